"""The aarch64 check: the token-id comparison it uses (tiny tier), and the script itself (opt-in, --aarch64)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgespec.engine.decoder import SpecDecoder
from edgespec.bench.evaluate import compare_greedy, plain_row

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "aarch64-check.sh"


def test_compare_greedy_accepts_equal_ids_and_judges_a_divergence_by_both_rows(tiny_export):
    dec = SpecDecoder.load(tiny_export, load_draft=False)
    ids = dec.encode(messages=[{"role": "user", "content": "def add(a, b):"}])
    ref = dec.generate(input_ids=ids, max_new_tokens=8, proposers=()).run().token_ids
    assert compare_greedy(dec, ids, ref, list(ref)) == {"identical": True, "first_divergence": None, "gap": None,
                                                         "equal_prefix": len(ref), "ok": True}
    row = plain_row(dec, ids, ref[:3])
    second = int(row.argsort()[-2])
    other = ref[:3] + [second] + ref[4:]
    r = compare_greedy(dec, ids, ref, other)  # without the other machine's row: no verdict
    top = sorted(row)[-2:]
    assert r["first_divergence"] == 3 and r["gap"] == pytest.approx(float(top[1] - top[0]), abs=1e-6)
    assert r["ok"] is None
    flipped = row.copy()  # the other machine's row: the same two candidates, their order swapped
    flipped[second] = row[ref[3]] + 1e-3
    r = compare_greedy(dec, ids, ref, other, flipped)
    assert r["ok"] and r["delta"] >= r["gap"]
    wild = np.zeros_like(row)
    wild[second] = 1.0
    assert not compare_greedy(dec, ids, ref, other, wild)["ok"]  # a row that invents its own top two
    short = compare_greedy(dec, ids, ref, ref[:5])
    assert short["first_divergence"] == 5 and not short["identical"] and short["ok"] is False


def test_the_aarch64_sides_steps_on_this_machine(tiny_export, tmp_path):
    """The script's aarch64-side commands (greedy, row) and the verdict, run here on a tiny export."""
    prompt = "def add(a, b):"
    ref_py = [sys.executable, str(SCRIPT.parent / "aarch64_ref.py")]
    dec = SpecDecoder.load(tiny_export, load_draft=False)
    ids = dec.encode(messages=[{"role": "user", "content": prompt}])
    plain = dec.generate(input_ids=ids, max_new_tokens=10, proposers=()).run().token_ids
    second = int(plain_row(dec, ids, plain[:4]).argsort()[-2])
    (tmp_path / "x86-plain.json").write_text(json.dumps({"token_ids": plain}))
    (tmp_path / "aarch64-plain.json").write_text(json.dumps({"token_ids": plain[:4] + [second]}))
    for side in ("x86", "aarch64"):
        (tmp_path / f"{side}-chat.txt").write_text("hello\n")
    run = lambda *a: subprocess.run(ref_py + [str(x) for x in a], capture_output=True, text=True, timeout=300)
    assert run("divergence", tmp_path).stdout.strip() == "4"
    assert run("greedy", tiny_export, prompt, 10, 4, tmp_path / "aarch64-greedy.json").returncode == 0
    g = json.loads((tmp_path / "aarch64-greedy.json").read_text())
    assert g["ok"] and g["consistent"]
    assert run("row", tiny_export, prompt, tmp_path / "x86-plain.json", 4, tmp_path / "aarch64-row.npy").returncode == 0
    # this machine's own row as "aarch64's": its argmax is x86's token, not the one aarch64 chose: a FAIL
    v = run("verdict", tiny_export, prompt, tmp_path, "tiny")
    assert v.returncode == 1 and "FAIL" in v.stdout and "kernel flip by the two machines' rows: NO" in v.stdout
    swapped = np.load(tmp_path / "aarch64-row.npy")
    swapped[second] = swapped[plain[4]] + 1e-3
    np.save(tmp_path / "aarch64-row.npy", swapped)
    v = run("verdict", tiny_export, prompt, tmp_path, "tiny")
    assert v.returncode == 0 and "PASS" in v.stdout, v.stdout + v.stderr


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
