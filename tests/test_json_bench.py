"""bench/json_output.py offline: the interleaved JSON-schema run on the tiny pair, with a fake llama-server."""

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("llguidance")
BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import json_output  # noqa: E402
from test_peers import _fake_binary  # noqa: E402

FAKE = '''
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def _send(self, body):
        data = json.dumps(body).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
    def do_GET(self):
        self._send({"status": "ok"})
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert req["json_schema"]["type"] == "object" and req["temperature"] == 0.0
        t = {"cache_n": 0, "prompt_n": len(req["prompt"]), "prompt_ms": 5.0, "predicted_n": 9, "predicted_ms": 80.0}
        self._send({"timings": t, "tokens": list(range(9)),
                    "content": json.dumps({"name": "a", "age": 3, "email": "e", "languages": ["py"]})})
HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def test_json_bench_on_the_tiny_pair_with_a_fake_server(tiny_export, home, tmp_path, capsys):
    build = tmp_path / "build"
    (build / "bin").mkdir(parents=True)
    _fake_binary(build / "bin", FAKE)
    t = tmp_path / "t.gguf"
    t.write_bytes(b"GGUF")
    out = tmp_path / "res" / "json"
    argv = [str(tiny_export), "--tasks", "1", "--max-new-tokens", "48", "--repeats", "2", "--llama-build",
            str(build), "--target-gguf", str(t), "--out", str(out)]
    assert json_output.main(argv) == 0
    res = json.loads(out.with_name("json.json").read_text())
    s = res["summary"]
    assert list(s) == ["edgespec plain", "edgespec adaptive+lookup", "llama.cpp plain"]
    assert s["edgespec plain"]["vs_edgespec_plain"] == pytest.approx(1.0)
    assert s["llama.cpp plain"]["decode_tok_s"] == pytest.approx(8 / 0.08) and s["llama.cpp plain"]["all_valid"]
    for r in res["runs"]:
        assert len(r["decode_tok_s_repeats"]) == 2
        if r["runtime"] == "edgespec" and r["stop"] == "stop_token":
            assert r["valid"]  # a finished constrained output always validates
    edgespec = [r for r in res["runs"] if r["runtime"] == "edgespec"]
    default = next(r for r in edgespec if r["mode"] == "adaptive+lookup")
    assert set(default["proposers"]) <= {"grammar", "lookup", "draft"} and default["plain_steps"] >= 0
    for ps in default["proposers"].values():
        assert 0 <= ps["accepted"] <= ps["proposed"]
    grammar = default["proposers"]["grammar"]  # the default mode proposes the schema's forced tokens
    assert grammar["rounds"] > 0 and grammar["accepted"] == grammar["proposed"]  # always accepted
    assert edgespec[0]["tokens"] == edgespec[1]["tokens"]  # greedy: default mode == plain under the grammar
    assert "| llama.cpp | plain |" in capsys.readouterr().out
    assert json_output.main([str(tiny_export), "--modes", "adaptive", "--no-llama", "--out", str(out)]) == 1
