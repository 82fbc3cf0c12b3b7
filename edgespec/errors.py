"""User-facing errors: one clear line at the CLI, never a traceback."""


class EdgespecError(Exception):
    """An error caused by the user's input or environment; the CLI prints ``str(err)`` on one line."""
