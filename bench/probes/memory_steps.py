"""Where a conversation's RSS growth happens: attribute it to each graph run (by graph and rows) and to the
code between runs, for any edgespec CLI command (issue 17).

    python bench/probes/memory_steps.py chat EXPORT_DIR --max-new-tokens 120 < turns.txt

Every ``OnnxLM.forward`` is wrapped: RSS (``/proc/self/statm``) is read before and after it, so a run's own
allocations (activations, newly written KV pages, arena growth) land on that run and everything else
(tokenizer, proposers, Python) lands "between runs". Prints, on stderr after the command: RSS at the first run
and at the end, the growth by (graph, rows: 1, 2-8, >8), and the twelve runs that grew it most. Linux only.
"""

from __future__ import annotations

import collections
import os
import sys

import edgespec.io.onnx_model as om

_PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE_MB


def main(argv: list[str]) -> int:
    runs = []  # (graph, rows, cache length after, RSS before, RSS after)
    forward = om.OnnxLM.forward

    def recorded(self, ids, cache, *a, **k):
        before = _rss_mb()
        out = forward(self, ids, cache, *a, **k)
        runs.append((self.spec.path.split("/")[0], len(ids), cache.length, before, _rss_mb()))
        return out

    om.OnnxLM.forward = recorded
    from edgespec.cli import main as cli

    try:
        return cli(argv)
    finally:
        if runs:
            report(runs)


def report(runs) -> None:
    inside, count = collections.defaultdict(float), collections.Counter()
    between = sum(b[3] - a[4] for a, b in zip(runs, runs[1:]))
    for graph, rows, _, before, after in runs:
        key = (graph, "1 row" if rows == 1 else "2-8 rows" if rows <= 8 else ">8 rows")
        inside[key] += after - before
        count[key] += 1
    err = sys.stderr
    print(f"RSS at the first run {runs[0][3]:.0f} MB, at the end {runs[-1][4]:.0f} MB", file=err)
    for key in sorted(inside):
        print(f"  {key[0]:6} {key[1]:8} {count[key]:5} runs  {inside[key]:+8.1f} MB", file=err)
    print(f"  between runs               {between:+8.1f} MB", file=err)
    print("runs that grew it most:", file=err)
    for graph, rows, length, before, after in sorted(runs, key=lambda r: r[3] - r[4])[:12]:
        print(f"  {graph:6} {rows:4} rows, cache {length:5} positions after it: {after - before:+7.1f} MB", file=err)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
