"""Where a decode step's time goes after a short and a long past: onnxruntime's profiler, per operator type.

Fills a graph's KV cache with ``--pasts`` random tokens (prefill in 512-token chunks), times ten one-token
steps after each, and sums the profiler's kernel times per op type (ms per step). Used for issue 12: after a
3,500-token past the format-3 target spends most of the extra time in ``GroupQueryAttention``.

    python bench/probes/profile_step.py ~/.cache/edgespec/exports/qwen2.5-coder-1.5b+0.5b --pasts 128,3500 [--role draft]
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json
import os
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgespec import onnx_model as om
from edgespec.io.manifest import load_manifest

STEPS, SKIP = 12, 2  # timed steps after each past; the first SKIP are warm-up


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export")
    ap.add_argument("--pasts", default="128,3500")
    ap.add_argument("--role", choices=("target", "draft"), default="target")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    pasts = [int(x) for x in a.pasts.split(",")]
    spec = getattr(load_manifest(a.export), a.role)
    so = om.session_options(threads=a.threads)
    so.enable_profiling = True
    so.profile_file_prefix = f"/tmp/edgespec-profile-{os.getpid()}"
    sess = ort.InferenceSession(str(Path(a.export) / spec.path), so, providers=["CPUExecutionProvider"])
    lm = om.OnnxLM.from_session(spec, sess)
    rng = np.random.default_rng(0)
    for p in pasts:
        cache = lm.new_cache()
        ids = rng.integers(100, 20000, p)
        for s in range(0, p, 512):
            lm.forward(ids[s:s + 512], cache, keep=1)
        ts = []
        for _ in range(STEPS):
            t0 = time.perf_counter()
            lm.forward([123], cache)
            ts.append(time.perf_counter() - t0)
        print(f"past {p}: step median {np.median(ts[SKIP:]) * 1e3:.1f} ms")
    trace = sess.end_profiling()
    events = json.loads(Path(trace).read_text())
    Path(trace).unlink()
    runs = [e for e in events if e.get("name") == "model_run"]
    starts = [r["ts"] for r in runs]
    per_run = collections.defaultdict(lambda: collections.defaultdict(float))
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_run[bisect.bisect_right(starts, e["ts"]) - 1][e["args"].get("op_name", "?")] += e["dur"] / 1e3
    first = 0
    for p in pasts:
        steps = range(first + (p + 511) // 512 + SKIP, first + (p + 511) // 512 + STEPS)
        first += (p + 511) // 512 + STEPS
        ops = collections.defaultdict(float)
        for i in steps:
            for op, ms in per_run[i].items():
                ops[op] += ms / len(steps)
        print(f"past {p}: kernels {sum(ops.values()):.1f} ms/step; " + ", ".join(
            f"{op} {ms:.1f}" for op, ms in sorted(ops.items(), key=lambda x: -x[1])[:5]))


if __name__ == "__main__":
    main()
