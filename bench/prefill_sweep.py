"""Prefill speed: edgespec's target over a range of prefill chunk sizes against ``llama-bench -p N``, one run.

edgespec's prefill feeds the prompt in chunks of ``PREFILL_CHUNK`` rows with the output head on the last row only
(``keep=1``); this script times that on a fresh KV cache for several chunk sizes (interleaved repeats, median),
on the int4 graph and, where the export has one (``edgespec export --prefill-int8``), on its int8 prefill graph
and, in the same run, llama.cpp's prompt processing of the same number of tokens on the export's own GGUF
(``llama-bench -p N -n 0 -t THREADS``, its default batch sizes). Figures are tok/s (prompt tokens / wall time).

Usage (the real pair exported; llama.cpp built by ``python bench/peers_build.py``; a quiet machine):
    python bench/prefill_sweep.py --tokens 1043 --chunks 128,256,512,1043 --out bench/results/prefill-sweep
writes ``<out>.json`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from llama_server import finish  # noqa: E402

from edgespec import paths  # noqa: E402
from edgespec.errors import EdgespecError  # noqa: E402


def prompt_ids(tokenizer, n: int) -> list[int]:
    """``n`` token ids of real code: this repository's own runtime source, repeated if short."""
    text = "".join(p.read_text() for p in sorted((Path(__file__).resolve().parent.parent / "edgespec").glob("*.py")))
    ids = tokenizer.encode(text).ids
    while len(ids) < n:
        ids = ids + ids
    return ids[:n]


def time_prefill(dec, ids: list[int], chunk: int, prefill_graph: bool = False) -> float:
    """Wall ms of one prefill of ``ids`` on a fresh target cache in chunks of ``chunk`` rows (head on last row);
    ``prefill_graph``: on the export's int8 prefill graph (``edgespec export --prefill-int8``) as the runtime's
    prefill runs chunks of ≥ 64 rows, else on the int4 graph."""
    dec.reset()
    cache = dec.tcache
    t0 = time.perf_counter()
    for i in range(0, len(ids), chunk):
        dec.target.forward(ids[i:i + chunk], cache, keep=1, prefill=prefill_graph)
    return (time.perf_counter() - t0) * 1e3


def llama_bench(binary: Path, gguf: Path, n: int, threads: int, repeats: int) -> dict:
    """llama-bench's prompt processing of ``n`` tokens: its JSON record (``avg_ts`` tok/s) and the command."""
    cmd = [str(binary), "-m", str(gguf), "-p", str(n), "-n", "0", "-t", str(threads), "-r", str(repeats), "-o", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise EdgespecError(f"llama-bench failed ({out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
    rec = json.loads(out.stdout)[0]
    return {"tok_s": float(rec["avg_ts"]), "tok_s_stdev": float(rec.get("stddev_ts", 0.0)),
            "n_batch": rec.get("n_batch"), "n_ubatch": rec.get("n_ubatch"), "command": " ".join(cmd)}


def run(args) -> dict:
    from peers import cpu_model, find_gguf
    from peers_build import binaries, cache_dir

    from edgespec.engine.decoder import SpecDecoder

    try:
        chunks = [int(c) for c in args.chunks.split(",")]
    except ValueError:
        chunks = [0]
    if any(c < 1 for c in chunks) or args.tokens < 1 or args.repeats < 1:
        raise ValueError(f"--chunks must be positive integers (got {args.chunks!r}), --tokens and --repeats >= 1")
    export = Path(args.export) if args.export else paths.default_export_dir()
    dec = SpecDecoder.load(export, threads=args.threads)
    ids = prompt_ids(dec.tokenizer, args.tokens)
    graphs = [False] + ([True] if dec.target.prefill_session is not None else [])  # both, interleaved
    configs = [(c, g) for c in chunks for g in graphs]
    for g in graphs:
        time_prefill(dec, ids[:64], 64, g)  # warm the sessions (first-run allocations)
    ms: dict[tuple, list[float]] = {cg: [] for cg in configs}
    for r in range(args.repeats):
        for cg in configs[r % len(configs):] + configs[:r % len(configs)]:
            ms[cg].append(time_prefill(dec, ids, *cg))
    edgespec = {f"{c}{' prefill graph' if g else ''}": {"ms_p50": float(np.median(v)), "ms": v,
                                                         "tok_s": args.tokens / (np.median(v) / 1e3)}
                for (c, g), v in ms.items()}
    del dec
    llama = None
    if not args.no_llama:
        build = args.llama_build or cache_dir() / "build"
        b = binaries(build)
        if "llama-bench" not in b:
            raise EdgespecError(f"no llama-bench in {build}: run python bench/peers_build.py")
        target_gguf = find_gguf(export, "target", args.target_gguf)
        llama = llama_bench(b["llama-bench"], target_gguf, args.tokens, args.threads, args.repeats)
    return {"cpu": cpu_model(), "threads": args.threads, "tokens": args.tokens, "repeats": args.repeats,
            "export": str(export), "edgespec": edgespec, "llama.cpp": llama,
            "command": "python bench/prefill_sweep.py " + " ".join(sys.argv[1:]),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def table(result: dict) -> str:
    rows = ["| runtime | chunk | prefill tok/s | vs llama.cpp |", "|---|---|---|---|"]
    ll = result["llama.cpp"]
    for c, e in result["edgespec"].items():
        ratio = f"{e['tok_s'] / ll['tok_s']:.2f}×" if ll else "—"
        rows.append(f"| edgespec | {c} | {e['tok_s']:.1f} | {ratio} |")
    if ll:
        rows.append(f"| llama.cpp | n_batch {ll['n_batch']}, n_ubatch {ll['n_ubatch']} | {ll['tok_s']:.1f} | 1.00× |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("export", nargs="?", help="export directory (default: the default pair in the user cache)")
    ap.add_argument("--tokens", type=int, default=1043, help="prompt tokens (default: %(default)s)")
    ap.add_argument("--chunks", default="128,256,512,1043", help="edgespec chunk sizes (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-llama", action="store_true", help="edgespec only")
    ap.add_argument("--target-gguf", type=Path, help="target GGUF for llama.cpp (default: the export's source)")
    ap.add_argument("--llama-build", type=Path, help="llama.cpp cmake build dir (default: <cache>/peers/build)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/prefill-sweep"), help="writes OUT.json")
    return finish(ap.parse_args(argv), run, table)


if __name__ == "__main__":
    sys.exit(main())
