"""Value types of the command-line flags (argparse ``type=`` callables), shared by ``edgespec`` (apps/cli.py) and
``edgespec voice`` (voice/cli.py), which sit in two layers above this one.

Each raises :class:`argparse.ArgumentTypeError` with ``expected <what>, got '<text>'``; argparse prefixes the flag
(``argument --k: expected an integer ≥ 0, got '-1'``). nan and ±inf are never accepted as numbers.
"""

from __future__ import annotations

import argparse
import math
from typing import Callable


def checked(kind: type, what: str, ok: Callable) -> Callable[[str], int | float]:
    """A flag type: the text parsed as ``kind`` (int or float), finite, and ``ok(value)``; else the error
    ``expected {what}, got {text!r}``."""
    def parse(s: str):
        try:
            v = kind(s)
        except ValueError:
            v = None
        if v is None or (isinstance(v, float) and not math.isfinite(v)) or not ok(v):
            raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}")
        return v
    return parse


integer = checked(int, "an integer", lambda v: True)
nonneg_int = checked(int, "an integer ≥ 0", lambda v: v >= 0)
pos_int = checked(int, "an integer ≥ 1", lambda v: v >= 1)
MAX_SEED = (1 << 64) - 1  # the seeded sampler keys its noise by 64 bits (edgespec.core.coupling)
seed = checked(int, f"an integer in [0, {MAX_SEED}]", lambda v: 0 <= v <= MAX_SEED)
port = checked(int, "a port in [1, 65535]", lambda v: 1 <= v <= 65535)
temperature = checked(float, "a finite number ≥ 0", lambda v: v >= 0)
top_p = checked(float, "a number in (0, 1]", lambda v: 0 < v <= 1)
probability = checked(float, "a number in [0, 1]", lambda v: 0 <= v <= 1)
latency_ms = checked(float, "a finite number of milliseconds > 0", lambda v: v > 0)
_context = checked(int, "token counts ≥ 1 (e.g. 128,1024)", lambda v: v >= 1)


def contexts(s: str) -> list[int]:
    """Comma-separated context lengths in tokens, each ≥ 1 and given once, e.g. ``128,1024,2048,3500``."""
    parts = [x.strip() for x in s.split(",") if x.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected comma-separated token counts, got {s!r}")
    values = [_context(x) for x in parts]
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:  # one sweep row per length: a repeat would merge two rows into one
        raise argparse.ArgumentTypeError(f"each context length once, got {', '.join(map(str, repeated))} more than once")
    return values
