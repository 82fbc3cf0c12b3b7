"""The speculative decoder: prefill, the speculative round, generation, and the embeddable API.

:class:`SpecDecoder` is the facade: loading is :mod:`edgespec.io.loading`, prompt encoding and id checks
:class:`~edgespec.io.encoding.PromptEncoder`, the options and the streamed result :mod:`.generation`, a mode's
proposers and K policy :mod:`.presets`; the decoder keeps the caches and the committed tokens and runs the round.

State between calls is the committed token list and the two KV caches, so a follow-up prompt that extends
the previous conversation reuses every cached position of their common prefix (multi-turn KV reuse).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import numpy as np

from ..control.kpolicy import FixedK, KPolicy
from ..core.coupling import GumbelCoupling
from ..core.processors import Pipeline, pipeline_for, process_rows, token_logprobs
from ..core.round import Proposal, RoundPlan, RoundResult
from ..core.sampling import (SamplingParams, accept_reject, follow_choices, greedy_accept, probs, sample,
                             verify_tree)
from ..core.stats import GenerationStats
from ..core.token_tree import TokenTree, common_prefix
from ..draft import Proposer, resolve
from ..draft.base import DraftContext
from ..draft.grammar import with_grammar
from ..draft.model import DraftModel
from ..io.encoding import PromptEncoder
from ..io.loading import check_export, open_export
from ..io.manifest import Manifest
from ..io.onnx_model import (CPU, PREFILL_GRAPH_ROWS, KVCache, OnnxLM, SessionMemory, resolve_provider,
                             use_shared_thread_pool)
from ..io.text import ChatTemplate
from .generation import Generation, GenerationOptions, run_rounds

PREFILL_CHUNK = 256


def forward_tokens(lm, ids: list[int], cache) -> np.ndarray | None:
    """Run ``ids`` through ``lm`` after ``cache`` in prefill chunks of :data:`PREFILL_CHUNK` (the head on the
    last row only; chunks of ≥ 64 rows on the export's int8 prefill graph where it has one, see
    :meth:`~edgespec.io.onnx_model.OnnxLM.forward`); returns the last position's logits float32 (V,), or None
    for no ids. An int8 cache's float32 copy (the prefill graph's past) is freed at the end: a server idle after
    a prompt keeps the int8 rows only."""
    logits = None
    for i in range(0, len(ids), PREFILL_CHUNK):
        logits = lm.forward(ids[i:i + PREFILL_CHUNK], cache, keep=1, prefill=True)
    if hasattr(cache, "drop_float32"):  # an in-place cache (formats 1-2 and 4 have no copy)
        cache.drop_float32()
    return None if logits is None else logits[-1]


def prompt_logits(lm, ids: list[int], cache) -> np.ndarray | None:
    """Run a prompt's ``ids`` after ``cache`` as a generation's prefill runs them and return the last position's
    logits float32 (V,) (None for no ids): :func:`forward_tokens`, except that where the export's int8 prefill
    graph takes the chunks (more than :data:`~edgespec.io.onnx_model.PREFILL_GRAPH_ROWS` ids) the last id runs
    alone on the graph itself. So the first new token, like every later one, is chosen from the graph's logits,
    and a prompt whose cache is reused (its last token always runs, :meth:`SpecDecoder.cached_tokens`) gets the
    same one; the prefill graph's own last row can differ at a near tie (int8 weights)."""
    if getattr(lm, "prefill_session", None) is None or len(ids) <= PREFILL_GRAPH_ROWS:
        return forward_tokens(lm, ids, cache)
    forward_tokens(lm, ids[:-1], cache)
    return lm.forward(ids[-1:], cache)[-1]


feed = forward_tokens  # the former name (``edgespec.decoder.feed``)


class SpecDecoder:
    """Target + draft graphs of one export, with their caches and the committed tokens.

    Not thread-safe: one generation at a time per decoder.
    """

    def __init__(self, target: OnnxLM, draft: OnnxLM | None, tokenizer, stop_ids, context_length: int,
                 template: ChatTemplate | None = None, manifest: Manifest | None = None):
        self.target, self.draft = target, draft
        self.tokenizer = tokenizer
        self.stop_ids = frozenset(int(s) for s in stop_ids)
        self.context_length = int(context_length)
        self.template = template
        self.manifest = manifest
        self.encoder = PromptEncoder(tokenizer, template)  # prompts and messages → ids; caller ids checked
        # q and p are defined over the ids the tokenizer has: logits past them (a padded head) are cut off
        self.n_tokens = self.encoder.n_tokens
        self.width = min(target.spec.vocab_size, self.n_tokens)
        for lm in (target, draft):
            if lm is not None and not lm.spec.kept_token_ids:
                lm.vocab_limit = min(lm.spec.vocab_size, self.n_tokens)
        # the draft LM with its cache, its vocabulary map and its draft-side processing (None: target only)
        self.draft_model: DraftModel | None = DraftModel.load(draft, self.width) if draft is not None else None
        # what proposers keep across rounds and generations, by name (the suffix tree's corpus): not reset
        self.memory: dict = {}
        # generations that started their rounds (run_rounds): one that a newer one replaced does not report its end
        self.generations = 0
        # the running generation's Gumbel coupling (seeded, drafter-invariant sampling), or None: proposers that
        # sample from q read it (see :mod:`.coupling`)
        self.coupling: GumbelCoupling | None = None
        # the running generation's logits processors (:mod:`.processors`) for every target and draft row, or None
        self.processor = None
        self.logprobs_top: int | None = None  # report emitted tokens' logprobs with this many alternatives
        self.step_logprobs: list = []  # the last prefill's or round's TokenLogprob per committed token
        self.reset()

    @property
    def processor(self) -> Pipeline | None:
        """The running generation's logits processors for every target and draft row, or None (setting it sets
        the draft model's too)."""
        return self._processor

    @processor.setter
    def processor(self, pipeline: Pipeline | None) -> None:
        self._processor = pipeline
        if self.draft_model is not None:
            self.draft_model.processor = pipeline

    @property
    def dcache(self):
        """The draft's KV cache (its :class:`~edgespec.draft.model.DraftModel`'s), or None without a draft."""
        return self.draft_model.cache if self.draft_model is not None else None

    def context(self) -> DraftContext:
        """What the proposers see this round (:class:`~edgespec.draft.base.DraftContext`): the committed tokens,
        the vocabulary width, the draft model, the coupling, and the decoder's memory for their own state."""
        return DraftContext(self.tokens, self.width, self.draft_model, self.coupling, self.memory, self.processor)

    @property
    def plain_tokenizer(self):
        """The tokenizer that encodes control-token text in message content as ordinary text (built once, on
        the first message that holds such text: :class:`~edgespec.io.encoding.PromptEncoder`)."""
        return self.encoder.plain_tokenizer

    @property
    def _plain_tokenizer(self):
        """That tokenizer if it was built, else None (it costs ~100 MB for Qwen's vocabulary)."""
        return self.encoder.plain

    @classmethod
    def load(cls, export_dir: str | Path, provider: str = "cpu", threads: int | None = None,
             context_length: int | None = None, load_draft: bool = True,
             shared_thread_pool: bool = False, provider_options: dict | None = None,
             memory: SessionMemory | None = None) -> "SpecDecoder":
        """Open an export directory written by ``edgespec export`` (:mod:`edgespec.io.loading`).

        ``load_draft=False`` gives a target-only decoder (plain decoding or proposers without a model).
        ``shared_thread_pool=True`` calls :func:`~edgespec.io.onnx_model.use_shared_thread_pool` first (faster;
        changes how every later onnxruntime session of the process must be created; CPU only).
        ``provider`` (``cpu``, ``xnnpack``, ``qnn``, ``openvino``, …) with ``provider_options`` (str → str) runs
        both graphs there; one that is missing or rejects a graph falls back to CPU with a one-line notice
        (see :func:`~edgespec.io.onnx_model.open_session`); ``target.provider`` tells which one runs.
        ``memory``: onnxruntime's session memory settings (default
        :data:`~edgespec.io.onnx_model.DEFAULT_MEMORY`).

        The export is checked where it enters (:mod:`edgespec.io.integrity`): file sizes always, sha256 on the
        first load on this device, the graphs' inputs and outputs and the tokenizer against the manifest.

        Raises:
            EdgespecError: not a complete export, a file or graph that does not match the manifest, or an
                unknown execution provider.
        """
        export_dir = Path(export_dir).expanduser()  # "~/.cache/…" as the README writes it
        m = check_export(export_dir)
        if shared_thread_pool and resolve_provider(provider)[0] == CPU:
            use_shared_thread_pool(threads)  # process-wide: before the first session
        e = open_export(export_dir, m, provider, threads, provider_options, load_draft, context_length, memory)
        return cls(e.target, e.draft, e.tokenizer, m.special_tokens.stop, e.context_length, e.template, m)

    def reset(self) -> None:
        """Forget the conversation: empty both caches."""
        self.tokens: list[int] = []
        self.tcache: KVCache = self.target.new_cache()
        if self.draft_model is not None:
            self.draft_model.reset()

    # -- prompts ---------------------------------------------------------------------------------------

    def encode(self, prompt: str | None = None, messages: list[dict] | None = None,
               tools: list[dict] | None = None) -> list[int]:
        """Token ids int64 of a raw prompt, or of chat ``messages`` rendered with the chat template (``tools``:
        OpenAI tool objects the template renders); see :meth:`~edgespec.io.encoding.PromptEncoder.encode`.

        Raises:
            ValueError: neither or both given, an empty prompt, invalid messages or text, a failing template.
        """
        return self.encoder.encode(prompt, messages, tools)

    def check_ids(self, input_ids) -> list[int]:
        """``input_ids`` as a list of ints, each an id of the tokenizer (0 ≤ id < ``n_tokens``); see
        :meth:`~edgespec.io.encoding.PromptEncoder.check_ids`.

        Raises:
            ValueError: naming ``input_ids``: not a 1-D sequence of integers, or an id out of range.
        """
        return self.encoder.check_ids(input_ids)

    def rewind_to(self, n: int) -> None:
        """Keep the first ``n`` committed tokens and forget the rest: the one public rollback.

        Afterwards ``tokens[n-1]`` is ``last`` (committed, not cached), the target cache holds positions
        0..n-2 and the draft cache at most as many; the next round continues from there.

        Raises:
            ValueError: ``n`` outside 1..len(tokens).
        """
        if not 1 <= n <= len(self.tokens):
            raise ValueError(f"rewind_to: n must be in 1..{len(self.tokens)}, got {n}")
        del self.tokens[n:]
        self.tcache.crop(min(self.tcache.length, n - 1))
        if self.draft_model is not None:
            self.draft_model.keep(n - 1)

    def _draft_ids(self, draft_prompt) -> list[int]:
        """``draft_prompt`` as checked token ids (:meth:`check_ids`). Raises ValueError naming draft_prompt."""
        try:
            return self.check_ids(list(draft_prompt))
        except ValueError as e:
            raise ValueError(f"draft_prompt: {e}") from None

    def cached_tokens(self, ids: list[int]) -> int:
        """How many leading tokens of the prompt ``ids`` the target's KV cache holds now: what a generation from
        ``ids`` reuses rather than prefills (at most len(ids) - 1: the last prompt token is always run)."""
        return min(common_prefix(self.tokens, ids), len(ids) - 1, self.tcache.length)

    def cache_prefix(self, ids: list[int], draft_prompt: list[int] | None = None) -> None:
        """Prefill a prefix that later prompts share (a fixed system prompt) into both caches ahead of time,
        so that the next generation whose prompt starts with ``ids`` pays only for the rest, and the draft has
        no prompt of its own to catch up on but the rest. What is cached of ``ids`` already is kept.

        Afterwards ``tokens`` = ``ids`` (int64 ids, each < the tokenizer's width) and both caches hold
        positions 0..len(ids)-2: ``ids[-1]`` is ``last``, as after a round. ``draft_prompt`` (token ids, or None:
        ``ids``): what the draft reads in place of ``ids``, as for a generation
        (:attr:`~edgespec.engine.generation.GenerationOptions.draft_prompt`); its cache then holds all of it but
        its last token.

        Raises:
            ValueError: ``ids`` empty, not token ids, or not shorter than the context.
        """
        ids = self.check_ids(ids)
        if not ids or len(ids) >= self.context_length:
            raise ValueError(f"a cached prefix needs 1..{self.context_length - 1} tokens, got {len(ids)}")
        keep = min(common_prefix(self.tokens, ids), len(ids) - 1)
        if draft_prompt is not None and not 0 < len(draft_prompt) <= len(ids):
            raise ValueError(f"a draft prompt needs 1..{len(ids)} tokens, got {len(draft_prompt)}")
        dm = self.draft_model
        if dm is not None:  # what its view of the tokens until now shares with its view of ids
            dm.set_prompt(self.tokens, ids, self._draft_ids(draft_prompt) if draft_prompt is not None else None)
        self.tokens = list(ids)
        self.tcache.crop(min(self.tcache.length, keep))
        forward_tokens(self.target, ids[self.tcache.length:-1], self.tcache)
        if dm is not None:  # the draft through its DraftModel, as in the round
            forward_tokens(dm.lm, dm.view(ids)[dm.cache.length:-1], dm.cache)

    # -- the steps -------------------------------------------------------------------------------------

    def prefill(self, ids: list[int], sp: SamplingParams, rng: np.random.Generator,
                coupling: GumbelCoupling | None = None, draft_prompt: list[int] | None = None) -> int:
        """Run the prompt ``ids`` through the target, reusing the cached common prefix with the previous call,
        and commit the first new token sampled from the last position's p (returned): drawn with ``rng``, or
        the race choice of ``coupling`` at position len(ids). Afterwards a round can start: ``tokens`` = ids +
        [token]. ``draft_prompt`` (token ids, or None: ``ids``): what the draft reads in place of ``ids``
        (:meth:`~edgespec.draft.model.DraftModel.set_prompt`); the draft reads nothing now.

        Raises:
            ValueError: ``draft_prompt`` empty or longer than ``ids`` (before any change).
        """
        keep = min(common_prefix(self.tokens, ids), len(ids) - 1)
        if self.draft_model is not None:  # first: it refuses a draft prompt longer than ids before any change
            self.draft_model.set_prompt(self.tokens, ids, draft_prompt)
        self.tcache.crop(keep)  # drop what the new prompt does not share
        self.tokens = list(ids)
        logits = prompt_logits(self.target, ids[self.tcache.length:], self.tcache)
        if self.processor is not None:  # edgespec.core.processors: penalties, logit bias, grammar mask
            logits = self.processor(ids, logits)
        p = probs(logits, sp)
        x = coupling.choose(p, len(ids)) if coupling is not None and not sp.greedy else sample(p, rng)
        if self.logprobs_top is not None:
            self.step_logprobs = token_logprobs(logits[None], [x], self.logprobs_top)
        self.tokens.append(x)
        return x

    def run_round(self, plan: RoundPlan, sp: SamplingParams, rng: np.random.Generator,
                  coupling: GumbelCoupling | None = None) -> RoundResult:
        """One target run: propose → verify → accept → roll back → catch up; commits the new tokens.

        ``plan`` names the proposer and its size (0: a plain step, whose proposal is empty, optionally followed
        by a draft catch-up of ``plan.catchup_tokens``). ``coupling`` (seeded sampling, :mod:`.coupling`): every
        token is the race choice of its position, a proposal token is accepted iff it is the target's choice;
        else ``rng`` drives the rule of :mod:`.sampling`. Greedy ignores both.
        """
        # Invariant on entry and exit: the target cache holds positions 0..L-1 of `tokens`; tokens[L] (`last`) is
        # committed but not cached; the draft cache holds 0..Ld-1 of its view of `tokens` with Ld < the view's
        # length (it lags after plain steps, rounds of other proposers or full acceptance, and reads what it lags
        # in its next proposal's first feed); without a draft prompt the view is `tokens`.
        t0 = time.perf_counter()
        L = len(self.tokens) - 1
        self.coupling = coupling if not sp.greedy else None
        # 1. propose: a token tree with its q (a chain: parents i-1); a plain step proposes nothing
        drafting = plan.size > 0
        prop = plan.proposer.propose(self.context(), plan.size, sp, rng) if drafting else Proposal(TokenTree())
        tree = prop.tree
        draft_ms = (time.perf_counter() - t0) * 1e3 if drafting else 0.0
        # 2. verify: the target scores `last` and every proposal token in one run → logits float32 (N+1, V)
        logits = self._verify(L, tree)
        if self.processor is not None:  # the same processors as the draft's rows, per position (processors.py)
            logits = process_rows(self.processor, self.tokens, tree, logits)
        # 3. accept: the rule of sampling.py — min(1, p/q) per token, a correction from norm(max(0, p - q)),
        #    or a bonus token from p after the last accepted one
        path, x = self._accept(tree, logits, sp, rng, L)
        new = [tree.tokens[i] for i in path] + [x]
        if self.logprobs_top is not None:  # each committed token's row: the root's, then its parent node's
            self.step_logprobs = token_logprobs(logits[[0] + [i + 1 for i in path]], new, self.logprobs_top)
        # 4. roll back: keep the accepted path's KV entries (the draft: its accepted chain rows), then commit
        self._roll_back(L, path, draft_kept=min(len(path), prop.draft_rows))
        self.tokens += new
        # 5. catch up: a plain step may feed the draft part of what it lags (the new token stays unfed)
        if not drafting and plan.catchup_tokens > 0 and self.draft_model is not None:
            prop.catchup_ms, prop.catchup_tokens = self.draft_model.catch_up(self.tokens, plan.catchup_tokens)
            draft_ms = prop.catchup_ms
        steps = prop.draft_step_ms
        return RoundResult(
            plan=plan, tokens=new, proposer=plan.proposer if len(tree) else None, depths=tuple(tree.depth),
            accepted=len(path), bonus=not tree.children.get(path[-1] if path else -1), draft_ms=draft_ms,
            round_ms=(time.perf_counter() - t0) * 1e3, draft_step_ms=float(np.median(steps)) if steps else None,
            catchup_ms=prop.catchup_ms, catchup_tokens=prop.catchup_tokens,
            logits=logits[-1] if not len(tree) else None, tree=tree, start=L)

    def _verify(self, L: int, tree: TokenTree) -> np.ndarray:
        """2. The target's logits float32 (N+1, V) for `last` and the N proposal tokens: a chain with the
        causal mask, a tree with its ancestor mask and per-node positions (prefix length + depth)."""
        ids = [self.tokens[-1]] + tree.tokens
        if tree.is_chain:
            return self.target.forward(ids, self.tcache)
        n = len(tree)
        mask = np.ones((1, 1, n + 1, L + n + 1), dtype=bool)  # bool (1, 1, N+1, L+N+1)
        mask[0, 0, :, L:] = tree.ancestors_mask()
        pos = L + np.array([0] + tree.depth, dtype=np.int64)
        return self.target.forward(ids, self.tcache, pos, mask)

    def _accept(self, tree: TokenTree, logits: np.ndarray, sp: SamplingParams,
                rng: np.random.Generator, L: int) -> tuple[list[int], int]:
        """3. (accepted node indices, the correction or bonus token). Chains take the fast paths
        (:func:`greedy_accept`, :func:`accept_reject`); trees the walk :func:`verify_tree`; all share
        :func:`~edgespec.core.sampling.accept_candidates`. A fixed proposal (no q) has one-hot q. Under a coupling
        (``self.coupling``) the walk :func:`follow_choices` takes the race choice of p at each row's position
        (L + 1 + the node's depth) and keeps a proposal token iff it is that choice."""
        if self.coupling is not None:
            c = self.coupling
            return follow_choices(tree, lambda node: c.choose(probs(logits[node + 1], sp),
                                                              L + 1 + (tree.depth[node] if node >= 0 else 0)))
        if not tree.is_chain:
            return verify_tree(tree, probs(logits, sp), sp, rng)
        drafted = np.asarray(tree.tokens, dtype=np.int64)
        if sp.greedy:
            n, x = greedy_accept(drafted, logits)
        else:
            if tree.q:
                q = np.stack([tree.q[i - 1] for i in range(len(drafted))])
            else:  # one-hot q: accepted with probability p(x)
                q = np.zeros((len(drafted), self.width))
                q[np.arange(len(drafted)), drafted] = 1.0
            n, x = accept_reject(drafted, q, probs(logits, sp), rng)
        return list(range(n)), x

    def _roll_back(self, L: int, accepted_rows: list[int], draft_kept: int) -> None:
        """4. Roll back: the one place a round shortens the caches.

        The target keeps the committed prefix 0..L (``last`` at L) and, after it, the verified rows of the
        accepted proposal tokens (indices into the proposal; a chain's prefix is a view, a tree's path a
        gather). The draft keeps its first ``draft_kept`` proposal positions; its catch-up is the next
        proposal's first feed.
        """
        self.tcache.crop(L + 1, keep=[L + 1 + i for i in accepted_rows])
        if self.draft_model is not None:
            self.draft_model.keep(L + 1 + draft_kept)

    # -- generation ------------------------------------------------------------------------------------

    def proposers_for(self, options: GenerationOptions) -> list[Proposer]:
        """The options' proposers as instances; under a grammar constraint a speculative generation also
        proposes the grammar's forced tokens, first (``grammar``, :mod:`edgespec.draft.grammar`: lossless,
        always accepted).

        Raises:
            ValueError: an unknown name, or a proposer that needs the draft on a decoder loaded without it.
        """
        proposers = with_grammar([resolve(p, options) for p in options.proposers], options.processing)
        if self.draft is None and any(p.uses_draft for p in proposers):
            raise ValueError("this decoder was loaded without its draft; use proposers without a model "
                             "(e.g. ('lookup',)) or () for plain decoding")
        return proposers

    def generate_ids(self, input_ids: list[int], options: GenerationOptions | None = None,
                     policy: KPolicy | None = None,
                     stats: GenerationStats | None = None) -> Iterator[tuple[list[int], int]]:
        """Yield ``(new token ids, how many of them are accepted proposal tokens)`` per target run.

        ``policy`` (e.g. :class:`~edgespec.control.adaptive.AdaptiveK`) plans each round; without one, a fixed K
        (``options.k``, ``options.n_nodes`` for trees) from the first proposer that can propose. Stop tokens end
        generation and are not yielded. ``max_new_tokens`` is never exceeded; K is clamped so that every
        verified position stays inside the context. ``stats`` (if given) is filled in place.

        Raises:
            ValueError: empty prompt, prompt not shorter than the context, a proposer this decoder cannot run,
                processing it cannot apply (a logit_bias id out of range, a grammar that does not compile).
        """
        o = options or GenerationOptions()
        proposers = self.proposers_for(o)
        pipeline = pipeline_for(o.processing, self.tokenizer, self.width, self.stop_ids, len(input_ids))
        if len(input_ids) == 0:
            raise ValueError("the prompt is empty")
        if len(input_ids) >= self.context_length:
            raise ValueError(f"the prompt is {len(input_ids)} tokens; the context holds {self.context_length}")
        if o.draft_prompt is not None:
            if len(o.draft_prompt) > len(input_ids):
                raise ValueError(f"draft_prompt is {len(o.draft_prompt)} tokens, longer than the prompt's "
                                 f"{len(input_ids)}")
            self._draft_ids(o.draft_prompt)
        stats = stats if stats is not None else GenerationStats()
        policy = policy if policy is not None else FixedK(o.k, o.n_nodes)
        stats.latency_budget_ms = policy.latency_budget_ms
        stats.provider = self.target.provider
        drafts = any(p.uses_draft for p in proposers)
        stats.mode = "spec" if drafts else "+".join(p.name for p in proposers) or "plain"
        return self._generate(list(input_ids), o, proposers, policy, stats, pipeline)

    def _generate(self, input_ids, o: GenerationOptions, proposers, policy: KPolicy, stats: GenerationStats,
                  pipeline: Pipeline | None):
        """The generation's processors and logprobs setting are the decoder's for its duration (a newer
        generation that replaced it keeps its own)."""
        self.processor, self.logprobs_top, self.step_logprobs = pipeline, o.logprobs, []
        owner = self._processing_owner = object()
        try:
            yield from run_rounds(self, input_ids, o, proposers, policy, stats)
        finally:
            if self._processing_owner is owner:
                self.processor = self.logprobs_top = None

    def generate(self, prompt: str | None = None, *, messages: list[dict] | None = None,
                 input_ids: list[int] | None = None, options: GenerationOptions | None = None,
                 policy: KPolicy | None = None, **option_fields) -> Generation:
        """Generate from a raw prompt, chat messages, or token ids; iterate the result for text pieces.

        ``options`` (default :class:`GenerationOptions`), with any of its fields overridden by keyword (e.g.
        ``max_new_tokens=64, temperature=0.7, proposers=("lookup", "draft")``); ``policy`` plans each round
        (default: fixed K). Returns a :class:`Generation`: iterating it streams text (str), then ``.stats``,
        ``.text`` and ``.token_ids`` hold the outcome.

        Raises:
            ValueError: invalid arguments (before any work). TypeError: an unknown option name.
        """
        o = GenerationOptions.with_fields(options, option_fields) if option_fields else (options or GenerationOptions())
        if input_ids is None:
            input_ids = self.encode(prompt, messages)
        elif prompt is not None or messages is not None:
            raise ValueError("give one of prompt, messages or input_ids")
        else:
            input_ids = self.check_ids(input_ids)
        stats = GenerationStats()
        return Generation(self.generate_ids(list(input_ids), o, policy, stats), self.tokenizer, stats)
