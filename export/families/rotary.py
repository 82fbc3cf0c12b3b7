"""Rotary embedding frequencies of the graph writers, one function per scaling type (transformers'
``modeling_rope_utils`` is the source of each formula; the numpy reference, :mod:`export.reference`, has its own)."""

from __future__ import annotations

import math

import numpy as np

from edgespec.errors import EdgespecError

from ..model_config import ModelConfig


def inv_freq(cfg: ModelConfig, layer_type: str = "full_attention") -> tuple[np.ndarray, float]:
    """(inverse frequencies float64 (rotary_dim / 2,), attention factor) of ``layer_type``'s rotary embedding.

    ``rotary_dim`` is ``head_dim * partial_rotary_factor``. Sliding layers of a model with ``rope_local_theta``
    (Gemma 3) use that base and no scaling. Scaling types: linear, llama3 (Hugging Face's dict), freq_factors
    (a GGUF's ``rope_freqs`` per-frequency divisors: llama.cpp's form of llama3), longrope (its short factors:
    the graphs hold the original context only, :func:`export.families.base.context_length`).

    Raises:
        EdgespecError: another scaling type (yarn, dynamic …).
    """
    dim = int(cfg.head_dim * cfg.partial_rotary_factor)
    local = layer_type == "sliding_attention" and cfg.rope_local_theta is not None
    base = cfg.rope_local_theta if local else cfg.rope_theta
    freq = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    rs = None if local else (cfg.rope_scaling or None)
    kind = (rs or {}).get("rope_type", (rs or {}).get("type", "default"))
    if kind == "default":
        return freq, 1.0
    if kind == "linear":
        return freq / float(rs["factor"]), 1.0
    if kind == "freq_factors":
        return freq / np.asarray(rs["factors"], dtype=np.float64), 1.0
    if kind == "llama3":
        factor, low, high = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
        old = float(rs["original_max_position_embeddings"])
        wavelen = 2 * math.pi / freq
        smooth = (old / wavelen - low) / (high - low)
        scaled = np.where(wavelen > old / low, freq / factor, freq)
        mid = (wavelen <= old / low) & (wavelen >= old / high)
        return np.where(mid, (1 - smooth) * scaled / factor + smooth * scaled, scaled), 1.0
    if kind == "longrope":
        orig = cfg.original_max_position_embeddings or cfg.max_position_embeddings
        factor = cfg.max_position_embeddings / orig
        attn = rs.get("attention_factor")
        if attn is None:
            attn = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
        return freq / np.asarray(rs["short_factor"], dtype=np.float64), float(attn)
    raise EdgespecError(f"{cfg.architecture}: rotary scaling {kind!r} is not supported")
