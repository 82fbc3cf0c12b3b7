"""The TypeScript core (android_demo/core) against the Python runtime, on exports made in this run.

Opt-in (``pytest --android-core``; CI runs it after ``npm ci`` in android_demo/core): writes test vectors with
``android_demo/core/scripts/make_vectors.py`` for the tiny pair in graph formats 2 and 3 and the tiny self-pair
(draft == target), then runs ``npm test`` on them; with ``--real-pair`` also on the real default pair in the
user cache.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest


CORE = Path(__file__).resolve().parents[1] / "android_demo" / "core"
pytestmark = pytest.mark.android_core


def _make_vectors():
    spec = importlib.util.spec_from_file_location("make_vectors", CORE / "scripts" / "make_vectors.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main


def _npm_test(vectors: list[Path]) -> str:
    if shutil.which("npm") is None:
        pytest.fail("npm is not installed (the TypeScript core needs Node.js 20 and npm)")
    if not (CORE / "node_modules").is_dir():
        pytest.fail("android_demo/core has no node_modules: run `npm ci` there first (the README's test command does)")
    env = {**os.environ, "EDGESPEC_VECTORS": os.pathsep.join(str(v) for v in vectors)}
    r = subprocess.run(["npm", "test"], cwd=CORE, env=env, capture_output=True, text=True, timeout=3600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-12000:]
    assert "# fail 0" in out and "# skipped 0" in out, out[-4000:]
    return out


def test_core_on_the_tiny_exports(home, tiny_dirs, tiny_self_export, tiny_fim_export, tmp_path_factory, tmp_path):
    from conftest import _pair

    make = _make_vectors()
    vectors = []
    pairs = [("pair2", _pair(tmp_path_factory, tiny_dirs, "core2", "draft", 2), 2000),
             ("pair3", _pair(tmp_path_factory, tiny_dirs, "core3", "draft", 3), 1000),
             ("self", tiny_self_export, 500),
             ("fim", tiny_fim_export, 300)]  # its tokenizer has the FIM tokens (special) and tool-call tokens  # the self-pair's sampling check is mostly about full acceptance
    for name, d, draws in pairs:
        vectors.append(tmp_path / f"{name}.json")
        assert make([str(d), str(vectors[-1]), "--new-tokens", "24", "--draws", str(draws)]) == 0
    _npm_test(vectors)


@pytest.mark.real
def test_core_on_the_real_pair(real_export, tmp_path):
    out = tmp_path / "real.json"
    assert _make_vectors()([str(real_export), str(out), "--new-tokens", "24", "--draws", "150"]) == 0
    _npm_test([out])
