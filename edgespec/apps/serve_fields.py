"""What a request's tools, response format, logprobs and penalties ask of the decoder (``edgespec serve``).

:func:`encode_request` renders chat messages with their tools through the export's chat template;
:func:`generation_overrides` turns :class:`~edgespec.apps.openai_fields.Extras` into ``GenerationOptions`` fields:
a :class:`~edgespec.core.processors.Processing` (penalties, logit bias, the grammar of a ``response_format`` or a
required tool call) and ``logprobs``. Both raise RequestError (400) for what the export or the request cannot do.
"""

from __future__ import annotations

from ..core.constrain import TOOL_OPEN, Constraint
from .openai_api import Request, RequestError
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
