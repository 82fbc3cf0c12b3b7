"""bench/prefill_sweep.py offline: the tiny pair, a fake ``llama-bench`` that prints llama-bench's JSON."""

import json
import os
import stat
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
import prefill_sweep  # noqa: E402

FAKE_BENCH = '''
import json, sys
a = sys.argv[1:]
assert a[a.index("-n") + 1] == "0" and a[a.index("-o") + 1] == "json"
n = int(a[a.index("-p") + 1])
print(json.dumps([{"n_prompt": n, "n_gen": 0, "avg_ts": 50.0, "stddev_ts": 1.5, "n_batch": 2048, "n_ubatch": 512}]))
'''


def test_prefill_sweep_times_each_chunk_and_the_peer(tiny_export, home, tmp_path, capsys):
    build = tmp_path / "build" / "bin"
    build.mkdir(parents=True)
    fake = build / "llama-bench"
    fake.write_text(f"#!{sys.executable}\n" + FAKE_BENCH)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    gguf = tmp_path / "t.gguf"
    gguf.write_bytes(b"GGUF")
    out = tmp_path / "res" / "prefill"
    argv = [str(tiny_export), "--tokens", "40", "--chunks", "8,40", "--repeats", "2", "--llama-build",
            str(build.parent), "--target-gguf", str(gguf), "--out", str(out)]
    assert prefill_sweep.main(argv) == 0
    res = json.loads(out.with_name("prefill.json").read_text())
    assert set(res["edgespec"]) == {"8", "40"} and res["tokens"] == 40
    for e in res["edgespec"].values():
        assert len(e["ms"]) == 2 and e["tok_s"] == pytest.approx(40 / (e["ms_p50"] / 1e3))
    assert res["llama.cpp"]["tok_s"] == 50.0 and "-p 40" in res["llama.cpp"]["command"]
    assert "| llama.cpp |" in capsys.readouterr().out
    assert not list(out.parent.glob("*.tmp"))


def test_prefill_sweep_refuses_a_bad_chunk_without_writing(tiny_export, home, tmp_path, capsys):
    out = tmp_path / "res" / "prefill"
    assert prefill_sweep.main([str(tiny_export), "--chunks", "8,0", "--no-llama", "--out", str(out)]) == 1
    assert "error: --chunks" in capsys.readouterr().err and not out.parent.exists()


def test_chunked_prefill_gives_the_same_cache_as_one_chunk(tiny_export, home):
    from edgespec.decoder import SpecDecoder

    dec = SpecDecoder.load(tiny_export)
    ids = prefill_sweep.prompt_ids(dec.tokenizer, 30)
    assert len(ids) == 30
    prefill_sweep.time_prefill(dec, ids, 30)
    whole = [t.copy() for t in dec.tcache.tensors]
    prefill_sweep.time_prefill(dec, ids, 7)
    assert all(abs(a - b).max() < 1e-4 for a, b in zip(whole, dec.tcache.tensors))
    assert os.environ.get("EDGESPEC_HOME")
