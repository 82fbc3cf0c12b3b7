"""The round's typed data: what a policy is offered, what it plans, what a proposer proposes, what a round did.

Each round the decoder offers the proposers of the generation (:class:`Offer`: a proposer and how many tokens it
can propose now), the policy (:mod:`edgespec.control.kpolicy`) answers with a :class:`RoundPlan` (which proposer,
draft length K or tree size ``n_nodes``, and a draft catch-up), the proposer returns a :class:`Proposal`, and
after the round both the policy and the statistics consume the same :class:`RoundResult`. ``Proposer`` in the
annotations is :class:`edgespec.draft.base.Proposer` (a layer above: named, not imported).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .token_tree import TokenTree


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
        return self.n_nodes if self.proposer.sized_by_nodes else self.k

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
        if self.proposer is not None and self.proposer.sized_by_nodes:
            return self.plan.n_nodes
        return self.proposed


@dataclass
class Proposal:
    """A proposal to verify. ``tree``: the tokens, parents and q (``tree.q`` empty: a fixed proposal);
    ``draft_rows``: how many leading proposal tokens the draft cache holds in chain order after proposing (kept
    on acceptance; 0 for trees, whose draft rows are dropped). Times in ms: the one-token draft steps, and the
    catch-up feed of ``catchup_tokens`` tokens the draft had not seen (which also drafted the first token)."""

    tree: TokenTree
    draft_rows: int = 0
    draft_step_ms: list[float] = field(default_factory=list)
    catchup_ms: float = 0.0
    catchup_tokens: int = 0
