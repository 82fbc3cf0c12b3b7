"""Bounded load test of ``edgespec serve`` on loopback: N requests from T client threads, server RSS sampled.

    python bench/serve_load.py [DIR] [--requests 200 --threads 4 --max-queue 8 --max-tokens 32]

Without DIR it builds the tiny random pair of the test suite (needs the ``export`` and ``test`` extras) in a
temporary directory. Requests alternate streamed and non-streamed chat completions, greedy and seeded
sampling, over a few prompts (so some share a prefix with the previous request and some do not). A 429 (queue
full) is counted, not retried. Prints a Markdown summary and writes the JSON to ``--out``; exits 1 if any
request failed with anything but 429. Bounded: ``--requests`` in total, ``--time-limit`` seconds overall.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["def add", "Write a function that reverses a list.", "The quick brown fox",
           "class Node:", "Explain speculative decoding in one sentence."]


def tiny_pair(root: Path) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from tinymodels import build_model

    from edgespec.export import ExportOptions, export_pair

    t = build_model(root / "target", "qwen2", seed=0, layers=2, hidden=64)
    d = build_model(root / "draft", "qwen2", seed=0, noise=0.1)
    fp32 = ExportOptions(precision="fp32")
    return Path(export_pair(str(t), str(d), root / "pair", fp32, fp32))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", nargs="?")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--max-queue", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--time-limit", type=float, default=900.0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve-load-tiny.json"))
    a = ap.parse_args()
    import logging

    import openai

    for name in ("httpx", "httpx2"):  # one line per request otherwise, if a library turned INFO logging on
        logging.getLogger(name).setLevel(logging.WARNING)
    tmp = tempfile.TemporaryDirectory()
    env = dict(os.environ, EDGESPEC_HOME=os.environ.get("EDGESPEC_HOME", str(Path(tmp.name) / "home")))
    os.environ["EDGESPEC_HOME"] = env["EDGESPEC_HOME"]
    export = Path(a.dir) if a.dir else tiny_pair(Path(tmp.name))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(Path(tmp.name) / "server.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "edgespec.cli", "serve", str(export), "--port", str(port),
                               "--max-queue", str(a.max_queue)], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)
    t0 = time.time()
    while True:
        try:
            client.models.list()
            break
        except openai.APIConnectionError:
            if server.poll() is not None or time.time() - t0 > 300:
                print(open(log.name).read(), file=sys.stderr)
                return 1
            time.sleep(0.3)
    client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=4)  # warm
    rss = [(0.0, rss_mb(server.pid))]
    done = threading.Event()

    def sample():
        while not done.wait(0.25):
            rss.append((time.time() - start, rss_mb(server.pid)))

    results, lock, counter = [], threading.Lock(), iter(range(a.requests))

    def worker():
        while time.time() - start < a.time_limit:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            kw = dict(model="x", messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                      max_tokens=a.max_tokens, temperature=0.0 if i % 3 else 0.8, seed=i)
            t = time.perf_counter()
            try:
                if i % 2:
                    text = "".join(c.choices[0].delta.content or "" for c in
                                   client.chat.completions.create(stream=True, **kw) if c.choices)
                else:
                    text = client.chat.completions.create(**kw).choices[0].message.content
                outcome = "ok" if isinstance(text, str) else "bad"
            except openai.RateLimitError:
                outcome = "429"
            except Exception as e:  # anything else is a failure of the server
                outcome = f"error: {type(e).__name__}: {e}"
            with lock:
                results.append((outcome, (time.perf_counter() - t) * 1e3, i % 2 == 1))

    start = time.time()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    threads = [threading.Thread(target=worker) for _ in range(a.threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.time() - start
    done.set()
    health = json.loads(__import__("urllib.request").request.urlopen(f"http://127.0.0.1:{port}/health").read())
    rss.append((wall, rss_mb(server.pid)))
    server.send_signal(2)
    server.wait(30)
    ok = [ms for o, ms, _ in results if o == "ok"]
    errors = [o for o, _, _ in results if o not in ("ok", "429")]
    mem = [m for _, m in rss]
    q = len(mem) // 4 or 1
    out = {
        "command": "python bench/serve_load.py " + " ".join(sys.argv[1:]),
        "export": str(export) if a.dir else "tiny random pair (tests/tinymodels.py), fp32",
        "requests": len(results), "threads": a.threads, "max_queue": a.max_queue, "max_tokens": a.max_tokens,
        "ok": len(ok), "rejected_429": sum(o == "429" for o, _, _ in results), "errors": errors[:10],
        "n_errors": len(errors), "wall_s": wall, "requests_per_s": len(results) / wall,
        "latency_p50_ms": float(np.percentile(ok, 50)) if ok else None,
        "latency_p95_ms": float(np.percentile(ok, 95)) if ok else None,
        "rss_mb_after_warmup": mem[0], "rss_mb_max": max(mem), "rss_mb_end": mem[-1],
        "rss_mb_first_quarter_max": max(mem[:q]), "rss_mb_last_quarter_max": max(mem[-q:]),
        "server_counts": {k: health[k] for k in ("completed", "cancelled", "rejected", "failed")},
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"| requests | threads | max queue | ok | 429 | other errors | p50 ms | p95 ms | req/s | RSS MB after warm-up / "
          f"max / end |\n|---|---|---|---|---|---|---|---|---|---|\n| {out['requests']} | {a.threads} | {a.max_queue} | "
          f"{out['ok']} | {out['rejected_429']} | {out['n_errors']} | {out['latency_p50_ms']:.0f} | "
          f"{out['latency_p95_ms']:.0f} | {out['requests_per_s']:.1f} | {mem[0]:.0f} / {max(mem):.0f} / {mem[-1]:.0f} |")
    for e in errors[:5]:
        print(e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
