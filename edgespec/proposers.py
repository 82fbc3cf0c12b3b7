"""Drafting sources behind one seam: a proposer turns the committed tokens into a proposal.

A :class:`Proposal` is a token tree (:class:`~edgespec.tree.TokenTree`; a chain is a tree whose parents are
i − 1) with the draft distributions q its tokens were drawn from (none for a fixed proposal such as prompt
lookup or a greedy draft: q is then one-hot on each token). The decoder verifies any proposal with the target
in one run and applies the one acceptance rule of :mod:`.sampling`.

Three proposers ship: :class:`DraftChain` (the draft model, K tokens), :class:`DraftTree` (the draft model, a
token tree of ``n_nodes``) and :class:`PromptLookup` (n-gram match, no model). A new source is one class with
a ``name``, :meth:`Proposer.propose` (and optionally :meth:`Proposer.limit`), registered with
:func:`register`; then ``GenerationOptions(proposers=("<name>",))`` uses it and the adaptive controller
keeps its own estimates for it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from .lookup import ngram_lookup, ngram_match
from .sampling import SamplingParams, sample
from .tree import TokenTree, TreeShape, pick_children

if TYPE_CHECKING:
    from .decoder import SpecDecoder
    from .kpolicy import Offer


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


class Proposer:
    """A drafting source. ``uses_draft``: it runs the draft model (its rounds pay draft steps and the draft's
    catch-up); ``tree``: its size is a node count ``n_nodes`` rather than a draft length K."""

    name: ClassVar[str] = ""
    uses_draft: ClassVar[bool] = False
    tree: ClassVar[bool] = False

    @classmethod
    def from_options(cls, options) -> "Proposer":
        """An instance for a generation's :class:`~edgespec.generation.GenerationOptions`."""
        return cls()

    def limit(self, tokens: list[int], cap: int) -> int:
        """The most tokens this proposer can propose now, at most ``cap`` (0: none)."""
        return cap

    def offer(self, dec: "SpecDecoder", cap: int) -> "Offer":
        """This round's :class:`~edgespec.kpolicy.Offer` after ``dec.tokens``: :meth:`limit`, and a ``match``
        where the proposer knows one."""
        from .kpolicy import Offer

        return Offer(self, self.limit(dec.tokens, cap))

    def propose(self, dec: "SpecDecoder", size: int, sp: SamplingParams, rng: np.random.Generator) -> Proposal:
        """Propose up to ``size`` tokens after ``dec.tokens`` (the last one is ``last``, not yet in the target
        cache). Draft proposers may advance ``dec.dcache``; the decoder rolls it back."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


PROPOSERS: dict[str, type[Proposer]] = {}


def register(cls: type[Proposer]) -> type[Proposer]:
    """Class decorator: make ``cls`` available by its ``name`` in ``GenerationOptions.proposers``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    PROPOSERS[cls.name] = cls
    return cls


def resolve(spec, options) -> Proposer:
    """A proposer from a registered name or an instance.

    Raises:
        ValueError: an unknown name.
    """
    if isinstance(spec, Proposer):
        return spec
    cls = PROPOSERS.get(spec) if isinstance(spec, str) else None
    if cls is None:
        raise ValueError(f"unknown proposer {spec!r} (known: {', '.join(sorted(PROPOSERS))})")
    return cls.from_options(options)


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

    def propose(self, dec, size, sp, rng) -> Proposal:
        feed, drafted, q = dec.tokens[dec.dcache.length:], [], []
        prop = Proposal(TokenTree())
        for i in range(size):
            t0 = time.perf_counter()
            logits = dec.draft.forward(feed, dec.dcache, keep=1)[-1]
            ms = (time.perf_counter() - t0) * 1e3
            if len(feed) == 1:
                prop.draft_step_ms.append(ms)
            else:  # the feed's time includes drafting the first token (one draft step)
                prop.catchup_ms, prop.catchup_tokens = ms, len(feed) - 1
            # `drafted`: the proposal prefix before this row, for the logits processors (processors.py)
            if self.p_min is not None and i > 0 and \
                    dec.draft_probs(logits, SamplingParams(1.0), drafted).max() < self.p_min:
                break
            if sp.greedy:
                drafted.append(dec.draft_argmax(logits, drafted))
            elif dec.coupling is not None:  # the draft's race choice with the target's noise at this position
                drafted.append(dec.coupling.choose(dec.draft_probs(logits, sp, drafted), len(dec.tokens) + i))
            else:
                q.append(dec.draft_probs(logits, sp, drafted))
                drafted.append(sample(q[-1], rng))
            feed = drafted[-1:]
        prop.tree = TokenTree.chain(drafted, q or None)
        prop.draft_rows = len(drafted)
        return prop


@register
@dataclass(frozen=True)
class DraftTree(Proposer):
    """A token tree grown with the draft within a node budget, one draft run per level (see :mod:`.tree`).
    Children are drawn from q when sampling; for greedy from the draft's temperature-1 softmax, so that the
    top-m children and the shape are informed by its uncertainty. Under a Gumbel coupling (seeded sampling) the
    children are the m best tokens of the position's race over q."""

    name: ClassVar[str] = "tree"
    uses_draft: ClassVar[bool] = True
    tree: ClassVar[bool] = True

    def propose(self, dec, size, sp, rng) -> Proposal:
        shape = TreeShape.for_budget(size)
        sp_tree = SamplingParams(1.0) if sp.greedy else sp
        L = len(dec.tokens) - 1
        tree = TokenTree()
        feed = dec.tokens[dec.dcache.length:]
        t0 = time.perf_counter()
        logits = dec.draft.forward(feed, dec.dcache, keep=1)
        ms = (time.perf_counter() - t0) * 1e3
        prop = Proposal(tree)
        if len(feed) == 1:
            prop.draft_step_ms.append(ms)
        else:
            prop.catchup_ms, prop.catchup_tokens = ms, len(feed) - 1
        committed = dec.dcache.length  # = L + 1: everything up to and including `last`
        frontier, score, slot = [-1], {-1: 1.0}, {}
        for depth in range(1, shape.depth + 1):
            level = []
            for v, row in zip(frontier, logits):
                q = dec.draft_probs(row, sp_tree, tree.path_tokens(v))  # the prefix, for the processors
                tree.q[v] = q
                m = min(1 if q.max() >= shape.confident else shape.branch, shape.budget - len(tree))
                if dec.coupling is not None:  # the m best of the race at this position (its choice first)
                    kids = dec.coupling.candidates(q, L + depth, m)  # q: sp_tree is sp when sampling
                else:
                    kids = pick_children(q, m, sp, rng)
                for x in kids:
                    c = tree.add(v, x)
                    score[c] = score[v] * q[x]
                    level.append(c)
            if not level or len(tree) >= shape.budget or depth == shape.depth:
                break
            frontier = sorted(level, key=lambda c: -score[c])[:shape.width]
            start = dec.dcache.length
            mask = np.zeros((1, 1, len(frontier), start + len(frontier)), dtype=bool)  # bool (1, 1, F, P+F)
            mask[..., :committed] = True
            for j, c in enumerate(frontier):
                a = tree.parents[c]
                while a >= 0:
                    mask[0, 0, j, slot[a]] = True
                    a = tree.parents[a]
                mask[0, 0, j, start + j] = True
                slot[c] = start + j
            pos = np.array([L + tree.depth[c] for c in frontier], dtype=np.int64)
            t0 = time.perf_counter()
            logits = dec.draft.forward([tree.tokens[c] for c in frontier], dec.dcache, pos, mask)
            prop.draft_step_ms.append((time.perf_counter() - t0) * 1e3)
        return prop


@register
@dataclass(frozen=True)
class PromptLookup(Proposer):
    """Prompt lookup (see :mod:`.lookup`): the continuation of the longest recent n-gram match; no model, a
    fixed proposal (one-hot q: accepted with probability p(x))."""

    name: ClassVar[str] = "lookup"

    def limit(self, tokens, cap) -> int:
        return len(ngram_lookup(tokens, cap))

    def offer(self, dec, cap):
        from .kpolicy import Offer

        continuation, n = ngram_match(dec.tokens, cap)
        return Offer(self, len(continuation), n)

    def propose(self, dec, size, sp, rng) -> Proposal:
        return Proposal(TokenTree.chain(ngram_lookup(dec.tokens, size)))


from . import suffix  # noqa: E402,F401  (registers "suffix": a proposer is one class plus its registration)
from . import forced  # noqa: E402,F401  (registers "grammar": the forced tokens of a constraint)
