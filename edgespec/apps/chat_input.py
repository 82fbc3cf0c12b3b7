"""Reading ``edgespec chat`` turns: prompt_toolkit on a terminal, plain stdin otherwise.

On a terminal, prompt_toolkit gives line editing, history (↑/↓, kept in the user cache) and bracketed paste:
a pasted block with newlines arrives as one turn. In both modes a turn may also be written as a block between
lines starting and ending with ``\"\"\"``. Input bytes that are not UTF-8 become U+FFFD (the caller is told),
so a stray byte never ends the session.
"""

from __future__ import annotations

import sys

from ..io import paths

FENCE = '"""'


def clean_text(text: str) -> tuple[str, bool]:
    """``text`` with undecodable input (surrogate escapes, lone surrogates) replaced by U+FFFD; and whether
    anything was replaced."""
    try:
        text.encode("utf-8")
        return text, False
    except UnicodeEncodeError:
        pass
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace"), True
    except UnicodeEncodeError:  # surrogates that are not escaped bytes
        return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text), True


class PlainInput:
    """Lines from a stream (stdin): no editing; a ``> `` prompt only when ``prompt`` is set."""

    def __init__(self, stream=None, prompt: bool = False):
        self.stream = stream if stream is not None else sys.stdin
        self.prompt = prompt

    def line(self, continuation: bool = False) -> str | None:
        """The next line without its newline; None at end of input. Raises KeyboardInterrupt on Ctrl-C."""
        if self.prompt:
            sys.stdout.write("... " if continuation else "> ")
            sys.stdout.flush()
        raw = getattr(self.stream, "buffer", None)
        if raw is not None:  # bytes: undecodable input is replaced here, never raised
            data = raw.readline()
            if not data:
                return None
            return data.decode("utf-8", "surrogateescape").rstrip("\r\n")
        text = self.stream.readline()
        return None if not text else text.rstrip("\r\n")


class TerminalInput:
    """prompt_toolkit's line editor with history in ``<user cache>/chat_history`` (in memory if unwritable)."""

    def __init__(self):
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory, InMemoryHistory

        history = InMemoryHistory()
        try:
            path = paths.home() / "chat_history"
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a"):
                pass
            history = FileHistory(str(path))
        except OSError:
            pass
        self.session = PromptSession(history=history)

    def line(self, continuation: bool = False) -> str | None:
        try:
            return self.session.prompt("... " if continuation else "> ")
        except EOFError:  # Ctrl-D
            return None


def open_input(terminal: bool):
    """A :class:`TerminalInput` when stdin and stdout are a terminal and prompt_toolkit is installed, else
    :class:`PlainInput` on stdin."""
    if terminal:
        try:
            return TerminalInput()
        except ImportError:
            return PlainInput(prompt=True)
    return PlainInput(prompt=sys.stdin.isatty())


def read_turn(reader) -> str | None:
    """One user turn: a line (or a pasted block), or the lines of a ``\"\"\"`` … ``\"\"\"`` block joined by
    newlines; None at end of input. Raises KeyboardInterrupt (the partial turn is dropped)."""
    first = reader.line()
    if first is None:
        return None
    if not first.lstrip().startswith(FENCE):
        return first
    body, parts = first.lstrip()[len(FENCE):], []
    while True:
        end = body.rstrip()
        if end.endswith(FENCE):
            parts.append(end[:-len(FENCE)])
            break
        parts.append(body)
        body = reader.line(continuation=True)
        if body is None:  # end of input inside a block: the block so far is the turn
            break
    return "\n".join(parts)
