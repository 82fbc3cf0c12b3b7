"""Drafting sources behind one seam (:class:`~edgespec.draft.base.Proposer`), one file each: the draft model as a
chain (:mod:`.chain`) or a tree (:mod:`.tree`), prompt lookup (:mod:`.lookup`) and the suffix tree
(:mod:`.suffix`), and a grammar's forced tokens (:mod:`.grammar`). Importing the package registers them, in
this order: ``draft``, ``tree``, ``lookup``, ``suffix``, ``grammar``. Imports :mod:`edgespec.core` and :mod:`edgespec.io`.
"""

from ..core.round import Proposal
from .base import PROPOSERS, Proposer, register, resolve
from .chain import DraftChain
from .tree import DraftTree
from .lookup import PromptLookup  # noqa: I001  (the registration order is the import order)
from .suffix import SuffixTree
from .grammar import GrammarForced

__all__ = ["PROPOSERS", "DraftChain", "DraftTree", "GrammarForced", "PromptLookup", "Proposal", "Proposer", "SuffixTree", "register",
           "resolve"]
