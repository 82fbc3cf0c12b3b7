"""The draft model of a decoder: its graph and KV cache, its vocabulary map onto the target's ids, the running
generation's draft-side logits processing, its catch-up and its rollback.

Proposers that draft (:mod:`.chain`, :mod:`.tree`) reach it through their context
(:attr:`~edgespec.draft.base.DraftContext.draft`); the decoder rolls it back with :meth:`DraftModel.keep` and
catches it up with :meth:`DraftModel.catch_up`, each at one place of the round. Its cache holds positions
0..Ld-1 of its *view* of the committed tokens (:meth:`DraftModel.view`) with Ld ≤ its view's L: it lags after
plain steps, rounds of other proposers or full acceptance, and reads what it lags in the first feed of its next
proposal (:meth:`lead`).

The view is the committed tokens themselves, or, for a generation given a draft prompt
(:meth:`DraftModel.set_prompt`), that prompt in place of the target's prompt, followed by every token after it:
e.g. a fill-in-the-middle prompt cut to the code around the cursor, which the draft reads in a fraction of the
time. Losslessness does not depend on what the draft reads: the accept/reject rule (Leviathan et al. 2023,
Alg. 1; Chen et al. 2023, Alg. 2) takes any q, as long as q is the distribution the proposal was drawn from,
which it is here; only the acceptance rate alpha changes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

import numpy as np

from typing import TYPE_CHECKING

from ..core.round import Proposal
from ..core.sampling import SamplingParams, probs
from ..core.token_tree import common_prefix

if TYPE_CHECKING:  # annotations only: importing the drafting package needs no onnxruntime
    from ..core.processors import Pipeline
    from ..io.onnx_model import OnnxLM


class DraftModel:
    """The draft LM ``lm`` with its ``cache``; q and the greedy token are over the target's ``width`` ids.

    ``kept_ids`` int64 (N,): the target ids of a pruned draft head's N outputs (None: the head is the target's
    vocabulary, truncated to ``width``). ``processor``: the running generation's logits processors (the target's
    own, :mod:`edgespec.core.processors`), or None; the decoder sets it for a generation's duration."""

    def __init__(self, lm: OnnxLM, width: int, kept_ids: np.ndarray | None = None):
        self.lm, self.width, self.kept_ids = lm, int(width), kept_ids
        self.processor: Pipeline | None = None
        self.cache = lm.new_cache()
        # (the draft's prompt, the target's prompt) of the running view, or None: the view is the committed tokens
        self.prompts: tuple[list[int], list[int]] | None = None

    @classmethod
    def load(cls, lm: OnnxLM, width: int) -> "DraftModel":
        """The draft of an export: a pruned head's ``kept_token_ids`` file is read from the export."""
        kept = None
        if lm.spec.kept_token_ids:
            kept = np.load(Path(lm.export_dir) / lm.spec.kept_token_ids).astype(np.int64)
        return cls(lm, width, kept)

    def reset(self) -> None:
        """An empty cache; the view is the committed tokens."""
        self.cache = self.lm.new_cache()
        self.prompts = None

    def view(self, tokens: Sequence[int]) -> list[int] | Sequence[int]:
        """What the draft reads for the committed ``tokens`` (which start with the target's prompt while a
        draft prompt is set): the draft prompt + ``tokens`` after the target's prompt, else ``tokens``."""
        if self.prompts is None:
            return tokens
        mine, theirs = self.prompts
        return mine + list(tokens[len(theirs):])

    def _unread(self, tokens: Sequence[int]) -> list[int] | Sequence[int]:
        """Its view of ``tokens`` from its cache's length on (what it has not read; the view itself is not
        built: :meth:`lead`, :meth:`catch_up` and :meth:`lag` run every round)."""
        start = self.cache.length
        if self.prompts is None:
            return tokens[start:]
        mine, theirs = self.prompts
        if start >= len(mine):
            return tokens[len(theirs) + start - len(mine):]
        return mine[start:] + list(tokens[len(theirs):])

    def lag(self, tokens: Sequence[int]) -> int:
        """How many tokens of its view of ``tokens`` the draft has not read (``last`` included)."""
        shift = 0 if self.prompts is None else len(self.prompts[0]) - len(self.prompts[1])
        return len(tokens) + shift - self.cache.length

    def set_prompt(self, old_tokens: Sequence[int], prompt: Sequence[int],
                   draft_prompt: Sequence[int] | None = None) -> None:
        """Start a generation from ``prompt`` (int token ids; the draft reads ``draft_prompt`` in its place,
        or the prompt itself when None). The cache keeps what it holds of its view of ``old_tokens`` (the
        committed tokens until now) that the new view shares, at most all of it but its last token.

        Raises:
            ValueError: ``draft_prompt`` empty or longer than ``prompt`` (its view would outgrow the target's
                tokens, and the draft cache the context); nothing changes then.
        """
        if draft_prompt is not None and not 0 < len(draft_prompt) <= len(prompt):
            raise ValueError(f"a draft prompt needs 1..{len(prompt)} tokens, got {len(draft_prompt)}")
        old = self.view(old_tokens)
        self.prompts = (list(draft_prompt), list(prompt)) if draft_prompt is not None else None
        new = self.view(prompt)
        self.cache.crop(min(common_prefix(old, new), self.cache.length, len(new) - 1))

    def keep(self, n: int) -> None:
        """Roll back: keep at most the draft's positions of the first ``n`` committed tokens, of which the
        decoder keeps at least ``n`` + 1 (``last`` is never cached: :meth:`SpecDecoder.rewind_to` to the prompt
        keeps its len - 1). Once fewer than the target's whole prompt stay committed, a draft prompt no longer
        applies: the view becomes the committed tokens and the cache keeps what the two prompts share of those
        ``n``."""
        if self.prompts is not None:
            mine, theirs = self.prompts
            if n + 1 < len(theirs):
                self.prompts = None
                n = common_prefix(mine, theirs[:n])
            else:
                n += len(mine) - len(theirs)
        self.cache.crop(min(self.cache.length, n))

    def forward(self, ids, positions: np.ndarray | None = None, mask: np.ndarray | None = None,
                keep: int = 0) -> np.ndarray:
        """The draft's logits float32 (T or ``keep``, V_d) for ``ids`` after its cache (appended to it); see
        :meth:`~edgespec.io.onnx_model.OnnxLM.forward`."""
        return self.lm.forward(ids, self.cache, positions, mask, keep=keep)

    def lead(self, tokens: Sequence[int], prop: Proposal) -> np.ndarray:
        """A proposal's first feed: the committed ``tokens`` the draft has not read, ``last`` included; returns
        the last row's logits float32 (1, V_d). Its time (ms) goes to ``prop``: a one-token feed is a draft step,
        a longer one the catch-up of all but one token (which also drafted the first token); a catch-up of
        ≥ 64 rows runs on the draft's int8 prefill graph where the export has one (``--draft-prefill-int8``)."""
        feed = self._unread(tokens)
        t0 = time.perf_counter()
        logits = self.lm.forward(feed, self.cache, keep=1, prefill=True)
        ms = (time.perf_counter() - t0) * 1e3
        if len(feed) == 1:
            prop.draft_step_ms.append(ms)
        else:
            prop.catchup_ms, prop.catchup_tokens = ms, len(feed) - 1
        return logits

    def catch_up(self, tokens: Sequence[int], m: int) -> tuple[float, int]:
        """Feed up to ``m`` of the committed ``tokens`` the draft has not read, the newest excluded (it stays
        for the next proposal's first feed; ≥ 64 of them on the int8 prefill graph, as :meth:`lead`); returns
        (ms, tokens fed)."""
        unread = self._unread(tokens)
        feed = unread[:min(m, len(unread) - 1)]
        t0 = time.perf_counter()
        if feed:
            self.lm.forward(feed, self.cache, keep=1, prefill=True)
        return (time.perf_counter() - t0) * 1e3, len(feed)

    def probs(self, logits: np.ndarray, sp: SamplingParams, tokens: Sequence[int] = (), prefix=()) -> np.ndarray:
        """q float64 (V,) over the target's vocabulary from draft logits float32 (V_d,): a pruned head maps
        back, q = 0 outside; a head wider than the target's vocabulary is truncated. The processors see the
        committed ``tokens`` + ``prefix`` (the proposal tokens before this row), as for the target's row."""
        if self.processor is not None:
            return probs(self._processed(logits, tokens, prefix), sp)
        if self.kept_ids is None:
            return probs(logits, sp, self.width)
        q = np.zeros(self.width, dtype=np.float64)
        q[self.kept_ids] = probs(logits, sp)
        return q

    def argmax(self, logits: np.ndarray, tokens: Sequence[int] = (), prefix=()) -> int:
        """The draft's greedy token as a target id (ids the target cannot take are out); ``tokens`` and
        ``prefix`` as for :meth:`probs`."""
        if self.processor is not None:
            return int(np.argmax(self._processed(logits, tokens, prefix)))
        best = int(np.argmax(logits if self.kept_ids is not None else logits[:self.width]))
        return int(self.kept_ids[best]) if self.kept_ids is not None else best

    def _processed(self, logits: np.ndarray, tokens: Sequence[int], prefix) -> np.ndarray:
        """Draft logits float32 (V_d,) on the target's ids (-inf where a pruned head has none), processed."""
        if self.kept_ids is not None:
            full = np.full(self.width, -np.inf, dtype=np.float32)
            full[self.kept_ids] = logits
            logits = full
        return self.processor(list(tokens) + list(prefix), logits)
