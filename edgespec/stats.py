"""Generation statistics: returned, never printed."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class GenerationStats:
    """Counters of one generation.

    Invariants: ``accepted ≤ evaluated ≤ proposed`` (draft tokens after the first rejection are never
    evaluated); ``rounds = len(k_per_round)``; ``sum(accepted_per_position) ==
    accepted``; every spec round ends with exactly one correction or one bonus token, and every plain
    step (K = 0) with one target token; so ``new_tokens ≤ 1 + accepted + corrections + bonus + plain_steps``
    (less when a stop token or ``max_new_tokens`` cuts a round short).
    """

    mode: str = "spec"
    prompt_tokens: int = 0
    new_tokens: int = 0
    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    corrections: int = 0
    bonus: int = 0
    plain_steps: int = 0
    lookup_rounds: int = 0
    tree_rounds: int = 0
    lookup_accepted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    proposed_per_position: list[int] = field(default_factory=list)
    k_per_round: list[int] = field(default_factory=list)
    round_ms: list[float] = field(default_factory=list)
    prefill_ms: float = 0.0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    wall_ms: float = 0.0
    stop_reason: str = ""
    latency_budget_ms: float | None = None

    def round_latency(self) -> dict:
        """p50/p95 round time (ms) and, with a latency budget, the share of rounds over it."""
        import numpy as np

        if not self.round_ms:
            return {}
        out = {"round_p50_ms": float(np.percentile(self.round_ms, 50)),
               "round_p95_ms": float(np.percentile(self.round_ms, 95))}
        if self.latency_budget_ms is not None:
            out["share_rounds_over_budget"] = float(np.mean(np.array(self.round_ms) > self.latency_budget_ms))
        return out

    def record_position(self, k: int, n: int) -> None:
        """Count a round that proposed ``k`` and accepted the first ``n`` draft tokens."""
        while len(self.proposed_per_position) < k:
            self.proposed_per_position.append(0)
            self.accepted_per_position.append(0)
        for i in range(k):
            self.proposed_per_position[i] += 1
            self.accepted_per_position[i] += int(i < n)

    @property
    def evaluated(self) -> int:
        """Draft tokens the accept/reject rule looked at: the accepted ones plus one per rejection."""
        return self.accepted + self.corrections

    @property
    def alpha(self) -> float:
        """Acceptance rate alpha in [0, 1]: accepted / evaluated draft tokens, the estimate of Leviathan et
        al.'s per-token acceptance probability (0 when nothing was evaluated)."""
        return self.accepted / self.evaluated if self.evaluated else 0.0

    @property
    def draft_acceptance(self) -> float:
        """Share of drafted tokens that were kept: accepted / proposed, in [0, 1]."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens committed per target run after prefill (accepted + the correction/bonus/plain token)."""
        return (self.new_tokens - 1) / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_s(self) -> float:
        """New tokens per second of wall time, prefill included (tok/s)."""
        return self.new_tokens / (self.wall_ms / 1e3) if self.wall_ms > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first per second after prefill (tok/s)."""
        t = (self.wall_ms - self.prefill_ms) / 1e3
        return (self.new_tokens - 1) / t if t > 0 and self.new_tokens > 1 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(self.round_latency())
        d.update(evaluated=self.evaluated, alpha=self.alpha, draft_acceptance=self.draft_acceptance,
                 mean_accepted_length=self.mean_accepted_length,
                 tokens_per_s=self.tokens_per_s, decode_tokens_per_s=self.decode_tokens_per_s)
        return d
