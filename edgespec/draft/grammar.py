"""Grammar drafting: propose the tokens a constraint forces (a property name, a closing brace), at no model cost.

Under a grammar (:mod:`edgespec.core.constrain`: a JSON schema, a tool call) many positions allow a single token. The
``grammar`` proposer proposes the run of such tokens after the committed ones
(:meth:`~edgespec.core.constrain.Matcher.forced`) as a fixed proposal (q one-hot, like prompt lookup). The mask is
applied to the target's rows too (:mod:`edgespec.core.processors`), so each forced token has p = 1 there and is accepted
with probability 1 by the acceptance rule of :mod:`edgespec.core.sampling` (greedy: it is the masked argmax; a Gumbel
coupling: the race over a one-hot p picks it): the run costs verified rows instead of target steps, and the
output distribution is unchanged (Leviathan et al. 2023 hold for any q).

It offers nothing (limit 0) without a constraint or when the next position has a choice, so the adaptive
controller (:mod:`edgespec.control.adaptive`) weighs it like prompt lookup: a model-free offer of ``limit`` tokens.
:func:`with_grammar` puts it first among a generation's proposers when a constraint is set (what
``SpecDecoder.proposers_for`` does for every speculative generation under a constraint).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..core.round import Offer, Proposal
from ..core.token_tree import TokenTree
from .base import DraftContext, Proposer, register


def forced_tokens(ctx: DraftContext, cap: int) -> list[int]:
    """The tokens the running generation's grammar forces after ``ctx.tokens`` (at most ``cap``); [] without a
    grammar constraint."""
    pipe = ctx.processor
    matcher = getattr(pipe, "matcher", None)
    if matcher is None or cap <= 0:
        return []
    return matcher.forced(ctx.tokens[pipe.start:], cap)


@register
@dataclass(frozen=True)
class GrammarForced(Proposer):
    """The grammar's forced tokens after the committed ones (see the module docstring); no model, a fixed
    proposal (one-hot q), always accepted."""

    name: ClassVar[str] = "grammar"

    def offer(self, ctx: DraftContext, cap: int) -> Offer:
        return Offer(self, len(forced_tokens(ctx, cap)))

    def propose(self, ctx: DraftContext, size: int, sp, rng) -> Proposal:
        return Proposal(TokenTree.chain(forced_tokens(ctx, size)))


def with_grammar(proposers: list[Proposer], processing) -> list[Proposer]:
    """``proposers`` with :class:`GrammarForced` first when ``processing`` sets a constraint and the generation
    speculates (``proposers`` not empty: plain decoding stays plain); unchanged otherwise or when it is in them
    already."""
    if not proposers or processing is None or processing.constraint is None:
        return proposers
    if any(p.name == GrammarForced.name for p in proposers):
        return proposers
    return [GrammarForced()] + list(proposers)
