"""Hostile and careless requests to ``edgespec serve``'s newer fields and endpoints: each gets a clear 4xx
naming the field (never a 500 or a traceback in the server's log), and the server keeps serving.

The parser cases run without a server (pure functions); one tools server and one FIM server (the tiny
exports) then take the same bodies over loopback. Every case here was a 500 before its fix.
"""

from __future__ import annotations

import json

import pytest

from edgespec.apps.fim_api import parse_infill, parse_ollama_generate
from edgespec.apps.openai_api import RequestError, parse_chat, parse_completion
from edgespec.apps.tools import parse_call

M = [{"role": "user", "content": "hi"}]
TOOL = [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}]
HUGE = 10 ** 400  # a JSON integer literal no float holds
DEEP = "[" * 100_000  # JSON text nested past Python's recursion limit

# (name, endpoint, body, the field the 400 names)
CASES = [
    ("logit_bias key a superscript digit", "/v1/chat/completions",
     {"messages": M, "logit_bias": {"²": 1}}, "logit_bias"),
    ("logit_bias key of 5,000 digits", "/v1/completions", {"prompt": "x", "logit_bias": {"9" * 5000: 1}},
     "logit_bias"),
    ("temperature a huge integer", "/v1/chat/completions", {"messages": M, "temperature": HUGE}, "temperature"),
    ("top_p a huge integer", "/v1/completions", {"prompt": "x", "top_p": HUGE}, "top_p"),
    ("latency budget a huge integer", "/v1/chat/completions",
     {"messages": M, "edgespec": {"latency_budget_ms": HUGE}}, "latency_budget_ms"),
    ("role a list", "/v1/chat/completions", {"messages": [{"role": ["user"], "content": "x"}]}, "messages"),
    ("role an object", "/v1/chat/completions", {"messages": [{"role": {}, "content": "x"}]}, "messages"),
    ("tool_choice name a list", "/v1/chat/completions",
     {"messages": M, "tools": TOOL, "tool_choice": {"type": "function", "function": {"name": ["get"]}}},
     "tool_choice"),
    ("tool call arguments nested too deep", "/v1/chat/completions",
     {"messages": [{"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "get",
                                                                                    "arguments": DEEP}}]}]},
     "messages"),
]
INFILL_CASES = [
    ("t_max_predict_ms a huge integer", "/infill", {"input_prefix": "x", "t_max_predict_ms": HUGE},
     "t_max_predict_ms"),
    ("Ollama temperature a huge integer", "/api/generate",
     {"model": "m", "prompt": "x", "options": {"temperature": HUGE}}, "temperature"),
]
# lone surrogates (valid JSON escapes, not Unicode) where the chat template renders them: raw bodies
SURROGATES = [
    ("tool description", b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", '
                         b'"function": {"name": "f", "description": "\\ud800"}}]}'),
    ("tool parameters", b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", '
                        b'"function": {"name": "f", "parameters": {"type": "object", "description": "\\udfff"}}}], '
                        b'"tool_choice": "required"}'),
    ("tool call name", b'{"messages": [{"role": "assistant", "tool_calls": [{"id": "a", "function": '
                       b'{"name": "f\\ud800", "arguments": "{}"}}]}]}'),
    ("tool call arguments", b'{"messages": [{"role": "assistant", "tool_calls": [{"id": "a", "function": '
                            b'{"name": "f", "arguments": "{\\"a\\": \\"\\\\ud800\\"}"}}]}]}'),
    ("tool message id", b'{"messages": [{"role": "user", "content": "x"}, {"role": "tool", '
                        b'"tool_call_id": "\\ud800", "content": "r"}]}'),
]


def _parse(path: str, body):
    if path == "/v1/chat/completions":
        return parse_chat(body)
    if path == "/v1/completions":
        return parse_completion(body, 512)
    return parse_infill(body) if path == "/infill" else parse_ollama_generate(body)


@pytest.mark.parametrize("name,path,body,param", CASES + INFILL_CASES, ids=[c[0] for c in CASES + INFILL_CASES])
def test_the_parsers_refuse_with_a_400_naming_the_field(name, path, body, param):
    with pytest.raises(RequestError) as e:
        _parse(path, body)
    assert e.value.status == 400 and param in f"{e.value.param} {e.value.message}", e.value.message


@pytest.mark.parametrize("name,raw", SURROGATES, ids=[s[0] for s in SURROGATES])
def test_lone_surrogates_in_tool_fields_are_refused(name, raw):
    with pytest.raises(RequestError) as e:
        parse_chat(json.loads(raw))
    assert e.value.status == 400 and "Unicode" in e.value.message, e.value.message


def test_a_model_tool_call_nested_too_deep_is_not_a_call():
    """The model's own ``<tool_call>`` text (a client can steer it with logit_bias) is parsed on the event loop:
    JSON nested past the recursion limit is an invalid call left in the content, not an exception."""
    assert parse_call('{"name": "f", "arguments": ' + DEEP + "}") is None
    assert parse_call('{"name": "f", "arguments": "' + DEEP + '"}') is None


@pytest.fixture(scope="module")
def tool_server(tiny_tool_export, home, tmp_path_factory):
    pytest.importorskip("starlette")
    from test_serve import Server

    s = Server(tiny_tool_export, home, tmp_path_factory.mktemp("attack") / "tools.log")
    yield s
    s.close()  # asserts no traceback in the server's log


@pytest.fixture(scope="module")
def fim_server(tiny_fim_export, home, tmp_path_factory):
    pytest.importorskip("starlette")
    from test_serve import Server

    s = Server(tiny_fim_export, home, tmp_path_factory.mktemp("attack") / "fim.log")
    yield s
    s.close()


def test_the_server_answers_each_bad_request_with_a_4xx_and_keeps_serving(tool_server, fim_server):
    for name, path, body, param in CASES:
        status, obj = tool_server.post(path, json.dumps(body).encode())
        assert status == 400 and param in json.dumps(obj), (name, status, obj)
    for name, raw in SURROGATES:
        status, obj = tool_server.post("/v1/chat/completions", raw)
        assert status == 400 and "Unicode" in obj["error"]["message"], (name, status, obj)
    for name, path, body, param in INFILL_CASES:
        status, obj = fim_server.post(path, json.dumps(body).encode())
        assert status == 400 and param in json.dumps(obj), (name, status, obj)
    status, obj = tool_server.post("/v1/chat/completions", json.dumps({"messages": M, "max_tokens": 3}).encode())
    assert status == 200 and obj["usage"]["completion_tokens"] == 3
    status, obj = fim_server.post("/infill", json.dumps({"input_prefix": "def f(", "n_predict": 3}).encode())
    assert status == 200 and obj["tokens_predicted"] == 3
    assert tool_server.health()["failed"] == 0 and fim_server.health()["failed"] == 0


def test_a_json_schema_file_nested_too_deep_is_one_line_at_the_cli(tiny_export, home, tmp_path):
    from test_cli import run as run_cli

    deep = tmp_path / "deep.json"
    deep.write_text(DEEP)
    r = run_cli(["generate", str(tiny_export), "--prompt", "x", "--json-schema", str(deep)], home)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "not JSON" in lines[0], r.stderr


@pytest.mark.parametrize("body,param", [
    ({"response_format": {"type": "json_object", "schema": {"type": "object"}}}, "response_format"),
    ({"response_format": {"type": "text", "json_schema": {"name": "a", "schema": {}}}}, "response_format"),
    ({"parallel_tool_calls": True}, "parallel_tool_calls"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {}}]}]},
     "messages[0].content"),
], ids=["json_object with a schema", "text with a json_schema", "parallel_tool_calls without tools",
        "a content part's unknown key"])
def test_a_field_that_would_be_ignored_is_refused(body, param):
    with pytest.raises(RequestError) as e:
        parse_chat({"messages": M, **body})
    assert e.value.status == 400 and e.value.param == param, e.value.message


@pytest.mark.parametrize("keep_alive", [[0], {}, True])
def test_ollama_keep_alive_of_the_wrong_type_is_refused(keep_alive):
    with pytest.raises(RequestError) as e:
        parse_ollama_generate({"model": "m", "prompt": "x", "keep_alive": keep_alive})
    assert e.value.param == "keep_alive"


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"messages": M, "max_completion_tokens": 5, "max_tokens": "abc"}, "max_tokens"),
    ("/v1/chat/completions", {"messages": M, "max_completion_tokens": 5, "max_tokens": 9}, "max_tokens"),
    ("/infill", {"n_predict": 5, "max_tokens": [1]}, "max_tokens"),
    ("/infill", {"n_predict": 5, "max_tokens": 9}, "max_tokens"),
    ("/v1/chat/completions", {"messages": M, "tools": TOOL, "tool_choice": {
        "type": "function", "function": {"name": "get"}, "strict": True}}, "tool_choice"),
    ("/v1/chat/completions", {"messages": M, "tools": TOOL, "tool_choice": {
        "type": "function", "function": {"name": "get", "arguments": "{}"}}}, "tool_choice"),
], ids=["max_tokens not an integer beside max_completion_tokens", "max_tokens differing from max_completion_tokens",
        "infill max_tokens not an integer beside n_predict", "infill max_tokens differing from n_predict",
        "tool_choice unknown key", "tool_choice.function unknown key"])
def test_an_alias_or_key_that_would_be_ignored_is_refused(path, body, param):
    with pytest.raises(RequestError) as e:
        _parse(path, body)
    assert e.value.status == 400 and e.value.param == param, e.value.message


def test_aliases_that_agree_are_accepted():
    assert parse_chat({"messages": M, "max_completion_tokens": 5, "max_tokens": 5}).max_tokens == 5
    assert parse_infill({"n_predict": 5, "max_tokens": 5}).max_tokens == 5


def test_a_completion_prompt_over_the_context_names_prompt():
    """/v1/completions (a suffix over the context included) has no ``messages``: the 400 names ``prompt``."""
    from types import SimpleNamespace

    from edgespec.apps.serve_fields import job_for

    engine = SimpleNamespace(decoder=SimpleNamespace(context_length=8), default_max_tokens=4, gen_kwargs={})
    for req, param in ((parse_completion({"prompt": "x"}, 512), "prompt"), (parse_chat({"messages": M}), "messages")):
        with pytest.raises(RequestError) as e:
            job_for(engine, req, list(range(9)), None)
        assert e.value.param == param and e.value.code == "context_length_exceeded"


def test_null_counts_as_absent_for_fields_with_a_true_default():
    """As on the OpenAI routes, null is the default: Ollama's ``stream`` (true), llama.cpp's ``cache_prompt``."""
    assert parse_ollama_generate({"model": "m", "prompt": "x", "stream": None}).stream is True
    assert parse_infill({"input_prefix": "x", "cache_prompt": None}).cache_prompt is True
