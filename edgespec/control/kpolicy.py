"""The K policy protocol and the simple policies: fixed K, a schedule, and plain steps while held.

A :class:`KPolicy` reads a :class:`~edgespec.core.round.Situation` before each round, answers with a
:class:`~edgespec.core.round.RoundPlan`, and learns from the :class:`~edgespec.core.round.RoundResult`. The
adaptive policy is :class:`~edgespec.control.adaptive.AdaptiveK`.
"""

from __future__ import annotations

import contextlib
from typing import ClassVar

from ..core.round import Offer, RoundPlan, RoundResult, Situation

__all__ = ["FixedK", "HoldPlain", "KPolicy", "KSchedule", "Offer", "RoundPlan", "RoundResult", "Situation",
           "first_offer"]


class KPolicy:
    """Chooses each round's :class:`RoundPlan` and learns from its :class:`RoundResult`.

    Subclasses implement :meth:`choose`; the hooks have no-op defaults. ``latency_budget_ms`` (ms or None) is
    reported in the statistics."""

    latency_budget_ms: float | None = None
    honours_budget: ClassVar[bool] = False  # whether ``latency_budget_ms`` changes what it plans (AdaptiveK)

    @contextlib.contextmanager
    def budget(self, ms: float | None):
        """Within the block (one generation), plan with the latency budget ``ms`` (ms per round; None: keep
        this policy's own), then restore the policy's own; what it learns meanwhile carries over.

        Raises:
            ValueError: a budget for a policy that does not honour one.
        """
        if ms is None:
            yield self
            return
        if not self.honours_budget:
            raise ValueError(f"a latency budget needs a policy that honours one (adaptive K), not "
                             f"{type(self).__name__}")
        saved, self.latency_budget_ms = self.latency_budget_ms, ms
        try:
            yield self
        finally:
            self.latency_budget_ms = saved

    def choose(self, situation: Situation) -> RoundPlan:
        raise NotImplementedError

    def observe(self, result: RoundResult) -> None:
        """A round finished (called before its tokens are emitted)."""

    def begin(self) -> None:
        """A new answer starts (called after the prefill)."""

    def end(self, new_tokens: int) -> None:
        """The answer ended with ``new_tokens`` tokens (not called for a generation a newer one replaced)."""

    def observe_confidence(self, top1: float) -> None:
        """The target's top-1 probability (temperature 1, in [0, 1]) at a plain step of a speculative
        generation."""


def first_offer(situation: Situation) -> Offer | None:
    """The first offer that can propose something, in priority order."""
    return next((o for o in situation.offers if o.limit > 0), None)


class FixedK(KPolicy):
    """Always K: from the first offered proposer that can propose (e.g. prompt lookup when it has a match, up
    to K tokens), else a plain step — a chain of ``k`` tokens, or ``n_nodes`` for a tree proposer."""

    def __init__(self, k: int, n_nodes: int | None = None):
        if k < 0 or (n_nodes is not None and n_nodes < 0):
            raise ValueError(f"k and n_nodes must be ≥ 0, got {k}, {n_nodes}")
        self.k, self.n_nodes = k, k if n_nodes is None else n_nodes

    def choose(self, situation: Situation) -> RoundPlan:
        o = first_offer(situation)
        if o is None:
            return RoundPlan()
        if o.proposer.sized_by_nodes:
            return RoundPlan(o.proposer, n_nodes=min(self.n_nodes, o.limit))
        return RoundPlan(o.proposer, k=min(self.k, o.limit))


class KSchedule(KPolicy):
    """K from a list, cycled (forces e.g. [4, 0, 0, 4, 1, 0, 4] in tests), from the first proposer offered."""

    def __init__(self, schedule: list[int]):
        self.schedule, self.i = list(schedule), 0

    def choose(self, situation: Situation) -> RoundPlan:
        k = self.schedule[self.i % len(self.schedule)]
        self.i += 1
        o = next(iter(situation.offers), None)
        return RoundPlan(o.proposer, k=k, n_nodes=k) if o is not None else RoundPlan()


class HoldPlain(KPolicy):
    """Plain steps while held, then ``inner`` decides (a voice turn holds it until its first spoken chunk is
    decoded: on short chunks a proposal's cost and its bursty commits delay the first sound more than drafting
    saves). Every round is still observed by ``inner``; the output is unchanged (lossless: only which rounds
    propose changes)."""

    def __init__(self, inner: KPolicy):
        self.inner, self.held = inner, True
        self.latency_budget_ms = inner.latency_budget_ms

    def release(self) -> None:
        """From the next round on, ``inner`` plans."""
        self.held = False

    def choose(self, situation: Situation) -> RoundPlan:
        return RoundPlan() if self.held else self.inner.choose(situation)

    def observe(self, result: RoundResult) -> None:
        self.inner.observe(result)

    def begin(self) -> None:
        self.inner.begin()

    def end(self, new_tokens: int) -> None:
        self.inner.end(new_tokens)

    def observe_confidence(self, top1: float) -> None:
        self.inner.observe_confidence(top1)
