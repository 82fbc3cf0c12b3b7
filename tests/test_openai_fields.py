"""The wire format's extra fields without a server: what is accepted, what is a 400, and the tool-call parser."""

from __future__ import annotations

import json

import pytest

from edgespec.apps.openai_api import RequestError, parse_chat, parse_completion
from edgespec.apps.openai_fields import CHAT_FIELDS, COMPLETION_FIELDS
from edgespec.apps.tools import ToolCallParser, parse_call

MSGS = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


def refused(body, chat=True) -> RequestError:
    with pytest.raises(RequestError) as e:
        parse_chat(body) if chat else parse_completion(body, 500)
    assert e.value.status == 400
    return e.value


@pytest.mark.parametrize("field,value", [("functions", []), ("function_call", "auto"), ("modalities", ["text"]),
                                         ("prediction", {"type": "content"}), ("store", True), ("metadata", {}),
                                         ("service_tier", "auto"), ("reasoning_effort", "low"), ("audio", {}),
                                         ("web_search_options", {}), ("min_p", 0.1), ("echo", True)])
def test_unknown_chat_fields_are_a_400_naming_the_field(field, value):
    e = refused({"messages": MSGS, field: value})
    assert e.param == field and field in e.message


@pytest.mark.parametrize("field,value", [("tools", TOOLS), ("response_format", {"type": "text"}),
                                         ("best_of", 2), ("top_logprobs", 2)])  # suffix: FIM (tests/test_fim.py)
def test_unknown_completion_fields_are_a_400(field, value):
    assert refused({"prompt": "x", field: value}, chat=False).param == field


@pytest.mark.parametrize("body,param", [({"n": True}, "n"), ({"n": 1.0}, "n"), ({"best_of": True}, "best_of"),
                                        ({"stream_options": {"include_usage": True}}, "stream_options"),
                                        ({"stream": False, "stream_options": {}}, "stream_options")])
def test_fields_compare_by_json_type_and_stream_options_needs_stream(body, param):
    """``true`` is not 1 and ``1.0`` is not the integer 1; ``stream_options`` without ``stream`` is refused
    (OpenAI does), never silently unused."""
    assert refused({"prompt": "x", **body}, chat=False).param == param


@pytest.mark.parametrize("call,what", [
    ({"id": "a", "type": "bogus", "function": {"name": "f", "arguments": "{}"}}, ".type"),
    ({"id": "a", "zzz": 1, "function": {"name": "f", "arguments": "{}"}}, ".zzz"),
    ({"id": "a", "function": {"name": "f", "arguments": "{}", "extra": 1}}, ".function.extra"),
])
def test_an_assistant_tool_call_with_unknown_keys_is_a_400(call, what):
    msgs = MSGS + [{"role": "assistant", "tool_calls": [call]}]
    e = refused({"messages": msgs})
    assert e.param == "messages" and f"tool_calls[0]{what}" in e.message


def test_an_assistant_tool_call_as_a_client_merged_it_from_the_stream_is_accepted():
    """``index`` (this server's streamed deltas carry it) and a null ``type`` are not unknown keys."""
    call = {"index": 0, "id": "a", "type": None, "function": {"name": "get_weather", "arguments": "{}"}}
    msgs = MSGS + [{"role": "assistant", "tool_calls": [call]}]
    assert parse_chat({"messages": msgs, "tools": TOOLS}).messages[-1]["tool_calls"][0]["function"]["name"] == \
        "get_weather"
    assert refused({"messages": MSGS + [{"role": "assistant", "tool_calls": [{**call, "index": -1}]}]}).param == \
        "messages"


def test_null_fields_count_as_absent_and_every_listed_field_parses():
    assert parse_chat({"messages": MSGS, "functions": None, "audio": None}).extras.tools is None
    body = {"model": "m", "messages": MSGS, "max_tokens": 4, "max_completion_tokens": 4, "n": 1,
            "temperature": 0.5, "top_p": 0.9, "top_k": 5, "seed": 1, "stop": ["x"], "stream": True,
            "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 3, "presence_penalty": 1,
            "frequency_penalty": -1, "repetition_penalty": 1.1, "logit_bias": {"5": -100}, "user": "u",
            "response_format": {"type": "json_object"}, "tools": TOOLS, "tool_choice": "auto",
            "parallel_tool_calls": True, "edgespec": {"latency_budget_ms": 50}}
    assert set(body) == CHAT_FIELDS
    x = parse_chat(body).extras
    assert (x.logprobs, x.presence_penalty, x.logit_bias, x.response_format, x.tool_choice) == \
        (3, 1.0, ((5, -100.0),), "json_object", "auto")
    cbody = {"model": "m", "prompt": "x", "max_tokens": 4, "n": 1, "best_of": 1, "temperature": 0.5, "top_p": 0.9,
             "top_k": 5, "seed": 1, "stop": "x", "stream": True, "stream_options": {"include_usage": True},
             "logprobs": 2, "presence_penalty": 0, "frequency_penalty": 0, "repetition_penalty": 1,
             "logit_bias": {}, "echo": False, "user": "u", "edgespec": {}, "suffix": "y"}
    assert set(cbody) == COMPLETION_FIELDS and parse_completion(cbody, 500).extras.logprobs == 2


@pytest.mark.parametrize("body,param", [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools"),
    ({"tools": TOOLS, "parallel_tool_calls": False}, "parallel_tool_calls"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"top_logprobs": 3}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"presence_penalty": 2.5}, "presence_penalty"), ({"logit_bias": {"a": 1}}, "logit_bias"),
    ({"logit_bias": {"3": 101}}, "logit_bias"), ({"logit_bias": {"01": 1}}, "logit_bias"),
    ({"seed": 1 << 64}, "seed"), ({"stream_options": {"continuous_usage_stats": True}},
                                                 "stream_options.continuous_usage_stats"),
    ({"edgespec": {"k": 3}}, "edgespec.k"),
])
def test_bad_extras_are_a_clear_400(body, param):
    assert refused({"messages": MSGS, **body}).param == param


def test_tool_messages_are_accepted_and_checked():
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "P"}'}}
    msgs = MSGS + [{"role": "assistant", "content": None, "tool_calls": [call]},
                   {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    r = parse_chat({"messages": msgs, "tools": TOOLS})
    assert r.messages[1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert r.messages[2] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}
    bad = dict(call, function={"name": "get_weather", "arguments": "{not json"})
    assert "arguments" in refused({"messages": MSGS + [{"role": "assistant", "tool_calls": [bad]}]}).message
    assert "tool_call_id" in refused({"messages": MSGS + [{"role": "tool", "content": "x"}]}).message
    assert "name" in refused({"messages": [{"role": "user", "content": "x", "name": "bob"}]}).message


WHOLE = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
         '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>')


def _events(pieces):
    p = ToolCallParser()
    out = [e for piece in pieces for e in p.push(piece)] + p.flush()
    return [(k, v if k == "content" else (v.name, v.arguments)) for k, v in out], p


@pytest.mark.parametrize("text", [WHOLE, "plain text, no calls  \n", 'a <tool_call>{"oops"</tool_call> b',
                                  "ends inside <tool_call>\n{\"name\": \"x\""])
def test_the_parser_gives_the_same_events_at_every_split(text):
    whole, p = _events([text])
    joined = lambda ev: ("".join(v for k, v in ev if k == "content"), [v for k, v in ev if k == "call"])  # noqa: E731
    for cut in range(len(text) + 1):
        assert joined(_events([text[:cut], text[cut:]])[0]) == joined(whole), cut
    assert joined(_events(list(text))[0]) == joined(whole)
    if text == WHOLE:
        assert joined(whole) == ("Let me check.", [("get_weather", '{"city": "Paris"}'),
                                                   ("get_weather", '{"city": "Rome"}')]) and p.calls == 2
    elif "<tool_call>" in text:  # never dropped: the bad block stays as text, flagged
        assert joined(whole)[0] == text and p.invalid == 1 and p.calls == 0
    else:
        assert joined(whole)[0] == text


def test_parse_call_shapes():
    assert json.loads(parse_call('{"name": "f", "arguments": "{\\"a\\": 1}"}').arguments) == {"a": 1}
    assert parse_call('{"arguments": {}}') is None and parse_call("[1]") is None
    assert parse_call('{"name": "f", "arguments": [1]}') is None
