"""Generation statistics: returned, never printed (:func:`format_stats` makes the one-line summary the CLI
prints)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class ProposerStats:
    """Counters of one proposer over a generation: rounds, tokens proposed and accepted, and the time spent
    proposing (``draft_ms``) and in its whole rounds (``round_ms``), in ms."""

    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    draft_ms: float = 0.0
    round_ms: float = 0.0


@dataclass
class GenerationStats:
    """Counters of one generation.

    Invariants: ``accepted ≤ evaluated ≤ proposed`` (draft tokens after the first rejection are never
    evaluated); ``rounds = len(k_per_round)``; ``sum(accepted_per_position) ==
    accepted``; every spec round ends with exactly one correction or one bonus token, and every plain
    step (K = 0) with one target token; so ``new_tokens ≤ 1 + accepted + corrections + bonus + plain_steps``
    (less when a stop token or ``max_new_tokens`` cuts a round short). A round cut short counts only what it
    emitted (the stop token included): the proposal positions up to the cut, the accepted tokens among them,
    and its correction or bonus token only if that was emitted. ``proposers`` holds per-proposer counters.
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
    proposers: dict[str, ProposerStats] = field(default_factory=dict)
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
    provider: str = ""  # the execution provider the target ran on
    coupling: str = ""  # how tokens were chosen: "greedy", "standard" (accept/reject) or "gumbel" (seeded)
    draft_prompt_tokens: int | None = None  # tokens of the draft's own prompt (draft_prompt); None: the prompt's
    # with GenerationOptions.logprobs: one processors.TokenLogprob per emitted token (not in to_dict)
    token_logprobs: list = field(default_factory=list, repr=False)

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

    def record_round(self, r, emitted: int) -> None:
        """Count a finished round (:class:`~edgespec.core.round.RoundResult`) of which the first ``emitted`` tokens
        were used (fewer than ``len(r.tokens)`` when a stop token or ``max_new_tokens`` cut it)."""
        self.rounds += 1
        self.round_ms.append(r.round_ms)
        self.draft_ms += r.draft_ms
        self.verify_ms += r.round_ms - r.draft_ms
        if r.proposer is None:
            self.plain_steps += 1
            self.k_per_round.append(0)
            return
        cut = emitted < len(r.tokens)  # then inside the accepted tokens: positions past the cut never counted
        accepted = min(r.accepted, emitted)
        proposed = sum(d <= emitted for d in r.depths) if cut else len(r.depths)
        depth = min(max(r.depths), emitted) if cut else max(r.depths)
        self.proposed += proposed
        self.accepted += accepted
        self.k_per_round.append(proposed)
        if not cut:  # the round's last token (correction or bonus) was emitted
            self.bonus += int(r.bonus)
            self.corrections += int(not r.bonus)
        self.record_position(depth, accepted)
        ps = self.proposers.setdefault(r.proposer.name, ProposerStats())
        ps.rounds += 1
        ps.proposed += proposed
        ps.accepted += accepted
        ps.draft_ms += r.draft_ms
        ps.round_ms += r.round_ms

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
        d.pop("token_logprobs")
        d.update(self.round_latency())
        d.update(evaluated=self.evaluated, alpha=self.alpha, draft_acceptance=self.draft_acceptance,
                 mean_accepted_length=self.mean_accepted_length,
                 tokens_per_s=self.tokens_per_s, decode_tokens_per_s=self.decode_tokens_per_s)
        return d


def format_stats(s: GenerationStats) -> str:
    """One line: tokens, tok/s, alpha, mean accepted length, K, timings."""
    line = f"[{s.new_tokens} tokens, {s.tokens_per_s:.2f} tok/s, prefill {s.prefill_ms:.0f} ms"
    if s.mode != "plain":
        ks = s.k_per_round
        line += (f", alpha {s.alpha:.2f}, {s.mean_accepted_length:.2f} tokens/round, "
                 f"mean K {sum(ks) / max(len(ks), 1):.1f}, draft {s.draft_ms:.0f} ms, verify {s.verify_ms:.0f} ms")
    if s.latency_budget_ms is not None and s.round_ms:
        r = s.round_latency()
        line += (f", rounds p50/p95 {r['round_p50_ms']:.0f}/{r['round_p95_ms']:.0f} ms vs budget "
                 f"{s.latency_budget_ms:g} ms ({100 * r['share_rounds_over_budget']:.0f}% over)")
    return line + "]"
