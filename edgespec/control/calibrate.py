"""The measured cost model of adaptive K and its cache: target verify time per row count, draft step time,
draft catch-up time per token (ms), measured once per device, export and execution provider.

Kept apart from the controller (:mod:`.adaptive`), which is pure decision logic on a :class:`CostModel`; its
:meth:`CostModel.round_ms` is the one round-time formula (:class:`~.estimators.RoundCosts` rescales it).
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..io import paths


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

    def round_ms(self, k: int, draft_runs: int | None = None, target_scale: float = 1.0,
                 draft_scale: float = 1.0) -> float:
        """Predicted wall time (ms) of a round verifying K proposal tokens (K = 0: one plain step) with
        ``draft_runs`` one-token draft steps (default K: a draft chain; 0: no model, e.g. prompt lookup; a draft
        tree: its depth), the target's and the draft's calibrated times scaled by their measured factors."""
        runs = k if draft_runs is None else draft_runs
        return self.t_verify(k + 1) * target_scale + runs * (self.draft_ms * draft_scale)


def calibration_path(decoder, k_max: int) -> Path:
    """Where :func:`calibrate` caches its measurement: one JSON file per export, device, execution provider,
    thread count and K range (and whether the model that prices the catch-up runs a prefill graph), under the
    user cache."""
    from ..io.onnx_model import pool_threads

    m = decoder.manifest
    key = "-".join([
        m.name if m else "export", (m.target.source_sha256[:12] + m.draft.source_sha256[:12]) if m else "",
        m.target.quantization.precision if m else "", str(m.draft.vocab_size) if m else "",
        platform.node(), platform.machine(), decoder.target.session.get_providers()[0],
        str(pool_threads() or os.cpu_count()), f"k{k_max}",
        "lk" if decoder.target.has_logits_keep else "",
        f"g{decoder.target.spec.graph_format}",  # formats 2 and 3 of one pair have different cost curves
    ] + (["p8"] if getattr(_catchup_model(decoder), "prefill_session", None) is not None else [])  # its catch-up
      + (["kv8"] if "int8" in {getattr(getattr(lm, "spec", None), "kv_cache", "float32")  # an int8 cache
                                for lm in (decoder.target, getattr(decoder, "draft", None))} else []))  # costs otherwise
    return paths.home() / "calibration" / (key.replace("/", "_") + ".json")


def _catchup_model(decoder):
    """The model whose per-token feed cost the cost model keeps (``draft_prefill_ms``): the draft, or the target
    of a decoder without one."""
    return decoder.draft if getattr(decoder, "draft", None) is not None else decoder.target


def smooth_verify(verify_ms: list[float], tolerance: float = 0.25) -> list[float]:
    """t_v(1..N) ms with outliers replaced: a point more than ``tolerance`` off the Theil–Sen line through all
    points (median of pairwise slopes, median intercept) takes the line's value.

    Verifying N rows costs about a + b·N on a CPU for small N; one measurement hit by a burst of other load
    (t_v(6) = 299 ms between t_v(5) = 123 and t_v(7) = 165 was seen) would otherwise price that K out forever.
    """
    v = np.asarray(verify_ms, dtype=np.float64)
    if len(v) < 3:
        return [float(x) for x in v]
    n = np.arange(1, len(v) + 1, dtype=np.float64)
    i, j = np.triu_indices(len(v), 1)
    slope = float(np.median((v[j] - v[i]) / (n[j] - n[i])))
    intercept = float(np.median(v - slope * n))
    line = np.maximum(intercept + slope * n, 1e-3)
    off = np.abs(v / line - 1.0) > tolerance
    return [float(x) for x in np.where(off, line, v)]


STALE_FACTOR = 1.5  # a cached t_v(1) off by more than this factor from a fresh plain step is re-measured


def plain_step_ms(decoder, context: int = 16, reps: int = 3) -> float:
    """Median time (ms) of one plain target step after a ``context``-token past: the cheap check of a cached
    calibration (a warm-up run, a short prefill, ``reps`` one-row steps rolled back with ``crop``)."""
    model = decoder.target
    ids = np.random.default_rng(1).integers(0, min(decoder.width, 1000), size=context + 1).tolist()
    model.forward(ids[:8], model.new_cache())  # warm-up: a session's first run is slower
    cache = model.new_cache()
    model.forward(ids[:context], cache, keep=1)
    ts = []
    for _ in range(reps):
        cache.crop(context)
        t0 = time.perf_counter()
        model.forward(ids[context:], cache)
        ts.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(ts))


def read_cost(path: Path, k_max: int) -> CostModel | None:
    """The cost model cached at ``path`` if it is a valid one: ``verify_ms`` k_max+1 finite times > 0, finite
    ``draft_ms`` and ``draft_prefill_ms`` > 0. Anything else (missing, unreadable, a directory, strings,
    zeros, a list) is None: the caller measures again and rewrites the entry."""
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


def _cached(path: Path, decoder, k_max: int) -> CostModel | None:
    """The cached cost model at ``path`` if it is valid (:func:`read_cost`) and still describes this machine:
    its t_v(1) within :data:`STALE_FACTOR` of a plain step measured now. None: re-measure."""
    cost = read_cost(path, k_max)
    if cost is None:
        return None
    cached = cost.verify_ms[0]
    now = plain_step_ms(decoder)
    if not (cached > 0 and 1 / STALE_FACTOR <= now / cached <= STALE_FACTOR):
        return None
    return cost


def calibrate(decoder, k_max: int = 6, context: int = 128, reps: int = 5, use_cache: bool = True) -> CostModel:
    """Measure t_v(N) for N = 1..k_max+1, the draft step time after a ``context``-token past (median ms), and
    the draft's per-token prefill time (its catch-up cost).

    One prefill per model, then each timed run is rolled back with ``crop``; a second or two on the real
    pair. The result is cached per device, export and execution provider under the user cache; a cached one is
    re-checked at load with one plain step (:func:`plain_step_ms`) and re-measured when t_v(1) moved by more
    than :data:`STALE_FACTOR`. The controller keeps the model current from then on (:class:`.estimators.RoundCosts`).
    """
    path = calibration_path(decoder, k_max)
    if use_cache and path.exists():
        cost = _cached(path, decoder, k_max)
        if cost is not None:
            return cost
    rng = np.random.default_rng(0)
    ids = rng.integers(0, min(decoder.width, 1000), size=context + k_max + 1).tolist()

    prefill = {}

    def timed(model, ns):
        model.forward(ids[:8], model.new_cache())  # warm-up: a session's first run is slower
        feeds = model is _catchup_model(decoder)  # its feed of `context` tokens prices the catch-up
        if feeds and getattr(model, "prefill_session", None) is not None:  # so is its prefill graph's
            model.forward(ids[:context], model.new_cache(), keep=1, prefill=True)
        cache = model.new_cache()
        t0 = time.perf_counter()
        model.forward(ids[:context], cache, keep=1, prefill=feeds)  # a long catch-up's path: its prefill graph
        prefill[model] = (time.perf_counter() - t0) * 1e3 / context
        model.forward(ids[context:context + 1], cache)  # warm-up
        ts = {n: [] for n in ns}
        for _ in range(reps):  # interleaved: a burst of other load hits every N alike, not one N's median
            for n in ns:
                cache.crop(context)
                t0 = time.perf_counter()
                model.forward(ids[context:context + n], cache)
                ts[n].append((time.perf_counter() - t0) * 1e3)
        return {n: float(np.median(t)) for n, t in ts.items()}

    tv = timed(decoder.target, range(1, k_max + 2))
    verify = smooth_verify([tv[n] for n in range(1, k_max + 2)])
    draft = timed(decoder.draft, [1])[1] if decoder.draft is not None else verify[0]
    cost = CostModel(verify_ms=verify, draft_ms=draft,
                     draft_prefill_ms=prefill[_catchup_model(decoder)])
    if paths.cache_dir("calibration") is not None:  # else: measured again next time (warned once)
        paths.sweep_stale(path.parent)
        paths.write_atomic(path, json.dumps(asdict(cost)))
    return cost
