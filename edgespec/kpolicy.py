"""How to draft each round: the source (draft model or prompt lookup) and K.

Fixed, scheduled (tests), or adaptive (see :mod:`.adaptive`). K = 0 means a plain target step.
"""

from __future__ import annotations

from typing import Protocol


class KPolicy(Protocol):
    """Chooses the proposal source and K before a round and learns from its outcome."""

    def choose(self, lookup: int = 0, lag: int = 0, horizon: int | None = None) -> tuple[str, int]:
        """``("draft", K)``, ``("tree", nodes)`` or ``("lookup", K)``; K = 0 is a plain target step;
        ``("catchup", m)`` is a plain target step after which the draft is fed up to m of the tokens it lags.
        Optional hooks the decoder calls when a policy has them: ``begin()`` after the prefill,
        ``end(new_tokens)`` when the answer ends, ``observe_confidence(top1)`` after each plain step with the
        target's top-1 probability.

        ``lookup``: how many tokens prompt lookup can propose now (0: none, or lookup is off); ``lag``: tokens
        the draft must catch up on before it can draft; ``horizon``: new tokens still allowed."""

    def observe(self, source: str, k: int, accepted: int, draft_step_ms: float | None, round_ms: float,
                catchup_ms: float = 0.0, catchup_tokens: int = 0) -> None:
        """A round from ``source`` with draft length ``k`` accepted ``accepted`` tokens; the median time of
        its one-token draft steps (None if it had none), the whole round's wall time, and the time of the
        draft's catch-up feed of ``catchup_tokens`` unseen tokens, in ms (for a draft or tree round that feed
        also drafted the first token; for a ``"catchup"`` round it is the catch-up alone)."""


class FixedK:
    """Always K: from prompt lookup when it has a match (up to K tokens), else from the draft model — a chain
    of K tokens, or with ``tree`` a token tree of K nodes."""

    def __init__(self, k: int, draft: bool = True, tree: bool = False):
        if k < 0:
            raise ValueError(f"k must be ≥ 0, got {k}")
        self.k, self.draft, self.tree = k, draft, tree

    def choose(self, lookup: int = 0, lag: int = 0, horizon: int | None = None) -> tuple[str, int]:
        if lookup:
            return "lookup", min(self.k, lookup)
        return ("tree" if self.tree else "draft"), self.k if self.draft else 0

    def observe(self, source: str, k: int, accepted: int, draft_step_ms: float | None, round_ms: float,
                catchup_ms: float = 0.0, catchup_tokens: int = 0) -> None:
        pass


class KSchedule:
    """K from a list, cycled (forces e.g. [4, 0, 0, 4, 1, 0, 4] in tests); draft model only."""

    def __init__(self, schedule: list[int]):
        self.schedule, self.i = list(schedule), 0

    def choose(self, lookup: int = 0, lag: int = 0, horizon: int | None = None) -> tuple[str, int]:
        k = self.schedule[self.i % len(self.schedule)]
        self.i += 1
        return "draft", k

    def observe(self, source: str, k: int, accepted: int, draft_step_ms: float | None, round_ms: float,
                catchup_ms: float = 0.0, catchup_tokens: int = 0) -> None:
        pass
