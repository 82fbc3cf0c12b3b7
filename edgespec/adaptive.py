"""Adaptive K: a measured cost model and an online acceptance estimate pick K each round.

Expected tokens committed by a round of draft length K with per-token acceptance rate alpha (Leviathan et al.
2023, eq. 1): ``E[tokens | K, alpha] = (1 - alpha^(K+1)) / (1 - alpha)``. The round costs
``K·t_d + t_v(K+1)`` ms (draft step t_d, target verify of N rows t_v(N)). The controller picks the K ≤ K_max
that maximizes tokens per ms, K = 0 (a plain target step, 1 token in t_v(1)) when speculation is not predicted
to pay, with hysteresis against flapping and a probe round every ``probe_every`` plain steps so that it
recovers when the text becomes predictable. A latency budget B removes every K whose predicted round time
exceeds B.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass

import numpy as np

from . import paths


@dataclass
class CostModel:
    """Measured costs in ms: ``verify_ms[N-1]`` = target run of N rows; ``draft_ms`` = one draft step."""

    verify_ms: list[float]
    draft_ms: float

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


def best_k(cost: CostModel, alpha: float, k_max: int, budget_ms: float | None = None) -> tuple[int, list[float]]:
    """The K in 0..k_max with the highest predicted tokens/ms within the budget; also the rates per K."""
    rates = []
    for k in range(k_max + 1):
        t = cost.round_ms(k)
        ok = budget_ms is None or t <= budget_ms or k == 0
        rates.append(expected_tokens(k, alpha) / t if ok else -1.0)
    return int(np.argmax(rates)), rates


class AdaptiveK:
    """K policy (see module docstring). ``observe`` refines alpha (EWMA) and the cost model from real rounds."""

    def __init__(self, cost: CostModel, k_max: int = 6, latency_budget_ms: float | None = None,
                 alpha0: float = 0.6, decay: float = 0.9, hysteresis: float = 0.05, probe_every: int = 16,
                 probe_k: int = 2):
        self.cost, self.k_max, self.budget = cost, k_max, latency_budget_ms
        self.acc, self.rej = alpha0 * 4, (1 - alpha0) * 4  # pseudo-counts of accepted / rejected draft tokens
        self.decay, self.hysteresis = decay, hysteresis
        self.probe_every, self.probe_k = probe_every, probe_k
        self.plain_run = 0
        self.last_k = None

    @property
    def alpha(self) -> float:
        return self.acc / (self.acc + self.rej)

    def choose(self) -> int:
        k, rates = best_k(self.cost, self.alpha, self.k_max, self.budget)
        if k > 0 and rates[k] < rates[0] * (1 + self.hysteresis):
            k = 0  # speculation must beat plain decoding by a margin to be switched on
        if k == 0:
            self.plain_run += 1
            if self.plain_run >= self.probe_every:  # re-probe the acceptance rate
                self.plain_run = 0
                k = min(self.probe_k, self.k_max)
                if self.budget is not None and self.cost.round_ms(k) > self.budget:
                    k = 0
        else:
            self.plain_run = 0
        self.last_k = k
        return k

    def observe(self, k: int, accepted: int, draft_ms: float, verify_ms: float) -> None:
        """Update alpha from the round's outcome and t_d, t_v(K+1) from its measured times (EWMA)."""
        self._ewma_verify(k + 1, verify_ms)
        if k == 0:
            return
        self.acc = self.decay * self.acc + accepted
        self.rej = self.decay * self.rej + int(accepted < k)
        self.cost.draft_ms = 0.9 * self.cost.draft_ms + 0.1 * (draft_ms / k)

    def _ewma_verify(self, n: int, ms: float) -> None:
        if n <= len(self.cost.verify_ms):
            self.cost.verify_ms[n - 1] = 0.9 * self.cost.verify_ms[n - 1] + 0.1 * ms

    @classmethod
    def for_decoder(cls, decoder, latency_budget_ms: float | None = None, k_max: int = 6,
                    **kw) -> "AdaptiveK":
        """A controller with ``decoder``'s calibrated cost model (measured once per device and export)."""
        return cls(calibrate(decoder, k_max), k_max=k_max, latency_budget_ms=latency_budget_ms, **kw)


def _calibration_path(decoder, k_max: int):
    m = decoder.manifest
    key = "-".join([
        m.name if m else "export", (m.target.source_sha256[:12] + m.draft.source_sha256[:12]) if m else "",
        m.target.quantization.precision if m else "", platform.node(), platform.machine(),
        decoder.target.session.get_providers()[0], str(decoder.target.session.get_session_options().intra_op_num_threads),
        f"k{k_max}",
    ])
    return paths.home() / "calibration" / (key.replace("/", "_") + ".json")


def calibrate(decoder, k_max: int = 6, context: int = 128, reps: int = 3, use_cache: bool = True) -> CostModel:
    """Measure t_v(N) for N = 1..k_max+1 and the draft step time at a ``context``-token past (median ms).

    The result is cached per device, export and execution provider under the user cache.
    """
    path = _calibration_path(decoder, k_max)
    if use_cache and path.is_file():
        try:
            return CostModel(**json.loads(path.read_text()))
        except (ValueError, TypeError):
            pass
    rng = np.random.default_rng(0)
    ids = rng.integers(0, min(decoder.width, 1000), size=context + k_max + 1).tolist()

    def timed(model, n):
        out = []
        for _ in range(reps):
            cache = model.new_cache()
            model.forward(ids[:context], cache)
            t0 = time.perf_counter()
            model.forward(ids[context:context + n], cache)
            out.append((time.perf_counter() - t0) * 1e3)
        return float(np.median(out))

    verify = [timed(decoder.target, n) for n in range(1, k_max + 2)]
    draft = timed(decoder.draft, 1) if decoder.draft is not None else verify[0]
    cost = CostModel(verify_ms=verify, draft_ms=draft)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(asdict(cost)))
    os.replace(tmp, path)
    return cost
