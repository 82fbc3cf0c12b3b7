"""Can a Q4_K block be exact in onnxruntime's int4 kernel, and at what cost?

A Q4_K sub-block of 32 weights is ``d·q − m`` (q in 0..15, float scale d and offset m): a ``MatMulNBits`` block of
32 with a float zero point ``m / d`` reproduces it exactly, where a uint8 zero point rounds it. This times 8
matmuls of Qwen2.5-1.5B's gate/up shape (1536 → 8960, random blocks), block 32, accuracy level 4, at 1 and 5 rows:
symmetric, uint8 zero points, float zero points (median ms of 15 runs after one warm-up; onnxruntime's default
threads).

Usage: python bench/probes/float_zero_points.py
"""

import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

K, N, LAYERS, BLOCK = 1536, 8960, 8, 32


def model(zero_points: str) -> bytes:
    """The graph of LAYERS parallel matmuls on one input; ``zero_points``: "none", "uint8" or "float"."""
    rng = np.random.default_rng(0)
    blocks = K // BLOCK
    nodes, inits, outs = [], [], []
    for i in range(LAYERS):
        ins = ["x", f"b{i}", f"s{i}"]
        inits += [numpy_helper.from_array(rng.integers(0, 256, (N, blocks, BLOCK // 2), dtype=np.uint8), f"b{i}"),
                  numpy_helper.from_array(rng.random(N * blocks, dtype=np.float32) * 0.02 + 0.001, f"s{i}")]
        if zero_points == "uint8":
            inits.append(numpy_helper.from_array(rng.integers(0, 256, N * -(-blocks // 2), dtype=np.uint8), f"z{i}"))
            ins.append(f"z{i}")
        elif zero_points == "float":
            inits.append(numpy_helper.from_array(rng.random(N * blocks, dtype=np.float32) * 8, f"z{i}"))
            ins.append(f"z{i}")
        nodes.append(helper.make_node("MatMulNBits", ins, [f"y{i}"], domain="com.microsoft", K=K, N=N, bits=4,
                                      block_size=BLOCK, accuracy_level=4))
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["M", N]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", K])], outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("com.microsoft", 1)]).SerializeToString()


def main() -> None:
    for kind in ("none", "uint8", "float"):
        sess = ort.InferenceSession(model(kind), providers=["CPUExecutionProvider"])
        for m in (1, 5):
            x = np.random.default_rng(1).standard_normal((m, K), dtype=np.float32)
            sess.run(None, {"x": x})
            times = []
            for _ in range(15):
                t0 = time.perf_counter()
                sess.run(None, {"x": x})
                times.append((time.perf_counter() - t0) * 1e3)
            print(f"zero points {kind:5s}  {m} row{'s' if m > 1 else ' '}  {np.median(times):8.2f} ms")


if __name__ == "__main__":
    main()
