"""What a request's tools, response format, logprobs and penalties ask of the decoder (``edgespec serve``).

:func:`encode_request` renders chat messages with their tools through the export's chat template;
:func:`generation_overrides` turns :class:`~edgespec.apps.openai_fields.Extras` into ``GenerationOptions`` fields:
a :class:`~edgespec.core.processors.Processing` (penalties, logit bias, the grammar of a ``response_format`` or a
required tool call) and ``logprobs``. Both raise RequestError (400) for what the export or the request cannot do.
"""

from __future__ import annotations

from ..core.constrain import TOOL_OPEN, Constraint
from .openai_api import Request, RequestError
from .serve_job import Job
from ..core.processors import Processing
from .tools import TOOL_CLOSE, template_messages, template_renders_tools


def encode_request(decoder, req: Request) -> list[int]:
    """The prompt's token ids. Raises RequestError (400): a template refusal, an empty prompt, or tools for an
    export whose chat template does not render them."""
    if req.prompt_ids is not None:
        return list(req.prompt_ids)
    x = req.extras
    try:
        if req.messages is not None:
            tools = list(x.tools) if x is not None and x.tools is not None else None
            if tools and not template_renders_tools(decoder.template.source if decoder.template else ""):
                raise RequestError(400, "this export's chat template does not render tools (it has no <tool_call> "
                                        "format)", "tools")
            return decoder.encode(messages=template_messages(req.messages), tools=tools)
        return decoder.encode(req.prompt)
    except ValueError as e:  # template refusal, empty prompt
        raise RequestError(400, str(e), "messages" if req.messages is not None else "prompt") from None


def _single_token(decoder, text: str) -> int | None:
    t = decoder.tokenizer.token_to_id(text)
    return t if t is not None and decoder.tokenizer.encode(text, add_special_tokens=False).ids == [t] else None


def _constraint(decoder, x) -> Constraint | None:
    try:
        if x.constrained_tools:
            tools = [t for t in x.tools if x.tool_choice == "required" or t["function"]["name"] == x.tool_name]
            single = all(_single_token(decoder, s) is not None for s in (TOOL_OPEN, TOOL_CLOSE))
            return Constraint.tool_calls(tools, x.parallel_tool_calls, single)
        if x.response_format == "json_object":
            return Constraint.json_object()
        if x.response_format == "json_schema":
            return Constraint.json_schema(x.schema)
    except ValueError as e:
        raise RequestError(400, str(e), "tools" if x.constrained_tools else "response_format") from None
    return None


def generation_overrides(decoder, x) -> dict:
    """``GenerationOptions`` fields for the request's extras (empty when it asks for none)."""
    if x is None:
        return {}
    bias = dict(x.logit_bias)
    for t in bias:
        if t >= decoder.width:
            raise RequestError(400, f"logit_bias: {t} is not a token id (ids are 0..{decoder.width - 1})",
                               "logit_bias")
    if x.tools is not None and x.tool_choice == "none":  # the model may not open a call
        t = _single_token(decoder, TOOL_OPEN)
        if t is not None:
            bias[t] = -100.0
    p = Processing(x.presence_penalty, x.frequency_penalty, x.repetition_penalty, tuple(bias.items()),
                   _constraint(decoder, x))
    out = {"processing": p} if p.active else {}
    if x.logprobs is not None:
        out["logprobs"] = x.logprobs
    return out


def job_for(engine, req: Request, ids: list[int], loop, context: int | None = None,
            until_context: bool = False) -> Job:
    """Check the request against the context and build its job: the prompt ``ids`` (token ids), ``context`` a
    smaller context for this request (tokens; Ollama's ``num_ctx``), ``until_context`` with ``max_tokens``
    None: generate until the context is full (else the server's default). Raises RequestError (400)."""
    ctx, n = engine.decoder.context_length, len(ids)
    ctx = ctx if context is None else min(ctx, context)
    if n >= ctx:
        raise RequestError(400, f"the prompt is {n} tokens; the context holds {ctx}",
                           "messages" if req.messages is not None else "prompt", "context_length_exceeded")
    if req.max_tokens is not None and n + req.max_tokens > ctx:
        raise RequestError(400, f"the prompt is {n} tokens and max_tokens {req.max_tokens}; the context holds "
                                f"{ctx}", "max_tokens", "context_length_exceeded")
    default = ctx - n if until_context else min(engine.default_max_tokens, ctx - n)
    o = {"max_new_tokens": req.max_tokens if req.max_tokens is not None else default}
    for name in ("temperature", "top_p", "top_k", "seed"):
        if getattr(req, name) is not None:
            o[name] = getattr(req, name)
    o.update(generation_overrides(engine.decoder, req.extras))  # penalties, bias, grammar, logprobs
    if req.latency_budget_ms is not None and _policy(engine.gen_kwargs) is None:
        raise RequestError(400, "a latency budget needs adaptive K (the server runs a fixed K)",
                           "edgespec.latency_budget_ms")
    echo = ""
    if req.extras is not None and req.extras.echo:
        echo = req.prompt if req.prompt is not None else engine.decoder.tokenizer.decode(list(ids))
    return Job(list(ids), o, req.stop, req.latency_budget_ms, loop,
               logprobs=req.extras is not None and req.extras.logprobs is not None, echo=echo)



def _policy(gen_kwargs: dict):
    """The server's K policy if it honours a latency budget (adaptive K), else None (fixed K, plain decoding)."""
    p = gen_kwargs.get("policy")  # the keyword of SpecDecoder.generate that takes the K policy
    return p if p is not None and p.honours_budget else None
