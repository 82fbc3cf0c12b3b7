"""Tiers (b) and (c): tiny random models exported to ONNX, speculative vs plain, invariants."""

import numpy as np
import pytest

from edgespec.engine.decoder import SpecDecoder
from edgespec.engine.generation import GenerationOptions
from edgespec.control.kpolicy import KPolicy, KSchedule
from edgespec.core.round import RoundPlan
from edgespec.io.text import IncrementalDetokenizer


@pytest.fixture(scope="module")
def dec(export_each_format):
    return SpecDecoder.load(export_each_format)


@pytest.fixture(scope="module")
def self_dec(self_export_each_format):
    return SpecDecoder.load(self_export_each_format)


PROMPTS = ["def add(a, b):", "The quick brown", "class Node:\n", "单发"]


def _ids(d, prompt):
    return d.encode(prompt)


def _plain(d, ids, n):
    d.reset()
    return d.generate(input_ids=ids, max_new_tokens=n, proposers=()).run()


class _CheckedSchedule(KSchedule):
    """Forces K and asserts the cache invariants before every round."""

    def __init__(self, schedule, decoder):
        super().__init__(schedule)
        self.d = decoder

    def choose(self, situation):
        d = self.d
        assert d.tcache.length == len(d.tokens) - 1  # target: positions 0..L-1, `last` not cached
        assert d.dcache.length <= d.tcache.length  # the draft may lag, never lead
        return super().choose(situation)


@pytest.mark.parametrize("schedule", [[4], [4, 0, 0, 4, 1, 0, 4]])
def test_draft_equal_to_target_accepts_everything(self_dec, schedule):
    ids = _ids(self_dec, "def add(a, b):")
    plain = _plain(self_dec, ids, 200)
    self_dec.reset()
    g = self_dec.generate(input_ids=ids, max_new_tokens=200, policy=_CheckedSchedule(schedule, self_dec)).run()
    s = g.stats
    assert g.token_ids == plain.token_ids
    assert s.proposed > 0 and s.accepted == s.proposed and s.corrections == 0
    assert s.accepted_per_position == s.proposed_per_position


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("k", [1, 3, 5])
def test_speculative_greedy_equals_target_greedy(dec, prompt, k):
    ids = _ids(dec, prompt)
    plain = _plain(dec, ids, 60)
    dec.reset()
    g = dec.generate(input_ids=ids, max_new_tokens=60, k=k).run()
    assert g.token_ids == plain.token_ids
    assert g.text == plain.text
    s = g.stats
    assert 0 <= s.accepted <= s.proposed
    assert sum(s.accepted_per_position) == s.accepted
    assert s.rounds == len(s.k_per_round) == len(s.round_ms)
    assert s.new_tokens == len(g.token_ids) + (s.stop_reason == "stop_token")


def test_draft_and_target_disagree_sometimes(dec):
    """The tiny pair is a real test of rejection: the draft is not the target."""
    dec.reset()
    g = dec.generate(input_ids=_ids(dec, PROMPTS[0]), max_new_tokens=60, k=4).run()
    assert g.stats.corrections > 0


@pytest.mark.parametrize("n", [1, 2, 7, 13, 31])
def test_max_new_tokens_not_a_multiple_of_k_plus_one(self_dec, n):
    ids = _ids(self_dec, PROMPTS[1])
    plain = _plain(self_dec, ids, n)
    self_dec.reset()
    g = self_dec.generate(input_ids=ids, max_new_tokens=n, k=4).run()
    assert g.token_ids == plain.token_ids
    assert len(g.token_ids) == len(plain.token_ids) <= n


def test_stop_token_accepted_mid_block_ends_generation(self_dec):
    ids = _ids(self_dec, PROMPTS[2])
    plain = _plain(self_dec, ids, 40)
    # make the 6th greedy token a stop token: with K=4 it is accepted inside the second block
    stop_tok = plain.token_ids[5]
    self_dec.stop_ids = frozenset({stop_tok})
    try:
        self_dec.reset()
        g = self_dec.generate(input_ids=ids, max_new_tokens=40, k=4).run()
    finally:
        self_dec.stop_ids = frozenset(self_dec.manifest.special_tokens.stop)
    first = plain.token_ids.index(stop_tok)
    assert g.token_ids == plain.token_ids[:first]
    assert g.stats.stop_reason == "stop_token"


def test_sampling_is_reproducible_with_a_seed(dec):
    ids = _ids(dec, PROMPTS[0])
    runs = []
    for _ in range(2):
        dec.reset()
        runs.append(dec.generate(input_ids=ids, max_new_tokens=30, temperature=0.8, top_p=0.9, seed=7).run().token_ids)
    assert runs[0] == runs[1]


def test_empty_prompt_and_too_long_prompt_are_clear_errors(dec):
    with pytest.raises(ValueError, match="empty"):
        dec.generate("")
    with pytest.raises(ValueError, match="context"):
        dec.generate(input_ids=[1] * dec.context_length, max_new_tokens=5)


def test_prompt_plus_max_new_tokens_past_context_stops_at_the_limit(dec):
    ids = [5] * (dec.context_length - 10)
    dec.reset()
    g = dec.generate(input_ids=ids, max_new_tokens=50, k=4).run()
    assert g.stats.stop_reason in ("context", "stop_token")
    assert len(ids) + len(g.token_ids) <= dec.context_length + 1
    assert dec.tcache.length <= dec.context_length


def test_follow_up_prompt_reuses_the_cache_and_equals_a_fresh_run(dec):
    conv = [{"role": "user", "content": "def add"}]
    dec.reset()
    first = dec.generate(messages=conv, max_new_tokens=20, k=3).run()
    conv += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "again"}]
    cached_before = dec.tcache.length
    second = dec.generate(messages=conv, max_new_tokens=20, k=3).run()
    assert cached_before > 0
    assert second.stats.prefill_ms >= 0
    dec.reset()
    fresh = dec.generate(messages=conv, max_new_tokens=20, k=3).run()
    assert second.token_ids == fresh.token_ids


def test_streaming_never_emits_replacement_characters(dec):
    ids = dec.tokenizer.encode("A. 单发 ünïcödé ✓", add_special_tokens=False).ids
    d = IncrementalDetokenizer(dec.tokenizer)
    pieces = [d.push([i]) for i in ids] + [d.flush()]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == dec.tokenizer.decode(ids)


def test_top_k_top_p_sampling_runs_speculatively(dec):
    dec.reset()
    g = dec.generate("def", max_new_tokens=25, temperature=0.7, top_k=20, top_p=0.9, seed=1, k=3).run()
    assert 0 < len(g.token_ids) <= 25
    assert np.all(np.array(g.token_ids) < dec.width)


def test_first_token_of_a_round_follows_p(dec):
    """Tier (d) on the tiny pair: the emitted token's histogram is within sampling noise of p."""
    from edgespec.bench.evaluate import first_token_check
    from edgespec.core.sampling import SamplingParams

    r = first_token_check(dec, dec.encode("def add(a, b):"), SamplingParams(0.8, top_p=0.95), draws=2000, k=3)
    assert r["tv"] < 3 * r["tv_noise"] + 0.01


def test_greedy_check_reports_identity(dec):
    from edgespec.bench.evaluate import greedy_check

    r = greedy_check(dec, dec.encode("class Node:\n"), 30, k=3)
    assert r["identical"] and r["first_divergence"] is None and r["plain_tokens"] == r["spec_tokens"]


class _SourceSchedule(KPolicy):
    """Cycles through (source, K) pairs, checking the cache invariants and the draft's catch-up pieces."""

    def __init__(self, schedule, decoder):
        self.schedule, self.i, self.d = schedule, 0, decoder
        self.before, self.catchups = None, []

    def choose(self, situation):
        d, lag = self.d, situation.lag
        assert d.tcache.length == len(d.tokens) - 1 and d.dcache.length <= d.tcache.length
        assert lag == len(d.tokens) - d.dcache.length
        src, k = self.schedule[self.i % len(self.schedule)]
        self.i += 1
        self.before = (src, k, lag, d.dcache.length)
        if src == "catchup":
            return RoundPlan(catchup_tokens=k)
        return RoundPlan(next(o.proposer for o in situation.offers if o.proposer.name == src), k=k)

    def observe(self, result):
        src, m, lag, before = self.before
        if src == "catchup":
            fed = min(m, lag)  # the token this round adds stays unfed: the next proposal still has a feed
            assert result.size == 0 and result.accepted == 0 and result.catchup_tokens == fed
            assert self.d.dcache.length == before + fed
            self.catchups.append(fed)


def test_catch_up_rounds_advance_the_draft_and_keep_greedy_output(dec):
    """("catchup", m): a plain target step plus m tokens of the draft's lag; output still equals plain."""
    ids = _ids(dec, "def add(a, b):")
    plain = _plain(dec, ids, 60)
    dec.reset()
    pol = _SourceSchedule([("draft", 0), ("draft", 0), ("catchup", 2), ("catchup", 50), ("draft", 3)], dec)
    g = dec.generate(input_ids=ids, max_new_tokens=60, policy=pol).run()
    assert g.token_ids == plain.token_ids
    assert pol.catchups and max(pol.catchups) > 2 and g.stats.draft_ms > 0
    assert set(g.stats.k_per_round) <= {0, 1, 2, 3} and 3 in g.stats.k_per_round  # catch-up rounds record K = 0


def test_cached_prefix_is_reused_by_both_models_and_changes_nothing(dec, monkeypatch):
    """cache_prefix (a voice system prompt prefilled at start-up): the next prompt that starts with it feeds
    neither model the prefix again, and the output equals a fresh run's."""
    full = dec.encode(messages=[{"role": "system", "content": "Answer briefly."},
                                {"role": "user", "content": "def add"}])
    prefix = full[:12]
    dec.reset()
    ref = dec.generate(input_ids=full, max_new_tokens=16, k=3).run().token_ids
    dec.reset()
    dec.cache_prefix(prefix)
    assert dec.tokens == prefix and dec.tcache.length == dec.dcache.length == len(prefix) - 1
    starts = {"target": [], "draft": []}
    for role, lm in (("target", dec.target), ("draft", dec.draft)):
        def forward(ids, cache, *a, _f=lm.forward, _role=role, **kw):
            starts[_role].append(cache.length)
            return _f(ids, cache, *a, **kw)
        monkeypatch.setattr(lm, "forward", forward)
    assert dec.generate(input_ids=full, max_new_tokens=16, k=3).run().token_ids == ref
    assert min(starts["target"]) == len(prefix) - 1 and min(starts["draft"]) == len(prefix) - 1
    monkeypatch.undo()
    dec.cache_prefix(prefix)  # back to the prefix after a generation: crops both caches
    assert dec.tokens == prefix and dec.tcache.length == dec.dcache.length == len(prefix) - 1
    dec.cache_prefix(prefix[:5] + [prefix[5] + 1])  # a different prefix keeps only the common part
    assert dec.tokens == prefix[:5] + [prefix[5] + 1] and dec.tcache.length == dec.dcache.length == 5
    with pytest.raises(ValueError):
        dec.cache_prefix([])


def test_hold_plain_proposes_nothing_until_released_and_changes_nothing(dec, monkeypatch):
    from edgespec.control.kpolicy import FixedK, HoldPlain

    ids = _ids(dec, "def add(a, b):")
    ref = _plain(dec, ids, 24).token_ids
    sizes = []
    run_round = dec.run_round

    def record(plan, *a, **kw):
        sizes.append(plan.size)
        return run_round(plan, *a, **kw)
    monkeypatch.setattr(dec, "run_round", record)
    dec.reset()
    hold = HoldPlain(FixedK(3))
    out = []
    for new, _ in dec.generate_ids(ids, GenerationOptions(max_new_tokens=24, proposers=("draft",)), policy=hold):
        out += new
        if len(out) >= 6:
            hold.release()
    assert out == ref
    n_held = next(i for i, s in enumerate(sizes) if s > 0)
    assert n_held >= 5 and all(s == 0 for s in sizes[:n_held]) and sizes[n_held] == 3
