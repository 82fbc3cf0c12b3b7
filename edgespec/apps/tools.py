"""Tool calling: OpenAI tool definitions and messages in, the model's ``<tool_call>`` blocks out.

The export's chat template renders the tools and the tool turns (Qwen2.5's has the blocks; so do Hermes-style
templates): tools go to the template as ``tools``, an assistant's ``tool_calls`` as
``{"name", "arguments": {...}}`` (arguments parsed from OpenAI's JSON string, as Hugging Face's templates
expect), a ``role: "tool"`` message as is. The model answers a call as::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

:class:`ToolCallParser` turns streamed text into content deltas and parsed calls; a block whose JSON does not
parse (or lacks a name) stays in the content as text and is counted in ``invalid``, never dropped. The same
parser builds the streamed and the whole response, so the two agree.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from ..core.constrain import TOOL_CLOSE, TOOL_OPEN

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names


def template_renders_tools(source: str) -> bool:
    """Whether a chat template's source renders ``tools`` in the ``<tool_call>`` format this module parses."""
    return "tools" in source and TOOL_OPEN in source


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: ``id`` (``call_…``), the function ``name`` and its ``arguments`` as JSON text."""

    id: str
    name: str
    arguments: str

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def parse_call(body: str) -> ToolCall | None:
    """A call from the text between ``<tool_call>`` and ``</tool_call>``, or None if it is not
    ``{"name": str, "arguments": object}`` JSON (``arguments`` may also be a JSON string of an object)."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: nested past Python's limit
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(f"call_{uuid.uuid4().hex[:24]}", obj["name"], json.dumps(args, ensure_ascii=False))


class ToolCallParser:
    """Streamed text → events: ``("content", str)`` and ``("call", ToolCall)``.

    Text that may begin ``<tool_call>`` is held back until it is known; whitespace around calls is dropped
    (content is the text outside the calls). An unterminated or unparsable block is emitted as content and
    counted in ``invalid``; ``calls`` counts the parsed calls.
    """

    def __init__(self):
        self.buf = ""
        self.inside = False
        self.ws = ""  # whitespace held: dropped if a call follows (or ended just before), else emitted
        self.after_call = False
        self.calls = 0
        self.invalid = 0

    def _content(self, text: str, out: list) -> None:
        if not text:
            return
        stripped = text.rstrip()
        if not stripped:
            self.ws += text
            return
        if self.after_call:
            text, self.ws = text.lstrip(), ""
            self.after_call = False
            stripped = text.rstrip()
        out.append(("content", self.ws + stripped))
        self.ws = text[len(stripped):]

    def push(self, text: str) -> list:
        out: list = []
        self.buf += text
        while True:
            if self.inside:
                end = self.buf.find(TOOL_CLOSE)
                if end < 0:
                    return out
                body, self.buf = self.buf[:end], self.buf[end + len(TOOL_CLOSE):]
                self.inside = False
                call = parse_call(body.strip())
                if call is None:
                    self.invalid += 1
                    self._content(TOOL_OPEN + body + TOOL_CLOSE, out)
                else:
                    self.calls += 1
                    self.ws, self.after_call = "", True
                    out.append(("call", call))
                continue
            start = self.buf.find(TOOL_OPEN)
            if start >= 0:
                self._content(self.buf[:start], out)
                self.buf = self.buf[start + len(TOOL_OPEN):]
                self.inside = True
                continue
            hold = max((k for k in range(1, min(len(TOOL_OPEN), len(self.buf) + 1))
                        if self.buf.endswith(TOOL_OPEN[:k])), default=0)
            self._content(self.buf[:len(self.buf) - hold], out)
            self.buf = self.buf[len(self.buf) - hold:]
            return out

    def flush(self) -> list:
        """The end of the text: an unterminated block becomes content (counted invalid)."""
        out: list = []
        if self.inside:
            self.invalid += 1
            self._content(TOOL_OPEN + self.buf, out)
        else:
            self._content(self.buf, out)
        self.buf, self.inside = "", False
        if self.ws and not self.calls:
            out.append(("content", self.ws))
        self.ws = ""
        return out


def template_messages(messages) -> list[dict]:
    """OpenAI messages (validated) → the chat template's: an assistant's ``tool_calls`` with ``arguments``
    parsed to objects, content None → "" (the template skips empty content)."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [{"id": c["id"], "type": "function",
                                "function": {"name": c["function"]["name"],
                                             "arguments": json.loads(c["function"]["arguments"])}}
                               for c in m["tool_calls"]]
        out.append(m)
    return out
