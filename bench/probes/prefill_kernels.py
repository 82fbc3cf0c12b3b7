"""Prefill kernels: is there a faster matmul than ``MatMulNBits`` for a prefill chunk, and what would it cost in
accuracy? (Issue 24, prefill ≥ llama.cpp's.)

Three parts, each optional:

- ``--kernels``: one prefill-chunk matmul, ``rows`` × K → N, timed four ways with onnxruntime's own ops on random
  weights: ``MatMulNBits`` int4 block 32 at accuracy level 4 (what exports use today), ``MatMulNBits`` 8-bit
  (block values of an int4 weight fit it exactly), ``DynamicQuantizeMatMul`` (int8 weights with one scale per
  output column, u8 activations: onnxruntime's QGEMM, which uses AMX/VNNI where the CPU has them) and fp32
  ``MatMul``. Median ms of interleaved repeats, and GFLOP/s = 2·rows·K·N / time.
- ``--errors EXPORT``: the real target's activations into seven of its matmuls (layers 0, 14, 27) on a
  128-token prompt of this repository's source, and the relative error ||Δy|| / ||y|| against the int4 weights
  in float64 of: the activations int8 per row and per 32-block (what accuracy level 4 does), int8 per-column
  weights alone, int8 per-column weights with int8 per-row activations (``DynamicQuantizeMatMul``-like, per row
  rather than per tensor), and that after SmoothQuant's migration (Xiao et al. 2023, eq. 4, alpha 0.5).
- ``--build-int8 EXPORT OUT``: a copy of EXPORT whose target's layer matmuls are ``DynamicQuantizeMatMul`` with
  int8 weights re-quantized per output column from the int4 block values (the head stays int4), with its
  manifest's file entries rewritten: time it with ``bench/prefill_sweep.py OUT --no-llama``.
- ``--agreement EXPORT INT8``: prefill 1,000 tokens of this repository's source with INT8's target (an int8 copy, or
  an export with its prefill graph, ``edgespec export --prefill-int8``; chunks as the runtime feeds them), then decode
  64 positions teacher-forced with EXPORT's (int4) target from the cache it wrote, against int4 throughout:
  argmax agreement and max |Δ logit| per prompt (3 prompts).

Writes ``--out``.json (llama_server.write_result) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: llama_server, peers
from llama_server import write_result
from peers import cpu_model

from edgespec.errors import EdgespecError
from edgespec.export.prefill_graph import dequantize_nbits, int8_columns

REPO = Path(__file__).resolve().parents[2]
OPSETS = [h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)]


def _model(nodes, inits, rows: int, k: int) -> bytes:
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [rows, k])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    return h.make_model(g, opset_imports=OPSETS).SerializeToString()


def kernel_models(rows: int, k: int, n: int, seed: int = 0) -> dict[str, bytes]:
    """The four matmuls of the module docstring on random weights, as serialized ONNX models (x float32 (rows, K))."""
    rng = np.random.default_rng(seed)
    nblk = k // 32
    models = {}
    for bits in (4, 8):
        b = rng.integers(0, 256, (n, nblk, 32 * bits // 8), dtype=np.uint8)
        s = (rng.random((n, nblk)) * 0.01).astype(np.float32)
        node = h.make_node("MatMulNBits", ["x", "b", "s"], ["y"], domain="com.microsoft", K=k, N=n, bits=bits,
                           block_size=32, accuracy_level=4)
        models[f"MatMulNBits int{bits} acc4"] = _model([node], [nh.from_array(b, "b"), nh.from_array(s, "s")], rows, k)
    w8 = rng.integers(-127, 128, (k, n), dtype=np.int8)
    sc = (rng.random(n) * 0.01).astype(np.float32)
    node = h.make_node("DynamicQuantizeMatMul", ["x", "w", "ws"], ["y"], domain="com.microsoft")
    models["DynamicQuantizeMatMul int8"] = _model([node], [nh.from_array(w8, "w"), nh.from_array(sc, "ws")], rows, k)
    w = (rng.standard_normal((k, n)) * 0.02).astype(np.float32)
    models["MatMul fp32"] = _model([h.make_node("MatMul", ["x", "w"], ["y"])], [nh.from_array(w, "w")], rows, k)
    return models


def time_kernels(rows: int, k: int, n: int, repeats: int, threads: int) -> list[dict]:
    """Median ms per run of each kernel, interleaved over ``repeats`` rounds of 5 runs."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sessions = {name: ort.InferenceSession(m, so, providers=["CPUExecutionProvider"])
                for name, m in kernel_models(rows, k, n).items()}
    x = {"x": np.random.default_rng(1).standard_normal((rows, k)).astype(np.float32)}
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for s in sessions.values():
        s.run(None, x)
    for _ in range(repeats):
        for name, s in sessions.items():
            t = time.perf_counter()
            for _ in range(5):
                s.run(None, x)
            times[name].append((time.perf_counter() - t) / 5 * 1e3)
    return [{"kernel": name, "ms": statistics.median(v), "gflops": 2 * rows * k * n / statistics.median(v) / 1e6}
            for name, v in times.items()]


def _load(src: Path) -> onnx.ModelProto:
    """``src`` with its external data, read from a private copy (onnx refuses data files with several hard
    links, as the user cache's exports may have)."""
    with tempfile.TemporaryDirectory() as d:
        for f in src.parent.iterdir():
            shutil.copy(f, d)
        return onnx.load(str(Path(d) / src.name))


def _nbits_nodes(model: onnx.ModelProto) -> list:
    return [nd for nd in model.graph.node if nd.op_type == "MatMulNBits" and "lm_head" not in nd.input[1]]


def dequantize(node, inits: dict) -> np.ndarray:
    """float32 (N, K) weights of a symmetric 4-bit ``MatMulNBits`` (no zero points: the value is q − 8)."""
    w = dequantize_nbits(node, inits, Path("."))
    if w is None:
        raise ValueError(f"{node.name}: only symmetric 4-bit MatMulNBits without zero points or bias")
    return w


def _q8(v: np.ndarray, axis: int) -> np.ndarray:
    s = np.abs(v).max(axis, keepdims=True) / 127
    s[s == 0] = 1
    return np.round(v / s) * s


def requant_errors(export: Path, picks=(0, 2, 3, 56, 58, 59, 111), tokens: int = 128) -> list[dict]:
    """Relative errors of the module docstring, one row per picked matmul (index among the layer matmuls)."""
    from tokenizers import Tokenizer

    src = export / "target" / "model.onnx"
    m = onnx.load(src, load_external_data=False)
    nodes = _nbits_nodes(m)
    pick = [nodes[i] for i in picks if i < len(nodes)]
    for nd in pick:
        m.graph.output.append(h.make_tensor_value_info(nd.input[0], TP.FLOAT, None))
    probe = src.with_name("prefill_kernels_probe.onnx")  # beside its external data, removed below
    onnx.save(m, probe)
    try:
        sess = ort.InferenceSession(str(probe), providers=["CPUExecutionProvider"])
    finally:
        probe.unlink()
    ids = Tokenizer.from_file(str(export / "tokenizer.json")).encode(
        (REPO / "edgespec" / "engine" / "decoder.py").read_text()).ids[:tokens]
    feeds = {}
    for i in sess.get_inputs():
        if i.name == "input_ids":
            feeds[i.name] = np.array([ids], np.int64)
        elif i.name == "position_ids":
            feeds[i.name] = np.arange(len(ids), dtype=np.int64)[None]
        elif i.name == "attention_mask":
            feeds[i.name] = np.tril(np.ones((len(ids), len(ids)), bool))[None, None]
        elif i.name == "logits_keep":
            feeds[i.name] = np.array([1], np.int64)
        elif i.name.startswith("past_key_values"):
            feeds[i.name] = np.zeros([1, i.shape[1], 2 * len(ids), i.shape[3]], np.float32)
        else:
            raise ValueError(f"{src}: input {i.name} is not one of a format-3 target's")
    outs = sess.run([nd.input[0] for nd in pick], feeds)
    inits = {t.name: t for t in _load(src).graph.initializer}
    rows = []
    for nd, x in zip(pick, outs):
        x = x.reshape(-1, x.shape[-1]).astype(np.float64)
        w = dequantize(nd, inits).astype(np.float64)
        y = x @ w.T
        mx, k = len(x), x.shape[1]
        r = np.sqrt(np.abs(x).max(0) / np.maximum(np.abs(w).max(0), 1e-12))
        r /= np.median(r)
        def err(yy, y=y):
            return float(np.linalg.norm(yy - y) / np.linalg.norm(y))

        rows.append({"matmul": nd.input[1].removesuffix("_Q4"),
                     "acc4_activations": err(_q8(x.reshape(mx, k // 32, 32), 2).reshape(mx, k) @ w.T),
                     "int8_col_weights": err(x @ _q8(w, 1).T),
                     "int8_col_weights_row_activations": err(_q8(x, 1) @ _q8(w, 1).T),
                     "smoothquant_0.5": err(_q8(x / r, 1) @ _q8(w * r, 1).T),
                     "activation_max_over_median_channel": float(np.abs(x).max(0).max() / np.median(np.abs(x).max(0)))})
    return rows


def build_int8(export: Path, out: Path, keep_int4: tuple[str, ...] = ()) -> int:
    """Write the int8-weight copy of ``export`` to ``out`` (module docstring); returns the matmuls replaced.
    Matmuls whose weight name contains one of ``keep_int4`` (e.g. ``down_proj``) stay int4."""
    if out.exists():
        raise ValueError(f"{out} exists")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(export, tmp, ignore=shutil.ignore_patterns("target"))
    (tmp / "target").mkdir()
    m = _load(export / "target" / "model.onnx")
    inits = {t.name: t for t in m.graph.initializer}
    drop, replaced = set(), 0
    for i, nd in enumerate(m.graph.node):
        if nd.op_type != "MatMulNBits" or any(k in nd.input[1] for k in ("lm_head",) + tuple(keep_int4)):
            continue
        w8, col = int8_columns(dequantize(nd, inits), bits=8)
        wn = nd.input[1] + "_i8"
        m.graph.initializer.extend([nh.from_array(w8, wn), nh.from_array(col.astype(np.float32), wn + "_scale")])
        drop.update(nd.input[1:])
        m.graph.node[i].CopyFrom(h.make_node("DynamicQuantizeMatMul", [nd.input[0], wn, wn + "_scale"],
                                             list(nd.output), name=nd.name + "_i8", domain="com.microsoft"))
        replaced += 1
    keep = [t for t in m.graph.initializer if t.name not in drop]
    del m.graph.initializer[:]
    m.graph.initializer.extend(keep)
    onnx.save(m, tmp / "target" / "model.onnx", save_as_external_data=True, location="model.onnx.data",
              size_threshold=0)
    manifest = json.loads((tmp / "edgespec.json").read_text())
    for f in ("target/model.onnx", "target/model.onnx.data"):
        manifest["files"][f] = {"size": (tmp / f).stat().st_size,
                                "sha256": hashlib.sha256((tmp / f).read_bytes()).hexdigest()}
    (tmp / "edgespec.json").write_text(json.dumps(manifest, indent=1))
    tmp.rename(out)
    return replaced


def hybrid_agreement(export: Path, int8: Path, tokens: int = 1000, steps: int = 64, prompts: int = 3) -> list[dict]:
    """Rows of the ``--agreement`` part of the module docstring."""
    from tokenizers import Tokenizer

    from edgespec.io import onnx_model as om
    from edgespec.io.manifest import load_manifest

    text = "".join(p.read_text() for d in ("engine", "io") for p in sorted((REPO / "edgespec" / d).glob("*.py")))
    ids = Tokenizer.from_file(str(export / "tokenizer.json")).encode(text).ids
    from edgespec.engine.decoder import forward_tokens

    int4 = om.OnnxLM(load_manifest(export).target, export, memory=om.SessionMemory(prefill_graph=False))
    pre8 = om.OnnxLM(load_manifest(int8).target, int8)  # an int8 copy, or an export with its prefill graph
    rows = []
    for j in range(prompts):
        start = j * (tokens + steps)
        prompt, cont = ids[start:start + tokens], ids[start + tokens:start + tokens + steps]
        if len(cont) < steps:
            raise ValueError(f"the source text has too few tokens for {prompts} prompts of {tokens + steps}")
        logits = {}
        for name, pre in (("int4", int4), ("int8-prefill", pre8)):
            cache = int4.new_cache()
            out = [forward_tokens(pre, prompt, cache).copy()]  # in the runtime's chunks
            out += [int4.forward([t], cache)[-1].copy() for t in cont[:-1]]
            logits[name] = np.array(out)
        a, b = logits["int4"], logits["int8-prefill"]
        rows.append({"prompt": j, "positions": steps, "argmax_agreement": float((a.argmax(1) == b.argmax(1)).mean()),
                     "max_abs_logit_diff": float(np.abs(a - b).max())})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", action="store_true", help="time the four kernels")
    ap.add_argument("--rows", type=int, default=256, help="rows of the chunk (default 256, the prefill chunk)")
    ap.add_argument("--k", type=int, default=1536)
    ap.add_argument("--n", type=int, default=8960)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--errors", type=Path, metavar="EXPORT", help="re-quantization errors on this export's target")
    ap.add_argument("--agreement", nargs=2, type=Path, metavar=("EXPORT", "INT8"))
    ap.add_argument("--build-int8", nargs=2, type=Path, metavar=("EXPORT", "OUT"))
    ap.add_argument("--keep-int4", default="", help="with --build-int8: comma-separated weight-name parts left int4")
    ap.add_argument("--out", type=Path, default=Path("bench/results/prefill-kernels"))
    a = ap.parse_args(argv)
    if not (a.kernels or a.errors or a.build_int8 or a.agreement):
        ap.error("nothing to do: give --kernels, --errors EXPORT, --build-int8 EXPORT OUT or --agreement EXPORT INT8")
    try:
        if a.build_int8:
            n = build_int8(*a.build_int8, tuple(filter(None, a.keep_int4.split(","))))
            print(f"{n} matmuls replaced: {a.build_int8[1]}")
            if not (a.kernels or a.errors or a.agreement):
                return 0
        result = {"cpu": cpu_model(), "onnxruntime": ort.__version__}
        if a.kernels:
            result["kernels"] = {"rows": a.rows, "k": a.k, "n": a.n, "threads": a.threads,
                                 "results": time_kernels(a.rows, a.k, a.n, a.repeats, a.threads)}
        if a.errors:
            result["errors"] = requant_errors(a.errors)
        if a.agreement:
            result["agreement"] = hybrid_agreement(*a.agreement)
    except (OSError, ValueError, EdgespecError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    write_result(a.out, result)
    for r in result.get("kernels", {}).get("results", []):
        print(f"| {r['kernel']} | {r['ms']:.1f} ms | {r['gflops']:.0f} GFLOP/s |")
    for r in result.get("errors", []) + result.get("agreement", []):
        print("| " + " | ".join(f"{v:.4f}" if isinstance(v, float) else str(v) for v in r.values()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
