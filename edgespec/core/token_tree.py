"""Token trees: several candidate continuations drafted at once and verified in ONE target run.

The draft grows a tree level by level within a node budget: a node whose draft distribution q is confident
(top probability ≥ ``confident``) gets one child, an unsure one up to ``branch`` children, and only the
``width`` most probable nodes of a level are expanded further (in the spirit of SpecInfer, Sequoia and EAGLE-2's
dynamic trees). Every node is a verified row: the target sees ``last`` and all nodes with a tree attention
mask (a node attends to the committed prefix and its ancestors) and per-node position ids (prefix length +
depth).

Verification walks from the root. Greedy: follow the child whose token is the target's argmax. Sampling:
children are drawn from q without replacement and checked in order with the multi-candidate rule of
SpecInfer (Miao et al. 2024, multi-step speculative sampling) in its without-replacement form (Sequoia, Chen
et al. 2024): accept child x with probability min(1, p(x)/q(x)); on rejection p ← norm(max(0, p − q)) and
q ← norm(q with x removed); when no child is accepted, sample from the final p. A node without children
samples from p. The emitted tokens follow the target distribution exactly. The walk is :func:`edgespec.core.sampling.verify_tree`;
growing a tree with the draft is :class:`edgespec.draft.DraftTree`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .sampling import SamplingParams


@dataclass(frozen=True)
class TreeShape:
    """Node budget, maximum depth, children of an unsure node, nodes expanded per level, and the top
    probability above which a node is confident (one child)."""

    budget: int = 8
    depth: int = 5
    branch: int = 3
    width: int = 3
    confident: float = 0.8

    @staticmethod
    def for_budget(budget: int) -> "TreeShape":
        """The default shape for a node budget: as deep as the budget (a chain where the draft is confident),
        two children where it is not, two nodes expanded per level."""
        return TreeShape(budget=budget, depth=max(1, min(8, budget)), branch=2, width=2)


@dataclass
class TokenTree:
    """Nodes in breadth-first order; node i has ``tokens[i]``, ``parents[i]`` (-1 = the root, ``last``),
    ``depth[i]`` (≥ 1). ``q[v]`` is the draft distribution float (V,) its children were drawn from (v = -1 for
    the root); ``children[v]`` lists child node indices in draw order."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depth: list[int] = field(default_factory=list)
    q: dict[int, np.ndarray] = field(default_factory=dict)
    children: dict[int, list[int]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def chain(cls, tokens, q_rows=None) -> "TokenTree":
        """A chain: node i is ``tokens[i]`` with parent i − 1; ``q_rows`` float (K, V) (or a list of K rows)
        are the distributions each token was drawn from (None: a fixed proposal, one-hot q)."""
        t = cls()
        for i, x in enumerate(tokens):
            t.add(i - 1, x)
        if q_rows is not None:
            t.q = {i - 1: row for i, row in enumerate(q_rows)}
        return t

    @property
    def is_chain(self) -> bool:
        """Whether every node's parent is the node before it."""
        return all(par == i - 1 for i, par in enumerate(self.parents))

    def add(self, parent: int, token: int) -> int:
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.depth.append(1 if parent < 0 else self.depth[parent] + 1)
        self.children.setdefault(parent, []).append(len(self.tokens) - 1)
        return len(self.tokens) - 1

    def path_tokens(self, v: int) -> list[int]:
        """The tokens from the root down to node ``v`` (v included; [] for the root, v = -1)."""
        out = []
        while v >= 0:
            out.append(self.tokens[v])
            v = self.parents[v]
        return out[::-1]

    def ancestors_mask(self) -> np.ndarray:
        """bool (N+1, N+1): row/column 0 is the root; [i, j] is True iff j is i or an ancestor of i."""
        n = len(self.tokens)
        m = np.zeros((n + 1, n + 1), dtype=bool)
        m[:, 0] = True
        for i in range(n):
            m[i + 1, i + 1] = True
            par = self.parents[i]
            if par >= 0:
                m[i + 1] |= m[par + 1]
        return m


def pick_children(q: np.ndarray, m: int, sp: SamplingParams, rng: np.random.Generator) -> list[int]:
    """``m`` distinct tokens: the top-m of q (greedy) or m draws from q without replacement (Gumbel top-m)."""
    m = min(m, int((q > 0).sum()))
    if m <= 0:
        return []
    if sp.greedy:
        top = np.argpartition(-q, m - 1)[:m]  # O(V), not a full sort of the vocabulary
        return [int(t) for t in top[np.lexsort((top, -q[top]))]]
    support = np.flatnonzero(q > 0)
    keys = np.log(q[support]) + rng.gumbel(size=len(support))
    return [int(support[i]) for i in np.argsort(-keys)[:m]]


def common_prefix(a, b) -> int:
    """The length of the longest common prefix of two token id sequences (the cached rows a new prompt reuses)."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if len(diff) else n
