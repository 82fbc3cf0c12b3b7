"""Adaptive K and prompt lookup: the controller on an injected cost model, lookup drafting losslessness."""

import numpy as np
import pytest

from edgespec.adaptive import AdaptiveK, CostModel, expected_tokens
from edgespec.decoder import SpecDecoder
from edgespec.lookup import ngram_lookup
from edgespec.sampling import SamplingParams, accept_reject, probs, sample

LINEAR = [100.0 + 10.0 * (n - 1) for n in range(1, 9)]  # t_v(N) = 100 ms + 10 ms per extra row


def _feed(policy, source, k, accepted, n=50):
    for _ in range(n):
        policy.observe(source, k, accepted, None, policy.predicted_ms(source, k))


def test_expected_tokens_formula():
    assert expected_tokens(0, 0.7) == pytest.approx(1.0)
    assert expected_tokens(3, 0.5) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens(4, 1.0) == 5.0


def test_expensive_draft_gives_k0():
    pol = AdaptiveK(CostModel(list(LINEAR), draft_ms=90.0), alpha0=0.9)
    assert pol.choose() == ("draft", 0)


def test_cheap_draft_and_high_alpha_give_k_above_0():
    pol = AdaptiveK(CostModel(list(LINEAR), draft_ms=5.0), alpha0=0.9)
    src, k = pol.choose()
    assert src == "draft" and k >= 3


def test_measured_overhead_turns_speculation_off():
    """Rounds that measure 40% slower than the model predicts make a marginal K unprofitable."""
    pol = AdaptiveK(CostModel(list(LINEAR), draft_ms=20.0), alpha0=0.75)
    src, k = pol.choose()
    assert k > 0
    for _ in range(10):
        pol.observe(src, k, 1, None, 1.4 * pol._model_ms(src, k))
        pol.observe("draft", 0, 0, None, 100.0)
    assert pol.choose() == ("draft", 0)


def test_low_acceptance_switches_to_plain_and_probes_to_recover():
    pol = AdaptiveK(CostModel(list(LINEAR), draft_ms=10.0), alpha0=0.9, probe_every=8)
    assert pol.choose()[1] > 0
    _feed(pol, "draft", 4, 0)  # nothing accepted: speculation does not pay
    ks = [pol.choose()[1] for _ in range(16)]
    assert ks.count(0) >= 14 and max(ks) > 0  # plain steps, with a probe round every 8
    _feed(pol, "draft", 2, 2)  # the text became predictable
    assert pol.choose()[1] > 0


def test_latency_budget_is_respected():
    """Round(K) = 100 + 15 K ms. Before any round the budget plans with 1.15× the model (K = 2: 149.5 ms ≤ 160);
    rounds measured faster than the model let K grow, slower ones shrink it."""
    cost = CostModel(list(LINEAR), draft_ms=5.0)
    pol = AdaptiveK(cost, alpha0=0.95, latency_budget_ms=160.0)
    src, k = pol.choose()
    assert k == 2 and 1.15 * cost.round_ms(k) <= 160.0 < 1.15 * cost.round_ms(k + 1)
    for _ in range(20):  # measured at 0.95× the model: K = 4 (152 ms) fits
        pol.observe("draft", k, k, None, 0.95 * cost.round_ms(k))
    assert pol.choose() == ("draft", 4)
    for _ in range(20):  # then 20% slower: back to K = 2 (156 ms)
        pol.observe("draft", 4, 4, None, 1.2 * cost.round_ms(4))
    assert pol.choose() == ("draft", 2)
    assert AdaptiveK(CostModel(list(LINEAR), draft_ms=5.0), alpha0=0.95).choose()[1] > 4


def test_budget_splits_a_long_catch_up_into_plain_rounds():
    """A catch-up that does not fit the budget runs in pieces after plain steps, each round within it."""
    cost = CostModel(list(LINEAR), draft_ms=5.0, draft_prefill_ms=2.0)
    pol = AdaptiveK(cost, alpha0=0.95, latency_budget_ms=160.0)
    pol.end(1000)  # earlier answers were long: the catch-up pays
    src, m = pol.choose(lag=200)  # 398 ms of catch-up
    assert src == "catchup" and m == 1 + int((160.0 - 1.15 * 100.0 - 1.15 * 5.0) // (1.15 * 2.0))
    assert pol.choose(lag=10)[0] == "draft"  # 18 ms of catch-up fits beside K = 1 or 2


def test_budget_catch_up_pieces_shrink_the_lag_to_nothing():
    """Each ("catchup", m) round adds one token and feeds m, the last committed one included, so the lag
    reaches 0 even when one token of catch-up fits beside no K (here: a 73 ms budget, plain 50, K = 1 65.5)."""
    cost = CostModel([50.0 + 5 * n for n in range(8)], draft_ms=8.0, draft_prefill_ms=1.7)
    pol = AdaptiveK(cost, alpha0=0.95, latency_budget_ms=73.0)
    pol.end(1000)
    lag, rounds = 40, 0
    while lag > 1 and rounds < 50:
        src, m = pol.choose(lag=lag)
        if src != "catchup":
            break
        assert 1 <= m <= lag
        lag = lag - m + 1
        rounds += 1
    assert lag <= 1 and pol.choose(lag=lag)[0] == "draft" and pol.choose(lag=lag)[1] > 0


def test_lookup_is_tried_once_before_its_estimate_counts():
    """The draft looks better on the prior, but lookup costs only extra verified rows: it gets one try."""
    pol = AdaptiveK(CostModel(list(LINEAR), draft_ms=5.0), alpha0=0.95, lookup_alpha0=0.5)
    assert pol.choose(lookup=1)[0] == "draft"  # a one-token match is not worth a try
    assert pol.choose(lookup=4) == ("lookup", 4)
    pol.observe("lookup", 4, 0, None, pol._model_ms("lookup", 4))
    assert pol.choose(lookup=4)[0] == "draft"  # tried, rejected: the estimates decide from now on


def test_lookup_is_preferred_when_it_is_accepted_and_free():
    pol = AdaptiveK(CostModel(list(LINEAR), draft_ms=40.0), alpha0=0.6, lookup_alpha0=0.9)
    src, k = pol.choose(lookup=5)
    assert src == "lookup" and 1 <= k <= 5
    assert pol.choose(lookup=0)[0] == "draft"


def test_ngram_lookup():
    toks = [1, 2, 3, 4, 5, 9, 9, 2, 3]
    assert ngram_lookup(toks, 3) == [4, 5, 9]  # suffix [2, 3] occurred at 1..2
    assert ngram_lookup([1, 2, 3, 7, 8, 2, 3, 5, 6, 2, 3], 2) == [5, 6]  # the most recent occurrence wins
    assert ngram_lookup([1, 2, 3, 4], 3) == []
    assert ngram_lookup([5, 5, 5, 5], 2) == [5]


def test_one_hot_q_keeps_the_target_distribution():
    """Lookup proposes a fixed token x (q one-hot): emitted tokens still follow p."""
    rng = np.random.default_rng(0)
    p = probs(np.array([0.5, 1.5, -0.3, 0.9]), SamplingParams(0.8))
    draws = 50_000
    counts = np.zeros(4)
    q = np.zeros((1, 4))
    q[0, 1] = 1.0
    for _ in range(draws):
        n, tok = accept_reject(np.array([1]), q, np.stack([p, p]), rng)
        counts[1 if n == 1 else tok] += 1
    assert 0.5 * np.abs(counts / draws - p).sum() < 0.01
    assert sample(p, rng) in range(4)


@pytest.fixture(scope="module")
def dec(tiny_export):
    return SpecDecoder.load(tiny_export)


@pytest.mark.parametrize("mode,lookup", [("lookup", True), ("spec", True)])
@pytest.mark.parametrize("prompt", ["def add(a, b):", "The quick brown", "class Node:\n"])
def test_lookup_greedy_equals_target_greedy(dec, mode, lookup, prompt):
    ids = dec.encode(prompt)
    dec.reset()
    plain = dec.generate(input_ids=ids, max_new_tokens=80, mode="plain").run()
    dec.reset()
    g = dec.generate(input_ids=ids, max_new_tokens=80, k=4, mode=mode, lookup=lookup).run()
    assert g.token_ids == plain.token_ids
    assert g.stats.accepted <= g.stats.evaluated <= g.stats.proposed


def test_lookup_rounds_happen_on_repetitive_text(dec):
    ids = dec.encode("def add(a, b):\n    return a + b\ndef add(a, b):\n    return a + b\ndef add(a, b):")
    dec.reset()
    g = dec.generate(input_ids=ids, max_new_tokens=40, k=4, mode="lookup").run()
    assert g.stats.lookup_rounds > 0


def test_adaptive_policy_in_generation_keeps_greedy_and_reports_k(dec):
    ids = dec.encode("def add(a, b):")
    dec.reset()
    plain = dec.generate(input_ids=ids, max_new_tokens=60, mode="plain").run()
    dec.reset()
    pol = AdaptiveK(CostModel([1.0 + 0.1 * n for n in range(8)], draft_ms=0.05), probe_every=4)
    g = dec.generate(input_ids=ids, max_new_tokens=60, k=pol, lookup=True).run()
    assert g.token_ids == plain.token_ids
    assert len(g.stats.k_per_round) == g.stats.rounds and max(g.stats.k_per_round) > 0


def test_adaptive_tree_policy_picks_a_budget_and_learns():
    pol = AdaptiveK(CostModel(list(LINEAR) + [180.0, 190.0, 200.0, 210.0, 220.0], draft_ms=5.0), alpha0=0.8, tree=True)
    src, n = pol.choose()
    assert src in ("tree", "draft") and n > 0
    for _ in range(30):
        pol.observe("tree", 8, 5, 5.0, pol._model_ms("tree", 8))  # budget 8 accepts 5 tokens per round: best
        for b in (4, 6, 12):
            pol.observe("tree", b, 0, 5.0, pol._model_ms("tree", b))
    assert pol.choose() == ("tree", 8)


def test_draft_p_min_stops_drafting_early_and_stays_lossless(dec):
    ids = dec.encode("The quick brown")
    dec.reset()
    plain = dec.generate(input_ids=ids, max_new_tokens=40, mode="plain").run()
    dec.reset()
    g = dec.generate(input_ids=ids, max_new_tokens=40, k=6, draft_p_min=0.99).run()
    assert g.token_ids == plain.token_ids
    assert g.stats.proposed < 6 * g.stats.rounds  # some rounds stopped before K


def test_draft_catch_up_is_amortized_over_the_expected_answer_length():
    """A stretch the draft has not seen costs a catch-up; it pays only over enough expected remaining tokens."""
    pol = AdaptiveK(CostModel(list(LINEAR), draft_ms=5.0, draft_prefill_ms=2.0), alpha0=0.75)
    assert pol.choose(lag=1, horizon=200)[1] > 0  # nothing to catch up
    assert pol.choose(lag=400, horizon=10_000) == ("draft", 0)  # no history: expect as many tokens as so far
    pol.end(5000)
    pol.begin()
    assert pol.choose(lag=400, horizon=8) == ("draft", 0)  # only 8 tokens may follow
    assert pol.choose(lag=400, horizon=10_000)[1] > 0  # the last answer ran 5000 tokens


def test_without_history_the_draft_starts_once_the_answer_has_run_long_enough():
    """Rent or buy: with no earlier answers, the catch-up (40+ tokens × 20 ms) is paid once the tokens already
    generated would have paid for it (here after about 19), so short answers never pay it."""
    pol = AdaptiveK(CostModel(list(LINEAR), draft_ms=5.0, draft_prefill_ms=20.0), alpha0=0.9)
    starts = None
    for n in range(60):
        src, k = pol.choose(lag=40 + n, horizon=1000)
        if k > 0:
            starts = n
            break
        pol.observe("draft", 0, 0, None, 100.0)
    assert starts is not None and 15 < starts < 25
    assert pol.expected_remaining(1000) == starts
    short = AdaptiveK(CostModel(list(LINEAR), draft_ms=5.0, draft_prefill_ms=20.0), alpha0=0.9)
    for _ in range(3):
        short.begin()
        short.end(6)  # answers of 6 tokens: the catch-up never pays within them
    short.begin()
    for n in range(5):
        assert short.choose(lag=40 + n, horizon=1000) == ("draft", 0)
        short.observe("draft", 0, 0, None, 100.0)


def test_target_confidence_stands_in_for_acceptance_before_any_draft_round():
    pol = AdaptiveK(CostModel(list(LINEAR), draft_ms=5.0), alpha0=0.7)
    assert pol.alpha() == pytest.approx(0.7)
    for c in (0.9, 0.95, 1.0):
        pol.observe_confidence(c)
    assert pol.alpha() == pytest.approx((4 * 0.7 + 0.9 + 0.95 + 1.0) / 7)  # the prior weighs as 4 steps
    pol.observe("draft", 2, 0, None, 120.0)  # measured acceptance takes over
    assert pol.alpha() < 0.7


def test_k_per_round_records_what_was_proposed(dec):
    dec.reset()
    g = dec.generate("The quick brown", max_new_tokens=40, k=6, draft_p_min=0.99).run()
    assert sum(g.stats.k_per_round) == g.stats.proposed
    assert min(k for k in g.stats.k_per_round if k) < 6


def test_lookup_mode_never_runs_the_draft_even_if_the_policy_asks(dec):
    pol = AdaptiveK(CostModel([1.0 + 0.1 * n for n in range(8)], draft_ms=0.05), alpha0=0.95)
    dec.reset()
    ids = dec.encode("def add(a, b):")
    g = dec.generate(input_ids=ids, max_new_tokens=30, k=pol, mode="lookup").run()
    assert dec.dcache.length == 0 and g.stats.tree_rounds == 0
    dec.reset()
    plain = dec.generate(input_ids=ids, max_new_tokens=30, mode="plain").run()
    assert g.token_ids == plain.token_ids
