"""Give back the clean file-backed pages a loaded graph keeps mapped (Linux), to cut the process's RSS.

onnxruntime memory-maps a graph's external data file (``model.onnx.data``) and packs each int4 MatMulNBits
weight into its own buffer at load. Reading the file for that packing makes its pages resident in the
process; the packed weights' mappings are released afterwards, but on x86 the MatMulNBits kernel does not
release its ``scales`` input (it packs them into its buffer and reports them as not packed), so every scale
of the graph stays mapped and resident: 0.125 byte per weight at block size 32, 184 MB for Qwen2.5-1.5B,
59 MB for the 0.5B (measured, docs/benchmarks.md "Other benchmarks"). The embedding table is mapped too; only the
rows of tokens seen are read.

None of these pages is read again for a step (the kernels use their packed copies), and none was written:
they equal the file. :func:`release_file_pages` drops them from the process with
``madvise(MADV_DONTNEED)``: the memory is no longer the process's, and a page that is read again later (an
embedding row) faults back in from the page cache or the file, with the same bytes. A mapping holding any
page the process wrote (a private copy: ``Anonymous`` in smaps) is left alone, since dropping it would lose
the write.

Two more habits of a long-running process on a small board live here: :func:`anonymous_zeros` gives the
graph-format-3 KV cache buffers whose pages become resident only as positions are written (``numpy.zeros``
over a reused heap block touches every page of a 4,096-position buffer at once: 224 MB for the 1.5B target),
and :func:`trim_heap` returns the C heap's free blocks after loading (the tokenizer's JSON parse leaves ~37 MB).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import re
import sys
import threading
from pathlib import Path

import numpy as np

MADV_DONTNEED = 4  # the same values on x86_64 and aarch64 Linux
MADV_PAGEOUT = 21  # Linux >= 5.4: reclaim the pages, never losing their content
_REFUSED: set[int] = set()  # advice values madvise answered EINVAL to
_HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) \S+ \S+ ([0-9a-f]+):([0-9a-f]+) (\d+)")


def _mappings(smaps: str) -> list[dict]:
    """The mappings of ``/proc/<pid>/smaps`` text: start, end, (major, minor, inode) and the kB fields."""
    maps = []
    for line in smaps.splitlines():
        m = _HEADER.match(line)
        if m:
            maps.append({"start": int(m[1], 16), "end": int(m[2], 16),
                         "file": (int(m[3], 16), int(m[4], 16), int(m[5]))})
        elif maps and line.endswith(" kB"):
            key, _, value = line.partition(":")
            maps[-1][key] = int(value.split()[0])
    return maps


def mapped_rss(paths) -> int:
    """Resident bytes of this process's mappings of the files ``paths`` (0 where /proc is missing)."""
    ids = _file_ids(paths)
    try:
        maps = _mappings(Path("/proc/self/smaps").read_text(errors="surrogateescape"))
    except OSError:
        return 0
    return sum(m.get("Rss", 0) * 1024 for m in maps if m["file"] in ids)


def _file_ids(paths) -> set[tuple[int, int, int]]:
    ids = set()
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            continue
        ids.add((os.major(st.st_dev), os.minor(st.st_dev), st.st_ino))
    return ids


def release_file_pages(paths, advice: int = MADV_DONTNEED) -> int:
    """Drop this process's resident clean pages of the files ``paths`` (Linux); returns the bytes given back.

    Only mappings whose every resident page is file content (no ``Anonymous`` kB: no private copy of a
    written page) are advised; reading such a page again faults in the same bytes. ``advice``
    :data:`MADV_DONTNEED` (the page cache keeps the pages: a later load reads them from memory) is for a
    process whose mappings do not change meanwhile; :data:`MADV_PAGEOUT` is safe while another thread maps
    and unmaps (a range it reuses is paged out, not cleared) and also evicts the pages from the page cache.
    The count is of the resident bytes advised: the kernel may keep some (a page another process maps).
    Returns 0 without doing anything on other systems or when /proc or ``madvise`` is unavailable (or
    refuses ``advice``: kernels before 5.4 know no MADV_PAGEOUT). Never raises.
    """
    if not sys.platform.startswith("linux") or advice in _REFUSED:
        return 0
    ids = _file_ids(paths)
    try:
        maps = _mappings(Path("/proc/self/smaps").read_text(errors="surrogateescape"))
        # the same ranges in /proc/self/maps: under qemu-user emulation (the aarch64 check) maps shows the
        # guest's view and smaps may show the host's; a range that is not in both is never advised
        listed = {(m["start"], m["end"], m["file"])
                  for m in _mappings(Path("/proc/self/maps").read_text(errors="surrogateescape"))}
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return 0
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    released = 0
    for m in maps:
        if m["file"] not in ids or m.get("Rss", 0) == 0 or (m["start"], m["end"], m["file"]) not in listed:
            continue
        if m.get("Anonymous", 1):
            continue
        if madvise(m["start"], m["end"] - m["start"], advice) == 0:
            released += m["Rss"] * 1024
        elif advice != MADV_DONTNEED and ctypes.get_errno() == errno.EINVAL:
            _REFUSED.add(advice)  # an advice this kernel (or qemu-user) does not know: not asked again
            break
    return released


class ReleaseWhileLoading:
    """While the ``with`` block runs (an onnxruntime session being created), release the files' clean pages
    every ``interval_s`` from a background thread with :data:`MADV_PAGEOUT`.

    onnxruntime reads every int4 weight and scale of the mapped data file to pack it; the weights' mappings
    go when packed, the scales' stay until :func:`release_file_pages` runs after loading. Without this, the
    load's peak holds the packed copy and all the scales read so far (measured on Qwen2.5-1.5B at block 32:
    1,496 MB peak against 1,199 MB after loading; 1,257-1,280 with this, docs/benchmarks.md). onnxruntime
    maps and unmaps meanwhile, so :data:`MADV_DONTNEED` (which clears whatever is mapped at the address
    by then) would not be safe; MADV_PAGEOUT never loses data. It also drops the pages from the page
    cache: the next process start reads them from disk again (+0.4 s for that model here).
    """

    def __init__(self, paths, interval_s: float = 0.05):
        self.paths, self.interval_s = list(paths), interval_s
        self.released = 0  # resident bytes advised, as release_file_pages counts them
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval_s) and MADV_PAGEOUT not in _REFUSED:
                self.released += release_file_pages(self.paths, MADV_PAGEOUT)
        except Exception:  # memory hygiene only: never a reason to disturb the load
            pass

    def __enter__(self) -> "ReleaseWhileLoading":
        if sys.platform.startswith("linux"):
            self._thread = threading.Thread(target=self._run, name="edgespec-release-pages", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def anonymous_zeros(count: int, shape: tuple[int, ...], dtype=np.float32) -> list[np.ndarray]:
    """``count`` zeroed C-contiguous arrays of ``shape`` over one private anonymous memory mapping.

    The kernel hands out zero pages on first touch, so the process's RSS grows with the rows written, not
    with ``shape``; the mapping is unmapped when the last array over it is gone. Each array starts on a page
    boundary. Transparent huge pages are turned off for the mapping (one 2 MB page would make a KV head's
    whole block resident at its first row; numpy asks for huge pages on arrays of 4 MB and more, which is
    how ``numpy.zeros`` buffers became fully resident at a chat's first step).
    """
    itemsize = np.dtype(dtype).itemsize
    one = int(np.prod(shape)) * itemsize
    if count * one == 0:
        return [np.zeros(shape, dtype) for _ in range(count)]
    stride = -(-one // mmap.PAGESIZE) * mmap.PAGESIZE
    if hasattr(mmap, "MAP_PRIVATE"):  # Unix: private, not the shared /dev/zero mapping of mmap(-1, n)'s default
        m = mmap.mmap(-1, count * stride, flags=mmap.MAP_PRIVATE)  # fd -1: CPython adds MAP_ANONYMOUS
        if hasattr(mmap, "MADV_NOHUGEPAGE"):
            m.madvise(mmap.MADV_NOHUGEPAGE)
    else:  # Windows: pagefile-backed, committed up front, zero pages on first touch
        m = mmap.mmap(-1, count * stride)
    flat = np.frombuffer(m, dtype=np.uint8)
    return [flat[i * stride:i * stride + one].view(dtype).reshape(shape) for i in range(count)]


def trim_heap() -> None:
    """Give the C heap's free memory back to the system (glibc ``malloc_trim(0)``); a no-op elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
