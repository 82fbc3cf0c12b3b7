"""llama.cpp server's wire format (its ``tools/server/README.md``) beyond ``/infill``: ``POST /completion``,
``POST /tokenize``, ``POST /detokenize``, ``GET /props``.

Pure Python (no HTTP library): the ``parse_*`` functions turn a decoded JSON body into typed values or raise
:class:`~edgespec.apps.request_error.RequestError` (400), which the routes (:mod:`.llama_serve`) answer in
llama.cpp's shape ``{"error": {"code", "message", "type"}}``. ``/completion`` shares ``/infill``'s fields and
checks (:func:`~edgespec.apps.fim_api.parse_infill`); a sampler edgespec lacks is accepted only at the value
that turns it off (``min_p`` 0, ``repeat_penalty`` 1, …), anything else edgespec cannot honour is refused by name.
"""

from __future__ import annotations

from dataclasses import replace

from .fim_api import INFILL_FIELDS, FimRequest, parse_infill
from .openai_api import bool_field, text_field
from .request_error import RequestError, is_one_of

# /completion fields accepted only at the value that leaves edgespec's sampling unchanged
NEUTRAL_FIELDS = {"min_p": (0, 0.0), "typical_p": (1, 1.0), "repeat_penalty": (1, 1.0), "presence_penalty": (0, 0.0),
                  "frequency_penalty": (0, 0.0), "dry_multiplier": (0, 0.0), "xtc_probability": (0, 0.0),
                  "dynatemp_range": (0, 0.0), "mirostat": (0,), "ignore_eos": (False,), "n_keep": (0,),
                  "n_cmpl": (1,), "n_cache_reuse": (0,), "timings_per_token": (False,), "return_progress": (False,),
                  "post_sampling_probs": (False,), "logit_bias": ([], {}), "lora": ([],), "n_discard": (0,)}
COMPLETION_FIELDS = (INFILL_FIELDS - {"input_prefix", "input_suffix", "input_extra"}) | {"grammar", "json_schema"}
MAX_PROMPT_IDS = 1 << 20  # token ids in one prompt (far past any context)


def _prompt(v, n_tokens: int) -> tuple[str | None, tuple]:
    """llama.cpp's ``prompt``: a string, token ids, or ids mixed with strings (one prompt). Returns
    ``(text, ())`` for a string, else ``(None, parts)``: the strings and runs of ids (tuples) in order, the
    strings to be tokenized where the tokenizer is. Raises RequestError (400)."""
    if isinstance(v, str):
        if not v:
            raise RequestError(400, "prompt must not be empty", "prompt")
        return text_field(v, "prompt"), ()
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], (str, list)):
        return _prompt(v[0], n_tokens)  # a list of one prompt
    if not isinstance(v, list) or not v or len(v) > MAX_PROMPT_IDS:
        raise RequestError(400, "prompt must be a non-empty string or a list of token ids (and strings)", "prompt")
    if all(isinstance(p, str) for p in v):
        raise RequestError(400, "several prompts in one request are not supported: send one per request", "prompt")
    parts: list = []
    for p in v:
        if isinstance(p, str):
            parts.append(text_field(p, "prompt"))
        elif isinstance(p, int) and not isinstance(p, bool) and 0 <= p < n_tokens:
            if parts and isinstance(parts[-1], list):
                parts[-1].append(p)
            else:
                parts.append([p])
        else:
            raise RequestError(400, f"prompt: token ids must be integers in [0, {n_tokens}), got {str(p)[:40]}",
                               "prompt")
    return None, tuple(tuple(p) if isinstance(p, list) else p for p in parts)


def _grammar(body: dict) -> tuple[str, object] | None:
    g, js = body.get("grammar"), body.get("json_schema")
    if g is not None and g != "" and js is not None:
        raise RequestError(400, "give one of grammar and json_schema", "grammar")
    if g is not None and g != "":
        return "gbnf", text_field(g, "grammar")
    if js is not None:
        if not isinstance(js, dict):
            raise RequestError(400, "json_schema must be a JSON schema object", "json_schema")
        return "json_schema", js
    return None


def parse_completion(body, n_tokens: int, samplers: str = "refuse") -> FimRequest:
    """A ``POST /completion`` body → :class:`~edgespec.apps.fim_api.FimRequest`; ``n_tokens``: the tokenizer's ids
    (0..n_tokens-1). Raises RequestError (400).

    The request's ``prompt`` is in ``FimRequest.prompt`` (text) or, with token ids, in
    ``FimRequest.prompt_parts`` (strings and id runs, in order). ``grammar`` (GBNF or
    llguidance's Lark) or ``json_schema`` constrain the answer; ``return_tokens`` returns the generated ids;
    the other fields are ``/infill``'s (``n_predict``, sampling, ``stop``, ``stream``, ``cache_prompt``,
    ``n_indent``, ``t_max_*_ms``, ``samplers``, ``id_slot``, ``n_probs`` 0)."""
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    for k, ok in NEUTRAL_FIELDS.items():
        if body.get(k) is not None and not is_one_of(body[k], *ok):
            raise RequestError(400, f"{k} {body[k]!r} is not implemented (edgespec accepts only {ok[0]!r}, off)"[:200], k)
    bad = sorted(k for k, x in body.items() if x is not None and k not in COMPLETION_FIELDS | NEUTRAL_FIELDS.keys())
    if bad:
        raise RequestError(400, f"/completion: unsupported field(s) {', '.join(bad)} (edgespec refuses what it does "
                                "not implement)", bad[0])
    if "prompt" not in body or body["prompt"] is None:
        raise RequestError(400, "prompt is required", "prompt")
    text, parts = _prompt(body["prompt"], n_tokens)
    rest = {k: x for k, x in body.items() if k in INFILL_FIELDS and k not in ("prompt", "return_tokens")}
    req = parse_infill(rest, samplers)
    return replace(req, fim=None, prompt=text, prompt_parts=parts, grammar=_grammar(body),
                   return_tokens=bool_field(body, "return_tokens"))


def parse_tokenize(body) -> tuple[str, bool, bool, bool]:
    """A ``POST /tokenize`` body → ``(content, add_special, parse_special, with_pieces)`` (defaults false,
    true, false). Raises RequestError (400)."""
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    bad = sorted(k for k, x in body.items() if x is not None and k not in ("content", "add_special", "parse_special",
                                                                          "with_pieces"))
    if bad:
        raise RequestError(400, f"/tokenize: unsupported field(s) {', '.join(bad)}", bad[0])
    if body.get("content") is None:
        raise RequestError(400, "content is required", "content")
    parse_special = body.get("parse_special")
    if parse_special is not None and not isinstance(parse_special, bool):
        raise RequestError(400, "parse_special must be a boolean", "parse_special")
    return (text_field(body["content"], "content"), bool_field(body, "add_special"), parse_special is not False,
            bool_field(body, "with_pieces"))


def parse_detokenize(body, n_tokens: int) -> list[int]:
    """A ``POST /detokenize`` body → its ``tokens`` (ids in [0, n_tokens)). Raises RequestError (400)."""
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    bad = sorted(k for k, x in body.items() if x is not None and k != "tokens")
    if bad:
        raise RequestError(400, f"/detokenize: unsupported field(s) {', '.join(bad)}", bad[0])
    v = body.get("tokens", [])
    if not isinstance(v, list) or len(v) > MAX_PROMPT_IDS or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < n_tokens for t in v):
        raise RequestError(400, f"tokens must be a list of token ids in [0, {n_tokens})", "tokens")
    return list(v)


def piece(text: str, raw: list[int]) -> str | list[int]:
    """A token's piece as ``/tokenize`` gives it: its text when its bytes are whole UTF-8, else the bytes."""
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return raw


def props_object(settings: dict, n_ctx: int, model_path: str, chat_template: str, build_info: str,
                 processing: bool, bos: str, eos: str) -> dict:
    """``GET /props``: the default generation settings (``/completion``'s ``generation_settings``), one slot."""
    return {"default_generation_settings": {"id": 0, "id_task": -1, "n_ctx": n_ctx,
                                            "speculative": settings.get("speculative", False),
                                            "is_processing": processing, "params": settings, "prompt": ""},
            "total_slots": 1, "model_path": model_path, "chat_template": chat_template,
            "modalities": {"vision": False, "audio": False}, "build_info": build_info, "bos_token": bos,
            "eos_token": eos, "is_sleeping": False}
