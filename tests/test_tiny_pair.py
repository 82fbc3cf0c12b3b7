"""bench/export_cost.py tiny: builds a loadable tiny pair, refuses an existing directory."""

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
import export_cost  # noqa: E402


def test_tiny_pair_builds_a_loadable_export(home, tmp_path, capsys):
    from edgespec import SpecDecoder

    out = tmp_path / "pair"
    assert export_cost.main(["tiny", str(out)]) == 0
    dec = SpecDecoder.load(out)
    assert dec.encode("hello")
    assert export_cost.main(["tiny", str(out)]) == 1
    assert "exists" in capsys.readouterr().err
