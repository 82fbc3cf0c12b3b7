"""The round's typed data and the K policy protocol: what a policy is offered, what it plans, what it learns from.

Each round the decoder offers the proposers of the generation (:class:`Offer`: a proposer and how many tokens it
can propose now), the policy answers with a :class:`RoundPlan` (which proposer, draft length K or tree size
``n_nodes``, and a draft catch-up), and after the round both the policy and the statistics consume the same
:class:`RoundResult`. Fixed and scheduled policies live here; the adaptive one in :mod:`.adaptive`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..draft.proposers import Proposer


@dataclass(frozen=True)
class Offer:
    """A proposer available this round and ``limit``, the most tokens it can propose now (0: nothing, e.g.
    prompt lookup without a match). ``match`` describes the proposal's quality where the proposer knows it
    (prompt lookup: the matched n-gram's length; 0: none); a policy may track acceptance per ``match``."""

    proposer: "Proposer"
    limit: int
    match: int = 0


@dataclass(frozen=True)
class Situation:
    """What a policy knows before a round: the ``offers`` in priority order, ``lag`` (tokens the draft must
    read before it can draft: 1 when it is in step) and ``horizon`` (new tokens still allowed)."""

    offers: tuple[Offer, ...] = ()
    lag: int = 0
    horizon: int | None = None


@dataclass(frozen=True)
class RoundPlan:
    """One round: ``proposer`` None is a plain target step; a chain proposer drafts ``k`` tokens (K, the draft
    length), a tree proposer ``n_nodes``; ``catchup_tokens`` > 0 (with a plain step) also feeds the draft that
    many of the tokens it lags."""

    proposer: "Proposer | None" = None
    k: int = 0
    n_nodes: int = 0
    catchup_tokens: int = 0

    @property
    def size(self) -> int:
        """Tokens to propose: ``n_nodes`` for a tree proposer, else ``k`` (0: a plain step)."""
        if self.proposer is None:
            return 0
        return self.n_nodes if self.proposer.tree else self.k

    @property
    def name(self) -> str:
        """The proposer's name, ``catchup`` or ``plain``."""
        if self.proposer is not None and self.size > 0:
            return self.proposer.name
        return "catchup" if self.catchup_tokens else "plain"


@dataclass(frozen=True)
class RoundResult:
    """What one round did. ``tokens`` are committed (accepted proposal tokens, then the correction or bonus
    token); a plain step has ``proposer`` None and one token. ``depths`` int (N,) are the proposal's node depths
    (a chain of K: 1..K), ``accepted`` the accepted path's length, ``bonus`` whether the last token is a bonus
    (every evaluated proposal token accepted, a leaf reached) rather than a correction. Times in ms:
    ``draft_ms`` (proposing, or a plain step's catch-up feed), ``round_ms`` (the whole round, draft included),
    ``draft_step_ms`` (median one-token draft step, None without one), ``catchup_ms`` for ``catchup_tokens``
    unseen tokens fed to the draft (in a draft round that feed also drafted the first token). ``logits``
    float32 (V,) is the target's row at a plain step (None otherwise). ``tree`` is the verified proposal
    (a :class:`~edgespec.core.token_tree.TokenTree`, empty for a plain step) and ``start`` the index L of ``last`` in
    the committed tokens when the round began (what a replay of the verify call needs, :mod:`.evaluate`)."""

    plan: RoundPlan
    tokens: list[int]
    proposer: "Proposer | None" = None
    depths: tuple[int, ...] = ()
    accepted: int = 0
    bonus: bool = False
    draft_ms: float = 0.0
    round_ms: float = 0.0
    draft_step_ms: float | None = None
    catchup_ms: float = 0.0
    catchup_tokens: int = 0
    logits: object = field(default=None, repr=False)
    tree: object = field(default=None, repr=False)
    start: int = -1

    @property
    def proposed(self) -> int:
        """Proposal tokens the target verified (a chain's K actually drafted, a tree's nodes)."""
        return len(self.depths)

    @property
    def size(self) -> int:
        """The proposal's size as the policy measures it: a tree's planned node budget, a chain's K drafted."""
        if self.proposer is not None and self.proposer.tree:
            return self.plan.n_nodes
        return self.proposed


class KPolicy:
    """Chooses each round's :class:`RoundPlan` and learns from its :class:`RoundResult`.

    Subclasses implement :meth:`choose`; the hooks have no-op defaults. ``latency_budget_ms`` (ms or None) is
    reported in the statistics."""

    latency_budget_ms: float | None = None

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
        if o.proposer.tree:
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
