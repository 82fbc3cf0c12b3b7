"""Adaptive K: a measured cost model and an online acceptance estimate pick K each round.

Expected tokens committed by a round of draft length K with per-token acceptance rate alpha (Leviathan et al.
2023, eq. 1): ``E[tokens | K, alpha] = (1 - alpha^(K+1)) / (1 - alpha)``. The round costs
``K·t_d + t_v(K+1)`` ms (draft step t_d, target verify of N rows t_v(N)). The controller picks the K ≤ K_max
that maximizes tokens per ms, K = 0 (a plain target step, 1 token in t_v(1)) when speculation is not predicted
to pay, with hysteresis against flapping and a probe round every ``probe_every`` plain steps so that it
recovers when the text becomes predictable. A latency budget B removes every K whose predicted round time
exceeds B.

Paying the draft's catch-up. Before the draft can propose it must read every token it has not seen (the
prompt, at ~1.8 ms a token on the 0.5B draft here: ``bench/microbench.py``). That one-time cost is spread over the tokens the answer
is still expected to run: the mean excess of this controller's earlier answers that ran longer, or, with no
such history, as many tokens as the answer has run so far (rent or buy: pay once what plain decoding has
already lost would have paid for it). Short answers (a voice assistant's 10–20 tokens) therefore never pay
it, and a session that has seen them stops paying it. Until the controller has seen a draft round, acceptance
is estimated from the target's own top-1 probabilities at plain steps. With a latency budget, a catch-up too
long for one round runs in pieces after plain steps (``("catchup", m)``), and every check uses the 90th
percentile of recent measured / predicted round times rather than the mean.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass

import numpy as np

from . import paths
from .tree import TreeShape


@dataclass
class CostModel:
    """Measured costs in ms: ``verify_ms[N-1]`` = target run of N rows; ``draft_ms`` = one draft step;
    ``draft_prefill_ms`` = draft time per token of a many-token feed (its catch-up on unseen tokens)."""

    verify_ms: list[float]
    draft_ms: float
    draft_prefill_ms: float = 1.0

    def t_verify(self, n: int) -> float:
        """Predicted target time for N rows (linear extrapolation past the measured range)."""
        v = self.verify_ms
        if n <= len(v):
            return v[n - 1]
        slope = (v[-1] - v[0]) / max(len(v) - 1, 1)
        return v[-1] + slope * (n - len(v))

    def round_ms(self, k: int) -> float:
        """Predicted wall time of a round with draft length K (K = 0: one plain step)."""
        return k * self.draft_ms + self.t_verify(k + 1)


def expected_tokens(k: int, alpha: float) -> float:
    """E[committed tokens] for draft length K at acceptance rate alpha (Leviathan et al. 2023, eq. 1)."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class AdaptiveK:
    """K policy (see module docstring).

    Costs: the calibrated model predicts each option's round time; a per-source overhead factor, learned
    from measured rounds (EWMA of measured / predicted), adds what the model leaves out (sampling
    arithmetic over the vocabulary, the draft's catch-up, cache effects of alternating two models). Plain
    steps are costed by their own measured EWMA. Prompt lookup proposals cost t_v(K+1) (no draft run) and
    have their own acceptance estimate; a tree of N nodes costs t_v(N+1) plus one draft run per level.
    """

    def __init__(self, cost: CostModel, k_max: int = 6, latency_budget_ms: float | None = None,
                 alpha0: float = 0.7, decay: float = 0.8, hysteresis: float = 0.03, probe_every: int = 8,
                 probe_k: int = 2, has_draft: bool = True, lookup_alpha0: float = 0.7, tree: bool = False,
                 tree_budgets: tuple[int, ...] = (4, 6, 8, 12), catchup_margin: float = 0.10):
        self.cost, self.k_max, self.budget = cost, k_max, latency_budget_ms
        self.alpha0, self.catchup_margin = alpha0, catchup_margin
        # pseudo-counts of accepted / rejected proposal tokens, per source
        self.counts = {"draft": [alpha0 * 2, (1 - alpha0) * 2], "lookup": [lookup_alpha0 * 2, (1 - lookup_alpha0) * 2]}
        self.overhead = {"draft": 1.0, "lookup": 1.0, "tree": 1.0}  # measured / modelled round time (learned)
        self.plain_ms = cost.t_verify(1)
        self.catchup_ms = cost.draft_prefill_ms  # per token the draft has not seen
        self.decay, self.hysteresis = decay, hysteresis
        self.probe_every, self.probe_k = probe_every, probe_k
        self.has_draft = has_draft
        self.plain_run = 0
        # trees: EWMA of accepted tokens per round for each node budget, optimistic start (the chain's
        # expectation at the tree's depth) so that every budget gets tried
        self.tree_budgets = tree_budgets if tree and has_draft else ()
        self.tree_accepted = {b: expected_tokens(TreeShape.for_budget(b).depth, alpha0) - 1 for b in self.tree_budgets}
        self.draft_rounds = self.lookup_rounds = 0  # rounds observed over this controller's life
        self.conf_sum, self.conf_n = 0.0, 0  # the target's top-1 probabilities at plain steps (this answer)
        self.lengths: list[int] = []  # new tokens of this controller's finished answers, newest last
        self.generated = 0  # new tokens of the current answer so far
        # recent measured / modelled round-time ratios per source: a latency budget plans with their p90
        self.ratios: dict[str, list[float]] = {"draft": [], "lookup": [], "tree": [], "plain": []}
        self._p90: dict[str, float] = {}

    # -- answer length ----------------------------------------------------------------------------------

    def begin(self) -> None:
        """A new answer starts (called by the decoder after its prefill)."""
        self.generated, self.plain_run = 0, 0
        self.conf_sum, self.conf_n = 0.0, 0

    def end(self, new_tokens: int) -> None:
        """The answer ended with ``new_tokens`` tokens; remembered (last 32) to predict later answers' length."""
        self.lengths = (self.lengths + [int(new_tokens)])[-32:]

    def expected_remaining(self, horizon: int) -> float:
        """Expected new tokens still to come in this answer, at most ``horizon``.

        From the earlier answers of this controller that ran longer than the current one: their mean excess.
        Without such history, the current length itself (an answer that has run n tokens is expected to run
        about n more: the rule of a scale-free length prior, and the break-even rule of rent-or-buy problems),
        so a draft whose catch-up costs C ms starts once about C / (ms saved per token) tokens are out.
        """
        n = self.generated
        longer = [length - n for length in self.lengths if length > n]
        r = float(np.mean(longer)) if longer else float(max(n, 1))
        return max(1.0, min(r, float(horizon)))

    def alpha(self, source: str = "draft") -> float:
        """Current acceptance estimate of ``source``, in [0, 1].

        Before this controller has seen any draft round, the draft's estimate is the mean top-1 probability
        of the target over the plain steps so far when the decoder reports it (:meth:`observe_confidence`):
        a free proxy of greedy acceptance (over the 12 built-in benchmark prompts, agreement 0.64 on chat to
        0.98 on code, the two differed by 0.03 at the median and 0.11 at most: ``bench/confidence_proxy.py``),
        with the prior ``alpha0`` weighing as 4 steps."""
        if source == "draft" and not self.draft_rounds:  # prior alpha0 weighs as much as 4 plain steps
            return (4 * self.alpha0 + self.conf_sum) / (4 + self.conf_n)
        a, r = self.counts[source]
        return a / (a + r)

    def observe_confidence(self, top1: float) -> None:
        """The target's top-1 probability (temperature 1) at a plain step."""
        self.conf_sum += top1
        self.conf_n += 1

    def _model_ms(self, source: str, k: int) -> float:
        """The calibrated cost model's round time for ``source`` with K (tree: N nodes)."""
        if source == "lookup":
            return self.cost.t_verify(k + 1)
        if source == "tree":
            return self.cost.t_verify(k + 1) + TreeShape.for_budget(k).depth * self.cost.draft_ms
        return self.cost.round_ms(k)

    def predicted_ms(self, source: str, k: int) -> float:
        """Predicted wall time of a round (ms): K = 0 is a plain step."""
        return self.plain_ms if k == 0 else self._model_ms(source, k) * self.overhead[source]

    def _high_ms(self, source: str, k: int) -> float:
        """A pessimistic round time for budget checks: the model times the 90th percentile of recent
        measured/modelled ratios (at least the mean overhead; 1.15 before any round of ``source``)."""
        base = self.plain_ms if k == 0 else self._model_ms(source, k)
        key = "plain" if k == 0 else source
        p90 = self._p90.get(key)
        hi = max(p90, 1.0 if k == 0 else self.overhead[source]) if p90 is not None else 1.15
        return base * hi

    def _fits(self, source: str, k: int, extra_ms: float = 0.0) -> bool:
        return self.budget is None or self._high_ms(source, k) + extra_ms <= self.budget

    def _best(self, source: str, ks, catchup_ms: float = 0.0, remaining: float = 128.0,
              with_catchup: bool = False) -> tuple[int, float]:
        """(K, predicted tokens/ms) for ``source`` over ``ks`` whose round (``with_catchup``: plus the catch-up)
        fits the budget; (0, -1) if none.

        A one-time draft catch-up of ``catchup_ms`` is spread over the ``remaining`` tokens it would serve."""
        best = (0, -1.0)
        for k in ks:
            if not self._fits(source, k, catchup_ms if with_catchup else 0.0):
                continue
            t = self.predicted_ms(source, k)
            tokens = self.tree_accepted[k] + 1 if source == "tree" else expected_tokens(k, self.alpha(source))
            rate = tokens / (t + catchup_ms * tokens / remaining)
            if rate > best[1]:
                best = (k, rate)
        return best

    def choose(self, lookup: int = 0, lag: int = 0, horizon: int | None = None) -> tuple[str, int]:
        """The next round: ``(source, K)`` (see :class:`~edgespec.kpolicy.KPolicy`); with a latency budget
        also ``("catchup", m)``: a plain step plus m tokens of the draft's catch-up, when the whole catch-up
        does not fit in one round."""
        options = []
        remaining = self.expected_remaining(horizon or 128)
        catchup = max(lag - 1, 0) * self.catchup_ms
        if self.has_draft:
            options.append(("draft", *self._best("draft", range(1, self.k_max + 1), catchup, remaining)))
        if self.tree_budgets:
            options.append(("tree", *self._best("tree", self.tree_budgets, catchup, remaining)))
        if lookup:
            if not self.lookup_rounds and lookup >= 2 and self._fits("lookup", min(lookup, self.k_max)):
                self.plain_run = 0  # never tried: one try costs only the extra verified rows, so learn its alpha
                return "lookup", min(lookup, self.k_max)
            options.append(("lookup", *self._best("lookup", range(1, min(lookup, self.k_max) + 1))))
        source, k, rate = max(options, key=lambda o: o[2], default=("draft", 0, -1.0))
        # must beat plain decoding by a margin; a larger one when it means paying a catch-up now (a sure cost
        # against a gain that rests on estimates of acceptance and of the answer's length)
        big = catchup > self.plain_ms and source != "lookup"
        margin = max(self.hysteresis, self.catchup_margin) if big else self.hysteresis
        if k > 0 and rate >= (1 + margin) / self.plain_ms:
            self.plain_run = 0
            if source in ("draft", "tree") and catchup > 0 and not self._fits(source, k, catchup):
                ks = self.tree_budgets if source == "tree" else range(1, self.k_max + 1)
                k2, rate2 = self._best(source, ks, catchup, remaining, with_catchup=True)
                if k2 > 0 and rate2 >= (1 + margin) / self.plain_ms:
                    return source, k2  # a smaller K leaves room for the catch-up
                return self._catchup_round(lag)
            return source, k
        self.plain_run += 1
        # re-probe, so acceptance estimates can recover; a draft probe only if its catch-up is cheap
        if self.plain_run >= self.probe_every and (lookup or catchup <= 0.05 * self.plain_ms * remaining):
            self.plain_run = 0
            src = "lookup" if lookup else "draft"
            if src == "draft" and not self.has_draft:
                return "draft", 0
            k = min(self.probe_k, self.k_max, lookup or self.k_max)
            if self._fits(src, k, 0.0 if src == "lookup" else catchup):
                return src, k
        return "draft", 0

    def _catchup_round(self, lag: int) -> tuple[str, int]:
        """A plain step plus as much of the draft's catch-up as the budget leaves room for: a feed of m tokens
        costs about one draft step plus m - 1 tokens of catch-up (with a 15% margin); a plain step if not even
        one token fits."""
        room = self.budget - self._high_ms("draft", 0) - 1.15 * self.cost.draft_ms
        if room < 0:
            return "draft", 0
        m = 1 + int(room // max(1.15 * self.catchup_ms, 1e-3))
        return "catchup", min(m, lag)

    def observe(self, source: str, k: int, accepted: int, draft_step_ms: float | None, round_ms: float,
                catchup_ms: float = 0.0, catchup_tokens: int = 0) -> None:
        """Learn from a finished round: the source's acceptance, its overhead factor (catch-up excluded), the
        plain step, draft step and catch-up times (all EWMA), and the answer's length so far."""
        self.generated += accepted + 1
        if source != "catchup" and catchup_tokens > 0:  # the feed also drafted the first token
            catchup_ms = max(catchup_ms - (draft_step_ms or self.cost.draft_ms), 0.0)
        if catchup_tokens >= 8:  # short feeds mostly measure a run's fixed cost, not the per-token one
            self.catchup_ms = 0.7 * self.catchup_ms + 0.3 * (catchup_ms / catchup_tokens)
        if k == 0:  # a plain step, or a plain step with a catch-up ("catchup")
            plain = round_ms - catchup_ms
            self._ratio("plain", plain / self.plain_ms)
            self.plain_ms = 0.8 * self.plain_ms + 0.2 * plain
            return
        ratio = (round_ms - catchup_ms) / self._model_ms(source, k)
        self._ratio(source, ratio)
        self.overhead[source] = 0.7 * self.overhead[source] + 0.3 * ratio
        if draft_step_ms is not None:
            self.cost.draft_ms = 0.8 * self.cost.draft_ms + 0.2 * draft_step_ms
        if source == "tree":
            if k in self.tree_accepted:
                self.tree_accepted[k] = 0.8 * self.tree_accepted[k] + 0.2 * accepted
            return
        if source == "draft":
            self.draft_rounds += 1
        elif source == "lookup":
            self.lookup_rounds += 1
        c = self.counts[source]
        c[0] = self.decay * c[0] + accepted
        c[1] = self.decay * c[1] + int(accepted < k)

    def _ratio(self, key: str, r: float) -> None:
        self.ratios[key] = (self.ratios[key] + [r])[-16:]
        if self.budget is not None:  # kept up to date here: choose() asks for it a dozen times a round
            self._p90[key] = float(np.percentile(self.ratios[key], 90))

    @classmethod
    def for_decoder(cls, decoder, latency_budget_ms: float | None = None, k_max: int = 6,
                    has_draft: bool | None = None, **kw) -> "AdaptiveK":
        """A controller with ``decoder``'s calibrated cost model (measured once per device and export).
        ``has_draft`` False restricts it to prompt lookup (default: whether the decoder has a draft)."""
        has_draft = decoder.draft is not None if has_draft is None else has_draft
        return cls(calibrate(decoder, k_max), k_max=k_max, latency_budget_ms=latency_budget_ms,
                   has_draft=has_draft, **kw)


def _calibration_path(decoder, k_max: int):
    from . import onnx_model

    m = decoder.manifest
    key = "-".join([
        m.name if m else "export", (m.target.source_sha256[:12] + m.draft.source_sha256[:12]) if m else "",
        m.target.quantization.precision if m else "", str(m.draft.vocab_size) if m else "",
        platform.node(), platform.machine(), decoder.target.session.get_providers()[0],
        str(onnx_model._POOL_THREADS or os.cpu_count()), f"k{k_max}",
        "lk" if decoder.target.has_logits_keep else "",
    ])
    return paths.home() / "calibration" / (key.replace("/", "_") + ".json")


def calibrate(decoder, k_max: int = 6, context: int = 128, reps: int = 5, use_cache: bool = True) -> CostModel:
    """Measure t_v(N) for N = 1..k_max+1, the draft step time after a ``context``-token past (median ms), and
    the draft's per-token prefill time (its catch-up cost).

    One prefill per model, then each timed run is rolled back with ``crop``; a second or two on the real
    pair. The result is cached per device, export and execution provider under the user cache.
    """
    path = _calibration_path(decoder, k_max)
    if use_cache:
        cached = _read_cost(path, k_max)
        if cached is not None:
            return cached
    rng = np.random.default_rng(0)
    ids = rng.integers(0, min(decoder.width, 1000), size=context + k_max + 1).tolist()

    prefill = {}

    def timed(model, ns):
        model.forward(ids[:8], model.new_cache())  # warm-up: a session's first run is slower
        cache = model.new_cache()
        t0 = time.perf_counter()
        model.forward(ids[:context], cache, keep=1)
        prefill[model] = (time.perf_counter() - t0) * 1e3 / context
        model.forward(ids[context:context + 1], cache)  # warm-up
        out = {}
        for n in ns:
            ts = []
            for _ in range(reps):
                cache.crop(context)
                t0 = time.perf_counter()
                model.forward(ids[context:context + n], cache)
                ts.append((time.perf_counter() - t0) * 1e3)
            out[n] = float(np.median(ts))
        return out

    tv = timed(decoder.target, range(1, k_max + 2))
    verify = [tv[n] for n in range(1, k_max + 2)]
    draft = timed(decoder.draft, [1])[1] if decoder.draft is not None else verify[0]
    cost = CostModel(verify_ms=verify, draft_ms=draft,
                     draft_prefill_ms=prefill.get(decoder.draft, prefill[decoder.target]))
    if paths.cache_dir("calibration") is not None:  # else: measured again next time (warned once)
        paths.sweep_stale(path.parent)
        paths.write_atomic(path, json.dumps(asdict(cost)))
    return cost


def _read_cost(path, k_max: int) -> CostModel | None:
    """A cached cost model if ``path`` holds a valid one: ``verify_ms`` k_max+1 finite times > 0, finite
    ``draft_ms`` and ``draft_prefill_ms`` > 0. Anything else (missing, unreadable, a directory, wrong types,
    zeros) is None: the caller measures again and rewrites the entry."""
    def ms(v) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (np.isfinite(v) and v > 0):
            raise ValueError(v)
        return float(v)

    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        cost = CostModel(verify_ms=[ms(v) for v in raw["verify_ms"]], draft_ms=ms(raw["draft_ms"]),
                         draft_prefill_ms=ms(raw["draft_prefill_ms"]))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return cost if len(cost.verify_ms) == k_max + 1 else None
