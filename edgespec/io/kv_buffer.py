"""What the two preallocated KV caches share (graph formats 3 and 4): the valid rows as views, growth, load.

:class:`~edgespec.io.onnx_model.InPlaceKVCache` (format 3) and :class:`~edgespec.io.grouped_kv.GroupedKVCache`
(format 4) keep per-layer-and-kind buffers float32 (1, kv_heads, capacity, head_dim) of which the first
``length`` rows are valid; both grow by doubling through their own ``_alloc``.
"""

from __future__ import annotations

import numpy as np

from ..errors import EdgespecError


class PreallocatedKV:
    """The shared part: needs ``buffers``, ``length``, ``max_length`` and ``_alloc(capacity, n, old)``."""

    buffers: list[np.ndarray]
    length: int
    max_length: int

    @property
    def capacity(self) -> int:
        return self.buffers[0].shape[2]

    @property
    def tensors(self) -> list[np.ndarray]:
        """Views (no copy) of the valid rows, float32 (1, kv_heads, length, head_dim) per layer and kind."""
        return [buf[:, :, :self.length] for buf in self.buffers]

    def reserve(self, total: int) -> None:
        """Make room for ``total`` positions (grow by doubling, one copy).

        Raises:
            EdgespecError: ``total`` is beyond the model's context length.
        """
        if total > self.max_length:
            raise EdgespecError(f"context of {total} tokens is longer than the model's {self.max_length}")
        if total > self.capacity:
            cap = self.capacity
            while cap < total:
                cap *= 2
            self._alloc(min(cap, self.max_length), len(self.buffers), self.buffers)

    def load(self, tensors: list[np.ndarray]) -> None:
        """Replace the contents with ``tensors`` (1, kv_heads, P, head_dim) per layer and kind, of the buffers'
        dtype (float32, or int8 for an int8 cache).

        Raises:
            EdgespecError: tensors of another dtype (an int8 cache never takes float32 rows by casting).
        """
        p = tensors[0].shape[2]
        if any(t.dtype != buf.dtype for buf, t in zip(self.buffers, tensors)):
            raise EdgespecError(f"a KV cache of {self.buffers[0].dtype} cannot load {tensors[0].dtype} tensors")
        self.length = 0
        self.reserve(p)
        for buf, t in zip(self.buffers, tensors):
            buf[:, :, :p] = t
        self.length = p
