"""Build the test suite's tiny random pair (``tests/conftest.py``'s ``tiny_export``: a 2-layer qwen2 target, its
copy with 10% weight noise as the draft, fp32, the exporter's default graph format) at OUT, for benchmarks that
time the Python around the models (``bench/compare_checkouts.py``). Needs the ``export`` extra.

    python bench/tiny_pair.py OUT_DIR
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tinymodels import build_model  # noqa: E402

from edgespec.export import ExportOptions, export_pair  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="export directory to write (must not exist)")
    a = ap.parse_args(argv)
    if a.out.exists():
        print(f"error: {a.out} exists", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as d:
        target = build_model(Path(d) / "target", "qwen2", seed=0, layers=2, hidden=64)
        draft = build_model(Path(d) / "draft", "qwen2", seed=0, noise=0.1)
        fp32 = ExportOptions(precision="fp32")
        print(export_pair(str(target), str(draft), a.out, fp32, fp32))
    return 0


if __name__ == "__main__":
    sys.exit(main())
