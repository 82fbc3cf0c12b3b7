"""What a generation is asked to do (:class:`GenerationOptions`), how it runs (:func:`run_rounds`, the emission
loop, and :func:`plan_round`), and a running one (:class:`Generation`, streaming text)."""

from __future__ import annotations

import reprlib
import time
from dataclasses import dataclass, fields
from typing import Iterator

import numpy as np

from ..control.kpolicy import KPolicy
from ..core.coupling import GumbelCoupling
from ..core.processors import MAX_TOP_LOGPROBS, Processing
from ..core.round import RoundPlan, Situation
from ..core.sampling import SamplingParams, top1_probability
from ..core.stats import GenerationStats
from ..draft import PROPOSERS, Proposer
from ..io.text import IncrementalDetokenizer

COUPLINGS = ("auto", "gumbel", "standard")
DEFAULT_K = 4  # the draft length K of a fixed-K generation without its own (GenerationOptions.k, --k, bench)


@dataclass(frozen=True)
class GenerationOptions:
    """One generation's settings, validated on construction.

    ``proposers``: drafting sources in priority order, by registered name (``"draft"``: the draft model's
    chain, ``"tree"``: its token trees, ``"lookup"``: prompt lookup; see :mod:`.proposers`) or as
    :class:`~edgespec.draft.Proposer` instances; ``()`` is plain decoding with the target alone. Without a
    K policy, each round drafts a fixed ``k`` tokens (K, the draft length) or, from a tree proposer, a tree of
    ``n_nodes``. ``draft_p_min`` stops a draft chain once the draft's top probability falls below it.
    ``temperature`` 0 is greedy; ``top_k`` 0 and ``top_p`` 1 are off. ``processing``
    (:class:`~edgespec.core.processors.Processing`: penalties, logit bias, a grammar constraint) changes the logits of
    the target and the draft alike before sampling; under its grammar constraint a speculative generation also
    proposes the grammar's forced tokens, first (``"grammar"``, :mod:`edgespec.draft.grammar`). ``logprobs``
    (None: off; 0..20) records each emitted token's logprob and that many alternatives in ``stats.token_logprobs``.
    ``draft_prompt`` (int token ids, at most as many as the prompt; None: the prompt): what the draft model reads
    in place of the prompt, e.g. a fill-in-the-middle prompt cut to the code around the cursor
    (:func:`edgespec.apps.fim.build_draft_ids`); the output's distribution is the target's either way
    (:mod:`edgespec.draft.model`), only alpha and the draft's catch-up change.

    ``coupling`` picks the sampling rule (greedy ignores it): ``"gumbel"`` is drafter-invariant seeded sampling
    (:mod:`.coupling`: the output depends only on the seed and the target, never on K, the proposers or the
    cache), ``"standard"`` the accept/reject rule of Leviathan et al. 2023 (:mod:`.sampling`: the same
    distribution, but the random stream, and so the text, follows what speculation did); ``"auto"`` (default)
    is ``"gumbel"`` when a ``seed`` is given and ``"standard"`` without one. ``"gumbel"`` without a seed draws one.

    Raises:
        ValueError: an invalid value (named in the message).
    """

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    proposers: tuple = ("draft",)
    k: int = DEFAULT_K
    n_nodes: int = 8
    draft_p_min: float | None = None
    coupling: str = "auto"
    processing: Processing | None = None
    logprobs: int | None = None
    draft_prompt: tuple[int, ...] | None = None

    def __post_init__(self):
        if isinstance(self.proposers, (str, Proposer)) or not hasattr(self.proposers, "__iter__"):
            raise ValueError(f"proposers must be a tuple of names or Proposer instances, got {self.proposers!r}")
        object.__setattr__(self, "proposers", tuple(self.proposers))
        for p in self.proposers:
            if not isinstance(p, Proposer) and p not in PROPOSERS:
                raise ValueError(f"unknown proposer {p!r} (known: {', '.join(sorted(PROPOSERS))})")
        for name in ("max_new_tokens", "k", "n_nodes", "top_k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{name} must be an integer, got {v!r}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be ≥ 1, got {self.max_new_tokens}")
        if self.k < 0:
            raise ValueError(f"k must be ≥ 0, got {self.k}")
        if self.n_nodes < 0:
            raise ValueError(f"n_nodes must be ≥ 0, got {self.n_nodes}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed < 1 << 64):
            raise ValueError(f"seed must be an integer in [0, 2^64 - 1] or None, got {self.seed!r}")
        for name in ("temperature", "top_p"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(f"{name} must be a number, got {v!r}")
        if self.draft_p_min is not None and not 0 <= self.draft_p_min <= 1:
            raise ValueError(f"draft_p_min must be in [0, 1], got {self.draft_p_min}")
        if self.coupling not in COUPLINGS:
            raise ValueError(f"coupling must be one of {', '.join(COUPLINGS)}, got {self.coupling!r}")
        if self.processing is not None and not isinstance(self.processing, Processing):
            raise ValueError(f"processing must be an edgespec.core.processors.Processing, got {self.processing!r}")
        if self.logprobs is not None and (isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int)
                                          or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS):
            raise ValueError(f"logprobs must be None or an integer in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs!r}")
        if self.draft_prompt is not None:
            d = self.draft_prompt
            if not isinstance(d, (str, bytes)) and hasattr(d, "__iter__"):
                d = list(d)  # a generator or other one-pass iterable: read once
            if isinstance(d, (str, bytes)) or not hasattr(d, "__iter__") or not all(
                    isinstance(t, (int, np.integer)) and not isinstance(t, bool) and t >= 0 for t in d) or not len(d):
                raise ValueError(f"draft_prompt must be None or a non-empty sequence of token ids ≥ 0, got "
                                 f"{reprlib.repr(d)}")  # a long one cut short: one line
            object.__setattr__(self, "draft_prompt", tuple(int(t) for t in d))
        self.sampling  # validates temperature, top_k, top_p

    @property
    def coupled(self) -> bool:
        """Whether tokens are sampled by the Gumbel coupling (sampling, and ``coupling`` gumbel, or auto with a
        seed)."""
        if self.temperature == 0 or self.coupling == "standard":
            return False
        return self.coupling == "gumbel" or self.seed is not None

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p)

    @classmethod
    def with_fields(cls, base: "GenerationOptions | None", overrides: dict) -> "GenerationOptions":
        """``base`` (default options) with some fields replaced.

        Raises:
            TypeError: a name that is not a field (e.g. the old ``mode``/``lookup``/``tree`` arguments: use
                ``proposers``).
        """
        names = {f.name for f in fields(cls)}
        bad = sorted(set(overrides) - names)
        if bad:
            raise TypeError(f"unknown generation option(s) {', '.join(bad)}; the options are "
                            f"{', '.join(sorted(names))} (mode/lookup/tree became proposers=(...))")
        base = base or cls()
        return cls(**{**{n: getattr(base, n) for n in names}, **overrides})


def plan_round(decoder, policy: KPolicy, proposers: list[Proposer], cap: int, remaining: int) -> RoundPlan:
    """The next round of ``decoder`` (a :class:`~edgespec.engine.decoder.SpecDecoder`): the policy chooses among
    the proposers' offers (at most ``cap`` tokens each; ``remaining`` of ``max_new_tokens`` left), then the plan is
    kept feasible: only offered proposers, sizes within ``cap``, a catch-up only where a draft is in use."""
    if not proposers:
        return RoundPlan()
    lag = decoder.draft_model.lag(decoder.tokens) if decoder.draft_model is not None else 0
    ctx = decoder.context()
    offers = tuple(p.offer(ctx, cap) for p in proposers)
    plan = policy.choose(Situation(offers, lag, remaining))
    if plan.proposer is not None and plan.proposer not in proposers:
        return RoundPlan()  # asked for a source this generation does not use
    drafting = decoder.dcache is not None and any(p.uses_draft for p in proposers)
    return RoundPlan(plan.proposer, max(0, min(plan.k, cap)), max(0, min(plan.n_nodes, cap)),
                     max(0, plan.catchup_tokens) if drafting else 0)


def run_rounds(decoder, input_ids: list[int], o: GenerationOptions, proposers: list[Proposer], policy: KPolicy,
               stats: GenerationStats) -> Iterator[tuple[list[int], int]]:
    """The emission loop of one generation on ``decoder`` (a :class:`~edgespec.engine.decoder.SpecDecoder`): prefill
    ``input_ids``, then plan (:func:`plan_round`), run (``decoder.run_round``) and observe one round at a time,
    yielding ``(new token ids, how many of them are accepted proposal tokens)`` per target run until a stop token
    (not yielded), ``o.max_new_tokens`` or the end of the context; ``stats`` is filled in place (times in ms)."""
    stats.prompt_tokens = len(input_ids)
    stats.draft_prompt_tokens = len(o.draft_prompt) if o.draft_prompt is not None else None
    sp = o.sampling
    rng = np.random.default_rng(o.seed)
    coupling = None
    if o.coupled:
        seed = o.seed if o.seed is not None else int(np.random.SeedSequence().entropy % (1 << 64))
        coupling = GumbelCoupling(seed, decoder.width)
    stats.coupling = "gumbel" if coupling is not None else ("greedy" if sp.greedy else "standard")
    t_start = time.perf_counter()
    new, result = [decoder.prefill(input_ids, sp, rng, coupling, o.draft_prompt)], None
    stats.prefill_ms = (time.perf_counter() - t_start) * 1e3
    decoder.generations = generation = decoder.generations + 1
    policy.begin()
    try:
        while True:
            room = o.max_new_tokens - stats.new_tokens
            stop = next((i for i, t in enumerate(new) if t in decoder.stop_ids), None)
            if stop is not None and stop >= room:
                stop = None
            used = stop + 1 if stop is not None else min(len(new), room)  # the stop token is generated
            if result is not None:
                stats.record_round(result, used)
            stats.new_tokens += used
            emitted = new[:used - (stop is not None)]
            if decoder.logprobs_top is not None:
                stats.token_logprobs += decoder.step_logprobs[:len(emitted)]
            if stop is not None:
                stats.stop_reason = "stop_token"
            yield emitted, min(result.accepted if result is not None else 0, len(emitted))
            stats.wall_ms = (time.perf_counter() - t_start) * 1e3
            if stop is not None:
                break
            remaining = o.max_new_tokens - stats.new_tokens
            L = len(decoder.tokens) - 1
            if remaining <= 0:
                stats.stop_reason = "max_new_tokens"
                break
            if L >= decoder.context_length:
                stats.stop_reason = "context"
                break
            cap = min(remaining - 1, decoder.context_length - 1 - L)  # also caps a tree's node count
            result = decoder.run_round(plan_round(decoder, policy, proposers, cap, remaining), sp, rng, coupling)
            policy.observe(result)
            if result.logits is not None and proposers:  # the target's top-1 probability, temperature 1
                policy.observe_confidence(top1_probability(result.logits))
            new = result.tokens
    finally:  # also when the caller stops iterating early; not for a generation a newer one replaced
        if decoder.generations == generation:
            policy.end(stats.new_tokens)
            # keep what was generated (a stop token included), not a round's tokens past it: the next prompt
            # then reuses as many cached positions after speculative decoding as after plain, so both prefill
            # its rest in the same chunks (the same graph: OnnxLM.forward's int8 prefill graph)
            n = len(input_ids) + stats.new_tokens
            if 1 <= n < len(decoder.tokens):
                decoder.rewind_to(n)
    stats.wall_ms = (time.perf_counter() - t_start) * 1e3


class Generation:
    """A running generation: iterate for text pieces; ``chunks()`` also tells which came from the draft."""

    def __init__(self, events: Iterator[tuple[list[int], int]], tokenizer, stats: GenerationStats):
        self._events = events
        self._detok = IncrementalDetokenizer(tokenizer)
        self.stats = stats
        self.token_ids: list[int] = []
        self.text = ""

    def chunks(self) -> Iterator[tuple[str, bool]]:
        """Yield ``(text, from_draft)``: ``from_draft`` marks text of accepted draft tokens."""
        for ids, n_draft in self._events:
            for i, t in enumerate(ids):
                self.token_ids.append(t)
                piece = self._detok.push([t])
                if piece:
                    self.text += piece
                    yield piece, i < n_draft
        tail = self._detok.flush()
        if tail:
            self.text += tail
            yield tail, False

    def __iter__(self) -> Iterator[str]:
        for piece, _ in self.chunks():
            yield piece

    def run(self) -> "Generation":
        """Consume the whole generation; returns self."""
        for _ in self.chunks():
            pass
        return self
