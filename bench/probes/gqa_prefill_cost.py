"""One layer's prompt chunk through ``GroupQueryAttention`` with a float32 and with an int8 (PER_CHANNEL) KV cache:
why an int8 cache's prefill runs on a float32 prefill graph (issue 24, 2026-12-02; ``edgespec/io/kv_int8_copy.py``).

Qwen2.5-1.5B's shapes (12 query heads, 2 KV heads, D = 128), a shared past/present buffer of 4,096 positions
bound through IO binding, rotary inside the op, random data; ms per call, mean of 5 after 2 warm-up calls.

    python bench/probes/gqa_prefill_cost.py [--rows 256] [--pasts 0,1024,3072] [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

H, KVH, D, CAP = 12, 2, 128, 4096


def model(kv_type: int, per_channel: bool) -> bytes:
    info = helper.make_tensor_value_info
    ins = [info("qkv", TensorProto.FLOAT, [1, "T", (H + 2 * KVH) * D]), info("pk", kv_type, [1, KVH, "C", D]),
           info("pv", kv_type, [1, KVH, "C", D]), info("seqlens_k", TensorProto.INT32, [1]),
           info("total", TensorProto.INT32, []), info("cos", TensorProto.FLOAT, ["L", D // 2]),
           info("sin", TensorProto.FLOAT, ["L", D // 2]), info("pos", TensorProto.INT64, [1, "T"])]
    names = ["qkv", "", "", "pk", "pv", "seqlens_k", "total", "cos", "sin", "pos", "", ""]
    attrs = dict(num_heads=H, kv_num_heads=KVH, do_rotary=1)
    if per_channel:
        ins += [info("ks", TensorProto.FLOAT, [1, KVH, 1, D]), info("vs", TensorProto.FLOAT, [1, KVH, 1, D])]
        names += ["ks", "vs"]
        attrs.update(k_quant_type="PER_CHANNEL", v_quant_type="PER_CHANNEL", kv_cache_bit_width=8)
    node = helper.make_node("GroupQueryAttention", names, ["out", "prk", "prv"], domain="com.microsoft", **attrs)
    outs = [info("out", TensorProto.FLOAT, [1, "T", H * D]), info("prk", kv_type, [1, KVH, "C", D]),
            info("prv", kv_type, [1, KVH, "C", D])]
    m = helper.make_model(helper.make_graph([node], "g", ins, outs),
                          opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m.SerializeToString()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=256, help="new rows per call (a prompt chunk)")
    ap.add_argument("--pasts", default="0,1024,3072")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    rng = np.random.default_rng(0)
    ang = np.outer(np.arange(CAP), 1 / 10000 ** (np.arange(0, D, 2) / D))
    for label, kv_type, dtype, per_channel in (("float32 cache", TensorProto.FLOAT, np.float32, False),
                                               ("int8 cache (PER_CHANNEL)", TensorProto.INT8, np.int8, True)):
        s = ort.InferenceSession(model(kv_type, per_channel), so, providers=["CPUExecutionProvider"])
        k, v = (ort.OrtValue.ortvalue_from_numpy((rng.random((1, KVH, CAP, D)) * 10).astype(dtype)) for _ in "kv")
        cells = []
        for past in map(int, a.pasts.split(",")):
            io = s.io_binding()
            io.bind_ortvalue_input("pk", k)
            io.bind_ortvalue_input("pv", v)
            io.bind_ortvalue_output("prk", k)
            io.bind_ortvalue_output("prv", v)
            io.bind_output("out")
            io.bind_cpu_input("qkv", rng.random((1, a.rows, (H + 2 * KVH) * D)).astype(np.float32))
            io.bind_cpu_input("seqlens_k", np.array([past + a.rows - 1], np.int32))
            io.bind_cpu_input("total", np.array(past + a.rows, np.int32))
            io.bind_cpu_input("cos", np.cos(ang).astype(np.float32))
            io.bind_cpu_input("sin", np.sin(ang).astype(np.float32))
            io.bind_cpu_input("pos", np.arange(past, past + a.rows, dtype=np.int64)[None])
            if per_channel:
                io.bind_cpu_input("ks", np.full((1, KVH, 1, D), 0.05, np.float32))
                io.bind_cpu_input("vs", np.full((1, KVH, 1, D), 0.05, np.float32))
            for _ in range(2):
                s.run_with_iobinding(io)
            t0 = time.perf_counter()
            for _ in range(5):
                s.run_with_iobinding(io)
            cells.append(f"past {past}: {(time.perf_counter() - t0) / 5 * 1e3:.2f} ms")
        print(f"{label}, {a.rows} new rows:", ", ".join(cells), flush=True)


if __name__ == "__main__":
    main()
