"""The drafting seam: a proposer turns the committed tokens into a proposal; the registry of proposers by name.

A :class:`~edgespec.core.round.Proposal` is a token tree (:class:`~edgespec.core.token_tree.TokenTree`; a chain
is a tree whose parents are i − 1) with the draft distributions q its tokens were drawn from (none for a fixed
proposal such as prompt lookup or a greedy draft: q is then one-hot on each token). The decoder verifies any
proposal with the target in one run and applies the one acceptance rule of :mod:`edgespec.core.sampling`.

Four proposers ship, one file each: :class:`~.chain.DraftChain` (the draft model, K tokens),
:class:`~.tree.DraftTree` (the draft model, a token tree of ``n_nodes``), :class:`~.lookup.PromptLookup` (n-gram
match, no model) and :class:`~.suffix.SuffixTree` (SuffixDecoding, no model). A new source is one class with a
``name`` and :meth:`Proposer.propose`, registered with :func:`register`; then
``GenerationOptions(proposers=("<name>",))`` uses it and the adaptive controller keeps its own estimates for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Sequence

import numpy as np

from ..core.round import Offer, Proposal
from ..core.sampling import SamplingParams

if TYPE_CHECKING:
    from ..core.coupling import GumbelCoupling
    from ..core.processors import Pipeline
    from .model import DraftModel


@dataclass(frozen=True)
class DraftContext:
    """What a proposer sees of its decoder in a round.

    ``tokens``: the committed tokens, read-only (the last one is ``last``, not yet in the target's cache);
    ``width``: the target's vocabulary width V (a q is float64 (V,)); ``draft``: the
    :class:`~edgespec.draft.model.DraftModel` (None: a decoder loaded without its draft); ``coupling``: the
    running generation's Gumbel coupling (:mod:`edgespec.core.coupling`), or None; ``memory``: a dict that lives
    as long as the decoder, where a proposer keeps its own state across rounds and generations under its
    ``name`` (the suffix tree's corpus); ``processor``: the running generation's logits processors
    (:class:`~edgespec.core.processors.Pipeline`: penalties, logit bias, a grammar's mask), or None (the grammar
    proposer reads its constraint's forced tokens there)."""

    tokens: Sequence[int]
    width: int
    draft: "DraftModel | None" = None
    coupling: "GumbelCoupling | None" = None
    memory: dict = field(default_factory=dict)
    processor: "Pipeline | None" = None


class _FormerName:
    """A read-only alias of a class attribute under its former name, on the class and on instances."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, obj, owner=None):
        return getattr(owner if obj is None else obj, self.name)


class Proposer:
    """A drafting source. ``uses_draft``: it runs the draft model (its rounds pay draft steps and the draft's
    catch-up); ``sized_by_nodes``: its size is a node count ``n_nodes`` (it proposes branching trees) rather
    than a draft length K. (The flag was called ``tree``; a subclass that still sets ``tree`` is read the same.)"""

    name: ClassVar[str] = ""
    uses_draft: ClassVar[bool] = False
    sized_by_nodes: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if isinstance(cls.__dict__.get("tree"), bool):
            cls.sized_by_nodes = cls.__dict__["tree"]

    tree = _FormerName("sized_by_nodes")

    @classmethod
    def from_options(cls, options) -> "Proposer":
        """An instance for a generation's :class:`~edgespec.engine.generation.GenerationOptions`."""
        return cls()

    def limit(self, tokens: list[int], cap: int) -> int:
        """The most tokens this proposer can propose now, at most ``cap`` (0: none)."""
        return cap

    def draft_runs(self, size: int) -> int:
        """How many draft-model runs a proposal of ``size`` costs (the cost model's draft term): K for a draft
        chain, 0 for a proposer without a model."""
        return size if self.uses_draft else 0

    def offer(self, ctx: DraftContext, cap: int) -> Offer:
        """This round's :class:`~edgespec.core.round.Offer` after ``ctx.tokens``: :meth:`limit`, and a ``match``
        where the proposer knows one."""
        return Offer(self, self.limit(ctx.tokens, cap))

    def propose(self, ctx: DraftContext, size: int, sp: SamplingParams, rng: np.random.Generator) -> Proposal:
        """Propose up to ``size`` ≥ 1 tokens after ``ctx.tokens``. Draft proposers advance ``ctx.draft``'s cache
        (reading first what it lags, :meth:`~edgespec.draft.model.DraftModel.lead`) and say in
        ``Proposal.draft_rows`` how many of its new rows are the proposal's chain; the decoder rolls it back."""
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
