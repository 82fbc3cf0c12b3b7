"""What :mod:`.serve` and :mod:`.fim_serve` share: the :class:`Job` the worker thread runs, and two HTTP helpers
(the JSON body within a size limit, a client's disconnect)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field

from .request_error import RequestError


@dataclass
class Job:
    """One queued generation. The worker thread posts ``(kind, ...)`` events to ``events`` on ``loop``:
    ``("text", str, [TokenLogprob], [int])``: a piece of text, the logprobs of the tokens that made it (empty
    unless ``logprobs``) and their ids (tokens whose text is held back ride on a later piece), then
    ``("done", finish_reason, stats, cached_tokens, queue_ms)`` or ``("error", status, message)``. ``echo``:
    text sent first (the prompt, for completions' ``echo``; no token ids).

    Completion jobs (:mod:`.fim_serve`) also set ``stop_ids`` (tokens that end this generation besides the
    export's stop tokens), ``matcher`` (a :class:`~edgespec.apps.fim.MiddleCutter` in place of the stop-string
    matcher), ``evaluate_only`` (cache the prompt, generate nothing), ``cache_prompt`` (False: no KV reuse) and
    ``client`` (a newer job of the same client replaces this one: it is cancelled with a 409)."""

    ids: list[int]
    overrides: dict
    stops: tuple[str, ...]
    budget_ms: float | None
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    enqueued: float = field(default_factory=time.perf_counter)
    stop_ids: frozenset = frozenset()
    matcher: object = None
    evaluate_only: bool = False
    cache_prompt: bool = True
    client: str | None = None
    superseded: bool = False
    logprobs: bool = False
    echo: str = ""

    def post(self, *event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop has closed (server shutting down): nobody is listening
            self.cancel.set()


async def read_json(request, limit: int):
    """The request body as JSON. Raises RequestError: 413 over ``limit`` bytes, 400 if not JSON."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"the request body is over {limit} bytes", code="request_too_large")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise RequestError(413, f"the request body is over {limit} bytes", code="request_too_large")
    try:
        return json.loads(bytes(body))
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise RequestError(400, f"the request body is not valid JSON ({str(e)[:80]})") from None


_CANCELLED: set = set()  # cancelled tasks, held until they finish: the loop keeps only weak references


def cancel_task(task: "asyncio.Future") -> None:
    """Cancel ``task`` and hold it until it has finished, so that it is never garbage-collected while still
    pending (asyncio logs "Task was destroyed but it is pending!" for those)."""
    if task.done():
        return
    task.cancel()
    _CANCELLED.add(task)
    task.add_done_callback(_CANCELLED.discard)


async def wait_disconnect(request) -> None:
    """Returns when the client of ``request`` (a starlette request) disconnects."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
