"""The speculative decoder: prefill, the speculative round, generation, and the embeddable API.

State between calls is the committed token list and the two KV caches, so a follow-up prompt that extends
the previous conversation reuses every cached position of their common prefix (multi-turn KV reuse).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import numpy as np

from .integrity import check_files, check_tokenizer, tokenizer_width
from .kpolicy import FixedK, KPolicy
from .lookup import ngram_lookup
from .manifest import Manifest, load_manifest
from .onnx_model import KVCache, OnnxLM, use_shared_thread_pool
from .sampling import SamplingParams, accept_reject, greedy_accept, probs, sample
from .stats import GenerationStats
from .text import (ChatTemplate, IncrementalDetokenizer, check_text, encode_chat, load_template, load_tokenizer,
                   plain_text_tokenizer)
from .tree import TokenTree, TreeShape, pick_children, verify_tree

PREFILL_CHUNK = 256


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if len(diff) else n


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
        # q and p are defined over the ids the tokenizer has: logits past them (a padded head) are cut off
        self.n_tokens = tokenizer_width(tokenizer)
        self.width = min(target.spec.vocab_size, self.n_tokens)
        for lm in (target, draft):
            if lm is not None and not lm.spec.kept_token_ids:
                lm.vocab_limit = min(lm.spec.vocab_size, self.n_tokens)
        self.plain_tokenizer = plain_text_tokenizer(tokenizer)  # message content: control-token text stays text
        self.kept_ids = None  # int64 (N,): target ids of a pruned draft head's N outputs
        self._generation = 0  # counts generations, so that an abandoned one does not report its end late
        if draft is not None and draft.spec.kept_token_ids:
            self.kept_ids = np.load(Path(draft.export_dir) / draft.spec.kept_token_ids).astype(np.int64)
        self.reset()

    @classmethod
    def load(cls, export_dir: str | Path, provider: str = "cpu", threads: int | None = None,
             context_length: int | None = None, load_draft: bool = True,
             shared_thread_pool: bool = False) -> "SpecDecoder":
        """Open an export directory written by ``edgespec export``.

        ``load_draft=False`` gives a target-only decoder (``mode="plain"`` or ``"lookup"``).
        ``shared_thread_pool=True`` calls :func:`~edgespec.onnx_model.use_shared_thread_pool` first (faster;
        changes how every later onnxruntime session of the process must be created).

        The export is checked where it enters (:mod:`edgespec.integrity`): file sizes always, sha256 on the
        first load on this device, the graphs' inputs and outputs and the tokenizer against the manifest.

        Raises:
            EdgespecError: not a complete export, a file or graph that does not match the manifest, or the
                execution provider is unavailable.
        """
        export_dir = Path(export_dir)
        m = load_manifest(export_dir)
        check_files(export_dir, m)
        if shared_thread_pool:
            use_shared_thread_pool(threads)
        tok = load_tokenizer(export_dir / m.tokenizer)
        check_tokenizer(export_dir, m, tokenizer_width(tok))
        template = None
        if m.chat_template:
            bos = tok.id_to_token(m.special_tokens.bos) if m.special_tokens.bos is not None else ""
            template = load_template(export_dir / m.chat_template, bos or "",
                                     tok.id_to_token(m.special_tokens.eos) or "")
        target = OnnxLM(m.target, export_dir, provider, threads, role="target")
        draft = OnnxLM(m.draft, export_dir, provider, threads, role="draft") if load_draft else None
        ctx = min(m.target.context_length, m.draft.context_length)
        if context_length is not None:
            ctx = min(ctx, context_length)
        return cls(target, draft, tok, m.special_tokens.stop, ctx, template, m)

    def reset(self) -> None:
        """Forget the conversation: empty both caches."""
        self.tokens: list[int] = []
        self.plain_row: np.ndarray | None = None  # float32 (V,): the target's logits at the last plain step
        self.draft_step_ms: list[float] = []  # times of the last proposal's one-token draft steps (ms)
        self.catchup: tuple[float, int] = (0.0, 0)  # the last proposal's catch-up feed: (ms, tokens)
        self.tcache: KVCache = self.target.new_cache()
        self.dcache: KVCache | None = self.draft.new_cache() if self.draft else None

    # -- prompts ---------------------------------------------------------------------------------------

    def encode(self, prompt: str | None = None, messages: list[dict] | None = None) -> list[int]:
        """Token ids int64 of a raw prompt, or of chat ``messages`` rendered with the chat template.

        Message content is plain text: control-token text in it (``<|im_end|>``) does not become a control
        token (:func:`~edgespec.text.encode_chat`); a raw prompt is the caller's own markup and may hold them.

        Raises:
            ValueError: neither or both given, an empty prompt, messages that are not a list of
                ``{"role", "content"}`` dicts with known roles and str content, text that is not valid UTF-8,
                or a chat template that fails.
        """
        if (prompt is None) == (messages is None):
            raise ValueError("give exactly one of prompt or messages")
        if messages is not None:
            if self.template is None:
                raise ValueError("this export has no chat template; pass a raw prompt")
            ids = encode_chat(self.tokenizer, self.plain_tokenizer, self.template, messages)
        else:
            ids = self.tokenizer.encode(check_text(prompt, "prompt"), add_special_tokens=False).ids
        if not ids:
            raise ValueError("the prompt is empty")
        return ids

    def check_ids(self, input_ids) -> list[int]:
        """``input_ids`` as a list of ints, each an id of the tokenizer (0 ≤ id < its vocabulary).

        Raises:
            ValueError: naming ``input_ids``: not a 1-D sequence of integers (floats and bools are refused,
                never rounded), or an id out of range.
        """
        if isinstance(input_ids, (str, bytes, dict)) or not hasattr(input_ids, "__len__"):
            raise ValueError(f"input_ids must be a list of token ids, got {type(input_ids).__name__}")
        arr = np.asarray(input_ids, dtype=object if not isinstance(input_ids, np.ndarray) else None)
        if arr.ndim != 1:
            raise ValueError(f"input_ids must be a flat list of token ids, got shape {arr.shape}")
        for i, t in enumerate(arr.tolist() if arr.dtype != object else arr):
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                raise ValueError(f"input_ids[{i}] must be an integer token id, got {t!r}")
            if not 0 <= t < self.n_tokens:
                raise ValueError(f"input_ids[{i}] = {t} is not a token id (ids are 0..{self.n_tokens - 1})")
        return [int(t) for t in arr.tolist()]

    # -- the three steps -------------------------------------------------------------------------------

    def _prefill(self, ids: list[int], sp: SamplingParams, rng: np.random.Generator) -> int:
        """Run the prompt through the target, reusing the cached common prefix with the previous call, and
        sample the first new token from the last position's p."""
        keep = min(_common_prefix(self.tokens, ids), len(ids) - 1)
        self.tcache.crop(keep)  # rollback site for a new prompt: drop what the new prompt does not share
        if self.dcache is not None:
            self.dcache.crop(keep)
        self.tokens = list(ids)
        pending = ids[self.tcache.length:]
        for i in range(0, len(pending), PREFILL_CHUNK):
            logits = self.target.forward(pending[i:i + PREFILL_CHUNK], self.tcache, keep=1)
        x = sample(probs(logits[-1], sp), rng)
        self.tokens.append(x)
        return x

    def _prefill_state(self, ids: list[int]) -> None:
        """Commit ``ids`` with the last one as ``last`` (not cached): the state a round starts from."""
        self.reset()
        self.target.forward(ids[:-1], self.tcache, keep=1)
        self.tokens = list(ids)

    def _plain_step(self, sp: SamplingParams, rng: np.random.Generator) -> int:
        self.plain_row = self.target.forward(self.tokens[-1:], self.tcache)[-1]
        if sp.greedy:
            return int(np.argmax(self.plain_row))
        return sample(probs(self.plain_row, sp), rng)

    def _draft_probs(self, logits: np.ndarray, sp: SamplingParams) -> np.ndarray:
        """q over the target's vocabulary from draft logits (pruned heads map back; q = 0 outside)."""
        if self.kept_ids is None:
            return probs(logits, sp, self.width)
        q = np.zeros(self.width, dtype=np.float64)
        q[self.kept_ids] = probs(logits, sp)
        return q

    def _propose_draft(self, k: int, sp: SamplingParams, rng: np.random.Generator,
                       p_min: float | None = None) -> tuple[list[int], np.ndarray | None]:
        """Up to K tokens sampled autoregressively from the draft's q; feeds first what the draft has not seen.

        With ``p_min``, drafting stops early (after at least one token) once the draft's top probability
        (temperature 1) falls below it, like llama.cpp's ``--draft-p-min``; lossless, as K is then chosen from
        the draft's own outputs only. Greedy proposals are the draft's argmax and q is None (not needed by
        :func:`~edgespec.sampling.greedy_accept`).
        """
        feed, drafted, q = self.tokens[self.dcache.length:], [], []
        self.draft_step_ms, self.catchup = [], (0.0, 0)  # one-token steps; (ms, tokens) of a catch-up feed
        for i in range(k):
            t0 = time.perf_counter()
            logits = self.draft.forward(feed, self.dcache, keep=1)[-1]
            ms = (time.perf_counter() - t0) * 1e3
            if len(feed) == 1:
                self.draft_step_ms.append(ms)
            else:  # the feed's time includes drafting the first token (one draft step)
                self.catchup = (ms, len(feed) - 1)
            if p_min is not None and i > 0 and self._tree_q(logits, SamplingParams(0)).max() < p_min:
                break
            if sp.greedy:  # a draft head wider than the target's vocabulary: ids the target cannot take are out
                best = int(np.argmax(logits if self.kept_ids is not None else logits[:self.width]))
                drafted.append(int(self.kept_ids[best]) if self.kept_ids is not None else best)
            else:
                q.append(self._draft_probs(logits, sp))
                drafted.append(sample(q[-1], rng))
            feed = drafted[-1:]
        return drafted, (np.stack(q) if q else None)

    def _spec_round(self, drafted: list[int], q: np.ndarray | None, sp: SamplingParams, rng: np.random.Generator,
                    stats: GenerationStats) -> tuple[list[int], int]:
        """Verify, accept and roll back one proposal (Leviathan et al. 2023, Algorithm 1).

        Invariant on entry: the target cache holds positions 0..L-1 of ``self.tokens``; ``self.tokens[L]``
        (``last``) is committed but not cached; the draft cache holds 0..Ld-1 with Ld ≤ L + K (it lags after
        plain steps, lookup rounds or full acceptance, and catches up in the next draft proposal).
        ``drafted`` int (K,) was sampled from ``q`` float (K, V) (greedy: q None, one-hot implied).
        Returns (new tokens, accepted count).
        """
        L, k = len(self.tokens) - 1, len(drafted)
        # 2. verify: the target scores `last` and all K drafted tokens in one run → p (K+1, V)
        logits = self.target.forward([self.tokens[-1]] + drafted, self.tcache)
        # 3. accept: min(1, p/q) per token; correction from norm(max(0, p-q)) or a bonus token from p_{K+1}
        if sp.greedy:
            n, x = greedy_accept(np.asarray(drafted), logits)
        else:
            n, x = accept_reject(np.asarray(drafted), q, probs(logits, sp), rng)
        self._roll_back(L, list(range(n)), draft_kept=n)
        stats.proposed += k
        stats.accepted += n
        stats.corrections += int(n < k)
        stats.bonus += int(n == k)
        stats.record_position(k, n)
        return drafted[:n] + [x], n

    def _roll_back(self, L: int, accepted_rows: list[int], draft_kept: int) -> None:
        """4. Roll back: the one place a round shortens the caches.

        The target keeps the committed prefix 0..L (``last`` at L) and, after it, the verified rows of the
        accepted proposal tokens (indices into the proposal; a chain's prefix is a view, a tree's path a
        gather). The draft keeps its first ``draft_kept`` proposal positions; 5. its catch-up is the next
        proposal's first feed.
        """
        self.tcache.crop(L + 1, keep=[L + 1 + i for i in accepted_rows])
        if self.dcache is not None:
            self.dcache.crop(min(self.dcache.length, L + 1 + draft_kept))

    def _tree_q(self, logits: np.ndarray, sp: SamplingParams) -> np.ndarray:
        """The distribution tree children are drawn from: q itself when sampling; for greedy the draft's
        temperature-1 softmax, so that the top-m children and the shape are informed by its uncertainty."""
        return self._draft_probs(logits, SamplingParams(1.0) if sp.greedy else sp)

    def _propose_tree(self, shape: TreeShape, sp: SamplingParams, rng: np.random.Generator) -> TokenTree:
        """Grow a token tree with the draft, one draft run per level (see :mod:`.tree`)."""
        L = len(self.tokens) - 1
        tree = TokenTree()
        feed = self.tokens[self.dcache.length:]
        t0 = time.perf_counter()
        logits = self.draft.forward(feed, self.dcache, keep=1)
        ms = (time.perf_counter() - t0) * 1e3
        self.draft_step_ms, self.catchup = ([ms], (0.0, 0)) if len(feed) == 1 else ([], (ms, len(feed) - 1))
        committed = self.dcache.length  # = L + 1: everything up to and including `last`
        frontier, score, slot = [-1], {-1: 1.0}, {}
        for depth in range(1, shape.depth + 1):
            level = []
            for v, row in zip(frontier, logits):
                q = self._tree_q(row, sp)
                tree.q[v] = q
                m = min(1 if q.max() >= shape.confident else shape.branch, shape.budget - len(tree))
                for x in pick_children(q, m, sp, rng):
                    c = tree.add(v, x)
                    score[c] = score[v] * q[x]
                    level.append(c)
            if not level or len(tree) >= shape.budget or depth == shape.depth:
                break
            frontier = sorted(level, key=lambda c: -score[c])[:shape.width]
            start = self.dcache.length
            mask = np.zeros((1, 1, len(frontier), start + len(frontier)), dtype=bool)
            mask[..., :committed] = True
            for j, c in enumerate(frontier):
                a = tree.parents[c]
                while a >= 0:
                    mask[0, 0, j, slot[a]] = True
                    a = tree.parents[a]
                mask[0, 0, j, start + j] = True
                slot[c] = start + j
            pos = np.array([L + tree.depth[c] for c in frontier], dtype=np.int64)
            t0 = time.perf_counter()
            logits = self.draft.forward([tree.tokens[c] for c in frontier], self.dcache, pos, mask)
            self.draft_step_ms.append((time.perf_counter() - t0) * 1e3)
        return tree

    def _tree_round(self, shape: TreeShape, sp: SamplingParams, rng: np.random.Generator,
                    stats: GenerationStats) -> tuple[list[int], int, float]:
        """One tree round: 1. draft a tree, 2. verify every node in one target run with a tree mask,
        3. walk it (greedy or multi-candidate rejection), 4. keep only the accepted path's KV entries.
        Same entry invariant as :meth:`_spec_round`. Returns (new tokens, accepted count, draft ms)."""
        L = len(self.tokens) - 1
        t0 = time.perf_counter()
        tree = self._propose_tree(shape, sp, rng)
        draft_ms = (time.perf_counter() - t0) * 1e3
        n_nodes = len(tree)
        mask = np.ones((1, 1, n_nodes + 1, L + n_nodes + 1), dtype=bool)
        mask[0, 0, :, L:] = tree.ancestors_mask()
        pos = L + np.array([0] + tree.depth, dtype=np.int64)
        p = probs(self.target.forward([self.tokens[-1]] + tree.tokens, self.tcache, pos, mask), sp)
        path, x = verify_tree(tree, p, sp, rng)
        self._roll_back(L, path, draft_kept=0)
        leaf = not tree.children.get(path[-1] if path else -1)
        stats.proposed += n_nodes
        stats.accepted += len(path)
        stats.corrections += int(not leaf)
        stats.bonus += int(leaf)
        stats.record_position(max(tree.depth, default=0), len(path))
        return [tree.tokens[i] for i in path] + [x], len(path), draft_ms

    def _round(self, source: str, k: int, candidate: list[int], sp: SamplingParams, rng: np.random.Generator,
               p_min: float | None, stats: GenerationStats) -> tuple[list[int], int, float, int]:
        """One target run: a plain step (K = 0), or a proposal from ``source`` (draft chain, tree, or the
        prompt-lookup ``candidate``) verified by it. Returns (new tokens, accepted proposal tokens, draft ms,
        the K actually proposed: a chain can stop early, a lookup match can be shorter; a tree's node budget)."""
        if k == 0 or source == "catchup":
            stats.plain_steps += 1
            x = self._plain_step(sp, rng)
            if source != "catchup" or self.dcache is None:
                return [x], 0, 0.0, 0
            # a plain step, then up to K tokens of the draft's lag (a catch-up sized to a latency budget); the
            # token this step adds stays unfed, so the next proposal still starts with a feed
            start = self.dcache.length
            feed = self.tokens[start:min(start + k, len(self.tokens))]
            t0 = time.perf_counter()
            if feed:
                self.draft.forward(feed, self.dcache, keep=1)
            ms = (time.perf_counter() - t0) * 1e3
            self.catchup, self.draft_step_ms = (ms, len(feed)), []
            stats.draft_ms += ms
            return [x], 0, ms, 0
        t0 = time.perf_counter()
        if source == "tree":
            stats.tree_rounds += 1
            new, n, draft_ms = self._tree_round(TreeShape.for_budget(k), sp, rng, stats)
            stats.draft_ms += draft_ms
            return new, n, draft_ms, k
        if source == "lookup":
            drafted, q = candidate[:k], None
            if not sp.greedy:
                q = np.zeros((len(drafted), self.width))
                q[np.arange(len(drafted)), drafted] = 1.0  # one-hot q: accepted with probability p(x)
            stats.lookup_rounds += 1
        else:
            drafted, q = self._propose_draft(k, sp, rng, p_min)
        draft_ms = (time.perf_counter() - t0) * 1e3
        stats.draft_ms += draft_ms
        new, n = self._spec_round(drafted, q, sp, rng, stats)
        if source == "lookup":
            stats.lookup_accepted += n
        return new, n, draft_ms, len(drafted)

    # -- generation ------------------------------------------------------------------------------------

    def generate_ids(self, input_ids: list[int], max_new_tokens: int = 256, sampling: SamplingParams = SamplingParams(),
                     seed: int | None = None, k: int | KPolicy = 4, mode: str = "spec", lookup: bool = False,
                     stats: GenerationStats | None = None, tree: bool = False,
                     draft_p_min: float | None = None) -> Iterator[tuple[list[int], int]]:
        """Yield ``(new token ids, how many of them are accepted proposal tokens)`` per target run.

        ``mode``: ``spec`` (draft model; with ``lookup=True`` prompt lookup first, the draft model when
        lookup has no match), ``lookup`` (prompt lookup only, no draft model) or ``plain`` (target only).
        An int ``k`` is a fixed draft length, or with ``tree=True`` a fixed tree node budget; a
        :class:`KPolicy` (e.g. :class:`~edgespec.adaptive.AdaptiveK`) chooses per round.
        Stop tokens end generation and are not yielded. ``max_new_tokens`` is never exceeded; K is clamped
        so that every verified position stays inside the context. ``stats`` (if given) is filled in place.

        Raises:
            ValueError: empty prompt, prompt not shorter than the context, bad mode/K/max_new_tokens.
        """
        if mode not in ("spec", "lookup", "plain"):
            raise ValueError(f"mode must be 'spec', 'lookup' or 'plain', got {mode!r}")
        if mode == "spec" and self.draft is None:
            raise ValueError("this decoder was loaded without its draft; use mode='plain' or 'lookup'")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be ≥ 1, got {max_new_tokens}")
        if isinstance(k, int):
            policy = FixedK(k, draft=mode == "spec", tree=tree)
        else:
            policy = k
        if len(input_ids) == 0:
            raise ValueError("the prompt is empty")
        if len(input_ids) >= self.context_length:
            raise ValueError(f"the prompt is {len(input_ids)} tokens; the context holds {self.context_length}")
        stats = stats if stats is not None else GenerationStats()
        stats.latency_budget_ms = getattr(policy, "budget", None)
        use_lookup = mode == "lookup" or lookup
        if draft_p_min is not None and not 0 <= draft_p_min <= 1:
            raise ValueError(f"draft_p_min must be in [0, 1], got {draft_p_min}")
        return self._generate(list(input_ids), max_new_tokens, sampling, seed, policy, mode, use_lookup, stats,
                              draft_p_min)

    def _generate(self, input_ids, max_new_tokens, sampling, seed, policy, mode, use_lookup, stats, p_min):
        stats.mode, stats.prompt_tokens = mode, len(input_ids)
        rng = np.random.default_rng(seed)
        t_start = time.perf_counter()
        new, n_from_proposal = [self._prefill(input_ids, sampling, rng)], 0
        stats.prefill_ms = (time.perf_counter() - t_start) * 1e3
        begin, end = getattr(policy, "begin", None), getattr(policy, "end", None)
        on_confidence = getattr(policy, "observe_confidence", None) if mode != "plain" else None
        self._generation = generation = self._generation + 1
        if begin is not None:
            begin()
        try:
            while True:
                room = max_new_tokens - stats.new_tokens
                stop = next((i for i, t in enumerate(new) if t in self.stop_ids), None)
                if stop is not None and stop < room:
                    new, stats.stop_reason = new[:stop], "stop_token"
                    stats.new_tokens += 1  # the stop token was generated, not emitted
                else:
                    stop, new = None, new[:room]
                stats.new_tokens += len(new)
                yield new, min(n_from_proposal, len(new))
                stats.wall_ms = (time.perf_counter() - t_start) * 1e3
                if stop is not None:
                    break
                remaining = max_new_tokens - stats.new_tokens
                L = len(self.tokens) - 1
                if remaining <= 0:
                    stats.stop_reason = "max_new_tokens"
                    break
                if L >= self.context_length:
                    stats.stop_reason = "context"
                    break
                k_cap = min(remaining - 1, self.context_length - 1 - L)  # also caps a tree's node count
                candidate = ngram_lookup(self.tokens, k_cap) if use_lookup and mode != "plain" else []
                lag = L + 1 - self.dcache.length if self.dcache is not None else 0
                source, kk = ("draft", 0) if mode == "plain" else policy.choose(len(candidate), lag, remaining)
                kk = max(0, kk if source == "catchup" else min(kk, k_cap))
                if source in ("draft", "tree", "catchup") and (self.draft is None or mode == "lookup"):
                    source, kk = "draft", 0  # the draft model was asked for where there is none, or lookup only
                t0 = time.perf_counter()
                new, n_from_proposal, draft_ms, kk = self._round(source, kk, candidate, sampling, rng, p_min, stats)
                dt = (time.perf_counter() - t0) * 1e3
                stats.verify_ms += dt - draft_ms
                stats.rounds += 1
                stats.k_per_round.append(kk)
                stats.round_ms.append(dt)
                drafted_now = source in ("draft", "tree") and kk > 0
                step_ms = float(np.median(self.draft_step_ms)) if drafted_now and self.draft_step_ms else None
                catchup_ms, catchup_tokens = self.catchup if drafted_now or source == "catchup" else (0.0, 0)
                policy.observe(source, kk, n_from_proposal, step_ms, dt, catchup_ms, catchup_tokens)
                if on_confidence is not None and kk == 0:  # the target's top-1 probability at temperature 1
                    z = self.plain_row
                    on_confidence(float(1.0 / np.exp(z - z.max()).sum()))
                self.tokens.extend(new)
        finally:  # also when the caller stops iterating early; not for a generation a newer one replaced
            if end is not None and self._generation == generation:
                end(stats.new_tokens)
        stats.wall_ms = (time.perf_counter() - t_start) * 1e3

    def generate(self, prompt: str | None = None, *, messages: list[dict] | None = None,
                 input_ids: list[int] | None = None, max_new_tokens: int = 256, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int | None = None, k: int | KPolicy = 4,
                 mode: str = "spec", lookup: bool = False, tree: bool = False,
                 draft_p_min: float | None = None) -> "Generation":
        """Generate from a raw prompt, chat messages, or token ids; iterate the result for text pieces.

        Returns a :class:`Generation`: iterating it streams text (str), then ``.stats``, ``.text`` and
        ``.token_ids`` hold the outcome. Raises ValueError for invalid arguments (before any work).
        """
        _check_number("temperature", temperature, float)
        _check_number("top_k", top_k, int)
        _check_number("top_p", top_p, float)
        _check_number("max_new_tokens", max_new_tokens, int)
        if seed is not None and (_check_number("seed", seed, int) < 0):
            raise ValueError(f"seed must be an integer ≥ 0 or None, got {seed}")
        sp = SamplingParams(temperature, top_k, top_p)
        if input_ids is None:
            input_ids = self.encode(prompt, messages)
        else:
            if prompt is not None or messages is not None:
                raise ValueError("give one of prompt, messages or input_ids")
            input_ids = self.check_ids(input_ids)
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) and not hasattr(k, "choose"):
            raise ValueError(f"k must be an int ≥ 0 or a K policy, got {type(k).__name__}")
        if isinstance(k, (int, np.integer)) and k < 0:
            raise ValueError(f"k must be ≥ 0, got {k}")
        k = int(k) if isinstance(k, np.integer) else k
        stats = GenerationStats()
        it = self.generate_ids(list(input_ids), max_new_tokens, sp, seed, k, mode, lookup, stats, tree, draft_p_min)
        return Generation(it, self.tokenizer, stats)


def _check_number(name: str, value, kind: type):
    """``value`` if it is a real number of ``kind`` (an int for ``int``; bool is not a number here)."""
    ok = (isinstance(value, (int, np.integer)) if kind is int else
          isinstance(value, (int, float, np.integer, np.floating)))
    if isinstance(value, bool) or not ok:
        raise ValueError(f"{name} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    return value


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
