"""Graph format 4's KV cache: per-KV-head buffers whose row prefixes are the graph's past, bound by pointer.

A format-4 graph (``export/grouped_graph.py``) takes each layer's past as one input per KV head,
``past_key_values.{i}.key|value.{h}`` float32 (W, head_dim), and returns the new rows of every layer as one
output ``present`` float32 (2 · layers, kv_heads, T, head_dim). The cache keeps all layers in one
preallocated block float32 (2 · layers, kv_heads, capacity, head_dim) (layer i's key at 2i, value at 2i+1),
so a head's first W rows ``block[j, h, :W]`` are one contiguous (W, head_dim) array: bound by pointer through
IO binding, read in place, never copied. After a run the T new rows are copied to rows P..P+T-1 (one numpy
assignment; a pointer binding per head would cost ~3 µs each, two hundred per step on the 1.5B target).

The bound window W is the past length rounded up to :data:`WINDOW` rows and is rebound only when the past
leaves it, so a decode step binds only its ids, positions, mask and outputs; the window's rows past P are
masked off (``attention_mask`` widened to W+T columns). As in :class:`edgespec.io.onnx_model.InPlaceKVCache`
(same ``length``, ``capacity``, ``tensors``, ``reserve``, ``crop`` and ``load``), rollback is a length change,
a tree's accepted path moves only its rows, and the block grows by doubling.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from .kv_buffer import PreallocatedKV
from .pages import anonymous_zeros

WINDOW = 64  # rows: the bound past is the past length rounded up to this (rebound every WINDOW steps)


def past_names(num_layers: int, num_kv_heads: int) -> list[str]:
    """The format-4 past input names, in block order: layer, then key/value, then KV head."""
    return [f"past_key_values.{i}.{kind}.{h}" for i in range(num_layers) for kind in ("key", "value")
            for h in range(num_kv_heads)]


def widen_mask(mask: np.ndarray, past: int, window: int) -> np.ndarray:
    """``mask`` bool (1, 1, T, P+T) as bool (1, 1, T, W+T) for a bound window of W ≥ P past rows: columns
    P..W-1 (rows of the window that are not part of the past) False."""
    if window == past:
        return mask
    t = mask.shape[2]
    out = np.zeros((1, 1, t, window + t), dtype=bool)
    out[..., :past] = mask[..., :past]
    out[..., window:] = mask[..., past:]
    return out


class GroupedKVCache(PreallocatedKV):
    """Graph format 4: one block float32 (2 · layers, kv_heads, capacity, head_dim); ``buffers`` are its
    per-layer-and-kind views (1, kv_heads, capacity, head_dim). :meth:`run` feeds a graph from it."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, capacity: int, max_length: int):
        self.names = past_names(num_layers, num_kv_heads)
        self.max_length = max_length
        self.length = 0
        self._shape = (1, num_kv_heads, head_dim)
        self._alloc(min(capacity, max_length), 2 * num_layers)

    def _alloc(self, capacity: int, n: int, old: list[np.ndarray] | None = None) -> None:
        _, kv, hd = self._shape
        block = anonymous_zeros(1, (n, kv, capacity, hd))[0]  # resident as rows are written
        if old is not None:
            block[:, :, :self.length] = self.block[:, :, :self.length]
        self.block = block
        self.buffers = [block[j:j + 1] for j in range(n)]
        self.bindings: dict[int, list] = {}  # per session: [IOBinding, bound window W]

    def crop(self, n: int, keep=()) -> None:
        """Keep positions 0..n-1, then the positions in ``keep`` (each ≥ n, in that order): a length change,
        or (a tree's scattered path) just those rows moved down to n.. in the block."""
        keep = list(keep)
        if keep != list(range(n, n + len(keep))):
            self.block[:, :, n:n + len(keep)] = self.block[:, :, np.asarray(keep, dtype=np.int64)]
        self.length = min(self.length, n + len(keep))

    def _window(self, io_entry: list, past: int) -> int:
        """The bound window for a run after ``past`` rows: kept while it still covers them (and is not more
        than two windows longer), else rounded up from ``past`` and rebound."""
        io, w = io_entry
        if w is not None and past <= w < past + 2 * WINDOW:
            return w
        w = min(self.capacity, -(-past // WINDOW) * WINDOW)
        kv, cap, hd = self.block.shape[1:]
        base, row = self.block.ctypes.data, hd * self.block.itemsize
        for j, name in enumerate(self.names):  # j = (2 · layer + kind) · kv + head
            io.bind_input(name, "cpu", 0, np.float32, [w, hd], base + j * cap * row)
        io_entry[1] = w
        return w

    def run(self, session: ort.InferenceSession, feeds: dict, total: int, all_rows: np.ndarray | None) -> np.ndarray:
        """One run of a format-4 graph on ``feeds`` (``input_ids``, ``position_ids``, ``attention_mask`` bool
        (1, 1, T, P+T), optionally ``logits_keep``) after the cached P positions; ``all_rows`` is fed as
        ``logits_keep`` when the feeds have none. Stores the T new rows; returns logits float32 (1, N, V).

        Raises:
            EdgespecError: ``total`` = P+T is beyond the model's context length.
        """
        past = self.length
        self.reserve(total)
        entry = self.bindings.get(id(session))
        if entry is None:
            entry = self.bindings[id(session)] = [session.io_binding(), None]
        io = entry[0]
        w = self._window(entry, past)
        feeds = dict(feeds, attention_mask=widen_mask(feeds["attention_mask"], past, w))
        if "logits_keep" not in feeds and all_rows is not None:
            feeds["logits_keep"] = all_rows
        for name, value in feeds.items():
            io.bind_cpu_input(name, value)
        io.bind_output("logits", "cpu")  # rebound each run: onnxruntime allocates them at this run's shape
        io.bind_output("present", "cpu")
        session.run_with_iobinding(io)
        logits, present = io.get_outputs()
        self.store(present.numpy(), past, total)
        self.length = total
        return logits.numpy()

    def store(self, present: np.ndarray, past: int, total: int) -> None:
        """Write the new rows ``present`` float32 (2 · layers, kv, T, D) at rows ``past``..``total``-1 (one copy)."""
        self.block[:, :, past:total] = present
