"""Give back the clean file-backed pages a loaded graph keeps mapped (Linux), to cut the process's RSS.

onnxruntime memory-maps a graph's external data file (``model.onnx.data``) and packs each int4 MatMulNBits
weight into its own buffer at load. Reading the file for that packing makes its pages resident in the
process; the packed weights' mappings are released afterwards, but on x86 the MatMulNBits kernel does not
release its ``scales`` input (it packs them into its buffer and reports them as not packed), so every scale
of the graph stays mapped and resident: 0.125 byte per weight at block size 32, 184 MB for Qwen2.5-1.5B,
59 MB for the 0.5B (measured, docs/benchmarks.md "Memory"). The embedding table is mapped too; only the
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
import mmap
import os
import re
import sys
from pathlib import Path

import numpy as np

MADV_DONTNEED = 4  # the same value on x86_64 and aarch64 Linux
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
        maps = _mappings(Path("/proc/self/smaps").read_text())
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


def release_file_pages(paths) -> int:
    """Drop this process's resident clean pages of the files ``paths`` (Linux); returns the bytes given back.

    Only mappings whose every resident page is file content (no ``Anonymous`` kB: no private copy of a
    written page) are advised; reading such a page again faults in the same bytes. Returns 0 without
    doing anything on other systems or when /proc or ``madvise`` is unavailable. Never raises.
    """
    if not sys.platform.startswith("linux"):
        return 0
    ids = _file_ids(paths)
    try:
        maps = _mappings(Path("/proc/self/smaps").read_text())
        # the same ranges in /proc/self/maps: under qemu-user emulation (the aarch64 check) maps shows the
        # guest's view and smaps may show the host's; a range that is not in both is never advised
        listed = {(m["start"], m["end"], m["file"]) for m in _mappings(Path("/proc/self/maps").read_text())}
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
        if madvise(m["start"], m["end"] - m["start"], MADV_DONTNEED) == 0:
            released += m["Rss"] * 1024
    return released


def anonymous_zeros(count: int, shape: tuple[int, ...], dtype=np.float32) -> list[np.ndarray]:
    """``count`` zeroed C-contiguous arrays of ``shape`` over one anonymous memory mapping.

    The kernel hands out zero pages on first touch, so the process's RSS grows with the rows written, not
    with ``shape``; the mapping is unmapped when the last array over it is gone. (``numpy.zeros`` uses
    ``calloc``, which clears a reused heap block by writing every page.)
    """
    one = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if count * one == 0:
        return [np.zeros(shape, dtype) for _ in range(count)]
    flat = np.frombuffer(mmap.mmap(-1, count * one), dtype=dtype)
    return [flat[i * (one // flat.itemsize):(i + 1) * (one // flat.itemsize)].reshape(shape) for i in range(count)]


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
