"""Before/after speed of two source checkouts of edgespec on the same export, interleaved in one run.

    python bench/compare_checkouts.py BEFORE_DIR AFTER_DIR [--rounds 2] [-- edgespec bench arguments]

Each round runs ``edgespec bench`` once per checkout (alternating which goes first), each in a fresh process
with ``PYTHONPATH`` pointing at that checkout, and prints per mode the median over rounds of the median decode
tok/s and of the paired speedup against plain. Both checkouts must accept the same bench arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def run(checkout: Path, bench_args: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PYTHONPATH=str(checkout))
        cmd = [sys.executable, "-m", "edgespec.cli", "bench", *bench_args, "--json", "--out", str(Path(tmp) / "b")]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp)
        if r.returncode != 0:
            sys.exit(f"{checkout}: bench failed: {r.stderr.strip().splitlines()[-1:]}")
        return json.loads(r.stdout)


def main() -> None:
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(usage=__doc__.strip().splitlines()[2].strip())
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args(argv[:cut])
    bench_args = argv[cut + 1:]  # after --: arguments of edgespec bench
    results = {"before": [], "after": []}
    for i in range(a.rounds):
        order = [("before", a.before), ("after", a.after)][:: 1 if i % 2 == 0 else -1]
        for name, path in order:
            results[name].append(run(path.resolve(), bench_args))
            print(f"round {i + 1}: {name} done", file=sys.stderr)
    modes = results["before"][0]["modes"]
    print("| mode | decode tok/s before | after | after/before | speedup vs plain before | after |")
    print("|---|---|---|---|---|---|")
    out = {}
    for m in modes:
        tps = {k: float(np.median([r["summary"][m]["all"]["decode_tok_s"] for r in rs])) for k, rs in results.items()}
        spd = {k: float(np.median([r["summary"][m]["all"]["speedup_decode_median"] for r in rs]))
               for k, rs in results.items()}
        out[m] = {"decode_tok_s": tps, "speedup": spd}
        print(f"| {m} | {tps['before']:.2f} | {tps['after']:.2f} | {tps['after'] / tps['before']:.3f} | "
              f"{spd['before']:.2f}× | {spd['after']:.2f}× |")
    print(json.dumps({"bench_args": bench_args, "rounds": a.rounds, "per_mode": out,
                      "machine": results["after"][0]["machine"]}), file=sys.stderr)


if __name__ == "__main__":
    main()
