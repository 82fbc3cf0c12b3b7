"""Prompt lookup (n-gram) drafting: propose what followed the latest earlier occurrence of the current suffix.

No draft model: the proposal is the continuation of the longest recent n-gram match in the prompt and the
output so far (Saxena 2023, "prompt lookup decoding"; llama.cpp's lookup decoding). Its q is one-hot on the
proposed token, so the accept/reject rule accepts it with probability p(x) and on rejection samples from p
with x removed, which keeps the target distribution exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core.round import Offer, Proposal
from ..core.token_tree import TokenTree
from .base import Proposer, register


def ngram_lookup(tokens: list[int], k: int, max_ngram: int = 4, min_ngram: int = 2,
                 window: int = 4096) -> list[int]:
    """Up to ``k`` token ids continuing the longest suffix n-gram (``max_ngram`` down to ``min_ngram``) of
    ``tokens`` that also occurs earlier in the last ``window`` tokens; the most recent occurrence wins.
    Returns [] when there is no match."""
    return ngram_match(tokens, k, max_ngram, min_ngram, window)[0]


def ngram_match(tokens: list[int], k: int, max_ngram: int = 4, min_ngram: int = 2,
                window: int = 4096) -> tuple[list[int], int]:
    """:func:`ngram_lookup`'s continuation and the length n of the matched suffix n-gram (0: no match): a
    longer match predicts a longer accepted run, so the adaptive controller tracks acceptance per n."""
    if k <= 0 or len(tokens) <= min_ngram:
        return [], 0
    arr = np.asarray(tokens[-window:], dtype=np.int64)
    n_tok = len(arr)
    for n in range(min(max_ngram, n_tok - 1), min_ngram - 1, -1):
        suffix = arr[n_tok - n:]
        # candidate starts s with arr[s:s+n] == suffix and s + n < n_tok (something follows it)
        starts = np.flatnonzero(arr[: n_tok - n] == suffix[0])
        for s in starts[::-1]:
            if s + n < n_tok and np.array_equal(arr[s:s + n], suffix):
                return arr[s + n: s + n + k].tolist(), n
    return [], 0


@register
@dataclass(frozen=True)
class PromptLookup(Proposer):
    """Prompt lookup (see the module docstring): the continuation of the longest recent n-gram match; no model, a
    fixed proposal (one-hot q: accepted with probability p(x))."""

    name: ClassVar[str] = "lookup"

    def offer(self, ctx, cap):
        continuation, n = ngram_match(ctx.tokens, cap)
        return Offer(self, len(continuation), n)

    def propose(self, ctx, size, sp, rng) -> Proposal:
        return Proposal(TokenTree.chain(ngram_lookup(ctx.tokens, size)))
