"""Can a compressed KV cache be read by onnxruntime's CPU kernels without widening it first? One KV head's two
products at decode, float32 against float16 and int8 operands, for graph format 4's shapes.

Per KV head and layer, grouped attention (``export/grouped_graph.py``) computes scores = Q · Kᵀ (Q (G·T, D),
K (W, D): ``transB``) and out = P · V (P (G·T, W), V (W, D)). For each operand type this builds the op that
would do it, reports whether this onnxruntime runs it on CPU, and times it:

- float32: ``FusedMatMul`` transB (scores), ``MatMul`` (out) — format 4 today;
- float16 K/V: ``FusedMatMul`` / ``Gemm`` transB and ``MatMul`` on float16 operands (Q and P cast to float16);
- int8 V: ``MatMulInteger`` (P quantized to uint8 × int8 V; per-row V scales folded into P first) and
  ``DynamicQuantizeMatMul`` (float P × int8 V, per-column scale). There is no transB form of either, so int8 K
  would need a transposed K cache (not a row prefix): not measured.

Random data; Qwen2.5-1.5B's group (G = 6, D = 128); ms per call, mean of 50 after 3 warm-up calls.

    python bench/probes/kv_dtype_cost.py [--pasts 128,3500] [--new-rows 1,5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as TP, helper

G, D, CALLS = 6, 128, 50
F, H, I8, U8 = TP.FLOAT, TP.FLOAT16, TP.INT8, TP.UINT8


def _model(node, ins, out_type) -> bytes:
    info = helper.make_tensor_value_info
    g = helper.make_graph([node], "p", [info(n, t, s) for n, t, s in ins], [info("y", out_type, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m.SerializeToString()


def cases(rows: int, w: int, rng):
    """(name, model bytes, feeds) per product and operand type."""
    a = 1 / np.sqrt(D)
    q, k = rng.standard_normal((rows, D), dtype=np.float32), rng.standard_normal((w, D), dtype=np.float32)
    p, v = rng.random((rows, w), dtype=np.float32), rng.standard_normal((w, D), dtype=np.float32)
    ms = "com.microsoft"
    fused = lambda t: helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain=ms, transB=1, alpha=a)  # noqa: E731
    yield ("scores, FusedMatMul transB, float32", _model(fused(F), [("a", F, [rows, D]), ("b", F, [w, D])], F),
           {"a": q, "b": k})
    yield ("scores, FusedMatMul transB, float16", _model(fused(H), [("a", H, [rows, D]), ("b", H, [w, D])], H),
           {"a": q.astype(np.float16), "b": k.astype(np.float16)})
    gemm = helper.make_node("Gemm", ["a", "b"], ["y"], transB=1, alpha=a)
    yield ("scores, Gemm transB, float16", _model(gemm, [("a", H, [rows, D]), ("b", H, [w, D])], H),
           {"a": q.astype(np.float16), "b": k.astype(np.float16)})
    mm = helper.make_node("MatMul", ["a", "b"], ["y"])
    yield "out, MatMul, float32", _model(mm, [("a", F, [rows, w]), ("b", F, [w, D])], F), {"a": p, "b": v}
    yield ("out, MatMul, float16", _model(mm, [("a", H, [rows, w]), ("b", H, [w, D])], H),
           {"a": p.astype(np.float16), "b": v.astype(np.float16)})
    vq = np.clip(np.rint(v / (np.abs(v).max(1, keepdims=True) / 127)), -127, 127).astype(np.int8)
    mmi = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
    yield ("out, MatMulInteger uint8 x int8", _model(mmi, [("a", U8, [rows, w]), ("b", I8, [w, D])], TP.INT32),
           {"a": np.rint(p * 255).astype(np.uint8), "b": vq})
    dq = helper.make_node("DynamicQuantizeMatMul", ["a", "b", "s"], ["y"], domain=ms)
    yield ("out, DynamicQuantizeMatMul float x int8",
           _model(dq, [("a", F, [rows, w]), ("b", I8, [w, D]), ("s", F, [D])], F),
           {"a": p, "b": vq, "s": np.full(D, 0.01, np.float32)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pasts", default="128,3500")
    ap.add_argument("--new-rows", default="1,5")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.log_severity_level = 3
    rng = np.random.default_rng(0)
    for new in (int(x) for x in a.new_rows.split(",")):
        for w in (int(x) for x in a.pasts.split(",")):
            for name, model, feeds in cases(G * new, w, rng):
                try:
                    s = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
                    s.run(None, feeds)
                except Exception as e:  # onnxruntime's own types: no kernel for this type on CPU
                    print(f"{new} new row(s), past {w}, {name}: not run on CPU ({str(e).splitlines()[0][:120]})")
                    continue
                for _ in range(3):
                    s.run(None, feeds)
                t0 = time.perf_counter()
                for _ in range(CALLS):
                    s.run(None, feeds)
                print(f"{new} new row(s), past {w}, {name}: {(time.perf_counter() - t0) / CALLS * 1e3:.3f} ms",
                      flush=True)


if __name__ == "__main__":
    main()
