"""The adaptive controller's estimators on hand-made rounds, and the decision costing a proposer by what it declares."""

import ast
from pathlib import Path
from typing import ClassVar

import pytest

from edgespec.control.adaptive import AdaptiveK
from edgespec.control.calibrate import CostModel
from edgespec.control.estimators import Acceptance, RoundCosts, TreeAcceptance, expected_tokens
from edgespec.core.round import Offer, RoundPlan, RoundResult, Situation
from edgespec.core.token_tree import TreeShape
from edgespec.draft import DraftChain, DraftTree, PromptLookup, Proposer

LINEAR = [100.0 + 10.0 * (n - 1) for n in range(1, 14)]  # t_v(N) = 100 ms + 10 ms per extra row


class OneRunHead(Proposer):
    """A draft-model proposer that declares one draft run for any size (like a multi-token head)."""

    name: ClassVar[str] = "onerun"
    uses_draft: ClassVar[bool] = True

    def draft_runs(self, size: int) -> int:
        return 1


def test_acceptance_is_accepted_over_accepted_plus_rejected_tokens():
    """Without decay, alpha = accepted / (accepted + rejected) with the prior's 2 tokens: rounds of K = 4 that
    accept 4, 1 and 2 tokens add 7 accepted and 2 rejected to [1, 1] (alpha0 = 0.5)."""
    acc = Acceptance(alpha0=0.5, decay=1.0)
    chain = DraftChain()
    for accepted in (4, 1, 2):
        acc.observe(chain, 4, accepted)
    assert acc.counts["draft"] == [8.0, 3.0]
    assert acc.alpha("draft", True) == pytest.approx(8 / 11)
    assert acc.rounds == {"draft": 3}


def test_acceptance_per_match_starts_from_the_overall_counts_and_then_learns_apart():
    acc = Acceptance(model_free_alpha0=0.6, decay=0.5)
    lookup = PromptLookup()
    assert acc.alpha("lookup", False) == pytest.approx(0.6)  # the model-free prior, no confidence prior
    acc.observe(lookup, 3, 0, match=2)  # a 2-gram match rejected at once
    assert acc.counts["lookup/2"] == acc.counts["lookup"] == pytest.approx([0.6, 0.4 + 1])
    acc.observe(lookup, 3, 3, match=4)  # a 4-gram match: its counts start from the overall ones, then learn
    assert acc.counts["lookup/4"] == pytest.approx([0.3 + 3, 0.7])
    assert acc.alpha("lookup", False, 4) > 0.8 > 0.5 > acc.alpha("lookup", False, 2)


def test_the_confidence_prior_covers_only_a_draft_proposer_never_run_and_restarts_with_each_answer():
    acc = Acceptance(alpha0=0.5)
    for top1 in (1.0, 1.0):
        acc.observe_confidence(top1)
    assert acc.alpha("draft", True) == pytest.approx((4 * 0.5 + 2) / 6)
    assert acc.alpha("lookup", False) == pytest.approx(0.7)
    acc.begin()
    assert acc.alpha("draft", True) == pytest.approx(0.5)


def test_tree_acceptance_starts_at_the_chain_expectation_of_its_depth_then_follows_an_ewma():
    trees = TreeAcceptance(alpha0=0.8, budgets=(4, 8))
    depth = TreeShape.for_budget(6).depth
    assert trees.tokens("tree", 6) == pytest.approx(expected_tokens(depth, 0.8))  # a budget outside ``budgets``
    assert set(trees.accepted["tree"]) == {4, 6, 8}
    prior = trees.tokens("tree", 4) - 1
    trees.observe("tree", 4, 2)
    assert trees.tokens("tree", 4) == pytest.approx(0.8 * prior + 0.2 * 2 + 1)


@pytest.mark.parametrize("proposer", [DraftChain(), DraftTree(), PromptLookup(), OneRunHead()])
def test_round_costs_are_the_cost_models_one_formula_with_the_declared_draft_runs(proposer):
    cost = CostModel(list(LINEAR), draft_ms=7.0, draft_prefill_ms=2.0)
    costs = RoundCosts(cost)
    costs.scales.sample("target", 1.3)
    costs.scales.sample("draft", 0.6)
    for k in (1, 3, 6):
        assert costs.model_ms(proposer, k) == cost.round_ms(k, proposer.draft_runs(k), 1.3, 0.6)
    assert costs.plain_ms == costs.model_ms(proposer, 0) == pytest.approx(100.0 * 1.3)
    costs.overhead[proposer.name] = 1.25
    assert costs.predicted_ms(proposer, 3) == pytest.approx(1.25 * cost.round_ms(3, proposer.draft_runs(3), 1.3, 0.6))


def test_a_proposer_is_costed_by_the_draft_runs_it_declares():
    """An expensive draft step (30 ms): a chain pays it K times, a proposer that declares one run pays it once,
    so the controller gives that proposer a longer K at the same acceptance."""
    def chosen(p):
        pol = AdaptiveK(CostModel(list(LINEAR), draft_ms=30.0), k_max=8, alpha0=0.9)
        return pol.choose(Situation((Offer(p, 99),), 1, 1000)).k

    assert 0 < chosen(DraftChain()) < chosen(OneRunHead())


def test_model_free_alpha0_and_its_old_keyword():
    cost = CostModel(list(LINEAR), draft_ms=5.0)
    lookup = PromptLookup()
    new, old = AdaptiveK(cost, model_free_alpha0=0.4), AdaptiveK(cost, lookup_alpha0=0.4)
    assert new.alpha(lookup) == old.alpha(lookup) == pytest.approx(0.4)
    assert new.lookup_alpha0 == new.model_free_alpha0 == 0.4
    assert AdaptiveK(cost).alpha(lookup) == pytest.approx(0.7)
    with pytest.raises(ValueError, match="not both"):
        AdaptiveK(cost, model_free_alpha0=0.4, lookup_alpha0=0.5)


def test_adaptive_k_reads_and_writes_its_estimators_under_the_old_names():
    pol = AdaptiveK(CostModel(list(LINEAR), draft_ms=5.0))
    pol.observe(RoundResult(RoundPlan(DraftChain(), k=3), [0, 0, 0], DraftChain(), (1, 2, 3), 2, round_ms=150.0,
                            draft_ms=15.0, draft_step_ms=5.0))
    assert pol.counts is pol.acceptance.counts and pol.rounds == {"draft": 1}
    assert pol.overhead is pol.costs.overhead and "draft" in pol.overhead
    pol.generated = 7
    assert pol.answer.generated == 7


def test_the_controller_imports_no_proposer_class():
    """The decision and its estimators know proposers by what they declare: from edgespec.draft they import only
    the ``Proposer`` seam, for annotations."""
    control = Path(__file__).resolve().parent.parent / "edgespec" / "control"
    for name in ("adaptive.py", "estimators.py"):
        for node in ast.walk(ast.parse((control / name).read_text())):
            if isinstance(node, ast.ImportFrom) and "draft" in (node.module or ""):
                assert node.module == "draft.base" and [a.name for a in node.names] == ["Proposer"], name
