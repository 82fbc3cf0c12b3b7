"""The aarch64 check: the token-id comparison it uses (tiny tier), and the script itself (opt-in, --aarch64)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.decoder import SpecDecoder
from edgespec.evaluate import NEAR_TIE_LOGIT_GAP, compare_greedy

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "aarch64-check.sh"


def test_compare_greedy_accepts_equal_ids_and_judges_a_divergence_by_the_gap(tiny_export):
    dec = SpecDecoder.load(tiny_export, load_draft=False)
    ids = dec.encode(messages=[{"role": "user", "content": "def add(a, b):"}])
    ref = dec.generate(input_ids=ids, max_new_tokens=8, proposers=()).run().token_ids
    assert compare_greedy(dec, ids, ref, list(ref)) == {"identical": True, "first_divergence": None, "gap": None,
                                                         "equal_prefix": len(ref), "ok": True}
    row = dec.target.forward(ids + ref[:3], dec.target.new_cache(), keep=1)[-1]
    second = int(row.argsort()[-2])
    other = ref[:3] + [second] + ref[4:]
    r = compare_greedy(dec, ids, ref, other)
    top = sorted(row)[-2:]
    assert r["first_divergence"] == 3 and r["gap"] == pytest.approx(float(top[1] - top[0]), abs=1e-3)
    assert r["ok"] == (r["gap"] < NEAR_TIE_LOGIT_GAP)
    short = compare_greedy(dec, ids, ref, ref[:5])
    assert short["first_divergence"] == 5 and not short["identical"]


def test_script_rejects_bad_arguments_in_one_line():
    r = subprocess.run(["bash", str(SCRIPT), "--tokens", "x"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "--tokens" in r.stderr
    r = subprocess.run(["bash", str(SCRIPT), "--frobnicate"], capture_output=True, text=True)
    assert r.returncode == 2 and "unknown argument --frobnicate" in r.stderr


@pytest.mark.aarch64
def test_tiny_export_gives_the_same_greedy_tokens_on_aarch64():
    r = subprocess.run(["bash", str(SCRIPT), "--python", sys.executable], capture_output=True, text=True,
                       timeout=3600)
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert lines[-1].startswith("aarch64-check tiny: PASS"), lines[-1]
    assert "aarch64" in r.stdout and "onnxruntime" in r.stdout
