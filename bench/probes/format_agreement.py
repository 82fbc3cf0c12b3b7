"""Do two exports of one model agree? The targets (or drafts) of two export directories (e.g. the pair in graph
formats 3 and 4) decode the same prompt greedily side by side; each step both are fed the first export's
token, so the comparison never drifts apart.

Prints the prompt length, the share of steps whose argmax agrees, the max |Δ logit| of the prefill's last row
and of the steps, and each export's ms per step (one process, alternating; a correctness check, time it only
alone on the machine).

    python bench/probes/format_agreement.py EXPORT_A EXPORT_B [--past 3500] [--steps 64] [--role target|draft]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from edgespec.io import onnx_model as om
from edgespec.io.manifest import load_manifest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--past", type=int, default=3500, help="prompt tokens (random ids; default %(default)s)")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--role", choices=("target", "draft"), default="target")
    a = ap.parse_args()
    om.use_shared_thread_pool()
    lms = [om.OnnxLM(getattr(load_manifest(d), a.role), d) for d in (a.a, a.b)]
    vocab = min(lm.spec.vocab_size for lm in lms)
    prompt = [int(x) for x in np.random.default_rng(0).integers(100, min(vocab, 20000), a.past)]
    caches = [lm.new_cache() for lm in lms]
    last = []
    for lm, c in zip(lms, caches):
        for i in range(0, a.past, 256):
            row = lm.forward(prompt[i:i + 256], c, keep=1)
        last.append(row[-1])
    worst = float(np.abs(last[0] - last[1]).max())
    tok, agree, step_worst, ms = int(last[0].argmax()), int(last[0].argmax() == last[1].argmax()), 0.0, [[], []]
    for _ in range(a.steps):
        rows = []
        for j, (lm, c) in enumerate(zip(lms, caches)):
            t0 = time.perf_counter()
            rows.append(lm.forward([tok], c)[-1])
            ms[j].append((time.perf_counter() - t0) * 1e3)
        agree += int(rows[0].argmax() == rows[1].argmax())
        step_worst = max(step_worst, float(np.abs(rows[0] - rows[1]).max()))
        tok = int(rows[0].argmax())
    print(f"{a.role}, past {a.past}: argmax agreement {agree}/{a.steps + 1}, max |Δ logit| prefill {worst:.2e}, "
          f"steps {step_worst:.2e}; ms per step {np.median(ms[0]):.1f} ({lms[0].spec.graph_format}) vs "
          f"{np.median(ms[1]):.1f} ({lms[1].spec.graph_format})")


if __name__ == "__main__":
    main()
