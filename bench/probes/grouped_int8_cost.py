"""Attention over an int8 KV cache that reads each KV head once per query group, with onnxruntime's integer
GEMM, against ``GroupQueryAttention``'s own int8 cache (graph format 3 ``--kv-int8``), over a whole step's layers.

The probes of 2026-12-01 found no way to read an int8 cache once per query group with onnxruntime 1.32's CPU ops: widening it
in the graph (``DequantizeLinear``, ``Cast``) costs what the smaller reads save, and quantizing the softmax
output P to uint8 with one scale for the whole tensor (``DynamicQuantizeMatMul``) loses the small
probabilities (13/33 agreement). This probe tries a formulation that keeps both the cache and the products in
8 bits without that loss:

- **Layout**: per layer one K buffer uint8 (capacity, kv_heads·D) (the int8 value + 128) and one V buffer int8
  (capacity, kv_heads·D), row w holding position w of every KV head; the past is the contiguous row prefix
  (W, kv_heads·D), bound by pointer (zero copy). Static scales per KV head and channel, as ``--kv-int8``
  writes them (k_s, v_s float32 (kv_heads·D,)).
- **Scores**, both KV heads in one ``MatMulInteger`` (uint8 A × int8 B, MLAS's u8s8 kernel, AMX or VNNI where
  the CPU has them; int8 × int8 has no fast path in MLAS 1.32, see ``--check-kernels``): A = the K prefix
  (W, kv_heads·D) with zero point 128, B = the query group's rows with k_s folded in, block-diagonal over the
  KV heads (kv_heads·D, kv_heads·2·G·T), each row quantized in **two levels** (q = round(x / s), then the rest
  r = x − q·s as round(254·r / s)): ~15 bits of the query, so the scores carry only the cache's own int8 error.
  Each K byte is read once per step.
- **P · V**: P (G·T, W) per KV head after one softmax over [past scores | new rows' scores] (the new rows
  attend to themselves from float32, under the additive mask), in two uint8 levels too (s1 = row max / 255,
  x = p / s1, p1 = ⌊x⌋, p2 = round(254·(x − p1)), so p = s1·(p1 + p2 / 254)); one ``MatMulInteger`` over the V
  prefix for both KV heads, diagonal blocks kept, times v_s. Each V byte is read once per step.
- A one-level query (``1-level Q`` in the output) is timed too, to show what the second level buys.
- The new rows' K and V leave the graph quantized (uint8 K, int8 V) and the runtime writes them into the
  buffers (timed here: numpy row copies).

Against: ``GroupQueryAttention`` with ``k_quant_type``/``v_quant_type`` PER_CHANNEL and ``kv_cache_bit_width``
8 (what ``edgespec export --kv-int8`` writes, with the same scales) and with a float32 cache (the default
export), both in place through IO binding, no rotary in any variant (the grouped graph takes Q and the new K/V
after rotary). Each variant is one graph of ``--layers`` independent layers, each with its own buffers and its
own inputs (so that onnxruntime cannot merge the layers' identical ops): a call reads a whole step's cache. The
target's int8 cache after 3,500 tokens is 50 MB, which may partly stay in a large L3 (105 MB on the Xeon of
2026-12-03) between calls; the float32 cache (200 MB) cannot. Random data with outlier channels (log-normal
channel scales, as real K has); the error printed is the grouped variant's, layer 0's: max |Δ| of its output
against float32 attention over the same dequantized cache, relative to the output's max |value|.

    python bench/probes/grouped_int8_cost.py [--pasts 128,3500] [--new-rows 1,5] [--layers 28] [--check-kernels]

Prints ms per call (median of ``--calls``; the grouped rows include the runtime's write of the new rows) and the
relative error. Time it alone on the machine. Built and measured on 2026-12-03 (docs/benchmarks.md, "Why onnxruntime's attention sets the long-context floor"; output in ``bench/results/grouped-int8-cost-2026-12-03-xeon167.txt``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

H, KV, D = 12, 2, 128  # Qwen2.5-1.5B (the target)
G = H // KV
CAPACITY = 4096


class Graph:
    def __init__(self) -> None:
        self.nodes, self.inits, self.n = [], [], 0

    def op(self, kind: str, ins: list[str], domain: str = "", **attrs) -> str:
        self.n += 1
        out = f"{kind}_{self.n}"
        self.nodes.append(helper.make_node(kind, ins, [out], domain=domain, **attrs))
        return out

    def const(self, name: str, value) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name


def grouped_layer(g: Graph, i: int, q_levels: int) -> tuple[str, str, str]:
    """Nodes of one layer; returns (attention output (T, H·D), new K uint8 (T, KV·D), new V int8 (T, KV·D))."""
    # q float32 (T, H, D) → (KV, G·T, D): rows of KV head h are its G query heads × T new rows
    q = g.op("Reshape", [g.op("Transpose", [g.op("Reshape", [f"q{i}", "c/T_KV_G_D"])], perm=[1, 2, 0, 3]), "c/KV_GT_D"])
    qs = g.op("Mul", [q, f"ks_r{i}"])  # k_s folded into the query (KV, GT, D)
    sq = g.op("Max", [g.op("Div", [g.op("ReduceMax", [g.op("Abs", [qs]), "c/last"], keepdims=1), "c/127"]), "c/tiny"])
    x = g.op("Div", [qs, sq])  # in [−127, 127]
    b1 = g.op("Round", [x])
    levels, col_scale = [b1], [sq]
    if q_levels == 2:  # the rest, x − b1 in [−0.5, 0.5], as a second int8 level 254× finer
        levels.append(g.op("Round", [g.op("Mul", [g.op("Sub", [x, b1]), "c/254"])]))
        col_scale.append(g.op("Div", [sq, "c/254"]))
    # B (KV·D, L·KV·GT) int8, block diagonal over the KV heads, columns ordered (level, KV head, row)
    b = g.op("Concat", [g.op("Unsqueeze", [x_, "c/ax0"]) for x_ in levels], axis=0)  # (L, KV, GT, D)
    b = g.op("Unsqueeze", [g.op("Transpose", [b], perm=[1, 3, 0, 2]), "c/ax3"])  # (KV, D, L, 1, GT)
    b = g.op("Cast", [g.op("Reshape", [g.op("Mul", [b, "c/eye5"]), "c/KVD_m1"])], to=TP.INT8)
    cs = g.op("Concat", [g.op("Reshape", [c_, "c/m1"]) for c_ in col_scale], axis=0)  # (L·KV·GT,)
    s = g.op("Cast", [g.op("MatMulInteger", [f"k{i}", b, "c/zp128"])], to=TP.FLOAT)  # (W, L·KV·GT)
    s = g.op("Mul", [s, g.op("Mul", [cs, "c/inv_sqrt_d"])])
    if q_levels == 2:
        n = g.op("Slice", [g.op("Shape", [cs]), "c/zero_i", "c/one_i"])
        half = g.op("Div", [n, "c/two_i"])
        s = g.op("Add", [g.op("Slice", [s, "c/zero_i", half, "c/one_i"]), g.op("Slice", [s, half, n, "c/one_i"])])
    s = g.op("Transpose", [g.op("Reshape", [s, "c/W_KV_m1"])], perm=[1, 2, 0])  # (KV, GT, W)
    # new rows' scores from float32 under the additive mask (T, T)
    kn = g.op("Transpose", [g.op("Reshape", [f"k_new{i}", "c/T_KV_D"])], perm=[1, 2, 0])  # (KV, D, T)
    sn = g.op("Reshape", [g.op("Mul", [g.op("MatMul", [q, kn]), "c/inv_sqrt_d"]), "c/KVG_T_T"])
    sn = g.op("Reshape", [g.op("Add", [sn, "mask"]), "c/KV_GT_T"])
    p = g.op("Softmax", [g.op("Concat", [s, sn], axis=-1)], axis=-1)
    w = g.op("Slice", [g.op("Shape", [s]), "c/m1", "c/big"])  # [W]
    pp = g.op("Slice", [p, "c/zero_i", w, "c/m1"])
    pn = g.op("Slice", [p, w, "c/big", "c/m1"])
    # P over the past in two uint8 levels: x = p / s1 in [0, 255] (s1 = row max / 255), p1 = ⌊x⌋,
    # p2 = round(254·(x − p1)) in [0, 254], p = s1·(p1 + p2 / 254)
    s1 = g.op("Max", [g.op("Div", [g.op("ReduceMax", [pp, "c/last"], keepdims=1), "c/255"]), "c/tiny"])  # (KV, GT, 1)
    x = g.op("Div", [pp, s1])
    p1 = g.op("Floor", [x])
    p2 = g.op("Round", [g.op("Mul", [g.op("Sub", [x, p1]), "c/254"])])
    a = g.op("Cast", [g.op("Flatten", [g.op("Concat", [p1, p2], axis=1)], axis=2)], to=TP.UINT8)  # (KV·2GT, W)
    o = g.op("Mul", [g.op("Cast", [g.op("MatMulInteger", [a, f"v{i}"])], to=TP.FLOAT), f"vs{i}v"])  # (KV·2GT, KV·D)
    lv = g.op("Concat", [s1, g.op("Div", [s1, "c/254"])], axis=1)  # (KV, 2GT, 1)
    oa = g.op("Reshape", [g.op("Mul", [g.op("Reshape", [o, "c/KV_m1_KVD"]), lv]), "c/KV_2_GT_KVD"])
    oa = g.op("ReduceSum", [oa, "c/ax1"], keepdims=0)  # (KV, GT, KV·D)
    oa = g.op("ReduceSum", [g.op("Mul", [g.op("Reshape", [oa, "c/KV_GT_KV_D"]), "c/eye"]), "c/ax2"], keepdims=0)
    vn = g.op("Transpose", [g.op("Reshape", [f"v_new{i}", "c/T_KV_D"])], perm=[1, 0, 2])  # (KV, T, D)
    out = g.op("Reshape", [g.op("Add", [oa, g.op("MatMul", [pn, vn])]), "c/KV_G_T_D"])
    out = g.op("Reshape", [g.op("Transpose", [out], perm=[2, 0, 1, 3]), "c/T_HD"])
    # the new rows, quantized for the cache
    kq = g.op("Clip", [g.op("Round", [g.op("Div", [f"k_new{i}", f"ks{i}v"])]), "c/m127", "c/127"])
    kq = g.op("Cast", [g.op("Add", [kq, "c/128f"])], to=TP.UINT8)
    vq = g.op("Cast", [g.op("Clip", [g.op("Round", [g.op("Div", [f"v_new{i}", f"vs{i}v"])]), "c/m127", "c/127"])], to=TP.INT8)
    return out, kq, vq


def grouped_model(layers: int, scales, q_levels: int = 2) -> bytes:
    g = Graph()
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    f32 = lambda v: np.array(v, np.float32)  # noqa: E731
    for name, v in {"c/T_KV_G_D": i64(-1, KV, G, D), "c/KV_GT_D": i64(KV, -1, D), "c/last": i64(-1),
                    "c/ax1": i64(1), "c/ax2": i64(2), "c/KVD_m1": i64(KV * D, -1), "c/m1": i64(-1),
                    "c/W_KV_m1": i64(0, KV, -1),
                    "c/T_KV_D": i64(-1, KV, D), "c/KVG_T_T": i64(KV * G, -1, 0), "c/KV_GT_T": i64(KV, -1, 0),
                    "c/one_i": i64(1), "c/two_i": i64(2), "c/ax0": i64(0), "c/ax3": i64(3), "c/big": i64(1 << 40), "c/zero_i": i64(0),
                    "c/KV_2_GT_KVD": i64(KV, 2, -1, KV * D), "c/KV_m1_KVD": i64(KV, -1, KV * D), "c/KV_GT_KV_D": i64(KV, -1, KV, D), "c/KV_G_T_D": i64(KV, G, -1, D), "c/T_HD": i64(-1, H * D)}.items():
        g.const(name, v)
    for name, v in {"c/127": 127, "c/m127": -127, "c/255": 255, "c/254": 254, "c/tiny": 1e-30, "c/128f": 128,
                    "c/inv_sqrt_d": 1 / np.sqrt(D)}.items():
        g.const(name, f32(v))
    g.const("c/zp128", np.array(128, np.uint8))
    g.const("c/eye", np.eye(KV, dtype=np.float32).reshape(KV, 1, KV, 1))
    g.const("c/eye5", np.eye(KV, dtype=np.float32).reshape(KV, 1, 1, KV, 1))
    info = helper.make_tensor_value_info
    ins = [info("mask", TP.FLOAT, ["T", "T"])]
    outs = []
    for i in range(layers):
        ks, vs = scales[i]
        g.const(f"ks_r{i}", ks.reshape(KV, 1, D))
        g.const(f"ks{i}v", ks), g.const(f"vs{i}v", vs)
        ins += [info(f"k{i}", TP.UINT8, ["W", KV * D]), info(f"v{i}", TP.INT8, ["W", KV * D]),
                info(f"q{i}", TP.FLOAT, ["T", H, D]), info(f"k_new{i}", TP.FLOAT, ["T", KV * D]),
                info(f"v_new{i}", TP.FLOAT, ["T", KV * D])]  # each layer its own (no common-subexpression merge)
        out, kq, vq = grouped_layer(g, i, q_levels)
        for name, src, t in ((f"out{i}", out, TP.FLOAT), (f"kq{i}", kq, TP.UINT8), (f"vq{i}", vq, TP.INT8)):
            g.nodes.append(helper.make_node("Identity", [src], [name]))
            outs.append(info(name, t, None))
    m = helper.make_model(helper.make_graph(g.nodes, "grouped_int8", ins, outs, g.inits),
                          opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 9
    return m.SerializeToString()


def gqa_model(layers: int, int8: bool, scales=None) -> bytes:
    """``layers`` GroupQueryAttention nodes on their own in-place caches; int8: PER_CHANNEL with ``scales``."""
    info = helper.make_tensor_value_info
    dt = TP.INT8 if int8 else TP.FLOAT
    ins = [info("qkv", TP.FLOAT, [1, "T", (H + 2 * KV) * D]), info("seqlens_k", TP.INT32, [1]),
           info("total", TP.INT32, []), info("bias", TP.FLOAT, [1, 1, "T", "S"])]
    nodes, outs, inits = [], [], []
    for i in range(layers):
        ins += [info(f"pk{i}", dt, [1, KV, "C", D]), info(f"pv{i}", dt, [1, KV, "C", D])]
        names = ["qkv", "", "", f"pk{i}", f"pv{i}", "seqlens_k", "total", "", "", "", "bias"]
        kw = dict(num_heads=H, kv_num_heads=KV, do_rotary=0)
        if int8:
            names += ["", f"ks{i}", f"vs{i}"]
            for n, sc in zip((f"ks{i}", f"vs{i}"), scales[i]):
                inits.append(numpy_helper.from_array(sc.reshape(1, KV, 1, D).astype(np.float32), n))
            kw.update(k_quant_type="PER_CHANNEL", v_quant_type="PER_CHANNEL", kv_cache_bit_width=8)
        nodes.append(helper.make_node("GroupQueryAttention", names, [f"out{i}", f"prk{i}", f"prv{i}"],
                                      domain="com.microsoft", **kw))
        outs += [info(f"out{i}", TP.FLOAT, None), info(f"prk{i}", dt, None), info(f"prv{i}", dt, None)]
    m = helper.make_model(helper.make_graph(nodes, "gqa", ins, outs, inits),
                          opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m.SerializeToString()


def session(model: bytes, threads: int, shared: bool) -> ort.InferenceSession:
    if shared:  # what the CLI, bench and serve run on
        from edgespec.io.onnx_model import session_options, use_shared_thread_pool

        use_shared_thread_pool(threads)
        so = session_options()
    else:
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def timed(fn, calls: int) -> float:
    for _ in range(3):
        fn()
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def causal(t: int) -> np.ndarray:
    return np.triu(np.full((t, t), np.finfo(np.float32).min, np.float32), 1)


def reference(q, k_past, v_past, k_new, v_new):
    """float32 attention of one layer: q (T, H, D), k/v past (W, KV·D), new (T, KV·D) → (T, H·D)."""
    t = q.shape[0]
    out = np.zeros((t, H, D), np.float32)
    for h in range(H):
        kv = h // G
        k = np.concatenate([k_past[:, kv * D:(kv + 1) * D], k_new[:, kv * D:(kv + 1) * D]])
        v = np.concatenate([v_past[:, kv * D:(kv + 1) * D], v_new[:, kv * D:(kv + 1) * D]])
        s = q[:, h] @ k.T / np.sqrt(D)
        s[:, k_past.shape[0]:] += causal(t)
        p = np.exp(s - s.max(-1, keepdims=True))
        out[:, h] = (p / p.sum(-1, keepdims=True)) @ v
    return out.reshape(t, H * D)


def integer_gemm_saturates() -> bool:
    """True on an x86 CPU without VNNI or AMX (or whose flags cannot be read): there MLAS's uint8 × int8 kernel
    adds pairs of products in saturating int16 (``vpmaddubsw``), and 255 · 127 · 2 overflows it, so this
    formulation's 8-bit levels are wrong there (they would need 7-bit values). ARM's kernels do not saturate."""
    import platform

    from edgespec.bench.runner import cpus

    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return False
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    return not (cpus().get("vnni") or "amx_int8" in text)


def check_kernels(threads: int, past: int = 3500) -> None:
    """MatMulInteger alone on the two products' shapes at one decode row (G·T = 6 rows per KV head, both KV
    heads, two levels: 24 query columns or 25 P rows): which operand types have a fast kernel here."""
    info = helper.make_tensor_value_info
    rng = np.random.default_rng(1)
    cases = [("scores: K uint8 (W, 256) × Q int8 (256, 24)", TP.UINT8, TP.INT8, (past, 256), (256, 24)),
             ("scores: K int8 (W, 256) × Q int8 (256, 24)", TP.INT8, TP.INT8, (past, 256), (256, 24)),
             ("P · V: P uint8 (25, W) × V int8 (W, 256)", TP.UINT8, TP.INT8, (25, past), (past, 256)),
             ("P · V: P int8 (25, W) × V int8 (W, 256)", TP.INT8, TP.INT8, (25, past), (past, 256))]
    for label, ta, tb, sa, sb in cases:
        node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
        m = helper.make_model(helper.make_graph([node], "mmi", [info("a", ta, sa), info("b", tb, sb)],
                                                [info("y", TP.INT32, None)]), opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        s = session(m.SerializeToString(), threads, False)
        io = s.io_binding()
        for name, t, shape in (("a", ta, sa), ("b", tb, sb)):
            dt = np.uint8 if t == TP.UINT8 else np.int8
            io.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(rng.integers(0, 120, shape).astype(dt)))
        io.bind_output("y")
        print(f"{label}, past {past}: {timed(lambda: s.run_with_iobinding(io), 200):.3f} ms", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pasts", default="128,3500")
    ap.add_argument("--new-rows", default="1,5")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pool", choices=("shared", "session"), default="shared",
                    help="shared: edgespec's process-wide pool (the CLI's); session: a per-session pool, no spinning")
    ap.add_argument("--check-kernels", action="store_true", help="also time MatMulInteger alone per operand type")
    a = ap.parse_args()
    if integer_gemm_saturates():
        print("warning: this CPU has no VNNI/AMX: MLAS's uint8 × int8 kernel saturates in int16 here, so the grouped "
              "rows' errors and times are not this formulation's", flush=True)
    if a.check_kernels:
        check_kernels(a.threads)
    rng = np.random.default_rng(0)
    L = a.layers
    chan = np.exp(rng.normal(0, 1.0, (L, KV * D))).astype(np.float32)  # outlier channels
    k32 = [(rng.standard_normal((CAPACITY, KV * D)) * chan[i]).astype(np.float32) for i in range(L)]
    v32 = [rng.standard_normal((CAPACITY, KV * D)).astype(np.float32) for i in range(L)]
    scales = [(np.abs(k32[i]).max(0) / 127, np.abs(v32[i]).max(0) / 127) for i in range(L)]
    k8 = [(np.clip(np.rint(k32[i] / scales[i][0]), -127, 127) + 128).astype(np.uint8) for i in range(L)]
    v8 = [np.clip(np.rint(v32[i] / scales[i][1]), -127, 127).astype(np.int8) for i in range(L)]
    print(f"{L} layers of {H} query heads, {KV} KV heads, D = {D}, {a.threads} threads; ms per call (median of {a.calls})",
          flush=True)
    grouped = {lv: session(grouped_model(L, scales, lv), a.threads, a.pool == "shared") for lv in (1, 2)}
    gqa8, gqa32 = (session(gqa_model(L, int8, scales), a.threads, a.pool == "shared") for int8 in (True, False))
    gqa_k8 = [np.ascontiguousarray((k8[i].astype(np.int16) - 128).astype(np.int8).reshape(CAPACITY, KV, D).transpose(1, 0, 2))[None] for i in range(L)]
    gqa_v8 = [np.ascontiguousarray(v8[i].reshape(CAPACITY, KV, D).transpose(1, 0, 2))[None] for i in range(L)]
    gqa_k32 = [np.ascontiguousarray(k32[i].reshape(CAPACITY, KV, D).transpose(1, 0, 2))[None] for i in range(L)]
    gqa_v32 = [np.ascontiguousarray(v32[i].reshape(CAPACITY, KV, D).transpose(1, 0, 2))[None] for i in range(L)]
    for t in (int(x) for x in a.new_rows.split(",")):
        for past in (int(x) for x in a.pasts.split(",")):
            q = rng.standard_normal((t, H, D)).astype(np.float32)
            k_new = (rng.standard_normal((t, KV * D)) * chan[0]).astype(np.float32)
            v_new = rng.standard_normal((t, KV * D)).astype(np.float32)
            kd = (k8[0][:past].astype(np.float32) - 128) * scales[0][0]
            vd = v8[0][:past].astype(np.float32) * scales[0][1]
            ref = reference(q, kd, vd, k_new, v_new)
            res = {}
            for lv, sess in grouped.items():  # past bound by pointer as row prefixes; new rows written back
                io = sess.io_binding()
                io.bind_cpu_input("mask", causal(t))
                bufs_k, bufs_v = [b.copy() for b in k8], [b.copy() for b in v8]
                for i in range(L):
                    io.bind_input(f"k{i}", "cpu", 0, np.uint8, [past, KV * D], bufs_k[i].ctypes.data)
                    io.bind_input(f"v{i}", "cpu", 0, np.int8, [past, KV * D], bufs_v[i].ctypes.data)
                    io.bind_cpu_input(f"q{i}", q), io.bind_cpu_input(f"k_new{i}", k_new)
                    io.bind_cpu_input(f"v_new{i}", v_new)
                    for n in (f"out{i}", f"kq{i}", f"vq{i}"):
                        io.bind_output(n)

                def step_grouped(sess=sess, io=io, bufs_k=bufs_k, bufs_v=bufs_v):
                    sess.run_with_iobinding(io)
                    o = io.get_outputs()
                    for i in range(L):
                        bufs_k[i][past:past + t] = o[3 * i + 1].numpy()
                        bufs_v[i][past:past + t] = o[3 * i + 2].numpy()

                ms = timed(step_grouped, a.calls)
                err = np.abs(io.get_outputs()[0].numpy() - ref).max() / np.abs(ref).max()
                res[f"grouped int8 (MatMulInteger), {lv}-level Q, 2-level P"] = (ms, err)
            for label, s, kb, vb, dt in (("GroupQueryAttention int8 PER_CHANNEL (--kv-int8)", gqa8, gqa_k8, gqa_v8, np.int8),
                                         ("GroupQueryAttention float32 (default export)", gqa32, gqa_k32, gqa_v32, np.float32)):
                io2 = s.io_binding()
                qkv = np.concatenate([q.reshape(t, H * D), k_new, v_new], axis=1)[None]
                io2.bind_cpu_input("qkv", qkv.astype(np.float32))
                io2.bind_cpu_input("seqlens_k", np.array([past + t - 1], np.int32))
                io2.bind_cpu_input("total", np.array(past + t, np.int32))
                bias = np.zeros((1, 1, t, past + t), np.float32)
                bias[0, 0, :, past:] = causal(t)
                io2.bind_cpu_input("bias", bias)
                vals = []
                for i in range(L):
                    kk = ort.OrtValue.ortvalue_from_numpy(kb[i].copy())
                    vv = ort.OrtValue.ortvalue_from_numpy(vb[i].copy())
                    vals += [kk, vv]
                    io2.bind_ortvalue_input(f"pk{i}", kk), io2.bind_ortvalue_input(f"pv{i}", vv)
                    io2.bind_ortvalue_output(f"prk{i}", kk), io2.bind_ortvalue_output(f"prv{i}", vv)
                    io2.bind_output(f"out{i}")
                ms = timed(lambda: s.run_with_iobinding(io2), a.calls)
                res[label] = (ms, None)
            for label, (ms, err) in res.items():
                extra = f", max |Δ| / max |out| vs float32 over the int8 cache {err:.2e}" if err is not None else ""
                print(f"{t} new row(s), past {past}: {label}: {ms:.2f} ms{extra}", flush=True)


if __name__ == "__main__":
    main()
