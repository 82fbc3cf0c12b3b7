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

The model does not always use the tags: Qwen2.5-Coder asked about the weather in Paris answers a ```json fenced
block holding ``{"name": "get_weather", "arguments": {"city": "Paris"}}``. An answer that is *wholly* such a call
(:func:`whole_calls`: a ```json block or a bare JSON value, one call object or a list of them, each naming a
declared tool) is taken as calls, as the Hermes/Qwen tool parsers of llama.cpp and vLLM take it; the parser holds
such an answer back until it is ruled out or ends, so the stream never shows it as content first. JSON among
prose, or naming a tool that was not declared, stays content.
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
    return _call(obj)


def _call(obj) -> ToolCall | None:
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


CALL_KEYS = ("name", "arguments", "parameters")  # the keys of a call object outside the tags
FENCE = "```"
_FIRST_KEY = re.compile(r'\{\s*(?:"([^"\\]*)("?))?')
_NAME_VALUE = re.compile(r'\{\s*"name"\s*(?::\s*(?:"([^"\\]*)("?))?)?')


def _unique(pairs: list) -> dict:
    """``object_pairs_hook``: a repeated key is an error (json keeps the last, a prefix test sees the first)."""
    obj = dict(pairs)
    if len(obj) < len(pairs):
        raise ValueError("repeated key")
    return obj


_JSON = json.JSONDecoder(object_pairs_hook=_unique)


def _calls(value, names: frozenset) -> list[ToolCall] | None:
    """``value`` (parsed JSON) as calls: one call object or a non-empty list of them, each with keys among
    :data:`CALL_KEYS` (``arguments`` or ``parameters``, not both) and a ``name`` in ``names``; else None."""
    objs = value if isinstance(value, list) else [value]
    out = []
    for obj in objs:
        if (not isinstance(obj, dict) or not set(obj) <= set(CALL_KEYS) or obj.get("name") not in names
                or "arguments" in obj and "parameters" in obj):
            return None
        call = _call(obj)
        if call is None:
            return None
        out.append(call)
    return out or None


def _unfence(s: str) -> tuple[str, bool]:
    """``s`` (stripped on the left) without an opening fence and its ``json`` tag, and whether it had one."""
    if not s.startswith(FENCE):
        return s, False
    s = s[len(FENCE):]
    return (s[4:] if s[:4].lower() == "json" else s).lstrip(), True


def whole_calls(text: str, names) -> list[ToolCall] | None:
    """The calls when the whole ``text`` is tool calls outside the tags: a ```json (or bare ```) fenced block or a
    bare JSON value holding ``{"name": <one of names>, "arguments": {...}}`` or a list of such objects; else
    None (prose around the JSON, an undeclared name, other keys)."""
    s, fenced = _unfence(text.strip())
    if fenced:
        if not s.endswith(FENCE):
            return None
        s = s[:-len(FENCE)]
    try:
        value = _JSON.decode(s.strip())
    except (ValueError, RecursionError):
        return None
    return _calls(value, frozenset(names))


def _may_be_calls(s: str, names: frozenset) -> bool:
    """Whether an answer beginning ``s`` (stripped on the left, not empty) may still be :func:`whole_calls`.
    False only when no ending can make it one, so text released as content early is content at the end too."""
    if FENCE.startswith(s):
        return True
    fenced = s.startswith(FENCE)
    if fenced and "json".startswith(s[len(FENCE):].lower()):  # the tag may still be coming
        return True
    s, _ = _unfence(s)
    if not s:
        return True
    try:
        value, end = _JSON.raw_decode(s)
    except (ValueError, RecursionError):  # not yet whole (or never valid: then it ends as content)
        return _object_may_be_call(s, names)
    tail = s[end:].strip()
    return _calls(value, names) is not None and (fenced and FENCE.startswith(tail) or not tail)


def _object_may_be_call(s: str, names: frozenset) -> bool:
    """Whether unfinished JSON ``s`` may begin a call object (or a list whose first item is one): its first key
    is one of :data:`CALL_KEYS` and, when it is ``name``, its value one of ``names`` (checked as far as written;
    an escape in a key or the name defers the judgement to the end)."""
    if s[0] == "[":
        s = s[1:].lstrip()
        if not s:
            return True
    if s[0] != "{":
        return False
    m = _FIRST_KEY.match(s)
    key, closed = m.group(1), m.group(2)
    if key is None:  # "{" and spaces so far, or something other than a key after them
        return m.end() == len(s)
    if not closed:
        return m.end() < len(s) or any(k.startswith(key) for k in CALL_KEYS)
    if key not in CALL_KEYS:
        return False
    if key != "name":
        return True
    m = _NAME_VALUE.match(s)
    value, closed = m.group(1), m.group(2)
    if value is None:  # not yet the name's string, or not a string at all
        return m.end() == len(s)
    if closed:
        return value in names
    return m.end() < len(s) or any(n.startswith(value) for n in names)


class ToolCallParser:
    """Streamed text → events: ``("content", str)`` and ``("call", ToolCall)``.

    Text that may begin ``<tool_call>`` is held back until it is known; whitespace around calls is dropped
    (content is the text outside the calls). An unterminated or unparsable block is emitted as content and
    counted in ``invalid``; ``calls`` counts the parsed calls. With the declared tools' ``names``, an answer
    that may still be wholly calls outside the tags (:func:`whole_calls`) is held back from its start until it
    is ruled out (then it goes through as text) or ends (then it is calls or content, decided whole).
    """

    def __init__(self, names=()):
        self.names = frozenset(names)
        self.head = ""  # the answer so far while it may be wholly calls outside the tags
        self.sniff = bool(self.names)
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
        if self.sniff:
            self.head += text
            s = self.head.lstrip()
            if not s or _may_be_calls(s, self.names):
                return []
            self.sniff, text, self.head = False, self.head, ""
        return self._scan(text)

    def _scan(self, text: str) -> list:
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
        """The end of the text: an answer held whole becomes its calls or content; an unterminated block becomes
        content (counted invalid)."""
        out: list = []
        if self.sniff:
            self.sniff, head, self.head = False, self.head, ""
            calls = whole_calls(head, self.names)
            if calls:
                self.calls += len(calls)
                return [("call", c) for c in calls]
            out = self._scan(head)
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
