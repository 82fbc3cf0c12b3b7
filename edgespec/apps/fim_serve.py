"""The code-completion routes of ``edgespec serve``: ``POST /infill`` (llama.cpp), ``POST /api/generate`` and
``GET /api/tags`` (Ollama), and the FIM side of ``POST /v1/completions`` with ``suffix`` (OpenAI).

Each request becomes an :class:`~edgespec.apps.serve_job.Job` on the one engine, so it shares the queue, the KV
cache of earlier requests (an editor resends the whole file around the cursor on every keystroke: the common
prefix is not prefilled again) and the disconnect handling of the chat routes. FIM prompts are built by
:mod:`.fim` from the export's own FIM tokens; an export without them gets a 400. ``/infill`` with
``cache_prompt`` (llama.cpp's default, which its editor plug-ins send) also replaces the same client's
unfinished ``/infill`` request: it is cancelled with a 409, between two target runs.
"""

from __future__ import annotations

import asyncio
import json
import time

from .fim import DRAFT_WINDOW, FimPrompt, MiddleCutter, build_ids, draft_prompt_for, fim_tokens
from .fim_api import (completion_suffix, infill_object, llama_timings, ollama_chunk, ollama_done, parse_infill,
                      parse_ollama_generate)
from .openai_api import RequestError, extension_object
from .serve_job import Job, cancel_task, read_json, wait_disconnect
from ..core.stats import GenerationStats

__all__ = ["completion_suffix", "routes", "suffix_ids", "mark_fim", "draft_view", "evaluate_only", "start", "events",
           "llama_error", "llama_last"]


def _tokens(engine):
    """The export's FIM tokens. Raises RequestError (400) when its tokenizer has none."""
    t = fim_tokens(engine.decoder.tokenizer)
    if t is None:
        raise RequestError(400, "this model has no fill-in-the-middle tokens (<|fim_prefix|>, <|fim_suffix|>, "
                                "<|fim_middle|>) in its tokenizer; use a FIM model such as Qwen2.5-Coder",
                           code="fim_not_supported")
    return t


def fim_ids(engine, p: FimPrompt) -> list[int]:
    """Token ids of the FIM prompt ``p`` for the engine's export. Raises RequestError (400)."""
    d = engine.decoder
    return build_ids(d.tokenizer, lambda: d.plain_tokenizer, _tokens(engine), p)


def draft_view(engine, p: FimPrompt, job) -> None:
    """Let ``job``'s draft read the FIM prompt ``p`` cut to the code around the cursor
    (:func:`~edgespec.apps.fim.build_draft_ids`, ``engine.fim_draft_window`` tokens: ``serve --draft-window``)
    where the server has a draft model; the answer is the same either way, only the draft's catch-up is shorter."""
    window = getattr(engine, "fim_draft_window", DRAFT_WINDOW)
    ids = draft_prompt_for(engine.decoder, _tokens(engine), p, window, len(job.ids))
    if ids is not None:
        job.overrides["draft_prompt"] = ids


def suffix_ids(engine, req, suffix: str) -> list[int]:
    """``POST /v1/completions`` with ``suffix``: the FIM prompt of ``prompt`` (before) and ``suffix`` (after)."""
    if req.prompt is None:
        raise RequestError(400, "suffix needs a text prompt (the code before the insertion), not token ids",
                           "suffix")
    return fim_ids(engine, FimPrompt(prefix=req.prompt, suffix=suffix))


def mark_fim(engine, job) -> None:
    """Let ``job`` end where the middle ends (``<|fim_pad|>``, ``<|file_sep|>``, besides EOS)."""
    job.stop_ids = _tokens(engine).stop_ids


def evaluate_only(d, job, cached: int, queue_ms: float) -> str:
    """Worker side of ``n_predict`` 0: prefill the prompt into both caches, generate nothing."""
    t0 = time.perf_counter()
    d.cache_prefix(job.ids, job.overrides.get("draft_prompt"))
    ms = (time.perf_counter() - t0) * 1e3
    stats = GenerationStats(mode="plain", prompt_tokens=len(job.ids), prefill_ms=ms, wall_ms=ms,
                            stop_reason="max_new_tokens")
    job.post("done", "length", stats, cached, queue_ms)
    return "completed"


def _job(engine, req, ids: list[int], loop, client: str | None, stop_ids: frozenset):
    """The engine job of a FIM endpoint's request. Raises RequestError (400): the prompt or the answer does
    not fit the context (the server's, or the request's ``num_ctx``)."""
    ctx = engine.decoder.context_length if req.num_ctx is None else min(req.num_ctx, engine.decoder.context_length)
    n = len(ids)
    if n >= ctx:
        raise RequestError(400, f"the prompt is {n} tokens; the context holds {ctx}", "prompt",
                           "context_length_exceeded")
    if req.max_tokens is not None and n + req.max_tokens > ctx:
        raise RequestError(400, f"the prompt is {n} tokens and the answer may be {req.max_tokens}; the context "
                                f"holds {ctx}", "n_predict", "context_length_exceeded")
    room = ctx - n
    o = {"max_new_tokens": req.max_tokens if req.max_tokens is not None else
         room if req.until_context else min(engine.default_max_tokens, room)}
    for name in ("temperature", "top_p", "top_k", "seed"):
        if getattr(req, name) is not None:
            o[name] = getattr(req, name)
    cutter = MiddleCutter(req.stop, req.n_indent, req.t_max_predict_ms, req.t_max_prompt_ms)
    return Job(list(ids), o, req.stop, None, loop, stop_ids=stop_ids, matcher=cutter,
               evaluate_only=req.evaluate_only, cache_prompt=req.cache_prompt, client=client)


def _settings(engine, job) -> dict:
    """The sampling settings in force (llama.cpp's ``generation_settings``)."""
    from ..engine.generation import GenerationOptions

    o = GenerationOptions.with_fields(engine.gen_kwargs.get("options"), job.overrides)
    m = job.matcher
    return {"n_predict": 0 if job.evaluate_only else o.max_new_tokens, "temperature": o.temperature, "top_k": o.top_k, "top_p": o.top_p,
            "seed": -1 if o.seed is None else o.seed, "stop": list(job.stops), "n_indent": m.n_indent,
            "t_max_predict_ms": m.t_max_predict_ms, "t_max_prompt_ms": m.t_max_prompt_ms,
            "cache_prompt": job.cache_prompt, "n_ctx": engine.decoder.context_length, "model": engine.model,
            "speculative": bool(o.proposers), "samplers_replaced": getattr(job, "samplers_replaced", False)}


def _stop_type(job, finish: str, stats) -> str:
    if job.matcher.hit:
        return job.matcher.stop_type
    return "eos" if stats.stop_reason == "stop_token" else "limit"


async def events(job, request):
    """Yield the job's events until its end; a client that leaves cancels the job (then nothing more)."""
    watcher = asyncio.ensure_future(wait_disconnect(request))
    try:
        while True:
            getter = asyncio.ensure_future(job.events.get())
            done, _ = await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                cancel_task(getter)
                return
            ev = getter.result()
            yield ev
            if ev[0] != "text":
                return
    finally:
        job.cancel.set()
        cancel_task(watcher)


_LLAMA_TYPES = {404: "not_found_error", 501: "not_supported_error", 503: "unavailable_error"}


def llama_error(status: int, message: str) -> dict:
    """llama.cpp server's error object: ``{"error": {"code", "message", "type"}}``."""
    kind = _LLAMA_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"code": status, "message": message, "type": kind}}


async def start(engine, request, max_body_bytes: int, parse, build, replace: bool, prepare=None):
    """Read, parse (``parse``: body → FimRequest) and queue one request of a completion route; ``build``
    (FimRequest → token ids) and ``prepare`` (FimRequest, Job → None: more overrides, e.g. a grammar) run in a
    worker thread. Returns ``(req, job)``. Raises RequestError (4xx) and ClientDisconnect."""
    from starlette.concurrency import run_in_threadpool

    body = await read_json(request, max_body_bytes)
    req = parse(body)
    ids = await run_in_threadpool(build, req)
    stop_ids = _tokens(engine).stop_ids if req.fim is not None else frozenset()
    client = request.client.host if replace and req.cache_prompt and request.client else None
    job = _job(engine, req, ids, asyncio.get_running_loop(), client, stop_ids)
    job.samplers_replaced = req.samplers_replaced
    if req.fim is not None:
        await run_in_threadpool(draft_view, engine, req.fim, job)
    if prepare is not None:
        await run_in_threadpool(prepare, req, job)
    engine.submit(job)
    return req, job


def llama_last(engine, job, text: str, finish: str, stats, cached: int, queue_ms: float, **extra) -> dict:
    """The last object of an ``/infill`` or ``/completion`` answer (its whole text, or "" when streamed), with
    the counts, timings and settings; ``extra``: more keys (``tokens``, ``prompt``)."""
    out = infill_object(engine.model, text, stop=True, stop_type=_stop_type(job, finish, stats),
                        stopping_word=job.matcher.stopping_word, prompt_tokens=len(job.ids), cached=cached,
                        predicted=stats.new_tokens,
                        timings=llama_timings(len(job.ids) - cached, stats.prefill_ms, stats.new_tokens,
                                              max(0.0, stats.wall_ms - stats.prefill_ms)),
                        settings=_settings(engine, job), ext=extension_object(stats, queue_ms))
    out.update(extra)
    return out


def routes(engine, max_body_bytes: int) -> list:
    """The starlette routes: /infill, /api/generate."""
    from starlette.requests import ClientDisconnect
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    async def start_here(request, parse, build, replace: bool):
        return await start(engine, request, max_body_bytes, parse, build, replace)

    def infill_last(job, text: str, *done) -> dict:
        return llama_last(engine, job, text, *done)

    async def infill(request):
        try:
            req, job = await start_here(request, lambda b: parse_infill(b, getattr(engine, "infill_samplers", "refuse")),
                                   lambda r: fim_ids(engine, r.fim), replace=True)
        except RequestError as e:
            return JSONResponse(llama_error(e.status, e.message), status_code=e.status)
        except ClientDisconnect:
            return Response(status_code=499)
        if req.stream:
            async def sse():
                predicted = 0  # tokens generated so far (llama.cpp's per-chunk tokens_predicted)
                async for ev in events(job, request):
                    if ev[0] == "text":
                        predicted += len(ev[3])
                        if not ev[1]:
                            continue
                        obj = infill_object(engine.model, ev[1], stop=False, prompt_tokens=len(job.ids),
                                            predicted=predicted)
                    elif ev[0] == "error":
                        obj = llama_error(ev[1], ev[2])
                    else:
                        obj = infill_last(job, "", *ev[1:])
                    yield b"data: " + json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n\n"
            return StreamingResponse(sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        text = []
        async for ev in events(job, request):
            if ev[0] == "text":
                text.append(ev[1])
            elif ev[0] == "error":
                return JSONResponse(llama_error(ev[1], ev[2]), status_code=ev[1])
            else:
                return JSONResponse(infill_last(job, "".join(text), *ev[1:]))
        return Response(status_code=499)

    def ollama_ids(req) -> list[int]:
        if req.fim is not None:
            return fim_ids(engine, req.fim)
        try:
            if req.raw:
                return engine.decoder.encode(req.prompt)
            return engine.decoder.encode(messages=[{"role": "user", "content": req.prompt}])
        except ValueError as e:
            raise RequestError(400, str(e), "prompt") from None

    def ollama_last(job, text: str, finish: str, stats, cached: int, queue_ms: float) -> dict:
        return ollama_done(engine.model, text, "stop" if finish == "stop" else "length", len(job.ids),
                           stats.prefill_ms, stats.new_tokens, max(0.0, stats.wall_ms - stats.prefill_ms),
                           stats.wall_ms + queue_ms, extension_object(stats, queue_ms))

    async def generate(request):
        try:
            req, job = await start_here(request, parse_ollama_generate, ollama_ids, replace=False)
        except RequestError as e:
            return JSONResponse({"error": e.message}, status_code=e.status)
        except ClientDisconnect:
            return Response(status_code=499)
        if req.stream:
            async def lines():
                async for ev in events(job, request):
                    if ev[0] == "text":
                        if not ev[1]:
                            continue
                        obj = ollama_chunk(engine.model, ev[1])
                    elif ev[0] == "error":
                        obj = {"error": ev[2]}
                    else:
                        obj = ollama_last(job, "", *ev[1:])
                    yield json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n"
            return StreamingResponse(lines(), media_type="application/x-ndjson")
        text = []
        async for ev in events(job, request):
            if ev[0] == "text":
                text.append(ev[1])
            elif ev[0] == "error":
                return JSONResponse({"error": ev[2]}, status_code=ev[1])
            else:
                return JSONResponse(ollama_last(job, "".join(text), *ev[1:]))
        return Response(status_code=499)

    return [Route("/infill", infill, methods=["POST"]), Route("/api/generate", generate, methods=["POST"])]
