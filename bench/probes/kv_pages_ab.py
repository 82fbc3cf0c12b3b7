"""A/B of the format-3 KV buffers' memory (issue 17): a one-row target step after a long past with the buffers
from ``numpy.zeros`` (before 2026-11-30: numpy advises huge pages) and from ``edgespec.io.pages.anonymous_zeros``
(now: 4 KB pages, resident as rows are written), alternating in one process, 8 rounds of 8 steps each.

    python bench/probes/kv_pages_ab.py EXPORT_DIR [PAST_TOKENS, default 3000]

Prints the median ms per step of each and their ratio.
"""
import sys, time
import numpy as np
import edgespec.io.onnx_model as om
from edgespec.io.manifest import load_manifest
exp = sys.argv[1]; past = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
m = load_manifest(exp)
om.use_shared_thread_pool()
lm = om.OnnxLM(m.target, exp)
def numpy_cache():
    c = lm.new_cache()
    b, kv, _, hd = c.buffers[0].shape
    c.buffers = [np.zeros((b, kv, c.capacity, hd), np.float32) for _ in c.buffers]
    import onnxruntime as ort
    c.values = [ort.OrtValue.ortvalue_from_numpy(x) for x in c.buffers]
    c.bindings = {}
    return c
caches = {"numpy.zeros": numpy_cache(), "anonymous_zeros": lm.new_cache()}
rng = np.random.default_rng(0)
prompt = [int(x) for x in rng.integers(100, 20000, past)]
for k, c in caches.items():
    for i in range(0, past, 256):
        lm.forward(prompt[i:i + 256], c, keep=1)
times = {k: [] for k in caches}
for r in range(8):
    for k in (list(caches) if r % 2 == 0 else list(caches)[::-1]):
        c = caches[k]
        t0 = time.perf_counter()
        for i in range(8):
            lm.forward([500 + i], c)
        c.crop(past)
        times[k].append((time.perf_counter() - t0) / 8 * 1e3)
for k in caches:
    print(k, "ms/step median %.1f" % np.median(times[k]), [round(x, 1) for x in times[k]])
a, b = (np.median(times[k]) for k in caches)
print("anonymous/numpy %.3f" % (b / a))
