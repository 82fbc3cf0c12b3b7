"""Export validation: figures returned as plain dicts and stored in the manifest (``GraphSpec.validation``).

- Streamed graphs (GGUF files, safetensors directories; no torch): the graph against an independent numpy
  forward of the same source weights (:func:`validate_reference`: greedy agreement, max |Δ logit|, KL), and its
  own with-past vs full recompute. An int4 export whose greedy agreement with the source falls below
  :data:`AGREEMENT_FLOOR` is reported with a warning; an fp32 graph that differs from the reference by more
  than :data:`FP32_TOLERANCE` is refused.
- Traced and torch-built graphs: ONNX vs PyTorch (:func:`validate_fp32`), quantized vs fp32 greedy agreement.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

FP32_TOLERANCE = 1e-3
VALIDATION_TEXT = (
    "def fibonacci(n: int) -> list[int]:\n    \"\"\"Return the first n Fibonacci numbers.\"\"\"\n"
    "    out = [0, 1]\n    while len(out) < n:\n        out.append(out[-1] + out[-2])\n    return out[:n]\n\n"
    "Speculative decoding lets a small draft model propose several tokens that the large target model then "
    "verifies in a single forward pass; the accept/reject rule keeps the target's distribution exactly.\n"
    "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n"
    "        self.items.append(x)\n    def pop(self):\n        return self.items.pop()\n"
)


def validation_ids(tokenizer, n: int, vocab_size: int) -> np.ndarray:
    """int64 (n,) token ids of :data:`VALIDATION_TEXT`, repeated to length ``n``."""
    ids = [i for i in tokenizer.encode(VALIDATION_TEXT, add_special_tokens=False) if i < vocab_size]
    if not ids:
        ids = list(range(min(vocab_size, 50)))
    reps = -(-n // len(ids))
    return np.array((ids * reps)[:n], dtype=np.int64)


def session(path: Path) -> ort.InferenceSession:
    """A CPU session of ``path`` with the runtime's options, the data file's pages given back while and after
    it loads as the runtime does (:mod:`edgespec.io.pages`): a 7B int4 graph's file would otherwise stay resident
    beside the kernels' packed copies of it."""
    from edgespec.io.onnx_model import session_options
    from edgespec.io.pages import ReleaseWhileLoading, release_file_pages

    files = [f for f in Path(path).parent.iterdir() if f.is_file() and f.name.endswith(".data")]
    with ReleaseWhileLoading(files):
        s = ort.InferenceSession(str(path), session_options(), providers=["CPUExecutionProvider"])
    release_file_pages(files)
    return s


def _mask(past: int, new: int) -> np.ndarray:
    m = np.ones((new, past + new), dtype=bool)
    m[:, past:] = np.tril(np.ones((new, new), dtype=bool))
    return m[None, None]


def _lm(sess: ort.InferenceSession, layers: int, kv: int, head_dim: int, context: int):
    """An :class:`edgespec.io.onnx_model.OnnxLM` around an open session, for a graph of either format."""
    from edgespec.io.manifest import GraphSpec, Quantization
    from edgespec.io.onnx_model import ROTARY_POSITIONS, OnnxLM

    meta = sess.get_modelmeta().custom_metadata_map
    fmt = int(meta.get("edgespec.graph_format", 2))
    context = min(context, int(meta.get(ROTARY_POSITIONS, context)))  # never past the graph's rotary table
    spec = GraphSpec(path="", architecture="", num_layers=layers, num_kv_heads=kv, head_dim=head_dim,
                     vocab_size=1, context_length=context, quantization=Quantization("fp32"), source="",
                     source_sha256="", input_names=(), output_names=(), graph_format=fmt,
                     kv_cache=meta.get("edgespec.kv_cache", "float32"))
    return OnnxLM.from_session(spec, sess)


def run_onnx(sess: ort.InferenceSession, ids: np.ndarray, past: list[np.ndarray], layers: int, kv: int,
             head_dim: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """One causal forward of ``ids`` int64 (T,) after ``past``; returns logits (T, V) and present tensors
    float32 (1, kv, P+T, head_dim) (copies, whatever the graph format)."""
    lm = _lm(sess, layers, kv, head_dim, 1 << 16)
    cache = lm.new_cache(max(len(ids) + (past[0].shape[2] if past else 0), 16))
    if past:
        if lm.in_place:
            cache.load(past)
        else:
            cache.tensors = list(past)
    logits = lm.forward(ids, cache)
    return logits, [np.array(t) for t in cache.tensors]


def validate_fp32(model, onnx_path: Path, ids: np.ndarray, split: int = 8, step: int = 4) -> dict:
    """Compare the fp32 graph with the PyTorch model: prefill of ``split`` tokens, then ``step`` with past.

    Returns ``max_abs_prefill``, ``max_abs_with_past`` (ONNX vs PyTorch logits) and ``max_abs_past_vs_full``
    (ONNX prefill+step vs ONNX on all ``split+step`` tokens at once).
    """
    import torch

    from .onnx_graph import kv_shape
    from .traced_graph import ContractWrapper, causal_mask

    layers, kv, hd = kv_shape(model.config)
    wrapper = ContractWrapper(model).eval()
    a, b = ids[:split], ids[split:split + step]
    with torch.no_grad():
        t_pre = wrapper(torch.from_numpy(a)[None], torch.arange(split)[None], causal_mask(0, split),
                        *[torch.zeros(1, kv, 0, hd) for _ in range(2 * layers)])
        t_step = wrapper(torch.from_numpy(b)[None], torch.arange(split, split + step)[None],
                         causal_mask(split, step), *t_pre[1:])
    sess = session(onnx_path)
    o_pre, present = run_onnx(sess, a, [], layers, kv, hd)
    o_step, _ = run_onnx(sess, b, [x.numpy() for x in t_pre[1:]], layers, kv, hd)
    o_step_own, _ = run_onnx(sess, b, present, layers, kv, hd)
    o_full, _ = run_onnx(sess, np.concatenate([a, b]), [], layers, kv, hd)
    return {
        "max_abs_prefill": float(np.abs(o_pre - t_pre[0][0].numpy()).max()),
        "max_abs_with_past": float(np.abs(o_step - t_step[0][0].numpy()).max()),
        "max_abs_past_vs_full": float(np.abs(o_step_own - o_full[split:]).max()),
        "tolerance": FP32_TOLERANCE,
    }


def validate_quantized(fp32_path: Path, q_path: Path, ids: np.ndarray, layers: int, kv: int, head_dim: int,
                       kept: np.ndarray | None = None) -> dict:
    """Greedy top-1 agreement and max |Δ logit| of the quantized graph against fp32 over ``len(ids)`` positions.

    With a pruned head (``kept`` int64 (N,)), the quantized graph's argmax is mapped back to full ids, the
    logit error is taken over the kept columns, and ``target_top1_in_kept`` is the share of positions whose
    fp32 argmax survives pruning.
    """
    ref, _ = run_onnx(session(fp32_path), ids, [], layers, kv, head_dim)
    got, _ = run_onnx(session(q_path), ids, [], layers, kv, head_dim)
    top = got.argmax(-1) if kept is None else kept[got.argmax(-1)]
    out = {
        "positions": int(len(ids)),
        "greedy_agreement": float((ref.argmax(-1) == top).mean()),
        "max_abs_logit_error": float(np.abs((ref if kept is None else ref[:, kept]) - got).max()),
    }
    if kept is not None:
        out["target_top1_in_kept"] = float(np.isin(ref.argmax(-1), kept).mean())
    return out


def validate_kv_cache(plain_path: Path, q_path: Path, ids: np.ndarray, layers: int, kv: int, head_dim: int,
                      chunk: int = 32) -> dict:
    """Greedy top-1 agreement and max |Δ logit| of the int8-KV-cache graph ``q_path`` against the same graph
    with a float32 cache ``plain_path``, over ``ids`` fed in chunks of ``chunk`` rows (each reads the cache the
    chunks before it wrote)."""
    rows = []
    for path in (plain_path, q_path):
        lm = _lm(session(path), layers, kv, head_dim, len(ids) + 16)
        cache = lm.new_cache(len(ids) + 16)
        rows.append(np.concatenate([lm.forward(ids[i:i + chunk], cache) for i in range(0, len(ids), chunk)]))
    return _agreement(*rows)


def _agreement(a: np.ndarray, b: np.ndarray) -> dict:
    err = max(float(np.abs(a[r:r + 32] - b[r:r + 32]).max()) for r in range(0, len(a), 32))  # small temporaries
    return {"positions": int(len(a)), "greedy_agreement": float((a.argmax(-1) == b.argmax(-1)).mean()),
            "max_abs_logit_error": err}


def validate_float32_prefill(plain_path: Path, q_path: Path, prefill_path: Path, scales: dict[str, np.ndarray],
                             ids: np.ndarray, layers: int, kv: int, head_dim: int, chunk: int = 32) -> dict:
    """The runtime's prefill of an int8 cache through the float32 prefill graph ``prefill_path`` (its rows
    quantized with ``scales``, :meth:`edgespec.io.onnx_model.InPlaceKVCache.store_from`), then ``q_path``'s int8
    decoding, against ``plain_path`` with a float32 cache prefilled by the same prefill graph: greedy agreement and
    max |Δ logit| over the rows after the prefill (the first half of ``ids`` int64 (N,) is the prompt, one chunk;
    the rest runs in chunks of ``chunk`` rows)."""
    half = max(len(ids) // 2, 64)
    pre = session(prefill_path)
    rows = []
    for path, int8 in ((plain_path, False), (q_path, True)):
        lm = _lm(session(path), layers, kv, head_dim, len(ids) + 16)
        lm.prefill_session = pre
        if int8:
            lm.kv_scales = [scales[n] for n in lm._past]
        cache = lm.new_cache(len(ids) + 16)
        lm.forward(ids[:half], cache, keep=1, prefill=True)
        rows.append(np.concatenate([lm.forward(ids[i:i + chunk], cache) for i in range(half, len(ids), chunk)]))
    return _agreement(*rows)


AGREEMENT_FLOOR = 0.90  # int4 greedy agreement with the source below this: the export warns (module docstring)
REFERENCE = "numpy forward of the source weights, fp32 (export/reference.py)"


def reference_logits(source, ids: np.ndarray) -> np.ndarray:
    """float32 (N, V): :func:`export.reference.forward` of ``source`` over ``ids`` int64 (N,)."""
    from .reference import forward

    return forward(source, ids)


def validate_reference(ref: np.ndarray, graph: Path, ids: np.ndarray, layers: int, kv: int, head_dim: int,
                       kept: np.ndarray | None = None, split: int = 8, step: int = 4) -> dict:
    """The streamed graph against the numpy reference ``ref`` float32 (N, V) of the same weights over ``ids``:
    greedy agreement, max |Δ logit|, mean KL(p_reference ‖ p_graph) in nats (full heads only), and the graph's
    own consistency: ``split`` tokens then ``step`` more with the KV cache against all at once
    (``max_abs_past_vs_full``). With a pruned head (``kept`` int64 (K,)), the graph's argmax is mapped back
    to full ids and the logit error is taken over the kept columns."""
    sess = session(graph)
    got, _ = run_onnx(sess, ids, [], layers, kv, head_dim)
    out = {"against": REFERENCE, **_agreement(ref if kept is None else ref[:, kept], got)}
    if kept is not None:
        out["greedy_agreement"] = float((ref.argmax(-1) == kept[got.argmax(-1)]).mean())
        out["target_top1_in_kept"] = float(np.isin(ref.argmax(-1), kept).mean())
    else:
        out["kl_mean"] = kl_mean(ref, got)
    _, present = run_onnx(sess, ids[:split], [], layers, kv, head_dim)
    o_step, _ = run_onnx(sess, ids[split:split + step], present, layers, kv, head_dim)
    o_full, _ = run_onnx(sess, ids[:split + step], [], layers, kv, head_dim)
    out["max_abs_past_vs_full"] = float(np.abs(o_step - o_full[split:]).max())
    return out


def kl_mean(ref: np.ndarray, got: np.ndarray, rows: int = 32) -> float:
    """Mean over rows of KL(softmax(ref) ‖ softmax(got)) in nats, for logits float32 (N, V), ``rows`` rows at a
    time (a 150,000-wide vocabulary makes each full-size temporary 150 MB at 256 rows)."""
    total = 0.0
    for r in range(0, len(ref), rows):
        lp = ref[r:r + rows] - _logsumexp(ref[r:r + rows])
        lq = got[r:r + rows] - _logsumexp(got[r:r + rows])
        total += float((np.exp(lp) * (lp - lq)).sum())
    return total / len(ref)


def _logsumexp(x: np.ndarray) -> np.ndarray:
    m = x.max(-1, keepdims=True)
    return m + np.log(np.exp(x - m).sum(-1, keepdims=True))


def graph_logits(graph: Path, ids: np.ndarray, layers: int, kv: int, head_dim: int) -> np.ndarray:
    """float32 (N, V): one causal forward of ``ids`` through ``graph``."""
    return run_onnx(session(graph), ids, [], layers, kv, head_dim)[0]
