"""Export profiles (``edgespec export --profile``, export/profiles.py): small, full, and auto by the machine's
memory; what each writes, what the manifest records, and the refusals."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from edgespec.errors import EdgespecError
from edgespec.export import ExportOptions, export_pair
from edgespec.export import profiles
from edgespec.export.profiles import FULL_MIN_RAM_GIB, apply_profile, physical_memory, resolve_profile
from edgespec.io.manifest import load_manifest

GIB = 2**30


def test_auto_takes_full_only_with_the_memory_for_it():
    assert resolve_profile("auto", int(FULL_MIN_RAM_GIB * GIB))[0] == "full"
    name, why = resolve_profile("auto", 4 * GIB)
    assert name == "small" and why == f"auto: 4.0 GiB of RAM (under {FULL_MIN_RAM_GIB:g})"
    assert resolve_profile("full", 1 * GIB) == ("full", "asked for")
    assert resolve_profile("small", 64 * GIB) == ("small", "asked for")
    assert physical_memory() is None or physical_memory() > 0
    with pytest.raises(EdgespecError, match="export profile 'medium': one of auto, small, full"):
        resolve_profile("medium")


def test_a_container_limit_below_the_machine_is_the_memory_auto_reads(tmp_path, monkeypatch):
    v2, v1 = tmp_path / "memory.max", tmp_path / "limit_in_bytes"
    monkeypatch.setattr(profiles, "CGROUP_LIMITS", (str(v2), str(v1)))
    machine = physical_memory()  # neither file exists: the machine's own
    v2.write_text("max\n")  # cgroup v2 without a limit
    assert physical_memory() == machine
    v1.write_text(f"{4 * GIB}\n")  # a 4 GiB container
    assert physical_memory() == min(machine, 4 * GIB)
    assert resolve_profile("auto")[0] == ("small" if FULL_MIN_RAM_GIB > 4 else "full")


@pytest.mark.parametrize("opts, full, small", [
    (ExportOptions("int4", graph_format=3), (True, True), (False, False)),
    (ExportOptions("int4", graph_format=2), (True, False), (False, False)),  # an int8 cache needs format 3
    (ExportOptions("int8", graph_format=3), (False, False), (False, False)),  # the prefill graph needs int4
    (ExportOptions("int4", graph_format=3, zero_points=True, tensor_blocks=(("down_proj", 16),)), (True, True),
     (False, False)),  # any int4 blocks make a prefill graph
    (ExportOptions("int4", graph_format=3, kv_int8=False), (True, False), (False, False)),  # --no-kv-int8
    (ExportOptions("int4", graph_format=3, prefill_int8=False), (False, False), (False, False)),
    (ExportOptions("int4", graph_format=3, kv_int8=True), (True, True), (False, True)),  # --kv-int8 alone
])
def test_a_profile_fills_only_the_pieces_left_unset_and_only_where_they_apply(opts, full, small):
    for name, want in (("full", full), ("small", small)):
        o = apply_profile(name, opts)
        assert (o.prefill_int8, o.kv_int8) == want, name


@pytest.fixture(scope="module")
def full_export(home, tiny_dirs, tmp_path_factory):
    o = ExportOptions("int4", graph_format=3)
    return export_pair(str(tiny_dirs["target"]), str(tiny_dirs["draft"]), tmp_path_factory.mktemp("profile") / "p",
                       o, o, profile="full")


def test_the_full_profile_writes_prefill_graphs_and_int8_caches_and_says_so(full_export, home):
    m = load_manifest(full_export)
    assert (m.profile, m.profile_chosen_by) == ("full", "asked for")
    for role in ("target", "draft"):
        g = getattr(m, role)
        assert g.prefill_path == f"{role}/prefill.onnx" and g.kv_cache == "int8"
        assert g.validation["kv_int8"]["greedy_agreement"] >= 0.9
    env = {"EDGESPEC_HOME": str(home)}
    out = subprocess.run([sys.executable, "-m", "edgespec.cli", "info", str(full_export)], capture_output=True, text=True,
                         env={**os.environ, **env}, check=True).stdout
    assert "profile: full (asked for)" in out.splitlines()[1]
    shown = json.loads(subprocess.run([sys.executable, "-m", "edgespec.cli", "info", str(full_export), "--json"],
                                      capture_output=True, text=True, env={**os.environ, **env},
                                      check=True).stdout)
    assert shown["profile"] == "full"


def test_small_writes_the_int4_graphs_alone(home, tiny_dirs, tmp_path):
    o = ExportOptions("int4", graph_format=3)
    m = load_manifest(export_pair(str(tiny_dirs["target"]), str(tiny_dirs["draft"]), tmp_path / "s", o, o,
                                  profile="small"))
    assert m.profile == "small"
    assert all(getattr(m, r).prefill_path is None and getattr(m, r).kv_cache == "float32" for r in ("target", "draft"))


def test_without_a_profile_the_library_writes_what_it_is_asked(home, tiny_dirs, tmp_path):
    o = ExportOptions("int4", graph_format=3)
    m = load_manifest(export_pair(str(tiny_dirs["target"]), str(tiny_dirs["draft"]), tmp_path / "n", o, o))
    assert m.profile is None and m.target.prefill_path is None and m.target.kv_cache == "float32"


def test_full_asked_for_where_it_adds_nothing_is_refused_and_auto_records_small(home, tiny_dirs, tmp_path,
                                                                               monkeypatch):
    fp32 = ExportOptions("fp32")
    with pytest.raises(EdgespecError, match="--profile full adds nothing to this pair .*target: fp32 weights"):
        export_pair(str(tiny_dirs["target"]), str(tiny_dirs["draft"]), tmp_path / "f", fp32, fp32, profile="full")
    assert not (tmp_path / "f").exists()
    monkeypatch.setattr(profiles, "physical_memory", lambda: 64 * GIB)
    m = load_manifest(export_pair(str(tiny_dirs["target"]), str(tiny_dirs["draft"]), tmp_path / "a", fp32, fp32,
                                  profile="auto"))
    assert m.profile == "small" and "but full adds nothing here (target: fp32 weights" in m.profile_chosen_by


def test_a_bad_profile_in_a_manifest_is_refused_where_it_enters(full_export, tmp_path):
    d = tmp_path / "copy"
    shutil.copytree(full_export, d)
    raw = json.loads((d / "edgespec.json").read_text())
    raw["profile"] = "medium"
    (d / "edgespec.json").write_text(json.dumps(raw))
    with pytest.raises(EdgespecError, match="profile is \"medium\", not one of small, full"):
        load_manifest(d)


@pytest.mark.parametrize("argv, message", [
    (["export", "--voice", "--profile", "full"], "--profile applies to a pair export, not to --voice"),
    (["export", "--voice", "--no-kv-int8"], "--no-kv-int8 applies to a pair export, not to --voice"),
    (["export", "--profile", "medium"], "invalid choice: 'medium'"),
    (["export", "nonexistent-pair", "--profile", "bogus"], "invalid choice: 'bogus'"),
])
def test_profile_flags_are_refused_where_they_mean_nothing(argv, message, home):
    r = subprocess.run([sys.executable, "-m", "edgespec.cli", *argv], capture_output=True, text=True,
                       env={**os.environ, "EDGESPEC_HOME": str(home)})
    assert r.returncode != 0 and message in r.stderr and "Traceback" not in r.stderr
