"""One layer's onnxruntime ``GroupQueryAttention`` at decode (T = 1) after a short and a long past, with and
without the ``attention_bias`` input, float32 and float16: the op format-3 graphs use, in isolation.

Qwen2.5-1.5B's shapes: 12 query heads, 2 KV heads, head size 128, a shared past/present buffer of 4,096
positions bound through IO binding (as ``SharedKVCache`` does), rotary inside the op. Random data; ms per
call, mean of 50 after 3 warm-up calls.

    python bench/attention_cost.py [--pasts 128,3500]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

HEADS, KV_HEADS, HEAD, CAPACITY, CALLS = 12, 2, 128, 4096, 50


def gqa_model(dtype: int, bias: bool) -> bytes:
    info = helper.make_tensor_value_info
    ins = [info("qkv", dtype, [1, "T", (HEADS + 2 * KV_HEADS) * HEAD]), info("pk", dtype, [1, KV_HEADS, "C", HEAD]),
           info("pv", dtype, [1, KV_HEADS, "C", HEAD]), info("seqlens_k", TensorProto.INT32, [1]),
           info("total", TensorProto.INT32, []), info("cos", dtype, ["L", HEAD // 2]),
           info("sin", dtype, ["L", HEAD // 2]), info("pos", TensorProto.INT64, [1, "T"])]
    if bias:
        ins.append(info("bias", dtype, [1, 1, "T", "S"]))
    node = helper.make_node("GroupQueryAttention",
                            ["qkv", "", "", "pk", "pv", "seqlens_k", "total", "cos", "sin", "pos",
                             "bias" if bias else ""], ["out", "prk", "prv"], domain="com.microsoft",
                            num_heads=HEADS, kv_num_heads=KV_HEADS, do_rotary=1)
    outs = [info("out", dtype, [1, "T", HEADS * HEAD]), info("prk", dtype, [1, KV_HEADS, "C", HEAD]),
            info("prv", dtype, [1, KV_HEADS, "C", HEAD])]
    m = helper.make_model(helper.make_graph([node], "gqa", ins, outs),
                          opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m.SerializeToString()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pasts", default="128,3500")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    rng = np.random.default_rng(0)
    angles = np.outer(np.arange(CAPACITY), 1 / 10000 ** (np.arange(0, HEAD, 2) / HEAD))
    for name, dtype, npdt in (("float32", TensorProto.FLOAT, np.float32), ("float16", TensorProto.FLOAT16, np.float16)):
        for bias in (True, False):
            s = ort.InferenceSession(gqa_model(dtype, bias), so, providers=["CPUExecutionProvider"])
            k = ort.OrtValue.ortvalue_from_numpy(rng.random((1, KV_HEADS, CAPACITY, HEAD)).astype(npdt))
            v = ort.OrtValue.ortvalue_from_numpy(rng.random((1, KV_HEADS, CAPACITY, HEAD)).astype(npdt))
            cells = []
            for past in (int(x) for x in a.pasts.split(",")):
                io = s.io_binding()
                io.bind_ortvalue_input("pk", k), io.bind_ortvalue_input("pv", v)
                io.bind_ortvalue_output("prk", k), io.bind_ortvalue_output("prv", v), io.bind_output("out")
                io.bind_cpu_input("qkv", rng.random((1, 1, (HEADS + 2 * KV_HEADS) * HEAD)).astype(npdt))
                io.bind_cpu_input("seqlens_k", np.array([past], np.int32))
                io.bind_cpu_input("total", np.array(past + 1, np.int32))
                io.bind_cpu_input("cos", np.cos(angles).astype(npdt))
                io.bind_cpu_input("sin", np.sin(angles).astype(npdt))
                io.bind_cpu_input("pos", np.array([[past]], np.int64))
                if bias:
                    io.bind_cpu_input("bias", np.zeros((1, 1, 1, past + 1), npdt))
                for _ in range(3):
                    s.run_with_iobinding(io)
                t0 = time.perf_counter()
                for _ in range(CALLS):
                    s.run_with_iobinding(io)
                cells.append(f"past {past}: {(time.perf_counter() - t0) / CALLS * 1e3:.3f} ms")
            print(f"{name}, {'with' if bias else 'without'} attention_bias: " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    main()
