"""Ollama's API on ``edgespec serve`` (its docs/api.md: /api/chat, /api/show, /api/tags, /api/ps, /api/version,
/api/embed), driven by the official ``ollama`` Python client and by raw HTTP, on the tiny pair with a Qwen2.5-style
tools template (``tiny_tool_export``)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from edgespec.apps.ollama_api import parse_chat, parse_options
from edgespec.apps.ollama_serve import _chunks
from edgespec.apps.request_error import RequestError
from edgespec.apps.serve_output import Choice

ollama = pytest.importorskip("ollama")
pytest.importorskip("llguidance")

from test_serve import MODEL, Server  # noqa: E402

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
          "additionalProperties": False}
GREEDY = {"temperature": 0, "num_predict": 24}


# -- request parsing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("body, param", [
    ({"model": None}, "model"), ({"model": ""}, "model"), ({"model": 3}, "model"),
    ({"foo": 1}, "foo"), ({"think": True}, "think"), ({"logprobs": True}, "logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"), ({"format": "xml"}, "format"), ({"format": ["json"]}, "format"),
    ({"keep_alive": "0s"}, "keep_alive"), ({"keep_alive": "soon"}, "keep_alive"),
    ({"options": {"mirostat": 2}}, "options"), ({"options": {"repeat_penalty": 1.3}}, "options"),
    ({"options": {"num_thread": 4}}, "options"), ({"options": {"num_predict": -3}}, "num_predict"),
    ({"options": {"temperature": "hot"}}, "temperature"), ({"options": []}, "options"),
    ({"stream": "yes"}, "stream"), ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
    ({"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "messages"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}]}, "messages"),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": {}}}]}]},
     "messages"),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f",
                                                                                     "arguments": "{}"}}]}]},
     "messages"),
    ({"messages": [{"role": "user", "content": "x", "tool_name": "f"}]}, "messages"),
    ({"tools": [{"type": "function"}]}, "tools"), ({"tools": {"a": 1}}, "tools"),
    ({"options": {"seed": 1 << 64}}, "seed"),
])
def test_chat_refuses_bad_and_unimplemented_fields(body, param):
    with pytest.raises(RequestError) as e:
        parse_chat({"model": "m", "messages": ASK, **body})
    assert e.value.status == 400 and e.value.param == param


def test_chat_fields():
    c = parse_chat({"model": "qwen2.5-coder:1.5b", "messages": ASK, "tools": TOOLS, "keep_alive": "5m",
                    "options": {"num_predict": 16, "temperature": 0, "top_k": 4, "top_p": 0.5, "seed": 7,
                                "stop": ["\n\n"], "num_ctx": 128, "min_p": 0, "repeat_penalty": 1, "mirostat": 0}})
    r, x = c.request, c.request.extras
    assert c.stream and c.num_ctx == 128 and not c.until_context and not c.evaluate_only
    assert (r.max_tokens, r.temperature, r.top_k, r.top_p, r.seed, r.stop) == (16, 0, 4, 0.5, 7, ("\n\n",))
    assert x.tools[0]["function"]["name"] == "get_weather" and x.tool_choice == "auto" and x.parse_tools
    assert parse_chat({"model": "m", "messages": ASK, "format": "json"}).request.extras.response_format == "json_object"
    x = parse_chat({"model": "m", "messages": ASK, "format": SCHEMA, "stream": False}).request.extras
    assert x.response_format == "json_schema" and x.schema == SCHEMA
    assert parse_chat({"model": "m", "messages": ASK, "options": {"num_predict": -1}}).until_context
    assert parse_chat({"model": "m", "messages": ASK, "options": {"num_predict": 0}}).evaluate_only
    assert parse_chat({"model": "m", "messages": []}).load_only
    # null and empty count as absent, as the client sends them
    assert parse_chat({"model": "m", "messages": ASK, "format": "", "think": False, "tools": [], "options": None,
                       "logprobs": False}).request.extras.tools is None


def test_chat_history_with_a_tool_call_and_its_result():
    c = parse_chat({"model": "m", "messages": ASK + [
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather",
                                                                          "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": '{"celsius": 21}', "tool_name": "get_weather"}], "tools": TOOLS})
    _, call, result = c.request.messages
    (tc,) = call["tool_calls"]
    assert tc["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'} and tc["id"]
    assert result == {"role": "tool", "content": '{"celsius": 21}', "name": "get_weather"}


def test_options_off_values_are_accepted_other_values_refused():
    assert parse_options({"typical_p": 1.0, "tfs_z": 1, "presence_penalty": 0, "frequency_penalty": 0.0})["seed"] is None
    for k, v in (("typical_p", 0.9), ("presence_penalty", 0.5), ("mirostat", True), ("min_p", 0.05)):
        with pytest.raises(RequestError):
            parse_options({k: v})


def test_tool_calls_stream_as_ollama_objects():
    """The tool-call parser's deltas become Ollama chunks: text pieces, then each call once, whole."""
    x = parse_chat({"model": "m", "messages": ASK, "tools": TOOLS}).request.extras
    choice = Choice(True, x, None)
    text = 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    out = []
    for piece in (text[:9], text[9:40], text[40:]):
        out += _chunks(MODEL, choice, choice.push(piece))
    out += _chunks(MODEL, choice, choice.flush())
    assert [o["message"]["content"] for o in out] == ["Sure.", ""]
    assert out[1]["message"]["tool_calls"] == [{"function": {"index": 0, "name": "get_weather",
                                                             "arguments": {"city": "Paris"}}}]
    assert all(o["done"] is False and o["model"] == MODEL for o in out)


# -- the server --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tiny_tool_export, home, tmp_path_factory):
    s = Server(tiny_tool_export, home, tmp_path_factory.mktemp("serve") / "ollama.log")
    s.ollama = ollama.Client(host=s.url, timeout=120)
    yield s
    s.close()


def _get(server, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(server.url + path, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_official_client_chats_streamed_and_not(server):
    whole = server.ollama.chat(model=MODEL, messages=ASK, options=GREEDY)
    assert whole.done and whole.done_reason in ("stop", "length") and whole.message.role == "assistant"
    assert whole.eval_count <= 24 and whole.prompt_eval_count > 0 and whole.total_duration > 0
    parts = list(server.ollama.chat(model=MODEL, messages=ASK, options=GREEDY, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done and parts[-1].message.content == ""
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].eval_count == whole.eval_count and parts[-1].done_reason == whole.done_reason
    # the same engine as the OpenAI route: greedy, the same text
    r = server.client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=24)
    assert r.choices[0].message.content == whole.message.content


def test_the_official_client_shows_lists_and_ps(server):
    show = server.ollama.show(MODEL)
    assert "tools" in show.capabilities and "completion" in show.capabilities
    assert show.details.format == "onnx" and show.details.quantization_level == "fp32"
    assert show.modelinfo[f"{show.details.family}.context_length"] == 2048
    assert "<tool_call>" in show.template and '"<|im_end|>"' in show.parameters
    (m,) = server.ollama.list().models
    assert m.model == MODEL and m.size > 0 and m.digest.startswith("sha256:")
    (p,) = server.ollama.ps().models
    assert p.model == MODEL and p.context_length == 2048 and p.size_vram == 0
    assert _get(server, "/api/version")[1]["version"].count(".") == 2


def test_format_schema_and_json_streamed_equals_whole(server):
    for fmt in (SCHEMA, "json"):
        kw = dict(model=MODEL, messages=ASK, format=fmt, options={"temperature": 0, "num_predict": 64})
        whole = server.ollama.chat(**kw)
        streamed = "".join(p.message.content for p in server.ollama.chat(stream=True, **kw))
        assert streamed == whole.message.content
        if fmt is SCHEMA:
            assert json.loads(whole.message.content)["answer"] in ("yes", "no")


def test_tools_render_and_a_tool_result_round_trip(server):
    """Tools go through the template (the prompt grows by the tools block); a tool call in the history and
    the tool's result render too; a model that calls no tool answers in text (tiny random weights)."""
    plain = server.ollama.chat(model=MODEL, messages=ASK, options=GREEDY)
    with_tools = server.ollama.chat(model=MODEL, messages=ASK, tools=TOOLS, options=GREEDY)
    assert with_tools.prompt_eval_count > plain.prompt_eval_count + 20
    history = ASK + [{"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": '{"celsius": 21}', "tool_name": "get_weather"}]
    r = server.ollama.chat(model=MODEL, messages=history, tools=TOOLS, options=GREEDY)
    assert r.done and r.prompt_eval_count > with_tools.prompt_eval_count


def test_load_num_predict_and_num_ctx(server):
    status, r = server.post("/api/chat", json.dumps({"model": MODEL, "messages": []}).encode())
    assert status == 200 and r["done_reason"] == "load" and r["done"] is True
    r = server.ollama.chat(model=MODEL, messages=ASK, options={"num_predict": 0})
    assert r.eval_count == 0 and r.message.content == "" and r.done_reason == "length"
    r = server.ollama.chat(model=MODEL, messages=ASK, options={"temperature": 0, "num_predict": -1, "num_ctx": 60})
    assert r.done_reason in ("stop", "length") and r.prompt_eval_count + r.eval_count <= 60
    with pytest.raises(ollama.ResponseError) as e:
        server.ollama.chat(model=MODEL, messages=ASK, options={"num_ctx": 4})
    assert e.value.status_code == 400 and "context" in e.value.error


@pytest.mark.parametrize("method, path, body, status", [
    ("POST", "/api/chat", b"{", 400), ("POST", "/api/chat", b"[]", 400),
    ("POST", "/api/chat", b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "think": true}', 400),
    ("POST", "/api/chat", b'{"model": "m", "messages": [{"role": "user"}], "options": {"num_gpu": 1}}', 400),
    ("POST", "/api/chat", b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "format": {"type": 1}}',
     400),
    ("POST", "/api/show", b'{"verbose": 1, "model": "m"}', 400), ("POST", "/api/show", b"{}", 400),
    ("POST", "/api/embed", b'{"model": "m", "input": "x"}', 501),
    ("POST", "/api/embeddings", b'{"model": "m", "prompt": "x"}', 501),
    ("POST", "/api/pull", b'{"model": "m"}', 404), ("GET", "/api/chat", b"", 405),
    ("POST", "/api/generate", b'{"model": "m", "prompt": "x", "options": {"mirostat": 1}}', 400),
])
def test_errors_are_ollama_error_objects(server, method, path, body, status):
    req = urllib.request.Request(server.url + path, data=body if method == "POST" else None, method=method,
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    r = json.loads(e.value.read())
    assert e.value.code == status and isinstance(r["error"], str) and r["error"] and set(r) == {"error"}


def test_the_client_reads_the_error_text(server):
    with pytest.raises(ollama.ResponseError) as e:
        server.ollama.chat(model=MODEL, messages=ASK, options={"mirostat": 1})
    assert e.value.status_code == 400 and e.value.error.startswith("options: mirostat")
    with pytest.raises(ollama.ResponseError) as e:
        server.ollama.embed(model=MODEL, input="x")
    assert e.value.status_code == 501
    assert server.health()["running"] is False
