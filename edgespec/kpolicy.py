"""How many tokens to draft each round (K). Fixed, scheduled (tests), or adaptive (see :mod:`.adaptive`)."""

from __future__ import annotations

from typing import Protocol


class KPolicy(Protocol):
    """Chooses K before a round and learns from its outcome."""

    def choose(self) -> int:
        """K for the next round (0 = a plain target step)."""

    def observe(self, k: int, accepted: int, draft_ms: float, verify_ms: float) -> None:
        """A round with draft length ``k`` accepted ``accepted`` draft tokens; its draft and target times (ms)."""


class FixedK:
    """Always K."""

    def __init__(self, k: int):
        if k < 0:
            raise ValueError(f"k must be ≥ 0, got {k}")
        self.k = k

    def choose(self) -> int:
        return self.k

    def observe(self, k: int, accepted: int, draft_ms: float, verify_ms: float) -> None:
        pass


class KSchedule:
    """K from a list, cycled (forces e.g. [4, 0, 0, 4, 1, 0, 4] in tests)."""

    def __init__(self, schedule: list[int]):
        self.schedule, self.i = list(schedule), 0

    def choose(self) -> int:
        k = self.schedule[self.i % len(self.schedule)]
        self.i += 1
        return k

    def observe(self, k: int, accepted: int, draft_ms: float, verify_ms: float) -> None:
        pass
