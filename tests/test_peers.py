"""The peers benchmark's offline parts (bench/peers.py, bench/llama_server.py, bench/peers_build.py): llama-server
timings parsing, a fake llama-server on loopback, the interleaved run and its summary, GGUF lookup, and the
build's flags and cache reuse — without building llama.cpp."""

import json
import os
import stat
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import peers  # noqa: E402
import peers_build  # noqa: E402
from llama_server import LlamaServer, PeerError, PeerMode, parse_completion  # noqa: E402

from edgespec.errors import EdgespecError  # noqa: E402
from edgespec.bench.prompts import Prompt  # noqa: E402


def _timings(**kw):
    t = {"cache_n": 0, "prompt_n": 50, "prompt_ms": 500.0, "predicted_n": 11, "predicted_ms": 1000.0}
    t.update(kw)
    return {"timings": t, "tokens": list(range(11)), "stop_type": "limit"}


def test_parse_completion_rates():
    rec = parse_completion(_timings(draft_n=20, draft_n_accepted=15), prompt_tokens=50)
    assert rec["prefill_tok_s"] == pytest.approx(100.0)
    assert rec["decode_tok_s"] == pytest.approx(10.0)  # 10 tokens after the first, in 1 s
    assert rec["e2e_tok_s"] == pytest.approx(11 / 1.5)
    assert rec["alpha"] == pytest.approx(0.75)
    assert rec["tokens"] == list(range(11)) and rec["new_tokens"] == 11
    assert parse_completion(_timings(), 50)["alpha"] is None


def test_parse_completion_rejects_bad_answers():
    with pytest.raises(PeerError, match="timings"):
        parse_completion({"content": "x"}, 50)
    with pytest.raises(PeerError, match="timings"):
        parse_completion({"timings": {"prompt_n": 50}}, 50)
    with pytest.raises(PeerError, match="prefilled 10 tokens"):
        parse_completion(_timings(prompt_n=10, cache_n=40), 50)


def test_peer_modes_and_flags(tmp_path):
    t, d = tmp_path / "t.gguf", tmp_path / "d.gguf"
    assert PeerMode.parse("draft8").draft_n_max == 8 and PeerMode.parse("draft").draft_n_max == 3
    args = PeerMode.parse("draft8").server_args(t, d, threads=2, ctx=4096)
    assert args[args.index("-md") + 1] == str(d) and args[args.index("--spec-draft-n-max") + 1] == "8"
    assert args[args.index("--spec-type") + 1] == "draft-simple" and args[args.index("-t") + 1] == "2"
    ngram = PeerMode.parse("ngram").server_args(t, d, 2, 4096)
    assert ngram[ngram.index("--spec-type") + 1] == "ngram-simple" and "-md" not in ngram
    assert "--spec-type" not in PeerMode.parse("plain").server_args(t, d, 2, 4096)
    for bad in ("draft0", "eagle", "draftx"):
        with pytest.raises(ValueError):
            PeerMode.parse(bad)


FAKE_SERVER = '''
import json, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
spec = "--spec-type" in args
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
    def do_GET(self):
        self._send(200, {"status": "ok"})
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert req["cache_prompt"] is False and req["temperature"] == 0.0
        n = req["n_predict"]
        t = {"cache_n": 0, "prompt_n": len(req["prompt"]), "prompt_ms": 10.0 * len(req["prompt"]),
             "predicted_n": n, "predicted_ms": 100.0 * (n - 1) / (2 if spec else 1)}
        if spec:
            t.update(draft_n=2 * n, draft_n_accepted=n)
        toks = [sum(req["prompt"]) % 7 + i for i in range(n)]
        if spec and req["prompt"][0] == 2:
            toks[-1] += 1  # diverges from plain on prompt 2
        self._send(200, {"timings": t, "tokens": toks})
HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def _fake_binary(tmp_path, body):
    path = tmp_path / "llama-server"
    path.write_text(f"#!{sys.executable}\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_fake_server_on_loopback(tmp_path):
    binary = _fake_binary(tmp_path, FAKE_SERVER)
    with LlamaServer(binary, PeerMode.parse("draft").server_args(Path("t"), Path("d"), 2, 4096),
                     tmp_path / "srv.log", start_timeout_s=30) as srv:
        rec = srv.complete([1, 2, 3, 4], 5)
        proc = srv.proc
    assert proc.poll() is not None  # stopped on exit
    assert rec["prompt_tokens"] == 4 and rec["prefill_tok_s"] == pytest.approx(100.0)
    assert rec["decode_tok_s"] == pytest.approx(20.0) and rec["alpha"] == pytest.approx(0.5)
    assert rec["client_wall_ms"] > 0


def test_server_that_exits_is_a_clear_error(tmp_path):
    binary = _fake_binary(tmp_path, "import sys; print('bad flag'); sys.exit(3)\n")
    with pytest.raises(PeerError, match="exited with 3"):
        with LlamaServer(binary, [], tmp_path / "srv.log", start_timeout_s=30):
            pass
    assert "bad flag" in (tmp_path / "srv.log").read_text()
    with pytest.raises(PeerError, match="cannot start"):
        with LlamaServer(tmp_path / "missing", [], tmp_path / "srv.log"):
            pass


class FakeRunner:
    """An edgespec-like runner whose rates are a fixed function of (mode, prompt), logging the call order."""

    def __init__(self, runtime, mode, decode, calls):
        self.runtime, self.mode_name, self.decode, self.calls = runtime, mode, decode, calls
        self.n = 0

    def run(self, i, prompt, ids, max_new_tokens):
        self.calls.append((i, peers.label(self)))
        self.n += 1
        d = self.decode * (1 + i) * (1.0 + 0.1 * (self.n % 3))  # repeats differ: median must be picked
        rec = {"prompt_tokens": len(ids), "new_tokens": max_new_tokens, "decode_tok_s": d, "e2e_tok_s": d / 2,
               "prefill_tok_s": 100.0, "ttft_ms": 10.0}
        if self.runtime == peers.EDGESPEC:
            rec.update(accepted=3, evaluated=4)
        return rec


def test_interleave_rotates_and_summarizes(tmp_path):
    calls = []
    prompts = [Prompt("code", ({"role": "user", "content": "a"},)), Prompt("chat", ({"role": "user", "content": "b"},))]
    runners = [FakeRunner(peers.EDGESPEC, "plain", 10.0, calls), FakeRunner(peers.LLAMA, "plain", 8.0, calls),
               FakeRunner(peers.EDGESPEC, "adaptive", 15.0, calls), FakeRunner(peers.LLAMA, "ngram", 12.0, calls)]
    runs = peers.interleave(prompts, [[1, 2], [3]], runners, 16, repeats=3)
    labels = [peers.label(r) for r in runners]
    # prompt 0 in the given order, prompt 1 rotated by one; repeats interleaved (r1 of every runner first)
    assert [c[1] for c in calls[:4]] == labels and [c[1] for c in calls[4:8]] == labels
    assert [c[1] for c in calls[12:16]] == labels[1:] + labels[:1]
    assert len(runs) == 8 and all(len(r["decode_tok_s_repeats"]) == 3 for r in runs)
    for r in runs:  # the kept repeat is the median one
        assert r["decode_tok_s"] == sorted(r["decode_tok_s_repeats"])[1]
    s = peers.summarize(runs, labels)
    a = s["edgespec adaptive"]["all"]
    assert a["decode_vs_own_plain"] == pytest.approx(1.5) and a["decode_vs_llama_plain"] == pytest.approx(15 / 8)
    assert a["alpha"] == pytest.approx(0.75) and s["llama.cpp ngram"]["all"]["alpha"] is None
    assert s["llama.cpp ngram"]["code"]["prompts"] == 1 and s["llama.cpp ngram"]["all"]["prompts"] == 2
    h = peers.headline(s)
    assert h["plain_decode_edgespec_over_llama"] == pytest.approx(10 / 8)
    assert h["llama_best_speculative"] == "llama.cpp ngram"
    assert h["default_e2e_over_llama_best_speculative"] == pytest.approx(15 / 12)
    result = {"summary": s, "machine": {"cpu": "test cpu"},
              "long_prompt": {"prompt_tokens": 1000, "repeats": 3, "edgespec_over_llama": 0.5,
                              "prefill_tok_s": {"edgespec plain": 50.0, "llama.cpp plain": 100.0}}}
    md = peers.table(result)
    assert "| edgespec | adaptive |" in md and "1.50×" in md and "1000-token prompt" in md
    peers.plot(result, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_greedy_agreement_of_llama_modes(tmp_path):
    binary = _fake_binary(tmp_path, FAKE_SERVER)
    prompts = [Prompt("code", ({"role": "user", "content": str(i)},)) for i in range(3)]
    with LlamaServer(binary, PeerMode("plain").server_args(Path("t"), Path("d"), 2, 4096), tmp_path / "a.log") as p, \
            LlamaServer(binary, PeerMode("ngram").server_args(Path("t"), Path("d"), 2, 4096), tmp_path / "b.log") as n:
        runners = [peers.LlamaRunner(p, PeerMode("plain")), peers.LlamaRunner(n, PeerMode("ngram"))]
        runs = peers.interleave(prompts, [[0, 5], [1, 5], [2, 5]], runners, 4)
    same = {r["prompt"]: r["same_as_plain"] for r in runs if r["mode"] == "ngram"}
    assert same == {0: True, 1: True, 2: False}
    assert peers.summarize(runs, ["llama.cpp plain", "llama.cpp ngram"])["llama.cpp ngram"]["all"][
        "greedy_same_as_plain"] == "2/3"


def test_find_ggufs(tiny_export, home, tmp_path):
    from edgespec.io.manifest import load_manifest

    m = load_manifest(tiny_export)
    with pytest.raises(EdgespecError, match="target GGUF not found"):
        peers.find_ggufs(tiny_export)
    gg = Path(os.environ["EDGESPEC_HOME"]) / "gguf"
    gg.mkdir(parents=True, exist_ok=True)
    made = []
    for spec in (m.target, m.draft):
        p = gg / f"{spec.source_sha256}.gguf"
        p.write_bytes(b"GGUF")
        made.append(p)
    try:
        assert peers.find_ggufs(tiny_export) == tuple(made)
        given = tmp_path / "x.gguf"
        given.write_bytes(b"GGUF")
        assert peers.find_ggufs(tiny_export, target=given)[0] == given
    finally:
        for p in made:
            p.unlink()


def test_long_prompt_reaches_length():
    enc = lambda p: p.text.split()  # noqa: E731  (a whitespace "tokenizer")
    p = peers.long_prompt(enc, 400)
    assert len(enc(p)) >= 400 and p.cls == "long"
    assert p == peers.long_prompt(enc, 400)  # deterministic


def test_build_flags_and_amx_detection(tmp_path, monkeypatch):
    args = peers_build.cmake_args(Path("/src"), Path("/b"), amx_off=True)
    assert "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" in args
    assert "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" in args
    assert "-DCMAKE_C_FLAGS=" in peers_build.cmake_args(Path("/src"), Path("/b"), amx_off=False)
    monkeypatch.setattr(peers_build.platform, "machine", lambda: "x86_64")
    for state, want in (("[enabled]", True), ("[disabled]", False)):
        cc = tmp_path / f"cc-{want}"
        cc.write_text(f"#!/bin/sh\necho '  -mamx-tile                  \t\t{state}'\n")
        cc.chmod(0o755)
        assert peers_build.native_enables_amx(str(cc)) is want
    assert peers_build.native_enables_amx(str(tmp_path / "no-such-cc")) is False


def test_build_reuses_a_matching_build(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    monkeypatch.setattr(peers_build, "fetch_sdist", lambda root: tmp_path / "x.tar.gz")
    monkeypatch.setattr(peers_build, "unpack", lambda sdist, root: src)
    monkeypatch.setattr(peers_build, "native_enables_amx", lambda: False)
    ran = []
    monkeypatch.setattr(peers_build.subprocess, "run", lambda cmd, **kw: ran.append(cmd) or _Done(1))
    bindir = tmp_path / "build" / "bin"
    bindir.mkdir(parents=True)
    for t in peers_build.TARGETS:
        (bindir / t).write_text("")
        (bindir / t).chmod(0o755)
    stamp = {"sdist_sha256": peers_build.SDIST_SHA256,
             "cmake": peers_build.cmake_args(src, tmp_path / "build", False), "targets": list(peers_build.TARGETS)}
    (tmp_path / "build" / "edgespec-build.json").write_text(json.dumps(stamp))
    assert peers_build.build(tmp_path) == bindir and ran == []
    # another configuration (AMX off) rebuilds: cmake runs, and its failure is a one-line error
    monkeypatch.setattr(peers_build, "native_enables_amx", lambda: True)
    with pytest.raises(peers_build.PeerBuildError, match="failed"):
        peers_build.build(tmp_path)
    assert ran and ran[0][0] == "cmake" and any("-mno-amx-tile" in a for a in ran[0])


class _Done:
    def __init__(self, rc):
        self.returncode = rc


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert peers.main(["--modes", "adaptive", "--out", str(tmp_path / "o")]) == 1
    assert "must both include plain" in capsys.readouterr().err
    assert peers.main([str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.glob("o*"))



def test_whole_run_on_the_tiny_pair_with_a_fake_server(tiny_export, home, tmp_path, capsys, monkeypatch):
    # in this process: tests/conftest.py keeps onnxruntime's process-wide thread pool out of it
    build = tmp_path / "build"
    (build / "bin").mkdir(parents=True)
    _fake_binary(build / "bin", FAKE_SERVER)
    t, d = tmp_path / "t.gguf", tmp_path / "d.gguf"
    t.write_bytes(b"GGUF")
    d.write_bytes(b"GGUF")
    out = tmp_path / "res" / "peers"
    argv = [str(tiny_export), "--llama-build", str(build), "--target-gguf", str(t), "--draft-gguf", str(d),
            "--per-class", "1", "--max-new-tokens", "8", "--long-prompt", "120", "--long-repeats", "1",
            "--peer-modes", "plain,draft5,ngram", "--out", str(out)]
    assert peers.main(argv) == 0
    res = json.loads(out.with_suffix(".json").read_text())
    labels = ["edgespec plain", "llama.cpp plain", "edgespec adaptive", "llama.cpp draft5", "edgespec lookup",
              "llama.cpp ngram"]
    assert list(res["summary"]) == labels
    # the tiny export's 256-token context holds no code-edit prompt: skipped, as edgespec bench does
    assert len(res["skipped_prompts"]) == 1
    assert len(res["runs"]) == 3 * len(labels) and {r["class"] for r in res["runs"]} == {"code", "chat", "voice"}
    # the same prompt ids went to both runtimes
    for i in range(3):
        assert len({r["prompt_tokens"] for r in res["runs"] if r["prompt"] == i}) == 1
    assert "--spec-draft-n-max" in res["peer"]["server_commands"]["draft5"]
    assert res["long_prompt"]["prompt_tokens"] >= 120
    assert set(res["long_prompt"]["prefill_tok_s"]) == {"edgespec plain", "llama.cpp plain"}
    assert res["headline"]["llama_best_speculative"] in ("llama.cpp draft5", "llama.cpp ngram")
    assert out.with_suffix(".png").stat().st_size > 1000
    assert "| llama.cpp | draft5 |" in capsys.readouterr().out
    # without matplotlib (a runtime-only install): the JSON and the table still come, the plot is named as missing
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *a, **kw):
        if name.split(".")[0] == "matplotlib":
            raise ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    out2 = tmp_path / "res2" / "peers"
    assert peers.main(argv[:-1] + [str(out2)]) == 0
    assert json.loads(out2.with_suffix(".json").read_text())["summary"] and not out2.with_suffix(".png").exists()
    captured = capsys.readouterr()
    assert "| llama.cpp | draft5 |" in captured.out and "no plot: matplotlib is not installed" in captured.err
