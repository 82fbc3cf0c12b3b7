"""Ollama's wire format (its ``docs/api.md``) for ``edgespec serve``: ``POST /api/chat``, ``POST /api/show``,
``GET /api/version``, ``GET /api/ps``, ``GET /api/tags``, and the ``options`` and ``keep_alive`` fields that
``/api/generate`` (:mod:`.fim_api`) shares.

Pure Python (no HTTP library): :func:`parse_chat` turns a decoded ``/api/chat`` body into an
:class:`OllamaChat` around the OpenAI routes' :class:`~edgespec.apps.openai_api.Request` (so the chat runs
through the same encoder, job builder and tool-call parser) or raises
:class:`~edgespec.apps.request_error.RequestError` (400); the routes answer it as Ollama does, ``{"error":
"text"}``. A field edgespec cannot honour is refused by name; an ``options`` entry is accepted at the value that
turns its sampler off (``repeat_penalty`` 1, ``min_p`` 0, …), since that is what edgespec does. Durations in the
responses are in ns.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass

from ..engine.flags import MAX_SEED
from .openai_api import Request, float_field, int_field, stop_field, text_field
from .openai_fields import Extras, parse_extras
from .request_error import RequestError, is_one_of

# the Ollama release whose API these routes follow (GET /api/version): apps gate features on it (tools in chat
# came in 0.3, JSON-schema formats in 0.5, capabilities in /api/show in 0.6)
OLLAMA_API_VERSION = "0.6.4"
OPTIONS = {"num_predict", "temperature", "top_k", "top_p", "seed", "stop", "num_ctx"}
# options accepted only at the value that turns them off (edgespec has no such sampler)
NEUTRAL_OPTIONS = {"repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "mirostat": 0,
                   "typical_p": 1.0, "min_p": 0.0, "tfs_z": 1.0}
CHAT_FIELDS = {"model", "messages", "tools", "format", "options", "stream", "keep_alive", "think", "logprobs",
               "top_logprobs"}
MESSAGE_KEYS = {"role", "content", "images", "tool_calls", "tool_name", "thinking"}

_DURATION = re.compile(r"([0-9]*\.?[0-9]+|[0-9]+\.)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_seconds(v) -> float:
    """Ollama's ``keep_alive``: seconds as a number, or a Go duration string (``"5m"``, ``"1h30m"``, ``"-1"``,
    ``"0s"``; a bare number string is seconds) → seconds (negative: forever). Raises RequestError (400)."""
    bad = RequestError(400, 'keep_alive must be a duration: seconds, or a string such as "5m" or "1h30m"', "keep_alive")
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        raise bad
    if not isinstance(v, str):
        if not math.isfinite(v):
            raise bad
        return float(v)
    s = v.strip()
    sign = -1.0 if s.startswith("-") else 1.0
    s = s[1:] if s[:1] in "+-" else s
    try:
        seconds = float(s)  # "300", "0", "-1"
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise bad
        return sign * seconds
    pos, total = 0, 0.0
    for m in _DURATION.finditer(s):
        if m.start() != pos:
            raise bad
        total, pos = total + float(m.group(1)) * _UNIT_S[m.group(2)], m.end()
    if pos == 0 or pos != len(s):
        raise bad
    return sign * total


def check_keep_alive(body: dict) -> None:
    """``keep_alive`` is accepted (the model stays loaded for the server's lifetime) unless it is 0, which asks
    to unload the model. Raises RequestError (400)."""
    if body.get("keep_alive") is not None and keep_alive_seconds(body["keep_alive"]) == 0:
        raise RequestError(400, "keep_alive 0 (unload the model) is not implemented: the model stays loaded",
                           "keep_alive")


def parse_options(v) -> dict:
    """Ollama's ``options`` → ``num_predict`` (int ≥ -2 or None), ``temperature``, ``top_p``, ``top_k``,
    ``seed`` (None: the server's default), ``stop`` (tuple of str), ``num_ctx`` (tokens or None). Raises
    RequestError (400) naming ``options`` for an option edgespec does not implement."""
    opts = {} if v is None else v
    if not isinstance(opts, dict):
        raise RequestError(400, "options must be an object", "options")
    for k, x in opts.items():
        if k in NEUTRAL_OPTIONS and x is not None and not is_one_of(x, NEUTRAL_OPTIONS[k]):
            raise RequestError(400, f"options: {k} {x!r} is not implemented (only {NEUTRAL_OPTIONS[k]!r}, off)",
                               "options")
    bad = sorted(k for k in opts if k not in OPTIONS and k not in NEUTRAL_OPTIONS and opts[k] is not None)
    if bad:
        raise RequestError(400, f"options: {', '.join(bad)} not implemented (supported: "
                                f"{', '.join(sorted(OPTIONS))})", "options")
    return dict(num_predict=int_field(opts, "num_predict", -2),
                temperature=float_field(opts, "temperature", lambda t: 0 <= t <= 2, "in [0, 2]"),
                top_p=float_field(opts, "top_p", lambda t: 0 < t <= 1, "in (0, 1]"), top_k=int_field(opts, "top_k", 0),
                seed=int_field(opts, "seed", 0, MAX_SEED), stop=stop_field(opts.get("stop")),
                num_ctx=int_field(opts, "num_ctx", 1))


def stream_field(body: dict) -> bool:
    """Ollama's ``stream``: true unless false. Raises RequestError (400)."""
    stream = True if body.get("stream") is None else body["stream"]
    if not isinstance(stream, bool):
        raise RequestError(400, "stream must be a boolean", "stream")
    return stream


def model_field(body: dict) -> str:
    """``model``: a non-empty string (the server runs one model, whatever the name). Raises RequestError."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise RequestError(400, "model is required", "model")
    return text_field(body["model"], "model")


# -- /api/chat ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OllamaChat:
    """One validated ``/api/chat`` request: ``request`` the OpenAI routes' request it runs as (messages, tools,
    format as ``response_format``, sampling), ``num_ctx`` a smaller context for it (tokens, or None),
    ``until_context``: ``num_predict`` -1/-2 (as many tokens as the context holds), ``evaluate_only``:
    ``num_predict`` 0 (cache the prompt, answer nothing), ``load_only``: no messages (Ollama loads the model;
    edgespec's is loaded: an empty answer with ``done_reason`` ``load``)."""

    request: Request | None
    stream: bool = True
    num_ctx: int | None = None
    until_context: bool = False
    evaluate_only: bool = False
    load_only: bool = False


def _call(c, where: str) -> dict:
    """An Ollama tool call ``{"function": {"name", "arguments": {...}}}`` → the OpenAI routes' form (arguments
    as JSON text, an id for the template)."""
    f = c.get("function") if isinstance(c, dict) else None
    if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
        raise RequestError(400, f"{where} must be {{\"function\": {{\"name\", \"arguments\"}}}}", "messages")
    bad = sorted(set(c) - {"function", "id", "type"}) + sorted(f"function.{k}" for k in set(f) - {"name", "arguments",
                                                                                                  "index"})
    if bad:
        raise RequestError(400, f"{where}.{bad[0]} is not supported", "messages")
    args = f.get("arguments", {})
    if not isinstance(args, dict):
        raise RequestError(400, f"{where}.function.arguments must be an object", "messages")
    try:
        text = json.dumps(args, ensure_ascii=False)
        text.encode("utf-8")
    except (UnicodeEncodeError, ValueError, RecursionError):
        raise RequestError(400, f"{where}.function.arguments is not valid JSON text", "messages") from None
    cid = c.get("id") if isinstance(c.get("id"), str) else f"call_{where.split('[')[-1].rstrip(']')}"
    return {"id": cid, "type": "function", "function": {"name": text_field(f["name"], where), "arguments": text}}


def _messages(v) -> tuple[dict, ...]:
    """Ollama messages → the chat template's (validated). Raises RequestError (400)."""
    if not isinstance(v, list):
        raise RequestError(400, "messages must be a list", "messages")
    out = []
    for i, m in enumerate(v):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RequestError(400, f"{where} must be an object", "messages")
        role = m.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            raise RequestError(400, f"{where}.role must be system, user, assistant or tool, got {role!r}", "messages")
        bad = sorted(k for k, x in m.items() if x is not None and k not in MESSAGE_KEYS)
        if bad:
            raise RequestError(400, f"{where}.{bad[0]} is not supported", "messages")
        for name, what in (("images", "images (this model reads text only)"), ("thinking", "thinking")):
            if m.get(name) not in (None, "", []):
                raise RequestError(400, f"{where}.{name}: {what} is not implemented", "messages")
        msg = {"role": role, "content": text_field("" if m.get("content") is None else m["content"],
                                                   f"{where}.content")}
        calls = m.get("tool_calls")
        if calls not in (None, []):
            if role != "assistant" or not isinstance(calls, list):
                raise RequestError(400, f"{where}.tool_calls must be a list, on an assistant message", "messages")
            msg["tool_calls"] = [_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
        if m.get("tool_name") is not None:
            if role != "tool":
                raise RequestError(400, f"{where}.tool_name belongs on a tool message", "messages")
            msg["name"] = text_field(m["tool_name"], f"{where}.tool_name")  # Hugging Face templates' key
        out.append(msg)
    return tuple(out)


def _format(v) -> dict | None:
    """Ollama's ``format`` ("json" or a JSON schema) as the OpenAI ``response_format``."""
    if v is None or v == "":
        return None
    if v == "json":
        return {"type": "json_object"}
    if isinstance(v, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": v}}
    raise RequestError(400, 'format must be "json" or a JSON schema object', "format")


def parse_chat(body) -> OllamaChat:
    """A ``POST /api/chat`` body → :class:`OllamaChat`. Raises RequestError (400).

    ``stream`` defaults to true; ``tools`` (Ollama's tool objects, OpenAI's shape) let the model call them in
    its template's format (``tool_choice`` auto); ``format`` "json" or a schema constrains the answer;
    ``options`` as :func:`parse_options`; ``keep_alive`` as :func:`check_keep_alive`; ``think``, ``logprobs``
    and ``top_logprobs`` are refused unless off."""
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    bad = sorted(k for k, x in body.items() if x is not None and k not in CHAT_FIELDS)
    if bad:
        raise RequestError(400, f"/api/chat: unsupported field(s) {', '.join(bad)} (edgespec refuses what it does "
                                "not implement)", bad[0])
    model_field(body)
    for name in ("think", "logprobs"):
        if body.get(name) is not None and not is_one_of(body[name], False):
            raise RequestError(400, f"{name} is not implemented on /api/chat", name)
    if body.get("top_logprobs") is not None and not is_one_of(body["top_logprobs"], 0):
        raise RequestError(400, "top_logprobs is not implemented on /api/chat", "top_logprobs")
    check_keep_alive(body)
    o = parse_options(body.get("options"))
    stream = stream_field(body)
    messages = _messages(body.get("messages", []))
    if not messages:
        return OllamaChat(None, stream, load_only=True)
    openai = {"tools": body.get("tools") or None, "response_format": _format(body.get("format"))}
    x: Extras = parse_extras({k: v for k, v in openai.items() if v is not None}, chat=True)
    n = o["num_predict"]
    req = Request(messages=messages, max_tokens=n if n is not None and n > 0 else None,
                  temperature=o["temperature"], top_p=o["top_p"], top_k=o["top_k"], seed=o["seed"], stop=o["stop"],
                  stream=stream, extras=x)
    return OllamaChat(req, stream, o["num_ctx"], until_context=n is not None and n < 0, evaluate_only=n == 0)


# -- responses ----------------------------------------------------------------------------------------------


def now_iso() -> str:
    """The current time as Ollama writes ``created_at`` (RFC 3339, UTC, µs)."""
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


def ollama_calls(calls: list[dict], start: int = 0) -> list[dict]:
    """OpenAI tool-call objects (arguments as JSON text) → Ollama's (``{"function": {"index", "name",
    "arguments": {...}}}``), indexed from ``start``."""
    return [{"function": {"index": start + i, "name": c["function"]["name"],
                          "arguments": json.loads(c["function"]["arguments"])}} for i, c in enumerate(calls)]


def chat_chunk(model: str, content: str, tool_calls: list[dict] | None = None) -> dict:
    """One streamed ``/api/chat`` line before the end: a piece of the answer, or tool calls (Ollama's form)."""
    message: dict = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {"model": model, "created_at": now_iso(), "message": message, "done": False}


def done_fields(done_reason: str, prompt_tokens: int, prompt_ms: float, eval_count: int, eval_ms: float,
                total_ms: float) -> dict:
    """The closing figures of ``/api/generate`` and ``/api/chat``: ``done_reason`` ``stop``, ``length`` or
    ``load``; counts in tokens; durations given in ms, written in ns."""
    return {"done": True, "done_reason": done_reason, "total_duration": int(total_ms * 1e6), "load_duration": 0,
            "prompt_eval_count": prompt_tokens, "prompt_eval_duration": int(prompt_ms * 1e6),
            "eval_count": eval_count, "eval_duration": int(eval_ms * 1e6)}


def chat_done(model: str, content: str, tool_calls: list[dict] | None, fields: dict, ext: dict | None = None) -> dict:
    """The last (or only) ``/api/chat`` object: the message (all of it when not streamed, else empty) and
    :func:`done_fields`; edgespec's own figures under ``"edgespec"``."""
    out = chat_chunk(model, content, tool_calls)
    out.pop("done")
    out.update(fields)
    if ext is not None:
        out["edgespec"] = ext
    return out


@dataclass(frozen=True)
class ModelCard:
    """What ``/api/tags``, ``/api/show`` and ``/api/ps`` say about the one model: ``name``, ``size`` (bytes of
    the export's files), ``digest`` (``sha256:`` of the target's source), ``family`` (architecture),
    ``quantization`` (precision), ``modified`` (s since the epoch), ``context_length`` (tokens),
    ``template`` (the Jinja chat template), ``stop`` (stop-token texts), ``capabilities`` (Ollama's names),
    ``path`` (the export directory)."""

    name: str
    size: int
    digest: str
    family: str
    quantization: str
    modified: float
    context_length: int
    template: str = ""
    stop: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ("completion",)
    path: str = ""

    def details(self) -> dict:
        return {"parent_model": "", "format": "onnx", "family": self.family, "families": [self.family],
                "parameter_size": "", "quantization_level": self.quantization}

    def entry(self) -> dict:
        return {"name": self.name, "model": self.name, "modified_at": _iso(self.modified), "size": self.size,
                "digest": self.digest, "details": self.details()}


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def tags_object(card: ModelCard) -> dict:
    """``GET /api/tags``: the one model this server runs."""
    return {"models": [card.entry()]}


def ps_object(card: ModelCard) -> dict:
    """``GET /api/ps``: the model is loaded for the server's lifetime (``expires_at`` far ahead), on the CPU
    (``size_vram`` 0)."""
    e = card.entry()
    del e["modified_at"]
    return {"models": [{**e, "expires_at": "9999-12-31T23:59:59Z", "size_vram": 0,
                        "context_length": card.context_length}]}


def show_object(card: ModelCard) -> dict:
    """``POST /api/show``: details, ``model_info`` (architecture and context length under Ollama's keys),
    the chat template (Jinja, as the export has it), the stop tokens as ``parameters``, ``capabilities``."""
    params = "\n".join(f"stop {json.dumps(s)}" for s in card.stop)
    modelfile = f"# edgespec export\nFROM {card.path}\n" + "".join(f"PARAMETER {p}\n" for p in params.splitlines())
    return {"modelfile": modelfile, "parameters": params, "template": card.template, "details": card.details(),
            "model_info": {"general.architecture": card.family, f"{card.family}.context_length": card.context_length},
            "capabilities": list(card.capabilities), "modified_at": _iso(card.modified)}


def parse_show(body) -> bool:
    """A ``POST /api/show`` body: ``model`` (or the older ``name``), ``verbose`` (accepted: nothing here is
    abridged). Returns ``verbose``. Raises RequestError (400)."""
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    bad = sorted(k for k, x in body.items() if x is not None and k not in ("model", "name", "verbose"))
    if bad:
        raise RequestError(400, f"/api/show: unsupported field(s) {', '.join(bad)}", bad[0])
    model_field({"model": body.get("model") if body.get("model") is not None else body.get("name")})
    v = body.get("verbose")
    if v is not None and not isinstance(v, bool):
        raise RequestError(400, "verbose must be a boolean", "verbose")
    return bool(v)
