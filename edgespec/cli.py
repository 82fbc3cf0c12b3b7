"""The ``edgespec`` command's entry point (``edgespec.cli:main``, ``python -m edgespec.cli``): the CLI itself is
:mod:`edgespec.apps.cli`.

Importing it also installs :func:`redeliver_interrupt` as ``sys.unraisablehook``, before the CLI's own imports.
"""

import os
import signal
import sys
import threading

_default_unraisablehook = sys.unraisablehook


def redeliver_interrupt(unraisable) -> None:
    """``sys.unraisablehook`` of the ``edgespec`` process: a Ctrl-C that landed in a callback Python cannot raise
    from (e.g. the weakref callback of importlib's module locks, during start-up) is signalled again, so it
    interrupts the code that runs next (the CLI's handler: "edgespec: interrupted", 130) instead of being printed
    as "Exception ignored" and lost. It is sent from another thread 0.1 s later: raised here (or while this
    hook waits for a thread to start), Python would run the handler inside the hook and lose it again. Every
    other unraisable exception goes to the default hook."""
    if isinstance(unraisable.exc_type, type) and issubclass(unraisable.exc_type, KeyboardInterrupt):
        timer = threading.Timer(0.1, os.kill, args=(os.getpid(), signal.SIGINT))
        timer.daemon = True
        timer.start()
        return
    _default_unraisablehook(unraisable)


sys.unraisablehook = redeliver_interrupt

try:  # after the hook: a Ctrl-C during these imports counts
    from .apps.cli import build_parser, main
except BaseException as e:  # a Ctrl-C here may arrive wrapped (RuntimeError from a dataclass's __set_name__)
    from .errors import caused_by_interrupt

    if not caused_by_interrupt(e):
        raise
    print("\nedgespec: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

__all__ = ["build_parser", "main", "redeliver_interrupt"]

if __name__ == "__main__":
    sys.exit(main())
