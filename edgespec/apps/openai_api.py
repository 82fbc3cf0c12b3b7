"""The OpenAI-compatible wire format of ``edgespec serve``: request validation, response objects, stop strings.

Pure Python (no HTTP library): :func:`parse_chat` and :func:`parse_completion` turn a decoded JSON body into a
typed :class:`Request` or raise :class:`RequestError` (an HTTP status and an OpenAI-style error object);
the ``*_object`` builders give the response and stream-chunk shapes of the chat-completions and completions
APIs, with edgespec's own figures under the ``"edgespec"`` key. A field edgespec does not implement is refused
(400 naming it), never ignored: :data:`CHAT_FIELDS` and :data:`COMPLETION_FIELDS` are what it accepts (the
README's table). The tools, response-format, logprobs and penalty fields are parsed in :mod:`.openai_fields`.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass

from ..engine.flags import MAX_SEED
from .openai_fields import check_fields, parse_extras, tool_message
from .request_error import RequestError, error_object, is_one_of  # noqa: F401  (error_object: part of this module's API)

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
MAX_STOP = 4  # as the OpenAI API


@dataclass(frozen=True)
class Request:
    """One validated completion request. ``messages`` (chat) or ``prompt``/``prompt_ids`` (completions);
    None for a sampling field means "the server's default"; ``max_tokens`` in tokens; ``latency_budget_ms``
    (ms per round, adaptive K only) from the ``"edgespec"`` extension object."""

    messages: tuple[dict, ...] | None = None
    prompt: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    latency_budget_ms: float | None = None
    # openai_fields.Extras: tools, tool_choice, response format, logprobs, penalties, logit_bias, echo
    extras: object = None


def text_field(v, param: str) -> str:
    """``v`` if it is a str that encodes as UTF-8. Raises RequestError (400) naming ``param``."""
    if not isinstance(v, str):
        raise RequestError(400, f"{param} must be a string", param)
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError(400, f"{param} is not valid Unicode (lone surrogate)", param) from None
    return v


def int_field(body: dict, name: str, lo: int | None = None, hi: int | None = None) -> int | None:
    """``body[name]``: None, or an int (never a bool) in [lo, hi]. Raises RequestError (400) naming it."""
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise RequestError(400, f"{name} must be an integer, got {type(v).__name__}", name)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f"≥ {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise RequestError(400, f"{name} must be {rng}, got {v}", name)
    return v


def float_field(body: dict, name: str, ok, what: str) -> float | None:
    """``body[name]``: None, or a finite number for which ``ok`` holds (``what`` says which). Raises RequestError
    (400) naming it."""
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RequestError(400, f"{name} must be a number, got {type(v).__name__}", name)
    try:
        f = float(v)
    except OverflowError:  # a JSON integer no float holds
        raise RequestError(400, f"{name} must be {what}, got an integer of {len(str(abs(v)))} digits", name) from None
    if not math.isfinite(f) or not ok(f):
        raise RequestError(400, f"{name} must be {what}, got {v}", name)
    return f


def aliased_int_field(body: dict, name: str, alias: str, lo: int) -> int | None:
    """An integer field that has an alias (``max_tokens`` of ``max_completion_tokens``): both checked, and
    refused (400) when both are given and differ."""
    v, a = int_field(body, name, lo), int_field(body, alias, lo)
    if v is not None and a is not None and v != a:
        raise RequestError(400, f"{alias} ({a}) and {name} ({v}) differ: give one", alias)
    return a if v is None else v


def bool_field(body: dict, name: str) -> bool:
    """``body[name]``: a bool (absent or None: False). Raises RequestError (400) naming it."""
    v = body.get(name, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise RequestError(400, f"{name} must be a boolean", name)
    return v


def _content(v, i: int) -> str:
    param = f"messages[{i}].content"
    if isinstance(v, str):
        return text_field(v, param)
    if isinstance(v, list):  # content parts: only text is understood
        out = []
        for j, part in enumerate(v):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise RequestError(400, f"{param}[{j}]: only text content parts are supported", param)
            if set(part) - {"type", "text"}:
                raise RequestError(400, f"{param}[{j}].{sorted(set(part) - {'type', 'text'})[0]} is not supported",
                                   param)
            out.append(text_field(part.get("text"), f"{param}[{j}].text"))
        return "".join(out)
    raise RequestError(400, f"{param} must be a string or a list of text parts", param)


def _messages(v) -> tuple[dict, ...]:
    if not isinstance(v, list):
        raise RequestError(400, "messages must be a list", "messages")
    if not v:
        raise RequestError(400, "messages must not be empty", "messages")
    out = []
    for i, m in enumerate(v):
        if not isinstance(m, dict):
            raise RequestError(400, f"messages[{i}] must be an object", "messages")
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise RequestError(400, f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}",
                               "messages")
        content = "" if role == "assistant" and m.get("content") is None else _content(m.get("content"), i)
        out.append({"role": ROLES[role], "content": content, **tool_message(m, i, role)})
    return tuple(out)


def stop_field(v) -> tuple[str, ...]:
    """The ``stop`` field (None, a str or a list of str) as a tuple of stop strings. Raises RequestError (400)."""
    if v is None:
        return ()
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or len(stops) > MAX_STOP:
        raise RequestError(400, f"stop must be a string or a list of at most {MAX_STOP} strings", "stop")
    return tuple(s for s in (text_field(s, "stop") for s in stops) if s)


def _common(body: dict, chat: bool) -> dict:
    """The fields chat and text completions share."""
    check_fields(body, chat)
    if body.get("n") is not None and not is_one_of(body["n"], 1):
        raise RequestError(400, "n must be 1 (one choice per request)", "n")
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise RequestError(400, "stream_options must be an object", "stream_options")
    for k in set(so or {}) - {"include_usage"}:
        raise RequestError(400, f"stream_options.{k} is not supported (only include_usage)", f"stream_options.{k}")
    if so is not None and body.get("stream") is not True:  # as OpenAI: never silently unused
        raise RequestError(400, "stream_options is only allowed when stream is true", "stream_options")
    ext = body.get("edgespec")
    if ext is not None and not isinstance(ext, dict):
        raise RequestError(400, "edgespec must be an object", "edgespec")
    for k in set(ext or {}) - {"latency_budget_ms"}:
        raise RequestError(400, f"edgespec.{k} is not supported (only latency_budget_ms)", f"edgespec.{k}")
    max_tokens = aliased_int_field(body, "max_completion_tokens", "max_tokens", 1)
    if not isinstance(body.get("model", ""), str):
        raise RequestError(400, "model must be a string", "model")
    return dict(
        max_tokens=max_tokens,
        temperature=float_field(body, "temperature", lambda v: 0 <= v <= 2, "in [0, 2]"),
        top_p=float_field(body, "top_p", lambda v: 0 < v <= 1, "in (0, 1]"),
        top_k=int_field(body, "top_k", 0),
        seed=int_field(body, "seed", 0, MAX_SEED),
        stop=stop_field(body.get("stop")),
        stream=bool_field(body, "stream"),
        include_usage=bool_field(so or {}, "include_usage"),
        latency_budget_ms=float_field(ext or {}, "latency_budget_ms", lambda v: v > 0, "> 0 ms"),
        extras=parse_extras(body, chat),
    )


def parse_chat(body) -> Request:
    """A ``POST /v1/chat/completions`` body → :class:`Request`. Raises RequestError (400)."""
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    if "messages" not in body:
        raise RequestError(400, "messages is required", "messages")
    return Request(messages=_messages(body["messages"]), **_common(body, chat=True))


def parse_completion(body, n_tokens: int) -> Request:
    """A ``POST /v1/completions`` body → :class:`Request` (``prompt``: a string, a list of one string, or a
    list of token ids in [0, n_tokens): the tokenizer's ids, not a padded head's). Raises RequestError (400)."""
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
        p = p[0]
    if isinstance(p, str):
        if not p:
            raise RequestError(400, "prompt must not be empty", "prompt")
        return Request(prompt=text_field(p, "prompt"), **_common(body, chat=False))
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        if not all(0 <= t < n_tokens for t in p):
            raise RequestError(400, f"prompt token ids must be in [0, {n_tokens})", "prompt")
        return Request(prompt_ids=tuple(p), **_common(body, chat=False))
    raise RequestError(400, "prompt must be a non-empty string or list of token ids (one prompt per request)",
                       "prompt")


class StopMatcher:
    """Cuts streamed text at the first stop string, holding back only text that may begin one.

    ``push(piece)`` returns the text that is safe to emit; once a stop string is seen, ``hit`` is True and
    the stop string and everything after it are dropped. The concatenation of all returned text (plus
    ``flush()`` at the end) equals the generated text cut before the earliest stop string.
    """

    def __init__(self, stops: tuple[str, ...] = ()):
        self.stops = [s for s in stops if s]
        self.buf = ""
        self.hit = False

    def push(self, piece: str) -> str:
        if self.hit:
            return ""
        if not self.stops:
            return piece
        self.buf += piece
        cut = min((i for i in (self.buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            out, self.buf, self.hit = self.buf[:cut], "", True
            return out
        hold = max((k for s in self.stops for k in range(1, min(len(s), len(self.buf) + 1))
                    if self.buf.endswith(s[:k])), default=0)
        out, self.buf = self.buf[:len(self.buf) - hold], self.buf[len(self.buf) - hold:]
        return out

    def flush(self) -> str:
        out, self.buf = self.buf, ""
        return out


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage_object(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    """Token counts; ``cached_tokens``: prompt positions served from the KV cache of an earlier request."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def extension_object(stats, queue_ms: float) -> dict:
    """edgespec's own figures of one generation (from :class:`~edgespec.core.stats.GenerationStats`): alpha in
    [0, 1], mean K, tokens per round, tok/s, prefill/queue ms, the latency budget (ms) in force, and the
    draft's own prompt length in tokens (None: the draft read the prompt)."""
    ks = stats.k_per_round
    return {"mode": stats.mode, "alpha": stats.alpha, "mean_k": sum(ks) / len(ks) if ks else 0.0,
            "tokens_per_round": stats.mean_accepted_length, "rounds": stats.rounds,
            "tokens_per_s": stats.tokens_per_s, "decode_tokens_per_s": stats.decode_tokens_per_s,
            "prefill_ms": stats.prefill_ms, "queue_ms": queue_ms, "latency_budget_ms": stats.latency_budget_ms,
            "stop_reason": stats.stop_reason, "draft_prompt_tokens": stats.draft_prompt_tokens}


def response_object(chat: bool, rid: str, model: str, text: str, finish: str, usage: dict, ext: dict,
                    tool_calls: list | None = None, logprobs: dict | None = None) -> dict:
    """A whole (non-streamed) ``chat.completion`` or ``text_completion``; ``tool_calls`` (OpenAI call objects;
    the content is then None when empty) and ``logprobs`` (the choice's object) where asked for."""
    message = {"role": "assistant", "content": text}
    if tool_calls:
        message = {"role": "assistant", "content": text or None, "tool_calls": tool_calls}
    choice = ({"index": 0, "message": message, "finish_reason": finish, "logprobs": logprobs} if chat else
              {"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs})
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": [choice], "usage": usage, "edgespec": ext}


def chunk_object(chat: bool, rid: str, model: str, text: str | None, finish: str | None = None,
                 first: bool = False, tool_calls: list | None = None, logprobs: dict | None = None) -> dict:
    """One stream chunk: a text delta, tool-call deltas (OpenAI's ``[{"index", "id", "type", "function"}]``),
    or (``finish`` set) the closing chunk with an empty delta; ``logprobs`` of the chunk's tokens."""
    if chat:
        delta = {"role": "assistant", "content": ""} if first else ({} if text is None else {"content": text})
        if tool_calls:
            delta = {"tool_calls": tool_calls}
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": logprobs}
    return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": [choice]}
