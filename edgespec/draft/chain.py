"""The draft model as a chain: K tokens drafted one at a time (Leviathan et al. 2023)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

from ..core.round import Proposal
from ..core.sampling import SamplingParams, sample
from ..core.token_tree import TokenTree
from .base import Proposer, register


@register
@dataclass(frozen=True, repr=True)
class DraftChain(Proposer):
    """Up to K tokens sampled autoregressively from the draft's q (under a Gumbel coupling: the race choice of
    q at each position, :mod:`.coupling`); feeds first what the draft has not seen.

    With ``p_min``, drafting stops early (after at least one token) once the draft's top probability
    (temperature 1) falls below it, like llama.cpp's ``--draft-p-min``; lossless, as K is then chosen from the
    draft's own outputs only. Greedy proposals are the draft's argmax (a fixed proposal: q one-hot)."""

    p_min: float | None = None
    name: ClassVar[str] = "draft"
    uses_draft: ClassVar[bool] = True

    @classmethod
    def from_options(cls, options) -> "DraftChain":
        return cls(options.draft_p_min)

    def propose(self, ctx, size, sp, rng) -> Proposal:
        draft, tokens, drafted, q = ctx.draft, ctx.tokens, [], []
        prop = Proposal(TokenTree())
        for i in range(size):
            if i == 0:  # the first feed reads what the draft lags; its time includes drafting the first token
                logits = draft.lead(tokens, prop)[-1]
            else:
                t0 = time.perf_counter()
                logits = draft.forward(drafted[-1:], keep=1)[-1]
                prop.draft_step_ms.append((time.perf_counter() - t0) * 1e3)
            # `drafted`: the proposal prefix before this row, for the logits processors (processors.py)
            if self.p_min is not None and i > 0 and \
                    draft.probs(logits, SamplingParams(1.0), tokens, drafted).max() < self.p_min:
                break
            if sp.greedy:
                drafted.append(draft.argmax(logits, tokens, drafted))
            elif ctx.coupling is not None:  # the draft's race choice with the target's noise at this position
                drafted.append(ctx.coupling.choose(draft.probs(logits, sp, tokens, drafted), len(tokens) + i))
            else:
                q.append(draft.probs(logits, sp, tokens, drafted))
                drafted.append(sample(q[-1], rng))
        prop.tree = TokenTree.chain(drafted, q or None)
        prop.draft_rows = len(drafted)
        return prop
