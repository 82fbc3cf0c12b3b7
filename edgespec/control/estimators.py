"""The adaptive controller's estimators: small objects that learn from rounds and answer one question each.

:class:`AnswerLengths` predicts how many tokens the current answer still runs, :class:`ModelScales` how far the
target's and the draft's measured times are off their calibration, :class:`RoundTimeSpread` the 90th percentile
of measured / modelled round times that a latency budget plans with. :class:`~edgespec.control.adaptive.AdaptiveK`
(the decision) reads them.
"""

from __future__ import annotations

import numpy as np


class AnswerLengths:
    """The lengths (new tokens) of the last 32 finished answers and the current answer's length so far."""

    def __init__(self):
        self.lengths: list[int] = []  # newest last
        self.generated = 0

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
        if not self.lengths:  # no answer seen: also the request's own limit (uniform length up to it)
            return max(1.0, min(max(float(n), horizon / 2), float(horizon)))
        longer = [length - n for length in self.lengths if length > n]
        r = float(np.mean(longer)) if longer else float(max(n, 1))
        return max(1.0, min(r, float(horizon)))


class ModelScales:
    """Measured / calibrated time of the ``"target"`` and the ``"draft"``: the median of the last 8 samples each
    (1.0 before any; the draft follows the target's until its own steps are measured)."""

    def __init__(self):
        self.samples: dict[str, list[float]] = {"target": [], "draft": []}
        self._median: dict[str, float] = {}  # kept up to date by sample(): scale() is asked a dozen times a round

    def scale(self, model: str) -> float:
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
        self.ratios[key] = (self.ratios.get(key, []) + [ratio])[-16:]
        if tracked:
            self._p90[key] = float(np.percentile(self.ratios[key], 90))

    def p90(self, key: str | None) -> float | None:
        """The 90th percentile of ``key``'s ratios when last tracked, or None."""
        return self._p90.get(key)
