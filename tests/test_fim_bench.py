"""The FIM benchmark's offline parts (bench/fim_bench.py, bench/fim_tasks.py): stdlib task extraction, the
scores, the interleaved run and its summary, and a whole run on the tiny FIM export against a fake
``llama-server`` that answers ``/infill`` — without llama.cpp and without timing anything."""

import json
import random
import stat
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import fim_bench  # noqa: E402
from fim_tasks import levenshtein, normalize, score, stdlib_tasks, tasks_from_source  # noqa: E402

SOURCE = '''def f(x):
    """Doc."""
    a = x + 1
    b = a * 2
    # note
    return b


def g():
    return 1
'''


def test_tasks_are_whole_lines_of_a_function_body():
    for seed in range(20):
        (t,) = tasks_from_source("m", "m.py", SOURCE, random.Random(seed), 1, 10, 10) or [None]
        if t is None:
            continue
        assert t.prefix + t.answer + t.suffix in SOURCE and 1 <= t.n_lines <= 4
        assert t.answer.endswith("\n") and t.answer.count("\n") == t.n_lines
        assert '"""Doc."""' not in t.answer and t.answer.strip() and not t.answer.lstrip().startswith("#")
        assert SOURCE.splitlines()[t.line - 1] + "\n" == t.answer.splitlines(keepends=True)[0]


def test_stdlib_tasks_are_deterministic_and_from_real_files():
    a = stdlib_tasks(5, 1, 20, 5, seed=3)
    assert a == stdlib_tasks(5, 1, 20, 5, seed=3) and len({t.module for t in a}) == 5
    for t in a:
        text = Path(t.path).read_text(encoding="utf-8")
        assert t.prefix + t.answer + t.suffix in text
        assert t.prefix.count("\n") <= 20 and t.suffix.count("\n") <= 5 and 1 <= t.n_lines <= 5


def test_scores():
    assert normalize("\n  x = 1   \n\n") == "  x = 1"
    assert levenshtein("kitten", "sitting") == 3 and levenshtein("", "abc") == 3
    assert score("    y = 2\n", "    y = 2") == {"exact_match": True, "edit_similarity": 1.0}
    s = score("y = 2", "    y = 2")
    assert not s["exact_match"] and s["edit_similarity"] == pytest.approx(1 - 4 / 9)


FAKE_INFILL = '''
import json, sys
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
        if self.path == "/infill":
            assert req["input_extra"] == []
            content = (req["input_suffix"].splitlines(keepends=True) or [""])[0]  # a deterministic "completion"
            prompt_n = len(req["input_prefix"]) // 3
        else:
            assert self.path == "/completion" and all(isinstance(i, int) for i in req["prompt"])
            content, prompt_n = "pass\\n", len(req["prompt"])
        t = {"prompt_n": prompt_n, "prompt_ms": 50.0, "predicted_n": n,
             "predicted_ms": 100.0 / (2 if spec else 1)}
        if spec:
            t.update(draft_n=2 * n, draft_n_accepted=n)
        self._send(200, {"content": content, "timings": t, "stop_type": "eos"})
HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def test_whole_run_on_the_tiny_fim_pair_with_a_fake_server(tiny_fim_export, home, tmp_path, capsys, monkeypatch):
    build = tmp_path / "build" / "bin"
    build.mkdir(parents=True)
    server = build / "llama-server"
    server.write_text(f"#!{sys.executable}\n" + FAKE_INFILL)
    server.chmod(server.stat().st_mode | stat.S_IEXEC)
    t, d = tmp_path / "t.gguf", tmp_path / "d.gguf"
    t.write_bytes(b"GGUF")
    d.write_bytes(b"GGUF")
    out = tmp_path / "res" / "fim"
    argv = [str(tiny_fim_export), "--llama-build", str(build.parent), "--target-gguf", str(t), "--draft-gguf",
            str(d), "--files", "4", "--prefix-lines", "1", "--suffix-lines", "1", "--max-new-tokens", "6",
            "--out", str(out)]
    assert fim_bench.main(argv) == 0
    res = json.loads(out.with_suffix(".json").read_text())
    labels = ["edgespec plain", "llama.cpp plain", "edgespec adaptive+lookup", "llama.cpp ngram",
              "llama.cpp plain@ids", "llama.cpp ngram@ids"]
    assert list(res["summary"]) == labels
    n = len(res["tasks"])
    assert n >= 1 and len(res["runs"]) == n * len(labels) and n + len(res["skipped_tasks"]) == 4
    # rotated order: each task starts with another configuration
    firsts = [next(r["label"] for r in res["runs"] if r["task"] == i) for i in range(n)]
    assert firsts == [labels[i % len(labels)] for i in range(n)]
    s = res["summary"]
    # lossless: edgespec's default mode completes every task exactly as its plain decoding (fp32 tiny pair)
    assert s["edgespec adaptive+lookup"]["same_as_plain"] == f"{n}/{n}"
    assert s["edgespec plain"]["speedup_vs_edgespec_plain"] == pytest.approx(1.0)
    assert s["llama.cpp ngram"]["alpha"] == pytest.approx(0.5) and s["llama.cpp plain"]["alpha"] is None
    assert s["llama.cpp ngram"]["speedup_vs_llama.cpp_plain"] == pytest.approx(150 / 100)
    # @ids: llama.cpp prefilled exactly edgespec's prompt tokens; /infill its own prompt
    assert s["llama.cpp plain@ids"]["prompt_tokens_match"] == f"{n}/{n}"
    assert s["llama.cpp ngram@ids"]["same_as_plain"] == f"{n}/{n}"
    for r in res["runs"]:
        assert 0 <= r["edit_similarity"] <= 1 and r["new_tokens"] <= 6 and r["latency_ms"] >= r["ttft_ms"] >= 0
    h = res["headline"]
    assert h["default"] == "edgespec adaptive+lookup" and h["llama_best"] == "llama.cpp ngram"
    assert "| llama.cpp | ngram |" in capsys.readouterr().out


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert fim_bench.main(["--modes", "adaptive", "--out", str(tmp_path / "o")]) == 1
    assert "must both include plain" in capsys.readouterr().err
    assert fim_bench.main([str(tmp_path / "nope"), "--peer-modes", "", "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
