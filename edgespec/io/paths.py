"""Where edgespec keeps its files, and how it writes them safely.

The user cache (exports, assembled weights, cached graphs, calibration) is ``$EDGESPEC_HOME``, else
``$XDG_CACHE_HOME/edgespec``, else ``~/.cache/edgespec`` (tests set ``EDGESPEC_HOME`` to isolate it).

Everything written under it goes through a temporary name carrying the writer's process id
(``NAME.tmp<pid>``) and one rename, so a reader never sees half a file. A writer killed on the way leaves its
temporary behind; :func:`sweep_stale` removes those whose process is gone, on the next run. Writers of one
entry serialize on :func:`file_lock`. A cache that cannot be written is reported once (a warning) and
skipped: :func:`cache_dir` returns None and callers run without caching.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import warnings
from pathlib import Path
from typing import Iterator

from ..errors import EdgespecError, EdgespecWarning

DEFAULT_PAIR = "qwen2.5-coder-1.5b+0.5b"
_TEMP = re.compile(r"\.(tmp|old)(\d+)$")  # NAME.tmp<pid>, .NAME.old<pid>
_warned: set[str] = set()


def home() -> Path:
    """The edgespec cache root (not created)."""
    if os.environ.get("EDGESPEC_HOME"):
        return Path(os.environ["EDGESPEC_HOME"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edgespec"


def exports_dir() -> Path:
    """Directory holding one export directory per pair recipe name."""
    return home() / "exports"


def default_export_dir(pair: str = DEFAULT_PAIR) -> Path:
    """Export directory used by ``edgespec chat`` when no DIR is given."""
    return exports_dir() / pair


def warn_once(message: str) -> None:
    """An :class:`EdgespecWarning` with ``message``, once per process (the CLI prints it as one line)."""
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, EdgespecWarning, stacklevel=3)


def cache_dir(name: str) -> Path | None:
    """``home()/name``, created; None (and a one-line warning, once) if it cannot be created or written."""
    d = home() / name
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe = d / f".probe{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        return d
    except OSError as e:
        warn_once(f"the user cache {home()} is not writable ({e.strerror or e}); running without caching "
                  "(set EDGESPEC_HOME to a writable directory)")
        return None


def write_atomic(path: Path, data: bytes | str) -> bool:
    """Write ``path`` through ``path.tmp<pid>`` and one rename; False (nothing left behind) if it fails."""
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
        if path.is_dir() and not path.is_symlink():  # a directory where the file belongs: a broken entry
            shutil.rmtree(path)
        os.replace(tmp, path)
        return True
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return False


def check_out(path: Path, flag: str = "--out") -> Path:
    """``path`` (``~`` expanded) if a result can be written there: its folder exists and is writable, and it is not
    itself a folder. Checked before a run, so a long run never ends without a place for its result. Raises
    EdgespecError: it cannot be."""
    path = Path(path).expanduser()
    if not path.parent.is_dir():
        raise EdgespecError(f"{path.parent}: no such directory for {flag}")
    if path.is_dir():
        raise EdgespecError(f"{path}: is a directory, not a file for {flag}")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise EdgespecError(f"{path.parent}: not writable, for {flag}")
    return path


def write_json(path: Path, data) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file of its own beside it (never a half-written
    result, nothing left behind, no clash with another run writing the same file). Raises EdgespecError: it
    cannot be written (one line, naming the file)."""
    import json
    import tempfile

    text = json.dumps(data, indent=1)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # as an ordinary new file (mkstemp makes it 0600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise EdgespecError(f"{path}: cannot write the result ({e.strerror or e})") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (any user's)."""
    if pid == os.getpid():
        return True
    if sys.platform == "win32":  # os.kill(pid, 0) would terminate the process there
        return True  # never sweep on Windows: keep the temporary rather than risk a live writer's
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True
    return True


def stale_temp(path: Path) -> bool:
    """``path`` is a ``.tmp<pid>``/``.old<pid>`` entry whose writer is gone."""
    m = _TEMP.search(path.name)
    return bool(m) and not pid_alive(int(m.group(2)))


def remove(path: Path) -> None:
    """Delete a file or a directory tree; missing is fine."""
    with contextlib.suppress(FileNotFoundError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def sweep_stale(directory: Path, keep_old: bool = False) -> list[Path]:
    """Remove the temporaries in ``directory`` left by killed writers; returns what was removed.

    ``keep_old`` leaves ``.old<pid>`` entries alone (an export directory's previous version, which
    :func:`recover_export` may need to put back).
    """
    removed = []
    try:
        entries = list(directory.iterdir())
    except OSError:
        return removed
    for p in entries:
        if stale_temp(p) and not (keep_old and _TEMP.search(p.name).group(1) == "old"):
            try:
                remove(p)
                removed.append(p)
            except OSError:
                pass
    return removed


def recover_export(out: Path) -> None:
    """Finish or undo a re-export of ``out`` that was killed between its two renames, then sweep.

    A re-export writes ``.OUT.tmp<pid>`` (manifest last), renames ``OUT`` to ``.OUT.old<pid>``, renames the
    new one to ``OUT`` and deletes the old one. If ``OUT`` is missing, a complete new version is put in
    place, else the old one is put back. Entries of live processes are left alone.
    """
    parent = out.parent
    try:
        entries = list(parent.iterdir())
    except OSError:
        return
    mine = [p for p in entries if p.name.startswith(f".{out.name}.") and _TEMP.fullmatch(p.name[len(out.name) + 1:])
            and stale_temp(p)]
    if not out.exists():
        new = [p for p in mine if ".tmp" in p.name[len(out.name) + 1:] and (p / "edgespec.json").is_file()]
        old = [p for p in mine if ".old" in p.name[len(out.name) + 1:] and (p / "edgespec.json").is_file()]
        for candidate in new + old:
            try:
                os.replace(candidate, out)
                mine.remove(candidate)
                break
            except OSError:
                continue
    for p in mine:
        with contextlib.suppress(OSError):
            remove(p)


@contextlib.contextmanager
def file_lock(path: Path, what: str) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (a lock file, created; or an existing directory) for the
    block; waits for another holder, saying so once on stderr. Without ``fcntl`` (Windows) or a writable
    location, runs unlocked."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    try:
        fd = os.open(path, os.O_RDONLY) if path.is_dir() else os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"edgespec: waiting for another edgespec process ({what})", file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
