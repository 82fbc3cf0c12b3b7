"""Suffix drafting: token trees from what followed the current suffix earlier in the conversation or earlier answers.

SuffixDecoding (Oliaro et al. 2024) proposes, at no model cost, a tree of the continuations that followed
earlier occurrences of the text's current suffix, each node scored by how often it was seen (the empirical
probability of reaching it), and verifies the tree in one target run. Repetitive work — code edits that copy
most of a pasted file, agents re-emitting JSON, a chat asked the same thing again — is where it pays.

Here the index is a map from every n-gram (``min_ngram`` to ``max_ngram`` tokens) to the positions that
followed it, over two corpora: the decoder's committed tokens (prompt, conversation, answer so far) and an
archive of earlier conversations of the same decoder (what a reset or a new prompt dropped, up to
``archive_tokens``). The longest suffix found wins; continuations of its most recent occurrences (live ones
first) form a trie of at most the node budget, best-scored nodes first.

Lossless like every proposer: greedy verification follows the target's argmax; when sampling, each node's
children are drawn without replacement from q = the node's continuation frequencies (so the SpecInfer /
Sequoia multi-candidate rule of :func:`~edgespec.core.sampling.accept_candidates` applies exactly).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core.round import Offer, Proposal
from ..core.token_tree import TokenTree, pick_children
from .base import Proposer, register


class SuffixIndex:
    """n-gram → following positions over one token sequence, extended as the sequence grows.

    ``follow[ngram]`` lists (ascending) every position i such that ``tokens[i-n:i] == ngram`` (n = its length)."""

    def __init__(self, min_ngram: int = 2, max_ngram: int = 8):
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.tokens: list[int] = []
        self.follow: dict[tuple[int, ...], list[int]] = defaultdict(list)

    def extend(self, new: list[int]) -> None:
        """Append ``new`` tokens and index the n-grams they complete."""
        for t in new:
            self.tokens.append(int(t))
            i = len(self.tokens)
            for n in range(self.min_ngram, min(self.max_ngram, i) + 1):
                self.follow[tuple(self.tokens[i - n:i])].append(i)

    def continuations(self, suffix: tuple[int, ...], depth: int, limit: int, end: int | None = None):
        """Up to ``limit`` continuations (newest first) of ``depth`` tokens at most that followed ``suffix``,
        from occurrences ending before ``end`` (default: anywhere with something after it)."""
        end = len(self.tokens) if end is None else end
        out = []
        for i in reversed(self.follow.get(suffix, ())):
            if i < end:
                cont = self.tokens[i:min(i + depth, end)]
                if cont and cont[0] >= 0:
                    out.append([t for t in _until_separator(cont)])
                    if len(out) >= limit:
                        break
        return out


def _until_separator(cont: list[int]) -> list[int]:
    """The continuation up to (not including) an archive separator (-1)."""
    return cont[:cont.index(-1)] if -1 in cont else cont


class _DecoderCorpus:
    """The live index of a decoder's committed tokens and the archive of what earlier prompts dropped."""

    def __init__(self, archive_tokens: int):
        self.live = SuffixIndex()
        self.archive = SuffixIndex()
        self.archive_tokens = archive_tokens
        self.last = None  # ((length, last token, cap), result) of the last candidates() call

    def sync(self, tokens: list[int]) -> None:
        """Make the live index hold exactly ``tokens``: extend it, or archive it and start anew when the
        committed tokens no longer extend what it holds (a reset, a new prompt, a rollback)."""
        live = self.live.tokens
        n = len(live)
        if n <= len(tokens) and (n == 0 or (live[-1] == tokens[n - 1] and live[: min(n, 64)] == tokens[: min(n, 64)])):
            self.live.extend(tokens[n:])
            return
        if len(self.archive.tokens) + n > self.archive_tokens:
            self.archive = SuffixIndex()  # bounded: start the archive over rather than grow without end
        self.archive.extend(live + [-1])
        self.live = SuffixIndex()
        self.live.extend(tokens)


@register
@dataclass(frozen=True)
class SuffixTree(Proposer):
    """SuffixDecoding-style proposer (see the module docstring): no model; a tree of ``n_nodes`` at most."""

    max_depth: int = 16
    occurrences: int = 32
    archive_tokens: int = 65536
    name: ClassVar[str] = "suffix"
    sized_by_nodes: ClassVar[bool] = True

    def corpus(self, ctx) -> _DecoderCorpus:
        """The decoder's corpus, kept in its context's ``memory`` (made by the first suffix proposer to ask)."""
        corpus = ctx.memory.get(self.name)
        if corpus is None:
            corpus = ctx.memory[self.name] = _DecoderCorpus(self.archive_tokens)
        return corpus

    def candidates(self, tokens: list[int], cap: int, corpus: _DecoderCorpus | None = None) -> tuple[TokenTree, dict, int]:
        """The scored trie of continuations of the longest matching suffix of ``tokens``, at most ``cap``
        nodes: (tree in breadth-first order, ``{node: {token: count}}`` of each node's children with the root
        as -1, matched suffix length; 0 and an empty tree when nothing matches)."""
        corpus = corpus or _DecoderCorpus(self.archive_tokens)
        key = (len(tokens), tokens[-1] if tokens else None, cap)
        if corpus.last is not None and corpus.last[0] == key and corpus.live.tokens == tokens:
            return corpus.last[1]
        corpus.sync(list(tokens))
        result = TokenTree(), {}, 0
        end = len(tokens)
        for n in range(min(corpus.live.max_ngram, end), corpus.live.min_ngram - 1, -1):
            suffix = tuple(tokens[end - n:])
            conts = corpus.live.continuations(suffix, self.max_depth, self.occurrences, end)
            if len(conts) < self.occurrences:
                conts += corpus.archive.continuations(suffix, self.max_depth, self.occurrences - len(conts))
            if conts:
                result = (*_trie(conts, cap), n)
                break
        corpus.last = (key, result)
        return result

    def offer(self, ctx, cap):
        if cap <= 0:
            return Offer(self, 0)
        tree, _, n = self.candidates(ctx.tokens, cap, self.corpus(ctx))
        return Offer(self, len(tree), n)

    def propose(self, ctx, size, sp, rng) -> Proposal:
        tree, counts, _ = self.candidates(ctx.tokens, size, self.corpus(ctx))
        if not sp.greedy and ctx.coupling is None:  # children drawn from q = the continuation frequencies,
            # without replacement (under a coupling a child is kept iff it is the target's choice: order is moot)
            tree = _resample(tree, counts, ctx.width, sp, rng)
        return Proposal(tree)


def _trie(conts: list[list[int]], budget: int) -> tuple[TokenTree, dict]:
    """A trie of the continuations with counts; its ``budget`` best nodes by score = count / len(conts) (a
    node's score never exceeds its parent's, so the kept nodes form a tree), added breadth-first."""
    nodes: dict[tuple[int, ...], int] = defaultdict(int)
    for c in conts:
        for d in range(1, len(c) + 1):
            nodes[tuple(c[:d])] += 1
    kept = sorted(nodes, key=lambda path: (-nodes[path], len(path)))[:budget]
    kept.sort(key=lambda path: (len(path), -nodes[path]))
    tree, index, counts = TokenTree(), {(): -1}, defaultdict(dict)
    for path in kept:
        parent = index.get(path[:-1])
        if parent is None:
            continue  # its parent fell outside the budget at a tie
        index[path] = tree.add(parent, path[-1])
        counts[parent][path[-1]] = nodes[path]
    return tree, dict(counts)


def _resample(tree: TokenTree, counts: dict, width: int, sp, rng) -> TokenTree:
    """The same trie with each node's children in an order drawn without replacement from q (the children's
    frequencies, float (V,) over the target's vocabulary), and that q recorded for the acceptance rule."""
    out, new_index = TokenTree(), {-1: -1}
    order = sorted(range(len(tree)), key=lambda i: tree.depth[i])
    by_parent: dict[int, list[int]] = defaultdict(list)
    for i in order:
        by_parent[tree.parents[i]].append(i)
    frontier = [-1]
    while frontier:
        nxt = []
        for v in frontier:
            kids = by_parent.get(v, [])
            if not kids:
                continue
            q = np.zeros(width, dtype=np.float64)
            for c in kids:
                q[tree.tokens[c]] = counts[v][tree.tokens[c]]
            q /= q.sum()
            out.q[new_index[v]] = q
            drawn = pick_children(q, len(kids), sp, rng)
            kid_of = {tree.tokens[c]: c for c in kids}
            for x in drawn:
                c = kid_of[x]
                new_index[c] = out.add(new_index[v], x)
                nxt.append(c)
        frontier = nxt
    return _bfs(out)


def _bfs(tree: TokenTree) -> TokenTree:
    """``tree`` renumbered breadth-first (parents before children, as verification and the mask expect)."""
    order = sorted(range(len(tree)), key=lambda i: (tree.depth[i], i))
    new = {-1: -1}
    out = TokenTree()
    for i in order:
        new[i] = out.add(new[tree.parents[i]], tree.tokens[i])
    out.q = {new[v]: q for v, q in tree.q.items()}
    return out
