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
long for one round runs in pieces after plain steps (plans with ``catchup_tokens``), and every check uses the 90th
percentile of recent measured / predicted round times rather than the mean.

A cost model that cannot go stale: the calibrated curves t_v(N) and t_d are shapes; their scale is measured all
the time. Every plain step and every verify measures t_v(N) and every draft step t_d, and the medians of the last 8 measured /
calibrated ratios rescale the target's and the draft's curves (the draft follows the target's scale until its
own steps are measured). A calibration taken on a busy machine, 3× too slow, is therefore corrected after a few
plain steps instead of keeping the controller from ever drafting.

Every estimate (acceptance, overhead factor, tries) is kept per proposer, keyed by its name; a proposer is
costed by what it declares: the draft model's chain (K draft steps), its tree (one draft run per level), or no
model (verify rows only, like prompt lookup: up to ``free_k_max`` tokens, with acceptance tracked per matched
n-gram length, as a 4-gram match is accepted far more often than a 2-gram one). Pure decision logic: the costs come in a :class:`CostModel`
measured by :mod:`.calibrate`.
"""


from __future__ import annotations


from .calibrate import CostModel
from .estimators import AnswerLengths, ModelScales, RoundTimeSpread
from .kpolicy import KPolicy
from ..core.round import RoundPlan, RoundResult, Situation
from ..draft.base import PROPOSERS, Proposer
from ..core.token_tree import TreeShape

__all__ = ["AdaptiveK", "CostModel", "expected_tokens"]

_DRAFT = PROPOSERS["draft"]()  # the proposer alpha() describes by default: the draft model's chain


def expected_tokens(k: int, alpha: float) -> float:
    """E[committed tokens] for draft length K at acceptance rate alpha (Leviathan et al. 2023, eq. 1)."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class AdaptiveK(KPolicy):
    """K policy (see module docstring).

    Costs: the calibrated model predicts each option's round time; a per-proposer overhead factor, learned
    from measured rounds (EWMA of measured / predicted), adds what the model leaves out (sampling
    arithmetic over the vocabulary, the draft's catch-up, cache effects of alternating two models). Plain
    steps are costed by their own measured EWMA. Proposals without a model cost t_v(K+1) (no draft run) and
    have their own acceptance estimate (prior ``lookup_alpha0``); a tree of N nodes costs t_v(N+1) plus one
    draft run per level.
    """

    honours_budget = True

    def __init__(self, cost: CostModel, k_max: int = 6, latency_budget_ms: float | None = None,
                 alpha0: float = 0.7, decay: float = 0.8, hysteresis: float = 0.03, probe_every: int = 8,
                 probe_k: int = 2, lookup_alpha0: float = 0.7, tree_budgets: tuple[int, ...] = (4, 6, 8, 12),
                 catchup_margin: float = 0.10, free_k_max: int | None = None):
        self.cost, self.k_max, self.latency_budget_ms = cost, k_max, latency_budget_ms
        # proposals without a model cost only verified rows: they may run longer than a draft chain
        self.free_k_max = 2 * k_max if free_k_max is None else free_k_max
        self._offered_match: dict[str, int] = {}  # the match of each proposer's offer in the last choose()
        self.alpha0, self.lookup_alpha0, self.catchup_margin = alpha0, lookup_alpha0, catchup_margin
        self.counts: dict[str, list[float]] = {}  # pseudo-counts of accepted / rejected tokens, per proposer
        self.overhead: dict[str, float] = {}  # measured / modelled round time per proposer (learned)
        self.rounds: dict[str, int] = {}  # rounds observed per proposer over this controller's life
        # measured / calibrated time of the target's plain step and of the draft's step, newest last: their
        # medians rescale the calibrated curves, so a stale calibration corrects itself within a few rounds
        self.scales = ModelScales()
        self.catchup_measured_ms: float | None = None  # per token the draft has not seen, once measured
        self.decay, self.hysteresis = decay, hysteresis
        self.probe_every, self.probe_k = probe_every, probe_k
        self.plain_run = 0
        # trees: EWMA of accepted tokens per round for each node budget, optimistic start (the chain's
        # expectation at the tree's depth) so that every budget gets tried
        self.tree_budgets = tree_budgets
        self.tree_accepted: dict[str, dict[int, float]] = {}
        self.conf_sum, self.conf_n = 0.0, 0  # the target's top-1 probabilities at plain steps (this answer)
        self.answer = AnswerLengths()  # new tokens of this controller's finished answers and of the current one
        # recent measured / modelled round-time ratios per proposer (None: plain steps); a budget plans with p90
        self.spread = RoundTimeSpread()
        self.memory_path = None  # where end() writes the learned state (for_decoder(memory=...))

    @property
    def lengths(self) -> list[int]:
        """New tokens of this controller's finished answers (the last 32), newest last."""
        return self.answer.lengths

    @lengths.setter
    def lengths(self, lengths: list[int]) -> None:
        self.answer.lengths = lengths

    @property
    def generated(self) -> int:
        """New tokens of the current answer so far."""
        return self.answer.generated

    @generated.setter
    def generated(self, n: int) -> None:
        self.answer.generated = n

    @property
    def scale_samples(self) -> dict[str, list[float]]:
        """The last 8 measured / calibrated times of the target and the draft (:class:`.estimators.ModelScales`)."""
        return self.scales.samples

    # -- answer length ----------------------------------------------------------------------------------

    def begin(self) -> None:
        """A new answer starts (called by the decoder after its prefill)."""
        self.answer.begin()
        self.plain_run = 0
        self.conf_sum, self.conf_n = 0.0, 0

    def end(self, new_tokens: int) -> None:
        """The answer ended with ``new_tokens`` tokens; remembered (last 32) to predict later answers' length.
        With a memory file (:meth:`for_decoder` with ``memory``) the learned state is written to it."""
        self.answer.end(new_tokens)
        if self.memory_path is not None:
            from .memory import write_state

            write_state(self.memory_path, self.state())

    # -- what persists ----------------------------------------------------------------------------------

    def state(self) -> dict:
        """What this controller learned, as JSON data (:mod:`.memory` validates and stores it)."""
        from .memory import VERSION

        return {"version": VERSION, "lengths": list(self.lengths),
                "counts": {k: list(v) for k, v in self.counts.items()}, "overhead": dict(self.overhead),
                "rounds": dict(self.rounds), "scale_samples": {k: list(v) for k, v in self.scale_samples.items()},
                "catchup_measured_ms": self.catchup_measured_ms,
                "tree_accepted": {k: {str(n): v for n, v in d.items()} for k, d in self.tree_accepted.items()}}

    def load_state(self, state: dict) -> None:
        """Continue from ``state`` (validated by :func:`~edgespec.control.memory.parse_state`)."""
        self.lengths, self.counts = list(state["lengths"]), {k: list(v) for k, v in state["counts"].items()}
        self.overhead, self.rounds = dict(state["overhead"]), dict(state["rounds"])
        self.catchup_measured_ms = state["catchup_measured_ms"]
        self.tree_accepted = {k: dict(d) for k, d in state["tree_accepted"].items()}
        self.scales = ModelScales()
        for model, samples in state["scale_samples"].items():
            for r in samples:
                self._sample_scale(model, r)

    def expected_remaining(self, horizon: int) -> float:
        """Expected new tokens still to come in this answer, at most ``horizon``.

        From the earlier answers of this controller (and, with ``memory``, of earlier processes on this device
        and export) that ran longer than the current one: their mean excess; if none ran longer, the current
        length itself (an answer that has run n tokens is expected to run about n more: the rule of a
        scale-free length prior, and the break-even rule of rent-or-buy problems). With no answer seen at all,
        the larger of that and half the tokens the request still allows (``horizon``: ``max_new_tokens`` less
        those out), the mean of a length uniform up to the request's limit.
        """
        return self.answer.expected_remaining(horizon)

    # -- estimates --------------------------------------------------------------------------------------

    def alpha(self, proposer: Proposer | None = None, match: int = 0) -> float:
        """Current acceptance estimate of ``proposer`` (default: the draft model's chain), in [0, 1]; with
        ``match`` > 0, that of its offers of that match (prompt lookup: per matched n-gram length, since longer
        matches are accepted more often).

        Before this controller has seen any round of a draft-model chain, its estimate is the mean top-1
        probability of the target over the plain steps so far when the decoder reports it
        (:meth:`observe_confidence`): a free proxy of greedy acceptance (over the 12 built-in benchmark prompts,
        agreement 0.64 on chat to 0.98 on code, the two differed by 0.03 at the median and 0.11 at most:
        ``bench/confidence_proxy.py``), with the prior ``alpha0`` weighing as 4 steps."""
        p = proposer or _DRAFT
        if p.uses_draft and not self.rounds.get(p.name):  # prior alpha0 weighs as much as 4 plain steps
            return (4 * self.alpha0 + self.conf_sum) / (4 + self.conf_n)
        a, r = self._counts(p, match)
        return a / (a + r)

    def _counts(self, p: Proposer, match: int = 0) -> list[float]:
        """Pseudo-counts [accepted, rejected] of ``p``; with ``match`` > 0 those of its offers of that match
        (prompt lookup: of that n-gram length), which start from the proposer's overall counts."""
        if p.name not in self.counts:
            a0 = self.alpha0 if p.uses_draft else self.lookup_alpha0
            self.counts[p.name] = [a0 * 2, (1 - a0) * 2]
        if match <= 0:
            return self.counts[p.name]
        key = f"{p.name}/{match}"
        if key not in self.counts:
            self.counts[key] = list(self.counts[p.name])
        return self.counts[key]

    def _tree_accepted(self, p: Proposer) -> dict[int, float]:
        if p.name not in self.tree_accepted:
            self.tree_accepted[p.name] = {b: expected_tokens(TreeShape.for_budget(b).depth, self.alpha0) - 1
                                          for b in self.tree_budgets}
        return self.tree_accepted[p.name]

    def _tree_tokens(self, p: Proposer, n_nodes: int) -> float:
        """Expected committed tokens of a tree round of ``n_nodes`` (accepted EWMA + 1; optimistic at first)."""
        acc = self._tree_accepted(p)
        if n_nodes not in acc:
            acc[n_nodes] = expected_tokens(TreeShape.for_budget(n_nodes).depth, self.alpha0) - 1
        return acc[n_nodes] + 1

    def observe_confidence(self, top1: float) -> None:
        """The target's top-1 probability (temperature 1) at a plain step."""
        self.conf_sum += top1
        self.conf_n += 1

    # -- costs ------------------------------------------------------------------------------------------

    def scale(self, model: str) -> float:
        """Measured / calibrated time of ``model`` ("target" or "draft"): the median of its last 8 measured
        runs (target: plain steps and verifies of N rows against t_v(N); draft: one-token steps), 1.0 before
        any. The draft follows the target's scale until its own steps are measured (a calibration made while
        the machine was busy is off for both). Kept up to date by :meth:`_sample_scale`: ``choose`` asks for
        it a dozen times a round."""
        return self.scales.scale(model)

    @property
    def plain_ms(self) -> float:
        """Predicted plain target step (ms): calibrated t_v(1) times the target's measured scale."""
        return self.cost.t_verify(1) * self.scale("target")

    @property
    def draft_step_ms(self) -> float:
        """Predicted one-token draft step (ms): calibrated t_d times the draft's measured scale."""
        return self.cost.draft_ms * self.scale("draft")

    @property
    def catchup_ms(self) -> float:
        """Predicted draft catch-up per unseen token (ms): measured on long feeds, else calibrated × scale."""
        if self.catchup_measured_ms is not None:
            return self.catchup_measured_ms
        return self.cost.draft_prefill_ms * self.scale("draft")

    def _model_ms(self, p: Proposer, k: int) -> float:
        """The cost model's round time for proposer ``p`` with K (tree: N nodes) and the draft runs ``p``
        declares for that size (:meth:`~edgespec.draft.base.Proposer.draft_runs`): calibrated curves, rescaled
        by the measured target and draft scales."""
        return self.cost.round_ms(k, p.draft_runs(k), self.scale("target"), self.scale("draft"))

    def _sample_scale(self, model: str, ratio: float) -> None:
        self.scales.sample(model, ratio)

    def predicted_ms(self, p: Proposer, k: int) -> float:
        """Predicted wall time of a round (ms): K = 0 is a plain step."""
        return self.plain_ms if k == 0 else self._model_ms(p, k) * self.overhead.get(p.name, 1.0)

    def _high_ms(self, p: Proposer, k: int) -> float:
        """A pessimistic round time for budget checks: the model times the 90th percentile of recent
        measured/modelled ratios (at least the mean overhead; 1.15 before any round of ``p``)."""
        base = self.plain_ms if k == 0 else self._model_ms(p, k)
        p90 = self.spread.p90(None if k == 0 else p.name)
        hi = max(p90, 1.0 if k == 0 else self.overhead.get(p.name, 1.0)) if p90 is not None else 1.15
        return base * hi

    def _fits(self, p: Proposer, k: int, extra_ms: float = 0.0) -> bool:
        return self.latency_budget_ms is None or self._high_ms(p, k) + extra_ms <= self.latency_budget_ms

    def _best(self, p: Proposer, ks, catchup_ms: float = 0.0, remaining: float = 128.0,
              with_catchup: bool = False, match: int = 0) -> tuple[int, float]:
        """(K, predicted tokens/ms) for ``p`` over ``ks`` whose round (``with_catchup``: plus the catch-up)
        fits the budget; (0, -1) if none.

        A one-time draft catch-up of ``catchup_ms`` is spread over the ``remaining`` tokens it would serve."""
        best = (0, -1.0)
        for k in ks:
            if not self._fits(p, k, catchup_ms if with_catchup else 0.0):
                continue
            t = self.predicted_ms(p, k)
            tokens = self._tree_tokens(p, k) if p.sized_by_nodes else expected_tokens(k, self.alpha(p, match))
            rate = tokens / (t + catchup_ms * tokens / remaining)
            if rate > best[1]:
                best = (k, rate)
        return best

    # -- the decision -----------------------------------------------------------------------------------

    @staticmethod
    def _plan(p: Proposer, k: int) -> RoundPlan:
        return RoundPlan(p, n_nodes=k) if p.sized_by_nodes else RoundPlan(p, k=k)

    def _sizes(self, p: Proposer):
        return self.tree_budgets if p.sized_by_nodes else range(1, self.k_max + 1)

    def choose(self, situation: Situation) -> RoundPlan:
        """The next round (see :class:`~edgespec.control.kpolicy.KPolicy`); with a latency budget also a plain step
        with ``catchup_tokens`` of the draft's catch-up, when the whole catch-up does not fit in one round."""
        options = []
        remaining = self.expected_remaining(situation.horizon or 128)
        catchup = max(situation.lag - 1, 0) * self.catchup_ms
        free = [o for o in situation.offers if not o.proposer.uses_draft and o.limit > 0]
        for o in situation.offers:
            if o.proposer.uses_draft:
                options.append((o.proposer, *self._best(o.proposer, self._sizes(o.proposer), catchup, remaining)))
        self._offered_match = {o.proposer.name: o.match for o in situation.offers}
        for o in free:
            p, top = o.proposer, min(o.limit, self.free_k_max)
            first = min(top, self.probe_k)
            if not self.rounds.get(p.name) and o.limit >= 2 and self._fits(p, first):
                # never tried: a short try costs only a couple of extra verified rows, so learn its alpha (a long
                # one cost a 12-token voice answer ~10%; the per-match estimates lengthen later tries)
                self.plain_run = 0
                return self._plan(p, first)
            sizes = sorted({min(b, o.limit) for b in self.tree_budgets}) if p.sized_by_nodes else range(1, top + 1)
            options.append((p, *self._best(p, sizes, match=o.match)))
        p, k, rate = max(options, key=lambda o: o[2], default=(None, 0, -1.0))
        # must beat plain decoding by a margin; a larger one when it means paying a catch-up now (a sure cost
        # against a gain that rests on estimates of acceptance and of the answer's length)
        big = catchup > self.plain_ms and p is not None and p.uses_draft
        margin = max(self.hysteresis, self.catchup_margin) if big else self.hysteresis
        if k > 0 and rate >= (1 + margin) / self.plain_ms:
            self.plain_run = 0
            if p.uses_draft and catchup > 0 and not self._fits(p, k, catchup):
                k2, rate2 = self._best(p, self._sizes(p), catchup, remaining, with_catchup=True)
                if k2 > 0 and rate2 >= (1 + margin) / self.plain_ms:
                    return self._plan(p, k2)  # a smaller K leaves room for the catch-up
                return self._catchup_round(situation.lag)
            return self._plan(p, k)
        self.plain_run += 1
        # re-probe, so acceptance estimates can recover; a draft probe only if its catch-up is cheap
        if self.plain_run >= self.probe_every and (free or catchup <= 0.05 * self.plain_ms * remaining):
            self.plain_run = 0
            chains = [o for o in situation.offers if o.proposer.uses_draft and not o.proposer.sized_by_nodes]
            probe = free[0] if free else (chains[0] if chains else None)
            if probe is None:
                return RoundPlan()
            k = min(self.probe_k, self.k_max, probe.limit if free else self.k_max)
            if self._fits(probe.proposer, k, catchup if probe.proposer.uses_draft else 0.0):
                return self._plan(probe.proposer, k)
        return RoundPlan()

    def _catchup_round(self, lag: int) -> RoundPlan:
        """A plain step plus as much of the draft's catch-up as the budget leaves room for: a feed of m tokens
        costs about one draft step plus m - 1 tokens of catch-up (with a 15% margin); a plain step if not even
        one token fits."""
        room = self.latency_budget_ms - self._high_ms(_DRAFT, 0) - 1.15 * self.draft_step_ms
        if room < 0:
            return RoundPlan()
        m = 1 + int(room // max(1.15 * self.catchup_ms, 1e-3))
        return RoundPlan(catchup_tokens=min(m, lag))

    def observe(self, result: RoundResult) -> None:
        """Learn from a finished round: the proposer's acceptance, its overhead factor (catch-up excluded), the
        target and draft scales (every plain step and verify measures t_v(N), every draft step t_d), the catch-up time
        per token (EWMA), and the answer's length so far."""
        r, p, k = result, result.proposer, result.size
        self.answer.generated += r.accepted + 1
        catchup_ms = r.catchup_ms
        if p is not None and r.catchup_tokens > 0:  # the feed also drafted the first token
            catchup_ms = max(catchup_ms - (r.draft_step_ms or self.draft_step_ms), 0.0)
        if r.catchup_tokens >= 8:  # short feeds mostly measure a run's fixed cost, not the per-token one
            prev = self.catchup_ms
            self.catchup_measured_ms = 0.7 * prev + 0.3 * (catchup_ms / r.catchup_tokens)
        if r.draft_step_ms is not None:
            self._sample_scale("draft", r.draft_step_ms / self.cost.draft_ms)
        if p is None or k == 0:  # a plain step, or a plain step with a catch-up
            plain = r.round_ms - catchup_ms
            self._ratio(None, plain / self.plain_ms)
            self._sample_scale("target", plain / self.cost.t_verify(1))
            return
        if r.draft_ms > 0 or not p.uses_draft:  # the verify of N rows is the round less its proposing time
            self._sample_scale("target", (r.round_ms - r.draft_ms) / self.cost.t_verify(r.proposed + 1))
        ratio = (r.round_ms - catchup_ms) / self._model_ms(p, k)
        self._ratio(p.name, ratio)
        self.overhead[p.name] = 0.7 * self.overhead.get(p.name, 1.0) + 0.3 * ratio
        if p.sized_by_nodes:
            self.rounds[p.name] = self.rounds.get(p.name, 0) + 1
            acc = self._tree_accepted(p)
            acc[k] = 0.8 * (acc[k] if k in acc else self._tree_tokens(p, k) - 1) + 0.2 * r.accepted
            return
        self.rounds[p.name] = self.rounds.get(p.name, 0) + 1
        match = self._offered_match.get(p.name, 0)
        for c in [self._counts(p)] + ([self._counts(p, match)] if match > 0 else []):
            c[0] = self.decay * c[0] + r.accepted
            c[1] = self.decay * c[1] + int(r.accepted < k)

    def _ratio(self, key: str | None, r: float) -> None:
        # the p90 is kept up to date only under a budget (choose() then asks for it a dozen times a round)
        self.spread.add(key, r, tracked=self.latency_budget_ms is not None)

    @classmethod
    def for_decoder(cls, decoder, latency_budget_ms: float | None = None, k_max: int = 6,
                    memory: str | None = None, **kw) -> "AdaptiveK":
        """A controller with ``decoder``'s calibrated cost model (measured once per device and export, see
        :func:`~edgespec.control.calibrate.calibrate`). ``memory``: a name for the use (the CLI passes its command:
        ``generate``, ``chat``, ``serve``, ``complete``): start from what earlier processes of that use learned on
        this device and export, and keep it up to date (:mod:`.memory`; a missing or invalid file:
        cold). None (the default): start cold, save nothing."""
        from .calibrate import calibrate

        policy = cls(calibrate(decoder, k_max), k_max=k_max, latency_budget_ms=latency_budget_ms, **kw)
        if memory:
            from .memory import memory_path, read_state

            policy.memory_path = memory_path(decoder, k_max, memory)
            state = read_state(policy.memory_path)
            if state is not None:
                policy.load_state(state)
        return policy
