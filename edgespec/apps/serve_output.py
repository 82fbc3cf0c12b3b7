"""One choice of a ``edgespec serve`` response, built from the worker's text events: content, tool calls, logprobs.

The same :class:`Choice` builds the stream's deltas and the whole response, so a streamed answer and the
non-streamed one agree (tool calls, content and logprobs alike).
"""

from __future__ import annotations

from .openai_fields import Extras, LogprobsFormatter
from .tools import ToolCallParser


class Choice:
    """Feeds text pieces (with their tokens' logprobs) through the tool-call parser and the logprobs formatter.

    :meth:`push` and :meth:`flush` return the deltas to stream, each a dict of :func:`chunk_object` keywords
    (``text`` or ``tool_calls``, and ``logprobs``); afterwards ``text``, ``tool_calls`` and ``logprobs`` hold the
    whole choice and :meth:`finish_reason` the reason to report.
    """

    def __init__(self, chat: bool, extras: Extras | None, tokenizer):
        self.chat = chat
        self.parser = None
        if chat and extras is not None and extras.parse_tools:  # calls outside the tags: only with text output
            names = [t["function"]["name"] for t in extras.tools] if extras.response_format == "text" else ()
            self.parser = ToolCallParser(names)
        self.want_logprobs = extras is not None and extras.logprobs is not None
        self.formatter = LogprobsFormatter(tokenizer, chat) if self.want_logprobs else None
        self.text_parts: list[str] = []
        self.tool_calls: list[dict] = []
        self.entries: list = []

    def _lp(self, entries) -> dict | None:
        if self.formatter is None:
            return None
        self.entries += entries
        return self.formatter.format(entries)

    def push(self, text: str, entries=()) -> list[dict]:
        events = self.parser.push(text) if self.parser is not None else [("content", text)]
        return self._deltas(events, entries)

    def flush(self) -> list[dict]:
        return self._deltas(self.parser.flush() if self.parser is not None else [], ())

    def _deltas(self, events, entries) -> list[dict]:
        out = []
        for kind, v in events:
            if kind == "content":
                if not v:
                    continue
                self.text_parts.append(v)
                out.append({"text": v})
            else:
                i = len(self.tool_calls)
                self.tool_calls.append(v.as_openai())
                out.append({"text": None, "tool_calls": [{"index": i, "id": v.id, "type": "function",
                                            "function": {"name": v.name, "arguments": ""}}]})
                out.append({"text": None, "tool_calls": [{"index": i, "function": {"arguments": v.arguments}}]})
        if entries and self.formatter is not None:
            if not out:  # tokens whose text is held back: their logprobs ride on an empty delta
                out.append({"text": "" if not self.chat else None})
            out[0]["logprobs"] = self._lp(list(entries))
        return out

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    @property
    def invalid_tool_calls(self) -> int:
        return self.parser.invalid if self.parser is not None else 0

    def finish_reason(self, base: str) -> str:
        return "tool_calls" if self.tool_calls and base == "stop" else base

    def logprobs(self) -> dict | None:
        """The whole choice's logprobs object (None when not asked for)."""
        if self.formatter is None:
            return None
        return LogprobsFormatter(self.formatter.tok, self.chat).format(self.entries)
