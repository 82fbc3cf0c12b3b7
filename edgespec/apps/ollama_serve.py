"""Ollama's chat and model routes of ``edgespec serve``: ``POST /api/chat``, ``POST /api/show``, ``GET /api/tags``,
``GET /api/ps``, ``GET /api/version``, and ``POST /api/embed``/``/api/embeddings`` refused (501: a generation
pair has no embedding model). ``/api/generate`` is in :mod:`.fim_serve`.

A chat runs as the OpenAI chat route's request (:func:`~edgespec.apps.ollama_api.parse_chat`): the same chat
template and tools block (:func:`~edgespec.apps.serve_fields.encode_request`), the same job on the one engine
(queue, KV reuse across requests, speculative decoding, constraints) and the same tool-call parser
(:class:`~edgespec.apps.serve_output.Choice`), so a streamed answer equals the whole one. Errors are Ollama's
``{"error": "text"}``; streamed lines are NDJSON.
"""

from __future__ import annotations

import asyncio
import json

from .fim import fim_tokens
from .fim_serve import events
from .ollama_api import (OLLAMA_API_VERSION, ModelCard, chat_chunk, chat_done, done_fields, now_iso, ollama_calls,
                         parse_chat, parse_show, ps_object, show_object, tags_object)
from .openai_api import extension_object
from .request_error import RequestError
from .serve_fields import encode_request, job_for
from .serve_job import read_json
from .serve_output import Choice
from .tools import template_renders_tools


def model_card(engine) -> ModelCard:
    """What the Ollama routes say about the engine's model (read from its export once, then kept)."""
    card = getattr(engine, "_ollama_card", None)
    if card is not None:
        return card
    d = engine.decoder
    m = d.manifest
    root = d.target.export_dir
    manifest = root / "edgespec.json"
    template = d.template.source if d.template is not None else ""
    caps = ["completion"] + (["tools"] if template_renders_tools(template) else []) + \
        (["insert"] if fim_tokens(d.tokenizer) is not None else [])
    stop = tuple(t for t in (d.tokenizer.id_to_token(int(i)) for i in sorted(d.stop_ids)) if t)
    card = ModelCard(
        name=engine.model, size=sum(f.size for f in m.files.values()) if m is not None else 0,
        digest=f"sha256:{m.target.source_sha256}" if m is not None else "",
        family=m.target.architecture if m is not None else "",
        quantization=m.target.quantization.precision if m is not None else "",
        modified=manifest.stat().st_mtime if manifest.is_file() else 0.0, context_length=d.context_length,
        template=template, stop=stop, capabilities=tuple(caps), path=str(root))
    engine._ollama_card = card
    return card


def _line(obj: dict) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n"


def _chunks(model: str, choice: Choice, deltas: list[dict]) -> list[dict]:
    """:class:`Choice` deltas → streamed ``/api/chat`` objects: text pieces, and each tool call whole once
    parsed (its name and arguments come in one OpenAI delta pair; the first carries the index)."""
    out = []
    for d in deltas:
        calls = d.get("tool_calls")
        if calls and "id" in calls[0]:
            i = calls[0]["index"]
            out.append(chat_chunk(model, "", ollama_calls(choice.tool_calls[i:i + 1], start=i)))
        elif not calls and d.get("text"):
            out.append(chat_chunk(model, d["text"]))
    return out


def routes(engine, max_body_bytes: int) -> list:
    """The starlette routes of this module."""
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import ClientDisconnect
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    model = engine.model

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    def last(job, content: str, calls, finish: str, stats, cached: int, queue_ms: float) -> dict:
        fields = done_fields("stop" if finish == "stop" else "length", len(job.ids), stats.prefill_ms,
                             stats.new_tokens, max(0.0, stats.wall_ms - stats.prefill_ms), stats.wall_ms + queue_ms)
        return chat_done(model, content, calls, fields, extension_object(stats, queue_ms))

    async def chat(request):
        try:
            c = parse_chat(await read_json(request, max_body_bytes))
            if c.load_only:  # Ollama loads the model; this one is loaded
                return JSONResponse({"model": model, "created_at": now_iso(),
                                     "message": {"role": "assistant", "content": ""}, "done_reason": "load",
                                     "done": True})
            ids = await run_in_threadpool(encode_request, engine.decoder, c.request)
            job = job_for(engine, c.request, ids, asyncio.get_running_loop(), c.num_ctx, c.until_context)
            job.evaluate_only = c.evaluate_only
            engine.submit(job)
        except RequestError as e:
            return error(e.status, e.message)
        except ClientDisconnect:
            return Response(status_code=499)
        choice = Choice(True, c.request.extras, engine.decoder.tokenizer)
        if c.stream:
            async def lines():
                async for ev in events(job, request):
                    if ev[0] == "text":
                        for obj in _chunks(model, choice, choice.push(ev[1])):
                            yield _line(obj)
                    elif ev[0] == "error":
                        yield _line({"error": ev[2]})
                    else:
                        for obj in _chunks(model, choice, choice.flush()):
                            yield _line(obj)
                        yield _line(last(job, "", None, *ev[1:]))
            return StreamingResponse(lines(), media_type="application/x-ndjson")
        async for ev in events(job, request):
            if ev[0] == "text":
                choice.push(ev[1])
            elif ev[0] == "error":
                return error(ev[1], ev[2])
            else:
                choice.flush()
                return JSONResponse(last(job, choice.text, ollama_calls(choice.tool_calls) or None, *ev[1:]))
        return Response(status_code=499)

    async def show(request):
        try:
            parse_show(await read_json(request, max_body_bytes))
        except RequestError as e:
            return error(e.status, e.message)
        except ClientDisconnect:
            return Response(status_code=499)
        return JSONResponse(show_object(await run_in_threadpool(model_card, engine)))

    async def tags(request):
        return JSONResponse(tags_object(await run_in_threadpool(model_card, engine)))

    async def ps(request):
        return JSONResponse(ps_object(await run_in_threadpool(model_card, engine)))

    async def version(request):
        return JSONResponse({"version": OLLAMA_API_VERSION})

    async def embed(request):
        return error(501, f"embeddings are not implemented: {model} is a generation model pair (edgespec serves "
                          "no embedding model)")

    return [Route("/api/chat", chat, methods=["POST"]), Route("/api/show", show, methods=["POST"]),
            Route("/api/tags", tags, methods=["GET"]), Route("/api/ps", ps, methods=["GET"]),
            Route("/api/version", version, methods=["GET"]), Route("/api/embed", embed, methods=["POST"]),
            Route("/api/embeddings", embed, methods=["POST"])]
