"""An independent numpy forward pass of the decoder families edgespec exports: the logits a graph must reproduce.

:func:`forward` computes a causal LM's float32 logits for a prompt at positions 0..T-1 from any
:class:`export.weights.TensorSource` (a GGUF file, a Hugging Face directory, a state dict), with no torch and no
onnx, written from transformers' modeling files (Qwen2, Llama / Mistral, Qwen3, Gemma 3 text, Phi-3) and
``modeling_rope_utils``: the math only. It reads a layer's tensors while that layer runs and drops them after, so
its peak memory is one layer's weights plus activations; the output head is applied in chunks of vocabulary rows.

:func:`rotary_inv_freq` is the rotary frequencies and attention factor of one layer type, per ``rope_type``
(the graph writers have their own, :mod:`export.families.rotary`: the two are checked against each other through
the graphs).
"""

from __future__ import annotations

import math

import numpy as np

from edgespec.errors import EdgespecError

from .model_config import ModelConfig
from .weights import TensorSource, has

ARCHITECTURES = ("qwen2", "llama", "mistral", "qwen3", "gemma3_text", "phi3")
HEAD_ROWS = 16384  # vocabulary rows of the output head multiplied at once
_TANH_GELU = ("gelu_pytorch_tanh", "gelu_tanh", "gelu_new", "gelu_fast")


# ---------------------------------------------------------------------------------------------------- rotary


def rotary_inv_freq(config: ModelConfig, layer_type: str = "full_attention",
                    seq_len: int | None = None) -> tuple[np.ndarray, float]:
    """The rotary embedding of ``layer_type``'s layers: (inv_freq float64 (rot_dim / 2,), attention factor).

    ``rot_dim`` is ``int(head_dim * partial_rotary_factor)``; the first ``rot_dim`` values of each head rotate
    (Hugging Face's half-split layout), the rest pass through. cos and sin are multiplied by the attention factor
    (LongRoPE's; 1 otherwise). Sliding layers of a model with ``rope_local_theta`` (Gemma 3) use that base and no
    scaling; other sliding layers share the full layers' rotary. ``seq_len`` matters to LongRoPE only: its long
    factors are used when ``seq_len`` exceeds ``original_max_position_embeddings`` (transformers' choice, made
    once per forward from the largest position + 1), the short ones otherwise.

    Scaling types: none/default, linear, llama3, longrope (Phi-3's old names su and yarn mean longrope there),
    freq_factors (a GGUF's per-frequency divisors ``rope_freqs``, llama.cpp's form of llama3).

    Raises:
        EdgespecError: another scaling type (dynamic, yarn, …) or a malformed scaling dict.
    """
    dim = int(config.head_dim * config.partial_rotary_factor)
    local = layer_type == "sliding_attention" and config.rope_local_theta is not None
    base = float(config.rope_local_theta if local else config.rope_theta)
    inv_freq = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    rs = None if local else config.rope_scaling
    kind = str((rs or {}).get("rope_type", (rs or {}).get("type", "default")))
    if config.architecture == "phi3" and kind in ("su", "yarn"):
        kind = "longrope"  # Phi3Config._rope_scaling_adjustment
    try:
        if kind in ("default", "none"):
            return inv_freq, 1.0
        if kind == "linear":
            return inv_freq / float(rs["factor"]), 1.0
        if kind == "freq_factors":
            return inv_freq / np.asarray(rs["factors"], dtype=np.float64), 1.0
        if kind == "llama3":
            return _llama3(inv_freq, rs), 1.0
        if kind == "longrope":
            return _longrope(config, inv_freq, rs, seq_len)
    except (KeyError, TypeError, ValueError) as e:
        raise EdgespecError(f"{config.architecture}: malformed rope_scaling {kind} ({type(e).__name__}: {e})") \
            from None
    raise EdgespecError(f"{config.architecture}: rotary scaling {kind!r} is not supported by the reference")


def _llama3(inv_freq: np.ndarray, rs: dict) -> np.ndarray:
    """Llama 3.1's frequency adjustment (``_compute_llama3_parameters``): long wavelengths divided by ``factor``,
    short ones kept, the band between smoothly interpolated."""
    factor, low, high = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
    old = float(rs["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > old / low, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    return np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


def _longrope(config: ModelConfig, inv_freq: np.ndarray, rs: dict, seq_len: int | None) -> tuple[np.ndarray, float]:
    """LongRoPE (``_compute_longrope_parameters``): frequencies divided by the short or long factors, and the
    attention factor sqrt(1 + ln(s) / ln(original)) with s = max_position_embeddings / original (1 when s <= 1)
    unless the dict gives ``attention_factor``."""
    original = config.original_max_position_embeddings
    factor = config.max_position_embeddings / original if original else float(rs.get("factor") or 1.0)
    original = original or config.max_position_embeddings
    attn = rs.get("attention_factor")
    if attn is None:
        attn = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    ext = rs["long_factor"] if seq_len is not None and seq_len > original else rs["short_factor"]
    ext = np.asarray(ext, dtype=np.float64)
    if ext.shape != inv_freq.shape:
        raise ValueError(f"{ext.size} factors for {inv_freq.size} frequencies")
    return inv_freq / ext, float(attn)


def _rotary_tables(config: ModelConfig, layer_type: str, T: int) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) float32 (T, rot_dim / 2) at positions 0..T-1, angles in float64, times the attention factor."""
    inv_freq, scale = rotary_inv_freq(config, layer_type, seq_len=T)
    angles = np.arange(T, dtype=np.float64)[:, None] * inv_freq[None, :]
    return (np.cos(angles) * scale).astype(np.float32), (np.sin(angles) * scale).astype(np.float32)


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x float32 (T, heads, head_dim) rotated in its first 2 * cos.shape[1] values (half-split pairs i, i + d/2)."""
    half = cos.shape[1]
    c, s = cos[:, None, :], sin[:, None, :]
    x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s, rest], axis=-1)


# ---------------------------------------------------------------------------------------------------- blocks


def _check(config: ModelConfig) -> None:
    """Raise EdgespecError (one line) for an architecture or option the reference does not compute."""
    a = config.architecture
    if a not in ARCHITECTURES:
        raise EdgespecError(f"reference: unsupported architecture {a!r} (supported: {', '.join(ARCHITECTURES)})")
    if config.hidden_act != "silu" and config.hidden_act not in _TANH_GELU:
        raise EdgespecError(f"reference: {a} with the {config.hidden_act!r} activation is not supported")
    if config.layer_types is not None:
        if len(config.layer_types) != config.num_layers:
            raise EdgespecError(f"reference: {a}: {len(config.layer_types)} layer_types for "
                                f"{config.num_layers} layers")
        unknown = set(config.layer_types) - {"full_attention", "sliding_attention"}
        if unknown:
            raise EdgespecError(f"reference: {a}: layer type {sorted(unknown)[0]!r} is not supported")
        if "sliding_attention" in config.layer_types and not config.sliding_window:
            raise EdgespecError(f"reference: {a}: sliding layers without a sliding_window")
    if config.num_heads % config.num_kv_heads:
        raise EdgespecError(f"reference: {a}: {config.num_heads} heads are not a multiple of "
                            f"{config.num_kv_heads} key/value heads")
    rotary_inv_freq(config, "full_attention")  # raises for an unsupported rope_scaling


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float, gemma: bool) -> np.ndarray:
    """RMSNorm over the last axis, float32: x / sqrt(mean(x²) + eps) times w (Gemma: times 1 + w)."""
    y = x / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + np.float32(eps))
    return y * ((1.0 + w) if gemma else w)


def _linear(x: np.ndarray, t: dict, name: str) -> np.ndarray:
    """x (T, in) @ W.T (+ b): W float32 (out, in) and its bias, if the layer has one, from t."""
    y = x @ t[name + ".weight"].T
    b = t.get(name + ".bias")
    return y if b is None else y + b


def _act(x: np.ndarray, kind: str) -> np.ndarray:
    """SiLU, or GELU with the tanh approximation (Gemma's ``gelu_pytorch_tanh``); float32."""
    if kind == "silu":
        return x / (1.0 + np.exp(-x))
    return 0.5 * x * (1.0 + np.tanh(np.float32(math.sqrt(2 / math.pi)) * (x + np.float32(0.044715) * x ** 3)))


def _attention(config: ModelConfig, t: dict, x: np.ndarray, rope: tuple, window: int | None) -> np.ndarray:
    """Self-attention of one layer: x float32 (T, H) → the o_proj output float32 (T, H).

    Causal; with ``window`` a query at i sees keys j with i - window < j <= i (transformers'
    ``sliding_window_overlay``). Grouped-query heads: query head h reads key/value head h // (heads / kv_heads).
    """
    T, nh, nkv, hd = x.shape[0], config.num_heads, config.num_kv_heads, config.head_dim
    gemma = config.architecture == "gemma3_text"
    if "self_attn.qkv_proj.weight" in t:  # Phi-3: q, k, v stacked along the output rows
        qkv = _linear(x, t, "self_attn.qkv_proj")
        q, k, v = np.split(qkv, [nh * hd, (nh + nkv) * hd], axis=1)
    else:
        q, k, v = (_linear(x, t, f"self_attn.{p}_proj") for p in "qkv")
    q, k, v = q.reshape(T, nh, hd), k.reshape(T, nkv, hd), v.reshape(T, nkv, hd)
    if "self_attn.q_norm.weight" in t:  # Qwen3, Gemma 3: RMSNorm over each head before the rotary
        q = _rms_norm(q, t["self_attn.q_norm.weight"], config.rms_norm_eps, gemma)
        k = _rms_norm(k, t["self_attn.k_norm.weight"], config.rms_norm_eps, gemma)
    q, k = _rotate(q, *rope), _rotate(k, *rope)
    scale = (config.query_pre_attn_scalar or hd) ** -0.5
    group = nh // nkv
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # (T, nh, hd)
    scores = np.einsum("ihd,jhd->hij", q, k) * np.float32(scale)  # (nh, T queries, T keys)
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    allowed = (j <= i) if window is None else (j <= i) & (j > i - window)
    scores = np.where(allowed[None], scores, -np.inf)
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs = scores / scores.sum(axis=-1, keepdims=True)
    out = np.einsum("hij,jhd->ihd", probs, v).reshape(T, nh * hd)
    return _linear(out, t, "self_attn.o_proj")


def _mlp(config: ModelConfig, t: dict, x: np.ndarray) -> np.ndarray:
    """down(act(gate(x)) * up(x)); Phi-3's ``gate_up_proj`` holds gate then up along its output rows."""
    if "mlp.gate_up_proj.weight" in t:
        gate, up = np.split(_linear(x, t, "mlp.gate_up_proj"), 2, axis=1)
    else:
        gate, up = _linear(x, t, "mlp.gate_proj"), _linear(x, t, "mlp.up_proj")
    return _linear(_act(gate, config.hidden_act) * up, t, "mlp.down_proj")


def _layer(config: ModelConfig, t: dict, x: np.ndarray, rope: tuple, window: int | None) -> np.ndarray:
    """One decoder layer on the residual stream x float32 (T, H); t: the layer's tensors by local name."""
    eps = config.rms_norm_eps
    if config.architecture == "gemma3_text":  # a norm before and after both the attention and the MLP
        a = _attention(config, t, _rms_norm(x, t["input_layernorm.weight"], eps, True), rope, window)
        x = x + _rms_norm(a, t["post_attention_layernorm.weight"], eps, True)
        m = _mlp(config, t, _rms_norm(x, t["pre_feedforward_layernorm.weight"], eps, True))
        return x + _rms_norm(m, t["post_feedforward_layernorm.weight"], eps, True)
    x = x + _attention(config, t, _rms_norm(x, t["input_layernorm.weight"], eps, False), rope, window)
    return x + _mlp(config, t, _rms_norm(x, t["post_attention_layernorm.weight"], eps, False))


# ---------------------------------------------------------------------------------------------------- model


def _rows(source: TensorSource, name: str, index) -> np.ndarray:
    """Rows ``index`` (a slice or int array) of a 2-D tensor, float32: through ``source.get_rows(name, index)``
    when the source offers it (then the whole matrix is never materialized), else from ``source.get(name)``."""
    get_rows = getattr(source, "get_rows", None)
    if get_rows is not None:
        return np.asarray(get_rows(name, index), dtype=np.float32)
    return np.asarray(source.get(name)[index], dtype=np.float32)


def _head(source: TensorSource, name: str, x: np.ndarray, vocab: int) -> np.ndarray:
    """logits float32 (T, V) = x (T, H) @ W.T, W (V, H) taken :data:`HEAD_ROWS` rows at a time when the source
    can give rows (else read once and multiplied in the same chunks)."""
    logits = np.empty((x.shape[0], vocab), dtype=np.float32)
    whole = None if hasattr(source, "get_rows") else source.get(name)
    for start in range(0, vocab, HEAD_ROWS):
        rows = slice(start, min(start + HEAD_ROWS, vocab))
        w = whole[rows] if whole is not None else _rows(source, name, rows)
        logits[:, rows] = x @ w.T
    return logits


def forward(source: TensorSource, ids: np.ndarray, *, layers_at_once: int = 1) -> np.ndarray:
    """The causal LM's logits float32 (T, V) for ``ids`` int64 (T,) at positions 0..T-1.

    Float32 arithmetic throughout (rotary angles in float64), as transformers computes a float32 model; Gemma 3's
    embedding scale is sqrt(hidden_size) rounded to float32 (``Gemma3TextScaledWordEmbedding`` casts it to the
    weights' dtype; a bfloat16 run of the same weights would use bf16(sqrt(hidden))). ``layers_at_once``: how
    many layers' tensors are read before they run (then dropped); peak memory follows that many layers.

    Raises:
        EdgespecError: an architecture or option the reference does not compute (:func:`_check`), or an id out
            of the vocabulary.
    """
    config = source.config
    _check(config)
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    T = ids.shape[0]
    if T == 0 or ids.min() < 0 or ids.max() >= config.vocab_size:
        raise EdgespecError(f"reference: token ids must be a non-empty list in [0, {config.vocab_size})")
    embed = "model.embed_tokens.weight"
    x = _rows(source, embed, ids)  # (T, H)
    if config.architecture == "gemma3_text":
        x = x * np.float32(math.sqrt(config.hidden_size))
    types = config.layer_types or ("full_attention",) * config.num_layers
    ropes = {kind: _rotary_tables(config, kind, T) for kind in set(types)}
    by_layer: dict[int, list[str]] = {}
    for name in source.names():
        parts = name.split(".")
        if name.startswith("model.layers.") and parts[2].isdigit():
            by_layer.setdefault(int(parts[2]), []).append(name)
    step = max(1, int(layers_at_once))
    for first in range(0, config.num_layers, step):
        group = range(first, min(first + step, config.num_layers))
        tensors = {i: {n.split(".", 3)[3]: source.get(n) for n in by_layer.get(i, [])} for i in group}
        for i in group:
            window = config.sliding_window if types[i] == "sliding_attention" else None
            x = _layer(config, tensors.pop(i), x, ropes[types[i]], window)
        del tensors
    x = _rms_norm(x, source.get("model.norm.weight"), config.rms_norm_eps, config.architecture == "gemma3_text")
    head = embed if config.tie_word_embeddings or not has(source, "lm_head.weight") else "lm_head.weight"
    return _head(source, head, x, config.vocab_size)
