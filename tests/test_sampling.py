"""Tier (a) and (d): the accept/reject math on hand-made distributions, and the sampling distribution."""

import numpy as np
import pytest

from edgespec.core.sampling import SamplingParams, accept_reject, probs, sample


def test_greedy_rejects_draft_argmax_that_is_not_target_argmax():
    # draft proposes a (q(a)=0.2 is its argmax); target has p(a)=0.3, p(b)=0.5 → the emitted token is b
    a, b = 0, 1
    q_raw = np.log(np.array([0.2, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]))
    p_raw = np.log(np.array([0.3, 0.5, 0.2]))
    p_raw = np.concatenate([p_raw, np.full(6, -np.inf)])
    sp = SamplingParams(temperature=0)
    q = probs(q_raw, sp)[None]
    p = probs(np.stack([p_raw, p_raw]), sp)
    assert q[0].argmax() == a
    n, tok = accept_reject(np.array([a]), q, p, np.random.default_rng(0))
    assert (n, tok) == (0, b)


def test_greedy_accepts_matching_argmax_and_gives_bonus():
    sp = SamplingParams(0)
    logits = np.array([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]])
    p = probs(logits, sp)
    n, tok = accept_reject(np.array([1]), p[:1], p, np.random.default_rng(0))
    assert (n, tok) == (1, 0)


def test_probs_top_k_top_p_temperature():
    logits = np.log(np.array([0.5, 0.25, 0.15, 0.1]))
    assert np.allclose(probs(logits, SamplingParams(1.0)), [0.5, 0.25, 0.15, 0.1])
    assert np.allclose(probs(logits, SamplingParams(1.0, top_k=2)), [2 / 3, 1 / 3, 0, 0])
    # nucleus: smallest prefix with mass ≥ 0.7 is {0, 1}
    assert np.allclose(probs(logits, SamplingParams(1.0, top_p=0.7)), [2 / 3, 1 / 3, 0, 0])
    assert np.allclose(probs(logits, SamplingParams(1.0, top_p=0.75)), [2 / 3, 1 / 3, 0, 0])
    assert np.allclose(probs(logits, SamplingParams(1.0, top_p=0.76)), np.array([0.5, 0.25, 0.15, 0]) / 0.9)
    sharp = probs(logits, SamplingParams(0.5))
    assert np.allclose(sharp, np.array([0.5, 0.25, 0.15, 0.1]) ** 2 / np.sum(np.array([0.5, 0.25, 0.15, 0.1]) ** 2))


def test_probs_top_p_large_vocab_uses_candidates_and_matches_full_sort():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=5000)
    sp = SamplingParams(0.9, top_p=0.9)
    got = probs(logits, sp)
    z = logits / 0.9
    e = np.exp(z - z.max())
    e /= e.sum()
    order = np.argsort(-e)
    n = int(np.searchsorted(np.cumsum(e[order]), 0.9)) + 1
    want = np.zeros_like(e)
    want[order[:n]] = e[order[:n]] / e[order[:n]].sum()
    assert np.allclose(got, want)


def test_probs_width_pads_with_zero_probability():
    out = probs(np.array([1.0, 2.0]), SamplingParams(1.0), width=4)
    assert out.shape == (4,) and out[2] == 0 and out[3] == 0 and np.isclose(out.sum(), 1)


@pytest.mark.parametrize("bad", [dict(temperature=-2), dict(top_k=-1), dict(top_p=0), dict(top_p=1.5),
                                 dict(temperature=float("nan"))])
def test_sampling_params_reject_bad_values(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def _tv(a, b):
    return 0.5 * np.abs(a - b).sum()


@pytest.mark.parametrize("pruned", [False, True])
def test_speculative_sampling_matches_target_distribution(pruned):
    """First and second emitted tokens over 50,000 seeded draws vs the processed target distribution.

    ``pruned``: the draft can only propose ids 0..5 of 8 (a pruned head, q = 0 elsewhere, FR-Spec)."""
    rng = np.random.default_rng(1234)
    v, k, draws = 8, 3, 50_000
    sp = SamplingParams(temperature=0.7, top_p=0.9)
    target_logits = rng.normal(size=(v, v)) * 1.5  # next-token logits depend on the previous token
    draft_logits = target_logits + rng.normal(size=(v, v))  # a draft that is close but wrong
    if pruned:
        draft_logits[:, 6:] = -np.inf
    p_of = probs(target_logits, sp)
    q_of = probs(draft_logits, sp)
    start = 3
    first = np.zeros(v)
    second = np.zeros((v, v))
    for _ in range(draws):
        drafted, prev = [], start
        for _ in range(k):
            drafted.append(sample(q_of[prev], rng))
            prev = drafted[-1]
        ctx = [start] + drafted
        n, tok = accept_reject(np.array(drafted), q_of[ctx[:-1]], p_of[ctx], rng)
        out = drafted[:n] + [tok]
        if len(out) < 2:  # the second token comes from the next round: sample it from p directly
            out.append(sample(p_of[out[0]], rng))
        first[out[0]] += 1
        second[out[0], out[1]] += 1
    want_first = p_of[start]
    assert _tv(first / draws, want_first) < 0.01
    joint = want_first[:, None] * p_of  # P(x1, x2) under the target alone
    assert _tv(second.sum(0) / draws, joint.sum(0)) < 0.01
    # the joint has 64 cells: its sampling noise alone is ~0.014 at 50,000 draws
    assert _tv(second.ravel() / draws, joint.ravel()) < 0.025


def test_greedy_accept_is_accept_reject_on_one_hot_distributions():
    """The temperature-0 shortcut gives exactly what the general rule gives on one-hot p and q."""
    from edgespec.core.sampling import greedy_accept

    rng = np.random.default_rng(3)
    greedy = SamplingParams(0.0)
    for _ in range(200):
        k, v = int(rng.integers(1, 6)), 7
        logits = rng.normal(size=(k + 1, v)).astype(np.float32)
        logits[:, 2] = logits[:, 3]  # ties resolve to the first index in both
        best = logits.argmax(-1)
        drafted = np.where(rng.random(k) < 0.7, best[:k], rng.integers(0, v, size=k))
        q = np.zeros((k, v))
        q[np.arange(k), drafted] = 1.0
        expect = accept_reject(drafted, q, probs(logits, greedy), rng)
        assert greedy_accept(drafted, logits) == expect


def test_a_chain_shaped_tree_is_accept_reject_on_the_same_seed():
    """One rule: verifying a chain as a tree (sampling.verify_tree) gives exactly what accept_reject gives,
    draw for draw, on broad and on one-hot (fixed proposal) q, and greedy matches greedy_accept."""
    from edgespec.core.sampling import greedy_accept, verify_tree
    from edgespec.core.token_tree import TokenTree

    gen = np.random.default_rng(11)
    sp = SamplingParams(0.9)
    n_rejected = 0
    for trial in range(300):
        k, v = int(gen.integers(1, 6)), 9
        p = probs(gen.normal(size=(k + 1, v)), sp)
        q = probs(gen.normal(size=(k, v)), sp) if trial % 3 else None
        drafted = [sample(q[i], gen) if q is not None else int(gen.integers(0, v)) for i in range(k)]
        if q is None:  # a fixed proposal: one-hot q
            q = np.zeros((k, v))
            q[np.arange(k), drafted] = 1.0
        chain = TokenTree.chain(drafted, q)
        assert chain.is_chain and chain.parents == list(range(-1, k - 1))
        seed = int(gen.integers(1 << 30))
        n, tok = accept_reject(np.array(drafted), q, p, np.random.default_rng(seed))
        path, tok2 = verify_tree(chain, p, sp, np.random.default_rng(seed))
        assert (path, tok2) == (list(range(n)), tok)
        n_rejected += n < k
        logits = gen.normal(size=(k + 1, v)).astype(np.float32)
        n_g, tok_g = greedy_accept(np.array(drafted), logits)
        path_g, tok_g2 = verify_tree(chain, probs(logits, SamplingParams(0)), SamplingParams(0),
                                     np.random.default_rng(seed))
        assert (path_g, tok_g2) == (list(range(n_g)), tok_g)
    assert 0 < n_rejected < 300  # both outcomes were exercised
