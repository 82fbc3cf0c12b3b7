"""What the adaptive controller learned, kept per device and export in the user cache, so a new process starts warm.

A one-shot ``edgespec generate`` and every ``serve`` start used to begin cold: acceptance at its prior, cost
scales at 1, no answer lengths, so the draft's prompt catch-up was priced against "as many tokens as so far"
and the draft started late. :class:`~edgespec.control.adaptive.AdaptiveK` built with ``memory="<use>"``
(``AdaptiveK.for_decoder``; the CLI passes its command unless ``--no-controller-memory``) reads this file at
start and rewrites it after every answer (one small JSON file, written atomically) with what its estimators
(:mod:`.estimators`) learned: the answer lengths (last 32, ``AnswerLengths``), acceptance pseudo-counts per
proposer and per matched n-gram length and the rounds seen (``Acceptance``), the tree EWMAs
(``TreeAcceptance``), overhead factors, the measured catch-up per token and the target's and draft's measured /
calibrated scale samples (``RoundCosts``, ``ModelScales``).

The file sits beside the calibration (same key: export, device, execution provider, threads, K range, graph
format; plus the use) and is validated where it enters: anything malformed (wrong types, non-finite or negative
numbers, an unknown version, a directory) is ignored — the controller starts cold and the next answer rewrites it — and
never raises.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..io import paths

VERSION = 1
MAX_LENGTH = 1_000_000  # a plausible answer length in tokens
MAX_KEYS = 256  # proposer names (and name/match keys) kept per map


def memory_path(decoder, k_max: int, use: str) -> Path:
    """``<user cache>/controller/<calibration key>-<use>.json``: one file per export, device, provider, threads,
    K range and use (a chat's answers and a completion's are of different lengths).

    Raises:
        ValueError: ``use`` is not a short lowercase word.
    """
    from .calibrate import calibration_path

    if not (use.isascii() and use.isalpha() and use.islower() and len(use) <= 32):
        raise ValueError(f"controller memory name {use!r}: a lowercase word expected")
    return paths.home() / "controller" / f"{calibration_path(decoder, k_max).stem}-{use}.json"


class _Bad(ValueError):
    pass


def _num(v, lo: float = 0.0, hi: float = math.inf) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise _Bad(v)
    return float(v)


def _map(v) -> dict:
    if not isinstance(v, dict) or len(v) > MAX_KEYS or not all(isinstance(k, str) for k in v):
        raise _Bad(v)
    return v


def _node_count(key: str) -> int:
    if not key.isdigit() or not 1 <= int(key) <= 10_000:
        raise _Bad(key)
    return int(key)


def parse_state(raw) -> dict:
    """The validated state (the shape ``AdaptiveK.state()`` returns, numbers converted, keys of tree node counts
    back to int).

    Raises:
        ValueError: anything that is not such a state.
    """
    if not isinstance(raw, dict) or raw.get("version") != VERSION:
        raise _Bad("version")
    missing = {"lengths", "counts", "overhead", "rounds", "scale_samples", "catchup_measured_ms",
               "tree_accepted"} - set(raw)
    if missing:
        raise _Bad(f"missing {sorted(missing)}")
    lengths = raw["lengths"]
    if not isinstance(lengths, list) or any(isinstance(n, bool) or not isinstance(n, int) for n in lengths):
        raise _Bad(lengths)
    scales = _map(raw["scale_samples"])
    if set(scales) - {"target", "draft"}:
        raise _Bad(scales)
    catchup = raw["catchup_measured_ms"]

    def pair(v) -> list[float]:
        if not isinstance(v, list) or len(v) != 2:
            raise _Bad(v)
        return [_num(x) for x in v]

    def rows(v) -> list[float]:
        if not isinstance(v, list):
            raise _Bad(v)
        return [_num(x, 1e-6, 1e3) for x in v][-8:]

    return {
        "lengths": [int(_num(n, 0, MAX_LENGTH)) for n in lengths][-32:],
        "counts": {k: pair(v) for k, v in _map(raw["counts"]).items()},
        "overhead": {k: _num(v, 1e-3, 1e3) for k, v in _map(raw["overhead"]).items()},
        "rounds": {k: int(_num(v, 0, 1e12)) for k, v in _map(raw["rounds"]).items()},
        "scale_samples": {k: rows(v) for k, v in scales.items()},
        "catchup_measured_ms": None if catchup is None else _num(catchup, 1e-6, 1e4),
        "tree_accepted": {k: {_node_count(n): _num(a, 0, 1e4) for n, a in _map(d).items()}
                          for k, d in _map(raw["tree_accepted"]).items()},
    }


def read_state(path: Path) -> dict | None:
    """The validated state in ``path`` (:func:`parse_state`), or None if it is missing or not a valid state."""
    try:
        return parse_state(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def write_state(path: Path, state: dict) -> bool:
    """Write ``state`` to ``path`` atomically; False (nothing written) if the user cache is not writable."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return paths.write_atomic(path, json.dumps(state))
