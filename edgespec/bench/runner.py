"""``edgespec bench``: plain vs speculative modes, interleaved in one process on the same prompts.

Every prompt runs every mode (in a rotated order, fresh caches each time) so that speedups are paired ratios
against plain decoding on the same prompt, not ratios of averages taken at different times. Plain decoding
runs on the very target session the speculative modes verify with: two sessions of the same graph in one
process measured ~5% apart here depending on which was created first, which would bias any comparison
across sessions.
"""

from __future__ import annotations

import copy
import math
import platform
import resource
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..control.adaptive import AdaptiveK, expected_tokens
from ..control.calibrate import calibrate
from ..engine.decoder import SpecDecoder
from ..engine import presets
from ..engine.generation import GenerationOptions
from .progress import progress_bar
from .prompts import Prompt
from ..core.stats import GenerationStats


@dataclass(frozen=True)
class Mode:
    """A benchmark mode: ``plain``; ``k<K>`` (fixed K); ``adaptive`` or ``adaptive@<ms>`` (latency budget);
    ``tree<N>`` (token trees of N nodes); the name of a registered proposer without a model, e.g. ``lookup``
    (that proposer alone, adaptive K). Suffixes: ``+tree`` lets the adaptive controller use trees, ``+<name>``
    (e.g. ``+lookup``) puts that proposer before the draft."""

    name: str
    k: int | None = None
    budget_ms: float | None = None
    first: tuple[str, ...] = ()
    draft: bool = True
    tree: bool = False

    @staticmethod
    def parse(name: str) -> "Mode":
        """From the names above; ValueError otherwise."""
        from ..draft import PROPOSERS

        if name == "plain":
            return Mode(name, k=0, draft=False)
        base, *extras = name.split("+")
        tree = "tree" in extras
        first = tuple(e for e in extras if e != "tree")
        known = [n for n, cls in PROPOSERS.items() if not cls.uses_draft]
        if all(e in known for e in first) and len(set(extras)) == len(extras):
            if base in known and not extras:
                return Mode(name, first=(base,), draft=False)
            if base.startswith("tree") and base[4:].isdigit():
                return Mode(name, k=int(base[4:]), first=first, tree=True)
            if base.startswith("k") and base[1:].isdigit() and not tree:
                return Mode(name, k=int(base[1:]), first=first)
            if base == "adaptive":
                return Mode(name, first=first, tree=tree)
            if base.startswith("adaptive@"):
                try:
                    budget = float(base.split("@", 1)[1])
                except ValueError:
                    budget = None
                if budget is not None and math.isfinite(budget) and budget > 0:
                    return Mode(name, budget_ms=budget, first=first, tree=tree)
                raise ValueError(f"mode {name!r}: the latency budget must be a finite number of milliseconds > 0")
        raise ValueError(f"unknown mode {name!r} (plain, k<K>, tree<N>, adaptive, adaptive@<ms>, "
                         f"{', '.join(known)}, adaptive+tree, …+<proposer>)")

    def controller(self, dec: SpecDecoder, cls: str | None = None) -> AdaptiveK:
        """A new adaptive controller for this mode on ``dec``, for prompts of class ``cls`` (the voice class gets
        the voice use's answer-length prior, as ``edgespec voice`` does: :data:`~edgespec.engine.presets.ANSWER_PRIORS`)."""
        return presets.k_policy(dec, None, self.budget_ms, use=cls)

    @property
    def proposers(self) -> tuple[str, ...]:
        """The mode's proposers in priority order (a fixed-size tree replaces the chain; an adaptive tree is
        offered beside it)."""
        if self.name == "plain":
            return presets.proposers(draft=False)
        return presets.proposers(self.first, self.draft, self.tree, fixed_k=self.k is not None)

    def options(self, max_new_tokens: int, temperature: float, seed: int) -> GenerationOptions:
        """The generation options of one run of this mode (a fixed K, or the controller's)."""
        k = self.k if self.k is not None else presets.DEFAULT_K
        return GenerationOptions(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                                 proposers=self.proposers, k=k, n_nodes=k)


def _median(xs) -> float | None:
    return float(np.median(xs)) if len(xs) else None


def _pct(xs, q) -> float | None:
    return float(np.percentile(xs, q)) if len(xs) else None


def run_one(dec: SpecDecoder, mode: Mode, prompt: Prompt, max_new_tokens: int, temperature: float,
            seed: int, policy: AdaptiveK | None = None) -> dict:
    """One generation from fresh caches; returns its measurements (times in ms, rates in tok/s).

    Adaptive modes use ``policy`` (a controller that may have run earlier prompts) or a new one."""
    dec.reset()
    ids = dec.encode(messages=list(prompt.messages))
    options = mode.options(max_new_tokens, temperature, seed)
    if mode.k is None and policy is None and options.proposers:
        policy = mode.controller(dec, prompt.cls)
    warm = bool(policy is not None and policy.lengths)
    stats = GenerationStats()
    t0 = time.perf_counter()
    last, gaps = t0, []
    first_ms = None
    for toks, _ in dec.generate_ids(ids, options, policy if mode.k is None else None, stats):
        now = time.perf_counter()
        if first_ms is None:
            first_ms = (now - t0) * 1e3
        elif toks:
            gaps += [(now - last) * 1e3] + [0.0] * (len(toks) - 1)  # a burst arrives at once
        last = now
    s = stats
    rec = {
        "class": prompt.cls, "mode": mode.name, "prompt_tokens": len(ids), "new_tokens": s.new_tokens,
        "ttft_ms": first_ms, "prefill_ms": s.prefill_ms,
        "prefill_tok_s": len(ids) / (s.prefill_ms / 1e3) if s.prefill_ms > 0 else 0.0, "wall_ms": s.wall_ms,
        "e2e_tok_s": s.tokens_per_s, "decode_tok_s": s.decode_tokens_per_s,
        "itl_p50_ms": _pct(gaps, 50), "itl_p95_ms": _pct(gaps, 95), "rounds": s.rounds,
        "alpha": s.alpha if options.proposers else None,
        "proposers": {name: asdict(ps) for name, ps in s.proposers.items()}, "accepted_per_target_run": s.accepted / s.rounds if s.rounds else 0.0,
        "accepted": s.accepted, "evaluated": s.evaluated,
        "proposed": s.proposed, "mean_accepted_length": s.mean_accepted_length,
        "accepted_per_position": s.accepted_per_position, "proposed_per_position": s.proposed_per_position,
        "mean_k": float(np.mean(s.k_per_round)) if s.k_per_round else 0.0,
        "round_p50_ms": _pct(s.round_ms, 50), "round_p95_ms": _pct(s.round_ms, 95),
        "draft_ms": s.draft_ms, "verify_ms": s.verify_ms, "warm_controller": warm, "adaptive": policy is not None,
    }
    if mode.budget_ms is not None:
        rec["budget_ms"] = mode.budget_ms
        rec["rounds_over_budget"] = int(sum(r > mode.budget_ms for r in s.round_ms))
    return rec


def summarize(runs: list[dict], modes: list[str]) -> dict:
    """Per mode and per prompt class: medians, paired speedups vs plain, token-weighted alpha."""
    plain = {r["prompt"]: r for r in runs if r["mode"] == "plain"}
    out = {}
    classes = sorted({r["class"] for r in runs})
    for mode in modes:
        rs = [r for r in runs if r["mode"] == mode]
        per = {}
        for cls in classes + ["all"]:
            sel = [r for r in rs if cls == "all" or r["class"] == cls]
            if not sel:
                continue
            paired = [(r, r["decode_tok_s"] / plain[r["prompt"]]["decode_tok_s"]) for r in sel
                      if r["prompt"] in plain and plain[r["prompt"]]["decode_tok_s"] > 0]
            sp_dec = [x for _, x in paired]
            # adaptive modes: the prompts that met a new controller (nothing learned from earlier prompts)
            sp_new = [x for r, x in paired
                      if r.get("warm_controller") is False and r.get("adaptive")]
            sp_e2e = [r["e2e_tok_s"] / plain[r["prompt"]]["e2e_tok_s"] for r in sel
                      if r["prompt"] in plain and plain[r["prompt"]]["e2e_tok_s"] > 0]
            acc, ev = sum(r["accepted"] for r in sel), sum(r["evaluated"] for r in sel)
            pos_acc = np.sum([np.pad(r["accepted_per_position"], (0, 16))[:16] for r in sel], axis=0)
            pos_prop = np.sum([np.pad(r["proposed_per_position"], (0, 16))[:16] for r in sel], axis=0)
            n = int(np.max(np.nonzero(pos_prop)[0]) + 1) if pos_prop.any() else 0
            per[cls] = {
                "prompts": len(sel),
                "decode_tok_s": float(np.median([r["decode_tok_s"] for r in sel])),
                "e2e_tok_s": float(np.median([r["e2e_tok_s"] for r in sel])),
                "ttft_ms": float(np.median([r["ttft_ms"] for r in sel])),
                "speedup_decode_median": _median(sp_dec),
                "speedup_decode_min": float(np.min(sp_dec)) if sp_dec else None,
                "speedup_decode_new_controller": _median(sp_new),
                "speedup_e2e_median": _median(sp_e2e),
                "alpha": acc / ev if ev else None,
                "mean_accepted_length": float(np.mean([r["mean_accepted_length"] for r in sel])),
                "accepted_per_target_run": float(np.mean([r["accepted_per_target_run"] for r in sel])),
                "mean_k": float(np.mean([r["mean_k"] for r in sel])),
                "itl_p50_ms": float(np.median([r["itl_p50_ms"] for r in sel if r["itl_p50_ms"] is not None] or [0])),
                "itl_p95_ms": float(np.median([r["itl_p95_ms"] for r in sel if r["itl_p95_ms"] is not None] or [0])),
                "acceptance_by_position": [float(a / p) if p else None for a, p in zip(pos_acc[:n], pos_prop[:n])],
            }
            if any("budget_ms" in r for r in sel):
                rounds = sum(r["rounds"] for r in sel)
                per[cls]["budget_ms"] = sel[0]["budget_ms"]
                per[cls]["share_rounds_over_budget"] = sum(r["rounds_over_budget"] for r in sel) / max(rounds, 1)
                per[cls]["round_p95_ms"] = float(np.max([r["round_p95_ms"] for r in sel if r["round_p95_ms"]] or [0]))
        out[mode] = per
    return out


def cost_curve(dec: SpecDecoder, n_max: int = 9, context: int = 256, reps: int = 5) -> dict:
    """Target t(N)/t(1) for N = 1..n_max, the draft's step time and c = t_draft / t_target(1) (ms)."""
    context = min(context, dec.context_length - n_max)  # past + N must fit the model's positions
    cm = calibrate(dec, k_max=n_max - 1, context=context, reps=reps, use_cache=False)
    t1 = cm.verify_ms[0]
    return {"context": context, "target_ms": cm.verify_ms, "ratio": [t / t1 for t in cm.verify_ms],
            "draft_ms": cm.draft_ms, "c": cm.draft_ms / t1}


def predicted_speedups(curve: dict, summary: dict) -> dict:
    """For each fixed-K mode: Leviathan et al. 2023's speedup (1 - α^(K+1)) / ((1 - α)(Kc + 1)) from the
    measured alpha and c, the same with the measured verify cost t(K+1)/t(1) in place of 1, and the
    measured decode speedup."""
    out = {}
    for mode, per in summary.items():
        if not (mode.startswith("k") and mode[1:].isdigit()) or per.get("all", {}).get("alpha") is None:
            continue
        k, a, c = int(mode[1:]), per["all"]["alpha"], curve["c"]
        ratio = curve["ratio"][k] if k < len(curve["ratio"]) else None
        out[mode] = {
            "alpha": a,
            "leviathan": expected_tokens(k, a) / (k * c + 1),
            "with_measured_verify_cost": expected_tokens(k, a) / (k * c + ratio) if ratio else None,
            "measured": per["all"]["speedup_decode_median"],
        }
    return out


def run_bench(export_dir: str | Path, modes: list[str], prompts: list[Prompt], max_new_tokens: int = 128,
              temperature: float = 0.0, seed: int = 0, provider: str = "cpu", threads: int | None = None,
              cost: bool = False, progress: bool = True, sessions: bool = True, repeats: int = 1,
              provider_options: dict | None = None) -> dict:
    """Run every mode on every prompt; returns the whole result (runs, summary, machine, settings).

    ``sessions``: an adaptive mode keeps one controller across the prompts of a class, as ``edgespec chat``
    keeps one across the turns of a conversation and an app across its requests (what it learned: acceptance,
    costs, answer lengths); each class's first prompt meets a new controller (``warm_controller`` False in
    its record). ``sessions=False`` gives every prompt a new controller.

    ``repeats``: every prompt runs all modes that many times (interleaved, each adaptive repeat from the same
    controller state); each (prompt, mode) keeps the repeat with the median decode rate (the lower middle one
    for an even count) (short answers of a
    few hundred ms vary by ±15% between runs here)."""
    parsed = [Mode.parse(m) for m in modes]
    spec = SpecDecoder.load(export_dir, provider=provider, threads=threads, shared_thread_pool=True,
                            provider_options=provider_options)
    rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for proposers in ((), ("draft",)):  # warm-up: first runs allocate
        spec.generate("Hello", max_new_tokens=4, k=2, proposers=proposers).run()
    if any(m.k is None for m in parsed):  # adaptive modes: measure the cost model once, before timing
        calibrate(spec)
    runs, skipped, controllers = [], [], {}
    bar = progress_bar(len(prompts) * len(parsed), "bench", progress, unit="run")
    for i, prompt in enumerate(prompts):
        if len(spec.encode(messages=list(prompt.messages))) >= spec.context_length:
            skipped.append(i)  # does not fit this export's context
            bar.update(len(parsed))
            continue
        order = parsed[i % len(parsed):] + parsed[:i % len(parsed)]
        start = {}  # each adaptive repeat starts from the controller state before this prompt
        for mode in order:
            key = (mode.name, prompt.cls)
            if mode.k is None and sessions and key not in controllers:
                controllers[key] = mode.controller(spec, prompt.cls)
            start[mode.name] = controllers.get(key)
        reps = {mode.name: [] for mode in order}
        for _ in range(repeats):  # interleaved: a slow stretch of the machine hits every mode alike
            for mode in order:
                policy = copy.deepcopy(start[mode.name]) if start[mode.name] is not None else None
                reps[mode.name].append((run_one(spec, mode, prompt, max_new_tokens, temperature, seed + i, policy), policy))
        for mode in order:
            rs = sorted(reps[mode.name], key=lambda rp: rp[0]["decode_tok_s"])
            rec, policy = rs[(len(rs) - 1) // 2]  # the median (the lower middle one for an even count)
            if start[mode.name] is not None:
                controllers[(mode.name, prompt.cls)] = policy  # the session goes on from the kept repeat
            rec["decode_tok_s_repeats"] = [rp[0]["decode_tok_s"] for rp in rs]
            rec["prompt"] = i
            runs.append(rec)
            bar.update()
    bar.close()
    result = {
        "export": str(export_dir), "modes": modes, "max_new_tokens": max_new_tokens, "temperature": temperature,
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": cpus(),
                    **cpu_model(),
                    "provider": spec.target.provider, "provider_requested": provider,
                    "provider_options": provider_options or {}, "threads": threads},
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "rss_after_load_mb": rss_loaded,
        "controller_sessions": sessions, "runs": runs, "skipped_prompts": skipped, "summary": summarize(runs, modes),
    }
    # after the timed runs: how far a K+1-row verify and a one-token step differ on this CPU (evaluate.kernel_noise)
    from .evaluate import kernel_noise

    fits = [p for i, p in enumerate(prompts) if i not in skipped][:1]
    result["kernel_noise"] = kernel_noise(spec, [spec.encode(messages=list(p.messages)) for p in fits],
                                          ks=(1, 2, 4), max_new_tokens=min(32, max_new_tokens))
    if cost:
        result["cost_curve"] = cost_curve(spec)
        result["predicted"] = predicted_speedups(result["cost_curve"], result["summary"])
    return result


def cpu_model() -> dict:
    """``cpu_model`` (the model name) and ``cpu_flags`` (those of AVX2 / AVX-512 / VNNI / AMX it has) from
    /proc/cpuinfo, which tell the int4 kernels onnxruntime runs (empty where there is no /proc/cpuinfo)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {"cpu_model": "", "cpu_flags": []}
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")
    return {"cpu_model": model, "cpu_flags": [f for f in wanted if f in flags]}


def format_bench(result: dict) -> str:
    """A Markdown table: one row per mode and prompt class."""
    rows = ["| mode | class | decode tok/s | speedup (median, min) | alpha | tokens/round | mean K | TTFT ms "
            "| ITL p50/p95 ms |", "|---|---|---|---|---|---|---|---|---|"]
    for mode, per in result["summary"].items():
        for cls, s in per.items():
            sp = ("—" if s["speedup_decode_median"] is None else
                  f"{s['speedup_decode_median']:.2f}× ({s['speedup_decode_min']:.2f}×)")
            alpha = "—" if s["alpha"] is None else f"{s['alpha']:.2f}"
            rows.append(f"| {mode} | {cls} | {s['decode_tok_s']:.1f} | {sp} | {alpha} | "
                        f"{s['mean_accepted_length']:.2f} | {s['mean_k']:.1f} | {s['ttft_ms']:.0f} | "
                        f"{s['itl_p50_ms']:.0f}/{s['itl_p95_ms']:.0f} |")
    lines = rows + [f"\npeak RSS {result['peak_rss_mb']:.0f} MB (after load {result['rss_after_load_mb']:.0f} MB)"]
    for mode, per in result["summary"].items():
        if "budget_ms" in per.get("all", {}):
            s = per["all"]
            lines.append(f"{mode}: budget {s['budget_ms']:g} ms, round p95 {s['round_p95_ms']:.0f} ms, "
                         f"{100 * s['share_rounds_over_budget']:.1f}% of rounds over budget")
    if "cost_curve" in result:
        c = result["cost_curve"]
        lines.append("target t(N)/t(1), N=1..%d: %s; t(1) = %.1f ms; draft step %.1f ms, c = %.2f" % (
            len(c["ratio"]), " ".join(f"{r:.2f}" for r in c["ratio"]), c["target_ms"][0], c["draft_ms"], c["c"]))
        for mode, p in result.get("predicted", {}).items():
            lines.append(f"{mode}: alpha {p['alpha']:.2f}; predicted speedup {p['leviathan']:.2f}× (Leviathan, "
                         f"verify = t(1)), {p['with_measured_verify_cost']:.2f}× (measured t(K+1)); "
                         f"measured {p['measured']:.2f}×")
    return "\n".join(lines)


def cpus() -> dict:
    info = {"count": __import__("os").cpu_count()}
    try:
        text = Path("/proc/cpuinfo").read_text()
        flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), [])
        info["model"] = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), "")
        info["avx512"] = any(f.startswith("avx512") for f in flags)
        info["vnni"] = "avx512_vnni" in flags or "avx_vnni" in flags
    except OSError:
        pass
    return info


def plot(result: dict, path: str | Path) -> None:
    """PNG: decode speedup vs plain by mode and prompt class; acceptance rate by draft position."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = result["summary"]
    modes = [m for m in result["modes"] if m != "plain"]
    classes = sorted({c for m in summary.values() for c in m if c != "all"}) + ["all"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(len(classes), 1)
    for j, cls in enumerate(classes):
        vals = [summary[m].get(cls, {}).get("speedup_decode_median") or 0 for m in modes]
        ax1.bar(np.arange(len(modes)) + j * width, vals, width, label=cls)
    ax1.axhline(1.0, color="k", lw=0.8)
    ax1.set_xticks(np.arange(len(modes)) + width * (len(classes) - 1) / 2, modes, rotation=30, ha="right")
    ax1.set_ylabel("decode speedup vs plain (median of paired ratios)")
    ax1.set_title("Speedup by mode and prompt class")
    ax1.legend(fontsize=8)
    for m in modes:
        acc = summary[m]["all"]["acceptance_by_position"]
        if acc:
            ax2.plot(range(1, len(acc) + 1), [a if a is not None else np.nan for a in acc], marker="o", label=m)
    ax2.set_xlabel("draft position")
    ax2.set_ylabel("accepted / proposed at this position")
    ax2.set_ylim(0, 1.02)
    ax2.set_title("Acceptance by draft position")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
