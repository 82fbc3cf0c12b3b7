"""Adaptive K and prompt lookup: the controller on an injected cost model, lookup drafting losslessness."""

import math

import numpy as np
import pytest

from edgespec.control.adaptive import AdaptiveK, CostModel, expected_tokens
from edgespec.engine.decoder import SpecDecoder
from edgespec.core.round import Offer, RoundPlan, RoundResult, Situation
from edgespec.draft.lookup import ngram_lookup
from edgespec.draft import PROPOSERS
from edgespec.core.sampling import SamplingParams, accept_reject, probs, sample

LINEAR = [100.0 + 10.0 * (n - 1) for n in range(1, 9)]  # t_v(N) = 100 ms + 10 ms per extra row
P = {name: cls() for name, cls in PROPOSERS.items()}  # "draft", "tree", "lookup"


def _choose(pol, lookup=0, lag=0, horizon=None, draft=True, tree=False):
    """The controller's plan as (source, size): ("draft", 0) for a plain step, ("catchup", m)."""
    offers = ((Offer(P["draft"], 99),) if draft else ()) + ((Offer(P["tree"], 99),) if tree else ())
    plan = pol.choose(Situation(offers + (Offer(P["lookup"], lookup),), lag, horizon))
    if plan.catchup_tokens:
        return "catchup", plan.catchup_tokens
    return (plan.proposer.name, plan.size) if plan.size else ("draft", 0)


def _observe(pol, source, k, accepted, draft_step_ms, round_ms):
    p = P[source] if k else None
    plan = RoundPlan(p, k=k, n_nodes=k) if p else RoundPlan()
    depths = tuple(range(1, k + 1))
    pol.observe(RoundResult(plan, [0] * (accepted + 1), p, depths, accepted, draft_step_ms=draft_step_ms,
                            round_ms=round_ms))


def _feed(policy, source, k, accepted, n=50):
    for _ in range(n):
        _observe(policy, source, k, accepted, None, policy.predicted_ms(P[source], k))


def test_expected_tokens_formula():
    assert expected_tokens(0, 0.7) == pytest.approx(1.0)
    assert expected_tokens(3, 0.5) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens(4, 1.0) == 5.0


def test_expensive_draft_gives_k0():
    pol = AdaptiveK(CostModel(list(LINEAR), draft_ms=90.0), alpha0=0.9)
    assert _choose(pol) == ("draft", 0)


def test_cheap_draft_and_high_alpha_give_k_above_0():
    pol = AdaptiveK(CostModel(list(LINEAR), draft_ms=5.0), alpha0=0.9)
    src, k = _choose(pol)
    assert src == "draft" and k >= 3


def test_measured_overhead_turns_speculation_off():
    """Rounds that measure 40% slower than the model predicts make a marginal K unprofitable."""
    pol = AdaptiveK(CostModel(list(LINEAR), draft_ms=20.0), alpha0=0.75)
    src, k = _choose(pol)
    assert k > 0
    for _ in range(10):
        _observe(pol, src, k, 1, None, 1.4 * pol._model_ms(P[src], k))
        _observe(pol, "draft", 0, 0, None, 100.0)
    assert _choose(pol) == ("draft", 0)


def test_low_acceptance_switches_to_plain_and_probes_to_recover():
    pol = AdaptiveK(CostModel(list(LINEAR), draft_ms=10.0), alpha0=0.9, probe_every=8)
    assert _choose(pol)[1] > 0
    _feed(pol, "draft", 4, 0)  # nothing accepted: speculation does not pay
    ks = [_choose(pol)[1] for _ in range(16)]
    assert ks.count(0) >= 14 and max(ks) > 0  # plain steps, with a probe round every 8
    _feed(pol, "draft", 2, 2)  # the text became predictable
    assert _choose(pol)[1] > 0


def test_latency_budget_is_respected():
    """Round(K) = 100 + 15 K ms. Before any round the budget plans with 1.15× the model (K = 2: 149.5 ms ≤ 160);
    rounds measured faster than the model let K grow, slower ones shrink it."""
    cost = CostModel(list(LINEAR), draft_ms=5.0)
    pol = AdaptiveK(cost, alpha0=0.95, latency_budget_ms=160.0)
    src, k = _choose(pol)
    assert k == 2 and 1.15 * cost.round_ms(k) <= 160.0 < 1.15 * cost.round_ms(k + 1)
    for _ in range(20):  # measured at 0.95× the model: K = 4 (152 ms) fits
        _observe(pol, "draft", k, k, None, 0.95 * cost.round_ms(k))
    assert _choose(pol) == ("draft", 4)
    for _ in range(20):  # then 20% slower: back to K = 2 (156 ms)
        _observe(pol, "draft", 4, 4, None, 1.2 * cost.round_ms(4))
    assert _choose(pol) == ("draft", 2)
    assert _choose(AdaptiveK(CostModel(list(LINEAR), draft_ms=5.0), alpha0=0.95))[1] > 4


def test_budget_splits_a_long_catch_up_into_plain_rounds():
    """A catch-up that does not fit the budget runs in pieces after plain steps, each round within it."""
    cost = CostModel(list(LINEAR), draft_ms=5.0, draft_prefill_ms=2.0)
    pol = AdaptiveK(cost, alpha0=0.95, latency_budget_ms=160.0)
    pol.end(1000)  # earlier answers were long: the catch-up pays
    src, m = _choose(pol, lag=200)  # 398 ms of catch-up
    assert src == "catchup" and m == 1 + int((160.0 - 1.15 * 100.0 - 1.15 * 5.0) // (1.15 * 2.0))
    assert _choose(pol, lag=10)[0] == "draft"  # 18 ms of catch-up fits beside K = 1 or 2


def test_budget_catch_up_pieces_shrink_the_lag_to_nothing():
    """Each ("catchup", m) round adds one token and feeds m, the last committed one included, so the lag
    reaches 0 even when one token of catch-up fits beside no K (here: a 73 ms budget, plain 50, K = 1 65.5)."""
    cost = CostModel([50.0 + 5 * n for n in range(8)], draft_ms=8.0, draft_prefill_ms=1.7)
    pol = AdaptiveK(cost, alpha0=0.95, latency_budget_ms=73.0)
    pol.end(1000)
    lag, rounds = 40, 0
    while lag > 1 and rounds < 50:
        src, m = _choose(pol, lag=lag)
        if src != "catchup":
            break
        assert 1 <= m <= lag
        lag = lag - m + 1
        rounds += 1
    assert lag <= 1 and _choose(pol, lag=lag)[0] == "draft" and _choose(pol, lag=lag)[1] > 0


def test_lookup_is_tried_once_before_its_estimate_counts():
    """The draft looks better on the prior, but lookup costs only extra verified rows: it gets one try."""
    pol = AdaptiveK(CostModel(list(LINEAR), draft_ms=5.0), alpha0=0.95, lookup_alpha0=0.5)
    assert _choose(pol, lookup=1)[0] == "draft"  # a one-token match is not worth a try
    assert _choose(pol, lookup=4) == ("lookup", pol.probe_k)  # a short first try: two extra rows, not four
    _observe(pol, "lookup", pol.probe_k, 0, None, pol._model_ms(P["lookup"], pol.probe_k))
    assert _choose(pol, lookup=4)[0] == "draft"  # tried, rejected: the estimates decide from now on


def test_lookup_is_preferred_when_it_is_accepted_and_free():
    pol = AdaptiveK(CostModel(list(LINEAR), draft_ms=40.0), alpha0=0.6, lookup_alpha0=0.9)
    src, k = _choose(pol, lookup=5)
    assert src == "lookup" and 1 <= k <= 5
    assert _choose(pol, lookup=0)[0] == "draft"


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


@pytest.mark.parametrize("proposers", [("lookup",), ("lookup", "draft")])
@pytest.mark.parametrize("prompt", ["def add(a, b):", "The quick brown", "class Node:\n"])
def test_lookup_greedy_equals_target_greedy(dec, proposers, prompt):
    ids = dec.encode(prompt)
    dec.reset()
    plain = dec.generate(input_ids=ids, max_new_tokens=80, proposers=()).run()
    dec.reset()
    g = dec.generate(input_ids=ids, max_new_tokens=80, k=4, proposers=proposers).run()
    assert g.token_ids == plain.token_ids
    assert g.stats.accepted <= g.stats.evaluated <= g.stats.proposed


def test_lookup_rounds_happen_on_repetitive_text(dec):
    ids = dec.encode("def add(a, b):\n    return a + b\ndef add(a, b):\n    return a + b\ndef add(a, b):")
    dec.reset()
    g = dec.generate(input_ids=ids, max_new_tokens=40, k=4, proposers=("lookup",)).run()
    assert g.stats.proposers["lookup"].rounds > 0


def test_adaptive_policy_in_generation_keeps_greedy_and_reports_k(dec):
    ids = dec.encode("def add(a, b):")
    dec.reset()
    plain = dec.generate(input_ids=ids, max_new_tokens=60, proposers=()).run()
    dec.reset()
    pol = AdaptiveK(CostModel([1.0 + 0.1 * n for n in range(8)], draft_ms=0.05), probe_every=4)
    g = dec.generate(input_ids=ids, max_new_tokens=60, policy=pol, proposers=("lookup", "draft")).run()
    assert g.token_ids == plain.token_ids
    assert len(g.stats.k_per_round) == g.stats.rounds and max(g.stats.k_per_round) > 0


def test_adaptive_tree_policy_picks_a_budget_and_learns():
    pol = AdaptiveK(CostModel(list(LINEAR) + [180.0, 190.0, 200.0, 210.0, 220.0], draft_ms=5.0), alpha0=0.8)
    src, n = _choose(pol, tree=True)
    assert src in ("tree", "draft") and n > 0
    for _ in range(30):
        _observe(pol, "tree", 8, 5, 5.0, pol._model_ms(P["tree"], 8))  # budget 8 accepts 5 tokens per round: best
        for b in (4, 6, 12):
            _observe(pol, "tree", b, 0, 5.0, pol._model_ms(P["tree"], b))
    assert _choose(pol, tree=True) == ("tree", 8)


def test_draft_p_min_stops_drafting_early_and_stays_lossless(dec):
    ids = dec.encode("The quick brown")
    dec.reset()
    plain = dec.generate(input_ids=ids, max_new_tokens=40, proposers=()).run()
    dec.reset()
    g = dec.generate(input_ids=ids, max_new_tokens=40, k=6, draft_p_min=0.99).run()
    assert g.token_ids == plain.token_ids
    assert g.stats.proposed < 6 * g.stats.rounds  # some rounds stopped before K


def test_draft_catch_up_is_amortized_over_the_expected_answer_length():
    """A stretch the draft has not seen costs a catch-up; it pays only over enough expected remaining tokens."""
    pol = AdaptiveK(CostModel(list(LINEAR), draft_ms=5.0, draft_prefill_ms=2.0), alpha0=0.75)
    assert _choose(pol, lag=1, horizon=200)[1] > 0  # nothing to catch up
    # no history: half of what the request still allows (20 tokens: 10, too few for 400 tokens of catch-up)
    assert _choose(pol, lag=400, horizon=20) == ("draft", 0)
    assert _choose(pol, lag=400, horizon=10_000)[1] > 0  # a long request: the catch-up pays over 5,000 tokens
    pol.end(12)
    pol.begin()
    assert _choose(pol, lag=400, horizon=10_000) == ("draft", 0)  # the last answer ran 12 tokens
    pol.end(5000)
    pol.begin()
    assert _choose(pol, lag=400, horizon=8) == ("draft", 0)  # only 8 tokens may follow
    assert _choose(pol, lag=400, horizon=10_000)[1] > 0  # the last answer ran 5000 tokens


def test_the_catch_up_margin_is_the_catch_ups_share_of_the_remaining_plain_time():
    """Starting the draft behind a catch-up needs a gain over plain decoding of the catch-up's share of the plain
    time the answer is still expected to take, between the hysteresis (+3%) and +10% (since 2026-12-02; before
    it: always +10%): a small catch-up against a long answer starts the draft at +9%; the same catch-up at
    +5% starts it against 75 expected tokens (share 5.3%) and not against 60 (6.6%)."""
    cost = CostModel(list(LINEAR), draft_ms=40.0, draft_prefill_ms=2.0)
    small = AdaptiveK(cost, alpha0=0.65)  # 59 tokens × 2 ms of catch-up over 200 expected tokens: share 0.6%
    gain = small._best(Offer(P["draft"], 99), 118.0, 200.0).rate * small.plain_ms
    assert 1.05 < gain < 1.10
    assert _choose(small, lag=60, horizon=400) == ("draft", 1)
    fixed = AdaptiveK(cost, alpha0=0.65, catchup_weight=math.inf)  # the rule before 2026-12-02: +10%
    assert _choose(fixed, lag=60, horizon=400) == ("draft", 0)
    # 199 tokens × 2 ms of catch-up; no answer seen, so half the horizon is expected to follow
    for horizon, share, starts in ((150, 398.0 / 7500.0, True), (120, 398.0 / 6000.0, False)):
        pol = AdaptiveK(cost, alpha0=0.7)
        gain = pol._best(Offer(P["draft"], 99), 398.0, horizon / 2).rate * pol.plain_ms
        assert 1.05 < gain < 1.07  # clears the hysteresis and the share of 128 tokens (3.1%) either way
        assert pol._margin(P["draft"], 398.0, horizon / 2) == pytest.approx(share)
        assert (_choose(pol, lag=200, horizon=horizon)[1] > 0) is starts
    half = AdaptiveK(cost, alpha0=0.7, catchup_weight=0.5)  # the weight scales the share
    assert half._margin(P["draft"], 398.0, 60.0) == pytest.approx(0.5 * 398.0 / 6000.0)
    assert _choose(half, lag=200, horizon=120)[1] > 0
    large = AdaptiveK(cost, alpha0=0.7)
    assert large._margin(P["draft"], 598.0, 5.0) == pytest.approx(0.10)  # never more than catchup_margin
    assert large._margin(P["draft"], 50.0, 75.0) == large.hysteresis  # no catch-up longer than a plain step
    for bad in (-0.5, float("nan"), True, "1"):
        with pytest.raises(ValueError, match="catchup_weight"):
            AdaptiveK(cost, catchup_weight=bad)


def test_an_answer_longer_than_every_earlier_one_pays_the_catch_up_once_it_ran_long_enough():
    """Rent or buy: once an answer has outlived every earlier one (here one of 3 tokens), the catch-up (40+ tokens
    × 20 ms) is paid once the tokens already generated would have paid for it (here after about 19), so short
    answers never pay it."""
    pol = AdaptiveK(CostModel(list(LINEAR), draft_ms=5.0, draft_prefill_ms=20.0), alpha0=0.9)
    pol.end(3)
    pol.begin()
    starts = None
    for n in range(60):
        src, k = _choose(pol, lag=40 + n, horizon=1000)
        if k > 0:
            starts = n
            break
        _observe(pol, "draft", 0, 0, None, 100.0)
    assert starts is not None and 15 < starts < 25
    assert pol.expected_remaining(1000) == starts
    short = AdaptiveK(CostModel(list(LINEAR), draft_ms=5.0, draft_prefill_ms=20.0), alpha0=0.9)
    for _ in range(3):
        short.begin()
        short.end(6)  # answers of 6 tokens: the catch-up never pays within them
    short.begin()
    for n in range(5):
        assert _choose(short, lag=40 + n, horizon=1000) == ("draft", 0)
        _observe(short, "draft", 0, 0, None, 100.0)


def test_target_confidence_stands_in_for_acceptance_before_any_draft_round():
    pol = AdaptiveK(CostModel(list(LINEAR), draft_ms=5.0), alpha0=0.7)
    assert pol.alpha() == pytest.approx(0.7)
    for c in (0.9, 0.95, 1.0):
        pol.observe_confidence(c)
    assert pol.alpha() == pytest.approx((4 * 0.7 + 0.9 + 0.95 + 1.0) / 7)  # the prior weighs as 4 steps
    _observe(pol, "draft", 2, 0, None, 120.0)  # measured acceptance takes over
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
    g = dec.generate(input_ids=ids, max_new_tokens=30, policy=pol, proposers=("lookup",)).run()
    assert dec.dcache.length == 0 and "tree" not in g.stats.proposers and "draft" not in g.stats.proposers
    dec.reset()
    plain = dec.generate(input_ids=ids, max_new_tokens=30, proposers=()).run()
    assert g.token_ids == plain.token_ids


def test_lookup_acceptance_is_tracked_per_match_length():
    """Long n-gram matches are accepted in full, short ones rejected: the controller takes lookup for a 4-gram
    match, and longer than a draft chain (up to ``free_k_max``), but not for a 2-gram match."""
    from edgespec.draft.lookup import ngram_match

    pol = AdaptiveK(CostModel(list(LINEAR), draft_ms=30.0), alpha0=0.6, lookup_alpha0=0.6)
    lookup = P["lookup"]

    def offer(match, limit=12):
        return Situation((Offer(lookup, limit, match), Offer(P["draft"], 99)), 1, 1000)

    for _ in range(12):
        for match, accepted in ((4, 12), (2, 0)):
            plan = pol.choose(offer(match))
            k = plan.size if plan.proposer is lookup else 4
            pol.observe(RoundResult(RoundPlan(lookup, k=k), [0] * (min(accepted, k) + 1), lookup,
                                    tuple(range(1, k + 1)), min(accepted, k), round_ms=pol._model_ms(lookup, k)))
    long_plan, short_plan = pol.choose(offer(4)), pol.choose(offer(2))
    assert long_plan.proposer is lookup and long_plan.size > pol.k_max
    assert short_plan.proposer is not lookup
    assert pol.alpha(lookup, 4) > 0.9 and pol.alpha(lookup, 2) < 0.2
    assert ngram_match([1, 2, 3, 4, 9, 1, 2, 3, 4], 3) == ([9, 1, 2], 4)
    assert ngram_match([5, 6, 7], 3) == ([], 0)


def test_the_controller_is_pure_decision_logic_without_onnxruntime():
    import subprocess
    import sys

    code = ("import sys; sys.modules['onnxruntime'] = None; "
            "from edgespec.control.adaptive import AdaptiveK, CostModel; "
            "from edgespec.core.round import Offer, Situation; "
            "from edgespec.draft import DraftChain; "
            "pol = AdaptiveK(CostModel([100.0 + 10 * n for n in range(8)], draft_ms=5.0), alpha0=0.9); "
            "print(pol.choose(Situation((Offer(DraftChain(), 99),))).name)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.strip() == "draft", r.stderr


def test_calibration_outlier_takes_the_line_value():
    """One t_v(N) hit by a burst of other load is replaced by the Theil–Sen line; a clean curve is kept."""
    from edgespec.control.calibrate import smooth_verify

    clean = [65.7, 73.5, 91.5, 108.1, 122.6, 140.0, 164.8]
    assert smooth_verify(clean) == clean
    spiked = clean[:5] + [299.3] + clean[6:]
    fixed = smooth_verify(spiked)
    assert fixed[:5] == clean[:5] and fixed[6:] == clean[6:]
    assert 122.6 < fixed[5] < 164.8


def test_an_answer_length_prior_prices_the_catch_up_before_any_answer_was_seen():
    """``answer_prior`` (the voice use's short answers): with no answer seen, the catch-up is spread over
    max(L − n, n) tokens instead of half of the request's limit, so a cold voice controller does not pay a
    prompt catch-up that a 12-token answer cannot return; an answer that outlives L is again expected to run n
    more, and a seen answer replaces the prior."""
    cost = CostModel(list(LINEAR), draft_ms=30.0, draft_prefill_ms=6.0)
    cold = AdaptiveK(cost, alpha0=0.7)
    voice = AdaptiveK(cost, alpha0=0.7, answer_prior=24)
    assert cold.expected_remaining(128) == 64
    assert [voice.expected_remaining(128)] == [24]
    assert _choose(cold, lag=45, horizon=128)[1] > 0  # 264 ms of catch-up over 64 tokens pays
    assert _choose(voice, lag=45, horizon=128) == ("draft", 0)  # over 24 it does not
    for n in range(1, 40):
        _observe(voice, "draft", 0, 0, None, 100.0)
        assert voice.expected_remaining(128) == max(24 - n, n)
    assert voice.expected_remaining(30) == 30  # never more than the request allows
    voice.end(200)
    voice.begin()
    assert voice.expected_remaining(1000) == 200  # the answers seen replace the prior
    for bad in (0, -1, float("nan"), float("inf"), True, "24"):
        with pytest.raises(ValueError, match="answer_prior"):
            AdaptiveK(cost, answer_prior=bad)


def test_the_voice_use_and_the_bench_voice_class_get_the_voice_prior(monkeypatch):
    """``k_policy(use="voice")`` (``edgespec voice``, the bench's voice prompts) builds the controller with
    ``ANSWER_PRIORS["voice"]``; other uses with none."""
    from edgespec.control import adaptive
    from edgespec.engine import presets

    got = []
    monkeypatch.setattr(adaptive.AdaptiveK, "for_decoder",
                        classmethod(lambda cls, dec, **kw: got.append(kw)))
    presets.k_policy(object(), None, use="voice")
    presets.k_policy(object(), None, memory="chat")
    presets.k_policy(object(), None)
    assert [kw["answer_prior"] for kw in got] == [presets.ANSWER_PRIORS["voice"], None, None]
    # the voice use's catch-up margin (presets.CATCHUP_MARGINS); the others keep AdaptiveK's defaults
    assert (got[0]["catchup_margin"], got[0]["catchup_weight"]) == presets.CATCHUP_MARGINS["voice"]
    assert "catchup_margin" not in got[1] and "catchup_weight" not in got[2]
    voice = adaptive.AdaptiveK(CostModel([60.0, 70.0], 20.0, 3.0), **presets.controller_settings("voice"))
    assert voice.catchup_margin > adaptive.AdaptiveK(CostModel([60.0, 70.0], 20.0, 3.0)).catchup_margin


def test_keep_margin_band():
    """A proposer that has run since the last plain step keeps running while it is at most ``keep_margin``
    below a plain step;
    a new start needs the ``hysteresis`` above it. K = 1 at 110 + 30 ms breaks even at alpha 0.4."""
    def at(alpha, last, **kw):
        pol = AdaptiveK(CostModel(list(LINEAR), draft_ms=30.0), k_max=1, **kw)
        pol.counts["draft"], pol.rounds["draft"] = [alpha * 10, (1 - alpha) * 10], 5
        pol.running = {last} if last else set()
        return _choose(pol, lag=1)

    assert at(0.38, None) == ("draft", 0)  # 1.5% below plain: not started
    assert at(0.38, "draft") == ("draft", 1)  # but kept
    assert at(0.25, "draft") == ("draft", 0)  # 11% below: stopped
    assert at(0.38, "draft", keep_margin=-0.03) == ("draft", 0)  # the band closed: the hysteresis both ways
    assert at(0.45, None) == ("draft", 1)
    pol = AdaptiveK(CostModel(list(LINEAR), draft_ms=30.0))
    _observe(pol, "draft", 1, 1, 30.0, 140.0)
    assert pol.running == {"draft"}
    _observe(pol, "lookup", 2, 2, None, 120.0)
    assert pol.running == {"draft", "lookup"}  # a lookup round does not end the draft's run
    _observe(pol, "draft", 0, 0, None, 100.0)
    assert pol.running == set()  # a plain step does
    pol.running.add("draft")
    pol.begin()
    assert pol.running == set()  # a new answer starts from a plain step


def test_a_candidate_that_does_not_clear_its_margin_does_not_displace_one_in_its_band():
    """The draft, in its keep band 1.5% below a plain step, runs even though lookup offers a higher rate that
    does not clear the +3% of a start (before, the highest rate alone was judged, and a plain step followed)."""
    pol = AdaptiveK(CostModel(list(LINEAR), draft_ms=30.0), k_max=1, free_k_max=1)
    pol.counts["draft"], pol.rounds["draft"] = [3.8, 6.2], 5  # K = 1: 1.38 tokens in 140 ms, 0.986 of plain
    pol.counts["lookup"], pol.rounds["lookup"] = [1.1, 8.9], 5  # K = 1: 1.11 tokens in 110 ms, 1.009 of plain
    pol.running = {"draft"}
    assert pol._rate(P["lookup"], 1, 0, 0.0, 128) > pol._rate(P["draft"], 1, 0, 0.0, 128)
    assert _choose(pol, lookup=2, lag=1) == ("draft", 1)
    pol.running = set()
    assert _choose(pol, lookup=2, lag=1) == ("draft", 0)  # neither clears the +3% of a start


def test_a_lookup_round_keeps_the_drafts_band():
    """Between two draft rounds a lookup round leaves the draft in its keep band (replayed on chat answers, a
    lookup round made the draft, 1.5% below plain, need the +3% of a new start and wait for a probe)."""
    pol = AdaptiveK(CostModel(list(LINEAR), draft_ms=30.0), k_max=1)
    pol.counts["draft"], pol.rounds["draft"] = [3.8, 6.2], 5
    pol.running = {"draft"}
    _observe(pol, "lookup", 1, 1, None, 110.0)  # alpha 0.38: K = 1 at 140 ms is 1.5% below a plain step
    assert _choose(pol, lag=1) == ("draft", 1)
    _observe(pol, "draft", 0, 0, None, 100.0)
    assert _choose(pol, lag=1) == ("draft", 0)

