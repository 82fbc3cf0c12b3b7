"""Adaptive K: the decision that picks each round, over the controller's estimators (:mod:`.estimators`).

Expected tokens committed by a round of draft length K with per-token acceptance rate alpha (Leviathan et al.
2023, eq. 1): ``E[tokens | K, alpha] = (1 - alpha^(K+1)) / (1 - alpha)``. The round costs ``K·t_d + t_v(K+1)``
ms (draft step t_d, target verify of N rows t_v(N): :meth:`~edgespec.control.calibrate.CostModel.round_ms`).
Over every offered proposer and size the controller picks the round with the most predicted tokens per ms, a
plain step (1 token in t_v(1)) when none beats it by a margin (hysteresis against flapping), and a probe round
every ``probe_every`` plain steps so that it recovers when the text becomes predictable. A latency budget B
removes every size whose pessimistic (p90) round time exceeds B.

Paying the draft's catch-up. Before the draft can propose it must read every token it has not seen (the
prompt, at ~1.8 ms a token on the 0.5B draft here: ``bench/probes/microbench.py``). That one-time cost is spread over
the tokens the answer is still expected to run (:class:`~.estimators.AnswerLengths`: the mean excess of this
controller's earlier answers that ran longer, or, with no such history, as many tokens as the answer has run so
far: rent or buy). Short answers (a voice assistant's 10–20 tokens) therefore never pay it, and a session that
has seen them stops paying it. With a latency budget, a catch-up too long for one round runs in pieces after
plain steps (plans with ``catchup_tokens``).

What the decision reads: :class:`~.estimators.Acceptance` (alpha per proposer and per match, the target's
confidence as the prior of a draft never run), :class:`~.estimators.TreeAcceptance` (tokens per node budget),
:class:`~.estimators.AnswerLengths` and :class:`~.estimators.RoundCosts` (the calibrated curves rescaled by
the measured :class:`~.estimators.ModelScales`, so a stale calibration corrects itself within a few rounds;
overhead factors; the p90 of :class:`~.estimators.RoundTimeSpread`; the catch-up per token). Every estimate is
kept per proposer, keyed by its name, and a proposer is costed only by what it declares: ``uses_draft`` (it
pays draft steps and the catch-up), ``sized_by_nodes`` (its size is a node count), ``draft_runs(size)`` (the
draft term of the round time). No proposer class is imported. Pure decision logic: the costs come in a
:class:`CostModel` measured by :mod:`.calibrate`.
"""


from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .calibrate import CostModel
from .estimators import Acceptance, AnswerLengths, ModelScales, RoundCosts, TreeAcceptance, expected_tokens
from .kpolicy import KPolicy
from ..core.round import Offer, RoundPlan, RoundResult, Situation

if TYPE_CHECKING:
    from ..draft.base import Proposer

__all__ = ["AdaptiveK", "CostModel", "expected_tokens"]

DRAFT_CHAIN = "draft"  # the name the draft model's chain is registered under: what alpha() describes by default


def _through(estimator: str, attr: str, doc: str) -> property:
    """An attribute of AdaptiveK that is ``attr`` of its estimator ``estimator`` (read and written there)."""
    return property(lambda self: getattr(getattr(self, estimator), attr),
                    lambda self, value: setattr(getattr(self, estimator), attr, value), doc=doc)


@dataclass(frozen=True)
class Candidate:
    """The best size of one offer: ``size`` (K, or N nodes) and its predicted ``rate`` in tokens/ms (size 0,
    rate -1: no size fits the budget)."""

    offer: Offer
    size: int = 0
    rate: float = -1.0

    @property
    def proposer(self) -> "Proposer":
        """The offer's proposer."""
        return self.offer.proposer


class AdaptiveK(KPolicy):
    """K policy (see module docstring): estimators (:mod:`.estimators`) and a decision over them.

    ``alpha0``: the prior acceptance of a draft-model proposer; ``model_free_alpha0`` (default 0.7): that of a
    proposer without a model (prompt lookup, suffix, grammar; its old keyword ``lookup_alpha0=`` is still read);
    ``decay``: the acceptance counts' forgetting per round (0.9: a memory of ~10 rounds; at 0.8 two rejections
    at K = 1 priced the draft out of chat answers it paid on, ``bench/probes/controller_replay.py``); ``hysteresis``:
    the margin by which a round must beat plain decoding in predicted tokens/ms; when it means paying a draft
    catch-up longer than a plain step, the catch-up's share of the plain time the answer is still expected to
    take times ``catchup_weight`` (≥ 0), between ``hysteresis`` and ``catchup_margin`` (:meth:`_margin`;
    ``catchup_weight=math.inf`` gives the fixed ``catchup_margin`` used before 2026-12-02); ``keep_margin``: the fraction by which a
    proposer that has run since the last plain step may fall below a plain step and still run this round (the
    other side of the hysteresis band: an estimate of a few rounds' tokens swings below break-even on text it
    pays on; a prompt-lookup round between two draft rounds does not end the draft's run);
    ``probe_every`` / ``probe_k``: a probe round of ``probe_k`` after that many plain steps (``probe_k`` is
    also the size of a model-free proposer's first try); ``tree_budgets``: the node
    counts tried for proposers sized by nodes; ``free_k_max``: the longest
    proposal of a model-free proposer (default 2 × ``k_max``: it costs only verified rows).
    ``latency_budget_ms``: ms per round, None for none. ``answer_prior``: the expected length of an answer (new
    tokens) before any answer has been seen, the prior of the use (:data:`~edgespec.engine.presets.ANSWER_PRIORS`:
    a voice answer is one or two sentences); None: half of what the request allows (:meth:`expected_remaining`).

    Raises:
        ValueError: both ``model_free_alpha0`` and its old name ``lookup_alpha0`` given; ``answer_prior`` not a
        finite number > 0; ``catchup_weight`` not a number ≥ 0 (``math.inf`` allowed).
    """

    honours_budget = True

    def __init__(self, cost: CostModel, k_max: int = 6, latency_budget_ms: float | None = None,
                 alpha0: float = 0.7, decay: float = 0.9, hysteresis: float = 0.03, probe_every: int = 8,
                 probe_k: int = 1, model_free_alpha0: float | None = None,
                 tree_budgets: tuple[int, ...] = (4, 6, 8, 12), catchup_margin: float = 0.10,
                 free_k_max: int | None = None, *, lookup_alpha0: float | None = None,
                 answer_prior: float | None = None, keep_margin: float = 0.10, catchup_weight: float = 1.0):
        if answer_prior is not None and (isinstance(answer_prior, bool) or not isinstance(answer_prior, (int, float))
                                         or not math.isfinite(answer_prior) or answer_prior <= 0):
            raise ValueError(f"answer_prior {answer_prior!r}: a finite number of tokens > 0 expected")
        if (isinstance(catchup_weight, bool) or not isinstance(catchup_weight, (int, float))
                or math.isnan(catchup_weight) or catchup_weight < 0):
            raise ValueError(f"catchup_weight {catchup_weight!r}: a number >= 0 expected (math.inf: the fixed "
                             "catchup_margin)")
        if lookup_alpha0 is not None:
            if model_free_alpha0 is not None:
                raise ValueError("give model_free_alpha0 or its old name lookup_alpha0, not both")
            model_free_alpha0 = lookup_alpha0
        self.k_max, self.latency_budget_ms = k_max, latency_budget_ms
        self.free_k_max = 2 * k_max if free_k_max is None else free_k_max
        self.hysteresis, self.catchup_margin, self.keep_margin = hysteresis, catchup_margin, keep_margin
        self.catchup_weight = catchup_weight
        self.running: set[str] = set()  # the proposers of the rounds since the last plain step
        self.probe_every, self.probe_k = probe_every, probe_k
        self.plain_run = 0  # plain steps since the last proposal: a probe after probe_every
        self._offered_match: dict[str, int] = {}  # the match of each proposer's offer in the last choose()
        self.acceptance = Acceptance(alpha0, 0.7 if model_free_alpha0 is None else model_free_alpha0, decay)
        self.trees = TreeAcceptance(alpha0, tree_budgets)
        self.costs = RoundCosts(cost)
        self.answer = AnswerLengths(None if answer_prior is None else float(answer_prior))
        self.memory_path = None  # where end() writes the learned state (for_decoder(memory=...))

    # what the estimators hold, under the names this class always had
    cost = _through("costs", "cost", "The calibrated :class:`CostModel`.")
    counts = _through("acceptance", "counts", "Acceptance pseudo-counts [accepted, rejected] per proposer (and "
                      "``name/match``).")
    rounds = _through("acceptance", "rounds", "Rounds observed per proposer over this controller's life.")
    decay = _through("acceptance", "decay", "The acceptance counts' forgetting factor per round.")
    model_free_alpha0 = _through("acceptance", "model_free_alpha0", "Prior alpha of a proposer without a model.")
    lookup_alpha0 = _through("acceptance", "model_free_alpha0", "The former name of ``model_free_alpha0``.")
    conf_sum = _through("acceptance", "conf_sum", "Sum of the target's top-1 probabilities at plain steps.")
    conf_n = _through("acceptance", "conf_n", "Plain steps whose top-1 probability was observed (this answer).")
    tree_accepted = _through("trees", "accepted", "EWMA of accepted tokens per round, per proposer and node budget.")
    tree_budgets = _through("trees", "budgets", "The node budgets tried for proposers sized by nodes.")
    overhead = _through("costs", "overhead", "Measured / modelled round time per proposer (EWMA).")
    catchup_measured_ms = _through("costs", "catchup_measured_ms", "Measured catch-up per unseen token (ms), or None.")
    scales = _through("costs", "scales", "The target's and the draft's measured / calibrated time (ModelScales).")
    spread = _through("costs", "spread", "Recent measured / modelled round-time ratios (RoundTimeSpread).")
    lengths = _through("answer", "lengths", "New tokens of this controller's finished answers (the last 32), newest "
                       "last.")
    generated = _through("answer", "generated", "New tokens of the current answer so far.")

    @property
    def alpha0(self) -> float:
        """Prior alpha of a draft-model proposer (and of a tree's first rounds)."""
        return self.acceptance.alpha0

    @alpha0.setter
    def alpha0(self, value: float) -> None:
        self.acceptance.alpha0 = self.trees.alpha0 = value

    @property
    def scale_samples(self) -> dict[str, list[float]]:
        """The last 8 measured / calibrated times of the target and the draft (:class:`.estimators.ModelScales`)."""
        return self.scales.samples

    # -- the answer -------------------------------------------------------------------------------------

    def begin(self) -> None:
        """A new answer starts (called by the decoder after its prefill)."""
        self.answer.begin()
        self.plain_run = 0
        self.running.clear()
        self.acceptance.begin()

    def end(self, new_tokens: int) -> None:
        """The answer ended with ``new_tokens`` tokens; remembered (last 32) to predict later answers' length.
        With a memory file (:meth:`for_decoder` with ``memory``) the learned state is written to it."""
        self.answer.end(new_tokens)
        if self.memory_path is not None:
            from .memory import write_state

            write_state(self.memory_path, self.state())

    def expected_remaining(self, horizon: int) -> float:
        """Expected new tokens still to come in this answer, at most ``horizon``.

        From the earlier answers of this controller (and, with ``memory``, of earlier processes on this device
        and export) that ran longer than the current one: their mean excess; if none ran longer, the current
        length itself (an answer that has run n tokens is expected to run about n more: the rule of a
        scale-free length prior, and the break-even rule of rent-or-buy problems). With no answer seen at all,
        the larger of that and half the tokens the request still allows (``horizon``: ``max_new_tokens`` less
        those out), the mean of a length uniform up to the request's limit; or, with an ``answer_prior`` L, the
        larger of L − n and n (a voice answer of one or two sentences: the draft's prompt catch-up is priced
        against the few tokens it can serve, and an answer that runs past L is again expected to run n more).
        """
        return self.answer.expected_remaining(horizon)

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
                self.scales.sample(model, r)

    # -- estimates --------------------------------------------------------------------------------------

    def alpha(self, proposer: "Proposer | None" = None, match: int = 0) -> float:
        """Current acceptance estimate of ``proposer`` (default: the draft model's chain), in [0, 1]; with
        ``match`` > 0, that of its offers of that match (:class:`.estimators.Acceptance`: before any round of a
        draft-model proposer, the target's mean top-1 probability with the prior ``alpha0``)."""
        if proposer is None:
            return self.acceptance.alpha(DRAFT_CHAIN, True, match)
        return self.acceptance.alpha(proposer.name, proposer.uses_draft, match)

    def observe_confidence(self, top1: float) -> None:
        """The target's top-1 probability (temperature 1) at a plain step."""
        self.acceptance.observe_confidence(top1)

    def _tree_tokens(self, p: "Proposer", n_nodes: int) -> float:
        """Expected committed tokens of a round of ``n_nodes`` of ``p`` (:class:`.estimators.TreeAcceptance`)."""
        return self.trees.tokens(p.name, n_nodes)

    def expected_tokens(self, p: "Proposer", size: int, match: int = 0) -> float:
        """Expected committed tokens of a round of ``p`` of ``size``: measured per node budget for a proposer
        sized by nodes, else eq. 1 of Leviathan et al. 2023 at ``p``'s alpha (of ``match``)."""
        if p.sized_by_nodes:
            return self._tree_tokens(p, size)
        return expected_tokens(size, self.alpha(p, match))

    # -- costs (ms, :class:`.estimators.RoundCosts`) ----------------------------------------------------

    def scale(self, model: str) -> float:
        """Measured / calibrated time of ``model`` ("target" or "draft"): the median of its last 8 measured
        runs (target: plain steps and verifies of N rows against t_v(N); draft: one-token steps), 1.0 before
        any. The draft follows the target's scale until its own steps are measured (a calibration made while
        the machine was busy is off for both)."""
        return self.scales.scale(model)

    @property
    def plain_ms(self) -> float:
        """Predicted plain target step (ms): calibrated t_v(1) times the target's measured scale."""
        return self.costs.plain_ms

    @property
    def draft_step_ms(self) -> float:
        """Predicted one-token draft step (ms): calibrated t_d times the draft's measured scale."""
        return self.costs.draft_step_ms

    @property
    def catchup_ms(self) -> float:
        """Predicted draft catch-up per unseen token (ms): measured on long feeds, else calibrated × scale."""
        return self.costs.catchup_ms

    def _model_ms(self, p: "Proposer", k: int) -> float:
        """The cost model's round time (ms) for ``p`` with K (tree: N nodes), rescaled by the measured scales."""
        return self.costs.model_ms(p, k)

    def predicted_ms(self, p: "Proposer", k: int) -> float:
        """Predicted wall time of a round (ms): K = 0 is a plain step."""
        return self.costs.predicted_ms(p, k)

    def _fits(self, p: "Proposer | None", k: int, extra_ms: float = 0.0) -> bool:
        """Whether a round of ``p`` with K (plus ``extra_ms``) fits the latency budget, at its p90 time."""
        return self.latency_budget_ms is None or self.costs.high_ms(p, k) + extra_ms <= self.latency_budget_ms

    # -- the decision -----------------------------------------------------------------------------------

    def choose(self, situation: Situation) -> RoundPlan:
        """The next round (see :class:`~edgespec.control.kpolicy.KPolicy`); with a latency budget also a plain step
        with ``catchup_tokens`` of the draft's catch-up, when the whole catch-up does not fit in one round.

        1. Each offer's best size by predicted tokens/ms (:meth:`_rate`), the draft's catch-up spread over the
           tokens the answer is still expected to run; a model-free proposer never tried gets a short first try
           instead (:meth:`_first_try`).
        2. The best of those that beat a plain step by their margin (:meth:`_margin`: a proposer in its keep band
           is not passed over for one with a higher rate that does not clear the margin of a start); under a
           budget, with room made for a catch-up that does not fit beside it (:meth:`_make_room`).
        3. Else a plain step, or after ``probe_every`` of them a probe round (:meth:`_probe`).
        """
        remaining = self.expected_remaining(situation.horizon or 128)
        catchup = max(situation.lag - 1, 0) * self.catchup_ms  # ms of reading before the draft can draft
        free = [o for o in situation.offers if not o.proposer.uses_draft and o.limit > 0]
        candidates = [self._best(o, catchup, remaining) for o in situation.offers if o.proposer.uses_draft]
        self._offered_match = {o.proposer.name: o.match for o in situation.offers}
        for o in free:
            first = self._first_try(o)
            if first is not None:
                self.plain_run = 0
                return first
            candidates.append(self._best(o))
        paying = [c for c in candidates if c.size > 0 and self._pays(c, catchup, remaining)]  # each by its margin
        best = max(paying, key=lambda c: c.rate, default=None)
        if best is not None:
            self.plain_run = 0
            if best.proposer.uses_draft and catchup > 0 and not self._fits(best.proposer, best.size, catchup):
                return self._make_room(best, catchup, remaining, situation.lag)
            return self._plan(best.proposer, best.size)
        self.plain_run += 1
        if self.plain_run >= self.probe_every and (free or catchup <= 0.05 * self.plain_ms * remaining):
            self.plain_run = 0  # a draft probe only if its catch-up is cheap
            return self._probe(situation, free, catchup)
        return RoundPlan()

    def _rate(self, p: "Proposer", size: int, match: int, catchup_ms: float, remaining: float) -> float:
        """The one score of every candidate: predicted tokens/ms of a round of ``p`` of ``size`` (offered with
        ``match``), E[tokens] / (predicted round ms + the round's share of a one-time catch-up of ``catchup_ms``,
        spread over the ``remaining`` tokens it would serve)."""
        tokens = self.expected_tokens(p, size, match)
        return tokens / (self.predicted_ms(p, size) + catchup_ms * tokens / remaining)

    def _sizes(self, o: Offer):
        """The sizes considered for offer ``o``: a draft-model proposer's are the controller's (K up to
        ``k_max``, or ``tree_budgets``; the decoder cuts them to the context); a model-free one's are cut to its
        ``limit`` (a chain up to ``free_k_max``)."""
        p = o.proposer
        if p.uses_draft:
            return self.tree_budgets if p.sized_by_nodes else range(1, self.k_max + 1)
        if p.sized_by_nodes:
            return sorted({min(b, o.limit) for b in self.tree_budgets})
        return range(1, min(o.limit, self.free_k_max) + 1)

    def _best(self, o: Offer, catchup_ms: float = 0.0, remaining: float = 128.0,
              with_catchup: bool = False) -> Candidate:
        """The size of offer ``o`` with the highest :meth:`_rate` among those whose round fits the budget
        (``with_catchup``: together with the catch-up); the first on ties; size 0 if none fits. Per-match
        estimates are those of model-free proposers (their ``match``); a draft-model proposer's offer is
        estimated over all its rounds."""
        p = o.proposer
        match = 0 if p.uses_draft else o.match
        best = Candidate(o)
        for k in self._sizes(o):
            if self._fits(p, k, catchup_ms if with_catchup else 0.0):
                rate = self._rate(p, k, match, catchup_ms, remaining)
                if rate > best.rate:
                    best = Candidate(o, k, rate)
        return best

    def _margin(self, p: "Proposer", catchup_ms: float, remaining: float) -> float:
        """The fraction by which a round of ``p`` must beat a plain step in tokens/ms: ``hysteresis``; when it
        means paying a draft catch-up of ``catchup_ms`` longer than a plain step now, the catch-up's share of the
        plain time of the ``remaining`` tokens the answer is expected to run, times ``catchup_weight``, between
        ``hysteresis`` and ``catchup_margin``. The catch-up is a sure cost against a gain that rests on two
        estimates, alpha and the answer's length; the rate already spreads it over the answer, and the margin
        counts it once more, so the larger it is against what it serves, the surer the gain must be, up to +10%:
        a 44-token code prompt read by the draft in 5% of a 64-token answer's plain time needs +5% (on the
        Zen 4's costs the fixed +10% used before 2026-12-02 kept the draft off code it paid on: replayed 1.11×
        against 1.23× now and k3's 1.23×, ``bench/probes/controller_replay.py``, docs/benchmarks.md "AMD EPYC Zen 4"), a
        voice prompt read in 13% of a 24-token answer's needs +10%. ``-keep_margin`` (it may fall that far below) when ``p`` has
        run since the last plain step and no such catch-up is due."""
        if p.uses_draft and catchup_ms > self.plain_ms:
            share = catchup_ms / (max(remaining, 1.0) * self.plain_ms)
            return max(self.hysteresis, min(self.catchup_margin, self.catchup_weight * share))
        if p.name in self.running:
            return -self.keep_margin
        return self.hysteresis

    def _pays(self, c: Candidate, catchup_ms: float, remaining: float) -> bool:
        """Whether candidate ``c`` beats a plain step (1 token in ``plain_ms``) by its margin (:meth:`_margin`;
        ``remaining``: the answer's expected remaining tokens)."""
        return c.rate >= (1 + self._margin(c.proposer, catchup_ms, remaining)) / self.plain_ms

    def _first_try(self, o: Offer) -> RoundPlan | None:
        """A model-free proposer never tried, offering 2 tokens or more: a round of ``probe_k`` (fewer if it
        offers fewer), so that its alpha is learned (at the default ``probe_k`` = 1 it costs one extra verified
        row; a longer one cost a 12-token voice answer ~10%; the per-match estimates lengthen later tries). None
        otherwise, or if it does not fit the budget. (A first try at each match length as well was replayed on
        Zen 4's costs, 2026-12-02: it helped one 8-token voice answer and cost as much on others.)"""
        p = o.proposer
        size = min(o.limit, self.free_k_max, self.probe_k)
        if not self.acceptance.tried(p.name) and o.limit >= 2 and self._fits(p, size):
            return self._plan(p, size)
        return None

    def _make_room(self, best: Candidate, catchup_ms: float, remaining: float, lag: int) -> RoundPlan:
        """Under a budget that ``best`` does not fit together with its draft catch-up: a smaller size that does
        (if it still pays), else a plain step with part of the catch-up (:meth:`_catchup_round`)."""
        smaller = self._best(best.offer, catchup_ms, remaining, with_catchup=True)
        if smaller.size > 0 and self._pays(smaller, catchup_ms, remaining):
            return self._plan(smaller.proposer, smaller.size)
        return self._catchup_round(lag)

    def _probe(self, situation: Situation, free: list[Offer], catchup_ms: float) -> RoundPlan:
        """A probe round of ``probe_k``, so that acceptance estimates can recover: the first model-free offer
        that can propose, else the first draft chain; a plain step if there is none or it does not fit."""
        chains = [o for o in situation.offers if o.proposer.uses_draft and not o.proposer.sized_by_nodes]
        probe = free[0] if free else (chains[0] if chains else None)
        if probe is None:
            return RoundPlan()
        p = probe.proposer
        k = min(self.probe_k, self.k_max, probe.limit if free else self.k_max)
        if self._fits(p, k, catchup_ms if p.uses_draft else 0.0):
            return self._plan(p, k)
        return RoundPlan()

    def _catchup_round(self, lag: int) -> RoundPlan:
        """A plain step plus as much of the draft's catch-up as the budget leaves room for: a feed of m tokens
        costs about one draft step plus m - 1 tokens of catch-up (with a 15% margin); a plain step if not even
        one token fits."""
        room = self.latency_budget_ms - self.costs.high_ms(None, 0) - 1.15 * self.draft_step_ms
        if room < 0:
            return RoundPlan()
        m = 1 + int(room // max(1.15 * self.catchup_ms, 1e-3))
        return RoundPlan(catchup_tokens=min(m, lag))

    @staticmethod
    def _plan(p: "Proposer", size: int) -> RoundPlan:
        return RoundPlan(p, n_nodes=size) if p.sized_by_nodes else RoundPlan(p, k=size)

    # -- learning ---------------------------------------------------------------------------------------

    def observe(self, result: RoundResult) -> None:
        """Learn from a finished round: the answer's length so far, the costs (:meth:`.estimators.RoundCosts.observe`:
        scales, overhead factor, catch-up per token, p90 spread) and the proposer's acceptance (per match) or,
        for a proposer sized by nodes, its tokens per node budget."""
        p, k = result.proposer, result.size
        if p is None or k == 0:
            self.running.clear()
        else:
            self.running.add(p.name)
        self.answer.generated += result.accepted + 1
        self.costs.observe(result, tracked=self.latency_budget_ms is not None)
        if p is None or k == 0:
            return
        if p.sized_by_nodes:
            self.acceptance.count_round(p.name)
            self.trees.observe(p.name, k, result.accepted)
        else:
            self.acceptance.observe(p, k, result.accepted, self._offered_match.get(p.name, 0))

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
