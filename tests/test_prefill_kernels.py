"""bench/probes/prefill_kernels.py offline: the int4 dequantization against onnxruntime's own MatMulNBits, the kernel
timer on a small shape, and the int8 copy of an export on a one-matmul graph."""

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

BENCH = Path(__file__).resolve().parent.parent / "bench" / "probes"
sys.path.insert(0, str(BENCH))
import prefill_kernels  # noqa: E402

K, N = 64, 24


def _nbits_model(rng) -> onnx.ModelProto:
    b = rng.integers(0, 256, (N, K // 32, 16), dtype=np.uint8)
    s = (rng.random((N, K // 32)) * 0.1 + 0.01).astype(np.float32)
    node = h.make_node("MatMulNBits", ["x", "layers.0.mlp.down_proj.weight_Q4", "layers.0.mlp.down_proj.weight_scales"],
                       ["y"], name="mm", domain="com.microsoft", K=K, N=N, bits=4, block_size=32, accuracy_level=0)
    g = h.make_graph([node], "g", [h.make_tensor_value_info("x", TP.FLOAT, [None, K])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)],
                     [nh.from_array(b, node.input[1]), nh.from_array(s, node.input[2])])
    return h.make_model(g, opset_imports=prefill_kernels.OPSETS)


def _run(model: onnx.ModelProto | str, x):
    src = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_dequantize_matches_matmulnbits():
    rng = np.random.default_rng(0)
    m = _nbits_model(rng)
    x = rng.standard_normal((5, K)).astype(np.float32)
    w = prefill_kernels.dequantize(m.graph.node[0], {t.name: t for t in m.graph.initializer})
    assert w.shape == (N, K)
    np.testing.assert_allclose(_run(m, x), x @ w.T, rtol=1e-4, atol=1e-4)


def test_time_kernels_small_shape():
    rows = prefill_kernels.time_kernels(rows=4, k=K, n=N, repeats=1, threads=1)
    assert [r["kernel"] for r in rows] == ["MatMulNBits int4 acc4", "MatMulNBits int8 acc4",
                                          "DynamicQuantizeMatMul int8", "MatMul fp32"]
    assert all(r["ms"] > 0 and r["gflops"] > 0 for r in rows)


def test_build_int8_copies_an_export(tmp_path):
    rng = np.random.default_rng(1)
    src = tmp_path / "export"
    (src / "target").mkdir(parents=True)
    (src / "draft").mkdir()
    (src / "draft" / "model.onnx").write_bytes(b"draft")
    onnx.save(_nbits_model(rng), src / "target" / "model.onnx", save_as_external_data=True,
              location="model.onnx.data", size_threshold=0)
    (src / "edgespec.json").write_text(json.dumps({"files": {}}))
    out = tmp_path / "int8"
    assert prefill_kernels.build_int8(src, out) == 1
    assert not (tmp_path / "int8.partial").exists()
    m = onnx.load(out / "target" / "model.onnx")
    assert [n.op_type for n in m.graph.node] == ["DynamicQuantizeMatMul"]
    files = json.loads((out / "edgespec.json").read_text())["files"]
    for f in ("target/model.onnx", "target/model.onnx.data"):
        assert files[f]["sha256"] == hashlib.sha256((out / f).read_bytes()).hexdigest()
    assert (out / "draft" / "model.onnx").read_bytes() == b"draft"
    # the int8 weights times their column scales are the int4 values within half a step (numpy: no kernel's
    # rounding, the same on every CPU); the graph runs and has the int4 graph's output shape
    inits = {t.name: nh.to_array(t) for t in m.graph.initializer}
    w8, scale = inits[m.graph.node[0].input[1]], inits[m.graph.node[0].input[2]]
    src_model = onnx.load(src / "target" / "model.onnx")
    w4 = prefill_kernels.dequantize(src_model.graph.node[0], {t.name: t for t in src_model.graph.initializer})
    assert np.all(np.abs(w8.astype(np.float32) * scale - w4.T) <= scale / 2 + 1e-7)
    x = rng.standard_normal((3, K)).astype(np.float32)
    assert _run(str(out / "target" / "model.onnx"), x).shape == _run(src_model, x).shape == (3, N)
    with pytest.raises(ValueError, match="exists"):
        prefill_kernels.build_int8(src, out)
    kept = tmp_path / "kept"
    assert prefill_kernels.build_int8(src, kept, keep_int4=("down_proj",)) == 0
    assert [n.op_type for n in onnx.load(kept / "target" / "model.onnx").graph.node] == ["MatMulNBits"]


def test_main_needs_a_part(capsys):
    with pytest.raises(SystemExit) as e:
        prefill_kernels.main([])
    assert e.value.code == 2
    assert "nothing to do" in capsys.readouterr().err
