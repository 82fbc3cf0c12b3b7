"""llama.cpp server's API on ``edgespec serve`` (its tools/server/README.md: /completion, /tokenize, /detokenize,
/props, and the per-chunk counts of streamed /infill and /completion), by raw HTTP, on the tiny pair whose
tokenizer has Qwen2.5-Coder's FIM tokens (``tiny_fim_export``)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from edgespec.apps.llama_api import parse_completion, parse_detokenize, parse_tokenize
from edgespec.apps.request_error import RequestError

pytest.importorskip("starlette")

from test_serve import MODEL, Server  # noqa: E402

PROMPT = "def add(a, b):\n"
N_TOKENS = 408  # the tiny FIM tokenizer's ids


# -- request parsing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("body, param", [
    ({"prompt": None}, "prompt"), ({"prompt": ""}, "prompt"), ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": [1, 2, 999]}, "prompt"), ({"prompt": [1, True]}, "prompt"), ({"prompt": {"prompt_string": "a"}}, "prompt"),
    ({"n_predict": -2}, "n_predict"), ({"min_p": 0.05}, "min_p"), ({"repeat_penalty": 1.1}, "repeat_penalty"),
    ({"mirostat": 2}, "mirostat"), ({"ignore_eos": True}, "ignore_eos"), ({"n_probs": 3}, "n_probs"),
    ({"logit_bias": [[1, 2.0]]}, "logit_bias"), ({"grammar": 3}, "grammar"), ({"json_schema": "{}"}, "json_schema"),
    ({"grammar": "root ::= \"a\"", "json_schema": {}}, "grammar"), ({"return_tokens": 1}, "return_tokens"),
    ({"input_prefix": "x"}, "input_prefix"), ({"foo": 1}, "foo"), ({"samplers": ["min_p"]}, "samplers"),
    ({"seed": 1 << 64}, "seed"), ({"temperature": 3}, "temperature"), ({"stream": "yes"}, "stream"),
])
def test_completion_refuses_bad_and_unimplemented_fields(body, param):
    with pytest.raises(RequestError) as e:
        parse_completion({"prompt": PROMPT, **body}, N_TOKENS)
    assert e.value.status == 400 and e.value.param == param


def test_completion_fields():
    r = parse_completion({"prompt": PROMPT, "n_predict": 8, "temperature": 0, "stop": ["\n\n"], "stream": True,
                          "cache_prompt": False, "json_schema": {"type": "object"}, "return_tokens": True,
                          "min_p": 0, "repeat_penalty": 1.0, "n_indent": 4, "seed": -1, "id_slot": -1}, N_TOKENS)
    assert r.fim is None and r.prompt == PROMPT and r.prompt_parts == () and r.max_tokens == 8 and r.stream
    assert r.stop == ("\n\n",) and not r.cache_prompt and r.grammar == ("json_schema", {"type": "object"})
    assert r.return_tokens and r.n_indent == 4 and r.seed is None and r.temperature == 0
    assert parse_completion({"prompt": [1, 2, "x", 3]}, N_TOKENS).prompt_parts == ((1, 2), "x", (3,))
    assert parse_completion({"prompt": [[5, 6]]}, N_TOKENS).prompt_parts == ((5, 6),)
    assert parse_completion({"prompt": ["one"]}, N_TOKENS).prompt == "one"
    r = parse_completion({"prompt": "x", "n_predict": 0, "grammar": "root ::= \"yes\""}, N_TOKENS)
    assert r.evaluate_only and r.grammar == ("gbnf", "root ::= \"yes\"")
    assert parse_completion({"prompt": "x", "n_predict": -1}, N_TOKENS).until_context


def test_tokenize_and_detokenize_fields():
    assert parse_tokenize({"content": "a"}) == ("a", False, True, False)
    assert parse_tokenize({"content": "a", "add_special": True, "parse_special": False, "with_pieces": True}) == \
        ("a", True, False, True)
    for body in ({}, {"content": 1}, {"content": "a", "with_pieces": "yes"}, {"content": "a", "x": 1},
                 {"content": "a", "parse_special": 0}):
        with pytest.raises(RequestError):
            parse_tokenize(body)
    assert parse_detokenize({"tokens": [1, 2]}, N_TOKENS) == [1, 2]
    for body in ({"tokens": [N_TOKENS]}, {"tokens": ["a"]}, {"tokens": 3}, {"tokens": [1], "x": 2}):
        with pytest.raises(RequestError):
            parse_detokenize(body, N_TOKENS)


# -- the server --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tiny_fim_export, home, tmp_path_factory):
    s = Server(tiny_fim_export, home, tmp_path_factory.mktemp("serve") / "llama.log")
    yield s
    s.close()


def post(server, path: str, body: dict) -> dict:
    status, r = server.post(path, json.dumps(body).encode())
    assert status == 200, r
    return r


def stream(server, path: str, body: dict) -> list[dict]:
    req = urllib.request.Request(server.url + path, data=json.dumps({**body, "stream": True}).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        lines = r.read().decode().splitlines()
    return [json.loads(x[len("data: "):]) for x in lines if x.startswith("data: ")]


def check_counts(chunks: list[dict]) -> None:
    """Every chunk counts the tokens generated so far; their ids add up to that count."""
    seen = 0
    for c in chunks[:-1]:
        seen += len(c.get("tokens", [])) if "tokens" in c else 0
        assert c["stop"] is False and c["tokens_predicted"] > 0 and c["tokens_evaluated"] > 0
        if "tokens" in c:
            assert c["tokens_predicted"] == seen
    preds = [c["tokens_predicted"] for c in chunks]
    assert preds == sorted(preds) and chunks[-1]["stop"] is True and preds[-1] == chunks[-1]["timings"]["predicted_n"]


def test_completion_equals_v1_completions_streamed_and_not(server):
    body = {"prompt": PROMPT, "n_predict": 24, "temperature": 0}
    whole = post(server, "/completion", {**body, "return_tokens": True})
    v1 = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 24, "temperature": 0})
    assert whole["content"] == v1["choices"][0]["text"] and whole["stop"] is True
    assert whole["tokens_predicted"] == len(whole["tokens"]) == v1["usage"]["completion_tokens"]
    assert whole["stop_type"] in ("eos", "limit") and whole["model"] == MODEL and whole["prompt"] == PROMPT
    assert whole["tokens_evaluated"] == v1["usage"]["prompt_tokens"] and whole["generation_settings"]["n_predict"] == 24
    chunks = stream(server, "/completion", body)
    assert "".join(c["content"] for c in chunks) == whole["content"]
    check_counts(chunks)
    assert [t for c in chunks[:-1] for t in c["tokens"]] == whole["tokens"][:sum(len(c["tokens"]) for c in chunks[:-1])]
    # the prompt as token ids, and as ids mixed with text, is the same prompt
    ids = post(server, "/tokenize", {"content": PROMPT})["tokens"]
    assert post(server, "/completion", {**body, "prompt": ids})["content"] == whole["content"]
    assert post(server, "/completion", {**body, "prompt": ids[:2] + [post(server, "/detokenize", {
        "tokens": ids[2:]})["content"]]})["content"] == whole["content"]


def test_streamed_infill_counts_each_chunk(server):
    chunks = stream(server, "/infill", {"input_prefix": PROMPT, "input_suffix": "\n", "n_predict": 16,
                                        "temperature": 0})
    check_counts(chunks)


def test_stop_words_cache_prompt_and_evaluate_only(server):
    r = post(server, "/completion", {"prompt": PROMPT * 3, "n_predict": 0})
    assert r["content"] == "" and r["tokens_predicted"] == 0
    r = post(server, "/completion", {"prompt": PROMPT * 3, "n_predict": 4, "temperature": 0})
    assert r["tokens_cached"] == r["tokens_evaluated"] - 1  # the prompt was evaluated into the cache before
    r = post(server, "/completion", {"prompt": PROMPT * 3, "n_predict": 4, "temperature": 0, "cache_prompt": False})
    assert r["tokens_cached"] == 0
    whole = post(server, "/completion", {"prompt": PROMPT, "n_predict": 24, "temperature": 0})["content"]
    word = whole.strip()[len(whole.strip()) // 2:][:2]
    r = post(server, "/completion", {"prompt": PROMPT, "n_predict": 24, "temperature": 0, "stop": [word]})
    assert r["stop_type"] == "word" and r["stopping_word"] == word and r["content"] == whole[:whole.index(word)]


def test_grammar_and_json_schema(server):
    pytest.importorskip("llguidance")
    r = post(server, "/completion", {"prompt": PROMPT, "n_predict": 8, "grammar": 'root ::= "yes" | "no"'})
    assert r["content"] in ("yes", "no") and r["stop_type"] == "eos"
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = post(server, "/completion", {"prompt": PROMPT, "n_predict": 32, "temperature": 0, "json_schema": schema})
    assert isinstance(json.loads(r["content"])["ok"], bool)
    chunks = stream(server, "/completion", {"prompt": PROMPT, "n_predict": 32, "temperature": 0,
                                            "json_schema": schema})
    assert "".join(c["content"] for c in chunks) == r["content"]


def test_tokenize_detokenize(server):
    text = "x = 1<|im_end|>"
    special = post(server, "/tokenize", {"content": text})["tokens"]
    plain = post(server, "/tokenize", {"content": text, "parse_special": False})["tokens"]
    assert len(plain) > len(special) and post(server, "/detokenize", {"tokens": special})["content"] == text
    pieces = post(server, "/tokenize", {"content": "ü=1", "with_pieces": True})["tokens"]
    assert [p["id"] for p in pieces] == post(server, "/tokenize", {"content": "ü=1"})["tokens"]
    assert "".join(p["piece"] if isinstance(p["piece"], str) else bytes(p["piece"]).decode("latin-1")
                   for p in pieces).endswith("=1")
    assert post(server, "/tokenize", {"content": ""})["tokens"] == []


def test_props(server):
    with urllib.request.urlopen(server.url + "/props", timeout=30) as r:
        p = json.loads(r.read())
    s = p["default_generation_settings"]
    assert s["n_ctx"] == 256 and p["total_slots"] == 1 and p["chat_template"] and "params" in s
    assert s["speculative"] is True and p["eos_token"] == "<|im_end|>" and p["model_path"]


@pytest.mark.parametrize("method, path, body, status", [
    ("POST", "/completion", b"{", 400), ("POST", "/completion", b"[1]", 400),
    ("POST", "/completion", b'{"prompt": "a", "min_p": 0.1}', 400),
    ("POST", "/completion", b'{"prompt": "a", "grammar": "root ::= ("}', 400),
    ("POST", "/completion", b'{"prompt": "a", "json_schema": {"type": "nonsense"}}', 400),
    ("POST", "/completion", b'{"prompt": "a", "n_predict": 100000}', 400),
    ("POST", "/completion", b'{"prompt": [1, 99999]}', 400),
    ("POST", "/tokenize", b'{"content": 1}', 400), ("POST", "/detokenize", b'{"tokens": [-1]}', 400),
    ("POST", "/props", b"{}", 501), ("GET", "/completion", b"", 405), ("DELETE", "/tokenize", b"", 405),
])
def test_errors_are_llamacpp_error_objects(server, method, path, body, status):
    req = urllib.request.Request(server.url + path, data=body if method != "GET" else None, method=method,
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    r = json.loads(e.value.read())
    assert e.value.code == status and set(r["error"]) == {"code", "message", "type"} and r["error"]["code"] == status
    assert r["error"]["type"] == ("not_supported_error" if status == 501 else "invalid_request_error")
    assert server.health()["running"] is False


def test_completion_prompt_gets_bos_as_llamacpps():
    """A tokenizer that puts <bos> in front of a text (Gemma's, Llama 3's): a string prompt gets it, and of a
    prompt given in parts only the first part, when it is a string (llama.cpp's ``tokenize_mixed``)."""
    from types import SimpleNamespace

    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from edgespec.apps.llama_serve import completion_ids
    from edgespec.io.encoding import PromptEncoder

    tok = Tokenizer(models.WordLevel({"<bos>": 0, "a": 1, "b": 2}, unk_token="a"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 0)])
    enc = PromptEncoder(tok)
    dec = SimpleNamespace(tokenizer=tok, encode=lambda prompt: enc.encode(prompt=prompt))

    def ids(prompt):
        return completion_ids(dec, parse_completion({"prompt": prompt}, 3))

    assert ids("a b") == [0, 1, 2]
    assert ids(["a", 2, "b"]) == [0, 1, 2, 2]
    assert ids([1, "b a"]) == [1, 2, 1]
