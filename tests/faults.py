"""Helpers for the fault tests: run the CLI in an isolated user directory, copy and edit an export."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path


def run(args, home, stdin=None, env=None, timeout=300):
    """``python -m edgespec.cli ARGS`` with EDGESPEC_HOME=home and ``env`` (None unsets); ``stdin`` str or bytes."""
    e = dict(os.environ, EDGESPEC_HOME=str(home))
    for k, v in (env or {}).items():  # None: unset
        if v is None:
            e.pop(k, None)
        else:
            e[k] = v
    binary = isinstance(stdin, bytes) or any(isinstance(a, bytes) for a in args)
    r = subprocess.run([sys.executable, "-m", "edgespec.cli", *args], input=stdin, capture_output=True,
                       env=e, timeout=timeout, text=not binary)
    if binary:
        r.stdout, r.stderr = r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
    return r


def one_line_error(r, says: str | tuple = (), progress: bool = False) -> str:
    """Assert ``r`` failed with exactly one ``edgespec: error:`` line on stderr (containing ``says``) and no
    traceback; returns that line. ``progress`` allows the exporter's progress lines before it."""
    assert r.returncode not in (0, None), (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("edgespec: warning:")]
    if progress:
        assert sum(ln.startswith("edgespec: error:") for ln in lines) == 1, r.stderr
        lines = lines[-1:]
    assert len(lines) == 1 and lines[0].startswith("edgespec: error:"), r.stderr
    for s in (says,) if isinstance(says, str) else says:
        assert s in lines[0], (s, lines[0])
    return lines[0]


def copy_export(src: Path, dst: Path, edit=None) -> Path:
    """A copy of the export ``src`` at ``dst``; ``edit(manifest dict) -> dict`` rewrites its manifest."""
    shutil.copytree(src, dst)
    if edit is not None:
        m = json.loads((dst / "edgespec.json").read_text())
        (dst / "edgespec.json").write_text(json.dumps(edit(m)))
    return dst


def manifest(d: Path) -> dict:
    return json.loads((Path(d) / "edgespec.json").read_text())


def tree_snapshot(d: Path) -> dict[str, bytes]:
    """Every file under ``d`` (relative path → bytes): to show that a failed command wrote nothing."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(Path(d).rglob("*")) if p.is_file()}
