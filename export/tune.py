"""``edgespec export --tune``: the weight layout of one graph chosen by measurement on this machine.

Two stages, per model:

1. **Speed.** Each candidate layout's matmuls — the model's own shapes and per-tensor bits (packed Q/K/V, output
   projection, gate/up, down projection for :data:`TIMED_LAYERS` layers, scaled to the model's depth, and the
   output head) — as ``MatMulNBits`` over random blocks in one onnxruntime session, timed at 1 row (a decode step)
   and at K+1 rows (a verify), median of :data:`ROUNDS` runs, the default layout timed first and last. Attention, the
   norms and the embedding do not depend on the layout and are left out. Random blocks cost what real ones do:
   the kernels' work depends on the shapes, not the values.
2. **Accuracy.** Among the candidates faster than the default layout at both row counts, the fastest whose
   greedy agreement and KL(p_source ‖ p_export) are at least the default's and whose mean negative
   log-likelihood of held text (:func:`held_ids`) is no higher (or whose agreement reaches ``min_agreement``,
   where given) is found by bisection (a faster layout is taken to be no more accurate), each
   tried one built as a real graph (:func:`export.build.build_graph`, cached like any export) and validated
   against the numpy forward of the source weights; it wins if its real decode step then measures faster than
   the default graph's (:func:`graph_step_ms`). None: the default layout stays.

The result names the CPU and date it was measured on (``Quantization.chosen_by``; the figures in the graph's
``validation["tune"]``), since another CPU's kernels may rank the layouts differently (docs/benchmarks.md).
"""

from __future__ import annotations

import datetime
import platform
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from edgespec.errors import EdgespecError

from .build import (SOURCE_BITS, ExportOptions, _log, build_graph, parse_layout, resolve_bits, uses_source_bits,
                    weight_layout)
from .load import ModelInfo, weights

# int4 layouts worth measuring: onnxruntime's block sizes, zero points, and 8 bits or block 32 for the output
# head or for the tensors a GGUF keeps at 6 bits or more (gguf6: a Q4_K_M file's Q6_K head, down and value
# projections), which win back accuracy (docs/export.md, "Weight layouts"); the gguf6 ones only for a GGUF source
CANDIDATES = ("b32", "b64", "b64z", "b128", "b128z", "b128z+lm_head=8", "b256", "b256z", "b64z+gguf6=8",
              "b128z+gguf6=8", "b256z+gguf6=8", "b128z+gguf6=b32", "b256+gguf6=b32")
TIMED_LAYERS = 8  # layers in the timing session (enough to spill any L3 cache), scaled to the model's depth
ROUNDS = 15
MIN_GAIN = 0.03  # a candidate must be this much faster than the default at one row to be worth its accuracy risk


def cpu_name() -> str:
    """This machine's CPU: its model name with family and model numbers (``/proc/cpuinfo``; a VM's "Intel Xeon
    Processor" alone does not tell one generation from another), or the platform's processor string."""
    try:
        info = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
        if info.get("model name"):
            return info["model name"] + (f" (family {info['cpu family']} model {info['model']})"
                                         if info.get("cpu family") and info.get("model") else "")
    except OSError:
        pass
    return platform.processor() or platform.machine()


def timed_layers(num_layers: int) -> list[int]:
    """The indices of the :data:`TIMED_LAYERS` layers (all, for a shallower model) timed for a model of
    ``num_layers``: spread evenly over its depth, first and last included."""
    n = min(TIMED_LAYERS, num_layers)
    return sorted({round(j * (num_layers - 1) / max(n - 1, 1)) for j in range(n)})


def _matmuls(cfg) -> list[tuple[str, int, int]]:
    """(name, N, K) of the model's weight matmuls for the :func:`timed_layers` and the output head, named as
    :mod:`export.families` names them (so per-tensor bits — a GGUF's Q6_K layers among them — apply as they
    would)."""
    h, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    out = []
    for i in timed_layers(cfg.num_layers):
        out += [(f"layers.{i}.attn.qkv_proj", q + 2 * kv, h), (f"layers.{i}.attn.o_proj", h, q),
                (f"layers.{i}.mlp.gate_up_proj", 2 * cfg.intermediate_size, h),
                (f"layers.{i}.mlp.down_proj", h, cfg.intermediate_size)]
    return out + [("lm_head", cfg.vocab_size, h)]


def _timing_graph(mats: list[tuple[str, int, int]], opts: ExportOptions, path: Path, seed: int = 0,
                  src=None) -> Path:
    """An ONNX graph at ``path`` of the matmuls ``mats`` ((name, N, K), :func:`_matmuls`) in the layout
    ``opts`` on random blocks: input ``x{K}`` float32 (M, K) for each input width K, one output float32 (M, N)
    per matmul. The weights go to an external data file beside ``path``. ``src``: the model's weights, for a
    layout whose bits follow the source's tensor types (:func:`export.build.resolve_bits`)."""
    import onnx
    from onnx import TensorProto, helper

    from .gqa_graph import GraphBuilder

    rng = np.random.default_rng(seed)
    lay = weight_layout(opts, src)
    g = GraphBuilder(path.with_name(path.name + ".data"))
    outputs = []
    try:
        for name, n, k in mats:
            bits, block = lay.bits_of(name), lay.block_of(name)
            if bits == 32:
                w = rng.standard_normal((k, n), dtype=np.float32)
                out = g.node("MatMul", [f"x{k}", g.init(f"{name}.weight", w)], name)[0]
            else:
                blocks = -(-k // block)
                b = rng.integers(0, 256, (n, blocks, block * bits // 8), dtype=np.uint8)
                ins = [f"x{k}", g.init(f"{name}.B", b),
                       g.init(f"{name}.scales", rng.random(n * blocks, dtype=np.float32) * 0.02 + 0.001)]
                if opts.zero_points:
                    ins.append(g.init(f"{name}.zp", rng.integers(0, 256, n * -(-blocks * bits // 8), dtype=np.uint8)))
                out = g.node("MatMulNBits", ins, name, domain="com.microsoft", K=k, N=n, bits=bits,
                             block_size=block, accuracy_level=opts.accuracy_level)[0]
            outputs.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, ["M", n]))
    finally:
        g.close()
    graph = helper.make_graph(g.nodes, "layout_timing",
                              [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, ["M", k])
                               for k in sorted({k for _, _, k in mats})], outputs, initializer=g.inits)
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                            helper.make_opsetid("com.microsoft", 1)]), str(path))
    return path


def _time(path: Path, rows: tuple[int, ...], rounds: int) -> dict[int, float]:
    """Median milliseconds of one run of the graph at ``path`` per row count (after one warm-up run)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    out = {}
    for m in rows:
        feeds = {i.name: rng.standard_normal((m, int(i.name[1:])), dtype=np.float32) for i in sess.get_inputs()}
        sess.run(None, feeds)
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            sess.run(None, feeds)
            times.append((time.perf_counter() - t0) * 1e3)
        out[m] = float(np.median(times))
    return out


def kernel_ms(cfg, layouts: dict[str, ExportOptions], rows: tuple[int, ...] = (1, 5),
              rounds: int = ROUNDS, src=None) -> tuple[dict[str, dict[int, float]], float]:
    """Milliseconds of each layout's weight matmuls for a whole forward of ``rows`` rows on this machine's
    onnxruntime CPU kernels, ``{layout: {rows: ms}}``: :data:`TIMED_LAYERS` layers scaled to ``cfg.num_layers``
    plus the output head, median of ``rounds`` runs; and the drift, the first layout's one-row time when timed
    again last over its first time. One layout is in memory at a time; the first one's two timings are averaged,
    so a machine that drifts in between shows rather than favouring the layouts timed early. ``src``: as for
    :func:`_timing_graph`."""
    mats = _matmuls(cfg)
    scale = cfg.num_layers / len(timed_layers(cfg.num_layers))
    order = list(layouts) + [next(iter(layouts))]
    got: dict[str, list[dict[int, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="edgespec-tune") as tmp:
        for i, tag in enumerate(order):
            one = {}
            for part, sub in (("layers", mats[:-1]), ("head", mats[-1:])):
                path = _timing_graph(sub, layouts[tag], Path(tmp) / f"{i}-{part}.onnx", src=src)
                t = _time(path, rows, rounds)
                for m in rows:
                    one[m] = one.get(m, 0.0) + t[m] * (scale if part == "layers" else 1.0)
                for f in Path(tmp).iterdir():
                    f.unlink()
            got.setdefault(tag, []).append(one)
    out = {tag: {m: round(float(np.mean([r[m] for r in runs])), 2) for m in rows} for tag, runs in got.items()}
    first = got[order[0]]
    return out, round(first[1][rows[0]] / first[0][rows[0]], 3)


def graph_step_ms(graphs: dict[str, Path], kv_shape: tuple[int, int, int], rows: tuple[int, ...] = (1, 5),
                  past: int = 128, repeats: int = 3, calls: int = 7) -> dict[str, dict[int, float]]:
    """Milliseconds of one forward of ``rows`` new tokens after a ``past``-token prefix, for each written graph
    of ``graphs`` ({name: directory holding model.onnx}), through the runtime's own model wrapper: the graphs
    interleaved ``repeats`` times (drift falls on all alike), median of ``calls`` timed calls each time, then
    the median over the repeats."""
    from .validate import _lm, session

    layers, kv, hd = kv_shape
    lms = {n: _lm(session(d / "model.onnx"), layers, kv, hd, past + max(rows) + 8) for n, d in graphs.items()}
    ids = np.arange(past + max(rows), dtype=np.int64) % 1000 + 100
    cells: dict[tuple[str, int], list[float]] = {}
    for _ in range(repeats):
        for n, lm in lms.items():
            for m in rows:
                times = []
                for _ in range(calls + 2):
                    cache = lm.new_cache(past + m + 8)
                    lm.forward(ids[:past], cache, keep=1)
                    t0 = time.perf_counter()
                    lm.forward(ids[past:past + m], cache)
                    times.append((time.perf_counter() - t0) * 1e3)
                cells.setdefault((n, m), []).append(float(np.median(times[2:])))
    return {n: {m: round(float(np.median(cells[n, m])), 2) for m in rows} for n in graphs}


def _held_nll(info: ModelInfo, graph_dir: Path) -> float:
    """Mean negative log-likelihood (nats per token) of :func:`held_ids` under the graph in ``graph_dir``: the
    likelihood of text nobody here wrote, the third accuracy measure of the target's floor."""
    from .validate import _logsumexp, graph_logits

    ids = held_ids(info.tokenizer)
    logits = graph_logits(graph_dir / "model.onnx", ids, *info.config.kv_shape)[:-1].astype(np.float64)
    lp = logits[np.arange(len(ids) - 1), ids[1:]] - _logsumexp(logits)[:, 0]
    return round(float(-lp.mean()), 4)


def held_ids(tokenizer, n: int = 256) -> np.ndarray:
    """int64 (n,): tokens of text nobody here wrote — the standard library's ``argparse.py`` from its first class
    on — to measure a layout's accuracy and a draft's acceptance on."""
    import argparse as mod
    import inspect

    text = inspect.getsource(mod)
    return np.array(tokenizer.encode(text[text.index("class "):], add_special_tokens=False)[:n], dtype=np.int64)


def tune(info: ModelInfo, base: ExportOptions, role: str, cache: Path | None = None,
         candidates: tuple[str, ...] = CANDIDATES, verify_rows: int = 5, max_builds: int = 4,
         min_agreement: float | None = None, target: tuple[Path, dict] | None = None
         ) -> tuple[ExportOptions, Path, dict]:
    """The layout of ``role``'s graph chosen on this machine (module docstring): returns the chosen options
    (``chosen_by`` set), its cached graph directory and metadata (``validation["tune"]`` holding every
    candidate's figures). ``base`` gives everything but the layout; the default layout (``ExportOptions()``'s)
    is the reference. ``max_builds`` bounds the accuracy stage (each build is a full export of the model).

    With ``target`` (the chosen target graph's directory and metadata) the model is a draft, judged by what it
    is for: its greedy acceptance α against the target's graph on held text (:func:`held_ids`) and its real
    step time give the expected speculative decoding speed, E[tokens per cycle] / (K · draft step + target
    verify of K + 1 rows), with E = (1 − α^(K+1)) / (1 − α) and K = ``verify_rows`` − 1 (Leviathan et al. 2023,
    eq. 1); the fastest by that measure wins. The draft's accuracy does not bound the output (the target
    decides every token), so no floor applies.

    Raises:
        EdgespecError: ``base`` is not int4 (the layouts are int4 ones), or a candidate is not a layout.
    """
    if base.precision != "int4":
        raise EdgespecError(f"--tune chooses among int4 layouts; the {role} is {base.precision}")
    default = replace(base, **parse_layout(ExportOptions().layout))
    opts = {c: replace(base, **parse_layout(c)) for c in dict.fromkeys((default.layout, *candidates))}
    src = weights(info) if info.source.kind == "gguf" else None
    if src is None or not resolve_bits(((SOURCE_BITS, 8),), src):  # no stored tensor types, or none above 6 bits:
        opts = {c: o for c, o in opts.items()  # gguf6 would change nothing
                if not uses_source_bits(o.tensor_bits + o.tensor_blocks)}
    when, cpu = datetime.date.today().isoformat(), cpu_name()
    _log(f"{role}: timing {len(opts)} int4 layouts on this CPU ({cpu}) at 1 and {verify_rows} rows")
    ms, drift = kernel_ms(info.config, opts, (1, verify_rows), src=src)
    ref = ms[default.layout]
    d_dir, d_meta = build_graph(info, default, role, cache)
    report = {"cpu": cpu, "date": when, "rows": [1, verify_rows], "default": default.layout, "drift": drift,
              "candidates": [{"layout": c, "ms": [ms[c][1], ms[c][verify_rows]]} for c in opts]}
    rows = {r["layout"]: r for r in report["candidates"]}
    faster = sorted((c for c in opts if c != default.layout and ms[c][1] <= ref[1] * (1 - MIN_GAIN)
                     and ms[c][verify_rows] <= ref[verify_rows]), key=lambda c: ms[c][1])
    pick = _pick_draft if target is not None else _pick_target
    chosen, c_dir, c_meta, why = pick(info, opts, default, (d_dir, d_meta), faster, rows, report, role, cache,
                                      verify_rows=verify_rows, max_builds=max_builds, min_agreement=min_agreement,
                                      target=target)
    rows[chosen.layout]["chosen"] = True
    why = f"tuned on {cpu}, {when}: {why}"
    _log(f"{role}: {why}")
    c_meta = {**c_meta, "validation": {**c_meta["validation"], "tune": report}}
    return replace(chosen, chosen_by=why), c_dir, c_meta


def _pick_target(info, opts, default, built, faster, rows, report, role, cache, *, verify_rows, max_builds,
                 min_agreement, target):
    """The fastest candidate at the default's accuracy whose real graph confirms the gain (module docstring);
    returns (options, graph directory, metadata, why).

    The candidates (fastest first) are searched by bisection on the assumption that a faster layout is no more
    accurate (coarser blocks, fewer bits): at most ``max_builds`` builds for up to 2^max_builds − 1 candidates.
    Every layout returned was built and validated; where the assumption fails, a faster layout that would have
    held the floor may go untried, never one below it chosen."""
    d_dir, d_meta = built
    ms = {c: r["ms"] for c, r in rows.items()}
    floor = d_meta["validation"]["reference"]
    report["floor"] = ({"greedy_agreement": floor["greedy_agreement"], "kl_mean": floor.get("kl_mean")}
                       if min_agreement is None else {"greedy_agreement": min_agreement})
    rows[default.layout].update(greedy_agreement=floor["greedy_agreement"], kl_mean=floor.get("kl_mean"))
    tried: list[str] = []
    best = None  # (layout, graph directory, metadata) of the fastest candidate at the floor so far
    lo, hi = 0, len(faster) - 1
    while lo <= hi and len(tried) < max_builds:
        mid = (lo + hi) // 2
        c = faster[mid]
        tried.append(c)
        _log(f"{role}: {c} runs the matmuls in {ms[c][0]:.1f} ms against {ms[default.layout][0]:.1f} ms at one "
             "row; measuring its accuracy")
        g_dir, g_meta = build_graph(info, opts[c], role, cache)
        v = g_meta["validation"]["reference"]
        rows[c].update(greedy_agreement=v["greedy_agreement"], kl_mean=v.get("kl_mean"))
        if min_agreement is not None:
            ok = v["greedy_agreement"] >= min_agreement
        else:
            ok = (v["greedy_agreement"] >= floor["greedy_agreement"]
                  and v.get("kl_mean", 0.0) <= floor.get("kl_mean", float("inf")))
            if ok:  # and the likelihood of held text (agreement and KL are measured on the export's own snippet)
                if "nll" not in report["floor"]:
                    report["floor"]["nll"] = rows[default.layout]["nll"] = _held_nll(info, d_dir)
                rows[c]["nll"] = _held_nll(info, g_dir)
                ok = rows[c]["nll"] <= report["floor"]["nll"]
        rows[c]["accepted"] = ok
        if ok:
            if best is not None:  # a faster one also holds the floor
                _drop(best[1])
            best, hi = (c, g_dir, g_meta), mid - 1
        else:
            _drop(g_dir)
            lo = mid + 1
    if best is not None:  # the real graphs confirm the kernels' gain (attention and the rest included)
        c, g_dir, g_meta = best
        step = graph_step_ms({default.layout: d_dir, c: g_dir}, info.config.kv_shape, (1, verify_rows))
        for x in (default.layout, c):
            rows[x]["step_ms"] = [step[x][1], step[x][verify_rows]]
        a, d = rows[c], rows[default.layout]
        if step[c][1] <= step[default.layout][1] * (1 - MIN_GAIN / 2):
            return opts[c], g_dir, g_meta, (
                f"a decode step {a['step_ms'][0]:.1f} ms and a {verify_rows}-row verify {a['step_ms'][1]:.1f} ms "
                f"against {d['step_ms'][0]:.1f} / {d['step_ms'][1]:.1f} ms at {default.layout}; greedy agreement "
                f"{a['greedy_agreement']:.3f} (floor {report['floor']['greedy_agreement']:.3f})"
                + (f", NLL of held text {a['nll']:.4f} (floor {report['floor']['nll']:.4f})" if "nll" in a else ""))
        _drop(g_dir)
        return default, d_dir, d_meta, (
            f"{c} held the accuracy floor but its real decode step ({a['step_ms'][0]:.1f} ms) was not faster than "
            f"{default.layout}'s ({d['step_ms'][0]:.1f} ms)")
    return default, d_dir, d_meta, (
        f"no layout both faster than {default.layout} and as accurate (built and measured: {', '.join(tried)})"
        if tried else f"no layout's kernels faster than {default.layout}'s by {MIN_GAIN:.0%} at 1 and "
                      f"{verify_rows} rows")


def _pick_draft(info, opts, default, built, faster, rows, report, role, cache, *, verify_rows, max_builds,
                min_agreement, target):
    """The draft layout of the highest expected speculative decoding speed (:func:`tune`'s docstring); returns
    (options, graph directory, metadata, why)."""
    from .validate import graph_logits

    t_dir, t_meta = target
    t_spec = (t_meta["num_layers"], t_meta["num_kv_heads"], t_meta["head_dim"])
    ids = held_ids(info.tokenizer)
    t_top = graph_logits(t_dir / "model.onnx", ids, *t_spec).argmax(-1)
    if t_meta.get("kept_token_ids"):
        t_top = np.load(t_dir / t_meta["kept_token_ids"])[t_top]
    verify = graph_step_ms({"target": t_dir}, t_spec, (verify_rows,))["target"][verify_rows]
    k = verify_rows - 1
    report.update(target_verify_ms=verify, k=k, held_tokens=int(len(ids)))
    graphs = {default.layout: built}
    for c in faster[:max_builds]:
        _log(f"{role}: {c} runs the matmuls in {rows[c]['ms'][0]:.1f} ms against "
             f"{rows[default.layout]['ms'][0]:.1f} ms at one row; measuring its acceptance")
        graphs[c] = build_graph(info, opts[c], role, cache)
    step = graph_step_ms({c: d for c, (d, _) in graphs.items()}, info.config.kv_shape, (1,))
    speed = {}
    for c, (d, meta) in graphs.items():
        top = graph_logits(d / "model.onnx", ids, *info.config.kv_shape).argmax(-1)
        if meta.get("kept_token_ids"):
            top = np.load(d / meta["kept_token_ids"])[top]
        alpha = float((top == t_top).mean())
        tokens = (1 - alpha ** (k + 1)) / (1 - alpha) if alpha < 1 else k + 1.0
        speed[c] = 1e3 * tokens / (k * step[c][1] + verify)
        rows[c].update(acceptance=round(alpha, 4), step_ms=[step[c][1]], tokens_per_s=round(speed[c], 2))
    best = max(speed, key=speed.get)
    for c, (d, _) in graphs.items():
        if c not in (best, default.layout):
            _drop(d)
    b, d = rows[best], rows[default.layout]
    return opts[best], graphs[best][0], graphs[best][1], (
        f"greedy acceptance {b['acceptance']:.3f} against the target on {len(ids)} held tokens, a draft step "
        f"{b['step_ms'][0]:.1f} ms; expected speculative decoding at K={k} {speed[best]:.1f} tok/s"
        + ("" if best == default.layout else
           f" against {speed[default.layout]:.1f} at {default.layout} (acceptance {d['acceptance']:.3f}, "
           f"step {d['step_ms'][0]:.1f} ms)"))


def _drop(graph_dir: Path) -> None:
    """Remove a rejected candidate's cached graph (a full model's weights on disk)."""
    from edgespec.io import paths

    paths.remove(graph_dir)
