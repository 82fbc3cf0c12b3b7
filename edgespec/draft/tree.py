"""The draft model as a tree: a token tree grown level by level within a node budget (SpecInfer, Sequoia)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core.round import Proposal
from ..core.sampling import SamplingParams
from ..core.token_tree import TokenTree, TreeShape, pick_children
from .base import Proposer, register


@register
@dataclass(frozen=True)
class DraftTree(Proposer):
    """A token tree grown with the draft within a node budget, one draft run per level (see :mod:`edgespec.core.token_tree`).
    Children are drawn from q when sampling; for greedy from the draft's temperature-1 softmax, so that the
    top-m children and the shape are informed by its uncertainty. Under a Gumbel coupling (seeded sampling) the
    children are the m best tokens of the position's race over q."""

    name: ClassVar[str] = "tree"
    uses_draft: ClassVar[bool] = True
    sized_by_nodes: ClassVar[bool] = True

    def draft_runs(self, size: int) -> int:
        """One draft run per level of the tree shape of ``size`` nodes."""
        return TreeShape.for_budget(size).depth

    def propose(self, ctx, size, sp, rng) -> Proposal:
        shape = TreeShape.for_budget(size)
        sp_tree = SamplingParams(1.0) if sp.greedy else sp
        draft, tokens, coupling = ctx.draft, ctx.tokens, ctx.coupling
        L = len(tokens) - 1
        tree = TokenTree()
        prop = Proposal(tree)
        logits = draft.lead(tokens, prop)  # reads what the draft lags, `last` included
        committed = draft.cache.length  # everything of its view up to and including `last` (L + 1 without a draft prompt)
        frontier, score, slot = [-1], {-1: 1.0}, {}
        for depth in range(1, shape.depth + 1):
            level = []
            for v, row in zip(frontier, logits):
                q = draft.probs(row, sp_tree, tokens, tree.path_tokens(v))  # the prefix, for the processors
                tree.q[v] = q
                m = min(1 if q.max() >= shape.confident else shape.branch, shape.budget - len(tree))
                if coupling is not None:  # the m best of the race at this position (its choice first)
                    kids = coupling.candidates(q, L + depth, m)  # q: sp_tree is sp when sampling
                else:
                    kids = pick_children(q, m, sp, rng)
                for x in kids:
                    c = tree.add(v, x)
                    score[c] = score[v] * q[x]
                    level.append(c)
            if not level or len(tree) >= shape.budget or depth == shape.depth:
                break
            frontier = sorted(level, key=lambda c: -score[c])[:shape.width]
            start = draft.cache.length
            mask = np.zeros((1, 1, len(frontier), start + len(frontier)), dtype=bool)  # bool (1, 1, F, P+F)
            mask[..., :committed] = True
            for j, c in enumerate(frontier):
                a = tree.parents[c]
                while a >= 0:
                    mask[0, 0, j, slot[a]] = True
                    a = tree.parents[a]
                mask[0, 0, j, start + j] = True
                slot[c] = start + j
            pos = np.array([committed - 1 + tree.depth[c] for c in frontier], dtype=np.int64)  # its view's
            t0 = time.perf_counter()
            logits = draft.forward([tree.tokens[c] for c in frontier], pos, mask)
            prop.draft_step_ms.append((time.perf_counter() - t0) * 1e3)
        return prop
