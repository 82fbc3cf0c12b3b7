"""``edgespec serve``: an OpenAI-compatible HTTP server (starlette + uvicorn, the ``edgespec[serve]`` extra).

One model pair per process and one generation at a time: a single worker thread owns the
:class:`~edgespec.engine.decoder.SpecDecoder`, requests wait in a bounded queue (429 when it is full), and the
decoder's committed tokens carry over between requests, so a client that resends a growing conversation
reuses the KV cache of the common prefix. A client that disconnects cancels its generation (between two
target runs) or its place in the queue. Bad input is a 4xx in the error shape of the API it was sent to. The
same engine serves Ollama's (:mod:`.ollama_serve`, :mod:`.fim_serve`) and llama.cpp's (:mod:`.llama_serve`,
:mod:`.fim_serve`) routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import sys
import threading
import time

from .openai_api import (Request, RequestError, StopMatcher, chunk_object, error_object, extension_object,
                         new_id, parse_chat, parse_completion, response_object, usage_object)
from .serve_fields import _policy, encode_request, job_for
from .serve_job import Job, cancel_task, read_json, wait_disconnect
from .serve_output import Choice

MAX_BODY_BYTES = 4 << 20


class Engine:
    """The decoder behind a bounded queue, driven by one worker thread.

    ``max_queue``: requests that may wait while one runs (more get 429). ``gen_kwargs``: the server's
    keyword arguments of :meth:`SpecDecoder.generate` (K policy, proposers, default sampling); a request's
    own fields override them.
    """

    def __init__(self, decoder, gen_kwargs: dict, max_queue: int = 8, default_max_tokens: int = 512):
        self.decoder, self.gen_kwargs = decoder, gen_kwargs
        self.default_max_tokens = default_max_tokens
        self.max_queue = max_queue
        self.jobs: queue.Queue = queue.Queue()
        self.waiting = 0  # jobs queued, not yet started
        self.running = False
        self.counts = {"completed": 0, "cancelled": 0, "rejected": 0, "failed": 0}
        self._lock = threading.Lock()
        self._latest: dict[str, Job] = {}  # client → its newest replaceable job
        self.model = decoder.manifest.name if decoder.manifest else "edgespec"
        self._thread = threading.Thread(target=self._work, name="edgespec-generate", daemon=True)
        self._thread.start()

    # -- called from the event loop ----------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Queue ``job``. Raises RequestError(429) when ``max_queue`` jobs already wait behind a running one."""
        with self._lock:
            # one job runs and max_queue wait; a job not yet taken by an idle worker is about to run, so it
            # does not count as waiting (a burst of max_queue + 1 requests on an idle server is all served)
            if self.waiting >= self.max_queue + (0 if self.running else 1):
                self.counts["rejected"] += 1
                raise RequestError(429, f"the server is busy ({self.waiting} requests waiting); retry later",
                                   code="rate_limit_exceeded", kind="rate_limit_error")
            self.waiting += 1
            if job.client is not None:  # a newer completion from the same client replaces its unfinished one
                old = self._latest.get(job.client)
                if old is not None and not old.cancel.is_set():
                    old.superseded = True
                    old.cancel.set()
                self._latest[job.client] = job
        self.jobs.put(job)

    def health(self) -> dict:
        with self._lock:
            return {"status": "ok", "model": self.model, "running": self.running, "waiting": self.waiting,
                    "max_queue": self.max_queue, "context_length": self.decoder.context_length, **self.counts}

    def stop(self) -> None:
        self.jobs.put(None)

    # -- the worker thread --------------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            with self._lock:
                self.waiting -= 1
                self.running = not job.cancel.is_set()
                if not self.running:  # its client left (or replaced it) while it waited
                    self.counts["cancelled"] += 1
                    _post_superseded(job)
                    continue
            try:
                outcome = self._generate(job)
            except ValueError as e:  # arguments the decoder refuses: the client's fault
                outcome = "failed"
                job.post("error", 400, str(e))
            except Exception as e:  # a runtime failure: reported, and the server keeps serving
                outcome = "failed"
                print(f"edgespec serve: generation failed: {type(e).__name__}: {e}", file=sys.stderr)
                job.post("error", 500, f"generation failed: {type(e).__name__}")
            with self._lock:
                self.running = False
                self.counts[outcome] += 1
                if job.client is not None and self._latest.get(job.client) is job:
                    del self._latest[job.client]

    def _generate(self, job: Job) -> str:
        d = self.decoder
        queue_ms = (time.perf_counter() - job.enqueued) * 1e3
        if not job.cache_prompt:
            d.reset()
        cached = d.cached_tokens(job.ids)
        if job.evaluate_only:
            from .fim_serve import evaluate_only

            return evaluate_only(d, job, cached, queue_ms)
        policy = _policy(self.gen_kwargs)
        budget = policy.budget(job.budget_ms) if policy is not None else contextlib.nullcontext()
        stop_ids = d.stop_ids
        d.stop_ids = stop_ids | job.stop_ids  # this job's own end tokens (a FIM middle ends at <|file_sep|>)
        try:
            with budget:  # this request's budget (None: the server's); the controller's learning carries over
                g = d.generate(input_ids=job.ids, **{**self.gen_kwargs, **job.overrides})
                return self._stream(job, g, cached, queue_ms)
        finally:
            d.stop_ids = stop_ids

    def _stream(self, job: Job, g, cached: int, queue_ms: float) -> str:
        matcher, finish = job.matcher or StopMatcher(job.stops), None
        if hasattr(matcher, "start"):
            matcher.start()
        chunks = g.chunks()
        sent = 0  # tokens posted: their ids (and with job.logprobs their logprobs) ride on the text they made
        if job.echo:
            job.post("text", job.echo, (), [])
        try:
            for piece, _ in chunks:
                if job.cancel.is_set():
                    _post_superseded(job)
                    return "cancelled"
                out = matcher.push(piece)
                if out or job.logprobs:
                    n = len(g.token_ids)
                    job.post("text", out, g.stats.token_logprobs[sent:n] if job.logprobs else (), g.token_ids[sent:n])
                    sent = n
                if matcher.hit:
                    finish = "stop"
                    break
        finally:
            chunks.close()
        if finish is None:
            tail = matcher.flush()
            if tail:
                job.post("text", tail, (), g.token_ids[sent:])
            finish = "stop" if g.stats.stop_reason == "stop_token" else "length"
        job.post("done", finish, g.stats, cached, queue_ms)
        return "completed"


def _post_superseded(job: Job) -> None:
    if job.superseded:  # its client is still waiting for an answer
        job.post("error", 409, "cancelled: a newer completion request from the same client replaced it")


# -- HTTP ----------------------------------------------------------------------------------------------


LLAMA_PATHS = ("/infill", "/completion", "/completions", "/tokenize", "/detokenize", "/props")


def error_body(path: str, status: int, message: str) -> dict:
    """An error in the shape of the API that ``path`` belongs to: Ollama's ``{"error": "text"}`` under /api/,
    llama.cpp's ``{"error": {"code", "message", "type"}}`` on its routes, else OpenAI's error object."""
    if path.startswith("/api/"):
        return {"error": message}
    if path.rstrip("/") in LLAMA_PATHS:
        from .fim_serve import llama_error

        return llama_error(status, message)
    return error_object(message, "invalid_request_error" if status < 500 else "server_error")


def build_app(engine: Engine, max_body_bytes: int = MAX_BODY_BYTES):
    """The starlette application: /v1/chat/completions, /v1/completions (``suffix``: fill in the middle),
    /v1/models, /health, the code-completion routes of :mod:`.fim_serve` (/infill, /api/generate), Ollama's chat
    and model routes (:mod:`.ollama_serve`) and llama.cpp's (:mod:`.llama_serve`). Unknown paths and methods
    are answered in the shape of the API the path belongs to (:func:`error_body`)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import ClientDisconnect
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    from . import fim_serve, llama_serve, ollama_serve

    def error(e: RequestError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    async def http_error(request, exc: HTTPException):
        return JSONResponse(error_body(request.url.path, exc.status_code, str(exc.detail)),
                            status_code=exc.status_code)

    async def server_error(request, exc: Exception):
        print(f"edgespec serve: {type(exc).__name__}: {exc}", file=sys.stderr)
        return JSONResponse(error_body(request.url.path, 500, "internal error"), status_code=500)

    def encode(req: Request) -> list[int]:
        return encode_request(engine.decoder, req)

    async def complete(request, chat: bool):
        try:
            body = await read_json(request, max_body_bytes)
            req = parse_chat(body) if chat else parse_completion(body, engine.decoder.n_tokens)
            suffix = None if chat else fim_serve.completion_suffix(body)
            if suffix is None:
                ids = await run_in_threadpool(encode, req)
            else:  # OpenAI's insert mode: the prompt is the code before, the suffix the code after
                ids = await run_in_threadpool(fim_serve.suffix_ids, engine, req, suffix)
            job = job_for(engine, req, ids, asyncio.get_running_loop())
            if suffix is not None:
                fim_serve.mark_fim(engine, job)
                await run_in_threadpool(fim_serve.draft_view, engine,
                                        fim_serve.FimPrompt(prefix=req.prompt, suffix=suffix), job)
            engine.submit(job)
        except RequestError as e:
            return error(e)
        except ClientDisconnect:  # left while sending its request: nobody to answer
            return Response(status_code=499)
        rid = new_id("chatcmpl" if chat else "cmpl")
        if req.stream:
            return StreamingResponse(_sse(job, request, chat, rid, engine.model, req.include_usage,
                                          Choice(chat, req.extras, engine.decoder.tokenizer)),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        watcher = asyncio.ensure_future(wait_disconnect(request))
        choice = Choice(chat, req.extras, engine.decoder.tokenizer)
        try:
            while True:
                getter = asyncio.ensure_future(job.events.get())
                done, _ = await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:  # the client left: free the worker
                    cancel_task(getter)
                    return Response(status_code=499)
                ev = getter.result()
                if ev[0] == "text":
                    choice.push(ev[1], ev[2] if len(ev) > 2 else ())
                elif ev[0] == "error":
                    return JSONResponse(error_object(ev[2], "invalid_request_error" if ev[1] < 500 else "server_error"),
                                        status_code=ev[1])
                else:
                    _, finish, stats, cached, queue_ms = ev
                    choice.flush()
                    return JSONResponse(response_object(chat, rid, engine.model, choice.text,
                                                        choice.finish_reason(finish),
                                                        usage_object(len(job.ids), stats.new_tokens, cached),
                                                        _extension(stats, queue_ms, choice), choice.tool_calls,
                                                        choice.logprobs()))
        finally:
            job.cancel.set()
            cancel_task(watcher)

    async def chat_completions(request):
        return await complete(request, chat=True)

    async def completions(request):
        return await complete(request, chat=False)

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": engine.model, "object": "model", "created": 0,
                                                         "owned_by": "edgespec"}]})

    async def health(request):
        return JSONResponse(engine.health())

    routes = [Route("/v1/chat/completions", chat_completions, methods=["POST"]),
              Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/models", models, methods=["GET"]),
              Route("/health", health, methods=["GET"]), *fim_serve.routes(engine, max_body_bytes),
              *ollama_serve.routes(engine, max_body_bytes), *llama_serve.routes(engine, max_body_bytes)]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: server_error})


def _sse_line(obj) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n\n"


def _extension(stats, queue_ms: float, choice: Choice) -> dict:
    ext = extension_object(stats, queue_ms)
    if choice.invalid_tool_calls:  # <tool_call> blocks that did not parse: left in the content as text
        ext["invalid_tool_calls"] = choice.invalid_tool_calls
    return ext


async def _sse(job: Job, request, chat: bool, rid: str, model: str, include_usage: bool, choice: Choice):
    """Server-sent events: text deltas (and tool-call deltas, through ``choice``), a closing chunk
    (finish_reason and the ``edgespec`` figures), the usage chunk if asked for, then ``data: [DONE]``. Leaving
    early (client gone) cancels the job."""
    watcher = asyncio.ensure_future(wait_disconnect(request))
    watcher.add_done_callback(lambda _: job.cancel.set())
    try:
        if chat:
            yield _sse_line(chunk_object(chat, rid, model, None, first=True))
        while True:
            ev = await job.events.get()
            if ev[0] == "text":
                for d in choice.push(ev[1], ev[2] if len(ev) > 2 else ()):
                    yield _sse_line(chunk_object(chat, rid, model, **d))
            elif ev[0] == "error":
                yield _sse_line(error_object(ev[2], "server_error" if ev[1] >= 500 else "invalid_request_error"))
                break
            else:
                _, finish, stats, cached, queue_ms = ev
                for d in choice.flush():
                    yield _sse_line(chunk_object(chat, rid, model, **d))
                last = chunk_object(chat, rid, model, None, choice.finish_reason(finish))
                last["edgespec"] = _extension(stats, queue_ms, choice)
                yield _sse_line(last)
                if include_usage:
                    u = chunk_object(chat, rid, model, None)
                    u["choices"], u["usage"] = [], usage_object(len(job.ids), stats.new_tokens, cached)
                    yield _sse_line(u)
                break
        yield b"data: [DONE]\n\n"
    finally:
        job.cancel.set()
        cancel_task(watcher)


def listen(host: str, port: int):
    """A bound, listening TCP socket. Raises EdgespecError (one line) if the address cannot be had."""
    import socket

    from ..errors import EdgespecError

    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise EdgespecError(f"cannot listen on {host}:{port}: {e}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise EdgespecError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def serve(engine: Engine, sock, max_body_bytes: int = MAX_BODY_BYTES) -> int:
    """Run the server on the listening socket ``sock`` (from :func:`listen`) until SIGINT/SIGTERM. Returns the
    exit code."""
    import uvicorn

    host, port = sock.getsockname()[:2]
    if host not in ("127.0.0.1", "::1"):
        print(f"edgespec serve: listening on {host}, not only loopback: anyone who reaches this port can use "
              "the model", file=sys.stderr)
    print(f"edgespec serve: {engine.model} on http://{host}:{port}/v1 (context {engine.decoder.context_length}, "
          f"queue {engine.max_queue})", file=sys.stderr, flush=True)
    config = uvicorn.Config(build_app(engine, max_body_bytes), log_level="warning", access_log=False,
                            timeout_graceful_shutdown=2)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        engine.stop()
        sock.close()
    return 0
