"""Logits processors: penalties, logit bias and a grammar's mask, applied to the target's p and the draft's q alike.

A processor is a deterministic function of (the tokens before a position, that position's logits). The decoder
applies the same processors to every target row it verifies and to every draft row it proposes from, with the
history including the proposal prefix up to that row (:func:`process_rows`, ``DraftModel.probs``). The
acceptance rule of :mod:`.sampling` then runs on the processed distributions, so speculative output is
distributed exactly as plain sampling from the processed p (Leviathan et al. 2023 hold for any p and q). A
proposal token the processors forbid has p = 0 and is rejected at once.

Definitions (those of the OpenAI API and vLLM; the repetition penalty of CTRL, Keskar et al. 2019, as in
Hugging Face's ``RepetitionPenaltyLogitsProcessor``):

- ``presence_penalty`` a and ``frequency_penalty`` b: ``logit[t] -= a·[c_t > 0] + b·c_t`` with ``c_t`` the count
  of token t among the *generated* tokens (the prompt does not count);
- ``repetition_penalty`` r: for every token t of the prompt *and* the generated tokens, ``logit[t] /= r`` if it
  is > 0, else ``logit[t] *= r``;
- ``logit_bias``: ``logit[t] += bias[t]``;
- ``constraint``: a grammar (:mod:`.constrain`): ``logit[t] = -inf`` for every token the grammar does not allow
  next (stop tokens allowed once the grammar is complete).

They run in that order, before temperature, top-k and top-p. :func:`token_logprobs` reports ``log softmax`` of
the processed logits (temperature 1) at the emitted tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    from .constrain import Constraint

MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class Processing:
    """A generation's logits processing (``GenerationOptions.processing``); the defaults change nothing.

    ``presence_penalty``/``frequency_penalty`` in [-2, 2], ``repetition_penalty`` > 0 (1: off), ``logit_bias``
    a tuple of ``(token id, bias)`` with bias in [-100, 100], ``constraint`` a
    :class:`~edgespec.core.constrain.Constraint` (JSON schema, any JSON object, tool calls) or None. See the module docstring for the formulas.

    Raises:
        ValueError: a value out of range (named).
    """

    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    constraint: "Constraint | None" = None

    def __post_init__(self):
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not -2 <= v <= 2:
                raise ValueError(f"{name} must be a number in [-2, 2], got {v!r}")
        r = self.repetition_penalty
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not (math.isfinite(r) and r > 0):
            raise ValueError(f"repetition_penalty must be a number > 0, got {r!r}")
        bias = tuple(self.logit_bias.items()) if isinstance(self.logit_bias, dict) else tuple(self.logit_bias)
        for t, b in bias:
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0:
                raise ValueError(f"logit_bias: token ids must be integers ≥ 0, got {t!r}")
            if isinstance(b, bool) or not isinstance(b, (int, float)) or not -100 <= b <= 100:
                raise ValueError(f"logit_bias[{t}] must be a number in [-100, 100], got {b!r}")
        object.__setattr__(self, "logit_bias", tuple((int(t), float(b)) for t, b in bias))

    @property
    def active(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1
                    or self.logit_bias or self.constraint is not None)


class Pipeline:
    """The processors of one generation over rows of width ``width`` (the target's vocabulary). ``start``: the
    prompt's length (tokens from there on are generated). Call it as ``pipeline(history, logits)``: float32
    (V,) → float32 (width,), a new array. Stateful only through the grammar matcher, which follows ``history``
    (rolled back and advanced to it on each call), so it follows the KV cache's rollbacks by itself."""

    def __init__(self, processing: Processing, width: int, start: int, matcher=None):
        self.p, self.width, self.start, self.matcher = processing, width, start, matcher
        bad = [t for t, _ in processing.logit_bias if t >= width]
        if bad:
            raise ValueError(f"logit_bias: token id {bad[0]} is not a token id (ids are 0..{width - 1})")
        self.bias = None
        if processing.logit_bias:
            self.bias = np.zeros(width, dtype=np.float32)
            for t, b in processing.logit_bias:
                self.bias[t] += b

    def __call__(self, history: Sequence[int], logits: np.ndarray) -> np.ndarray:
        z = np.asarray(logits, dtype=np.float32)[:self.width].copy()
        if z.shape[0] < self.width:
            z = np.concatenate([z, np.full(self.width - z.shape[0], -np.inf, dtype=np.float32)])
        p = self.p
        if p.repetition_penalty != 1 and len(history):
            seen = np.unique(np.asarray(history, dtype=np.int64))
            seen = seen[seen < self.width]
            v = z[seen]
            z[seen] = np.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
        if (p.presence_penalty or p.frequency_penalty) and len(history) > self.start:
            gen = np.asarray(history[self.start:], dtype=np.int64)
            ids, counts = np.unique(gen[gen < self.width], return_counts=True)
            z[ids] -= p.presence_penalty + p.frequency_penalty * counts.astype(np.float32)
        if self.bias is not None:
            z += self.bias
        if self.matcher is not None:
            allowed = self.matcher.allowed(history[self.start:])
            if allowed is not None:  # None: the history left the grammar (a rejected proposal's later rows)
                z[~allowed] = -np.inf
        return z


def pipeline_for(processing: Processing | None, tokenizer, width: int, stop_ids, start: int) -> Pipeline | None:
    """A generation's pipeline for a prompt of ``start`` tokens (None: nothing to apply); a constraint gets its
    grammar matcher (:class:`~edgespec.core.constrain.Matcher`). Raises ValueError as :class:`Pipeline` and the
    matcher do."""
    if processing is None or not processing.active:
        return None
    matcher = None
    if processing.constraint is not None:
        from .constrain import Matcher

        matcher = Matcher(processing.constraint, tokenizer, width, stop_ids)
    return Pipeline(processing, width, start, matcher)


def process_rows(pipeline: Pipeline, tokens: Sequence[int], tree, logits: np.ndarray) -> np.ndarray:
    """The target's verify rows processed: float32 (N+1, V) → float32 (N+1, width). Row 0 follows ``tokens``
    (the committed tokens, ``last`` included); row i+1 follows ``tokens`` + the path to proposal node i."""
    out = np.empty((logits.shape[0], pipeline.width), dtype=np.float32)
    out[0] = pipeline(tokens, logits[0])
    paths: dict[int, list[int]] = {-1: []}
    for i in range(len(tree)):  # parents come before children (breadth-first order)
        paths[i] = paths[tree.parents[i]] + [tree.tokens[i]]
        out[i + 1] = pipeline(list(tokens) + paths[i], logits[i + 1])
    return out


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token's ``logprob`` (natural log, ≤ 0) under the processed target distribution at
    temperature 1, and the ``top`` alternatives as ``(token id, logprob)``, most likely first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(rows: np.ndarray, tokens: Sequence[int], top_n: int) -> list[TokenLogprob]:
    """``log softmax`` of each row float32 (n, V) at its token, with the ``top_n`` (0..20) most likely ids."""
    out = []
    for row, t in zip(np.asarray(rows, dtype=np.float64), tokens):
        m = row.max()
        lse = m + math.log(np.exp(row - m).sum())
        top: tuple = ()
        if top_n > 0:
            idx = np.argpartition(-row, top_n - 1)[:top_n]
            idx = idx[np.argsort(-row[idx], kind="stable")]
            top = tuple((int(i), float(row[i] - lse)) for i in idx)
        out.append(TokenLogprob(int(t), float(row[t] - lse), top))
    return out
