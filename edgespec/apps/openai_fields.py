"""The OpenAI request fields beyond messages and sampling: which fields are accepted, tools and tool messages,
``response_format``, ``logprobs``, penalties, ``logit_bias``, ``echo`` — and the ``logprobs`` response shapes.

Pure Python (no HTTP library, no grammar library): :func:`check_fields` refuses a field edgespec does not
implement, :func:`parse_extras` gives the typed :class:`Extras`; the grammar of a ``response_format`` or a
required tool call is compiled later (``edgespec.apps.serve``), where the tokenizer is known.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..core.processors import MAX_TOP_LOGPROBS
from .request_error import RequestError, is_one_of

# every field a request may carry (null counts as absent); anything else is a 400 naming it
CHAT_FIELDS = frozenset({
    "model", "messages", "max_tokens", "max_completion_tokens", "n", "temperature", "top_p", "top_k", "seed",
    "stop", "stream", "stream_options", "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "logit_bias", "response_format", "tools", "tool_choice", "parallel_tool_calls", "user",
    "edgespec"})
COMPLETION_FIELDS = frozenset({
    "model", "prompt", "max_tokens", "n", "best_of", "temperature", "top_p", "top_k", "seed", "stop", "stream",
    "stream_options", "logprobs", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
    "echo", "user", "edgespec", "suffix"})  # suffix: fill in the middle (edgespec/fim_serve.py)
HINTS = {"functions": "use tools", "function_call": "use tool_choice"}
MAX_LOGIT_BIAS = 1024
MAX_ID_DIGITS = 18  # a logit_bias key longer than this is no token id (and int() refuses over 4,300 digits)
INF_LOGPROB = -9999.0  # what a token the processors forbid (logprob -inf) is reported as (JSON has no -inf)


def _error(message: str, param: str | None = None):
    return RequestError(400, message, param)


def check_fields(body: dict, chat: bool) -> None:
    """Raises RequestError (400) naming the first field (sorted) this endpoint does not implement."""
    known = CHAT_FIELDS if chat else COMPLETION_FIELDS
    for k in sorted(k for k, v in body.items() if v is not None and k not in known):
        hint = f"; {HINTS[k]}" if k in HINTS else ""
        raise _error(f"{k} is not supported by edgespec serve on this endpoint{hint}", k)
    if body.get("best_of") is not None and not is_one_of(body["best_of"], 1):
        raise _error("best_of must be 1 (one choice per request)", "best_of")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise _error("user must be a string", "user")


@dataclass(frozen=True)
class Extras:
    """What a request asks beyond plain sampling. ``tools``: validated OpenAI tool objects (None: none);
    ``tool_choice``: ``auto``, ``none``, ``required`` or ``function`` (then ``tool_name``); ``response_format``:
    ``text``, ``json_object`` or ``json_schema`` (then ``schema``); ``parallel_tool_calls``: a constrained call
    may be several (default one); ``logprobs``: None (off) or how many
    alternatives (0..20); penalties as :class:`~edgespec.core.processors.Processing`; ``echo``: prepend the prompt."""

    tools: tuple | None = None
    tool_choice: str = "none"
    tool_name: str | None = None
    parallel_tool_calls: bool = False
    response_format: str = "text"
    schema: dict | None = None
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple = ()
    echo: bool = False

    @property
    def constrained_tools(self) -> bool:
        return self.tools is not None and self.tool_choice in ("required", "function")

    @property
    def parse_tools(self) -> bool:
        return self.tools is not None and self.tool_choice != "none"


def _unicode(v, where: str, param: str) -> None:
    """Raises RequestError (400) when ``v`` (JSON data) holds a lone surrogate: a valid JSON escape
    (``"\\ud800"``) but not Unicode text, which the chat template would render and the tokenizer refuse."""
    try:
        json.dumps(v, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise _error(f"{where} is not valid Unicode (lone surrogate)", param) from None


def _number(body: dict, name: str, lo: float, hi: float, default: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise _error(f"{name} must be a number in [{lo:g}, {hi:g}], got {v!r}", name)
    return float(v)


def _tools(v) -> tuple:
    if not isinstance(v, list) or not v:
        raise _error("tools must be a non-empty list of tool objects", "tools")
    out, names = [], set()
    for i, t in enumerate(v):
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise _error(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}", "tools")
        extra = sorted(set(t) - {"type", "function"})
        if extra:
            raise _error(f"tools[{i}].{extra[0]} is not supported", "tools")
        f = t["function"]
        from .tools import NAME

        if not isinstance(f.get("name"), str) or not NAME.match(f["name"]):
            raise _error(f"tools[{i}].function.name must be 1-64 letters, digits, _ or -", "tools")
        if f["name"] in names:
            raise _error(f"tools[{i}].function.name {f['name']!r} is not unique", "tools")
        names.add(f["name"])
        bad = sorted(k for k, x in f.items() if x is not None and k not in ("name", "description", "parameters",
                                                                             "strict"))
        if bad:
            raise _error(f"tools[{i}].function.{bad[0]} is not supported", "tools")
        if f.get("description") is not None and not isinstance(f["description"], str):
            raise _error(f"tools[{i}].function.description must be a string", "tools")
        if f.get("parameters") is not None and not isinstance(f["parameters"], dict):
            raise _error(f"tools[{i}].function.parameters must be a JSON schema object", "tools")
        if f.get("strict") is not None and not isinstance(f["strict"], bool):
            raise _error(f"tools[{i}].function.strict must be a boolean", "tools")
        _unicode(f, f"tools[{i}].function", "tools")
        out.append({"type": "function", "function": {k: x for k, x in f.items() if x is not None and k != "strict"}})
    return tuple(out)


def _tool_choice(v, tools) -> tuple[str, str | None]:
    if v is None:
        return ("auto" if tools else "none"), None
    if tools is None:
        raise _error("tool_choice needs tools", "tool_choice")
    if v in ("auto", "none", "required"):
        return v, None
    if isinstance(v, dict) and v.get("type") == "function" and isinstance(v.get("function"), dict):
        bad = sorted(set(v) - {"type", "function"}) + sorted(f"function.{k}" for k in set(v["function"]) - {"name"})
        if bad:
            raise _error(f"tool_choice.{bad[0]} is not supported", "tool_choice")
        name = v["function"].get("name")
        if not isinstance(name, str) or name not in {t["function"]["name"] for t in tools}:
            raise _error(f"tool_choice names the function {name!r}, which is not in tools", "tool_choice")
        return "function", name
    raise _error('tool_choice must be "auto", "none", "required" or {"type": "function", "function": {"name"}}',
                 "tool_choice")


def _response_format(v) -> tuple[str, dict | None]:
    if v is None:
        return "text", None
    if not isinstance(v, dict) or v.get("type") not in ("text", "json_object", "json_schema"):
        raise _error('response_format.type must be "text", "json_object" or "json_schema"', "response_format")
    bad = sorted(set(v) - {"type"} - ({"json_schema"} if v["type"] == "json_schema" else set()))
    if bad:
        raise _error(f"response_format.{bad[0]} is not supported with type {v['type']}", "response_format")
    if v["type"] != "json_schema":
        return v["type"], None
    js = v.get("json_schema")
    if not isinstance(js, dict) or not isinstance(js.get("name"), str):
        raise _error("response_format.json_schema must be an object with a name and a schema", "response_format")
    bad = sorted(set(js) - {"name", "description", "schema", "strict"})
    if bad:
        raise _error(f"response_format.json_schema.{bad[0]} is not supported", "response_format")
    schema = js.get("schema", {})
    if not isinstance(schema, dict):
        raise _error("response_format.json_schema.schema must be an object", "response_format")
    if js.get("strict") is not None and not isinstance(js["strict"], bool):
        raise _error("response_format.json_schema.strict must be a boolean", "response_format")
    return "json_schema", schema  # strict or not, the output is constrained to the schema


def _logprobs(body: dict, chat: bool) -> int | None:
    v = body.get("logprobs")
    if chat:
        if v is not None and not isinstance(v, bool):
            raise _error("logprobs must be a boolean", "logprobs")
        top = body.get("top_logprobs")
        if top is not None:
            if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
                raise _error(f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}]", "top_logprobs")
            if not v:
                raise _error("top_logprobs needs logprobs: true", "top_logprobs")
        return (top or 0) if v else None
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_TOP_LOGPROBS:
        raise _error(f"logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}]", "logprobs")
    return v


def _logit_bias(v) -> tuple:
    if v is None:
        return ()
    if not isinstance(v, dict) or len(v) > MAX_LOGIT_BIAS:
        raise _error(f"logit_bias must be an object of at most {MAX_LOGIT_BIAS} token ids", "logit_bias")
    out = []
    for k, b in v.items():
        if not (isinstance(k, str) and k.isascii() and k.isdigit() and len(k) <= MAX_ID_DIGITS
                and (k == "0" or not k.startswith("0"))):  # "01" would be a second key for token 1
            raise _error(f"logit_bias keys must be token ids, got {k[:24]!r}", "logit_bias")
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not -100 <= b <= 100:
            raise _error(f"logit_bias[{k}] must be a number in [-100, 100]", "logit_bias")
        out.append((int(k), float(b)))
    return tuple(out)


def parse_extras(body: dict, chat: bool) -> Extras:
    """The body's tools/format/logprobs/penalty/echo fields → :class:`Extras`. Raises RequestError (400)."""
    tools = _tools(body["tools"]) if chat and body.get("tools") is not None else None
    choice, name = _tool_choice(body.get("tool_choice"), tools) if chat else ("none", None)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise _error("parallel_tool_calls must be a boolean", "parallel_tool_calls")
    if parallel is not None and tools is None:
        raise _error("parallel_tool_calls needs tools", "parallel_tool_calls")
    if parallel is False and tools is not None and choice == "auto":
        raise _error("parallel_tool_calls: false needs tool_choice required or a named function (where decoding "
                     "is constrained to one call)", "parallel_tool_calls")
    fmt, schema = _response_format(body.get("response_format")) if chat else ("text", None)
    if fmt != "text" and choice in ("required", "function"):
        raise _error("response_format and a required tool call cannot both constrain the output", "response_format")
    echo = body.get("echo")
    if echo is not None and not isinstance(echo, bool):
        raise _error("echo must be a boolean", "echo")
    lp = _logprobs(body, chat)
    if echo and lp is not None:
        raise _error("echo with logprobs (the prompt's logprobs) is not supported", "echo")
    # a required or named call is one call unless parallel_tool_calls is true (llama.cpp's default: on the
    # real pair an unbounded grammar let the model go on inventing calls); auto returns every call it makes
    return Extras(tools, choice, name, parallel is True, fmt, schema, lp,
                  _number(body, "presence_penalty", -2, 2, 0.0), _number(body, "frequency_penalty", -2, 2, 0.0),
                  _number(body, "repetition_penalty", 0.01, 100, 1.0), _logit_bias(body.get("logit_bias")),
                  bool(echo))


def tool_message(m: dict, i: int, role: str) -> dict:
    """The tool keys of ``messages[i]``: an assistant's ``tool_calls`` (validated, arguments JSON text of an
    object), a tool message's ``tool_call_id``. Raises RequestError (400) for any other key."""
    allowed = {"role", "content"} | ({"tool_calls"} if role == "assistant" else set()) | \
        ({"tool_call_id"} if role == "tool" else set())
    bad = sorted(k for k, v in m.items() if v is not None and k not in allowed)
    if bad:
        raise _error(f"messages[{i}].{bad[0]} is not supported", "messages")
    out: dict = {}
    if role == "tool":
        if not isinstance(m.get("tool_call_id"), str):
            raise _error(f"messages[{i}].tool_call_id must be a string", "messages")
        _unicode(m["tool_call_id"], f"messages[{i}].tool_call_id", "messages")
        out["tool_call_id"] = m["tool_call_id"]
    calls = m.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise _error(f"messages[{i}].tool_calls must be a list", "messages")
        norm = []
        for j, c in enumerate(calls):
            f = c.get("function") if isinstance(c, dict) else None
            where = f"messages[{i}].tool_calls[{j}]"
            if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not isinstance(c.get("id"), str):
                raise _error(f"{where} must have an id and a function with a name and arguments", "messages")
            if c.get("type") not in (None, "function"):
                raise _error(f"{where}.type must be \"function\"", "messages")
            if c.get("index") is not None and not (type(c["index"]) is int and c["index"] >= 0):
                raise _error(f"{where}.index must be an integer ≥ 0", "messages")
            # "index": what a client that merged this server's streamed tool-call deltas sends back (ignored)
            extra = sorted({k for k, v in c.items() if v is not None} - {"id", "type", "function", "index"}) + sorted(
                f"function.{k}" for k, v in f.items() if v is not None and k not in ("name", "arguments"))
            if extra:
                raise _error(f"{where}.{extra[0]} is not supported", "messages")
            try:
                args = json.loads(f.get("arguments", "{}"))
            except (TypeError, ValueError, RecursionError):  # RecursionError: nested past Python's limit
                raise _error(f"{where}.function.arguments must be JSON text of an object", "messages") from None
            if not isinstance(args, dict):
                raise _error(f"{where}.function.arguments must be JSON text of an object", "messages")
            _unicode([c["id"], f["name"], args], where, "messages")
            norm.append({"id": c["id"], "type": "function",
                         "function": {"name": f["name"], "arguments": f.get("arguments", "{}")}})
        if norm:
            out["tool_calls"] = norm
    return out


# -- logprobs in the response ------------------------------------------------------------------------------

_BYTE_OF: dict | None = None


def _byte_level_map() -> dict:
    """GPT-2's byte-level BPE alphabet: the printable character that stands for each byte → that byte."""
    global _BYTE_OF
    if _BYTE_OF is None:
        bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
            list(range(ord("®"), ord("ÿ") + 1))
        cs, n = bs[:], 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        _BYTE_OF = {chr(c): b for b, c in zip(bs, cs)}
    return _BYTE_OF


def token_piece(tokenizer, token_id: int) -> tuple[str, list[int]]:
    """A token's text and its bytes (a byte-level token's raw bytes, which may be part of a UTF-8 character)."""
    raw = tokenizer.id_to_token(int(token_id)) or ""
    m = _byte_level_map()
    if raw and all(ch in m for ch in raw):
        b = bytes(m[ch] for ch in raw)
    else:
        b = tokenizer.decode([int(token_id)], skip_special_tokens=False).encode("utf-8")
    return b.decode("utf-8", errors="replace"), list(b)


def _lp(x: float) -> float:
    return x if x > INF_LOGPROB else INF_LOGPROB


class LogprobsFormatter:
    """:class:`~edgespec.core.processors.TokenLogprob` entries → OpenAI's ``logprobs`` object of a chat choice
    (``{"content": [{"token", "logprob", "bytes", "top_logprobs"}]}``) or of a completion choice
    (``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``), chunk by chunk (the text offsets run on
    across chunks, from ``offset``). Forbidden tokens' -inf is reported as -9999."""

    def __init__(self, tokenizer, chat: bool, offset: int = 0):
        self.tok, self.chat, self.offset = tokenizer, chat, offset

    def format(self, entries) -> dict:
        if self.chat:
            content = []
            for e in entries:
                text, b = token_piece(self.tok, e.token_id)
                tops = [dict(zip(("token", "bytes"), token_piece(self.tok, t)), logprob=_lp(lp)) for t, lp in e.top]
                content.append({"token": text, "logprob": _lp(e.logprob), "bytes": b, "top_logprobs": tops})
            return {"content": content, "refusal": None}
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for e in entries:
            text, _ = token_piece(self.tok, e.token_id)
            out["tokens"].append(text)
            out["token_logprobs"].append(_lp(e.logprob))
            out["top_logprobs"].append({token_piece(self.tok, t)[0]: _lp(lp) for t, lp in e.top})
            out["text_offset"].append(self.offset)
            self.offset += len(text)
        return out
