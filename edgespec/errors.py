"""User-facing errors: one clear line at the CLI, never a traceback."""


class EdgespecError(Exception):
    """An error caused by the user's input or environment; the CLI prints ``str(err)`` on one line."""


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none), for one-line errors."""
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def caused_by_interrupt(e: BaseException) -> bool:
    """Whether a KeyboardInterrupt is ``e`` or among its causes: a Ctrl-C inside a C extension's initialisation
    or a class body's ``__set_name__`` arrives wrapped (ImportError, RuntimeError)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


class EdgespecWarning(UserWarning):
    """Something the user should know that does not stop the run (e.g. an unwritable cache); the CLI prints
    ``edgespec: warning: <message>`` on one line."""
