"""Node (the TypeScript core on onnxruntime-node) against the Python runtime on one export, in one run.

    flock /work/locks/real.lock flock /work/locks/bench.lock \\
        python android_demo/core/scripts/bench_node_vs_python.py [EXPORT_DIR] --out android_demo/bench/real.json

Same prompts (the built-in set's first code and chat prompts, encoded once by Python), same export, greedy,
modes plain / fixed K=4 / adaptive K (each runtime's own calibration), both runtimes with one session pool per
graph and no spinning. Blocks alternate (Python, Node, Python, Node ...) for ``--repeats`` rounds; reports the
median end-to-end tok/s (prefill included) per runtime and mode, and the speculative speed-ups over each
runtime's own plain decoding. Needs ``npm ci && npm run build`` in android_demo/core.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from edgespec.io import paths
from edgespec.control.adaptive import AdaptiveK
from edgespec.engine.decoder import SpecDecoder
from edgespec.bench.prompts import builtin

CORE = Path(__file__).resolve().parents[1]
MODES = ("plain", "k4", "adaptive")


def python_block(dec: SpecDecoder, prompts: list[list[int]], max_new: int, policy_for) -> list[dict]:
    out = []
    for i, ids in enumerate(prompts):
        for mode in MODES:
            dec.reset()
            kw = {"proposers": ()} if mode == "plain" else {"k": 4}
            g = dec.generate(input_ids=ids, max_new_tokens=max_new, policy=policy_for(mode), **kw).run()
            s = g.stats
            out.append({"runtime": "python", "prompt": i, "mode": mode, "new_tokens": s.new_tokens,
                        "tokens_per_s": s.tokens_per_s, "decode_tokens_per_s": s.decode_tokens_per_s,
                        "alpha": s.alpha, "mean_k": (sum(s.k_per_round) / len(s.k_per_round)) if s.k_per_round else 0,
                        "wall_ms": s.wall_ms, "token_ids": g.token_ids})
    return out


def node_block(export_dir: Path, prompts: list[list[int]], max_new: int, threads: int | None) -> list[dict]:
    job = {"export_dir": str(export_dir), "prompts": prompts, "modes": list(MODES), "max_new_tokens": max_new,
           **({"threads": threads} if threads else {})}
    r = subprocess.run(["node", str(CORE / "dist" / "bench" / "bench.js"), json.dumps(job)], capture_output=True,
                       text=True, timeout=7200)
    if r.returncode != 0:
        sys.exit(f"node bench failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export_dir", type=Path, nargs="?", default=None)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args(argv)
    export_dir = a.export_dir or paths.default_export_dir()
    if not (CORE / "dist" / "bench" / "bench.js").is_file():
        sys.exit("build the core first: (cd android_demo/core && npm ci && npm run build)")
    dec = SpecDecoder.load(export_dir, threads=a.threads)
    chosen = [p for cls in ("code", "chat") for p in builtin(1, [cls])]
    prompts = [dec.encode(messages=list(p.messages)) for p in chosen]
    adaptive = AdaptiveK.for_decoder(dec)  # calibrated once (cached per device), then learns across prompts

    def policy_for(mode):
        return adaptive if mode == "adaptive" else None

    runs = []
    for rep in range(a.repeats):
        for row in python_block(dec, prompts, a.max_new_tokens, policy_for):
            runs.append({**row, "repeat": rep})
        for row in node_block(export_dir, prompts, a.max_new_tokens, a.threads):
            runs.append({**row, "repeat": rep})
    summary = {}
    for rt in ("python", "node"):
        for mode in MODES:
            xs = [r["tokens_per_s"] for r in runs if r["runtime"] == rt and r["mode"] == mode]
            summary[f"{rt}/{mode}"] = {"median_tokens_per_s": statistics.median(xs),
                                       "alpha": statistics.mean(r["alpha"] for r in runs if r["runtime"] == rt and r["mode"] == mode),
                                       "mean_k": statistics.mean(r["mean_k"] for r in runs if r["runtime"] == rt and r["mode"] == mode)}
        for mode in MODES[1:]:
            summary[f"{rt}/{mode}"]["speedup_over_plain"] = (summary[f"{rt}/{mode}"]["median_tokens_per_s"]
                                                             / summary[f"{rt}/plain"]["median_tokens_per_s"])
    same = sum(1 for r in runs if r["runtime"] == "node" and any(
        q["runtime"] == "python" and q["prompt"] == r["prompt"] and q["mode"] == "plain" and q["token_ids"] == r["token_ids"]
        for q in runs))
    result = {"export_dir": str(export_dir), "prompts": [p.cls for p in chosen], "max_new_tokens": a.max_new_tokens,
              "repeats": a.repeats, "threads": a.threads, "summary": summary,
              "node_runs_equal_to_python_plain_greedy": f"{same}/{sum(1 for r in runs if r['runtime'] == 'node')}",
              "command": "python android_demo/core/scripts/bench_node_vs_python.py " + " ".join(argv or sys.argv[1:]),
              "runs": [{k: v for k, v in r.items() if k != "token_ids"} for r in runs]}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1))
    for key, s in summary.items():
        extra = f"  {s['speedup_over_plain']:.2f}× own plain" if "speedup_over_plain" in s else ""
        print(f"{key:18s} {s['median_tokens_per_s']:6.2f} tok/s  alpha {s['alpha']:.2f}  mean K {s['mean_k']:.1f}{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
