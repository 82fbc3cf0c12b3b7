"""Prefill of one long prompt on several exports' targets, chunk by chunk, alternating between them (2026-12-01: the
int8 KV cache's prefill against the float32 cache's). Random ids; prints tok/s and every few chunks' ms.
``--prefill-graph`` runs the chunks as a prefill does (``forward(prefill=True)``: on the export's int8 prefill graph
where it has one; 2026-12-02: an int8 cache beside a float32 prefill graph).

    python bench/probes/prefill_chunks.py 256 qwen-kv8,qwen2.5-coder-1.5b+0.5b   # chunk size, export names in the user cache
    python bench/probes/prefill_chunks.py 256 qwen-kv8p,qwen-p8b,qwen-kv8 --prefill-graph
"""
import sys
import time

import numpy as np

from edgespec.io import onnx_model as om
from edgespec.io import paths
from edgespec.io.manifest import load_manifest

om.use_shared_thread_pool()
prefill = "--prefill-graph" in sys.argv
sys.argv = [a for a in sys.argv if a != "--prefill-graph"]
chunk = int(sys.argv[1]) if len(sys.argv) > 1 else 256
lms = {}
for name in sys.argv[2].split(","):
    d = paths.exports_dir() / name
    lms[name] = om.OnnxLM(load_manifest(d).target, d)
ids = [int(x) for x in np.random.default_rng(0).integers(100, 20000, 3600)]
caches = {n: lm.new_cache() for n, lm in lms.items()}
res = {n: [] for n in lms}
for i in range(0, 3584, chunk):
    for n, lm in lms.items():
        t0 = time.perf_counter(); lm.forward(ids[i:i+chunk], caches[n], keep=1, prefill=prefill); res[n].append((i, (time.perf_counter()-t0)*1e3))
for n, r in res.items():
    tot = sum(ms for _, ms in r)
    print(n, "(prefill graph)" if prefill and lms[n].prefill_session is not None else "", f"chunk {chunk}: total {tot/1e3:.1f} s = {3584/tot*1e3:.1f} tok/s;", " ".join(f"{i}:{ms:.0f}" for i, ms in r[::max(1,len(r)//7)]))
