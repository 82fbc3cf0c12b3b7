"""Fill-in-the-middle: the FIM prompt, the middle's limits, the decode of non-special added tokens, and the
completion endpoints of ``edgespec serve`` (/infill, /api/generate, /api/tags, /v1/completions with suffix) on
a tiny export whose tokenizer has Qwen2.5-Coder's FIM tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from edgespec.engine.decoder import SpecDecoder
from edgespec.apps.fim import FimPrompt, MiddleCutter, build_ids, fim_tokens
from edgespec.apps.fim_api import parse_infill, parse_ollama_generate
from edgespec.apps.openai_api import RequestError
from edgespec.io.text import IncrementalDetokenizer, decode

PREFIX = "class Node:\n    def __init__(self, value):\n"
SUFFIX = "\n\nfor i in range(10):\n    print(i)\n"
EXTRA = [{"filename": "add.py", "text": "def add(a, b):\n    return a + b\n"}]


@pytest.fixture(scope="module")
def fim_api(tiny_fim_export):
    return SpecDecoder.load(tiny_fim_export, load_draft=False)


def plain_middle(dec, p: FimPrompt, n: int) -> tuple[str, str]:
    """The target's own greedy middle (plain decoding, fresh caches) and why it ended."""
    t = fim_tokens(dec.tokenizer)
    dec.reset()
    saved = dec.stop_ids
    dec.stop_ids = saved | t.stop_ids
    try:
        g = dec.generate(input_ids=build_ids(dec.tokenizer, lambda: dec.plain_tokenizer, t, p), max_new_tokens=n,
                         proposers=()).run()
    finally:
        dec.stop_ids = saved
    return g.text, g.stats.stop_reason


# -- prompt, tokens, decode ----------------------------------------------------------------------------


def test_fim_tokens_come_from_the_tokenizer(fim_api, tiny_export):
    t = fim_tokens(fim_api.tokenizer)
    tok = fim_api.tokenizer
    assert (t.prefix, t.suffix, t.middle) == tuple(tok.token_to_id(x) for x in
                                                   ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"))
    assert t.repo_level and t.stop_ids == {tok.token_to_id("<|fim_pad|>"), tok.token_to_id("<|file_sep|>")}
    assert fim_tokens(SpecDecoder.load(tiny_export, load_draft=False).tokenizer) is None


def test_repo_level_prompt_layout(fim_api):
    tok = fim_api.tokenizer
    t = fim_tokens(tok)
    p = FimPrompt(PREFIX, SUFFIX, (("add.py", "x = 1"),), prompt="        self")
    ids = build_ids(tok, lambda: fim_api.plain_tokenizer, t, p)
    assert decode(tok, ids) == ("<|repo_name|>myproject\n<|file_sep|>add.py\nx = 1\n<|file_sep|>filename\n"
                                f"<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>        self")
    assert ids.count(t.prefix) == ids.count(t.suffix) == ids.count(t.middle) == 1 and ids[0] == t.repo_name
    alone = build_ids(tok, lambda: fim_api.plain_tokenizer, t, FimPrompt(PREFIX, SUFFIX))  # one file: file-level
    assert decode(tok, alone) == f"<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>"


def test_control_token_text_in_code_stays_plain_text(fim_api):
    tok = fim_api.tokenizer
    t = fim_tokens(tok)
    ids = build_ids(tok, lambda: fim_api.plain_tokenizer, t, FimPrompt("a = '<|fim_suffix|><|im_end|>'\n", "b\n"))
    assert ids.count(t.suffix) == 1 and tok.token_to_id("<|im_end|>") not in ids
    assert "a = '<|fim_suffix|><|im_end|>'" in decode(tok, ids)


def test_decode_keeps_the_non_special_added_tokens_and_drops_control_tokens(fim_api):
    tok = fim_api.tokenizer
    text = "<|fim_prefix|>def f(x):\n<|fim_suffix|>\n<|fim_middle|><tool_call>x</tool_call><|file_sep|><|im_end|>"
    ids = tok.encode(text, add_special_tokens=False).ids
    assert tok.token_to_id("<|file_sep|>") in ids and tok.token_to_id("<|im_end|>") in ids
    want = text.replace("<|im_end|>", "")
    assert tok.decode(ids, skip_special_tokens=True) != want  # the tokenizer alone drops the FIM tokens
    assert decode(tok, ids) == want
    assert decode(tok, ids, skip_special_tokens=False) == text
    d = IncrementalDetokenizer(tok)
    assert "".join([d.push([i]) for i in ids] + [d.flush()]) == want


# -- the middle's limits -------------------------------------------------------------------------------


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def run(cutter: MiddleCutter, pieces) -> str:
    out = []
    for p in pieces:
        out.append(cutter.push(p))
        if cutter.hit:
            break
    return "".join(out) + cutter.flush()


def test_n_indent_cuts_at_a_line_indented_less():
    c = MiddleCutter(n_indent=4)
    assert run(c, ["x = 1\n", "    y = 2\n", "  ", "z = 3\n", "w"]) == "x = 1\n    y = 2\n  "
    assert c.hit and c.stop_type == "limit"
    c = MiddleCutter(n_indent=4)  # blank lines and the first line do not count
    assert run(c, ["a\n", "\n", "    b\n"]) == "a\n\n    b\n" and not c.hit


def test_stop_words_and_time_limits():
    c = MiddleCutter(stops=("\n\n", "END"))
    assert run(c, ["a = 1", "\nEN", "D more"]) == "a = 1\n" and c.stop_type == "word" and c.stopping_word == "END"
    clock = Clock()
    c = MiddleCutter(t_max_predict_ms=100, clock=clock)
    out = [c.push("a")]
    clock.t = 0.2
    out.append(c.push("b"))  # past the limit but no new line yet
    assert not c.hit
    out.append(c.push("\nc"))
    assert c.hit and c.stop_type == "limit" and "".join(out) == "ab\nc"
    clock = Clock()
    c = MiddleCutter(t_max_prompt_ms=50, clock=clock)
    c.start()
    clock.t = 0.1
    assert c.push("x") == "" and c.hit and c.stop_type == "limit"


# -- request parsing -----------------------------------------------------------------------------------


@pytest.mark.parametrize("body, param", [
    ({"input_prefix": 1}, "input_prefix"), ({"input_extra": [{"file": "a"}]}, "input_extra"),
    ({"input_extra": "x"}, "input_extra"), ({"n_predict": -2}, "n_predict"), ({"mirostat": 2}, "mirostat"),
    ({"samplers": ["top_k", "top_p", "infill"]}, "samplers"), ({"samplers": ["top_p", "temperature"]}, "samplers"),
    ({"id_slot": 3}, "id_slot"), ({"return_tokens": True}, "return_tokens"), ({"cache_prompt": "yes"}, "cache_prompt"),
    ({"temperature": 3}, "temperature"), ({"stop": [1]}, "stop"), ({"lora": []}, "lora"),
    # JSON types, not Python's ==: 0.0 is not the integer 0, false is not 0, 0 is not false
    ({"id_slot": 0.0}, "id_slot"), ({"n_probs": False}, "n_probs"), ({"return_tokens": 0}, "return_tokens"),
    ({"seed": 1 << 64}, "seed"),  # the seeded sampler keys its noise by 64 bits: a larger seed would alias
])
def test_infill_refuses_bad_and_unimplemented_fields(body, param):
    with pytest.raises(RequestError) as e:
        parse_infill({"input_prefix": "a", **body})
    assert e.value.status == 400 and e.value.param == param


def test_infill_fields():
    r = parse_infill({"input_prefix": "a", "input_suffix": "b", "input_extra": EXTRA, "prompt": "c", "n_predict": 0,
                      "samplers": ["top_k", "top_p"], "top_k": 40, "top_p": 0.9, "t_max_predict_ms": 500,
                      "n_indent": 4, "seed": -1, "cache_prompt": False})
    assert r.fim == FimPrompt("a", "b", (("add.py", EXTRA[0]["text"]),), "c")
    assert r.evaluate_only and r.temperature == 1.0 and (r.top_k, r.top_p) == (40, 0.9) and r.seed is None
    assert r.t_max_predict_ms == 500 and r.n_indent == 4 and not r.cache_prompt
    assert parse_infill({"n_predict": -1}).until_context
    r = parse_infill({"samplers": ["top_k", "top_p", "infill"], "top_k": 40}, samplers="server")
    assert r.samplers_replaced and r.temperature is None and r.top_k == 40


@pytest.mark.parametrize("body, param", [
    ({}, "model"), ({"system": "be brief"}, "system"), ({"options": {"mirostat": 1}}, "options"),
    ({"images": ["x"]}, "images"), ({"keep_alive": 0}, "keep_alive"), ({"prompt": ""}, "prompt"),
    ({"stream": "no"}, "stream"), ({"suffix": 3}, "suffix"), ({"foo": 1}, "foo"),
    ({"options": []}, "options"), ({"options": 0}, "options"), ({"think": 0}, "think"),
    ({"options": {"seed": 1 << 64}}, "seed"),
    # keep_alive: a Go duration or seconds; any spelling of 0 asks to unload the model (not implemented)
    ({"keep_alive": "0h"}, "keep_alive"), ({"keep_alive": "0.0"}, "keep_alive"), ({"keep_alive": 0.0}, "keep_alive"),
    ({"keep_alive": "banana"}, "keep_alive"), ({"keep_alive": "5x"}, "keep_alive"), ({"keep_alive": ""}, "keep_alive"),
    ({"keep_alive": "inf"}, "keep_alive"), ({"keep_alive": True}, "keep_alive"),
])
def test_ollama_generate_refuses_bad_and_unimplemented_fields(body, param):
    with pytest.raises(RequestError) as e:
        parse_ollama_generate({"model": "m", "prompt": "def", **body} if body != {} else {"prompt": "x"})
    assert e.value.status == 400 and e.value.param == param


def test_ollama_generate_null_and_empty_fields_count_as_absent():
    r = parse_ollama_generate({"model": "m", "prompt": "def", "options": None, "think": False, "format": "",
                               "images": []})
    assert r.fim is None


def test_ollama_keep_alive_takes_go_durations_and_seconds():
    from edgespec.apps.fim_api import keep_alive_seconds

    assert [keep_alive_seconds(v) for v in ("5m", "1h30m", "300ms", "-1", "300", 1800, -1, "1.5h")] == \
        [300.0, 5400.0, 0.3, -1.0, 300.0, 1800.0, -1.0, 5400.0]
    for v in ("5m", "1h30m", "-1", 1800):  # accepted: the model stays loaded for the server's lifetime anyway
        parse_ollama_generate({"model": "m", "prompt": "def", "keep_alive": v})


def test_ollama_generate_fields():
    r = parse_ollama_generate({"model": "qwen2.5-coder:1.5b", "prompt": "a", "suffix": "b", "keep_alive": 1800,
                               "options": {"num_predict": 16, "temperature": 0, "stop": ["\n\n"], "num_ctx": 128,
                                           "min_p": None}})
    assert r.fim == FimPrompt("a", "b") and r.stream and r.max_tokens == 16 and r.num_ctx == 128
    assert r.stop == ("\n\n",) and r.temperature == 0


# -- the server ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tiny_fim_export, home, tmp_path_factory):
    from test_serve import Server

    s = Server(tiny_fim_export, home, tmp_path_factory.mktemp("serve_fim") / "server.log", "--infill-samplers",
               "server")
    yield s
    s.close()


def post_stream(server, path: str, body: dict) -> list[bytes]:
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.read().splitlines()


def test_infill_equals_plain_decoding_streamed_and_not(server, fim_api):
    n = 24
    want, reason = plain_middle(fim_api, FimPrompt(PREFIX, SUFFIX, (("add.py", EXTRA[0]["text"]),)), n)
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": EXTRA, "n_predict": n, "temperature": 0}
    status, r = server.post("/infill", json.dumps(body).encode())
    assert status == 200, r
    assert r["content"] == want and r["stop"] is True
    assert r["stop_type"] == ("eos" if reason == "stop_token" else "limit")
    assert r["tokens_evaluated"] > 0 and 0 < r["tokens_predicted"] <= n and r["tokens_cached"] >= 0
    t = r["timings"]
    assert t["predicted_n"] == r["tokens_predicted"] and t["prompt_ms"] >= 0 and t["prompt_n"] >= 0
    assert r["generation_settings"]["n_predict"] == n and r["model"] == "target+draft"
    events = [json.loads(line[len(b"data: "):]) for line in post_stream(server, "/infill", {**body, "stream": True})
              if line.startswith(b"data: ")]
    assert all(not e["stop"] for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == want
    assert events[-1]["tokens_predicted"] == r["tokens_predicted"]
    # the same request again: the prompt comes from the KV cache
    status, again = server.post("/infill", json.dumps(body).encode())
    assert again["content"] == want and again["tokens_cached"] == again["tokens_evaluated"] - 1


def test_infill_prompt_only_evaluation_then_reuse(server):
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": "", "n_predict": 0}
    status, r = server.post("/infill", json.dumps(body).encode())
    assert status == 200 and r["content"] == "" and r["tokens_predicted"] == 0
    assert r["generation_settings"]["n_predict"] == 0  # what was asked, not the server's default
    status, r = server.post("/infill", json.dumps({**body, "prompt": "        self", "n_predict": 4}).encode())
    assert status == 200 and r["tokens_cached"] >= r["tokens_evaluated"] - 6


def test_suffix_on_v1_completions(server, fim_api):
    want, _ = plain_middle(fim_api, FimPrompt(PREFIX, SUFFIX), 20)
    r = server.client.completions.create(model="target+draft", prompt=PREFIX, suffix=SUFFIX, max_tokens=20,
                                         temperature=0)
    assert r.choices[0].text == want
    stream = server.client.completions.create(model="target+draft", prompt=PREFIX, suffix=SUFFIX, max_tokens=20,
                                              temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in stream) == want


def test_ollama_generate_with_suffix_streamed_and_not(server, fim_api):
    want, _ = plain_middle(fim_api, FimPrompt(PREFIX, SUFFIX), 20)
    body = {"model": "qwen2.5-coder:1.5b", "prompt": PREFIX, "suffix": SUFFIX,
            "options": {"num_predict": 20, "temperature": 0}, "keep_alive": 1800}
    status, r = server.post("/api/generate", json.dumps({**body, "stream": False}).encode())
    assert status == 200, r
    assert r["response"] == want and r["done"] is True and r["done_reason"] in ("stop", "length")
    assert r["eval_count"] > 0 and r["prompt_eval_count"] > 0 and r["total_duration"] >= r["eval_duration"] >= 0
    lines = [json.loads(x) for x in post_stream(server, "/api/generate", body)]
    assert [x["done"] for x in lines] == [False] * (len(lines) - 1) + [True]
    assert "".join(x["response"] for x in lines) == want and lines[-1]["eval_count"] == r["eval_count"]


def test_ollama_tags(server):
    with urllib.request.urlopen(server.url + "/api/tags", timeout=10) as resp:
        tags = json.loads(resp.read())
    (m,) = tags["models"]
    assert m["name"] == m["model"] == "target+draft" and m["size"] > 0 and m["digest"].startswith("sha256:")
    assert m["details"]["family"] and m["details"]["quantization_level"] == "fp32"


@pytest.mark.parametrize("path, body", [
    ("/infill", b"{"), ("/infill", b"[1]"), ("/infill", b'{"input_prefix": "a", "frequency_penalty": 1}'),
    ("/infill", b'{"input_prefix": "a", "n_predict": 100000}'),
    ("/api/generate", b'{"model": "m", "prompt": "a", "options": {"num_predict": 9, "num_ctx": 4}}'),
    ("/api/generate", b'{"model": "m", "prompt": "a", "format": "json"}'),
    ("/v1/completions", b'{"prompt": [1, 2], "suffix": "x"}'),
])
def test_bad_requests_are_4xx_never_500(server, path, body):
    status, r = server.post(path, body)
    assert 400 <= status < 500, (status, r)
    assert "error" in r


def test_a_newer_infill_from_the_same_client_replaces_an_unfinished_one(server, fim_api):
    server.wait_idle()
    long = {"input_prefix": "def", "input_suffix": "\n", "n_predict": -1, "temperature": 0}
    _, reason = plain_middle(fim_api, FimPrompt("def", "\n"), 200)
    assert reason == "max_new_tokens"  # the tiny model's middle runs to the context's end: time to replace it
    first = {}

    def send():
        first["status"], first["body"] = server.post("/infill", json.dumps(long).encode())

    th = threading.Thread(target=send)
    th.start()
    deadline = time.time() + 60
    while not server.health()["running"]:
        assert time.time() < deadline
        time.sleep(0.005)
    status, r = server.post("/infill", json.dumps({**long, "n_predict": 4}).encode())
    th.join(60)
    assert status == 200 and r["tokens_predicted"] == 4
    assert first["status"] == 409 and "replaced" in first["body"]["error"]["message"], first
    assert server.wait_idle()["cancelled"] >= 1
    # cache_prompt false: no replacement and no KV reuse
    status, r = server.post("/infill", json.dumps({**long, "n_predict": 4, "cache_prompt": False}).encode())
    assert status == 200 and r["tokens_cached"] == 0


@pytest.fixture(scope="module")
def plain_server(tiny_export, home, tmp_path_factory):
    from test_serve import Server

    s = Server(tiny_export, home, tmp_path_factory.mktemp("serve_nofim") / "server.log")
    yield s
    s.close()


def test_llama_vscode_request_with_the_server_samplers(server, fim_api):
    """llama.vscode's request (src/llama-server.ts): its `samplers` names llama.cpp's `infill` sampler, which
    `--infill-samplers server` replaces by the server's own (greedy here), and says so."""
    want, _ = plain_middle(fim_api, FimPrompt(PREFIX, SUFFIX, (("add.py", EXTRA[0]["text"]),), "        self"), 16)
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": EXTRA, "prompt": "        self",
            "n_predict": 16, "top_k": 40, "top_p": 0.99, "stream": False, "samplers": ["top_k", "top_p", "infill"],
            "cache_prompt": True, "n_indent": 4, "t_max_prompt_ms": 500000, "t_max_predict_ms": 500000}
    status, r = server.post("/infill", json.dumps(body).encode())
    assert status == 200, r
    assert r["generation_settings"]["samplers_replaced"] is True and r["generation_settings"]["temperature"] == 0
    cut = MiddleCutter(n_indent=4)
    assert r["content"] == cut.push(want) + cut.flush()
    warm = {**body, "input_prefix": "", "input_suffix": "", "prompt": "", "n_predict": 0, "samplers": [],
            "t_max_predict_ms": 1}  # its context warm-up request
    assert server.post("/infill", json.dumps(warm).encode())[0] == 200


def test_a_pair_without_fim_tokens_gets_400(plain_server):
    for path, body in (("/infill", {"input_prefix": "a", "input_suffix": "b"}),
                       ("/api/generate", {"model": "m", "prompt": "a", "suffix": "b", "stream": False}),
                       ("/v1/completions", {"prompt": "a", "suffix": "b"})):
        status, r = plain_server.post(path, json.dumps(body).encode())
        assert status == 400 and "fill-in-the-middle" in json.dumps(r), (path, r)
    status, r = plain_server.post("/infill", json.dumps({"input_prefix": "a", "samplers": ["infill"]}).encode())
    assert status == 400 and "samplers" in r["error"]["message"]  # refused by default
    status, r = plain_server.post("/api/generate", json.dumps({"model": "m", "prompt": "def", "raw": True,
                                                              "stream": False,
                                                              "options": {"num_predict": 3}}).encode())
    assert status == 200 and r["done"] and r["eval_count"] == 3


# -- the command line ----------------------------------------------------------------------------------


def _cli(home, *args, stdin: str | None = None):
    return subprocess.run([sys.executable, "-m", "edgespec.cli", "complete", *map(str, args)], input=stdin,
                          capture_output=True, text=True, env=dict(os.environ, EDGESPEC_HOME=str(home)), timeout=300)


def test_complete_command_equals_plain_decoding(tiny_fim_export, home, fim_api, tmp_path):
    (tmp_path / "before.py").write_text(PREFIX)
    (tmp_path / "add.py").write_text(EXTRA[0]["text"])
    want, _ = plain_middle(fim_api, FimPrompt(PREFIX, SUFFIX, ((str(tmp_path / "add.py"), EXTRA[0]["text"]),)), 16)
    r = _cli(home, tiny_fim_export, "--prefix-file", tmp_path / "before.py", "--suffix-file", "-",
             "--extra-file", tmp_path / "add.py", "--max-new-tokens", 16, "--json", stdin=SUFFIX)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["text"] == want and out["stats"]["mode"] == "spec" and out["stats"]["new_tokens"] <= 16
    r = _cli(home, tiny_fim_export, "--prefix-text", PREFIX, "--suffix-text", SUFFIX, "--extra-file",
             tmp_path / "add.py", "--max-new-tokens", 16, "--mode", "plain")
    assert r.returncode == 0 and r.stdout == want, r.stderr


def test_complete_command_errors_are_one_line(tiny_export, tiny_fim_export, home, tmp_path):
    for args in ((tiny_export, "--prefix-text", "a"), (tiny_fim_export,),
                 (tiny_fim_export, "--prefix-file", tmp_path / "missing.py"),
                 (tiny_fim_export, "--prefix-file", "-", "--suffix-file", "-"),
                 (tiny_fim_export, "--prefix-file", "-", "--extra-file", "-")):  # stdin is read once
        r = _cli(home, *args)
        assert r.returncode == 2 and r.stderr.startswith("edgespec: error: ") and r.stderr.count("\n") == 1, r.stderr
    assert "fill-in-the-middle" in _cli(home, tiny_export, "--prefix-text", "a").stderr


# -- proposals -----------------------------------------------------------------------------------------


def test_lookup_and_suffix_trees_see_the_suffix_and_the_other_files(fim_api):
    from edgespec.draft.lookup import ngram_lookup
    from edgespec.draft.suffix import SuffixTree

    tok = fim_api.tokenizer
    t = fim_tokens(tok)
    line = "        self.value = value\n"
    enc = lambda text: tok.encode(text, add_special_tokens=False).ids  # noqa: E731
    in_suffix, in_file = enc(line + SUFFIX), enc(PREFIX + line)
    cases = ((FimPrompt(PREFIX, line + SUFFIX), in_suffix[:3], in_suffix[3:8]),
             (FimPrompt(PREFIX, SUFFIX, (("node.py", PREFIX + line),)), in_file[-8:-5], in_file[-5:]))
    for p, start, rest in cases:  # the middle has begun the line that the suffix (or another file) holds
        tokens = build_ids(tok, lambda: fim_api.plain_tokenizer, t, p) + start
        assert ngram_lookup(tokens, len(rest)) == rest
        tree, _, n = SuffixTree().candidates(tokens, 16)
        assert n >= 2 and tree.tokens[:len(rest)] == rest[:len(tree.tokens)]


# -- the real pair -------------------------------------------------------------------------------------


@pytest.mark.real
def test_real_pair_fills_in_the_middle(real_export):
    """Qwen2.5-Coder's FIM tokens at their ids (151659-151664), decoded as text; a one-line middle that the
    suffix determines, the default mode equal to plain decoding."""
    dec = SpecDecoder.load(real_export)
    tok = dec.tokenizer
    t = fim_tokens(tok)
    assert (t.prefix, t.middle, t.suffix, t.pad, t.repo_name, t.file_sep) == tuple(range(151659, 151665))
    assert decode(tok, [t.file_sep, 151657, t.prefix]) == "<|file_sep|><tool_call><|fim_prefix|>"
    p = FimPrompt("def area(width, height):\n    ", "\n\n\nprint(area(3, 4))\n")
    ids = build_ids(tok, lambda: dec.plain_tokenizer, t, p)
    dec.stop_ids = dec.stop_ids | t.stop_ids
    plain = dec.generate(input_ids=ids, max_new_tokens=24, proposers=()).run()
    dec.reset()
    spec = dec.generate(input_ids=ids, max_new_tokens=24, proposers=("lookup", "draft")).run()
    print(repr(plain.text), plain.stats.stop_reason)
    assert plain.stats.stop_reason == "stop_token" and "width * height" in plain.text
    assert spec.text == plain.text
