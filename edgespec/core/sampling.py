"""Logits processing and the speculative accept/reject rule.

Leviathan et al. 2023 ("Fast Inference from Transformers via Speculative Decoding", Algorithm 1) and Chen et
al. 2023 ("Accelerating LLM Decoding with Speculative Sampling", Algorithm 2): ``p`` is the target's
distribution, ``q`` the draft's. Draft token ``x`` at position i is accepted with probability
``min(1, p_i(x) / q_i(x))``; at the first rejection the replacement is drawn from ``norm(max(0, p_i - q_i))``;
if all K are accepted a bonus token is drawn from ``p_{K+1}``. The emitted tokens are then distributed exactly
as sampling from ``p`` alone. Greedy decoding (temperature 0) is the same rule on one-hot ``p`` and ``q``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TOP_P_CANDIDATES = 1024


@dataclass(frozen=True)
class SamplingParams:
    """How logits become a distribution. ``temperature`` 0 is greedy; ``top_k`` 0 and ``top_p`` 1 disable them.

    Raises:
        ValueError: temperature < 0, top_k < 0, or top_p outside (0, 1].
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not (self.temperature >= 0 and np.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number ≥ 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be ≥ 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probs(logits: np.ndarray, sp: SamplingParams, width: int | None = None) -> np.ndarray:
    """Processed distribution(s): float64 (..., W) from logits float32 (..., V).

    Applies temperature, then top-k, then top-p (nucleus: the smallest set of most likely tokens whose mass
    reaches top_p), then renormalizes. Greedy gives a one-hot at argmax (first index on ties); so does a
    temperature so small that logits/T overflows float64 (its limit as T → 0). ``width`` pads
    with zeros (ids the model cannot produce) or truncates to a common vocabulary width.
    """
    logits = np.asarray(logits)
    if width is not None and width != logits.shape[-1]:
        if width < logits.shape[-1]:
            logits = logits[..., :width]
        else:
            pad = np.full(logits.shape[:-1] + (width - logits.shape[-1],), -np.inf, dtype=logits.dtype)
            logits = np.concatenate([logits, pad], axis=-1)
    if logits.ndim > 1:
        return np.stack([probs(row, sp) for row in logits.reshape(-1, logits.shape[-1])]).reshape(
            logits.shape[:-1] + (logits.shape[-1],))
    v = logits.shape[-1]
    if sp.greedy:
        out = np.zeros(v, dtype=np.float64)
        out[int(np.argmax(logits))] = 1.0
        return out
    with np.errstate(over="ignore"):
        z = logits.astype(np.float64) / sp.temperature
    if not np.isfinite(z.max()):  # T → 0: the distribution is the argmax's one-hot
        out = np.zeros(v, dtype=np.float64)
        out[int(np.argmax(logits))] = 1.0
        return out
    if 0 < sp.top_k < v:
        cand = np.argpartition(-z, sp.top_k - 1)[: sp.top_k]
    else:
        cand = None
    if sp.top_p < 1:
        pool = cand if cand is not None else np.argpartition(-z, min(TOP_P_CANDIDATES, v) - 1)[:TOP_P_CANDIDATES]
        zp = z[pool]
        full = np.exp(z - zp.max())
        total = full.sum() if cand is None else full[cand].sum()
        order = pool[np.argsort(-zp, kind="stable")]
        cum = np.cumsum(full[order]) / total
        n = int(np.searchsorted(cum, sp.top_p)) + 1  # smallest prefix with mass ≥ top_p
        if n > len(order):  # mass beyond the candidate pool: sort everything
            order = np.argsort(-z, kind="stable") if cand is None else order
            cum = np.cumsum(full[order]) / total
            n = int(np.searchsorted(cum, sp.top_p)) + 1
        cand = order[: min(n, len(order))]
    out = np.zeros(v, dtype=np.float64)
    if cand is None:
        e = np.exp(z - z.max())
        return e / e.sum()
    e = np.exp(z[cand] - z[cand].max())
    out[cand] = e / e.sum()
    return out


def sample(dist: np.ndarray, rng: np.random.Generator) -> int:
    """One token id drawn from ``dist`` float (V,), non-negative, not necessarily normalized."""
    c = np.cumsum(dist)
    if not (np.isfinite(c[-1]) and c[-1] > 0):
        raise ValueError("cannot sample: the distribution has no finite positive mass")
    i = int(np.searchsorted(c, rng.random() * c[-1], side="right"))
    return min(i, int(np.flatnonzero(dist)[-1]))  # rounding at the top end never lands on a zero-mass id


def accept_candidates(p: np.ndarray, q: np.ndarray, candidates, rng: np.random.Generator) -> tuple[int | None, np.ndarray]:
    """The acceptance rule at one node: the one place edgespec decides whether a proposed token stays.

    Candidates ``x_1..x_m`` were drawn from ``q`` without replacement (m = 1 for a chain). Each is accepted with
    probability ``min(1, p(x)/q(x))`` (Leviathan et al. 2023, Algorithm 1); after a rejection
    ``p ← norm(max(0, p − q))`` and ``q ← norm(q with x removed)`` (SpecInfer, Miao et al. 2024, multi-step
    speculative sampling, in the without-replacement form of Sequoia, Chen et al. 2024).

    Args:
        p: float (V,) the target's processed distribution at the node.
        q: float (V,) the draft's distribution the candidates were drawn from (one-hot for a fixed proposal).
        candidates: token ids in draw order.
        rng: decides acceptance (one draw per evaluated candidate with q(x) > 0).

    Returns:
        ``(j, p)``: the index of the accepted candidate and ``p`` unchanged, or ``(None, residual)`` with the
        distribution float (V,) to sample the correction from when every candidate was rejected.
    """
    last = len(candidates) - 1
    for j, x in enumerate(candidates):
        if q[x] > 0 and rng.random() * q[x] < p[x]:  # u < p/q without dividing
            return j, p
        r = np.maximum(p - q, 0.0)
        s = r.sum()
        p = r / s if s > 0 else p  # p ≤ q everywhere means p == q: cannot reject; guard rounding
        if j == last:
            break
        q = q.copy()
        q[x] = 0.0
        if q.sum() <= 0:
            break
        q /= q.sum()
    return None, p


def accept_reject(draft_tokens: np.ndarray, q: np.ndarray, p: np.ndarray,
                  rng: np.random.Generator) -> tuple[int, int]:
    """Leviathan et al. 2023, Algorithm 1 (steps after the draft and the parallel target run): the chain
    specialisation of :func:`verify_tree`, one :func:`accept_candidates` per position.

    Args:
        draft_tokens: int64 (K,) proposed ids, ``draft_tokens[i] ~ q[i]``.
        q: float (K, V) the draft's processed distributions.
        p: float (K+1, V) the target's processed distributions at the same positions, plus one.
        rng: the generator that decides acceptance and samples the replacement.

    Returns:
        ``(n, token)``: the first n draft tokens are accepted; ``token`` is the correction drawn from
        norm(max(0, p_n - q_n)) when n < K, or the bonus token drawn from p_K when n == K.
    """
    k = len(draft_tokens)
    for i in range(k):
        j, residual = accept_candidates(p[i], q[i], [int(draft_tokens[i])], rng)
        if j is None:
            return i, sample(residual, rng)
    return k, sample(p[k], rng)


def verify_tree(tree, p_rows: np.ndarray, sp: SamplingParams, rng: np.random.Generator) -> tuple[list[int], int]:
    """Walk a token tree (:class:`~edgespec.core.token_tree.TokenTree`: ``tokens``, ``children``, ``q``) against the
    target; p_rows float (N+1, V): row 0 for the root (``last``), row i+1 for node i.

    Greedy: follow the child that is the target's argmax. Sampling: :func:`accept_candidates` at each node over
    its children in draw order; a node without children, or whose children are all rejected, samples from
    (the residual) p. The emitted tokens follow the target distribution exactly.

    Returns (accepted node indices from the root down, the next token: correction or bonus).
    """
    node = -1
    path: list[int] = []
    while True:
        p = p_rows[node + 1]
        kids = tree.children.get(node, [])
        if not kids:
            return path, sample(p, rng)
        if sp.greedy:
            best = int(np.argmax(p))
            nxt = next((c for c in kids if tree.tokens[c] == best), None)
            if nxt is None:
                return path, best
        else:
            j, p = accept_candidates(p, tree.q[node], [tree.tokens[c] for c in kids], rng)
            if j is None:
                return path, sample(p, rng)
            nxt = kids[j]
        path.append(nxt)
        node = nxt


def follow_choices(tree, choose) -> tuple[list[int], int]:
    """Walk a token tree (a chain included) by a deterministic choice per row: greedy's argmax, or the Gumbel
    coupling's race choice (:mod:`.coupling`), under which a proposal token is kept iff it is the target's
    choice (Daliri et al. 2024, drafter-invariant speculative decoding).

    ``choose(node)`` returns the target's token after ``node`` (-1: the root, ``last``) from its verify row
    (row node + 1); it is called only for the rows the walk reaches. Returns (accepted node indices from the
    root down, the next token: the choice that no child matched, or the choice after a leaf).
    """
    node, path = -1, []
    while True:
        x = choose(node)
        nxt = next((c for c in tree.children.get(node, []) if tree.tokens[c] == x), None)
        if nxt is None:
            return path, x
        path.append(nxt)
        node = nxt


def top1_probability(logits: np.ndarray) -> float:
    """The largest probability of softmax(logits) at temperature 1, in [0, 1]; logits float (V,)."""
    z = np.asarray(logits, dtype=np.float64)
    return float(1.0 / np.exp(z - z.max()).sum())


def greedy_accept(draft_tokens: np.ndarray, target_logits: np.ndarray) -> tuple[int, int]:
    """:func:`accept_reject` at temperature 0, without building one-hot distributions over the vocabulary.

    With one-hot p and q, draft token i is accepted iff it is the target's argmax at i, and the correction
    (or the bonus token) is the target's argmax at the first mismatch (or after the last draft token).

    Args:
        draft_tokens: int64 (K,) proposed ids.
        target_logits: float32 (K+1, V) the target's logits at the same positions, plus one.

    Returns:
        ``(n, token)`` as :func:`accept_reject`.
    """
    best = np.argmax(target_logits, axis=-1)  # first index on ties, as probs() does
    k = len(draft_tokens)
    miss = np.flatnonzero(best[:k] != np.asarray(draft_tokens, dtype=np.int64))
    n = int(miss[0]) if len(miss) else k
    return n, int(best[n])
