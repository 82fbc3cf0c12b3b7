"""An int8 KV cache for graph format 3 (``edgespec export --kv-int8``): ``GroupQueryAttention`` reads and writes it.

Format 3's attention is onnxruntime's ``com.microsoft.GroupQueryAttention`` over in-place float32 buffers
(:mod:`.gqa_graph`). Its CPU kernel also keeps the cache quantized (``k_quant_type`` / ``v_quant_type``,
``kv_cache_bit_width`` 8, inputs 12 and 13 ``k_scale`` / ``v_scale``): it quantizes the new rows' K (after
rotary) and V as it writes them and reads the past as int8, a quarter of the bytes. This module rewrites a
finished format-3 graph that way, with static scales per KV head and channel, float32 (1, kv_heads, 1, head_dim)
(PER_CHANNEL: a scale per tensor left K's outlier channels with too few levels, and onnxruntime has no
per-position scales):

- V: max |v| per channel over a calibration text run through the float32-cache graph, / 127, × :data:`MARGIN`.
- K (rotated): rotary turns each pair of channels (j, j + head_dim/2) by a position-dependent angle, so a channel's
  range at position 3,500 is not its range in a short text; the scale is the pair's largest norm
  √(k_j² + k_{j+D/2}²), which bounds both channels at every angle, / 127.

Values past a scale saturate at ±127. Everything else (the mask, ``attention_bias`` for trees, in-place
rows, rollback by length) is format 3's. Measured on the real pair after a 3,500-token past (docs/benchmarks.md,
``bench/kv_int8_probe.py``): a decode step 1.34× faster than with the float32 cache, argmax agreement 33/33.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

MARGIN = 1.25  # V's calibrated absmax is widened by this (a later text may run larger)
CALIBRATION_ROWS = 32  # the calibration text runs in chunks of this many rows (as a prefill does)


def calibration_ids(tokenizer, ids: np.ndarray, vocab_size: int, n: int = 768) -> np.ndarray:
    """int64 (len(ids) + up to ``n``,): ``ids`` (the export's validation text), then ``n`` tokens of a Python
    standard-library source file (``typing.py``: code nobody here wrote, on every machine), ids below
    ``vocab_size`` only."""
    import inspect
    import typing

    try:
        text = Path(inspect.getsourcefile(typing)).read_text(encoding="utf-8")
    except (OSError, TypeError):
        text = ""
    more = [i for i in tokenizer.encode(text, add_special_tokens=False) if i < vocab_size][:n] if text else []
    return np.concatenate([np.asarray(ids, dtype=np.int64), np.array(more, dtype=np.int64)])


def _past_inputs(g) -> list[str]:
    return [i.name for i in g.input if i.name.startswith("past_key_values.")]


def calibrate(graph: Path, ids: np.ndarray, layers: int, kv: int, head_dim: int) -> dict[str, np.ndarray]:
    """Per-channel scales float32 (1, kv, 1, head_dim) for every ``past_key_values.{i}.key|value`` of the
    float32-cache format-3 ``graph``, from a run over ``ids`` int64 (N,) (the module docstring's rules)."""
    from .validate import _lm, session

    lm = _lm(session(graph), layers, kv, head_dim, max(len(ids) + 16, 64))
    cache = lm.new_cache(len(ids) + 16)
    for i in range(0, len(ids), CALIBRATION_ROWS):
        lm.forward(ids[i:i + CALIBRATION_ROWS], cache, keep=1)
    half = head_dim // 2
    out = {}
    for (k_name, v_name), k, v in zip(lm.spec.past_names(), cache.tensors[0::2], cache.tensors[1::2]):
        norm = np.sqrt(k[..., :half] ** 2 + k[..., half:] ** 2).max(axis=(0, 2), keepdims=True)
        out[k_name] = np.concatenate([norm, norm], axis=-1) / 127.0
        out[v_name] = np.abs(v).max(axis=(0, 2), keepdims=True) * MARGIN / 127.0
    return {n: np.maximum(s, 1e-6).astype(np.float32) for n, s in out.items()}


def rewrite(graph: Path, scales: dict[str, np.ndarray], out: Path | None = None) -> int:
    """Rewrite the format-3 ``graph`` (in place, or to ``out`` beside it: the same data file) for an int8 cache
    with ``scales`` (:func:`calibrate`); returns the number of attention nodes changed.

    Raises:
        ValueError: not a format-3 graph, already int8, or a past input without a scale.
    """
    m = onnx.load(str(graph), load_external_data=False)
    meta = {p.key: p.value for p in m.metadata_props}
    if meta.get("edgespec.graph_format") != "3":
        raise ValueError(f"{graph}: an int8 KV cache needs a graph-format-3 graph")
    if meta.get("edgespec.kv_cache", "float32") != "float32":
        raise ValueError(f"{graph}: its KV cache is already {meta['edgespec.kv_cache']}")
    g = m.graph
    missing = [n for n in _past_inputs(g) if n not in scales]
    if missing:
        raise ValueError(f"no scale for {missing[0]}")
    for vi in list(g.input) + list(g.output):
        if vi.name.startswith(("past_key_values.", "present.")):
            vi.type.tensor_type.elem_type = TensorProto.INT8
    n = 0
    for node in g.node:
        if node.op_type != "GroupQueryAttention":
            continue
        pk, pv = node.input[3], node.input[4]
        for name in (pk, pv):
            g.initializer.append(onnx.numpy_helper.from_array(scales[name], f"{name}/scale"))
        ins = list(node.input) + [""] * (11 - len(node.input))  # ... position_ids, attention_bias
        node.input[:] = ins[:11] + ["", f"{pk}/scale", f"{pv}/scale"]  # head_sink, k_scale, v_scale
        node.attribute.extend([helper.make_attribute("k_quant_type", "PER_CHANNEL"),
                               helper.make_attribute("v_quant_type", "PER_CHANNEL"),
                               helper.make_attribute("kv_cache_bit_width", 8)])
        n += 1
    helper.set_model_props(m, {**meta, "edgespec.kv_cache": "int8"})
    onnx.save(m, str(out or graph))
    return n
