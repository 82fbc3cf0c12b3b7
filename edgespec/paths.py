"""Where edgespec keeps its files: the user cache (exports, assembled weights, calibration).

``EDGESPEC_HOME`` overrides the location (tests use it to isolate the user directory); otherwise
``$XDG_CACHE_HOME/edgespec`` or ``~/.cache/edgespec``.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_PAIR = "qwen2.5-coder-1.5b+0.5b"


def home() -> Path:
    """The edgespec cache root (not created)."""
    if os.environ.get("EDGESPEC_HOME"):
        return Path(os.environ["EDGESPEC_HOME"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edgespec"


def exports_dir() -> Path:
    """Directory holding one export directory per pair recipe name."""
    return home() / "exports"


def default_export_dir(pair: str = DEFAULT_PAIR) -> Path:
    """Export directory used by ``edgespec chat`` when no DIR is given."""
    return exports_dir() / pair
