"""Replay K policies on recorded greedy answers: the controller's choices without the timing noise of a real run.

Under greedy decoding the answer is fixed (it is plain decoding's), and so is every proposal's fate: a draft
chain started at answer position j accepts the run of positions j, j + 1, … where the draft's argmax, given the
true prefix, equals the answer's token (the draft's own proposals are those tokens while they match), and a
prompt-lookup proposal is a function of the committed tokens. So one recording per prompt, made with the real
pair, fixes the acceptance of every round any policy could ask for:

    python bench/probes/controller_replay.py record [EXPORT] --per-class 3 --out bench/results/replay-record.json

records, for each built-in prompt, the prompt ids, plain decoding's answer, whether the draft's greedy token
matched at each answer position and the target's top-1 probability there (the confidence prior of
:class:`~edgespec.control.estimators.Acceptance`). Then

    python bench/probes/controller_replay.py replay bench/results/replay-record.json --cost v=62,70,88,98,116 --draft-ms 20.5 \
        --catchup-ms 3.7 --policies plain,k1,k2,k3,default --noise 0.05 --seeds 5

runs each policy over each answer: the real :class:`~edgespec.control.adaptive.AdaptiveK` (or a fixed K) chooses,
the round's acceptance comes from the recording and its time from the cost model given (ms: t_v(1..N) of the
target, one draft step, the draft's catch-up per unseen token), times a log-normal noise of ``--noise`` (the
controller sees the noisy times, as in a real run). It prints decode speed over plain per prompt and the median
per class, as ``edgespec bench`` does. Policy names: ``plain``, ``k<K>`` (draft chain of fixed K), ``default``
(adaptive + prompt lookup, the CLI's default), ``adaptive`` (the draft chain alone), ``lookup`` (prompt lookup
alone, adaptive K: ``edgespec bench``'s ``lookup`` mode), with options after ``@``:
``default@decay=0.8:probe_k=2`` (keywords of :class:`~edgespec.control.adaptive.AdaptiveK`, ``:`` between them).

``--true-cost v=...`` charges the rounds other t_v(1..N) than the controller was calibrated with (the calibration
is measured after a 128-token past; a recording of long prompts is charged what a verify costs after its past),
and ``--max-new-tokens`` cuts the answers to a request's shorter limit (the context sweep asks for 48):

    python bench/probes/controller_replay.py replay REC.json --cost v=80,86,117,135,164,178,211 \
        --true-cost v=107,131,182,226,285,316,371 --draft-ms 40 --catchup-ms 1.8 --max-new-tokens 48

What it leaves out: sampling (greedy only), trees, the latency budget's catch-up pieces, and kernel noise (a
real verify row can differ from a one-token step in the last bits). Its speeds are model figures, for comparing
policies on the same recorded answers; speed claims come from ``edgespec bench``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

from edgespec.control.adaptive import AdaptiveK
from edgespec.control.calibrate import CostModel
from edgespec.core.round import Offer, RoundPlan, RoundResult, Situation
from edgespec.core.sampling import top1_probability
from edgespec.draft.chain import DraftChain
from edgespec.draft.lookup import PromptLookup, ngram_match

MAX_NEW = 128


# -- recording (real models) ----------------------------------------------------------------------------------

def _argmax_rows(lm, ids: list[int], start: int, chunk: int = 64, probs: bool = False):
    """The argmax (and, with ``probs``, the top-1 probability at temperature 1) of ``lm``'s rows ``start``..end
    when it reads ``ids`` from an empty cache (row i predicts ids[i + 1])."""
    cache = lm.new_cache()
    tops, p1 = [], []
    for s in range(0, len(ids), chunk):
        part = ids[s:s + chunk]
        logits = lm.forward(part, cache)
        lo = max(start - s, 0)
        if lo >= len(part):
            continue
        rows = logits[lo:]
        tops += rows.argmax(axis=1).tolist()
        if probs:  # the decoder's own measure of the confidence prior
            p1 += [top1_probability(row) for row in rows]
    return tops, p1


def record_prompt(dec, messages, max_new: int = MAX_NEW) -> dict:
    """One recording: ``ids`` (the prompt), ``answer`` (plain greedy decoding's new tokens, a stop token
    included), ``match`` (the draft's greedy token at each answer position equals the answer's) and ``top1``
    (the target's top-1 probability at each answer position), all as JSON lists."""
    return record_ids(dec, [int(t) for t in dec.encode(messages=list(messages))], max_new)


def record_ids(dec, ids: list[int], max_new: int = MAX_NEW) -> dict:
    """:func:`record_prompt` for the prompt ids ``ids``."""
    from edgespec.core.stats import GenerationStats
    from edgespec.engine.generation import GenerationOptions

    dec.reset()
    stats = GenerationStats()
    answer: list[int] = []
    for toks, _ in dec.generate_ids(ids, GenerationOptions(max_new_tokens=max_new, proposers=()), None, stats):
        answer += [int(t) for t in toks]
    if stats.stop_reason == "stop_token":
        answer.append(int(dec.tokens[len(ids) + len(answer)]))  # the stop token the loop did not yield
    full = ids + answer
    draft_top, _ = _argmax_rows(dec.draft_model.lm, full[:-1], len(ids) - 1)
    target_top, top1 = _argmax_rows(dec.target, full[:-1], len(ids) - 1, probs=True)
    return {"ids": ids, "answer": answer, "match": [int(d == a) for d, a in zip(draft_top, answer)],
            "target_agrees": float(np.mean([t == a for t, a in zip(target_top, answer)])) if answer else 1.0,
            "top1": [round(float(p), 4) for p in top1]}


def record(a) -> None:
    from edgespec.bench.prompts import builtin, load_file
    from edgespec.engine.decoder import SpecDecoder
    from edgespec.io import paths

    dec = SpecDecoder.load(a.export or paths.default_export_dir(), shared_thread_pool=True)
    out = []
    prompts = load_file(a.prompts_file) if a.prompts_file else builtin(per_class=a.per_class)
    for i, pr in enumerate(prompts):
        rec = {"prompt": i, "class": pr.cls, **record_prompt(dec, pr.messages, a.max_new_tokens)}
        out.append(rec)
        print(f"{pr.cls} #{i}: {len(rec['ids'])} prompt tokens, {len(rec['answer'])} new, draft match "
              f"{np.mean(rec['match']):.2f}, teacher-forced target = answer {rec['target_agrees']:.2f}", file=sys.stderr)
    Path(a.out).write_text(json.dumps({"export": str(a.export or paths.default_export_dir()),
                                       "max_new_tokens": a.max_new_tokens, "prompts": out}) + "\n")


# -- replay (no models) ---------------------------------------------------------------------------------------

class Costs:
    """The replay's true costs (ms) and their noise: ``verify`` t_v(1..N), ``draft`` one draft step,
    ``catchup`` per unseen token."""

    def __init__(self, verify: list[float], draft: float, catchup: float, noise: float, seed: int):
        self.model = CostModel(list(verify), draft, catchup)
        self.noise, self.rng = noise, np.random.default_rng(seed)

    def jitter(self, ms: float) -> float:
        return ms * (float(np.exp(self.rng.normal(0.0, self.noise))) if self.noise > 0 else 1.0)


def _policy(name: str, cost: CostModel, cls: str):
    """(proposers, AdaptiveK or the fixed K) of a policy name (module docstring)."""
    from edgespec.engine.presets import controller_settings

    base, _, opts = name.partition("@")
    kw = {}
    for item in filter(None, opts.split(":")):
        key, _, value = item.partition("=")
        try:
            kw[key] = int(value) if value.isdigit() else float(value)
        except ValueError:
            raise SystemExit(f"policy {name!r}: {key}={value!r} is not a number") from None
    if base == "plain":
        return (), None
    if base.startswith("k") and base[1:].isdigit():
        return (DraftChain(),), int(base[1:])
    adaptive = {"default": (PromptLookup(), DraftChain()), "adaptive": (DraftChain(),), "lookup": (PromptLookup(),)}
    if base in adaptive:
        props = adaptive[base]
        try:
            return props, AdaptiveK(cost, k_max=6, **{**controller_settings(cls), **kw})
        except (TypeError, ValueError) as e:
            raise SystemExit(f"policy {name!r}: {e}") from None
    raise SystemExit(f"unknown policy {name!r}")


def _accepted(hits) -> int:
    """The accepted length of a greedy proposal: its leading run of tokens that equal the answer's."""
    acc = 0
    for hit in hits:
        if not hit:
            break
        acc += 1
    return acc


def replay(rec: dict, name: str, costs: Costs, calibration: CostModel, max_new: int = MAX_NEW) -> dict:
    """Decode time (ms, after the first token) and rounds of policy ``name`` on recording ``rec``."""
    ids, ans, match, top1 = rec["ids"], rec["answer"][:max_new], rec["match"], rec["top1"]
    props, policy = _policy(name, calibration, rec["class"])
    true = costs.model
    n, c, draft_len, ms_total, rounds = len(ans), 1, 0, 0.0, 0
    accepted_total = proposed_total = 0
    if isinstance(policy, AdaptiveK):
        policy.begin()
    while c < n:
        committed = ids + ans[:c]
        remaining = max_new - c
        cap = remaining - 1
        lag = len(committed) - draft_len
        lookup: list[int] = []  # prompt lookup's continuation this round
        if not props or cap < 1:
            plan = RoundPlan()
        elif isinstance(policy, AdaptiveK):
            offers = []
            for p in props:
                if p.uses_draft:
                    offers.append(Offer(p, cap))
                else:
                    lookup, m = ngram_match(committed, cap)
                    offers.append(Offer(p, len(lookup), m))
            plan = policy.choose(Situation(tuple(offers), lag, remaining))
            plan = RoundPlan(plan.proposer, min(plan.k, cap)) if plan.proposer is not None else plan
        else:
            plan = RoundPlan(props[0], min(policy, cap))
        p, k = plan.proposer, plan.k
        if p is None or k == 0:
            ms = costs.jitter(true.t_verify(1))
            result = RoundResult(RoundPlan(), [ans[c]], round_ms=ms, logits=None)
            conf = top1[c]
            c += 1
        else:
            if p.uses_draft:
                acc = _accepted(match[c:c + k])
                step = costs.jitter(true.draft_ms)
                catch = costs.jitter((lag - 1) * true.draft_prefill_ms) if lag > 1 else 0.0
                draft_ms = catch + k * step
                draft_len = len(committed) + min(acc, k - 1)
                extra = dict(draft_step_ms=step, catchup_ms=catch + step if lag > 1 else 0.0,
                             catchup_tokens=lag - 1)
            else:
                cont = lookup[:k]  # the offer's continuation: the same match, cut to K
                k = len(cont)
                acc = _accepted(t == a for t, a in zip(cont, ans[c:]))
                draft_ms, extra = 0.0, {}
            verify = costs.jitter(true.t_verify(k + 1))
            ms = draft_ms + verify
            result = RoundResult(RoundPlan(p, k), ans[c:c + acc + 1], proposer=p, depths=tuple(range(1, k + 1)),
                                 accepted=acc, bonus=acc == k, draft_ms=draft_ms, round_ms=ms, **extra)
            conf = None
            accepted_total += acc
            proposed_total += k
            c += acc + 1
        ms_total += ms
        rounds += 1
        if isinstance(policy, AdaptiveK):
            policy.observe(result)
            if conf is not None:
                policy.observe_confidence(conf)
    if isinstance(policy, AdaptiveK):
        policy.end(n)
    return {"ms": ms_total, "rounds": rounds, "tokens": n - 1, "accepted": accepted_total, "proposed": proposed_total}


def replay_all(recs: list[dict], policies: list[str], verify: list[float], draft_ms: float, catchup_ms: float,
               noise: float, seeds: int, calibration: CostModel | None = None, max_new: int = MAX_NEW) -> dict:
    """Per policy and prompt: the median over ``seeds`` noise draws of decode speed over plain (plain's time
    over the policy's, each under the same noise seed); answers cut to ``max_new`` tokens (the request's
    limit the controller sees)."""
    calibration = calibration or CostModel(list(verify), draft_ms, catchup_ms)
    out: dict[str, dict[int, float]] = {name: {} for name in policies}
    for rec in recs:
        if len(rec["answer"]) < 2:
            continue
        for name in policies:
            ratios = []
            for seed in range(seeds):
                plain = replay(rec, "plain", Costs(verify, draft_ms, catchup_ms, noise, seed), calibration, max_new)
                run = replay(rec, name, Costs(verify, draft_ms, catchup_ms, noise, 1000 + seed), calibration,
                             max_new)
                ratios.append(plain["ms"] / run["ms"])
            out[name][rec["prompt"]] = statistics.median(ratios)
    return out


def _table(recs: list[dict], result: dict) -> str:
    classes = sorted({r["class"] for r in recs})
    by = {r["prompt"]: r["class"] for r in recs}
    lines = ["| policy | " + " | ".join(classes) + " | all | lowest prompt |", "|---" * (len(classes) + 3) + "|"]
    for name, per in result.items():
        cells = [statistics.median([v for i, v in per.items() if by[i] == cls]) for cls in classes]
        lines.append(f"| {name} | " + " | ".join(f"{v:.2f}×" for v in cells)
                     + f" | {statistics.median(per.values()):.2f}× | {min(per.values()):.2f}× |")
    return "\n".join(lines)


def _ms_list(text: str, flag: str) -> list[float]:
    """``v=62,70,88`` (or without ``v=``) as floats; SystemExit with the flag's name on anything else."""
    try:
        return [float(x) for x in text.removeprefix("v=").split(",")]
    except ValueError:
        raise SystemExit(f"{flag} {text!r}: comma-separated ms expected") from None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="record greedy answers and draft matches with the real models")
    r.add_argument("export", nargs="?", default=None)
    r.add_argument("--per-class", type=int, default=3)
    r.add_argument("--prompts-file", help="prompts from a file (edgespec bench's format) instead of the built-in set")
    r.add_argument("--max-new-tokens", type=int, default=MAX_NEW)
    r.add_argument("--out", required=True)
    p = sub.add_parser("replay", help="replay policies on a recording (no models)")
    p.add_argument("recording")
    p.add_argument("--calibration", help="a cost model cached by calibrate (~/.cache/edgespec/calibration/*.json): "
                   "its t_v, draft step and catch-up per token, in place of the three options below")
    p.add_argument("--cost", help="v=t_v(1),t_v(2),... in ms")
    p.add_argument("--draft-ms", type=float)
    p.add_argument("--catchup-ms", type=float)
    p.add_argument("--true-cost", help="v=t_v(1),t_v(2),... in ms that the rounds are charged, where they differ from "
                   "the controller's calibration (e.g. measured after a long past: the controller is calibrated "
                   "after 128 tokens)")
    p.add_argument("--policies", default="plain,k1,k2,k3,default")
    p.add_argument("--max-new-tokens", type=int, default=MAX_NEW,
                   help="the request's limit: answers are cut to it (at most the recording's)")
    p.add_argument("--noise", type=float, default=0.05, help="log-normal sigma of every measured time")
    p.add_argument("--seeds", type=int, default=5)
    a = ap.parse_args()
    if a.cmd == "record":
        record(a)
        return
    if a.calibration:
        try:
            raw = json.loads(Path(a.calibration).read_text())
            verify, a.draft_ms, a.catchup_ms = ([float(v) for v in raw["verify_ms"]], float(raw["draft_ms"]),
                                                float(raw["draft_prefill_ms"]))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"--calibration {a.calibration}: not a cached cost model ({e})")
    elif a.cost is None or a.draft_ms is None or a.catchup_ms is None:
        raise SystemExit("give --calibration FILE, or --cost, --draft-ms and --catchup-ms")
    else:
        verify = _ms_list(a.cost, "--cost")
    true = _ms_list(a.true_cost, "--true-cost") if a.true_cost else verify
    if not verify or not all(math.isfinite(v) and v > 0 for v in verify + true + [a.draft_ms, a.catchup_ms]):
        raise SystemExit("costs: positive finite ms expected")
    print(f"costs (ms): t_v = {', '.join(f'{v:.1f}' for v in true)}"
          + (f" (calibrated: {', '.join(f'{v:.1f}' for v in verify)})" if a.true_cost else "")
          + f"; draft step {a.draft_ms:.1f}; catch-up {a.catchup_ms:.2f} a token; noise {a.noise}, {a.seeds} seeds")
    recs = json.loads(Path(a.recording).read_text())["prompts"]
    result = replay_all(recs, a.policies.split(","), true, a.draft_ms, a.catchup_ms, a.noise, a.seeds,
                        calibration=CostModel(list(verify), a.draft_ms, a.catchup_ms), max_new=a.max_new_tokens)
    print(_table(recs, result))
    print("per prompt:", json.dumps({name: {str(i): round(v, 3) for i, v in per.items()} for name, per in result.items()}))


if __name__ == "__main__":
    main()
