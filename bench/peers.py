"""edgespec against llama.cpp on the same GGUF weights, side by side in one run, interleaved by prompt.

Every prompt of the built-in set runs every configuration — edgespec's modes (default: plain, the default
``adaptive`` mode, prompt ``lookup``) and llama.cpp's ``llama-server`` (plain, the 0.5B draft with
``--spec-draft-n-max``, ``ngram-simple`` lookup) — in an order rotated per prompt, so a slow stretch of this
shared machine hits every configuration alike and the ratios are paired per prompt. The prompt token ids are
the same for both (edgespec's tokenizer and chat template; sent to llama-server as ids). Greedy, 128 new tokens,
2 threads by default. A long prompt (~1,000 tokens by default) then measures prefill tok/s for both plain
decoders. llama.cpp's figures are its server's own timings; edgespec's come from its own stats (the same
definitions: see bench/llama_server.py).

Usage (build llama.cpp first, ~5.5 min on 2 cores: ``python bench/peers_build.py``; the real pair exported):
    python bench/peers.py --per-class 2 --out bench/results/peers-default-int4
writes ``<out>.json`` and ``<out>.png`` and prints the markdown table for docs/benchmarks.md.

onnxruntime-genai is not run here: see docs/benchmarks.md ("How the figures are measured") for why.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from llama_server import LlamaServer, PeerMode, finish  # noqa: E402

from edgespec.io import paths  # noqa: E402
from edgespec.errors import EdgespecError  # noqa: E402
from edgespec.bench.prompts import Prompt, builtin  # noqa: E402

EDGESPEC, LLAMA = "edgespec", "llama.cpp"


# ---------------------------------------------------------------- configurations


class EdgespecRunner:
    """One edgespec bench mode on a loaded decoder (a new adaptive controller per prompt, as a cold
    ``edgespec generate``)."""

    runtime = EDGESPEC

    def __init__(self, dec, mode_name: str, temperature: float = 0.0):
        from edgespec.bench.runner import Mode

        self.dec, self.mode, self.temperature = dec, Mode.parse(mode_name), temperature
        self.mode_name = mode_name

    def run(self, i: int, prompt: Prompt, ids: list[int], max_new_tokens: int) -> dict:
        from edgespec.bench.runner import run_one

        rec = run_one(self.dec, self.mode, prompt, max_new_tokens, self.temperature, seed=i)
        rec["prefill_tok_s"] = rec["prompt_tokens"] / (rec["ttft_ms"] / 1e3) if rec["ttft_ms"] else 0.0
        return rec


class LlamaRunner:
    """One llama.cpp configuration served by a running ``LlamaServer``."""

    runtime = LLAMA

    def __init__(self, server: LlamaServer, mode: PeerMode):
        self.server, self.mode_name = server, mode.name

    def run(self, i: int, prompt: Prompt, ids: list[int], max_new_tokens: int) -> dict:
        return self.server.complete(ids, max_new_tokens)


def label(runner) -> str:
    return f"{runner.runtime} {runner.mode_name}"


# ---------------------------------------------------------------- the interleaved run


def interleave(prompts: list[Prompt], encoded: list[list[int]], runners: list, max_new_tokens: int,
               repeats: int = 1, key: str = "decode_tok_s", progress=None) -> list[dict]:
    """Run every runner on every prompt, the order rotated by one per prompt and the repeats interleaved
    (r1 of every runner, then r2, …); keep for each (prompt, runner) the repeat with the median ``key``
    (the lower middle one for an even count). Records gain ``prompt``, ``class``, ``runtime``, ``mode``,
    ``label`` and ``<key>_repeats``."""
    runs = []
    for i, (prompt, ids) in enumerate(zip(prompts, encoded)):
        order = runners[i % len(runners):] + runners[:i % len(runners)]
        reps: dict[str, list[dict]] = {label(r): [] for r in order}
        for _ in range(repeats):
            for r in order:
                reps[label(r)].append(r.run(i, prompt, ids, max_new_tokens))
                if progress:
                    progress()
        for r in order:
            rs = sorted(reps[label(r)], key=lambda x: x[key])
            rec = dict(rs[(len(rs) - 1) // 2])
            rec.update(prompt=i, runtime=r.runtime, mode=r.mode_name, label=label(r), **{"class": prompt.cls})
            rec[f"{key}_repeats"] = [x[key] for x in rs]
            runs.append(rec)
    for rec in runs:  # greedy agreement of llama.cpp's speculative modes with its own plain decoding
        if rec["runtime"] == LLAMA and rec.get("tokens"):
            plain = next((p for p in runs if p["runtime"] == LLAMA and p["mode"] == "plain"
                          and p["prompt"] == rec["prompt"]), None)
            if plain is not None and plain is not rec:
                rec["same_as_plain"] = rec["tokens"] == plain["tokens"]
    return runs


def _median(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return float(np.median(xs)) if xs else None


def _paired(sel: list[dict], ref: dict[int, dict], field: str) -> float | None:
    return _median([r[field] / ref[r["prompt"]][field] for r in sel
                    if r["prompt"] in ref and ref[r["prompt"]][field] > 0])


def summarize(runs: list[dict], labels: list[str]) -> dict:
    """Per configuration and prompt class (and ``all``): median tok/s (e2e, decode, prefill), token-weighted
    alpha, and median per-prompt ratios against edgespec plain, llama.cpp plain and the runtime's own plain."""
    plains = {rt: {r["prompt"]: r for r in runs if r["runtime"] == rt and r["mode"] == "plain"}
              for rt in (EDGESPEC, LLAMA)}
    classes = sorted({r["class"] for r in runs}) + ["all"]
    out = {}
    for lab in labels:
        rs = [r for r in runs if r["label"] == lab]
        per = {}
        for cls in classes:
            sel = [r for r in rs if cls == "all" or r["class"] == cls]
            if not sel:
                continue
            own = plains[sel[0]["runtime"]]
            acc = sum(r.get("accepted") or 0 for r in sel)
            ev = sum((r.get("evaluated") if r["runtime"] == EDGESPEC else r.get("drafted")) or 0 for r in sel)
            same = [r["same_as_plain"] for r in sel if "same_as_plain" in r]
            per[cls] = {
                "prompts": len(sel),
                "e2e_tok_s": _median(r["e2e_tok_s"] for r in sel),
                "decode_tok_s": _median(r["decode_tok_s"] for r in sel),
                "prefill_tok_s": _median(r["prefill_tok_s"] for r in sel),
                "ttft_ms": _median(r["ttft_ms"] for r in sel),
                "alpha": acc / ev if ev else None,
                "e2e_vs_own_plain": _paired(sel, own, "e2e_tok_s"),
                "decode_vs_own_plain": _paired(sel, own, "decode_tok_s"),
                "e2e_vs_edgespec_plain": _paired(sel, plains[EDGESPEC], "e2e_tok_s"),
                "e2e_vs_llama_plain": _paired(sel, plains[LLAMA], "e2e_tok_s"),
                "decode_vs_llama_plain": _paired(sel, plains[LLAMA], "decode_tok_s"),
                "greedy_same_as_plain": f"{sum(same)}/{len(same)}" if same else None,
            }
        out[lab] = per
    return out


def headline(summary: dict, default_mode: str = "adaptive") -> dict:
    """The issue's comparisons, as ratios of medians over all prompts: plain decode edgespec/llama.cpp; the
    default mode and each runtime's best mode (by median e2e tok/s) against llama.cpp's best speculative mode."""
    def e2e(lab):
        return (summary.get(lab, {}).get("all") or {}).get("e2e_tok_s")

    def best(rt, spec_only):
        cands = [(e2e(lab), lab) for lab in summary if lab.startswith(rt + " ")
                 and not (spec_only and lab.endswith(" plain")) and e2e(lab)]
        return max(cands)[1] if cands else None

    out = {}
    ep, lp = summary.get(f"{EDGESPEC} plain", {}).get("all"), summary.get(f"{LLAMA} plain", {}).get("all")
    if ep and lp:
        out["plain_decode_edgespec_over_llama"] = ep["decode_tok_s"] / lp["decode_tok_s"]
        out["plain_e2e_edgespec_over_llama"] = ep["e2e_tok_s"] / lp["e2e_tok_s"]
    lbest, ebest = best(LLAMA, True), best(EDGESPEC, False)
    if lbest:
        out["llama_best_speculative"] = lbest
        if e2e(f"{EDGESPEC} {default_mode}"):
            out["default_e2e_over_llama_best_speculative"] = e2e(f"{EDGESPEC} {default_mode}") / e2e(lbest)
        if ebest:
            out["edgespec_best"] = ebest
            out["edgespec_best_e2e_over_llama_best_speculative"] = e2e(ebest) / e2e(lbest)
    return out


# ---------------------------------------------------------------- inputs


def find_gguf(export_dir: Path, role: str, given: Path | None = None) -> Path:
    """The GGUF file the export's ``role`` ("target" or "draft") was made from: ``given``, else
    ``<cache>/gguf/<source_sha256>.gguf`` (where ``edgespec export`` assembles the recipe's chunks), else the
    manifest's ``source`` path.

    Raises:
        EdgespecError: the export is invalid, or the GGUF is not on this machine.
    """
    from edgespec.io.manifest import load_manifest

    spec = getattr(load_manifest(export_dir), role)
    cands = [given] if given else [paths.home() / "gguf" / f"{spec.source_sha256}.gguf", Path(spec.source)]
    path = next((p for p in cands if p.is_file() and p.suffix == ".gguf"), None)
    if path is None:
        raise EdgespecError(f"{role} GGUF not found (tried {', '.join(map(str, cands))}); "
                            f"run `edgespec export` or pass --{role}-gguf")
    return path


def find_ggufs(export_dir: Path, target: Path | None = None, draft: Path | None = None) -> tuple[Path, Path]:
    """The target's and the draft's GGUF files (:func:`find_gguf`)."""
    return find_gguf(export_dir, "target", target), find_gguf(export_dir, "draft", draft)


def long_prompt(encode, tokens: int) -> Prompt:
    """A code-summary request whose chat-templated ids number at least ``tokens``: a made-up module of small
    distinct functions (deterministic)."""
    funcs = []
    while True:
        n = len(funcs)
        funcs.append(f"def transform_{n}(values, scale={n % 9 + 1}):\n    \"\"\"Scale every value not divisible by "
                     f"{n % 7 + 2} and shift it by {n}.\"\"\"\n    return [v * scale + {n} for v in values "
                     f"if v % {n % 7 + 2}]\n\n")
        text = "Summarize what this module does in two sentences:\n```python\n" + "".join(funcs) + "```"
        p = Prompt("long", ({"role": "user", "content": text},))
        if len(encode(p)) >= tokens:
            return p


# ---------------------------------------------------------------- output


def table(result: dict) -> str:
    """The markdown table for docs/benchmarks.md (all prompts; ratios are medians of per-prompt ratios)."""
    rows = ["| runtime | mode | end to end tok/s | decode tok/s | alpha | e2e vs own plain | e2e vs edgespec plain "
            "| e2e vs llama.cpp plain | greedy = own plain |", "|---|---|---|---|---|---|---|---|---|"]
    f = lambda x, d=2: "—" if x is None else f"{x:.{d}f}"  # noqa: E731
    for lab, per in result["summary"].items():
        a = per["all"]
        rt, mode = lab.split(" ", 1)
        rows.append(f"| {rt} | {mode} | {f(a['e2e_tok_s'])} | {f(a['decode_tok_s'])} | {f(a['alpha'])} | "
                    f"{f(a['e2e_vs_own_plain'])}× | {f(a['e2e_vs_edgespec_plain'])}× | {f(a['e2e_vs_llama_plain'])}× | "
                    f"{a['greedy_same_as_plain'] or '—'} |")
    lp = result.get("long_prompt")
    if lp:
        rows.append("")
        rows.append(f"Prefill of a {lp['prompt_tokens']}-token prompt (median of {lp['repeats']}): "
                    + ", ".join(f"{lab} {f(v, 1)} tok/s" for lab, v in lp["prefill_tok_s"].items())
                    + f"; edgespec / llama.cpp = {f(lp.get('edgespec_over_llama'))}×.")
    return "\n".join(rows)


def plot(result: dict, path: Path) -> None:
    """PNG: median end-to-end and decode tok/s per configuration; prefill tok/s on the long prompt."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labs = list(result["summary"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 1]})
    x = np.arange(len(labs))
    for j, (field, name) in enumerate((("e2e_tok_s", "end to end"), ("decode_tok_s", "decode"))):
        ax1.bar(x + (j - 0.5) * 0.38, [result["summary"][lab]["all"][field] or 0 for lab in labs], 0.38, label=name,
                color=[("C0" if lab.startswith(EDGESPEC) else "C1") for lab in labs], alpha=1.0 if j == 0 else 0.55)
    ax1.set_xticks(x, labs, rotation=25, ha="right")
    ax1.set_ylabel("tok/s (median over prompts)")
    ax1.set_title(f"{result['machine']['cpu']}: solid = end to end, light = decode")
    lp = result.get("long_prompt")
    if lp:
        ks = list(lp["prefill_tok_s"])
        ax2.bar(range(len(ks)), [lp["prefill_tok_s"][k] for k in ks],
                color=[("C0" if k.startswith(EDGESPEC) else "C1") for k in ks])
        ax2.set_xticks(range(len(ks)), ks, rotation=25, ha="right")
        ax2.set_title(f"prefill, {lp['prompt_tokens']}-token prompt")
        ax2.set_ylabel("tok/s")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (what the result files record as ``machine.cpu``)."""
    try:
        return next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


# ---------------------------------------------------------------- main


def run(args) -> dict:
    """The whole benchmark (see the module docstring); returns the result dict written as JSON."""
    import os
    from contextlib import ExitStack

    from edgespec.control.calibrate import calibrate
    from edgespec.engine.decoder import SpecDecoder
    from edgespec.bench.progress import progress_bar
    from peers_build import SDIST_REQ, binaries, cache_dir

    modes = args.modes.split(",")
    peer_modes = [PeerMode.parse(m) for m in args.peer_modes.split(",")]
    if "plain" not in modes or "plain" not in [p.name for p in peer_modes]:
        raise EdgespecError("--modes and --peer-modes must both include plain (the ratios are against it)")
    export = Path(args.export).expanduser() if args.export else paths.default_export_dir()
    target, draft = find_ggufs(export, args.target_gguf, args.draft_gguf)
    server_bin = binaries(args.llama_build or cache_dir() / "build").get("llama-server")
    if server_bin is None:
        raise EdgespecError("llama-server is not built: run `python bench/peers_build.py` first (~5.5 min)")
    dec = SpecDecoder.load(export, threads=args.threads, shared_thread_pool=True)
    es = [EdgespecRunner(dec, m) for m in modes]  # greedy; ValueError on a bad mode name
    for proposers in ((), ("draft",)):  # warm-up: first runs allocate
        dec.generate("Hello", max_new_tokens=4, k=2, proposers=proposers).run()
    if any(r.mode.k is None for r in es):  # adaptive modes: measure the cost model once, before timing
        calibrate(dec)
    enc = lambda p: dec.encode(messages=list(p.messages))  # noqa: E731
    prompts, encoded, skipped = [], [], []
    for p in builtin(args.per_class):  # as edgespec bench: skip what does not fit this export's context
        ids = enc(p)
        if len(ids) >= dec.context_length:
            skipped.append(p.text[:40])
        else:
            prompts.append(p)
            encoded.append(ids)
    lp = long_prompt(enc, args.long_prompt) if args.long_prompt else None
    if lp and len(enc(lp)) + args.long_new_tokens > dec.context_length:
        raise EdgespecError(f"--long-prompt {args.long_prompt} does not fit the export's {dec.context_length}-token "
                            "context")
    ctx = max(4096, len(enc(lp)) + args.max_new_tokens + 64 if lp else 0)
    load_start = os.getloadavg()
    with ExitStack() as stack:
        servers = {}
        for pm in peer_modes:
            srv = LlamaServer(server_bin, pm.server_args(target, draft, args.threads, ctx),
                              cache_dir() / "logs" / f"llama-server-{pm.name}.log")
            servers[pm.name] = stack.enter_context(srv)
            srv.complete(encoded[0], 4)  # warm-up
        ll = [LlamaRunner(servers[pm.name], pm) for pm in peer_modes]
        runners = [r for pair in zip(es, ll) for r in pair] + es[len(ll):] + ll[len(es):]
        bar = progress_bar(len(prompts) * len(runners) * args.repeats, "peers", unit="run")
        runs = interleave(prompts, encoded, runners, args.max_new_tokens, args.repeats, progress=bar.update)
        bar.close()
        long = None
        if lp:
            plain2 = [next(r for r in es if r.mode_name == "plain"), LlamaRunner(servers["plain"], PeerMode("plain"))]
            lruns = interleave([lp], [enc(lp)], plain2, args.long_new_tokens, args.long_repeats, key="prefill_tok_s")
            pre = {r["label"]: r["prefill_tok_s"] for r in lruns}
            long = {"prompt_tokens": lruns[0]["prompt_tokens"], "new_tokens": args.long_new_tokens,
                    "repeats": args.long_repeats, "prefill_tok_s": pre,
                    "edgespec_over_llama": pre[f"{EDGESPEC} plain"] / pre[f"{LLAMA} plain"],
                    "runs": [{k: v for k, v in r.items() if k != "tokens"} for r in lruns]}
        commands = {name: s.command for name, s in servers.items()}
    labels = [label(r) for r in runners]
    summary = summarize(runs, labels)
    return {
        "command": "python " + " ".join(sys.argv), "export": str(export),
        "ggufs": {"target": str(target), "draft": str(draft)},
        "peer": {"llama.cpp": f"b11434 from {SDIST_REQ} (sdist, built by bench/peers_build.py)",
                 "server_commands": commands},
        "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(), "platform": platform.platform(),
                    "loadavg_start": load_start, "loadavg_end": os.getloadavg()},
        "settings": {"modes": modes, "peer_modes": [p.name for p in peer_modes], "per_class": args.per_class,
                     "max_new_tokens": args.max_new_tokens, "threads": args.threads, "repeats": args.repeats,
                     "greedy": True, "edgespec_controller": "new per prompt (cold)"},
        "runs": [{k: v for k, v in r.items() if k != "tokens"} for r in runs], "skipped_prompts": skipped,
        "summary": summary, "headline": headline(summary), "long_prompt": long,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("export", nargs="?", help="export directory (default: the default pair in the user cache)")
    ap.add_argument("--modes", default="plain,adaptive,lookup", help="edgespec bench modes (default: %(default)s)")
    ap.add_argument("--peer-modes", default="plain,draft,ngram",
                    help="llama.cpp modes: plain, draft (draft<N>: --spec-draft-n-max N, default 3), ngram")
    ap.add_argument("--per-class", type=int, default=2, help="built-in prompts per class (default: %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2, help="threads for both runtimes (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=1, help="interleaved repeats per prompt; the median is kept")
    ap.add_argument("--long-prompt", type=int, default=1000, help="prefill prompt length in tokens (0: skip)")
    ap.add_argument("--long-new-tokens", type=int, default=16)
    ap.add_argument("--long-repeats", type=int, default=3)
    ap.add_argument("--target-gguf", type=Path, help="target GGUF for llama.cpp (default: the export's source)")
    ap.add_argument("--draft-gguf", type=Path, help="draft GGUF for llama.cpp (default: the export's source)")
    ap.add_argument("--llama-build", type=Path, help="llama.cpp cmake build dir (default: <cache>/peers/build)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/peers"), help="writes OUT.json and OUT.png")
    args = ap.parse_args(argv)

    def plot_if_possible(result: dict) -> None:  # the JSON and the table never depend on the plot
        try:  # matplotlib is the `bench` extra
            plot(result, args.out.with_name(args.out.name + ".png"))
        except ModuleNotFoundError as e:
            print(f"no plot: {e.name} is not installed (pip install -e '.[bench]')", file=sys.stderr)

    return finish(args, run, table, after=plot_if_possible)

if __name__ == "__main__":
    sys.exit(main())
