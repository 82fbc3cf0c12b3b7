"""Drafting sources behind one seam (:class:`~edgespec.draft.proposers.Proposer`): the draft model as a chain or a
tree, prompt lookup and the suffix tree. Imports :mod:`edgespec.core` and :mod:`edgespec.io`."""
