"""llama.cpp's server routes of ``edgespec serve`` beyond ``/infill`` (:mod:`.fim_serve`): ``POST /completion``
(and its alias ``/completions``), ``POST /tokenize``, ``POST /detokenize``, ``GET /props``.

``/completion`` is ``/infill`` without the FIM prompt: the same job builder (stop words, ``n_indent``, time
limits, ``n_predict`` 0 = cache the prompt only), the same engine (queue, KV reuse with ``cache_prompt``,
speculative decoding), plus a ``grammar`` (GBNF or Lark) or ``json_schema`` constraint and ``return_tokens``.
Streams are server-sent events whose every chunk counts the tokens generated so far (``tokens_predicted``) and
carries their ids (``tokens``). Errors are llama.cpp's ``{"error": {"code", "message", "type"}}``.
"""

from __future__ import annotations

import json

from .fim_api import infill_object
from .fim_serve import events, llama_error, llama_last, start
from .llama_api import parse_completion, parse_detokenize, parse_tokenize, piece, props_object
from .openai_fields import token_piece
from .request_error import RequestError

PROPS_READ_ONLY = "this server does not support changing global properties (llama.cpp's --props)"


def completion_ids(decoder, req) -> list[int]:
    """The prompt of a ``/completion`` request as token ids: its text encoded as a raw prompt (control-token
    text is markup, as llama.cpp's ``parse_special``), or its parts joined (strings encoded, ids as given; a first
    part that is a string gets the tokenizer's ``<bos>`` as a raw prompt does, as llama.cpp's). Raises
    RequestError (400)."""
    try:
        if req.prompt is not None:
            return decoder.encode(req.prompt)
        ids: list[int] = []
        for i, p in enumerate(req.prompt_parts):
            ids += decoder.tokenizer.encode(p, add_special_tokens=i == 0).ids if isinstance(p, str) else list(p)
    except ValueError as e:
        raise RequestError(400, str(e), "prompt") from None
    if not ids:
        raise RequestError(400, "the prompt is empty", "prompt")
    return ids


def constrain(req, job) -> None:
    """Add the request's ``grammar`` or ``json_schema`` to ``job`` as a constraint. Raises RequestError (400):
    a grammar or schema llguidance refuses (or llguidance is missing)."""
    if req.grammar is None:
        return
    from ..core.constrain import Constraint
    from ..core.processors import Processing

    kind, value = req.grammar
    param = "json_schema" if kind == "json_schema" else "grammar"
    try:
        if kind == "json_schema":
            c = Constraint.json_schema(value)
        else:
            from llguidance.gbnf_to_lark import any_to_lark

            try:
                lark = any_to_lark(value)
            except Exception as e:  # GbnfToLarkError and kin: the client's grammar does not parse
                raise ValueError(f"invalid GBNF grammar: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
            c = Constraint.lark(lark)
    except ImportError:
        raise RequestError(400, "grammars need the llguidance package (pip install llguidance)", param) from None
    except (ValueError, RuntimeError) as e:
        raise RequestError(400, f"{param}: {str(e)[:300]}", param) from None
    job.overrides["processing"] = Processing(constraint=c)


def default_settings(engine) -> dict:
    """The settings a ``/completion`` without sampling fields runs with (llama.cpp's ``params``)."""
    from ..engine.generation import GenerationOptions

    o = GenerationOptions.with_fields(engine.gen_kwargs.get("options"), {})
    return {"n_predict": engine.default_max_tokens, "temperature": o.temperature, "top_k": o.top_k,
            "top_p": o.top_p, "seed": -1 if o.seed is None else o.seed, "stop": [], "n_indent": 0,
            "t_max_predict_ms": 0.0, "t_max_prompt_ms": 0.0, "cache_prompt": True,
            "n_ctx": engine.decoder.context_length, "model": engine.model, "speculative": bool(o.proposers),
            "samplers": ["top_k", "top_p", "temperature"], "stream": False, "n_probs": 0, "grammar": ""}


def routes(engine, max_body_bytes: int) -> list:
    """The starlette routes of this module."""
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import ClientDisconnect
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    d = engine.decoder

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse(llama_error(status, message), status_code=status)

    def sse(obj: dict) -> bytes:
        return b"data: " + json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n\n"

    async def completion(request):
        try:
            req, job = await start(engine, request, max_body_bytes, lambda b: parse_completion(b, d.n_tokens),
                                   lambda r: completion_ids(d, r), replace=False, prepare=constrain)
        except RequestError as e:
            return error(e.status, e.message)
        except ClientDisconnect:
            return Response(status_code=499)
        if req.stream:
            async def chunks():
                predicted = 0
                async for ev in events(job, request):
                    if ev[0] == "text":
                        predicted += len(ev[3])
                        if not ev[1]:
                            continue
                        obj = infill_object(engine.model, ev[1], stop=False, prompt_tokens=len(job.ids),
                                            predicted=predicted)
                        obj["tokens"] = list(ev[3])
                    elif ev[0] == "error":
                        obj = llama_error(ev[1], ev[2])
                    else:
                        obj = llama_last(engine, job, "", *ev[1:], tokens=[])
                    yield sse(obj)
            return StreamingResponse(chunks(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        text, ids = [], []
        async for ev in events(job, request):
            if ev[0] == "text":
                text.append(ev[1])
                ids += ev[3]
            elif ev[0] == "error":
                return error(ev[1], ev[2])
            else:
                prompt = await run_in_threadpool(d.tokenizer.decode, job.ids, skip_special_tokens=False)
                return JSONResponse(llama_last(engine, job, "".join(text), *ev[1:],
                                               tokens=ids if req.return_tokens else [], prompt=prompt))
        return Response(status_code=499)

    def tokenize_body(body) -> dict:
        content, add_special, parse_special, with_pieces = parse_tokenize(body)
        tok = d.tokenizer if parse_special else d.plain_tokenizer
        ids = tok.encode(content, add_special_tokens=add_special).ids if content else []
        if not with_pieces:
            return {"tokens": ids}
        return {"tokens": [{"id": t, "piece": piece(*token_piece(d.tokenizer, t))} for t in ids]}

    async def tokenize(request):
        try:
            return JSONResponse(await run_in_threadpool(tokenize_body, await read_body(request)))
        except RequestError as e:
            return error(e.status, e.message)
        except ClientDisconnect:
            return Response(status_code=499)

    async def detokenize(request):
        try:
            ids = parse_detokenize(await read_body(request), d.n_tokens)
            return JSONResponse({"content": await run_in_threadpool(d.tokenizer.decode, ids,
                                                                    skip_special_tokens=False)})
        except RequestError as e:
            return error(e.status, e.message)
        except ClientDisconnect:
            return Response(status_code=499)

    async def read_body(request):
        from .serve_job import read_json

        return await read_json(request, max_body_bytes)

    async def props(request):
        if request.method == "POST":
            return error(501, PROPS_READ_ONLY)
        from importlib.metadata import PackageNotFoundError, version

        try:
            own = version("edgespec")
        except PackageNotFoundError:  # a checkout that was never installed
            own = ""

        def token(i):
            return d.tokenizer.id_to_token(int(i)) if i is not None else ""

        m = d.manifest
        special = m.special_tokens if m is not None else None
        return JSONResponse(props_object(
            default_settings(engine), d.context_length, str(d.target.export_dir),
            d.template.source if d.template is not None else "", f"edgespec {own}",
            engine.health()["running"], token(getattr(special, "bos", None)) or "",
            token(getattr(special, "eos", None)) or ""))

    return [Route("/completion", completion, methods=["POST"]), Route("/completions", completion, methods=["POST"]),
            Route("/tokenize", tokenize, methods=["POST"]), Route("/detokenize", detokenize, methods=["POST"]),
            Route("/props", props, methods=["GET", "POST"])]

