"""One layer's attention after a short and a long past: onnxruntime's ``GroupQueryAttention`` (graph format 3)
against the grouped attention of graph format 4, in one run.

- ``gqa``: the op format-3 graphs use, alone: a shared past/present buffer of 4,096 positions bound through IO
  binding (as ``InPlaceKVCache`` does), rotary inside the op, with and without the ``attention_bias`` input;
  float32 and float16.
- ``grouped``: the exact nodes ``export/grouped_graph.py`` writes for one layer (rotary, each KV head's query
  group as one (G·T, D) matrix, two score blocks under one softmax), the past bound by pointer as row
  prefixes of a (2, kv_heads, 4,096, D) block (as ``GroupedKVCache`` does: a window of the past rounded up to
  64 rows, the mask widened), plus the copy of the T new rows into the block after each call (the runtime's
  per-step cost).

Both start from the packed QKV projection's output (1, T, (heads + 2 kv_heads) · D) and end at the attention
output (1, T, heads · D). Shapes: ``--shape target`` is Qwen2.5-1.5B's (12 query heads, 2 KV heads, D = 128),
``draft`` Qwen2.5-0.5B's (14, 2, 64). Random data; ms per call, mean of 50 after 3 warm-up calls.

    python bench/probes/attention_cost.py [--pasts 128,3500] [--new-rows 1,5] [--shape target|draft] [--no-fp16]
        [--pool session|spin|shared]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

SHAPES = {"target": (12, 2, 128), "draft": (14, 2, 64)}
CAPACITY, CALLS, WINDOW = 4096, 50, 64


def gqa_model(heads: int, kv: int, hd: int, dtype: int, bias: bool) -> bytes:
    info = helper.make_tensor_value_info
    ins = [info("qkv", dtype, [1, "T", (heads + 2 * kv) * hd]), info("pk", dtype, [1, kv, "C", hd]),
           info("pv", dtype, [1, kv, "C", hd]), info("seqlens_k", TensorProto.INT32, [1]),
           info("total", TensorProto.INT32, []), info("cos", dtype, ["L", hd // 2]),
           info("sin", dtype, ["L", hd // 2]), info("pos", TensorProto.INT64, [1, "T"])]
    if bias:
        ins.append(info("bias", dtype, [1, 1, "T", "S"]))
    node = helper.make_node("GroupQueryAttention",
                            ["qkv", "", "", "pk", "pv", "seqlens_k", "total", "cos", "sin", "pos",
                             "bias" if bias else ""], ["out", "prk", "prv"], domain="com.microsoft",
                            num_heads=heads, kv_num_heads=kv, do_rotary=1)
    outs = [info("out", dtype, [1, "T", heads * hd]), info("prk", dtype, [1, kv, "C", hd]),
            info("prv", dtype, [1, kv, "C", hd])]
    m = helper.make_model(helper.make_graph([node], "gqa", ins, outs),
                          opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m.SerializeToString()


def grouped_model(heads: int, kv: int, hd: int, cos: np.ndarray, sin: np.ndarray) -> bytes:
    """One layer of graph format 4, built by the exporter's own writer."""
    from edgespec.export.gqa_graph import GraphBuilder
    from edgespec.export.grouped_graph import GroupedWriter, past_name

    g, w = GraphBuilder(), GroupedWriter(heads, kv, hd)
    g.init("const/zero_f", np.array(0.0, np.float32))
    g.init("const/min_f", np.array(np.finfo(np.float32).min, np.float32))
    g.init("rotary/cos", cos)
    g.init("rotary/sin", sin)
    w.prelude(g)
    out = w.layer(g, 0, "qkv")
    w.finish(g, 1)
    g.nodes.append(helper.make_node("Identity", [out], ["out"]))
    info, F = helper.make_tensor_value_info, TensorProto.FLOAT
    ins = [info("qkv", F, [1, "T", (heads + 2 * kv) * hd]), info("input_ids", TensorProto.INT64, [1, "T"]),
           info("position_ids", TensorProto.INT64, [1, "T"]), info("attention_mask", TensorProto.BOOL, [1, 1, "T", "S"])]
    ins += w.kv_io(1)[0]
    outs = [info("out", F, [1, "T", heads * hd]), info("present", F, [2, kv, "T", hd])]
    assert {i.name for i in ins[4:]} == {past_name(0, k, h) for k in ("key", "value") for h in range(kv)}
    m = helper.make_model(helper.make_graph(g.nodes, "grouped", ins, outs, g.inits),
                          opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m.SerializeToString()


def _time(fn) -> float:
    for _ in range(3):
        fn()
    t0 = time.perf_counter()
    for _ in range(CALLS):
        fn()
    return (time.perf_counter() - t0) / CALLS * 1e3


def run_gqa(s, heads, kv, hd, npdt, bias, past, new, cos, sin, rng) -> float:
    k = ort.OrtValue.ortvalue_from_numpy(rng.random((1, kv, CAPACITY, hd)).astype(npdt))
    v = ort.OrtValue.ortvalue_from_numpy(rng.random((1, kv, CAPACITY, hd)).astype(npdt))
    io = s.io_binding()
    io.bind_ortvalue_input("pk", k), io.bind_ortvalue_input("pv", v)
    io.bind_ortvalue_output("prk", k), io.bind_ortvalue_output("prv", v), io.bind_output("out")
    io.bind_cpu_input("qkv", rng.random((1, new, (heads + 2 * kv) * hd)).astype(npdt))
    io.bind_cpu_input("seqlens_k", np.array([past + new - 1], np.int32))
    io.bind_cpu_input("total", np.array(past + new, np.int32))
    io.bind_cpu_input("cos", cos.astype(npdt)), io.bind_cpu_input("sin", sin.astype(npdt))
    io.bind_cpu_input("pos", np.arange(past, past + new, dtype=np.int64)[None])
    if bias:
        m = np.zeros((1, 1, new, past + new), npdt)
        m[0, 0, :, past:] = np.triu(np.full((new, new), np.finfo(npdt).min, npdt), 1)
        io.bind_cpu_input("bias", m)
    return _time(lambda: s.run_with_iobinding(io))


def run_grouped(s, heads, kv, hd, past, new, rng) -> float:
    from edgespec.io.grouped_kv import widen_mask
    from edgespec.io.onnx_model import causal_mask

    block = rng.random((2, kv, CAPACITY, hd), dtype=np.float32)
    w = -(-past // WINDOW) * WINDOW
    io = s.io_binding()
    for j, kind in enumerate(("key", "value")):
        for h in range(kv):
            io.bind_input(f"past_key_values.0.{kind}.{h}", "cpu", 0, np.float32, [w, hd],
                          block[j, h].ctypes.data)
    io.bind_cpu_input("qkv", rng.random((1, new, (heads + 2 * kv) * hd), dtype=np.float32))
    io.bind_cpu_input("input_ids", np.zeros((1, new), np.int64))
    io.bind_cpu_input("position_ids", np.arange(past, past + new, dtype=np.int64)[None])
    io.bind_cpu_input("attention_mask", widen_mask(causal_mask(past, new), past, w))
    io.bind_output("out"), io.bind_output("present")

    def step():
        s.run_with_iobinding(io)
        block[:, :, past:past + new] = io.get_outputs()[1].numpy()

    return _time(step)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pasts", default="128,3500")
    ap.add_argument("--new-rows", default="1,5")
    ap.add_argument("--shape", choices=tuple(SHAPES), default="target")
    ap.add_argument("--no-fp16", action="store_true", help="skip GroupQueryAttention on float16 inputs")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pool", choices=("session", "spin", "shared"), default="session",
                    help="session: a per-session pool without spinning (edgespec's per-session setting); spin: the "
                    "same, spinning; shared: edgespec's process-wide pool (what the CLI, bench and serve run on)")
    a = ap.parse_args()
    heads, kv, hd = SHAPES[a.shape]
    if a.pool == "shared":
        from edgespec.io.onnx_model import session_options, use_shared_thread_pool

        use_shared_thread_pool(a.threads)
        so = session_options()
    else:
        so = ort.SessionOptions()
        so.intra_op_num_threads = a.threads
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if a.pool == "spin" else "0")
    rng = np.random.default_rng(0)
    angles = np.outer(np.arange(CAPACITY), 1 / 10000 ** (np.arange(0, hd, 2) / hd))
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    pasts = [int(x) for x in a.pasts.split(",")]
    cpu = ["CPUExecutionProvider"]
    print(f"one layer, {heads} query heads, {kv} KV heads, head size {hd}, {a.threads} threads; ms per call", flush=True)
    variants = [("GroupQueryAttention float32, attention_bias", TensorProto.FLOAT, np.float32, True),
                ("GroupQueryAttention float32, no bias", TensorProto.FLOAT, np.float32, False)]
    if not a.no_fp16:
        variants.append(("GroupQueryAttention float16, attention_bias", TensorProto.FLOAT16, np.float16, True))
    grouped = ort.InferenceSession(grouped_model(heads, kv, hd, cos, sin), so, providers=cpu)
    for new in (int(x) for x in a.new_rows.split(",")):
        for name, dtype, npdt, bias in variants:
            s = ort.InferenceSession(gqa_model(heads, kv, hd, dtype, bias), so, providers=cpu)
            cells = [f"past {p}: {run_gqa(s, heads, kv, hd, npdt, bias, p, new, cos, sin, rng):.3f}" for p in pasts]
            print(f"{new} new row(s), {name}: " + ", ".join(cells), flush=True)
        cells = [f"past {p}: {run_grouped(grouped, heads, kv, hd, p, new, rng):.3f}" for p in pasts]
        print(f"{new} new row(s), grouped (format 4) float32, + copy of the new rows: " + ", ".join(cells),
              flush=True)


if __name__ == "__main__":
    main()
