"""Code completion (fill in the middle) on the Python standard library: edgespec against llama.cpp's ``/infill``.

Tasks (bench/fim_tasks.py): from a few dozen stdlib source files of the Python that runs this, a span of 1–5
lines of a function is blanked out and completed from the lines around it (prefix and suffix). Every task runs
every configuration in an order rotated per task, greedy, from a cold KV cache (``cache_prompt`` off for
llama.cpp, fresh caches for edgespec), up to ``--max-new-tokens``:

- edgespec ``plain`` (the target alone) and its default mode (``adaptive+lookup``: prompt lookup first, then
  the draft model, adaptive K; one controller for the whole run, as ``edgespec serve`` keeps), on the FIM
  prompt of edgespec/fim.py (repo-level format, llama.cpp's default repository and file names);
- llama.cpp's ``llama-server`` on the export's own GGUFs: ``POST /infill`` with the same prefix and suffix
  (llama.cpp's own prompt, always repo-level for Qwen), ``plain`` and ``ngram`` (``--spec-type ngram-simple``);
  and the same modes with ``@ids`` (``plain@ids``, ``ngram@ids``): ``POST /completion`` with edgespec's FIM
  prompt as token ids, so both runtimes prefill and continue exactly the same tokens (the fair latency
  comparison: on the Instruct pair the repo-level prompt runs on past the middle). ``--peer-modes`` may add
  ``draft``.

Reported per configuration: exact match and edit similarity against the removed lines, agreement with its own
plain decoding (lossless: edgespec's default mode must equal edgespec plain), time to first token and
completion latency (ms, each runtime's own clock: edgespec's stats, llama-server's ``timings``), decode tok/s
and acceptance (alpha), and the median per-task latency ratios against edgespec plain and llama.cpp's best
mode. The prompt token counts of both runtimes are compared per task (``prompt_tokens_match``).

Usage (the real pair exported, llama.cpp built by ``python bench/peers_build.py``):
    python bench/fim_bench.py --out bench/results/fim-stdlib
writes ``<out>.json`` and prints the markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fim_tasks import Task, score, stdlib_tasks  # noqa: E402
from llama_server import LlamaServer, PeerError, PeerMode, finish, post_json  # noqa: E402

from edgespec.io import paths  # noqa: E402
from edgespec.errors import EdgespecError  # noqa: E402

EDGESPEC, LLAMA = "edgespec", "llama.cpp"
DEFAULT_MODE = "adaptive+lookup"  # edgespec serve's and generate's default: lookup first, then the draft


class EdgespecRunner:
    """One edgespec bench mode on a loaded decoder whose stop ids include the FIM ones. A mode name may end with
    ``@w<N>``: the draft reads a FIM prompt of about N tokens around the cursor (``@w0``: the whole prompt);
    without it, the window ``edgespec serve`` and ``complete`` use (edgespec.apps.fim.DRAFT_WINDOW)."""

    runtime = EDGESPEC

    def __init__(self, dec, mode_name: str, fim):
        from edgespec.apps.fim import DRAFT_WINDOW
        from edgespec.bench.runner import Mode

        base, _, w = mode_name.partition("@w")
        if _ and not w.isdigit():
            raise EdgespecError(f"mode {mode_name!r}: @w needs a number of tokens (e.g. @w256)")
        self.window = int(w) if _ else DRAFT_WINDOW
        self.dec, self.mode, self.mode_name, self.fim = dec, Mode.parse(base), mode_name, fim
        self.policy = self.mode.controller(dec) if self.mode.k is None and self.mode.proposers else None

    def run(self, task: Task, ids: list[int], n: int) -> dict:
        from edgespec.core.stats import GenerationStats
        from edgespec.io.text import IncrementalDetokenizer

        d = self.dec
        d.reset()
        stats = GenerationStats()
        detok = IncrementalDetokenizer(d.tokenizer)
        text, first_ms = [], None
        t0 = time.perf_counter()
        from edgespec.apps.fim import FimPrompt, draft_prompt_for
        from edgespec.engine.generation import GenerationOptions

        options = self.mode.options(n, 0.0, 0)
        drafting = any(p.uses_draft for p in d.proposers_for(options))
        draft_ids = draft_prompt_for(d, self.fim, FimPrompt(task.prefix, task.suffix), self.window,
                                     len(ids)) if drafting else None
        if draft_ids is not None:
            options = GenerationOptions.with_fields(options, {"draft_prompt": draft_ids})
        for toks, _ in d.generate_ids(ids, options, self.policy, stats):
            if first_ms is None:
                first_ms = (time.perf_counter() - t0) * 1e3
            text.append(detok.push(toks))
        latency_ms = (time.perf_counter() - t0) * 1e3  # the clock of ttft_ms (stats.wall_ms starts later)
        text.append(detok.flush())
        s = stats
        return {"completion": "".join(text), "prompt_tokens": len(ids), "new_tokens": s.new_tokens,
                "ttft_ms": first_ms, "latency_ms": latency_ms, "decode_tok_s": s.decode_tokens_per_s,
                "alpha": s.alpha if self.mode.proposers else None, "accepted": s.accepted,
                "drafted": s.proposed, "stop": s.stop_reason,
                "draft_prompt_tokens": len(draft_ids) if draft_ids is not None else None,
                "draft_ms": s.draft_ms}


class LlamaInfillRunner:
    """One llama.cpp configuration on a running ``LlamaServer``: ``/infill`` (its own FIM prompt), or with
    ``ids`` ``/completion`` of edgespec's FIM prompt token ids (mode name ``<mode>@ids``)."""

    runtime = LLAMA

    def __init__(self, server: LlamaServer, mode: PeerMode, ids: bool = False):
        self.server, self.ids = server, ids
        self.mode_name = mode.name + ("@ids" if ids else "")

    def run(self, task: Task, ids: list[int], n: int) -> dict:
        common = {"n_predict": n, "temperature": 0.0, "top_k": 1, "cache_prompt": False, "stream": False}
        if self.ids:
            path, body = "/completion", {"prompt": list(map(int, ids)), **common}
        else:
            path, body = "/infill", {"input_prefix": task.prefix, "input_suffix": task.suffix, "input_extra": [],
                                     "prompt": "", **common}
        t0 = time.perf_counter()
        res = post_json(self.server.url + path, body, 600)
        t = res.get("timings") or {}
        try:
            prompt_ms, gen_ms, k = float(t["prompt_ms"]), float(t["predicted_ms"]), int(t["predicted_n"])
        except (KeyError, TypeError, ValueError):
            raise PeerError(f"llama-server /infill answer has no usable timings: {str(t)[:200]}") from None
        drafted, accepted = int(t.get("draft_n", 0)), int(t.get("draft_n_accepted", 0))
        return {"completion": res.get("content", ""), "prompt_tokens": int(t.get("prompt_n", 0)), "new_tokens": k,
                "ttft_ms": prompt_ms, "latency_ms": prompt_ms + gen_ms,
                "decode_tok_s": (k - 1) / (gen_ms / 1e3) if k > 1 and gen_ms > 0 else 0.0,
                "alpha": accepted / drafted if drafted else None, "accepted": accepted, "drafted": drafted,
                "stop": res.get("stop_type"), "client_wall_ms": (time.perf_counter() - t0) * 1e3}


def label(r) -> str:
    return f"{r.runtime} {r.mode_name}"


def interleave(tasks: list[Task], encoded: list[list[int]], runners: list, n: int, progress=None) -> list[dict]:
    """Every runner on every task, the order rotated by one per task; records gain the task's fields, its
    score, and ``same_as_plain`` (the completion equals the same runtime's plain one)."""
    runs = []
    for i, (task, ids) in enumerate(zip(tasks, encoded)):
        for r in runners[i % len(runners):] + runners[:i % len(runners)]:
            rec = r.run(task, ids, n)
            rec.update(task=i, module=task.module, function=task.function, line=task.line, n_lines=task.n_lines,
                       runtime=r.runtime, mode=r.mode_name, label=label(r), **score(rec["completion"], task.answer))
            runs.append(rec)
            if progress:
                progress()
    by = {(x["task"], x["runtime"], x["mode"]): x for x in runs}
    for x in runs:
        plain = by.get((x["task"], x["runtime"], "plain@ids" if x["mode"].endswith("@ids") else "plain"))
        x["same_as_plain"] = plain is not None and x["completion"] == plain["completion"]
        es = by.get((x["task"], EDGESPEC, "plain"))
        x["prompt_tokens_match"] = es is not None and x["prompt_tokens"] == es["prompt_tokens"]
    return runs


def _median(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return float(np.median(xs)) if xs else None


def summarize(runs: list[dict], labels: list[str]) -> dict:
    """Per configuration: scores, agreement with plain, medians of time and rates, paired latency ratios."""
    by = {(x["task"], x["label"]): x for x in runs}
    tasks = sorted({x["task"] for x in runs})
    out = {}
    for lab in labels:
        sel = [x for x in runs if x["label"] == lab]
        drafted = sum(x["drafted"] for x in sel)
        out[lab] = {
            "tasks": len(sel), "exact_match": sum(x["exact_match"] for x in sel),
            "edit_similarity": float(np.mean([x["edit_similarity"] for x in sel])) if sel else None,
            "same_as_plain": f"{sum(x['same_as_plain'] for x in sel)}/{len(sel)}",
            "ttft_ms_p50": _median([x["ttft_ms"] for x in sel]),
            "latency_ms_p50": _median([x["latency_ms"] for x in sel]),
            "latency_ms_mean": float(np.mean([x["latency_ms"] for x in sel])) if sel else None,
            "decode_tok_s_p50": _median([x["decode_tok_s"] for x in sel]),
            "new_tokens_mean": float(np.mean([x["new_tokens"] for x in sel])) if sel else None,
            "alpha": sum(x["accepted"] for x in sel) / drafted if drafted else None,
            "prompt_tokens_match": f"{sum(x['prompt_tokens_match'] for x in sel)}/{len(sel)}",
        }
    for lab in labels:  # speed-up = the reference's latency / this one's, median over tasks
        for ref in (f"{EDGESPEC} plain", f"{LLAMA} plain"):
            ratios = [by[(t, ref)]["latency_ms"] / by[(t, lab)]["latency_ms"] for t in tasks
                      if (t, ref) in by and (t, lab) in by and by[(t, lab)]["latency_ms"] > 0]
            out[lab][f"speedup_vs_{ref.replace(' ', '_')}"] = _median(ratios)
    return out


def headline(summary: dict, tasks: list[int], runs: list[dict], default_label: str) -> dict:
    """The goal's figures: edgespec's default against its plain and against llama.cpp's fastest mode."""
    llama = [lab for lab in summary if lab.startswith(LLAMA)]
    best = min(llama, key=lambda lab: summary[lab]["latency_ms_p50"] or float("inf")) if llama else None
    by = {(x["task"], x["label"]): x for x in runs}
    vs_best = _median([by[(t, best)]["latency_ms"] / by[(t, default_label)]["latency_ms"] for t in tasks
                       if (t, best) in by and (t, default_label) in by]) if best else None
    d = summary[default_label]
    return {"default": default_label, "exact_match": d["exact_match"],
            "plain_exact_match": summary[f"{EDGESPEC} plain"]["exact_match"],
            "same_as_plain": d["same_as_plain"], "speedup_vs_own_plain": d[f"speedup_vs_{EDGESPEC}_plain"],
            "llama_best": best, "speedup_vs_llama_best": vs_best,
            "goal": "exact match equal to plain; >= 1.3x own plain and >= 1.2x llama.cpp's best in latency"}


def table(result: dict) -> str:
    """The markdown table of docs/benchmarks.md."""
    rows = ["| runtime | mode | exact match | edit sim. | same as plain | TTFT p50 ms | latency p50 ms | "
            "decode tok/s p50 | alpha | speed-up vs edgespec plain | vs llama.cpp plain |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for lab, s in result["summary"].items():
        rt, mode = lab.split(" ", 1)
        f = lambda v, fmt="{:.0f}": "—" if v is None else fmt.format(v)  # noqa: E731
        rows.append(f"| {rt} | {mode} | {s['exact_match']}/{s['tasks']} | {f(s['edit_similarity'], '{:.3f}')} | "
                    f"{s['same_as_plain']} | {f(s['ttft_ms_p50'])} | {f(s['latency_ms_p50'])} | "
                    f"{f(s['decode_tok_s_p50'], '{:.1f}')} | {f(s['alpha'], '{:.2f}')} | "
                    f"{f(s['speedup_vs_edgespec_plain'], '{:.2f}x')} | "
                    f"{f(s['speedup_vs_llama.cpp_plain'], '{:.2f}x')} |")
    return "\n".join(rows)


def run(args) -> dict:
    """The whole benchmark (see the module docstring); returns the result dict written as JSON."""
    from contextlib import ExitStack

    from peers import cpu_model, find_ggufs
    from peers_build import SDIST_REQ, binaries, cache_dir

    from edgespec.control.calibrate import calibrate
    from edgespec.engine.decoder import SpecDecoder
    from edgespec.apps.fim import FimPrompt, build_ids, fim_tokens
    from edgespec.bench.progress import progress_bar

    modes = args.modes.split(",")
    peer_specs = [(PeerMode.parse(m.split("@")[0]), m.endswith("@ids")) for m in args.peer_modes.split(",") if m]
    for name in args.peer_modes.split(","):
        if "@" in name and not name.endswith("@ids"):
            raise EdgespecError(f"unknown llama.cpp mode {name!r} (a mode, or a mode with @ids)")
    peer_modes = list({pm.name: pm for pm, _ in peer_specs}.values())  # one server per mode
    if "plain" not in modes or (peer_modes and "plain" not in [p.name for p in peer_modes]):
        raise EdgespecError("--modes and --peer-modes must both include plain (the ratios are against it)")
    export = Path(args.export).expanduser() if args.export else paths.default_export_dir()
    server_bin = None
    if peer_modes:
        target, draft = find_ggufs(export, args.target_gguf, args.draft_gguf)
        server_bin = binaries(args.llama_build or cache_dir() / "build").get("llama-server")
        if server_bin is None:
            raise EdgespecError("llama-server is not built: run `python bench/peers_build.py` first (~5.5 min)")
    dec = SpecDecoder.load(export, threads=args.threads, shared_thread_pool=True)
    fim = fim_tokens(dec.tokenizer)
    if fim is None:
        raise EdgespecError(f"{export}: the export's tokenizer has no FIM tokens")
    dec.stop_ids = dec.stop_ids | fim.stop_ids
    es = [EdgespecRunner(dec, m, fim) for m in modes]  # ValueError on a bad mode name
    for proposers in ((), ("draft",)):  # warm-up: first runs allocate
        dec.generate("Hello", max_new_tokens=4, k=2, proposers=proposers).run()
    if any(r.policy is not None for r in es):
        calibrate(dec)
    all_tasks = stdlib_tasks(args.files, args.per_file, args.prefix_lines, args.suffix_lines, args.seed)
    tasks, encoded, skipped = [], [], []
    for t in all_tasks:
        ids = build_ids(dec.tokenizer, lambda: dec.plain_tokenizer, fim, FimPrompt(t.prefix, t.suffix))
        if len(ids) + args.max_new_tokens > dec.context_length:
            skipped.append(f"{t.module}:{t.line}")
        else:
            tasks.append(t)
            encoded.append(ids)
    if not tasks:
        raise EdgespecError(f"no task fits the export's {dec.context_length}-token context (fewer --prefix-lines?)")
    ctx = max(4096, max(len(e) for e in encoded) + args.max_new_tokens + 64)
    load_start = os.getloadavg()
    with ExitStack() as stack:
        servers = {}
        for pm in peer_modes:
            srv = LlamaServer(server_bin, pm.server_args(target, draft, args.threads, ctx),
                              cache_dir() / "logs" / f"llama-server-fim-{pm.name}.log")
            servers[pm.name] = stack.enter_context(srv)
        ll = [LlamaInfillRunner(servers[pm.name], pm, by_ids) for pm, by_ids in peer_specs]
        for r in ll:
            r.run(tasks[0], encoded[0], 4)  # warm-up
        runners = [r for pair in zip(es, ll) for r in pair] + es[len(ll):] + ll[len(es):]
        bar = progress_bar(len(tasks) * len(runners), "fim", unit="run")
        runs = interleave(tasks, encoded, runners, args.max_new_tokens, progress=bar.update)
        bar.close()
        commands = {name: s.command for name, s in servers.items()}
    labels = [label(r) for r in runners]
    summary = summarize(runs, labels)
    default = f"{EDGESPEC} {DEFAULT_MODE}" if DEFAULT_MODE in modes else labels[0]
    return {
        "command": "python " + " ".join(sys.argv), "export": str(export),
        "python": sys.version.split()[0], "peer": {"llama.cpp": f"b11434 from {SDIST_REQ}",
                                                   "server_commands": commands} if peer_modes else None,
        "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(), "platform": platform.platform(),
                    "loadavg_start": load_start, "loadavg_end": os.getloadavg()},
        "settings": {"modes": modes, "peer_modes": [r.mode_name for r in ll], "files": args.files,
                     "per_file": args.per_file, "prefix_lines": args.prefix_lines, "suffix_lines": args.suffix_lines,
                     "max_new_tokens": args.max_new_tokens, "threads": args.threads, "seed": args.seed,
                     "greedy": True, "cold_cache": True},
        "tasks": [{"module": t.module, "path": t.path, "function": t.function, "line": t.line,
                   "n_lines": t.n_lines, "answer": t.answer} for t in tasks],
        "skipped_tasks": skipped, "runs": runs, "summary": summary,
        "headline": headline(summary, list(range(len(tasks))), runs, default),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("export", nargs="?", help="export directory (default: the default pair in the user cache)")
    ap.add_argument("--modes", default=f"plain,{DEFAULT_MODE}", help="edgespec bench modes (default: %(default)s)")
    ap.add_argument("--peer-modes", default="plain,ngram,plain@ids,ngram@ids",
                    help="llama.cpp modes: plain, ngram, draft, draft<N>; @ids: /completion of edgespec's prompt ids "
                         "instead of /infill ('' for none; default: %(default)s)")
    ap.add_argument("--files", type=int, default=40, help="stdlib source files (default: %(default)s)")
    ap.add_argument("--per-file", type=int, default=1, help="blanked spans per file (default: %(default)s)")
    ap.add_argument("--prefix-lines", type=int, default=40, help="lines before the span (default: %(default)s)")
    ap.add_argument("--suffix-lines", type=int, default=15, help="lines after the span (default: %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2, help="threads for both runtimes (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the task draw (default: %(default)s)")
    ap.add_argument("--target-gguf", type=Path, help="target GGUF for llama.cpp (default: the export's source)")
    ap.add_argument("--draft-gguf", type=Path, help="draft GGUF for llama.cpp (default: the export's source)")
    ap.add_argument("--llama-build", type=Path, help="llama.cpp cmake build dir (default: <cache>/peers/build)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/fim-stdlib"), help="writes OUT.json")
    return finish(ap.parse_args(argv), run, table)

if __name__ == "__main__":
    sys.exit(main())
