"""What a verify of N rows costs after a short and after a long past: t_v(1..7) and the draft step (median ms),
measured as :func:`edgespec.control.calibrate.calibrate` measures them, after each past in turn (twice, interleaved),
in one process; the calibration cached in the user cache is left as it is.

    python bench/probes/verify_depth.py ~/.cache/edgespec/exports/qwen-kv8p --pasts 128,3500 --out /tmp/verify-depth.json

The controller is calibrated after 128 tokens and rescales the whole curve by one measured factor; this shows how
far the curve's shape moves with the past (issue 24: each verified row re-reads the cache in
``GroupQueryAttention``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from edgespec.bench.runner import cpus
from edgespec.control import calibrate as cal
from edgespec.engine.decoder import SpecDecoder
from edgespec.errors import EdgespecError
from edgespec.io import paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export", nargs="?", default=None)
    ap.add_argument("--pasts", default="128,3500")
    ap.add_argument("--rounds", type=int, default=2, help="passes over the pasts (interleaved)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.out:
        try:
            paths.check_out(Path(a.out))
        except EdgespecError as e:
            raise SystemExit(f"error: {e}") from None
    paths.write_atomic = lambda *args, **kw: None  # measure only: the cached calibration stays
    dec = SpecDecoder.load(a.export or paths.default_export_dir(), shared_thread_pool=True)
    dec.generate("Hello", max_new_tokens=4, k=2, proposers=("draft",)).run()  # warm-up
    out: dict[str, list] = {}
    for _ in range(a.rounds):
        for past in (int(x) for x in a.pasts.split(",")):
            c = cal.calibrate(dec, k_max=6, context=past, reps=5, use_cache=False)
            out.setdefault(str(past), []).append({"verify_ms": c.verify_ms, "draft_ms": c.draft_ms})
            print(f"past {past}: t_v(1..7) = {', '.join(f'{v:.1f}' for v in c.verify_ms)} ms; draft step "
                  f"{c.draft_ms:.1f} ms; t_v(2)/t_v(1) = {c.verify_ms[1] / c.verify_ms[0]:.2f}", flush=True)
    if a.out:
        paths.write_json(Path(a.out), {"export": str(a.export), "pasts": out, "machine": cpus()})


if __name__ == "__main__":
    main()
