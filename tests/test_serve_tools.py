"""``edgespec serve`` with tools, JSON output, logprobs, penalties and echo, driven by the real ``openai`` client.

The tiny pair here has ``<tool_call>`` tokens and a Qwen2.5-style tools template (``tiny_tool_export``); its
random weights never call a tool of their own accord, so calls come from ``tool_choice: "required"`` or a named
function, where decoding is constrained to a valid call.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgespec.engine.decoder import SpecDecoder
from edgespec.core.processors import Processing

openai = pytest.importorskip("openai")
pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from test_serve import MODEL, Server  # noqa: E402

WEATHER = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
             "additionalProperties": False}}}]
SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "score": {"type": "boolean"}},
          "required": ["answer", "score"], "additionalProperties": False}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(tiny_tool_export, home, tmp_path_factory):
    s = Server(tiny_tool_export, home, tmp_path_factory.mktemp("serve") / "tools.log")
    yield s
    s.close()


@pytest.fixture(scope="module")
def api(tiny_tool_export):
    return SpecDecoder.load(tiny_tool_export)


def chat(server, **kw):
    return server.client.chat.completions.create(model=MODEL, max_tokens=kw.pop("max_tokens", 80), **kw)


def _streamed(server, **kw):
    """A streamed reply reassembled as the openai client's users do: content, tool calls, finish, logprobs."""
    text, calls, finish, lps = "", {}, None, []
    for c in chat(server, stream=True, **kw):
        if not c.choices:
            continue
        ch = c.choices[0]
        text += ch.delta.content or ""
        for d in ch.delta.tool_calls or []:
            slot = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            slot["id"] = d.id or slot["id"]
            if d.function is not None:
                slot["name"] += d.function.name or ""
                slot["arguments"] += d.function.arguments or ""
        if ch.logprobs is not None and ch.logprobs.content:
            lps += ch.logprobs.content
        finish = ch.finish_reason or finish
    return text, [calls[i] for i in sorted(calls)], finish, lps


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_a_tool_call_round_trip_streamed_equals_whole(server, choice):
    kw = dict(messages=ASK, tools=TOOLS, tool_choice=choice, temperature=0)
    r = chat(server, **kw)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and len(msg.tool_calls) == 1 and msg.content is None
    for call in msg.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        spec = next(t["function"] for t in TOOLS if t["function"]["name"] == call.function.name)
        jsonschema.validate(json.loads(call.function.arguments), spec["parameters"])
    if isinstance(choice, dict):
        assert {c.function.name for c in msg.tool_calls} == {"get_time"}
    text, calls, finish, _ = _streamed(server, **kw)
    assert finish == "tool_calls" and text == ""
    assert [(c["name"], c["arguments"]) for c in calls] == \
        [(c.function.name, c.function.arguments) for c in msg.tool_calls]
    # the tool's answer goes back; the model answers in text (auto: its own choice, parsed for calls)
    follow = ASK + [{"role": "assistant", "content": None,
                     "tool_calls": [c.model_dump(exclude_none=True) for c in msg.tool_calls]}]
    follow += [{"role": "tool", "tool_call_id": c.id, "content": '{"sky": "clear"}'} for c in msg.tool_calls]
    final = chat(server, messages=follow, tools=TOOLS, temperature=0, max_tokens=30)
    assert final.choices[0].finish_reason in ("stop", "length") and final.choices[0].message.content
    assert final.usage.prompt_tokens > r.usage.prompt_tokens  # the call and its result are in the prompt


def test_parallel_tool_calls_lets_a_required_call_be_several(server):
    r = chat(server, messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=True, temperature=1.0,
             seed=1, max_tokens=400)
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason in ("tool_calls", "length") and calls
    for c in calls:
        spec = next(t["function"] for t in TOOLS if t["function"]["name"] == c.function.name)
        jsonschema.validate(json.loads(c.function.arguments), spec["parameters"])


def test_tools_need_a_template_that_renders_them(tiny_export, home, tmp_path):
    s = Server(tiny_export, home, tmp_path / "plain.log")
    try:
        with pytest.raises(openai.BadRequestError) as e:
            s.client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=4)
        assert e.value.body["param"] == "tools" and "render tools" in e.value.body["message"]
    finally:
        s.close()


def test_json_schema_output_parses_and_validates_on_every_seed(server):
    fmt = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA, "strict": True}}
    for seed in range(8):
        r = chat(server, messages=[{"role": "user", "content": "Answer in JSON"}], response_format=fmt,
                 temperature=1.0, seed=seed, max_tokens=200)
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    r = chat(server, messages=ASK, response_format={"type": "json_object"}, temperature=0, max_tokens=120)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # cut by max_tokens: still a prefix of an object
        assert r.choices[0].message.content.lstrip().startswith("{")
    with pytest.raises(openai.BadRequestError) as e:
        chat(server, messages=ASK, response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "frobnicate"}}})
    assert e.value.body["param"] == "response_format"


def test_logprobs_are_the_targets_and_stream_as_whole(server, api):
    kw = dict(messages=ASK, temperature=0, max_tokens=20, logprobs=True, top_logprobs=3)
    r = chat(server, **kw)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    api.reset()
    g = api.generate(messages=ASK, max_new_tokens=20, proposers=(), logprobs=3).run()
    want = g.stats.token_logprobs
    assert "".join(t.token for t in content) == r.choices[0].message.content == g.text
    assert np.allclose([t.logprob for t in content], [e.logprob for e in want], atol=1e-3)
    assert all(len(t.top_logprobs) == 3 and t.top_logprobs[0].logprob >= t.top_logprobs[-1].logprob
               for t in content)
    text, _, _, lps = _streamed(server, **kw)
    assert text == r.choices[0].message.content
    assert [(t.token, round(t.logprob, 4)) for t in lps] == [(t.token, round(t.logprob, 4)) for t in content]
    c = server.client.completions.create(model=MODEL, prompt="def add", max_tokens=10, temperature=0, logprobs=2)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == c.usage.completion_tokens
    assert "".join(lp.tokens) == c.choices[0].text and lp.text_offset[0] == 0


def test_penalties_change_the_output_and_match_the_library(server, api):
    kw = dict(messages=[{"role": "user", "content": "for i in range(10):"}], temperature=0, max_tokens=40)
    plain = chat(server, **kw).choices[0].message.content
    body = dict(presence_penalty=1.5, frequency_penalty=0.5, logit_bias={"5": -20})
    pen = chat(server, **kw, **body).choices[0].message.content
    assert pen != plain
    api.reset()
    g = api.generate(messages=kw["messages"], max_new_tokens=40, proposers=(),
                     processing=Processing(1.5, 0.5, logit_bias=((5, -20.0),))).run()
    assert pen == g.text  # the server's speculative decoding equals the library's plain decoding
    rep = chat(server, **kw, extra_body={"repetition_penalty": 1.5}).choices[0].message.content
    assert rep != plain


def test_echo_and_unknown_fields(server):
    r = server.client.completions.create(model=MODEL, prompt="class Node", max_tokens=8, temperature=0, echo=True)
    plain = server.client.completions.create(model=MODEL, prompt="class Node", max_tokens=8, temperature=0)
    assert r.choices[0].text == "class Node" + plain.choices[0].text
    s = server.client.completions.create(model=MODEL, prompt="class Node", max_tokens=8, temperature=0, echo=True,
                                         stream=True)
    assert "".join(c.choices[0].text for c in s) == r.choices[0].text
    for field, value in (("functions", [{"name": "f"}]), ("modalities", ["text"]), ("store", True)):
        with pytest.raises(openai.BadRequestError) as e:
            chat(server, messages=ASK, extra_body={field: value})
        assert e.value.body["param"] == field
    status, body = server.post("/v1/chat/completions", json.dumps({"messages": ASK, "logit_bias": {"99999": 1}})
                               .encode())
    assert status == 400 and body["error"]["param"] == "logit_bias"


# -- calls outside the tags (issue 43) -----------------------------------------------------------------------

QWEN = '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris",\n    "days": 2\n  }\n}\n```'


@pytest.fixture(scope="module")
def replay(tiny_tool_export):
    """An in-process server on the tiny tool pair whose answer is ``replay.answer``: the model runs two tokens
    (for its stats), then the answer streams in 4-character pieces, ended as by the stop token. The tiny pair's
    random weights never write a call of their own; the request still goes through the template, the queue and
    the worker as any."""
    from starlette.testclient import TestClient

    from edgespec.apps.serve import Engine, build_app

    dec = SpecDecoder.load(tiny_tool_export)
    real = dec.generate

    def generate(**kw):
        g = real(**{**kw, "max_new_tokens": 2}).run()
        g.stats.stop_reason = "stop_token"
        text = replay.answer

        def chunks():
            for i in range(0, len(text), 4):
                yield text[i:i + 4], False

        g.chunks = chunks
        return g

    dec.generate = generate
    engine = Engine(dec, {"proposers": ()})
    replay.http = TestClient(build_app(engine))
    replay.client = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=replay.http)
    yield replay
    engine.stop()


def _ollama(replay, stream: bool, **body) -> tuple[str, list, str]:
    r = replay.http.post("/api/chat", json={"model": MODEL, "messages": ASK, "stream": stream, **body})
    lines = [json.loads(x) for x in r.text.splitlines() if x.strip()]
    assert r.status_code == 200 and lines[-1]["done"], lines
    calls = [c for x in lines for c in x["message"].get("tool_calls", [])]
    return "".join(x["message"]["content"] for x in lines), calls, lines[-1]["done_reason"]


@pytest.mark.parametrize("answer, calls", [
    (QWEN, [("get_weather", {"city": "Paris", "days": 2})]),
    ('[{"name": "get_weather", "arguments": {"city": "Oslo", "days": 1}}, {"name": "get_time", "arguments": '
     '{"zone": "UTC"}}]', [("get_weather", {"city": "Oslo", "days": 1}), ("get_time", {"zone": "UTC"})]),
    ('```json\n{"name": "get_news", "arguments": {}}\n```', []),  # not a declared tool: content
    ('The call is:\n' + QWEN, []),  # prose around: content
])
def test_an_answer_that_is_wholly_a_json_call_is_tool_calls_on_both_apis(replay, answer, calls):
    replay.answer = answer
    kw = dict(messages=ASK, tools=TOOLS, tool_choice="auto", max_tokens=20)
    ch = chat(replay, **kw).choices[0]
    got = [(c.function.name, json.loads(c.function.arguments)) for c in ch.message.tool_calls or []]
    assert got == calls
    assert (ch.finish_reason, ch.message.content) == (("tool_calls", None) if calls else ("stop", answer))
    text, streamed, finish, _ = _streamed(replay, **kw)  # nothing of the call streams as content first
    assert (text or None, [(c["name"], json.loads(c["arguments"])) for c in streamed], finish) == \
        (ch.message.content, got, ch.finish_reason)
    for stream in (False, True):  # Ollama's /api/chat: the same calls, in its own form
        text, ocalls, reason = _ollama(replay, stream, tools=TOOLS)
        assert (text, [(c["function"]["name"], c["function"]["arguments"]) for c in ocalls], reason) == \
            ("" if calls else answer, calls, "stop")
    # the same answer is content without tools, with tool_choice "none", or with JSON output asked for
    for extra in ({}, {"tools": TOOLS, "tool_choice": "none"},
                  {"tools": TOOLS, "response_format": {"type": "json_object"}}):
        m = chat(replay, messages=ASK, max_tokens=20, **extra).choices[0].message
        assert m.content == answer and not m.tool_calls
