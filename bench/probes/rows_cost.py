"""What verifying N rows costs: int4 MatMulNBits over 28 Qwen2.5-1.5B-sized MLP layers (1536 → 8960 → 1536,
weights streamed from memory as in the real model) for M = 1..8 and 64 rows, per accuracy level.

A draft round of K tokens makes the target run K+1 rows; the ratio t(K+1)/t(1) bounds what speculation can
gain on a CPU (Leviathan et al. 2023, section 3.4, the cost coefficient). Random weights; ms per run, median
of 15 after 3 warm-up runs.

    python bench/probes/rows_cost.py            # accuracy levels 4 (int8 compute, the exporter's default), 0, 1
"""

from __future__ import annotations

import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

HIDDEN, INTER, LAYERS = 1536, 8960, 28
ROWS = (1, 2, 3, 4, 5, 8, 64)


def mlp_stack(accuracy_level: int, block: int = 32) -> bytes:
    rng = np.random.default_rng(0)
    nodes, inits, h = [], [], "x"
    for i in range(LAYERS):
        for j, (a, b) in enumerate(((HIDDEN, INTER), (INTER, HIDDEN))):
            w = f"w{i}_{j}"
            inits.append(numpy_helper.from_array((rng.standard_normal((a, b)) * 0.02).astype(np.float32), w))
            nodes.append(helper.make_node("MatMul", [h, w], [f"h{i}_{j}"]))
            h = f"h{i}_{j}"
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", HIDDEN])],
                          [helper.make_tensor_value_info(h, TensorProto.FLOAT, ["M", HIDDEN])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    q = MatMulNBitsQuantizer(m, bits=4, block_size=block, is_symmetric=True, accuracy_level=accuracy_level)
    q.process()
    return q.model.model.SerializeToString()


def main() -> None:
    import logging

    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.log_severity_level = 3
    rng = np.random.default_rng(1)
    for level in [int(x) for x in sys.argv[1:]] or (4, 0, 1):
        s = ort.InferenceSession(mlp_stack(level), so, providers=["CPUExecutionProvider"])
        cells = []
        for m in ROWS:
            x = (rng.standard_normal((m, HIDDEN)) * 0.1).astype(np.float32)
            for _ in range(3):
                s.run(None, {"x": x})
            ts = []
            for _ in range(15):
                t0 = time.perf_counter()
                s.run(None, {"x": x})
                ts.append(time.perf_counter() - t0)
            cells.append(f"M={m}: {np.median(ts) * 1e3:.1f}")
        print(f"accuracy level {level}: " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
