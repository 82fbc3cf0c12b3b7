"""``edgespec serve`` on a tiny export, driven over loopback by the real ``openai`` client and by raw HTTP."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from edgespec.engine.decoder import SpecDecoder
from edgespec.apps.openai_api import RequestError, StopMatcher, parse_chat, parse_completion

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

CTX = 256  # the tiny models' context


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """An ``edgespec serve`` subprocess on a free loopback port."""

    def __init__(self, export, home, log, *args):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, EDGESPEC_HOME=str(home))
        self.log = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "edgespec.cli", "serve", str(export), "--port",
                                      str(self.port), *args], env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while True:
            assert self.proc.poll() is None, open(log).read()
            try:
                self.health()
                break
            except OSError:
                assert time.time() < deadline, "server did not come up"
                time.sleep(0.2)
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, timeout=120)

    def health(self) -> dict:
        with urllib.request.urlopen(self.url + "/health", timeout=10) as r:
            return json.loads(r.read())

    def post(self, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
        req = urllib.request.Request(self.url + path, data=body, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def wait_idle(self, timeout: float = 60) -> dict:
        deadline = time.time() + timeout
        while True:
            h = self.health()
            if not h["running"] and not h["waiting"]:
                return h
            assert time.time() < deadline, h
            time.sleep(0.05)

    def close(self):
        """Ctrl-C: a clean stop (exit 130 as for any interrupted command), no traceback in the log."""
        self.proc.send_signal(signal.SIGINT)
        assert self.proc.wait(timeout=30) in (0, 130)
        self.log.close()
        log = open(self.log.name).read()
        assert "Traceback" not in log, log


@pytest.fixture(scope="module")
def server(tiny_export, home, tmp_path_factory):
    s = Server(tiny_export, home, tmp_path_factory.mktemp("serve") / "server.log", "--max-queue", "1")
    yield s
    s.close()


@pytest.fixture(scope="module")
def api(tiny_export):
    return SpecDecoder.load(tiny_export, load_draft=False)


def greedy(api, messages=None, prompt=None, n=40) -> str:
    """The target's own greedy text (plain decoding, fresh caches)."""
    api.reset()
    return api.generate(prompt, messages=messages, max_new_tokens=n, proposers=()).run().text


MODEL = "target+draft"


def test_models_and_health(server):
    assert [m.id for m in server.client.models.list().data] == [MODEL]
    h = server.health()
    assert h["status"] == "ok" and h["context_length"] == CTX and h["max_queue"] == 1


def test_streamed_deltas_equal_the_non_streamed_text(server, api):
    msgs = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def add"}]
    want = greedy(api, msgs)
    r = server.client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=40, temperature=0)
    assert r.choices[0].message.content == want and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "length"
    u = r.usage
    assert u.completion_tokens == 40 and u.prompt_tokens == len(api.encode(messages=msgs))
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    ext = r.model_extra["edgespec"]
    assert 0 <= ext["alpha"] <= 1 and ext["mean_k"] >= 0 and ext["tokens_per_s"] > 0 and ext["rounds"] >= 1
    stream = server.client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=40, temperature=0,
                                                   stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 40 and not chunks[-1].choices


def test_text_completions_and_stop_strings(server, api):
    want = greedy(api, prompt="class Node", n=30)
    r = server.client.completions.create(model=MODEL, prompt="class Node", max_tokens=30, temperature=0)
    assert r.choices[0].text == want
    cut = want[len(want) // 2:len(want) // 2 + 2]
    assert cut and cut in want
    r = server.client.completions.create(model=MODEL, prompt="class Node", max_tokens=30, temperature=0, stop=[cut])
    assert r.choices[0].text == want[:want.index(cut)] and r.choices[0].finish_reason == "stop"
    s = server.client.completions.create(model=MODEL, prompt="class Node", max_tokens=30, temperature=0,
                                         stop=cut, stream=True)
    assert "".join(c.choices[0].text for c in s) == want[:want.index(cut)]


def test_multi_turn_reuses_the_kv_cache(server, api):
    msgs = [{"role": "user", "content": "for i in range(10):"}]
    r1 = server.client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, temperature=0)
    msgs += [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "again"}]
    r2 = server.client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, temperature=0)
    assert r2.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens - 1
    assert r2.choices[0].message.content == greedy(api, msgs, n=12)  # reuse changes nothing in the output


@pytest.fixture(scope="module")
def fixed_server(tiny_export, home, tmp_path_factory):
    """A server with a fixed K (no timing-driven choices)."""
    s = Server(tiny_export, home, tmp_path_factory.mktemp("serve") / "fixed.log", "--k", "3")
    yield s
    s.close()


def test_sampling_with_a_seed_repeats_at_a_fixed_k(fixed_server):
    """The same seed gives the same text when K is fixed (adaptive K picks K from measured times, and another
    K schedule draws other random numbers: the same distribution, not the same text)."""
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=20, temperature=0.9,
              top_p=0.95, seed=7)
    a = fixed_server.client.chat.completions.create(**kw).choices[0].message.content
    b = fixed_server.client.chat.completions.create(**kw).choices[0].message.content
    assert a == b
    kw["seed"] = 8
    texts = {fixed_server.client.chat.completions.create(**{**kw, "seed": s}).choices[0].message.content
             for s in range(8, 12)}
    assert len(texts) > 1  # the seed is used
    with pytest.raises(openai.BadRequestError) as e:  # a budget needs adaptive K
        fixed_server.client.chat.completions.create(**kw, extra_body={"edgespec": {"latency_budget_ms": 50}})
    assert e.value.body["param"] == "edgespec.latency_budget_ms"


def test_two_concurrent_clients_both_correct(server, api):
    prompts = ["def add", "The quick brown fox"]
    want = {p: greedy(api, [{"role": "user", "content": p}], n=60) for p in prompts}
    got = {}

    def ask(p):
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
        got[p] = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": p}], max_tokens=60,
                                           temperature=0).choices[0].message.content

    threads = [threading.Thread(target=ask, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got == want


def _long_stream(server):
    """A streamed greedy reply that runs to the context (a second or so on the tiny pair)."""
    return server.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "def add"}],
                                                 max_tokens=CTX - 30, temperature=0, stream=True)


def test_disconnect_mid_stream_frees_the_server(server, api):
    before = server.wait_idle()
    stream = _long_stream(server)
    first = [next(iter(stream)) for _ in range(3)]
    assert first[1].choices[0].delta.content is not None
    stream.close()  # the client goes away mid-reply
    after = server.wait_idle()
    assert after["cancelled"] == before["cancelled"] + 1 and after["completed"] == before["completed"]
    msgs = [{"role": "user", "content": "hi"}]
    r = server.client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=20, temperature=0)
    assert r.choices[0].message.content == greedy(api, msgs, n=20)


def test_a_client_that_leaves_before_a_non_streamed_reply_frees_the_server(server):
    before = server.wait_idle()
    body = json.dumps({"messages": [{"role": "user", "content": "def add"}], "max_tokens": CTX - 30}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.time() + 30
        while not server.health()["running"]:  # generating now; then the client leaves
            assert time.time() < deadline
    after = server.wait_idle()
    assert after["cancelled"] == before["cancelled"] + 1 and after["completed"] == before["completed"]


def test_the_queue_bound_counts_a_job_an_idle_worker_has_not_taken_yet_as_running():
    """``--max-queue 1``: one job runs and one waits. Two requests that reach an idle server before its worker
    takes the first are both accepted (the race that made two concurrent clients see a 429); a third is not."""
    import asyncio
    import types

    from edgespec.apps import serve

    engine = serve.Engine(types.SimpleNamespace(manifest=None, context_length=64), {}, max_queue=1)
    engine.stop()
    engine._thread.join(5)  # no worker: submitted jobs stay queued, as in the instant before it takes one
    assert not engine._thread.is_alive()
    loop = asyncio.new_event_loop()
    try:
        def job():
            return serve.Job(ids=[1], overrides={}, stops=(), budget_ms=None, loop=loop)

        engine.submit(job())
        engine.submit(job())
        with pytest.raises(RequestError) as e:
            engine.submit(job())
        assert e.value.status == 429 and engine.counts["rejected"] == 1
        engine.running, engine.waiting = True, 0  # a job runs: max_queue may wait
        engine.submit(job())
        with pytest.raises(RequestError):
            engine.submit(job())
        assert engine.counts["rejected"] == 2
    finally:
        loop.close()


def test_a_full_queue_gets_429(server):
    server.wait_idle()
    running = _long_stream(server)
    chunks = iter(running)
    while not next(chunks).choices[0].delta.content:  # text has come: the worker is on it
        pass
    waited = []
    waiting = threading.Thread(target=lambda: waited.append(server.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5)))
    waiting.start()
    deadline = time.time() + 30
    while server.health()["waiting"] < 1:
        assert time.time() < deadline
        time.sleep(0.01)
    with pytest.raises(openai.RateLimitError) as e:
        server.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5)
    assert e.value.body["code"] == "rate_limit_exceeded"
    running.close()
    waiting.join(60)
    assert waited and waited[0].usage.completion_tokens == 5  # the one that waited was served
    assert server.wait_idle()["rejected"] >= 1


def _chat(**kw) -> bytes:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **kw}).encode()


BAD = [
    ("malformed JSON", "/v1/chat/completions", b'{"messages": [', 400),
    ("not an object", "/v1/chat/completions", b"[1, 2]", 400),
    ("invalid UTF-8", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 400),
    ("lone surrogate", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud800"}]}', 400),
    ("no messages", "/v1/chat/completions", b"{}", 400),
    ("empty messages", "/v1/chat/completions", _chat(messages=[]), 400),
    ("messages not a list", "/v1/chat/completions", _chat(messages="hi"), 400),
    ("message not an object", "/v1/chat/completions", _chat(messages=["hi"]), 400),
    ("unknown role", "/v1/chat/completions", _chat(messages=[{"role": "wizard", "content": "hi"}]), 400),
    ("content not text", "/v1/chat/completions", _chat(messages=[{"role": "user", "content": 5}]), 400),
    ("max_tokens 0", "/v1/chat/completions", _chat(max_tokens=0), 400),
    ("max_tokens negative", "/v1/chat/completions", _chat(max_tokens=-3), 400),
    ("max_tokens a string", "/v1/chat/completions", _chat(max_tokens="5"), 400),
    ("max_tokens a bool", "/v1/chat/completions", _chat(max_tokens=True), 400),
    ("max_tokens over the context", "/v1/chat/completions", _chat(max_tokens=CTX), 400),
    ("prompt over the context", "/v1/chat/completions",
     _chat(messages=[{"role": "user", "content": "fox " * 400}]), 400),
    ("temperature a string", "/v1/chat/completions", _chat(temperature="hot"), 400),
    ("temperature negative", "/v1/chat/completions", _chat(temperature=-1), 400),
    ("top_p zero", "/v1/chat/completions", _chat(top_p=0), 400),
    ("seed a float", "/v1/chat/completions", _chat(seed=1.5), 400),
    ("seed negative", "/v1/chat/completions", _chat(seed=-1, stream=True), 400),
    ("deeply nested JSON", "/v1/chat/completions", b"[" * 100000 + b"]" * 100000, 400),
    ("stream a string", "/v1/chat/completions", _chat(stream="yes"), 400),
    ("stop a number", "/v1/chat/completions", _chat(stop=5), 400),
    ("five stops", "/v1/chat/completions", _chat(stop=["a", "b", "c", "d", "e"]), 400),
    ("n = 2", "/v1/chat/completions", _chat(n=2), 400),
    ("budget negative", "/v1/chat/completions", _chat(edgespec={"latency_budget_ms": -5}), 400),
    ("empty prompt", "/v1/completions", b'{"prompt": ""}', 400),
    ("prompt ids out of range", "/v1/completions", b'{"prompt": [1, 99999]}', 400),
    ("batched prompts", "/v1/completions", b'{"prompt": ["a", "b"]}', 400),
    ("unknown path", "/v1/embeddings", b"{}", 404),
]


@pytest.mark.parametrize("what,path,body,status", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_a_4xx_error_object(server, what, path, body, status):
    code, out = server.post(path, body)
    assert code == status, out
    err = out["error"]
    assert isinstance(err["message"], str) and err["message"] and err["type"]
    assert server.health()["status"] == "ok"


def _raw(server, head: bytes, body: bytes) -> tuple[int, dict]:
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(head + body)
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            got = s.recv(65536)
            if not got:
                break
            data += got
    status = int(data.split(b" ", 2)[1])
    return status, json.loads(data.split(b"\r\n\r\n", 1)[1])


def test_a_body_over_the_limit_is_413_before_it_is_read(server):
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (5 << 20))
    status, out = _raw(server, head, b'{"pad": "xxxx')  # declared 5 MiB; the server does not wait for it
    assert status == 413 and out["error"]["code"] == "request_too_large"
    chunked = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    piece = b"x" * (1 << 20)
    body = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(5)) + b"0\r\n\r\n"
    status, out = _raw(server, chunked, body)  # no declared length: counted while read
    assert status == 413
    assert server.health()["status"] == "ok"


def test_bad_input_through_the_client(server):
    with pytest.raises(openai.BadRequestError) as e:
        server.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=CTX + 1)
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError):
        server.client.embeddings.create(model=MODEL, input="hi")
    assert server.health()["failed"] == 0


def test_wrong_method_is_405(server):
    req = urllib.request.Request(server.url + "/v1/chat/completions", method="GET")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 405 and "error" in json.loads(e.value.read())


# -- the wire format alone (no server) --------------------------------------------------------------


def test_parse_chat_maps_roles_and_text_parts():
    r = parse_chat({"messages": [{"role": "developer", "content": "be brief"},
                                 {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text",
                                                                                              "text": "b"}]},
                                 {"role": "assistant", "content": None}], "max_tokens": 3, "stop": "x"})
    assert r.messages == ({"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"},
                          {"role": "assistant", "content": ""})
    assert r.max_tokens == 3 and r.stop == ("x",) and r.temperature is None
    with pytest.raises(RequestError) as e:
        parse_chat({"messages": [{"role": "tool", "content": "x"}]})
    assert e.value.status == 400 and e.value.param == "messages"
    assert parse_completion({"prompt": [3, 4]}, 10).prompt_ids == (3, 4)


@pytest.mark.parametrize("pieces,stops,want", [
    (["ab", "c<", "/d", "e"], ("</d",), "abc"),
    (["hello wor", "ld"], ("xyz",), "hello world"),
    (["a", "b", "c"], ("bc", "c"), "a"),
    (["<", "x"], ("<y",), "<x"),
])
def test_stop_matcher(pieces, stops, want):
    m = StopMatcher(stops)
    out = "".join(m.push(p) for p in pieces)
    out += m.flush() if not m.hit else ""
    assert out == want


def test_a_latency_budget_per_request(server, api):
    msgs = [{"role": "user", "content": "def add"}]
    r = server.client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=20, temperature=0,
                                              extra_body={"edgespec": {"latency_budget_ms": 50}})
    assert r.model_extra["edgespec"]["latency_budget_ms"] == 50
    assert r.choices[0].message.content == greedy(api, msgs, n=20)  # a budget changes speed, not text
    r = server.client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=5, temperature=0)
    assert r.model_extra["edgespec"]["latency_budget_ms"] is None  # the server's own (none) again


def _rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_bounded_load_gets_no_error_but_429_and_memory_stays_bounded(server):
    """64 requests from 4 threads (streamed and not, greedy and sampled) against a queue of 1; see
    bench/serve_load.py for the timed version."""
    before = server.wait_idle()
    outcomes, rss, lock = [], [_rss_mb(server.proc.pid)], threading.Lock()
    todo = iter(range(64))

    def worker():
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
        while (i := next(todo, None)) is not None:
            kw = dict(model=MODEL, messages=[{"role": "user", "content": f"part {i % 5}"}], max_tokens=16,
                      temperature=0.8 if i % 3 == 0 else 0.0, seed=i)
            try:
                if i % 2:
                    text = "".join(ch.choices[0].delta.content or "" for ch in
                                   c.chat.completions.create(stream=True, **kw) if ch.choices)
                else:
                    text = c.chat.completions.create(**kw).choices[0].message.content
                out = "ok" if isinstance(text, str) else "bad"
            except openai.RateLimitError:
                out = "429"
            except Exception as e:
                out = repr(e)
            with lock:
                outcomes.append(out)
                rss.append(_rss_mb(server.proc.pid))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(outcomes) == 64 and set(outcomes) <= {"ok", "429"}, [o for o in outcomes if o not in ("ok", "429")]
    assert outcomes.count("ok") >= 4  # a client that gets 429 asks again at once: most are refused
    assert max(rss[-16:]) < max(rss[:16]) + 64, rss  # MB: no growth with the number of requests
    h = server.wait_idle()
    assert h["failed"] == 0 and h["completed"] - before["completed"] == outcomes.count("ok")
    assert h["rejected"] - before["rejected"] == outcomes.count("429")


def test_a_port_in_use_is_one_line(tiny_export, home):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = subprocess.run([sys.executable, "-m", "edgespec.cli", "serve", str(tiny_export), "--port",
                            str(s.getsockname()[1])], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, EDGESPEC_HOME=str(home)))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("edgespec: error: cannot listen on 127.0.0.1:")
