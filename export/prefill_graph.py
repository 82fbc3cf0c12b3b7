"""An int8 prefill graph beside an int4 graph (``edgespec export --prefill-int8``, issue 24).

A prefill chunk (256 rows) is bound by arithmetic, not by reading weights, and onnxruntime's int4 kernel
(``MatMulNBits`` at accuracy level 4) is slower there than its QGEMM (``com.microsoft.DynamicQuantizeMatMul``:
int8 weights with one scale per output column, the activations quantized to uint8 inside, one scale per
tensor; AMX/VNNI where the CPU has them). On the 2-core Xeon VM, one 256 × 1536 → 8960 chunk matmul: 40.1 ms
int4, 12.0 ms int8 (``bench/prefill_kernels.py --kernels``, docs/benchmarks.md).

:func:`write_prefill_graph` writes ``prefill.onnx`` next to a graph's ``model.onnx``: the same graph (same
inputs, outputs and KV cache contract, so the runtime runs it on the same cache buffers) with the layer
matmuls re-quantized per output column from the int4 block values (7-bit values stored as int8,
:data:`WEIGHT_BITS`). Matmuls whose weight, node or output name contains one of ``keep_int4`` stay int4:
``down_proj``, whose inputs carry outlier channels 26–85× the median on Qwen2.5 (int8 per-tensor activations lose them: teacher-forced greedy agreement with int4 0.86–0.94 with it
int8, 0.95–1.00 without). The output head stays as it is. Every tensor the two graphs share stays in
``model.onnx.data`` (``prefill.onnx`` points into it); only the int8 weights and their scales go to
``prefill.onnx.data``, each at a 64 KiB-aligned offset.

The runtime uses the prefill graph for prompt chunks of at least 64 rows only
(``edgespec.engine.decoder.forward_tokens``, :data:`edgespec.io.onnx_model.PREFILL_GRAPH_ROWS`); decode
steps and verifies stay on the int4 graph, and plain and
speculative decoding prefill the same way, so they stay identical to each other.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

PREFILL_NAME = "prefill.onnx"
PREFILL_DATA = "prefill.onnx.data"
KEEP_INT4 = ("down_proj",)
# 7-bit weights in int8: AVX2's u8 × s8 kernel (vpmaddubsw, no VNNI) adds two u8·s8 products into a saturating
# int16, which 255 · 63 · 2 = 32,130 never overflows (255 · 127 · 2 would); on the real pair 7 bits agree with
# int4 as well as 8 (docs/benchmarks.md). Part of the graph cache key (REVISION): change both together.
WEIGHT_BITS = 7
REVISION = f"int{WEIGHT_BITS}-columns-keep-{'+'.join(KEEP_INT4)}"
# format 2 names its weights onnx::MatMul_N: its down_proj was made int8 until the node names were read too
REVISIONS = {2: REVISION + "-by-node-name"}
_ALIGN = 1 << 16


def _external(t: TensorProto) -> dict[str, str] | None:
    if t.data_location != TensorProto.EXTERNAL:
        return None
    return {e.key: e.value for e in t.external_data}


def _array(t: TensorProto, base: Path) -> np.ndarray:
    """A tensor's values, read from its external file directly (``onnx.load`` refuses data files with several
    hard links, as graphs linked from the user cache have)."""
    ext = _external(t)
    if ext is None:
        return numpy_helper.to_array(t)
    dtype = helper.tensor_dtype_to_np_dtype(t.data_type)
    count = int(np.prod(t.dims)) if len(t.dims) else 1
    with open(base / ext["location"], "rb") as f:
        f.seek(int(ext.get("offset", 0)))
        raw = f.read(int(ext.get("length", count * dtype.itemsize)))
    return np.frombuffer(raw, dtype).reshape(tuple(t.dims))


def dequantize_nbits(node: onnx.NodeProto, inits: dict[str, TensorProto], base: Path) -> np.ndarray | None:
    """float32 (N, K) weights of a 4-bit ``MatMulNBits`` without bias, symmetric or with a uint8 zero point per
    block (two per byte, low nibble first, as onnxruntime packs them): the value of a nibble q is q − z, times its
    block's scale, z = 8 without zero points. None for any other form (8 bits, a bias, group indices)."""
    a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    if (node.domain != "com.microsoft" or a.get("bits", 4) != 4 or len(node.input) not in (3, 4)
            or any(x not in inits for x in node.input[1:])
            or (len(node.input) == 4 and inits[node.input[3]].data_type != TensorProto.UINT8)):
        return None
    k, n = a["K"], a["N"]
    b = _array(inits[node.input[1]], base)
    s = _array(inits[node.input[2]], base).reshape(n, -1).astype(np.float32)
    q = np.stack([(b & 15).astype(np.int8), (b >> 4).astype(np.int8)], -1).reshape(n, s.shape[1], -1)
    if len(node.input) == 4:
        zb = _array(inits[node.input[3]], base).reshape(n, -1)
        z = np.stack([(zb & 15).astype(np.int8), (zb >> 4).astype(np.int8)], -1).reshape(n, -1)[:, :s.shape[1]]
    else:
        z = np.full(s.shape, 8, np.int8)
    return ((q - z[:, :, None]).astype(np.float32) * s[:, :, None]).reshape(n, -1)[:, :k]


def int8_columns(w: np.ndarray, bits: int = WEIGHT_BITS) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric ``bits``-bit (7 or 8) per output column of float32 (N, K) weights, stored as int8: (int8 (K, N)
    B, float32 (N,) scales) with B · scale ≈ wᵀ within half a step (scale = max|w| of the column / qmax,
    qmax = 2^(bits-1) − 1)."""
    qmax = (1 << (bits - 1)) - 1
    scale = np.abs(w).max(1) / qmax
    scale[scale == 0] = 1
    q = np.clip(np.round(w / scale[:, None]), -qmax, qmax).astype(np.int8)
    return np.ascontiguousarray(q.T), scale.astype(np.float32)


def _kept(node: onnx.NodeProto, keep_int4: tuple[str, ...]) -> bool:
    """Whether the matmul stays int4: one of ``keep_int4`` in its weight's, its own or its output's name (a
    format-3/4 graph names the weights after the module, ``layers.0.mlp.down_proj.weight_Q4``; the traced
    format-2 graph only the node and its output, ``/model/model/layers.0/mlp/down_proj/MatMul_Q4``)."""
    return any(k in name for k in keep_int4 for name in (node.input[1], node.name, *node.output))


def write_prefill_graph(graph_dir: Path, keep_int4: tuple[str, ...] = KEEP_INT4, bits: int = WEIGHT_BITS) -> int:
    """Write ``graph_dir/prefill.onnx`` and ``prefill.onnx.data`` from ``graph_dir/model.onnx`` (module
    docstring); returns how many matmuls became int8.

    Raises:
        ValueError: the graph has no 4-bit ``MatMulNBits`` layer matmul to replace (an int8 or fp32 export:
            nothing would get faster).
    """
    graph_dir = Path(graph_dir)
    model = onnx.load(str(graph_dir / "model.onnx"), load_external_data=False)
    inits = {t.name: t for t in model.graph.initializer}
    head = {n.name for n in model.graph.node if "logits" in n.output}
    data_path = graph_dir / PREFILL_DATA
    new_inits, replaced = [], set()
    with open(data_path, "wb") as data:
        for i, node in enumerate(model.graph.node):
            if node.op_type != "MatMulNBits" or node.name in head or _kept(node, keep_int4):
                continue
            w = dequantize_nbits(node, inits, graph_dir)
            if w is None:
                continue
            q, scale = int8_columns(w, bits)
            name = node.input[1] + "_i8"
            for arr, tname in ((q, name), (scale, name + "_scale")):
                data.seek(-data.tell() % _ALIGN, 1)
                t = TensorProto(name=tname, data_type=helper.np_dtype_to_tensor_dtype(arr.dtype), dims=arr.shape)
                t.data_location = TensorProto.EXTERNAL
                for key, value in (("location", PREFILL_DATA), ("offset", str(data.tell())),
                                   ("length", str(arr.nbytes))):
                    t.external_data.add(key=key, value=value)
                data.write(arr.tobytes())
                new_inits.append(t)
            replaced.update(node.input[1:])
            model.graph.node[i].CopyFrom(helper.make_node(
                "DynamicQuantizeMatMul", [node.input[0], name, name + "_scale"], list(node.output),
                name=node.name + "_i8", domain="com.microsoft"))
    if not new_inits:
        data_path.unlink()
        raise ValueError(f"{graph_dir / 'model.onnx'}: no 4-bit MatMulNBits layer matmul to make int8 "
                         "(a prefill graph needs an int4 export)")
    used = {x for n in model.graph.node for x in n.input}
    keep = [t for t in model.graph.initializer if t.name not in replaced or t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep + new_inits)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    (graph_dir / PREFILL_NAME).write_bytes(model.SerializeToString())
    return len(new_inits) // 2
