"""An int8 KV cache's float32 copy, for a prefill graph that attends in float32 (``GraphSpec.prefill_kv_cache``).

onnxruntime's ``GroupQueryAttention`` with an int8 cache has no GEMM path for many query rows (a 256-row prompt
chunk 3–4× slower than with a float32 cache, docs/benchmarks.md "The int8 prefill graph"). An export made with ``--kv-int8
--prefill-int8`` therefore keeps its prefill graph's cache float32: the runtime dequantizes the cached rows into a
float32 copy (exactly what the int8 graph reads), runs the prompt chunk on it, and quantizes the new rows into the
int8 cache as ``GroupQueryAttention`` does (:class:`Float32Copy`, mixed into
:class:`edgespec.io.onnx_model.InPlaceKVCache`), with the scales of the export's ``kv_scales`` file
(:func:`load_kv_scales`).
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from ..errors import EdgespecError, first_line
from .manifest import GraphSpec


class Float32Copy:
    """The float32 copy of an int8 in-place cache; needs ``buffers``, ``length``, ``capacity``, ``max_length``,
    ``dtype``, ``_shape`` and ``reserve`` (:class:`edgespec.io.onnx_model.InPlaceKVCache`), and the constructor
    signature ``(num_layers, num_kv_heads, head_dim, capacity, max_length)`` for a float32 one."""

    _float32 = None  # the copy while a prefill runs on it (the cache's crop and load shorten or drop it)

    def float32_copy(self, scales: list[np.ndarray]) -> Float32Copy:
        """An int8 cache's valid rows dequantized, as a float32 cache of the same class and capacity: the
        past of a prefill graph that attends in float32 (``GraphSpec.prefill_kv_cache``). ``scales`` float32
        (1, kv_heads, 1, head_dim) per buffer (int8 q stands for q · scale). Kept while consecutive prefill
        chunks run (only rows it lacks are dequantized); :meth:`drop_float32` frees it.

        Raises:
            EdgespecError: the cache is not int8.
        """
        if self.dtype != np.int8:
            raise EdgespecError(f"a float32 copy is of an int8 KV cache, not a {self.dtype} one")
        f = self._float32
        if f is None or f.capacity < self.capacity:
            _, kv, hd = self._shape
            f = self._float32 = type(self)(len(self.buffers) // 2, kv, hd, self.capacity, self.max_length)
        start, end = min(f.length, self.length), self.length
        for dst, src, scale in zip(f.buffers, self.buffers, scales):
            dst[:, :, start:end] = src[:, :, start:end] * scale
        f.length = end
        return f

    def store_from(self, f: Float32Copy, scales: list[np.ndarray]) -> None:
        """Quantize the rows a float32 prefill wrote into ``f`` (:meth:`float32_copy`) past this cache's length,
        q = clip(round(x / scale), −128, 127) as onnxruntime's GroupQueryAttention quantizes, into this cache,
        and write q · scale back into ``f`` so that its rows stay exactly what the int8 cache holds (the next chunk
        attends to what decoding will read)."""
        start, end = self.length, f.length
        self.reserve(end)
        for dst, src, scale in zip(self.buffers, f.buffers, scales):
            q = np.clip(np.rint(src[:, :, start:end] / scale), -128, 127)
            dst[:, :, start:end] = q
            src[:, :, start:end] = q * scale
        self.length = end

    def stale_from(self, n: int) -> None:
        """Rows from ``n`` on of the int8 cache changed (a crop, a scattered keep, a graph that writes the int8 cache
        itself): the copy keeps only the rows before them (the next :meth:`float32_copy` re-reads the rest)."""
        if self._float32 is not None:
            self._float32.length = min(self._float32.length, n)

    def drop_float32(self) -> None:
        """Free the float32 copy (the decoder's prefill does at its end: an idle cache keeps its int8 rows only;
        a decode step only marks its rows stale, so a draft's catch-ups re-read just the rows written since)."""
        self._float32 = None


def load_kv_scales(path: Path, spec: GraphSpec, names: list[str]) -> list[np.ndarray]:
    """The int8 cache's per-channel scales of ``spec.kv_scales`` (an ``.npz``), float32 (1, kv_heads, 1,
    head_dim) each, in the order of ``names`` (the graph's past inputs).

    Raises:
        EdgespecError: the file is unreadable, lacks a name, or holds a scale of another shape, or one that is
            not finite and positive (export again).
    """
    want = (1, spec.num_kv_heads, 1, spec.head_dim)
    try:
        z = np.load(path, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):  # a bare .npy array under the name
            raise ValueError("not an .npz archive")
        with z:
            scales = [np.asarray(z[n], dtype=np.float32) for n in names]
    except KeyError as e:
        raise EdgespecError(f"{path}: no KV scale {e} (export again)") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise EdgespecError(f"{path}: unreadable KV scales ({first_line(e)}; export again)") from None
    for n, sc in zip(names, scales):
        if sc.shape != want or not np.all(np.isfinite(sc)) or not np.all(sc > 0):
            raise EdgespecError(f"{path}: the KV scale {n} is not finite, positive float32 {want} (export again)")
    return scales
