"""Losslessness checks shared by ``edgespec eval`` and the real-pair tests.

- Greedy identity: speculative greedy must equal plain greedy. Verifying K+1 rows uses other kernels than a
  one-row step, so a near-tie in the target's logits can flip; at the first divergence the plain run's own
  top-1/top-2 logit gap is reported and must be below :data:`NEAR_TIE_LOGIT_GAP`, anything else is a bug.
- Sampling: the first token of a speculative round, over many seeds, against the target's processed
  distribution p at that position (what plain sampling draws from), with the total variation that sampling
  noise alone gives at the same number of draws.
- Likelihood: mean target log-likelihood per token of text sampled with and without speculation.
"""

from __future__ import annotations

import numpy as np

from .decoder import feed
from .generation import GenerationOptions
from .kpolicy import RoundPlan
from .progress import progress_bar
from .sampling import SamplingParams, probs

NEAR_TIE_LOGIT_GAP = 0.1  # logits; int4 MatMulNBits N=1 vs N>1 paths differ by ~1e-2 on the real pair


def greedy_check(decoder, input_ids: list[int], max_new_tokens: int, k=4) -> dict:
    """Plain greedy vs speculative greedy on one prompt with the same decoder (fresh caches each).

    Returns ``identical``, ``first_divergence`` (index into the new tokens or None), ``plain_gap`` (the plain
    run's top-1 minus top-2 logit at that step), ``near_tie`` (gap < NEAR_TIE_LOGIT_GAP), the two token
    lists and the speculative run's stats.
    """
    decoder.reset()
    plain = decoder.generate(input_ids=input_ids, max_new_tokens=max_new_tokens, proposers=()).run()
    decoder.reset()
    spec = decoder.generate(input_ids=input_ids, max_new_tokens=max_new_tokens, k=k).run()
    decoder.reset()
    a, b = plain.token_ids, spec.token_ids
    div = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if div is None and len(a) != len(b):
        div = min(len(a), len(b))
    gap = None
    if div is not None and div <= len(a):
        top = np.sort(_plain_row(decoder, input_ids, a[:div]))[-2:]
        gap = float(top[1] - top[0])
    return {"identical": div is None, "first_divergence": div, "plain_gap": gap,
            "near_tie": gap is not None and gap < NEAR_TIE_LOGIT_GAP, "plain_tokens": a, "spec_tokens": b,
            "stats": spec.stats}


def _plain_row(decoder, input_ids: list[int], new_ids: list[int]) -> np.ndarray:
    """The target's logits float32 (V,) after ``input_ids`` + ``new_ids``, computed as plain decoding computes
    them (the prompt in prefill chunks, then one-token steps), so that a near-tie is measured on the very
    numbers the plain run compared."""
    cache = decoder.target.new_cache()
    row = feed(decoder.target, input_ids, cache)
    for t in new_ids:
        row = decoder.target.forward([t], cache)[-1]
    return row


def compare_greedy(decoder, input_ids: list[int], reference: list[int], other: list[int]) -> dict:
    """Greedy token ids of one prompt from two runs (e.g. x86 and aarch64), under the near-tie rule above.

    ``reference`` and ``other`` are int token ids after ``input_ids``. At the first divergence i the
    ``decoder``'s target is teacher-forced on ``input_ids + reference[:i]`` as plain decoding runs it, and
    its top-1 minus top-2 logit gap there is reported; ``ok`` is True when the lists are equal or that gap
    is below :data:`NEAR_TIE_LOGIT_GAP` (a kernel difference can flip a near-tie, anything else is a bug).
    A run that stops early (a stop token) diverges where the shorter list ends.
    """
    div = next((i for i, (x, y) in enumerate(zip(reference, other)) if x != y), None)
    if div is None and len(reference) != len(other):
        div = min(len(reference), len(other))
    gap = None
    if div is not None:
        top = np.sort(_plain_row(decoder, list(input_ids), list(reference[:div])))[-2:]
        gap = float(top[1] - top[0])
    return {"identical": div is None, "first_divergence": div, "gap": gap, "equal_prefix": len(reference) if
            div is None else div, "ok": div is None or gap < NEAR_TIE_LOGIT_GAP}


def first_token_check(decoder, input_ids: list[int], sp: SamplingParams, draws: int, k: int = 4,
                      seed: int = 0, tree: bool = False) -> dict:
    """Distribution of the first token a speculative round (a chain of K, or a tree of K nodes) emits after
    ``input_ids``, over ``draws`` seeds.

    Compares it with the target's processed distribution p at that position (exact, from one target run)
    and returns ``tv`` and ``tv_noise`` (mean TV of ``draws`` direct samples from p, 20 repeats).
    """
    decoder.reset()
    p = probs(decoder.target.forward(input_ids, decoder.target.new_cache(), keep=1)[-1], sp)
    counts = np.zeros_like(p)
    proposer = decoder.proposers_for(GenerationOptions(proposers=("tree",) if tree else ("draft",)))[0]
    plan = RoundPlan(proposer, k=k, n_nodes=k)
    decoder.prefill(input_ids, sp, np.random.default_rng(seed))
    for s in range(draws):
        decoder.rewind_to(len(input_ids))  # back to the state after the prompt: `last` is its final token
        result = decoder.run_round(plan, sp, np.random.default_rng(seed + s))
        counts[result.tokens[0]] += 1
    decoder.reset()
    rng = np.random.default_rng(seed)
    noise = [0.5 * np.abs(rng.multinomial(draws, p / p.sum()) / draws - p).sum() for _ in range(20)]
    return {"draws": draws, "tv": float(0.5 * np.abs(counts / draws - p).sum()),
            "tv_noise": float(np.mean(noise)), "support": int((p > 0).sum())}


def mean_log_likelihood(decoder, input_ids: list[int], new_ids: list[int]) -> float:
    """Mean target log p (temperature 1, natural log) of ``new_ids`` after ``input_ids``, teacher-forced."""
    if not new_ids:
        return float("nan")
    logits = decoder.target.forward(input_ids + new_ids[:-1], decoder.target.new_cache())[len(input_ids) - 1:]
    logits = logits.astype(np.float64)
    m = logits.max(-1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
    return float(np.mean(logp[np.arange(len(new_ids)), new_ids]))


def run_eval(decoder, prompts, max_new_tokens: int = 64, k: int = 4, draws: int = 300, ll_samples: int = 8,
             temperature: float = 0.8, top_p: float = 0.95, progress: bool = True) -> dict:
    """Greedy identity on every prompt, a first-token sampling check and a log-likelihood comparison.

    The sampling and likelihood checks use the first prompt of two classes, ``chat`` (prose: broad
    distributions) first when present. Returns a JSON-able dict.
    """
    sp = SamplingParams(temperature, top_p=top_p)
    out = {"greedy": [], "sampling": [], "likelihood": {}, "settings": {
        "max_new_tokens": max_new_tokens, "k": k, "draws": draws, "ll_samples": ll_samples,
        "temperature": temperature, "top_p": top_p, "near_tie_logit_gap": NEAR_TIE_LOGIT_GAP}}
    bar = progress_bar(len(prompts) + 2 + 2 * ll_samples, "eval", progress)
    for p in prompts:
        ids = decoder.encode(messages=list(p.messages))
        r = greedy_check(decoder, ids, max_new_tokens, k)
        out["greedy"].append({"class": p.cls, "identical": r["identical"], "first_divergence": r["first_divergence"],
                              "plain_gap": r["plain_gap"], "near_tie": r["near_tie"], "alpha": r["stats"].alpha,
                              "tokens": len(r["plain_tokens"])})
        bar.update()
    by_class = list({p.cls: p for p in reversed(prompts)}.values())[::-1]  # first prompt of each class
    firsts = sorted(by_class, key=lambda p: p.cls != "chat")[:2]  # prose (broad p) first, then code
    for p in firsts:
        ids = decoder.encode(messages=list(p.messages))
        out["sampling"].append({"class": p.cls, **first_token_check(decoder, ids, sp, draws, k)})
        bar.update()
    ll = {"spec": [], "plain": []}
    for s in range(ll_samples):
        p = firsts[s % len(firsts)]
        ids = decoder.encode(messages=list(p.messages))
        for mode, proposers in (("spec", ("draft",)), ("plain", ())):
            decoder.reset()
            g = decoder.generate(input_ids=ids, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                 seed=1000 + s, k=k, proposers=proposers).run()
            ll[mode].append(mean_log_likelihood(decoder, ids, g.token_ids))
            bar.update()
    bar.close()
    for mode, xs in ll.items():
        xs = np.array([x for x in xs if np.isfinite(x)])
        out["likelihood"][mode] = {"mean_log_likelihood": float(xs.mean()) if len(xs) else None,
                                   "stderr": float(xs.std(ddof=1) / np.sqrt(len(xs))) if len(xs) > 1 else None,
                                   "perplexity": float(np.exp(-xs.mean())) if len(xs) else None, "samples": len(xs)}
    decoder.reset()
    return out
