"""How well the target's own top-1 probability predicts greedy acceptance (AdaptiveK's prior before any draft
round). For each built-in prompt: plain greedy answer, then one forward of each model over prompt + answer;
agreement = share of answer positions where the draft's argmax equals the target's.
Usage: python bench/probes/confidence_proxy.py [EXPORT_DIR]  (default: the default pair)."""

import sys

import numpy as np

from edgespec.io import paths
from edgespec.engine.decoder import SpecDecoder
from edgespec.bench.prompts import builtin


def top1(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e.max(-1) / e.sum(-1)


def main():
    dec = SpecDecoder.load(sys.argv[1] if len(sys.argv) > 1 else paths.default_export_dir(), shared_thread_pool=True)
    gaps = []
    for p in builtin(3):
        dec.reset()
        ids = dec.encode(messages=list(p.messages))
        answer = dec.generate(input_ids=ids, max_new_tokens=128, proposers=()).run().token_ids
        seq = ids + answer
        t = dec.target.forward(seq[:-1], dec.target.new_cache())[len(ids) - 1:]
        d = dec.draft.forward(seq[:-1], dec.draft.new_cache())[len(ids) - 1:]
        agree, conf = float((t.argmax(-1) == d.argmax(-1)).mean()), float(top1(t).mean())
        gaps.append(abs(agree - conf))
        print(f"{p.cls:9s} {len(answer):3d} tokens: greedy agreement {agree:.2f}, mean target top-1 {conf:.2f}")
    print(f"|agreement - top-1|: median {np.median(gaps):.3f}, max {np.max(gaps):.3f}")


if __name__ == "__main__":
    main()
