"""Trace a cold adaptive controller's choices on built-in prompts: every round's acceptance estimate, the
draft's catch-up cost, the expected remaining length and the plan it chose (issue 12: why the cold default
starts the draft late). Prints the calibrated cost model first.

    python bench/probes/trace_controller.py [EXPORT] --prompts 1 --mode adaptive+lookup [--per-class 3] [--every 1]
    python bench/probes/trace_controller.py ~/.cache/edgespec/exports/qwen-kv8p --context 3500 --max-new-tokens 48

``--context N`` traces the context sweep's prompt of about N tokens (``edgespec bench --context``: standard-library
source and a question) instead of built-in prompts. Each line ends with the round's accepted tokens and its
measured time (ms).
"""

from __future__ import annotations

import argparse

from edgespec.io import paths
from edgespec.control.adaptive import AdaptiveK
from edgespec.bench.runner import Mode, run_one
from edgespec.control.calibrate import calibrate
from edgespec.engine.decoder import SpecDecoder
from edgespec.bench.context import long_prompt
from edgespec.bench.prompts import builtin


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export", nargs="?", default=None)
    ap.add_argument("--prompts", default="1", help="indices into the built-in set (comma-separated)")
    ap.add_argument("--per-class", type=int, default=3)
    ap.add_argument("--mode", default="adaptive+lookup")
    ap.add_argument("--every", type=int, default=1, help="print every N-th round")
    ap.add_argument("--rounds", type=int, default=40, help="rounds printed at most")
    ap.add_argument("--context", type=int, default=None,
                    help="trace the context sweep's prompt of about this many tokens instead of --prompts")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    a = ap.parse_args()
    dec = SpecDecoder.load(a.export or paths.default_export_dir(), shared_thread_pool=True)
    dec.generate("Hello", max_new_tokens=4, k=2, proposers=("draft",)).run()  # warm-up
    print("cost model:", calibrate(dec))
    prompts, mode = builtin(per_class=a.per_class), Mode.parse(a.mode)
    log: list[str] = []
    choose = AdaptiveK.choose

    def traced(self, s):
        plan = choose(self, s)
        log.append(f"tokens {self.generated:3d}  draft alpha est. {self.alpha():.2f}  lag {s.lag:4d}  catch-up "
                   f"{max(s.lag - 1, 0) * self.catchup_ms:5.0f} ms  remaining {self.expected_remaining(s.horizon or 128):4.0f}"
                   f"  plain {self.plain_ms:5.1f} ms  -> {getattr(plan.proposer, 'name', 'plain')} k={plan.k}")
        return plan

    observe = AdaptiveK.observe

    def observed(self, r):
        log[-1] += f"  | accepted {r.accepted}, {r.round_ms:6.1f} ms"
        return observe(self, r)

    AdaptiveK.choose, AdaptiveK.observe = traced, observed
    if a.context is not None:
        try:
            todo = [("context", long_prompt(dec, a.context))]
        except ValueError as e:
            raise SystemExit(f"--context {a.context}: {e}") from None
    else:
        todo = [(i, prompts[i]) for i in (int(x) for x in a.prompts.split(","))]
    for i, prompt in todo:
        log.clear()
        r = run_one(dec, mode, prompt, a.max_new_tokens, 0.0, 0)
        print(f"{prompt.cls} #{i}: {r['prompt_tokens']} prompt tokens, {r['new_tokens']} new, "
              f"decode {r['decode_tok_s']:.1f} tok/s")
        for line in log[::a.every][:a.rounds]:
            print("  ", line)


if __name__ == "__main__":
    main()
