"""What ``edgespec export`` costs and what its weight layout gives: wall time and peak RSS of a whole export into
an empty graph cache (each run in a fresh process); each int4 layout's accuracy against the source weights and its
decode and verify cost on this CPU; also writes the GGUF files and the tiny pair other benchmarks export.

    python bench/export_cost.py measure [TARGET DRAFT] [--block-size 32] [--profile small] [--repeats 1] [--out STEM]
    python bench/export_cost.py layouts MODEL.gguf [--layouts b32,b128,b128z,...] [--graphs DIR]
                                        [--measure accuracy,speed] [--out STEM]
    python bench/export_cost.py synthetic qwen2.5-7b OUT.gguf      # random Q4_0 weights of that model's shapes
    python bench/export_cost.py tiny OUT_DIR                       # the test suite's tiny pair, exported

``measure`` exports the pair (default: the default pair's recipe) with ``EDGESPEC_HOME`` set to a new directory
(so the graph cache is empty; a recipe's GGUF files are linked in from the user cache first, so downloading and
assembling them is not timed) and reports the child's wall time and ``ru_maxrss``. ``layouts`` writes MODEL's graph in each layout (``b128``: int4 blocks of
128; ``z``: with zero points; ``+down_proj=8``: those matmuls at 8 bits; ``+lm_head=8``) and measures, over 512
tokens of the Python standard library's ``argparse.py`` (text nobody here wrote): greedy agreement, mean
KL(p_source ‖ p_export) and mean negative log-likelihood of the next token against the numpy forward of the source
weights (:mod:`export.reference`), and the ms of a decode step (1 row) and a 5-row verify after a 128-token
past (the layouts interleaved, 3 × 7 calls, median). ``synthetic`` writes a GGUF
whose tensors have the shapes of a real model (random 4-bit blocks, a byte-level stand-in tokenizer), one tensor at
a time: an export of it measures what a model of that size costs without its weights (a 7B Q4_0 file is 4.3 GB).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# shapes of real models (their config.json): layers, hidden, ffn, heads, kv heads, vocab rows
SHAPES = {
    "qwen2.5-7b": (28, 3584, 18944, 28, 4, 152064),
    "qwen2.5-3b": (36, 2048, 11008, 16, 2, 151936),
    "qwen2.5-1.5b": (28, 1536, 8960, 12, 2, 151936),
}


def write_synthetic(shape: str, out: Path, seed: int = 0) -> Path:
    """A qwen2 GGUF of ``SHAPES[shape]`` with random Q4_0 weights (scales 2^-7), F32 norms and biases, and a
    258-token byte-level tokenizer; written one tensor at a time (memory: one tensor)."""
    import gguf
    from tokenizers import pre_tokenizers

    layers, hidden, ffn, heads, kv, vocab = SHAPES[shape]
    hd = hidden // heads
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(out), "qwen2")
    for key, value in (("block_count", layers), ("context_length", 32768), ("embedding_length", hidden),
                       ("feed_forward_length", ffn), ("attention.head_count", heads),
                       ("attention.head_count_kv", kv)):
        w.add_uint32(f"qwen2.{key}", value)
    w.add_float32("qwen2.rope.freq_base", 1e6)
    w.add_float32("qwen2.attention.layer_norm_rms_epsilon", 1e-6)
    tokens = sorted(pre_tokenizers.ByteLevel.alphabet()) + ["<|endoftext|>", "<|im_end|>"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * 256 + [3, 3])
    w.add_token_merges([])
    w.add_eos_token_id(257)
    w.add_pad_token_id(256)
    tensors = [("token_embd.weight", (vocab, hidden)), ("output.weight", (vocab, hidden)),
               ("output_norm.weight", (hidden,))]
    for i in range(layers):
        b = f"blk.{i}."
        tensors += [(b + "attn_norm.weight", (hidden,)), (b + "ffn_norm.weight", (hidden,)),
                    (b + "attn_q.weight", (hidden, hidden)), (b + "attn_q.bias", (hidden,)),
                    (b + "attn_k.weight", (kv * hd, hidden)), (b + "attn_k.bias", (kv * hd,)),
                    (b + "attn_v.weight", (kv * hd, hidden)), (b + "attn_v.bias", (kv * hd,)),
                    (b + "attn_output.weight", (hidden, hidden)), (b + "ffn_gate.weight", (ffn, hidden)),
                    (b + "ffn_up.weight", (ffn, hidden)), (b + "ffn_down.weight", (hidden, ffn))]
    q4 = gguf.GGMLQuantizationType.Q4_0
    for name, shp in tensors:  # (rows, cols): GGUF's dims are the other way round
        if len(shp) == 1:
            w.add_tensor_info(name, shp, np.dtype(np.float32), shp[0] * 4)
        else:
            w.add_tensor_info(name, (shp[0], shp[1] // 32 * 18), np.dtype(np.uint8), shp[0] * shp[1] // 32 * 18,
                              raw_dtype=q4)  # the byte shape
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    scale = np.array([2.0 ** -7], np.float16).view(np.uint8)
    for name, shp in tensors:
        if len(shp) == 1:
            data = (1.0 + 0.02 * rng.standard_normal(shp)).astype(np.float32) if "norm" in name else \
                (0.02 * rng.standard_normal(shp)).astype(np.float32)
        else:
            data = rng.integers(0, 256, (shp[0], shp[1] // 32, 18), dtype=np.uint8)
            data[..., :2] = scale
            data = data.reshape(shp[0], -1)
        w.write_tensor_data(data)
    w.close()
    return out


def measure_once(target: str, draft: str, block: int, home: Path, out: Path, profile: str = "small") -> dict:
    """One ``edgespec export --profile PROFILE`` in a fresh process: wall seconds and peak RSS (MB, the child's
    ru_maxrss)."""
    env = dict(os.environ, EDGESPEC_HOME=str(home))
    argv = [sys.executable, "-m", "edgespec.cli", "export", "--out", str(out), "--block-size", str(block),
            "--profile", profile]
    if target:
        argv += ["--target", target, "--draft", draft]
    t0 = time.perf_counter()
    with open(home / "export.log", "w") as log:
        p = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"export_cost: the export failed:\n{(home / 'export.log').read_text()[-2000:]}")
    lines = [ln for ln in (home / "export.log").read_text().replace("\r", "\n").splitlines()
             if "greedy agreement" in ln or "export complete" in ln]
    return {"wall_s": round(wall, 1), "peak_rss_mb": round(usage.ru_maxrss / 1024), "validation": lines}


def _link_recipe_ggufs(home: Path) -> None:
    """The user cache's assembled recipe GGUFs, hard-linked into ``home`` (downloads are not what is measured)."""
    from edgespec.io import paths

    src = paths.home() / "gguf"
    if src.is_dir():
        (home / "gguf").mkdir(parents=True, exist_ok=True)
        for f in src.glob("*.gguf"):
            os.link(f, home / "gguf" / f.name)


def parse_layout(name: str, src=None):
    """``b128z+down_proj=8+lm_head=8`` (``edgespec export --layout``'s spelling) → an
    :class:`export.families.base.Layout`; ``src``, the GGUF source that ``+gguf6`` follows."""
    from edgespec.errors import EdgespecError
    from edgespec.export.build import ExportOptions, weight_layout
    from edgespec.export.build import parse_layout as fields

    try:
        return weight_layout(ExportOptions(**fields(name)), src)
    except EdgespecError as e:
        raise SystemExit(f"export_cost: {e}") from None


def _nll(logits: np.ndarray, ids: np.ndarray) -> float:
    """Mean negative log-likelihood (nats) of ``ids[1:]`` under ``logits[:-1]`` float32 (T, V)."""
    x = logits[:-1].astype(np.float64)
    m = x.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))[:, 0]
    return float((lse - x[np.arange(len(x)), ids[1:]]).mean())


def measure_layouts(model: str, names: list[str], graphs: Path) -> list[dict]:
    """Each layout of ``names`` on ``model`` (a GGUF file): accuracy against the source and step cost."""
    import onnx

    from edgespec.export.families import family_for
    from edgespec.export.gqa_graph import GraphBuilder
    from edgespec.export.load import describe, gguf_source
    from edgespec.export.reference import forward
    from edgespec.export.sources import resolve_model
    from edgespec.export.validate import graph_logits
    from edgespec.export.families.base import build
    from edgespec.export.tune import held_ids

    info = describe(resolve_model(model), "target")
    src = gguf_source(str(info.source.path))
    ids = held_ids(info.tokenizer, 512)
    layers, kv, hd = src.config.kv_shape
    t0 = time.perf_counter()
    ref = forward(src, ids)
    print(f"reference: {len(ids)} tokens in {time.perf_counter() - t0:.0f} s; NLL {_nll(ref, ids):.4f}", flush=True)
    lp = ref - ref.max(-1, keepdims=True)
    lp -= np.log(np.exp(lp).sum(-1, keepdims=True))
    rows = [{"layout": "source (numpy fp32)", "nll": _nll(ref, ids)}]
    for name in names:
        d = graphs / name
        if not (d / "model.onnx").is_file():
            d.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            g = GraphBuilder(d / "model.onnx.data")
            try:
                proto = build(family_for(src.config.architecture)(src, parse_layout(name, src), g))
            finally:
                g.close()
            onnx.save_model(proto, str(d / "model.onnx"))
            print(f"{name}: written in {time.perf_counter() - t0:.0f} s", flush=True)
        got = graph_logits(d / "model.onnx", ids, layers, kv, hd)
        lq = got - got.max(-1, keepdims=True)
        lq -= np.log(np.exp(lq).sum(-1, keepdims=True))
        r = {"layout": name, "greedy_agreement": float((ref.argmax(-1) == got.argmax(-1)).mean()),
             "kl_mean": float((np.exp(lp) * (lp - lq)).sum(-1).mean()), "nll": _nll(got, ids),
             "data_mb": round((d / "model.onnx.data").stat().st_size / 2**20)}
        rows.append(r)
        print(f"{name:24s} agreement {r['greedy_agreement']:.3f}  KL {r['kl_mean']:.4f}  NLL {r['nll']:.4f}  "
              f"{r['data_mb']} MB", flush=True)
    return rows


def time_layouts(names: list[str], graphs: Path, layers: int, kv: int, hd: int, repeats: int = 3) -> list[dict]:
    """ms of a decode step and a 5-row verify after a 128-token past for each written layout
    (:func:`export.tune.graph_step_ms`: the layouts interleaved ``repeats`` times, medians)."""
    from edgespec.export.tune import graph_step_ms

    ms = graph_step_ms({n: graphs / n for n in names}, (layers, kv, hd), (1, 5), repeats=repeats)
    out = []
    for n in names:
        r = {"layout": n, "step_ms_1": ms[n][1], "step_ms_5": ms[n][5]}
        out.append(r)
        print(f"{n:24s} step {r['step_ms_1']:.1f} ms  5-row verify {r['step_ms_5']:.1f} ms", flush=True)
    return out


def _provenance() -> dict:
    """The ``machine`` (CPU model, flags, family and model numbers) and ``date`` a result records."""
    from edgespec.bench.runner import cpus

    return {"machine": {**cpus(), **_cpu_id()}, "date": time.strftime("%Y-%m-%d")}


def _cpu_id() -> dict:
    """The CPU's family and model numbers (/proc/cpuinfo): "AMD EPYC" alone does not tell Zen 4 from Zen 2."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    get = lambda key: next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith(key)), "")  # noqa: E731
    return {"cpu_family": get("cpu family"), "cpu_model": get("model\t")}


def build_tiny(out: Path) -> int:
    """The test suite's tiny pair (``tests/conftest.py``'s ``tiny_export``: a 2-layer qwen2 target, its copy with
    10% weight noise as the draft, fp32) exported at ``out``, for benchmarks that time the Python around the
    models (``bench/compare_checkouts.py``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from tinymodels import build_model

    from edgespec.export import ExportOptions, export_pair

    if out.exists():
        print(f"error: {out} exists", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as d:
        target = build_model(Path(d) / "target", "qwen2", seed=0, layers=2, hidden=64)
        draft = build_model(Path(d) / "draft", "qwen2", seed=0, noise=0.1)
        fp32 = ExportOptions(precision="fp32")
        print(export_pair(str(target), str(draft), out, fp32, fp32))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="wall time and peak RSS of an export into an empty graph cache")
    m.add_argument("sources", nargs="*", help="TARGET DRAFT (default: the default pair's recipe)")
    m.add_argument("--block-size", type=int, default=32)
    m.add_argument("--profile", choices=("small", "full", "auto"), default="small",
                   help="edgespec export's --profile (default small: the int4 graphs alone, as before 2026-12-06)")
    m.add_argument("--repeats", type=int, default=1)
    m.add_argument("--out", type=Path, default=None, help="also write the JSON result to OUT.json")
    s = sub.add_parser("synthetic", help="a GGUF of a real model's shapes with random 4-bit weights")
    s.add_argument("shape", choices=sorted(SHAPES))
    s.add_argument("out", type=Path)
    lo = sub.add_parser("layouts", help="each int4 layout's accuracy against the source and its step cost")
    lo.add_argument("model", help="a GGUF file (the target)")
    lo.add_argument("--layouts", default="b32,b64,b128,b128z,b256,b256z,b128+down_proj=8,b128z+lm_head=8")
    lo.add_argument("--graphs", type=Path, default=None, help="keep the written graphs here (reused if present)")
    lo.add_argument("--measure", default="accuracy,speed",
                    help="accuracy (against the source; any machine load), speed (run alone), or both")
    lo.add_argument("--out", type=Path, default=None, help="also write the JSON result to OUT.json")
    t = sub.add_parser("tiny", help="export the test suite's tiny pair")
    t.add_argument("out", type=Path, help="export directory to write (must not exist)")
    a = ap.parse_args(argv)
    if a.cmd == "tiny":
        return build_tiny(a.out)
    if a.cmd == "layouts":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from llama_server import write_result

        names = a.layouts.split(",")
        with tempfile.TemporaryDirectory() as tmp:
            graphs = a.graphs or Path(tmp)
            rows = measure_layouts(a.model, names, graphs) if "accuracy" in a.measure else []
            if "speed" in a.measure:
                from edgespec.export.load import gguf_source

                cfg = gguf_source(str(Path(a.model).resolve())).config
                speed = {r["layout"]: r for r in time_layouts(names, graphs, *cfg.kv_shape)}
                rows = [{**r, **speed.get(r["layout"], {})} for r in rows] or list(speed.values())
        if a.out:
            write_result(a.out, {"command": "python bench/export_cost.py " + " ".join(sys.argv[1:]),
                                 **_provenance(), "layouts": rows})
        return 0
    if a.cmd == "synthetic":
        print(write_synthetic(a.shape, a.out))
        return 0
    if len(a.sources) not in (0, 2):
        ap.error("measure takes TARGET and DRAFT, or nothing (the default pair)")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from llama_server import write_result

    target, draft = (a.sources or ["", ""])
    runs = []
    for _ in range(a.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            home = Path(tmp) / "home"
            home.mkdir()
            if not target:
                _link_recipe_ggufs(home)
            r = measure_once(target, draft, a.block_size, home, Path(tmp) / "export", a.profile)
        runs.append(r)
        print(f"export: {r['wall_s']} s, peak RSS {r['peak_rss_mb']} MB", flush=True)
    result = {"command": "python bench/export_cost.py " + " ".join(sys.argv[1:] if argv is None else argv),
              **_provenance(),
              "sources": a.sources or ["default pair recipe"], "block_size": a.block_size, "profile": a.profile,
              "runs": runs}
    if a.out:
        write_result(a.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
