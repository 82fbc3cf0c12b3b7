"""Scratch-grade probe (2026-12-02, Intel Xeon family 6 model 207): a draft that reads only the end of a long chat prompt.

The target's cache keeps a long prompt (``edgespec.bench.context.long_prompt``); for each mode the draft starts
from an empty cache and reads either the whole prompt or, for ``@w512``, the prompt from a cut at a multiple of
512 tokens (512–1,023 tokens; ``GenerationOptions.draft_prompt``). Prints decode tok/s (new tokens after the
first over the time after prefill), draft ms and alpha per run, two rounds of all modes, then the JSON of the
rates. Result: ``bench/results/draft-tail-2026-12-02-xeon207.txt``.

    python bench/probes/draft_tail_window.py ~/.cache/edgespec/exports/qwen-kv8p 3500
"""
import os, sys, time, json
from edgespec.engine.decoder import SpecDecoder
from edgespec.bench.context import long_prompt
from edgespec.bench.runner import Mode
from edgespec.core.stats import GenerationStats
from edgespec.engine.generation import GenerationOptions
from edgespec.control.calibrate import calibrate
exp = os.path.expanduser(sys.argv[1]); n = int(sys.argv[2])  # export, prompt tokens
dec = SpecDecoder.load(exp, threads=2, shared_thread_pool=True)
dec.generate("Hello", max_new_tokens=4, k=2).run()
calibrate(dec)
p = long_prompt(dec, n)
ids = dec.encode(messages=list(p.messages))
print("prompt", len(ids), flush=True)
t0 = time.perf_counter(); dec.cache_prefix(ids); print("prefill+draft %.1f s" % (time.perf_counter() - t0), flush=True)
res = {}
for rep in range(2):
  for name, w in [("plain", None), ("k1", 0), ("k1@w512", 512), ("adaptive+lookup", 0), ("adaptive+lookup@w512", 512), ("k2@w512", 512)]:
    mode = Mode.parse(name.split("@")[0])
    o = mode.options(64, 0.0, 0)
    if w:
        cut = (len(ids) - w) // w * w
        o = GenerationOptions.with_fields(o, {"draft_prompt": tuple(ids[cut:])})
    dec.draft_model.reset()  # the target's cache keeps the prompt; the draft reads its own from nothing
    policy = mode.controller(dec) if mode.k is None and mode.proposers else None
    st = GenerationStats(); t0 = time.perf_counter()
    toks = [x for ts, _ in dec.generate_ids(ids, o, policy, st) for x in ts]
    dec.rewind_to(len(ids))
    ms = (time.perf_counter() - t0) * 1e3 - st.prefill_ms
    res.setdefault(name, []).append((len(toks) - 1) / ms * 1e3)
    print(rep, name, "decode %.2f tok/s draft %.0f ms alpha %.2f n %d" % (res[name][-1], st.draft_ms, st.alpha, len(toks)), flush=True)
print(json.dumps(res))
