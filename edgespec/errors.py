"""User-facing errors: one clear line at the CLI, never a traceback."""


class EdgespecError(Exception):
    """An error caused by the user's input or environment; the CLI prints ``str(err)`` on one line."""


class EdgespecWarning(UserWarning):
    """Something the user should know that does not stop the run (e.g. an unwritable cache); the CLI prints
    ``edgespec: warning: <message>`` on one line."""
