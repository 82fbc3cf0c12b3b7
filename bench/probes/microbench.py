"""Micro-measurements behind docs/benchmarks.md: the output head on the last row only, and the per-round time
spent outside the two models. Usage: python bench/probes/microbench.py [EXPORT_DIR]  (default: the default pair)."""

import sys
import time

import numpy as np

from edgespec.io import paths
from edgespec.engine.decoder import SpecDecoder
from edgespec.io.onnx_model import OnnxLM
from edgespec.bench.prompts import builtin
from edgespec.engine.generation import GenerationOptions
from edgespec.core.stats import GenerationStats


def median_ms(fn, reps=7):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(ts))


def main():
    export = sys.argv[1] if len(sys.argv) > 1 else paths.default_export_dir()
    dec = SpecDecoder.load(export, shared_thread_pool=True)
    ids = list(range(1000, 1042))
    for name, lm in (("draft", dec.draft), ("target", dec.target)):
        full = median_ms(lambda: lm.forward(ids, lm.new_cache()))
        last = median_ms(lambda: lm.forward(ids, lm.new_cache(), keep=1))
        print(f"{name}: 42-token feed, logits for every row {full:.1f} ms, last row only {last:.1f} ms")

    calls = {"target": 0.0, "draft": 0.0}
    forward = OnnxLM.forward

    def timed(self, *a, **k):
        t0 = time.perf_counter()
        out = forward(self, *a, **k)
        calls["target" if self is dec.target else "draft"] += (time.perf_counter() - t0) * 1e3
        return out

    OnnxLM.forward = timed
    prompt = next(p for p in builtin(3) if p.cls == "code")
    ids = dec.encode(messages=list(prompt.messages))
    for k, mode in ((0, "plain"), (2, "spec"), (0, "plain"), (2, "spec")):
        dec.reset()
        calls.update(target=0.0, draft=0.0)
        st = GenerationStats()
        t0 = time.perf_counter()
        options = GenerationOptions(max_new_tokens=128, seed=0, proposers=("draft",) if k else (), k=k)
        for _ in dec.generate_ids(ids, options, None, st):
            pass
        wall = (time.perf_counter() - t0) * 1e3
        other = wall - calls["target"] - calls["draft"]
        print(f"{mode} K={k}: {st.new_tokens} tokens in {st.rounds} rounds, {wall:.0f} ms; outside the models "
              f"{other:.0f} ms = {other / max(st.rounds, 1):.2f} ms per round")


if __name__ == "__main__":
    main()
