"""An int8 KV cache for graph format 4, measured on a real export: speed after a long past, and agreement.

Graph format 4 (``export/grouped_graph.py``) reads each KV head's past in place as float32 (W, D). This probe
rewrites a format-4 target so that the chosen kinds (``--kinds value`` or ``key,value``) enter as int8 (W, D)
with one float32 scale per cached position (W,) (symmetric absmax per row of each KV head: q = round(x / s),
s = max|x| / 127), widened inside the graph by ``DequantizeLinear`` (axis 0) right before the product that reads
them. The cache then holds 1 byte per value instead of 4, and a step reads 4× fewer cache bytes from memory; the
widened copy is one (W, D) block per head, written and read at once (cache-resident). The runtime quantizes the
T new rows of each run (``present``) as it stores them. Nothing else changes: rotary, masks, the new rows'
own score block (full precision, as they are exact for this run).

Both targets decode real text side by side (a Python standard-library source file, which every machine has),
teacher-forced with the float32-cache target's argmax, alternating step by step in one process:

    python bench/probes/kv_int8_probe.py ~/.cache/edgespec/exports/qwen-f4 --past 3500 --steps 48 --kinds value
    python bench/probes/kv_int8_probe.py ~/.cache/edgespec/exports/qwen-f4 --past 128 --steps 48 --kinds key,value

prints the argmax agreement, the max |Δ logit| of the prefill's last row and of the steps, and ms per step of
each (median). Time it only alone on the machine. The rewritten graph goes to a scratch directory beside the
export's files (hard links to its weights), removed at exit.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from edgespec.export import kv_int8
from onnx import TensorProto, helper

from edgespec.io import onnx_model as om
from edgespec.io.grouped_kv import WINDOW, GroupedKVCache, past_names
from edgespec.io.manifest import load_manifest


def scale_name(name: str) -> str:
    """``past_key_values.{i}.{kind}.{h}`` → ``past_scales.{i}.{kind}.{h}``: its per-position scales float32 (W,)."""
    return "past_scales." + name.split(".", 1)[1]


def rewrite(src: Path, dst: Path, kinds: set[str], method: str = "dequant") -> list[str]:
    """Write ``dst`` (model.onnx, its data hard-linked): ``src`` with the past inputs of ``kinds`` int8 plus
    scales. ``method`` "dequant": each widened by one ``DequantizeLinear``; "qgemm" (values only): the product
    P · V as ``com.microsoft.DynamicQuantizeMatMul`` of (P × the per-position scales) and the int8 V (P quantized
    to uint8 per tensor inside, onnxruntime's QGEMM). Returns the rewritten input names."""
    m = onnx.load(str(src), load_external_data=False)
    g = m.graph
    if method == "kfirst":  # float32 cache; scores as (K_past · Q_hᵀ)ᵀ: the long operand is A, never packed
        for node in [x for x in g.node if x.name.endswith("/past_scores")]:
            q, k = node.input
            alpha = next(a.f for a in node.attribute if a.name == "alpha")
            out, at = node.output[0], list(g.node).index(node)
            g.node.remove(node)
            g.node.insert(at, helper.make_node("Transpose", [q], [out + "/qT"], name=out + "/qT", perm=[0, 2, 1]))
            g.node.insert(at + 1, helper.make_node("FusedMatMul", [k, out + "/qT"], [out + "/sT"], name=out + "/KQ",
                                                   domain="com.microsoft", alpha=alpha))
            g.node.insert(at + 2, helper.make_node("Transpose", [out + "/sT"], [out], name=out + "/T",
                                                   perm=[0, 2, 1]))
        kinds = set()
    names = [i.name for i in g.input if i.name.startswith("past_key_values.") and i.name.split(".")[2] in kinds]
    for inp in g.input:
        if inp.name in names:
            inp.type.tensor_type.elem_type = TensorProto.FLOAT16 if method == "fp16" else TensorProto.INT8
    if method == "fp16":  # no scales: each past input widened by one Cast (MLAS converts fp16 buffers in SIMD)
        for n in names:
            for node in g.node:
                node.input[:] = [n + "/fp32" if x == n else x for x in node.input]
            g.node.insert(0, helper.make_node("Cast", [n], [n + "/fp32"], name=n + "/Cast", to=TensorProto.FLOAT))
        names = []
    if method == "qgemm":
        g.initializer.append(onnx.numpy_helper.from_array(np.ones((1,), np.float32), "probe/one"))
    for n in names:
        g.input.append(helper.make_tensor_value_info(scale_name(n), TensorProto.FLOAT, ["past"]))
        if method == "qgemm":
            (node,) = [x for x in g.node if x.op_type == "MatMul" and n in x.input]
            p = node.input[0]
            node.op_type, node.domain = "DynamicQuantizeMatMul", "com.microsoft"
            node.input[:] = [n + "/P", n, "probe/one"]
            g.node.insert(list(g.node).index(node), helper.make_node("Mul", [p, scale_name(n)], [n + "/P"],
                                                                    name=n + "/scaleP"))
            continue
        wide = n + "/fp32"
        for node in g.node:
            node.input[:] = [wide if x == n else x for x in node.input]
        g.node.insert(0, helper.make_node("DequantizeLinear", [n, scale_name(n)], [wide], name=n + "/Dequantize",
                                          axis=0))
    onnx.save(m, str(dst / "model.onnx"))
    _link(src, dst)
    return names


def _link(src: Path, dst: Path) -> None:
    """Hard-link (or copy) ``src``'s data file into the directory ``dst``."""
    data = src.parent / "model.onnx.data"
    try:
        os.link(data, dst / "model.onnx.data")
    except OSError:
        shutil.copy2(data, dst / "model.onnx.data")


class Int8KV(GroupedKVCache):
    """Format 4's cache with the past of ``kinds`` int8 (one scale per position and KV head): a float32 block
    for the other kinds as before, an int8 block and a float32 scale block (2 · layers, kv, capacity)."""

    def __init__(self, spec, kinds: set[str], capacity: int = 4096, fp16: bool = False):
        self.kinds, self.fp16 = kinds, fp16
        self.quant = np.array([n.split(".")[2] in kinds for n in past_names(spec.num_layers, 1)])  # per 2L
        super().__init__(spec.num_layers, spec.num_kv_heads, spec.head_dim, capacity, spec.context_length)

    def _alloc(self, capacity, n, old=None):
        super()._alloc(capacity, n, old)
        kv, hd = self._shape[1], self._shape[2]
        self.qblock = np.zeros((n, kv, capacity, hd), np.float16 if self.fp16 else np.int8)
        self.scales = np.zeros((n, kv, capacity), np.float32)

    def _window(self, io_entry, past):
        io, w = io_entry
        if w is not None and past <= w < past + 2 * WINDOW:
            return w
        w = min(self.capacity, -(-past // WINDOW) * WINDOW)
        kv, hd = self.block.shape[1], self.block.shape[3]
        for j, name in enumerate(self.names):
            layer_kind, h = divmod(j, kv)
            if self.quant[layer_kind]:
                io.bind_input(name, "cpu", 0, self.qblock.dtype, [w, hd], self.qblock[layer_kind, h].ctypes.data)
                if not self.fp16:
                    io.bind_input(scale_name(name), "cpu", 0, np.float32, [w],
                                  self.scales[layer_kind, h].ctypes.data)
            else:
                io.bind_input(name, "cpu", 0, np.float32, [w, hd], self.block[layer_kind, h].ctypes.data)
        io_entry[1] = w
        return w

    def store(self, new, past, total):
        """The float32 rows as before, and the quantized kinds' rows int8 (fp16) with their scales."""
        self.block[:, :, past:total] = new
        q = new[self.quant]
        if self.fp16:
            self.qblock[self.quant, :, past:total] = q.astype(np.float16)
            return
        s = np.abs(q).max(-1) / 127.0  # (n, kv, T)
        s[s == 0] = 1.0
        self.qblock[self.quant, :, past:total] = np.rint(q / s[..., None]).astype(np.int8)
        self.scales[self.quant, :, past:total] = s


def text_ids(tok_path: Path, n: int, modules=("json.decoder", "argparse", "subprocess")) -> list[int]:
    """``n`` token ids of standard-library source (json/decoder.py, then more modules as needed)."""
    import importlib

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_path))
    ids: list[int] = []
    for name in modules:
        ids += tok.encode(Path(inspect.getsourcefile(importlib.import_module(name))).read_text()).ids
        if len(ids) >= n:
            return ids[:n]
    raise SystemExit(f"not {n} tokens of source")


def _cpu() -> str:
    try:
        return next(x.split(":", 1)[1].strip() for x in open("/proc/cpuinfo") if x.startswith("model name"))
    except (OSError, StopIteration):
        import platform

        return platform.processor()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export", help="a graph-format-4 export")
    ap.add_argument("--past", type=int, default=3500)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--kinds", default="value", help="value, key or key,value")
    ap.add_argument("--method", choices=("dequant", "qgemm", "fp16", "kfirst", "gqa-channel"), default="dequant")
    ap.add_argument("--out", default=None, help="append the result as a JSON line to this file")
    a = ap.parse_args()
    kinds = set(a.kinds.split(","))
    if a.method == "kfirst":
        kinds = set()
    elif not kinds or kinds - {"key", "value"}:
        raise SystemExit("--kinds: value, key or key,value")
    if a.method == "qgemm" and kinds != {"value"}:
        raise SystemExit("--method qgemm: --kinds value only (int8 K has no transposed QGEMM form)")
    export = Path(a.export).expanduser()
    spec = load_manifest(export).target
    gqa = a.method.startswith("gqa")
    if spec.graph_format != (3 if gqa else 4):
        raise SystemExit(f"{export}: graph format {spec.graph_format}, not {3 if gqa else 4} for --method {a.method}")
    om.use_shared_thread_pool()
    ref = om.OnnxLM(spec, export)
    with tempfile.TemporaryDirectory(dir=export / "target", prefix=".int8kv-") as tmp:
        ids = text_ids(export / "tokenizer.json", a.past + a.steps + 1)
        prompt, cont = ids[:a.past], ids[a.past:]
        if gqa:  # static scales from another text (typing.py), absmax over its positions, per layer and kind
            calib = text_ids(export / "tokenizer.json", 2048, ("typing",))
            c = ref.new_cache()
            for i in range(0, len(calib), 256):
                ref.forward(calib[i:i + 256], c, keep=1)
            names = [n for pair in spec.past_names() for n in pair]  # per channel: (1, kv_heads, 1, head_dim)
            scales = {n: (np.abs(t).max(axis=(0, 2), keepdims=True) / 127.0).astype(np.float32)
                      for n, t in zip(names, c.tensors)}
            _link(export / spec.path, Path(tmp))
            kv_int8.rewrite(export / spec.path, scales, Path(tmp) / "model.onnx")  # the exporter's rewrite
            lm = om.OnnxLM.from_session(spec, om.open_session(Path(tmp) / "model.onnx"))
            caches = [ref.new_cache(), om.InPlaceKVCache(spec.num_layers, spec.num_kv_heads, spec.head_dim, 4096,
                                                         spec.context_length, np.int8)]
        else:
            rewrite(export / spec.path, Path(tmp), kinds, a.method)
            lm = om.OnnxLM.from_session(spec, om.open_session(Path(tmp) / "model.onnx"))
            caches = [ref.new_cache(), Int8KV(spec, kinds, fp16=a.method == "fp16")]
        last = []
        for m, c in zip((ref, lm), caches):
            for i in range(0, a.past, 256):
                row = m.forward(prompt[i:i + 256], c, keep=1)
            last.append(row[-1])
        worst = float(np.abs(last[0] - last[1]).max())
        tok, agree, step_worst, ms = int(last[0].argmax()), int(last[0].argmax() == last[1].argmax()), 0.0, [[], []]
        forced = 0
        for j in range(a.steps):
            rows = []
            for i, (m, c) in enumerate(zip((ref, lm), caches)):
                t0 = time.perf_counter()
                rows.append(m.forward([tok], c)[-1])
                ms[i].append((time.perf_counter() - t0) * 1e3)
            agree += int(rows[0].argmax() == rows[1].argmax())
            step_worst = max(step_worst, float(np.abs(rows[0] - rows[1]).max()))
            forced += int(rows[0].argmax() == cont[j])
            tok = int(rows[0].argmax())
    res = {"past": a.past, "kinds": sorted(kinds), "method": a.method, "steps": a.steps, "agreement": agree / (a.steps + 1),
           "max_abs_logit_prefill": worst, "max_abs_logit_steps": step_worst,
           "ms_fp32": float(np.median(ms[0])), "ms_int8": float(np.median(ms[1])), "cpu": _cpu()}
    print(f"past {a.past}, {a.method} ({'+'.join(sorted(kinds)) or '-'}): argmax agreement {agree}/{a.steps + 1}, max |Δ logit| "
          f"prefill {worst:.2f}, steps {step_worst:.2f}; ms per step fp32 cache {res['ms_fp32']:.1f}, "
          f"int8 {res['ms_int8']:.1f} ({res['ms_fp32'] / res['ms_int8']:.2f}×)")
    if a.out:
        with open(a.out, "a", encoding="utf-8") as f:
            f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
