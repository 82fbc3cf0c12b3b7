"""Progress bars for ``edgespec bench`` and ``eval``: tqdm when installed, otherwise silent.

tqdm comes with the ``export`` and ``bench`` extras; a runtime-only install (``pip install edgespec``) runs the
same commands without a bar.
"""

from __future__ import annotations


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, desc: str, enabled: bool = True, unit: str = "it"):
    """An object with ``update(n)`` and ``close()``: a tqdm bar on stderr, or a silent one when ``enabled`` is
    False or tqdm is not installed."""
    if enabled:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return _Silent()
        return tqdm(total=total, desc=desc, unit=unit)
    return _Silent()
