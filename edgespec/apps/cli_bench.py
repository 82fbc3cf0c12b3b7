"""``edgespec bench`` (plain against speculative modes on a prompt set, or ``--context``: a context sweep) and
``edgespec eval`` (losslessness checks): their arguments and what they run, printing and writing the results."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..engine import flags
from ..errors import EdgespecError
from .cli_common import add_provider_options, check_out, export_dir, provider_options, write_json


def add_bench_parser(sub) -> None:
    """Add the ``bench`` subcommand to the CLI's subparsers."""
    p = sub.add_parser("bench", help="plain vs speculative modes on a prompt set: JSON + PNG")
    p.add_argument("dir", nargs="?", help="export directory (default: the default pair)")
    p.add_argument("--modes", default=None,
                   help="comma-separated: plain, k<K>, adaptive, adaptive@<ms>, lookup, suffix, tree<N>, any of the first "
                        "four +lookup/+suffix/+tree "
                        "(default plain,k1,k2,k4,k6,adaptive,adaptive+lookup; with --context plain,adaptive+lookup; "
                        "adaptive+lookup is what chat, generate and serve run by default)")
    p.add_argument("--context", type=flags.contexts, default=None,
                   help="context sweep instead of the prompt set: decode and prefill tok/s after pasts of these "
                        "lengths, e.g. 128,1024,2048,3500")
    p.add_argument("--also", action="append", default=[], metavar="DIR",
                   help="with --context: another export measured side by side in the same run (repeatable)")
    p.add_argument("--latency-budget-ms", type=flags.latency_ms, default=None, help="also run adaptive@<this budget>")
    p.add_argument("--prompts", help="prompt file (JSON lines {class, prompt} or one prompt per line)")
    p.add_argument("--per-class", type=flags.pos_int, default=None, help="built-in prompts per class (default all)")
    p.add_argument("--max-new-tokens", type=flags.pos_int, default=128)
    p.add_argument("--temperature", type=flags.temperature, default=0.0)
    p.add_argument("--seed", type=flags.nonneg_int, default=0)
    add_provider_options(p)
    p.add_argument("--threads", type=flags.pos_int, default=None)
    p.add_argument("--cost-curve", action="store_true",
                   help="also measure t(N)/t(1), c, and the speedup Leviathan et al.'s formula predicts")
    p.add_argument("--repeats", type=flags.pos_int, default=1,
                   help="run every (prompt, mode) N times and keep the median-rate run (default %(default)s)")
    p.add_argument("--new-controller-per-prompt", action="store_true",
                   help="adaptive modes: a new controller for every prompt (default: one per prompt class, "
                        "carried across its prompts as chat carries it across turns)")
    p.add_argument("--out", default="edgespec-bench", help="write OUT.json and OUT.png (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the JSON result to stdout")


def add_eval_parser(sub) -> None:
    """Add the ``eval`` subcommand to the CLI's subparsers."""
    p = sub.add_parser("eval", help="losslessness: greedy identity, sampling check, likelihood")
    p.add_argument("dir", nargs="?")
    p.add_argument("--prompts")
    p.add_argument("--per-class", type=flags.pos_int, default=2)
    p.add_argument("--max-new-tokens", type=flags.pos_int, default=64)
    p.add_argument("--k", type=flags.pos_int, default=4)
    p.add_argument("--draws", type=flags.pos_int, default=300, help="seeds for the first-token sampling check")
    p.add_argument("--ll-samples", type=flags.pos_int, default=8, help="sampled texts per mode for the likelihood")
    add_provider_options(p)
    p.add_argument("--out", default=None, help="also write the JSON result to this file")
    p.add_argument("--json", action="store_true")


def prompt_set(a):
    """The ``--prompts`` file's prompts, or the built-in set (``--per-class`` of each class)."""
    from ..bench import prompts

    return prompts.load_file(a.prompts) if a.prompts else prompts.builtin(a.per_class)


def cmd_bench(a) -> int:
    """``edgespec bench``: writes OUT.json (and OUT.png with matplotlib), prints the table or the JSON."""
    from ..bench.runner import Mode, format_bench, plot, run_bench

    if a.context is not None:
        return _context_sweep(a)
    if a.also:
        raise EdgespecError("--also needs --context")
    modes = [m.strip() for m in (a.modes or "plain,k1,k2,k4,k6,adaptive,adaptive+lookup").split(",") if m.strip()]
    if a.latency_budget_ms is not None:
        modes.append(f"adaptive@{a.latency_budget_ms:g}")
    for m in modes:
        Mode.parse(m)
    if "plain" not in modes:
        modes.insert(0, "plain")
    prompts = prompt_set(a)
    d = export_dir(a.dir, auto_export=False)
    base = next((a.out[:-len(x)] for x in (".json", ".png") if a.out.endswith(x)), a.out)  # OUT.json, OUT.png
    json_out, png_out = check_out(Path(base + ".json")), check_out(Path(base + ".png"))
    result = run_bench(d, modes, prompts, a.max_new_tokens, a.temperature, a.seed, a.provider, a.threads,
                       provider_options=provider_options(a),
                       cost=a.cost_curve, progress=not a.json, sessions=not a.new_controller_per_prompt, repeats=a.repeats)
    result["command"] = "edgespec " + " ".join(sys.argv[1:])
    write_json(json_out, result)
    try:
        plot(result, png_out)
        wrote = f"wrote {json_out} and {png_out}"
    except ImportError:
        print("edgespec: matplotlib is not installed: no plot (pip install -e '.[bench]' in the edgespec checkout)", file=sys.stderr)
        wrote = f"wrote {json_out} (no plot)"
    if a.json:
        print(json.dumps(result))
    else:
        print(format_bench(result))
        print(wrote)
    return 0


def _context_sweep(a) -> int:
    from ..bench.runner import Mode
    from ..bench.context import context_sweep, format_sweep, plot_sweep

    modes = [m.strip() for m in (a.modes or "plain,adaptive+lookup").split(",") if m.strip()]
    for m in modes:
        Mode.parse(m)
    dirs = [export_dir(a.dir, auto_export=False)] + [export_dir(d, auto_export=False) for d in a.also]
    base = next((a.out[:-len(x)] for x in (".json", ".png") if a.out.endswith(x)), a.out)
    json_out, png_out = check_out(Path(base + ".json")), check_out(Path(base + ".png"))
    try:
        result = context_sweep(dirs, a.context, modes, a.max_new_tokens, a.provider, a.threads, a.repeats)
    except ValueError as e:
        raise EdgespecError(str(e)) from None
    result["command"] = "edgespec " + " ".join(sys.argv[1:])
    write_json(json_out, result)
    try:
        plot_sweep(result, png_out)
    except ImportError:
        print("edgespec: matplotlib is not installed: no plot (pip install -e '.[bench]' in the edgespec checkout)", file=sys.stderr)
    print(json.dumps(result) if a.json else format_sweep(result))
    if not a.json:
        print(f"wrote {json_out} and {png_out}")
    return 0


def cmd_eval(a) -> int:
    """``edgespec eval``: prints the checks (or the JSON); exit 1 when one fails."""
    from ..engine.decoder import SpecDecoder
    from ..bench.evaluate import run_eval

    out = check_out(Path(a.out)) if a.out else None
    prompts = prompt_set(a)
    d = export_dir(a.dir, auto_export=False)
    dec = SpecDecoder.load(d, provider=a.provider, provider_options=provider_options(a), shared_thread_pool=True)
    r = run_eval(dec, prompts, a.max_new_tokens, a.k, a.draws, a.ll_samples, progress=not a.json)
    r["command"] = "edgespec " + " ".join(sys.argv[1:])
    if out is not None:
        write_json(out, r)
    if a.json:
        print(json.dumps(r))
        return 0
    for name, rows in (("greedy", r["greedy"]), (f"seeded sampling (T={r['settings']['temperature']:g})", r["seeded"])):
        n_id = sum(g["identical"] for g in rows)
        n_ok = sum(g["ok"] and not g["identical"] for g in rows)
        print(f"{name}: {n_id}/{len(rows)} speculative runs identical to plain, {n_ok} diverge where the verify "
              f"path's own numbers chose otherwise (kernel noise), {len(rows) - n_id - n_ok} fail")
        for g in rows:
            if not g["identical"]:
                print(f"  {g['class']}: first divergence at token {g['first_divergence']}, plain gap "
                      f"{_fmt(g['plain_gap'])}, δ {_fmt(g['delta'])}: {'ok' if g['ok'] else 'FAIL: ' + str(g['problem'])}")
    for k, s in r["kernel_noise"]["by_k"].items():
        if s["positions"]:
            print(f"kernel noise, K+1 = {int(k) + 1}-row verify vs one-token step ({s['positions']} positions): "
                  f"max |Δ logit| median {s['median_max_abs']:.4f}, p99 {s['p99_max_abs']:.4f}, max "
                  f"{s['max_abs']:.4f}; greedy flips {s['flips_per_1000']:.1f} per 1,000 tokens")
    for s in r["sampling"]:
        print(f"sampling ({s['class']}, {s['coupling']} rule): first-token TV {s['tv']:.3f} over {s['draws']} "
              f"seeds; sampling noise alone {s['tv_noise']:.3f}")
    for mode, l in r["likelihood"].items():
        extra = f", alpha {l['alpha']:.3f}" if l.get("alpha") is not None else ""
        err = f" ± {l['stderr']:.3f}" if l["stderr"] is not None else ""  # one text: no standard error
        print(f"likelihood ({mode}): mean log p {l['mean_log_likelihood']:.3f}{err} "
              f"(perplexity {l['perplexity']:.2f}, {l['samples']} texts{extra})")
    ok = all(g["ok"] for g in r["greedy"] + r["seeded"])
    return 0 if ok else 1


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.4f}"
