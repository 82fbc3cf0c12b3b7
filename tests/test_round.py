"""The round's seams: typed options, the public rewind, and statistics of a round cut short by a stop token."""

import pytest

from edgespec.engine.decoder import SpecDecoder
from edgespec.engine.generation import GenerationOptions
from edgespec.core.round import RoundPlan, RoundResult
from edgespec.draft import DraftChain
from edgespec.core.stats import GenerationStats


@pytest.fixture(scope="module")
def self_dec(tiny_self_export):
    return SpecDecoder.load(tiny_self_export)


def test_options_are_validated_and_old_argument_names_are_a_clear_error(self_dec):
    with pytest.raises(ValueError, match="max_new_tokens"):
        GenerationOptions(max_new_tokens=0)
    with pytest.raises(ValueError, match="unknown proposer"):
        GenerationOptions(proposers=("suffix-array",))
    with pytest.raises(ValueError, match="proposers must be a tuple"):
        GenerationOptions(proposers="draft")
    with pytest.raises(ValueError, match="k must be"):
        self_dec.generate("x", k=-1)
    with pytest.raises(TypeError, match="mode"):
        self_dec.generate("x", mode="plain")
    o = GenerationOptions.with_fields(GenerationOptions(k=3), {"temperature": 0.5})
    assert (o.k, o.temperature, o.proposers) == (3, 0.5, ("draft",))


def test_rewind_to_forgets_the_tail_and_the_next_generation_equals_a_fresh_one(self_dec):
    ids = self_dec.encode("def add(a, b):")
    self_dec.reset()
    first = self_dec.generate(input_ids=ids, max_new_tokens=12, k=3).run()
    self_dec.rewind_to(len(ids) + 2)
    assert self_dec.tokens == ids + first.token_ids[:2]
    assert self_dec.tcache.length == len(ids) + 1 and self_dec.dcache.length <= len(ids) + 1
    with pytest.raises(ValueError, match="rewind_to"):
        self_dec.rewind_to(0)
    again = self_dec.generate(input_ids=ids, max_new_tokens=12, k=3).run()
    assert again.token_ids == first.token_ids


def test_a_round_cut_by_a_stop_token_counts_only_what_it_emitted(self_dec):
    """Issue 18 item 9: a K = 6 round whose first accepted token is the stop token emitted only that token:
    accepted 1, alpha 1.0, one position evaluated, no correction or bonus."""
    ids = self_dec.encode("class Node:\n")
    self_dec.reset()
    plain = self_dec.generate(input_ids=ids, max_new_tokens=10, proposers=()).run()
    stop_tok = plain.token_ids[1]  # the first token of the first K = 6 round (the draft equals the target)
    assert stop_tok not in plain.token_ids[:1]
    self_dec.stop_ids = frozenset({stop_tok})
    try:
        self_dec.reset()
        g = self_dec.generate(input_ids=ids, max_new_tokens=32, k=6).run()
    finally:
        self_dec.stop_ids = frozenset(self_dec.manifest.special_tokens.stop)
    s = g.stats
    assert g.token_ids == plain.token_ids[:1] and s.stop_reason == "stop_token" and s.new_tokens == 2
    assert (s.rounds, s.accepted, s.evaluated, s.proposed, s.alpha) == (1, 1, 1, 1, 1.0)
    assert s.accepted_per_position == [1] and s.proposed_per_position == [1]
    assert s.corrections == 0 and s.bonus == 0 and s.k_per_round == [1]
    assert s.proposers["draft"].accepted == 1


def test_record_round_cut_inside_and_after_the_accepted_prefix():
    r = RoundResult(RoundPlan(DraftChain(), k=6), tokens=[5, 6, 7, 9], proposer=DraftChain(),
                    depths=(1, 2, 3, 4, 5, 6), accepted=3, bonus=False, draft_ms=2.0, round_ms=5.0)
    s = GenerationStats()
    s.record_round(r, emitted=2)  # cut inside the accepted tokens
    assert (s.proposed, s.accepted, s.corrections, s.bonus) == (2, 2, 0, 0)
    assert s.accepted_per_position == [1, 1] and s.proposed_per_position == [1, 1]
    s = GenerationStats()
    s.record_round(r, emitted=4)  # the whole round: 3 accepted, then the correction
    assert (s.proposed, s.accepted, s.corrections, s.bonus, s.evaluated) == (6, 3, 1, 0, 4)
    assert s.accepted_per_position == [1, 1, 1, 0, 0, 0] and s.verify_ms == 3.0
