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

from ..core.coupling import GumbelCoupling
from ..engine.decoder import forward_tokens, prompt_logits
from ..engine.generation import GenerationOptions
from ..control.kpolicy import FixedK
from ..core.round import RoundPlan
from .progress import progress_bar
from ..core.sampling import SamplingParams, probs

NEAR_TIE_LOGIT_GAP = 0.1  # logits: reported only (how near a tie was); the verdict is the verify-path rule


class _Recorder(FixedK):
    """A fixed K that keeps every :class:`~edgespec.core.round.RoundResult` of one generation."""

    def __init__(self, k: int, n_nodes: int | None = None):
        super().__init__(k, n_nodes)
        self.rounds = []

    def observe(self, result) -> None:
        self.rounds.append(result)


def _top2(row: np.ndarray) -> tuple[tuple[int, float], tuple[int, float]]:
    """((top-1 id, logit), (top-2 id, logit)) of a logits row float32 (V,); ties go to the lower id, as argmax."""
    i = int(np.argmax(row))
    rest = row.copy()
    rest[i] = -np.inf
    j = int(np.argmax(rest))
    return (i, float(row[i])), (j, float(row[j]))


def race_scores(decoder, sp: SamplingParams, seed: int):
    """The coupled sampler's choice as an argmax: ``score(row, n)`` = log p_n(v) − log E_n(v) (−inf where p is
    0), float64 (W,), from a logits row float32 (V,) at absolute position n; argmax is
    :meth:`GumbelCoupling.choose`, and a gap between two tokens is in nats of the race."""
    c = GumbelCoupling(seed, decoder.width)

    def score(row, n):
        with np.errstate(divide="ignore"):
            return np.log(probs(row, sp)[:c.width]) - np.log(c.noise(n))
    return score


def greedy_check(decoder, input_ids: list[int], max_new_tokens: int, k=4, proposers=("draft",),
                 temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None,
                 draft_prompt: tuple[int, ...] | None = None) -> dict:
    """Plain greedy vs speculative greedy on one prompt, judged by the verify path's own numbers.

    ``draft_prompt``: what the speculative run's draft reads in place of the prompt
    (:attr:`~edgespec.engine.generation.GenerationOptions.draft_prompt`).

    With ``temperature`` > 0 and a ``seed`` the same check runs on seeded sampling (the Gumbel coupling,
    :mod:`.coupling`): a coupled choice is the argmax of the race scores :func:`race_scores`, so every row below
    is a row of those scores instead of logits.

    Both runs start from fresh caches. The speculative run's rounds are then *replayed* on a clean target cache
    (:func:`replay_verify`): the prompt as its prefill fed it, then each round's verify call rebuilt from the
    committed tokens alone (``last`` and the proposal, positions L + depth, the causal or ancestor mask), each
    followed by a crop to the accepted tokens. ``consistent`` is True when every token the speculative run
    committed is the argmax of its replayed verify row: a wrong position, a stale cache row or a bad rollback
    in the decoder makes the replay disagree. At the first divergence i from plain decoding the plain run's
    row (the numbers plain decoding compared) and the replayed verify row are reported: their top-1/top-2 ids
    and logits, the plain gap g = l_p(a) − l_p(b) (a plain's token, b the speculative one) and
    δ = g − (l_v(a) − l_v(b)), how far the two kernels moved that gap. A divergence is ``legitimate`` when the
    run is consistent, the verify row's argmax is b, the plain row's is a, and g ≤ δ (kernel noise flipped a
    near-tie: with the argmaxes as said, this last condition holds by construction and is reported as the
    figure). ``ok`` = identical or legitimate; ``near_tie`` (g < :data:`NEAR_TIE_LOGIT_GAP`) is a figure only.

    Returns a dict: ``identical``, ``ok``, ``consistent``, ``first_divergence`` (index into the new tokens or
    None), ``plain_gap``, ``delta``, ``plain_top2``/``verify_top2`` (pairs of (id, logit)), ``near_tie``,
    ``problem`` (a one-line reason when not ok), ``plain_tokens``, ``spec_tokens``, ``stats``.
    """
    opts = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)
    P = len(input_ids)
    score = (lambda row, n: row)
    if temperature > 0:
        if seed is None:
            raise ValueError("greedy_check of sampling needs a seed (the coupled rule)")
        score = race_scores(decoder, SamplingParams(temperature, top_p=top_p), seed)
    decoder.reset()
    plain_rec = _Recorder(0)
    plain = decoder.generate(input_ids=input_ids, proposers=(), policy=plain_rec, **opts).run()
    decoder.reset()
    rec = _Recorder(k, k)
    spec = decoder.generate(input_ids=input_ids, proposers=proposers, policy=rec, draft_prompt=draft_prompt,
                            **opts).run()
    decoder.reset()
    a, b = plain.token_ids, spec.token_ids
    out = {"identical": a == b, "ok": True, "consistent": True, "first_divergence": None, "plain_gap": None,
           "delta": None, "plain_top2": None, "verify_top2": None, "near_tie": False, "problem": None,
           "plain_tokens": a, "spec_tokens": b, "stats": spec.stats}
    plain_full = a[:1] + [t for r in plain_rec.rounds for t in r.tokens]
    spec_full = b[:1] + [t for r in rec.rounds for t in r.tokens]
    n = min(len(plain_full), len(spec_full))
    div = None if out["identical"] else next((i for i in range(n) if plain_full[i] != spec_full[i]), n)
    replay = replay_verify(decoder, input_ids, spec_full[0], rec.rounds, keep_row=div,
                           upto=len(b) if div is None else div + 1, score=score)
    decoder.reset()
    if replay["mismatch"] is not None:
        i, got, want = replay["mismatch"]
        out.update(ok=False, consistent=False, problem=(
            f"token {i}: the speculative run committed {got}, but its own verify call replayed on a clean cache "
            f"gives argmax {want} (a decoder bug: position, cache row or rollback)"))
    if div is None:
        return out
    out["first_divergence"] = div
    if div >= len(spec_full) or div >= len(plain_full):  # one run ended (stop token, context) where the other went on
        out.update(ok=False, problem=out["problem"] or f"token {div}: one run ended where the other went on")
        return out
    lp = score(plain_rec.rounds[div - 1].logits if div > 0 else plain_row(decoder, input_ids, []), P + div)
    lv = replay["row"]
    x, y = plain_full[div], spec_full[div]
    g = float(lp[x] - lp[y])
    delta = g - float(lv[x] - lv[y])
    out.update(plain_gap=g, delta=delta, plain_top2=_top2(lp), verify_top2=_top2(lv),
               near_tie=g < NEAR_TIE_LOGIT_GAP)
    if out["consistent"] and not (int(np.argmax(lv)) == y and int(np.argmax(lp)) == x and g <= delta):
        out.update(ok=False, problem=f"token {div}: plain {x} (top-2 {_top2(lp)}) vs speculative {y} "
                                     f"(verify top-2 {_top2(lv)}): not a flip of the two paths' argmax")
    return out


def replay_verify(decoder, input_ids: list[int], first_token: int, rounds, keep_row: int | None = None,
                  upto: int | None = None, score=None) -> dict:
    """Replay a generation's verify calls on a clean target cache and check its tokens against them.

    ``rounds`` are the generation's :class:`~edgespec.core.round.RoundResult` in order (each with its ``tree``
    and ``start``); the prompt ``input_ids`` is fed as a fresh prefill feeds it
    (:func:`~edgespec.engine.decoder.prompt_logits`), whose argmax must be ``first_token`` (token 0). Round r's
    verify call is rebuilt here, independently of the decoder: ids ``[last] + tree.tokens``, positions
    L + (0, depths), a causal mask for a chain or the ancestor mask for a tree; the walk follows the committed
    tokens; then the cache is cropped to the committed prefix (a chain's length, a tree's accepted rows
    gathered). Tokens at index ≥ ``upto`` are not checked. ``score(row, n)`` maps a row at absolute
    position n to what the token is the argmax of (default: the logits themselves).

    Returns ``mismatch`` (None, or (index, committed token, the replay's argmax) of the first disagreement)
    and ``row`` (the replayed verify row float32 (V,) that chose token ``keep_row``, if asked).
    """
    target = decoder.target
    cache = target.new_cache()
    score = score or (lambda row, n: row)
    P = len(input_ids)
    row = score(prompt_logits(target, list(input_ids), cache), P)
    tokens = list(input_ids)
    out = {"mismatch": None, "row": row if keep_row == 0 else None}
    if int(np.argmax(row)) != first_token:
        out["mismatch"] = (0, int(first_token), int(np.argmax(row)))
    tokens.append(int(first_token))
    index = 1
    for r in rounds:
        emitted = r.tokens
        L = len(tokens) - 1
        tree = r.tree
        if r.start != L:
            out["mismatch"] = out["mismatch"] or (index, -1, -1)
            break
        depth = np.array([0] + list(tree.depth), dtype=np.int64)
        chain = all(par == i - 1 for i, par in enumerate(tree.parents))
        mask = None
        if not chain:
            n = len(tree)
            mask = np.zeros((1, 1, n + 1, L + n + 1), dtype=bool)  # bool (1, 1, N+1, L+N+1)
            mask[..., :L] = True
            for i in range(-1, n):  # row i+1: the root and node i's ancestors, itself included
                a = i
                while True:
                    mask[0, 0, i + 1, L + a + 1] = True
                    if a < 0:
                        break
                    a = tree.parents[a]
        logits = target.forward([tokens[L]] + list(tree.tokens), cache, L + depth, mask)
        node, path = -1, []
        for j, t in enumerate(emitted):
            v = score(logits[node + 1], P + index)
            if keep_row == index:
                out["row"] = v
            if out["mismatch"] is None and (upto is None or index < upto) and int(np.argmax(v)) != t:
                out["mismatch"] = (index, int(t), int(np.argmax(v)))
            index += 1
            if j < len(emitted) - 1:
                node = next((c for c in tree.children.get(node, []) if tree.tokens[c] == t), None)
                if node is None:  # a committed token that is no child: the walk cannot go on
                    out["mismatch"] = out["mismatch"] or (index - 1, int(t), int(np.argmax(v)))
                    return out
                path.append(node)
        if chain:
            cache.crop(L + 1 + len(path))
        else:
            cache.crop(L + 1, keep=[L + 1 + i for i in path])
        tokens += emitted
    return out


def plain_row(decoder, input_ids: list[int], new_ids: list[int]) -> np.ndarray:
    """The target's logits float32 (V,) after ``input_ids`` + ``new_ids``, computed as plain decoding computes
    them (the prompt in prefill chunks, then one-token steps), so that a near-tie is measured on the very
    numbers the plain run compared."""
    cache = decoder.target.new_cache()
    row = prompt_logits(decoder.target, input_ids, cache)
    for t in new_ids:
        row = decoder.target.forward([t], cache)[-1]
    return row


def compare_rows(ref_token: int, ref_row: np.ndarray, other_token: int, other_row: np.ndarray) -> dict:
    """The divergence rule across machines (e.g. x86 and aarch64), where neither side can recompute the other's
    kernels: each side's plain-path logits row float32 (V,) at the first divergence, teacher-forced on the
    common prefix (dumped by each side).

    Legitimate when each row's argmax is its own side's token, the two rows rank the same two tokens first
    (a kernel difference reorders a near-tie, it does not invent a new candidate), and the reference gap
    g = l_ref(a) − l_ref(b) is within δ = g − (l_other(a) − l_other(b)). Returns ``ok``, ``gap``, ``delta``,
    ``ref_top2``, ``other_top2``, ``max_abs_diff`` (over the whole row) and ``problem``.
    """
    a, b = int(ref_token), int(other_token)
    rt, ot = _top2(ref_row), _top2(other_row)
    g, go = float(ref_row[a] - ref_row[b]), float(other_row[a] - other_row[b])
    n = min(len(ref_row), len(other_row))
    out = {"gap": g, "delta": g - go, "ref_top2": rt, "other_top2": ot,
           "max_abs_diff": float(np.max(np.abs(ref_row[:n].astype(np.float64) - other_row[:n]))), "problem": None}
    if rt[0][0] != a or ot[0][0] != b:
        out["problem"] = f"a row's argmax is not its own side's token (reference {rt}, other {ot}; tokens {a}, {b})"
    elif {rt[0][0], rt[1][0]} != {ot[0][0], ot[1][0]}:
        out["problem"] = f"the two rows rank other tokens on top (reference {rt}, other {ot})"
    elif not g <= out["delta"]:
        out["problem"] = f"the reference gap {g:.4f} is beyond the measured δ {out['delta']:.4f}"
    out["ok"] = out["problem"] is None
    return out


def compare_greedy(decoder, input_ids: list[int], reference: list[int], other: list[int],
                   other_row: np.ndarray | None = None) -> dict:
    """Greedy token ids of one prompt from two runs (e.g. x86 and aarch64), under :func:`compare_rows`.

    ``reference`` and ``other`` are int token ids after ``input_ids``; the ``decoder`` is the reference
    side's. At the first divergence i its target is teacher-forced on ``input_ids + reference[:i]`` as plain
    decoding runs it; ``other_row`` is the other side's row there (dumped by the other machine on the same
    prefix). Without ``other_row`` only the reference gap is known and ``ok`` is None at a divergence (the
    verdict needs the other side's numbers). A run that stops early diverges where the shorter list ends.
    Returns ``identical``, ``first_divergence``, ``gap``, ``equal_prefix``, ``ok`` and, with ``other_row``,
    the fields of :func:`compare_rows`.
    """
    div = next((i for i, (x, y) in enumerate(zip(reference, other)) if x != y), None)
    if div is None and len(reference) != len(other):
        div = min(len(reference), len(other))
    out = {"identical": div is None, "first_divergence": div, "gap": None,
           "equal_prefix": len(reference) if div is None else div, "ok": True if div is None else None}
    if div is None:
        return out
    row = plain_row(decoder, list(input_ids), list(reference[:div]))
    if div >= len(reference) or div >= len(other):
        out.update(ok=False, problem="one run ended where the other went on")
        return out
    top = _top2(row)
    out["gap"] = float(row[reference[div]] - row[other[div]]) if top[0][0] == reference[div] else None
    if other_row is not None:
        out.update(compare_rows(reference[div], row, other[div], np.asarray(other_row)))
    return out


def kernel_noise(decoder, prompts_ids: list[list[int]], ks=(1, 2, 4), max_new_tokens: int = 48) -> dict:
    """How far the target's one-token step and its K+1-row verify differ on this machine, at the same positions.

    For each prompt: plain greedy for ``max_new_tokens`` one-token steps (rows l_1), then, on the same cache
    cropped back to each start j (every K+1 tokens), one verify run of the next K+1 plain tokens (rows
    l_{K+1}) — the same history, other kernels. Per K: over the compared positions, the largest
    |l_1 − l_{K+1}| over the vocabulary (median, p90, p99, max, in logits), the mean |Δ| over all entries, and
    greedy flips (argmax differs) per 1,000 positions. Returns ``{"by_k": {str(K): {...}}, "compared_tokens"}``.
    """
    target = decoder.target
    per_k = {int(k): {"max_abs": [], "mean_abs": [], "flips": 0} for k in ks}
    for ids in prompts_ids:
        cache = target.new_cache()
        row = prompt_logits(target, list(ids), cache)
        P, gen, rows = len(ids), [int(np.argmax(row))], []
        n = min(max_new_tokens, decoder.context_length - P - 1)
        for j in range(n):  # rows[j]: the one-token step that feeds gen[j] (position P + j)
            rows.append(target.forward([gen[j]], cache)[-1])
            gen.append(int(np.argmax(rows[-1])))
        for j in range(n - 1, -1, -1):  # descending: a crop to P + j keeps only rows no verify has written
            for k in per_k:
                if j % (k + 1) or j + k >= n:
                    continue
                cache.crop(P + j)
                v = target.forward(gen[j:j + k + 1], cache)
                for i in range(k + 1):
                    d = np.abs(v[i].astype(np.float64) - rows[j + i])
                    per_k[k]["max_abs"].append(float(d.max()))
                    per_k[k]["mean_abs"].append(float(d.mean()))
                    per_k[k]["flips"] += int(np.argmax(v[i]) != np.argmax(rows[j + i]))
    by_k = {}
    for k, s in per_k.items():
        m = np.array(s["max_abs"])
        by_k[str(k)] = {"positions": len(m), **({
            "median_max_abs": float(np.median(m)), "p90_max_abs": float(np.quantile(m, 0.9)),
            "p99_max_abs": float(np.quantile(m, 0.99)), "max_abs": float(m.max()),
            "mean_abs": float(np.mean(s["mean_abs"])), "flips_per_1000": 1000.0 * s["flips"] / len(m)}
            if len(m) else {})}
    return {"by_k": by_k, "compared_tokens": int(sum(v["positions"] for v in by_k.values()))}


def first_token_check(decoder, input_ids: list[int], sp: SamplingParams, draws: int, k: int = 4,
                      seed: int = 0, tree: bool = False, coupled: bool = False) -> dict:
    """Distribution of the first token a speculative round (a chain of K, or a tree of K nodes) emits after
    ``input_ids``, over ``draws`` seeds; the standard accept/reject rule, or with ``coupled`` the Gumbel
    coupling (:mod:`.coupling`, one seed per draw).

    Compares it with the target's processed distribution p at that position (exact: the prompt but its last
    token prefilled as the decoder prefills it, in its chunks and on its graphs, then the last token as a
    one-row step, as a round's verify row reads it) and returns ``tv`` and ``tv_noise`` (mean TV of ``draws``
    direct samples from p, 20 repeats).
    """
    decoder.reset()
    cache = decoder.target.new_cache()
    forward_tokens(decoder.target, input_ids[:-1], cache)
    p = probs(decoder.target.forward(input_ids[-1:], cache)[-1], sp)
    counts = np.zeros_like(p)
    proposer = decoder.proposers_for(GenerationOptions(proposers=("tree",) if tree else ("draft",)))[0]
    plan = RoundPlan(proposer, k=k, n_nodes=k)
    decoder.prefill(input_ids, sp, np.random.default_rng(seed))
    for s in range(draws):
        decoder.rewind_to(len(input_ids))  # back to the state after the prompt: `last` is its final token
        coupling = GumbelCoupling(seed + s, decoder.width) if coupled else None
        result = decoder.run_round(plan, sp, np.random.default_rng(seed + s), coupling)
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
    """Greedy identity on every prompt (the verify-path rule of :func:`greedy_check`), the same rule on seeded
    sampling (the Gumbel coupling: speculation must give plain decoding's seeded ids), first-token sampling
    checks of both sampling rules, this machine's kernel noise (:func:`kernel_noise`), and a log-likelihood
    and acceptance comparison of sampled text: plain, and speculative under each rule.

    The sampling, seeded, noise and likelihood checks use the first prompt of two classes, ``chat`` (prose:
    broad distributions) first when present. Returns a JSON-able dict.
    """
    sp = SamplingParams(temperature, top_p=top_p)
    out = {"greedy": [], "seeded": [], "sampling": [], "kernel_noise": None, "likelihood": {}, "settings": {
        "max_new_tokens": max_new_tokens, "k": k, "draws": draws, "ll_samples": ll_samples,
        "temperature": temperature, "top_p": top_p, "near_tie_logit_gap": NEAR_TIE_LOGIT_GAP}}
    by_class = list({p.cls: p for p in reversed(prompts)}.values())[::-1]  # first prompt of each class
    firsts = sorted(by_class, key=lambda p: p.cls != "chat")[:2]  # prose (broad p) first, then code
    bar = progress_bar(len(prompts) + 5 * len(firsts) + 3 * ll_samples, "eval", progress)
    for p in prompts:
        ids = decoder.encode(messages=list(p.messages))
        out["greedy"].append({"class": p.cls, **_summary(greedy_check(decoder, ids, max_new_tokens, k))})
        bar.update()
    for i, p in enumerate(firsts):
        ids = decoder.encode(messages=list(p.messages))
        r = greedy_check(decoder, ids, max_new_tokens, k, temperature=temperature, top_p=top_p, seed=100 + i)
        out["seeded"].append({"class": p.cls, "seed": 100 + i, **_summary(r)})
        bar.update()
        for rule in ("standard", "gumbel"):
            out["sampling"].append({"class": p.cls, "coupling": rule, **first_token_check(
                decoder, ids, sp, draws, k, coupled=rule == "gumbel")})
            bar.update()
    out["kernel_noise"] = kernel_noise(decoder, [decoder.encode(messages=list(p.messages)) for p in firsts],
                                       ks=sorted({1, 2, k}), max_new_tokens=max_new_tokens)
    bar.update(2 * len(firsts))
    ll = {"plain": [], "spec_standard": [], "spec_gumbel": []}
    alpha = {"spec_standard": [], "spec_gumbel": []}
    for s in range(ll_samples):
        p = firsts[s % len(firsts)]
        ids = decoder.encode(messages=list(p.messages))
        for mode, proposers, rule in (("spec_standard", ("draft",), "standard"), ("spec_gumbel", ("draft",), "gumbel"),
                                      ("plain", (), "auto")):
            decoder.reset()
            g = decoder.generate(input_ids=ids, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                 seed=1000 + s, k=k, proposers=proposers, coupling=rule).run()
            ll[mode].append(mean_log_likelihood(decoder, ids, g.token_ids))
            if mode in alpha:
                alpha[mode].append((g.stats.accepted, g.stats.evaluated))
            bar.update()
    bar.close()
    for mode, xs in ll.items():
        xs = np.array([x for x in xs if np.isfinite(x)])
        out["likelihood"][mode] = {"mean_log_likelihood": float(xs.mean()) if len(xs) else None,
                                   "stderr": float(xs.std(ddof=1) / np.sqrt(len(xs))) if len(xs) > 1 else None,
                                   "perplexity": float(np.exp(-xs.mean())) if len(xs) else None, "samples": len(xs)}
        if mode in alpha:
            acc, ev = (sum(x) for x in zip(*alpha[mode])) if alpha[mode] else (0, 0)
            out["likelihood"][mode]["alpha"] = acc / ev if ev else None
    decoder.reset()
    return out


def _summary(r: dict) -> dict:
    keep = ("identical", "ok", "consistent", "first_divergence", "plain_gap", "delta", "plain_top2", "verify_top2",
            "near_tie", "problem")
    return {**{x: r[x] for x in keep}, "alpha": r["stats"].alpha, "tokens": len(r["plain_tokens"])}
