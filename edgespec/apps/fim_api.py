"""The code-completion wire formats of ``edgespec serve``: llama.cpp's ``POST /infill``, Ollama's
``POST /api/generate`` (with ``suffix``) and ``GET /api/tags``, and ``suffix`` on OpenAI's ``POST /v1/completions``.

Pure Python (no HTTP library): the ``parse_*`` functions turn a decoded JSON body into a typed
:class:`FimRequest` or raise :class:`~edgespec.apps.openai_api.RequestError` (400); a field edgespec does not
implement is refused by name, never ignored. The ``*_object`` builders give the published response shapes:
llama.cpp server README (``/completion`` response fields, ``/infill``), Ollama's API doc (``/api/generate``,
``/api/tags``; durations in ns).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..engine.flags import MAX_SEED
from .fim import FimPrompt
from .request_error import is_one_of
from .ollama_api import check_keep_alive, keep_alive_seconds, model_field, parse_options, stream_field  # noqa: F401
from .openai_api import RequestError, aliased_int_field, bool_field, float_field, int_field, stop_field, text_field

MAX_EXTRA = 256  # input_extra chunks per request


@dataclass(frozen=True)
class FimRequest:
    """One validated completion request of the FIM endpoints.

    ``fim``: what to fill (None: Ollama's plain ``prompt`` without ``suffix``, templated unless ``raw``);
    ``max_tokens`` in tokens (None: the server's default; ``until_context``: as many as the context holds);
    ``evaluate_only``: ``n_predict`` 0, the prompt is only cached; ``n_indent`` (characters),
    ``t_max_predict_ms``/``t_max_prompt_ms`` (ms, 0 = off): see :class:`~edgespec.apps.fim.MiddleCutter`;
    ``cache_prompt`` False: the KV cache of earlier requests is not reused; ``num_ctx``: Ollama's context
    size (tokens) for this request; ``prompt_parts``, ``grammar``, ``return_tokens``: llama.cpp's ``/completion``
    (:mod:`.llama_api`). Sampling fields None mean the server's default.
    """

    fim: FimPrompt | None = None
    prompt: str | None = None
    raw: bool = False
    max_tokens: int | None = None
    until_context: bool = False
    evaluate_only: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    n_indent: int = 0
    t_max_predict_ms: float = 0.0
    t_max_prompt_ms: float = 0.0
    cache_prompt: bool = True
    num_ctx: int | None = None
    samplers_replaced: bool = False
    latency_budget_ms: float | None = None  # as openai_api.Request (the serve job builder reads it)
    prompt_parts: tuple = ()  # llama.cpp's /completion: a prompt of token ids, as strings and id runs in order
    grammar: tuple[str, object] | None = None  # /completion: ("gbnf", text) or ("json_schema", schema)
    return_tokens: bool = False  # /completion: the generated token ids in the response's ``tokens``


def _object(body) -> dict:
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    return body


def _unknown(body: dict, known: set[str], where: str) -> None:
    bad = sorted(k for k in body if k not in known)
    if bad:
        raise RequestError(400, f"{where}: unsupported field(s) {', '.join(bad)} (edgespec refuses what it does "
                                "not implement)", bad[0])


def _extra(v) -> tuple[tuple[str, str], ...]:
    if v is None:
        return ()
    if not isinstance(v, list) or len(v) > MAX_EXTRA:
        raise RequestError(400, f"input_extra must be a list of at most {MAX_EXTRA} {{filename, text}} objects",
                           "input_extra")
    out = []
    for i, c in enumerate(v):
        if not isinstance(c, dict) or set(c) - {"filename", "text"}:
            raise RequestError(400, f"input_extra[{i}] must be an object with filename and text", "input_extra")
        name = text_field(c.get("filename", "tmp"), f"input_extra[{i}].filename")
        if "\n" in name:
            raise RequestError(400, f"input_extra[{i}].filename must be one line", "input_extra")
        out.append((name, text_field(c.get("text", ""), f"input_extra[{i}].text")))
    return tuple(out)


# llama.cpp's samplers that edgespec applies, in its own order (temperature, then top-k, then top-p)
SAMPLERS = ("temperature", "top_k", "top_p")


def _samplers(body: dict, fields: dict) -> None:
    """llama.cpp's ``samplers`` list: the samplers to apply. edgespec applies temperature, top-k and top-p in
    that order, so a list must name only those, in that order; one left out is off (no temperature: T = 1)."""
    v = body.get("samplers")
    if v is None:
        return
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise RequestError(400, "samplers must be a list of sampler names", "samplers")
    bad = [s for s in v if s not in SAMPLERS]
    if bad:
        raise RequestError(400, f"samplers: {bad[0]!r} is not implemented (edgespec samples the target's p with "
                                f"{', '.join(SAMPLERS)} only)", "samplers")
    if v != sorted(v, key=SAMPLERS.index) or len(set(v)) != len(v):
        raise RequestError(400, f"samplers: edgespec applies them once each, in the order {', '.join(SAMPLERS)}",
                           "samplers")
    if "temperature" not in v:
        if fields["temperature"] is not None and not is_one_of(fields["temperature"], 1.0):
            raise RequestError(400, "temperature is set but samplers leaves the temperature sampler out",
                               "samplers")
        fields["temperature"] = 1.0
    for name, off in (("top_k", 0), ("top_p", 1.0)):
        if name not in v:
            fields[name] = off


INFILL_FIELDS = {"input_prefix", "input_suffix", "input_extra", "prompt", "n_predict", "max_tokens", "temperature",
                 "top_k", "top_p", "seed", "stop", "stream", "cache_prompt", "n_indent", "t_max_predict_ms",
                 "t_max_prompt_ms", "samplers", "id_slot", "model", "return_tokens", "n_probs"}


def parse_infill(body, samplers: str = "refuse") -> FimRequest:
    """A llama.cpp ``POST /infill`` body → :class:`FimRequest`. Raises RequestError (400).

    ``samplers``: what to do with a request's ``samplers`` list: ``"refuse"`` one that names a sampler
    edgespec does not implement (llama.cpp's ``infill``, which llama.vscode and llama.vim ask for), or
    ``"server"``: replace the list by the server's own sampling settings (``edgespec serve --infill-samplers
    server``; the response's ``generation_settings.samplers_replaced`` says so).

    ``n_predict`` (or ``max_tokens``): -1 = as many as the context holds, 0 = only evaluate the prompt into
    the cache; ``seed`` -1 = random; ``id_slot`` must be -1 or 0 (one slot); ``return_tokens`` and
    ``n_probs`` only at their defaults (false, 0)."""
    body = _object(body)
    _unknown(body, INFILL_FIELDS, "/infill")
    n = aliased_int_field(body, "n_predict", "max_tokens", -1)
    if body.get("id_slot") is not None and not is_one_of(body["id_slot"], -1, 0):
        raise RequestError(400, "id_slot must be -1 or 0 (edgespec serves one slot)", "id_slot")
    if body.get("return_tokens") is not None and not is_one_of(body["return_tokens"], False):
        raise RequestError(400, "return_tokens is not implemented", "return_tokens")
    if body.get("n_probs") is not None and not is_one_of(body["n_probs"], 0):
        raise RequestError(400, "n_probs is not implemented", "n_probs")
    if not isinstance(body.get("model", ""), str):
        raise RequestError(400, "model must be a string", "model")
    seed = int_field(body, "seed", -1, MAX_SEED)
    fields = dict(temperature=float_field(body, "temperature", lambda v: 0 <= v <= 2, "in [0, 2]"),
                  top_p=float_field(body, "top_p", lambda v: 0 < v <= 1, "in (0, 1]"),
                  top_k=int_field(body, "top_k", 0))
    replaced = samplers == "server" and body.get("samplers") is not None
    if not replaced:
        _samplers(body, fields)
    fim = FimPrompt(prefix=text_field(body.get("input_prefix", ""), "input_prefix"),
                    suffix=text_field(body.get("input_suffix", ""), "input_suffix"),
                    extra=_extra(body.get("input_extra")), prompt=text_field(body.get("prompt", ""), "prompt"))
    cache_prompt = True if body.get("cache_prompt") is None else body["cache_prompt"]
    if not isinstance(cache_prompt, bool):
        raise RequestError(400, "cache_prompt must be a boolean", "cache_prompt")
    return FimRequest(fim=fim, max_tokens=n if n is not None and n > 0 else None, until_context=n == -1,
                      evaluate_only=n == 0, seed=None if seed in (None, -1) else seed,
                      stop=stop_field(body.get("stop")), stream=bool_field(body, "stream"), cache_prompt=cache_prompt,
                      n_indent=int_field(body, "n_indent", 0) or 0,
                      t_max_predict_ms=_ms(body, "t_max_predict_ms"), t_max_prompt_ms=_ms(body, "t_max_prompt_ms"),
                      samplers_replaced=replaced, **fields)


def _ms(body: dict, name: str) -> float:
    """A time limit in ms (at most 2**53, which a float holds exactly); -1, 0 or absent: off (0.0)."""
    v = int_field(body, name, -1, 2 ** 53)
    return float(v) if v is not None and v > 0 else 0.0


def completion_suffix(body) -> str | None:
    """The ``suffix`` of an OpenAI ``POST /v1/completions`` body (text after the insertion), or None."""
    if not isinstance(body, dict) or body.get("suffix") is None:
        return None
    return text_field(body["suffix"], "suffix")


OLLAMA_FIELDS = {"model", "prompt", "suffix", "options", "stream", "raw", "keep_alive", "system", "template",
                 "context", "images", "format", "think"}
def parse_ollama_generate(body) -> FimRequest:
    """An Ollama ``POST /api/generate`` body → :class:`FimRequest`. Raises RequestError (400).

    ``stream`` defaults to true (as Ollama); ``options`` may hold ``num_predict`` (-1: until the context is
    full), ``temperature``, ``top_k``, ``top_p``, ``seed``, ``stop``, ``num_ctx`` and the samplers edgespec lacks
    at their "off" value (:func:`~edgespec.apps.ollama_api.parse_options`); ``system``, ``template``,
    ``context``, ``images``, ``format`` and ``think`` are refused unless empty; ``keep_alive`` is accepted
    (the model stays loaded for the server's lifetime) unless 0, which asks to unload it."""
    body = _object(body)
    _unknown(body, OLLAMA_FIELDS, "/api/generate")
    model_field(body)
    for name in ("system", "template", "context", "images", "format", "think"):
        if body.get(name) is not None and not is_one_of(body[name], "", [], False):
            raise RequestError(400, f"{name} is not implemented", name)
    check_keep_alive(body)
    o = parse_options(body.get("options"))
    n = o.pop("num_predict")
    raw = bool_field(body, "raw")
    prompt = text_field(body.get("prompt", ""), "prompt")
    suffix = body.get("suffix")
    fim = None
    if suffix is not None:
        fim = FimPrompt(prefix=prompt, suffix=text_field(suffix, "suffix"))
    elif not prompt:
        raise RequestError(400, "prompt must not be empty (an empty prompt loads the model in Ollama; "
                                "edgespec's is always loaded)", "prompt")
    return FimRequest(fim=fim, prompt=None if fim else prompt, raw=raw,
                      max_tokens=n if n is not None and n > 0 else None, until_context=n is not None and n < 0,
                      evaluate_only=n == 0, stream=stream_field(body), **o)


# -- responses --------------------------------------------------------------------------------------------


def llama_timings(prompt_n: int, prompt_ms: float, predicted_n: int, predicted_ms: float) -> dict:
    """llama.cpp's ``timings``: prompt (uncached positions) and generation counts, ms and tokens/s."""
    def per(n, ms):
        return (ms / n if n else 0.0), (n / ms * 1e3 if ms > 0 else 0.0)

    p_tok, p_s = per(prompt_n, prompt_ms)
    g_tok, g_s = per(predicted_n, predicted_ms)
    return {"prompt_n": prompt_n, "prompt_ms": prompt_ms, "prompt_per_token_ms": p_tok, "prompt_per_second": p_s,
            "predicted_n": predicted_n, "predicted_ms": predicted_ms, "predicted_per_token_ms": g_tok,
            "predicted_per_second": g_s}


def infill_object(model: str, content: str, *, stop: bool, stop_type: str = "none", stopping_word: str = "",
                  prompt_tokens: int = 0, cached: int = 0, predicted: int = 0, timings: dict | None = None,
                  settings: dict | None = None, ext: dict | None = None) -> dict:
    """One ``/infill`` response, or one stream event (``stop`` False: a text piece; True: the last one, with
    the counts). ``stop_type``: ``eos``, ``limit``, ``word`` (``stopping_word``) or ``none``."""
    out = {"index": 0, "content": content, "id_slot": 0, "stop": stop, "model": model,
           "tokens_predicted": predicted, "tokens_evaluated": prompt_tokens}
    if stop:
        out.update({"stop_type": stop_type, "stopping_word": stopping_word, "tokens_cached": cached,
                    "truncated": False, "has_new_line": "\n" in content, "generation_settings": settings or {},
                    "timings": timings or {}})
        if ext is not None:
            out["edgespec"] = ext
    return out


def _now_iso() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


def ollama_chunk(model: str, text: str) -> dict:
    """One streamed ``/api/generate`` line before the end."""
    return {"model": model, "created_at": _now_iso(), "response": text, "done": False}


def ollama_done(model: str, text: str, done_reason: str, prompt_tokens: int, prompt_ms: float, eval_count: int,
                eval_ms: float, total_ms: float, ext: dict | None = None) -> dict:
    """The last (or only) ``/api/generate`` object: ``done_reason`` ``stop`` or ``length``; durations in ns."""
    out = {"model": model, "created_at": _now_iso(), "response": text, "done": True, "done_reason": done_reason,
           "total_duration": int(total_ms * 1e6), "load_duration": 0, "prompt_eval_count": prompt_tokens,
           "prompt_eval_duration": int(prompt_ms * 1e6), "eval_count": eval_count,
           "eval_duration": int(eval_ms * 1e6)}
    if ext is not None:
        out["edgespec"] = ext
    return out
