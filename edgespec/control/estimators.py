"""The adaptive controller's estimators: small objects that learn from rounds and answer one question each.

:class:`Acceptance` estimates a proposer's acceptance rate alpha (per proposer, per match, with the target's
confidence as the prior of a draft never run), :class:`TreeAcceptance` the tokens a token tree of N nodes
commits, :class:`AnswerLengths` how many tokens the current answer still runs, :class:`ModelScales` how far the
target's and the draft's measured times are off their calibration, :class:`RoundTimeSpread` the 90th percentile
of measured / modelled round times that a latency budget plans with, and :class:`RoundCosts` (over the last two
and a :class:`~edgespec.control.calibrate.CostModel`) each round's predicted time in ms.
:class:`~edgespec.control.adaptive.AdaptiveK` (the decision) reads them.

Every estimator keys what it learns by the proposer's ``name`` and reads only what a
:class:`~edgespec.draft.base.Proposer` declares (``uses_draft``, ``sized_by_nodes``, ``draft_runs(size)``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..core.token_tree import TreeShape

if TYPE_CHECKING:
    from ..core.round import RoundResult
    from ..draft.base import Proposer
    from .calibrate import CostModel


def expected_tokens(k: int, alpha: float) -> float:
    """E[committed tokens] for draft length K at acceptance rate alpha (Leviathan et al. 2023, eq. 1)."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class AnswerLengths:
    """The lengths (new tokens) of the last 32 finished answers and the current answer's length so far."""

    def __init__(self, prior: float | None = None):
        self.lengths: list[int] = []  # newest last
        self.generated = 0
        self.prior = prior  # expected answer length (tokens) before any answer is seen; None: the request's limit

    def begin(self) -> None:
        """A new answer starts."""
        self.generated = 0

    def end(self, new_tokens: int) -> None:
        """The answer ended with ``new_tokens`` tokens."""
        self.lengths = (self.lengths + [int(new_tokens)])[-32:]

    def expected_remaining(self, horizon: int) -> float:
        """Expected new tokens still to come in this answer, at most ``horizon`` (see
        :meth:`~edgespec.control.adaptive.AdaptiveK.expected_remaining`)."""
        n = self.generated
        if not self.lengths and self.prior is not None:  # no answer seen: the use's prior length, then n more
            return max(1.0, min(max(self.prior - n, float(n)), float(horizon)))
        if not self.lengths:  # no answer seen: also the request's own limit (uniform length up to it)
            return max(1.0, min(max(float(n), horizon / 2), float(horizon)))
        longer = [length - n for length in self.lengths if length > n]
        r = float(np.mean(longer)) if longer else float(max(n, 1))
        return max(1.0, min(r, float(horizon)))


class ModelScales:
    """Measured / calibrated time of the ``"target"`` and the ``"draft"``: the median of the last 8 samples each
    (1.0 before any; the draft follows the target's until its own steps are measured, as a calibration taken on
    a busy machine is off for both). The median rescales the calibrated curves, so a calibration 3× too slow is
    corrected after a few plain steps instead of keeping the controller from ever drafting."""

    def __init__(self):
        self.samples: dict[str, list[float]] = {"target": [], "draft": []}
        self._median: dict[str, float] = {}  # kept up to date by sample(): scale() is asked a dozen times a round

    def scale(self, model: str) -> float:
        """Measured / calibrated time of ``model`` ("target" or "draft"), 1.0 before any sample."""
        if model == "draft" and "draft" not in self._median:
            model = "target"
        return self._median.get(model, 1.0)

    def sample(self, model: str, ratio: float) -> None:
        """One measured / calibrated ratio of ``model`` (ignored unless finite and > 0)."""
        if np.isfinite(ratio) and ratio > 0:
            self.samples[model] = (self.samples[model] + [float(ratio)])[-8:]
            self._median[model] = float(np.median(self.samples[model]))


class RoundTimeSpread:
    """The last 16 measured / modelled round-time ratios per proposer name (None: plain steps) and, while
    ``tracked`` (a latency budget is set), their 90th percentile."""

    def __init__(self):
        self.ratios: dict[str | None, list[float]] = {}
        self._p90: dict[str | None, float] = {}

    def add(self, key: str | None, ratio: float, tracked: bool) -> None:
        """One measured / modelled ratio of ``key``'s rounds; ``tracked``: update its p90 now (a percentile
        costs, and only a latency budget reads it)."""
        self.ratios[key] = (self.ratios.get(key, []) + [ratio])[-16:]
        if tracked:
            self._p90[key] = float(np.percentile(self.ratios[key], 90))

    def p90(self, key: str | None) -> float | None:
        """The 90th percentile of ``key``'s ratios when last tracked, or None."""
        return self._p90.get(key)


class Acceptance:
    """The per-token acceptance rate alpha in [0, 1] of each proposer: decayed pseudo-counts of its tokens.

    Under the i.i.d. acceptance of Leviathan et al. 2023 (each drafted token accepted with probability alpha,
    sec. 3.1), a round of K that accepts ``a`` tokens is a geometric count cut at K: ``a`` successes and one
    failure when a < K. ``accepted / (accepted + rejected)`` over such rounds is the maximum-likelihood alpha;
    both counts are multiplied by ``decay`` before a round adds its own, so the estimate follows the text (a
    memory of about 1 / (1 − decay) rounds). A proposer starts at its prior weighing as 2 tokens: ``alpha0``
    for one that runs the draft model, ``model_free_alpha0`` for one that does not (lookup, suffix, grammar).
    With ``match`` > 0 (an offer's quality; prompt lookup: the matched n-gram's length, as a 4-gram match is
    accepted far more often than a 2-gram one) the offers of that match keep counts of their own, which start
    from the proposer's overall counts when first asked for.

    Before any round of a draft-model proposer its alpha is the mean top-1 probability of the target over this
    answer's plain steps (:meth:`observe_confidence`), with ``alpha0`` weighing as 4 steps: a free proxy of
    greedy acceptance (over the 12 built-in benchmark prompts, agreement 0.64 on chat to 0.98 on code; the two
    differed by 0.03 at the median and 0.11 at most: ``bench/probes/confidence_proxy.py``).

    ``counts``: name, or ``name/match``, → [accepted, rejected] (pseudo-counts, tokens); ``rounds``: name →
    rounds observed over the controller's life. Both persist (:mod:`.memory`).
    """

    def __init__(self, alpha0: float = 0.7, model_free_alpha0: float = 0.7, decay: float = 0.9):
        self.alpha0, self.model_free_alpha0, self.decay = alpha0, model_free_alpha0, decay
        self.counts: dict[str, list[float]] = {}
        self.rounds: dict[str, int] = {}
        self.conf_sum, self.conf_n = 0.0, 0  # the target's top-1 probabilities at plain steps (this answer)

    def begin(self) -> None:
        """A new answer starts: the confidence prior starts again."""
        self.conf_sum, self.conf_n = 0.0, 0

    def observe_confidence(self, top1: float) -> None:
        """The target's top-1 probability (temperature 1, in [0, 1]) at a plain step."""
        self.conf_sum += top1
        self.conf_n += 1

    def tried(self, name: str) -> bool:
        """Whether a round of the proposer ``name`` has been observed."""
        return bool(self.rounds.get(name))

    def alpha(self, name: str, uses_draft: bool, match: int = 0) -> float:
        """alpha of the proposer ``name`` (which runs the draft model if ``uses_draft``), of its offers of
        ``match`` if > 0."""
        if uses_draft and not self.tried(name):  # the prior alpha0 weighs as much as 4 plain steps
            return (4 * self.alpha0 + self.conf_sum) / (4 + self.conf_n)
        a, r = self.pseudo_counts(name, uses_draft, match)
        return a / (a + r)

    def pseudo_counts(self, name: str, uses_draft: bool, match: int = 0) -> list[float]:
        """[accepted, rejected] of ``name`` (made at the prior on first use); with ``match`` > 0 those of its
        offers of that match (made from the overall counts on first use). The list itself: updated in place."""
        if name not in self.counts:
            a0 = self.alpha0 if uses_draft else self.model_free_alpha0
            self.counts[name] = [a0 * 2, (1 - a0) * 2]
        if match <= 0:
            return self.counts[name]
        key = f"{name}/{match}"
        if key not in self.counts:
            self.counts[key] = list(self.counts[name])
        return self.counts[key]

    def count_round(self, name: str) -> None:
        """One more round of ``name`` observed (of any kind, trees included)."""
        self.rounds[name] = self.rounds.get(name, 0) + 1

    def observe(self, p: "Proposer", k: int, accepted: int, match: int = 0) -> None:
        """A chain round of ``p`` of draft length K that accepted ``accepted`` tokens, offered with ``match``."""
        self.count_round(p.name)
        counts = [self.pseudo_counts(p.name, p.uses_draft)]
        if match > 0:
            counts.append(self.pseudo_counts(p.name, p.uses_draft, match))
        for c in counts:
            c[0] = self.decay * c[0] + accepted
            c[1] = self.decay * c[1] + int(accepted < k)


class TreeAcceptance:
    """Tokens committed by a round of a proposer sized by nodes, per node budget N: an EWMA (weight 0.2 on the
    newest round) of the accepted path's length, plus one (the correction or bonus token).

    A tree's acceptance does not follow eq. 1 of Leviathan et al. 2023 (its paths branch), so it is measured per
    budget. Each budget starts optimistic, at what a chain as deep as the default tree shape of N nodes
    (:meth:`~edgespec.core.token_tree.TreeShape.for_budget`) commits at ``alpha0`` (eq. 1), so that every
    budget in ``budgets`` gets tried. ``accepted``: name → {N: accepted tokens per round} (persists,
    :mod:`.memory`)."""

    def __init__(self, alpha0: float = 0.7, budgets: tuple[int, ...] = (4, 6, 8, 12)):
        self.alpha0, self.budgets = alpha0, budgets
        self.accepted: dict[str, dict[int, float]] = {}

    def _prior(self, n_nodes: int) -> float:
        return expected_tokens(TreeShape.for_budget(n_nodes).depth, self.alpha0) - 1

    def _of(self, name: str) -> dict[int, float]:
        if name not in self.accepted:
            self.accepted[name] = {b: self._prior(b) for b in self.budgets}
        return self.accepted[name]

    def tokens(self, name: str, n_nodes: int) -> float:
        """Expected committed tokens of a round of ``n_nodes`` nodes of ``name``."""
        acc = self._of(name)
        if n_nodes not in acc:
            acc[n_nodes] = self._prior(n_nodes)
        return acc[n_nodes] + 1

    def observe(self, name: str, n_nodes: int, accepted: int) -> None:
        """A round of ``n_nodes`` nodes of ``name`` accepted a path of ``accepted`` tokens."""
        acc = self._of(name)
        prev = acc[n_nodes] if n_nodes in acc else self.tokens(name, n_nodes) - 1
        acc[n_nodes] = 0.8 * prev + 0.2 * accepted


class RoundCosts:
    """Predicted round times in ms: the calibrated :class:`~edgespec.control.calibrate.CostModel` (its
    :meth:`~edgespec.control.calibrate.CostModel.round_ms`, the one round-time formula), rescaled by the
    measured :class:`ModelScales`, times a per-proposer overhead factor.

    The overhead factor of a proposer is an EWMA (weight 0.3) of measured / modelled round time (the draft's
    catch-up excluded): it adds what the model leaves out (sampling arithmetic over the vocabulary, cache effects
    of alternating two models). The catch-up per token the draft has not seen is measured on feeds of 8 tokens
    or more (EWMA, weight 0.3), else the calibrated per-token prefill times the draft's scale. A latency budget
    checks :meth:`high_ms`, from the 90th percentile of recent ratios (:class:`RoundTimeSpread`).
    ``overhead`` (name → factor), ``catchup_measured_ms`` and the scales' samples persist (:mod:`.memory`)."""

    def __init__(self, cost: "CostModel"):
        self.cost = cost
        self.scales = ModelScales()
        self.spread = RoundTimeSpread()
        self.overhead: dict[str, float] = {}
        self.catchup_measured_ms: float | None = None  # per token the draft has not seen, once measured

    def model_ms(self, p: "Proposer | None", k: int) -> float:
        """The cost model's round time (ms) for ``p`` with K (sized by nodes: N nodes) and the draft runs ``p``
        declares for that size (:meth:`~edgespec.draft.base.Proposer.draft_runs`); K = 0: a plain step."""
        runs = p.draft_runs(k) if k > 0 else 0
        return self.cost.round_ms(k, runs, self.scales.scale("target"), self.scales.scale("draft"))

    @property
    def plain_ms(self) -> float:
        """Predicted plain target step (ms): calibrated t_v(1) times the target's measured scale."""
        return self.model_ms(None, 0)

    @property
    def draft_step_ms(self) -> float:
        """Predicted one-token draft step (ms): calibrated t_d times the draft's measured scale."""
        return self.cost.draft_ms * self.scales.scale("draft")

    @property
    def catchup_ms(self) -> float:
        """Predicted draft catch-up per unseen token (ms): measured on long feeds, else calibrated × scale."""
        if self.catchup_measured_ms is not None:
            return self.catchup_measured_ms
        return self.cost.draft_prefill_ms * self.scales.scale("draft")

    def predicted_ms(self, p: "Proposer | None", k: int) -> float:
        """Predicted wall time of a round (ms): the model times ``p``'s overhead factor; K = 0 is a plain step."""
        return self.plain_ms if k == 0 else self.model_ms(p, k) * self.overhead.get(p.name, 1.0)

    def high_ms(self, p: "Proposer | None", k: int) -> float:
        """A pessimistic round time (ms) for budget checks: the model times the 90th percentile of recent
        measured / modelled ratios (at least the overhead factor; 1.15 before any such round)."""
        base = self.plain_ms if k == 0 else self.model_ms(p, k)
        p90 = self.spread.p90(None if k == 0 else p.name)
        hi = max(p90, 1.0 if k == 0 else self.overhead.get(p.name, 1.0)) if p90 is not None else 1.15
        return base * hi

    def observe(self, r: "RoundResult", tracked: bool) -> None:
        """Learn from a round's times: the catch-up per token, the draft's and the target's scales (every draft
        step measures t_d, every plain step and verify t_v(N)), and the round's measured / modelled ratio
        (``tracked``: keep its p90 up to date, under a latency budget) and overhead factor."""
        p, k = r.proposer, r.size
        catchup_ms = r.catchup_ms
        if p is not None and r.catchup_tokens > 0:  # the feed also drafted the first token
            catchup_ms = max(catchup_ms - (r.draft_step_ms or self.draft_step_ms), 0.0)
        if r.catchup_tokens >= 8:  # short feeds mostly measure a run's fixed cost, not the per-token one
            prev = self.catchup_ms
            self.catchup_measured_ms = 0.7 * prev + 0.3 * (catchup_ms / r.catchup_tokens)
        if r.draft_step_ms is not None:
            self.scales.sample("draft", r.draft_step_ms / self.cost.draft_ms)
        if p is None or k == 0:  # a plain step, or a plain step with a catch-up
            plain = r.round_ms - catchup_ms
            self.spread.add(None, plain / self.plain_ms, tracked)
            self.scales.sample("target", plain / self.cost.t_verify(1))
            return
        if r.draft_ms > 0 or not p.uses_draft:  # the verify of N rows is the round less its proposing time
            self.scales.sample("target", (r.round_ms - r.draft_ms) / self.cost.t_verify(r.proposed + 1))
        ratio = (r.round_ms - catchup_ms) / self.model_ms(p, k)
        self.spread.add(p.name, ratio, tracked)
        self.overhead[p.name] = 0.7 * self.overhead.get(p.name, 1.0) + 0.3 * ratio
