"""An exported causal LM graph on onnxruntime, and its KV cache.

The cache knows its length; rollback is :meth:`KVCache.crop`, called at one site in the decoder. Position ids
default to the cache length, so they always equal the number of committed tokens.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

if hasattr(ort, "disable_telemetry_events"):  # also when onnxruntime was imported before edgespec set the opt-out
    ort.disable_telemetry_events()

from ..errors import EdgespecError, first_line
from .integrity import check_graph
from .kv_buffer import PreallocatedKV
from .kv_int8_copy import Float32Copy, load_kv_scales
from .manifest import GraphSpec
from .pages import ReleaseWhileLoading, anonymous_zeros, release_file_pages

PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "xnnpack": "XnnpackExecutionProvider",
    "qnn": "QNNExecutionProvider",
    "nnapi": "NnapiExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "dml": "DmlExecutionProvider",
    "azure": "AzureExecutionProvider",
}


CPU = "CPUExecutionProvider"
_NOTICED: set[str] = set()  # fallback notices already given in this process (one line each)


def provider_name(provider: str) -> str:
    """onnxruntime's name for ``provider`` (a short name like ``cpu``/``qnn`` or the full name).

    Raises:
        EdgespecError: a provider onnxruntime does not know at all.
    """
    full = PROVIDERS.get(provider.lower(), provider)
    if full not in ort.get_all_providers():
        raise EdgespecError(f"unknown execution provider {provider!r} (known: {', '.join(PROVIDERS)})")
    return full


def short_provider_name(full: str) -> str:
    """``cpu``, ``qnn``, … for onnxruntime's provider name (the name itself if it has no short one)."""
    return next((k for k, v in PROVIDERS.items() if v == full), full)


def resolve_provider(provider: str) -> tuple[str, str | None]:
    """``(onnxruntime name to try, None)``, or ``(CPUExecutionProvider, why)`` when ``provider`` is not in this
    onnxruntime build (``why``: a phrase such as "'qnn' is not available in this onnxruntime build (…)").

    Raises:
        EdgespecError: an unknown provider name.
    """
    full = provider_name(provider)
    available = ort.get_available_providers()
    if full not in available:
        return CPU, (f"{provider!r} is not available in this onnxruntime build "
                     f"(available: {', '.join(short_provider_name(p) for p in available)})")
    return full, None


def parse_provider_options(items) -> dict[str, str]:
    """Provider options from ``KEY=VALUE`` strings (``--provider-option backend_path=libQnnHtp.so``).

    Raises:
        EdgespecError: an item without ``=`` or with an empty key.
    """
    out = {}
    for item in items or ():
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise EdgespecError(f"--provider-option expects KEY=VALUE, got {item!r}")
        out[key.strip()] = value
    return out


def _notice(message: str) -> None:
    if message not in _NOTICED:
        _NOTICED.add(message)
        logging.getLogger("edgespec").warning("edgespec: execution provider %s; running on CPU", message)


def open_session(path: Path, provider: str = "cpu", provider_options: dict | None = None,
                 threads: int | None = None, memory: "SessionMemory | None" = None) -> ort.InferenceSession:
    """An onnxruntime session for the graph at ``path`` on ``provider`` with its ``provider_options`` (str → str,
    e.g. QNN ``backend_path``, OpenVINO ``device_type``), CPU as the fallback for nodes it does not take.

    If the provider is not in this onnxruntime build, or rejects the graph, the session runs on CPU after a
    one-line notice (logger ``edgespec``). Thread tuning (:func:`session_options`) applies on CPU only; the
    memory settings ``memory`` (default :data:`DEFAULT_MEMORY`) to every provider.

    Raises:
        EdgespecError: an unknown provider name, or a graph onnxruntime cannot load on CPU either.
    """
    full, why = resolve_provider(provider)
    options = {str(k): str(v) for k, v in (provider_options or {}).items()}
    if full != CPU:
        try:
            return ort.InferenceSession(str(path), session_options(threads, cpu=False, memory=memory),
                                        providers=[(full, options), CPU])
        except Exception as e:  # onnxruntime raises its own types; a provider may also reject its options
            why = f"{provider!r} rejected {path.name} ({first_line(e)})"
    if why:
        _notice(why)
    try:
        return ort.InferenceSession(str(path), session_options(threads, memory=memory),
                                    providers=[(CPU, options)] if not why else [CPU])
    except Exception as e:
        raise EdgespecError(f"{path}: onnxruntime cannot load this graph ({first_line(e)})") from None


class KVCache:
    """Per-layer past keys and values, float32 (1, kv_heads, length, head_dim) each (graph formats 1–2).

    Every forward returns new ``present`` tensors (past and the new rows concatenated by the graph).
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int):
        empty = np.zeros((1, num_kv_heads, 0, head_dim), dtype=np.float32)
        self.tensors: list[np.ndarray] = [empty] * (2 * num_layers)

    @property
    def length(self) -> int:
        """Number of cached positions."""
        return self.tensors[0].shape[2]

    def crop(self, n: int, keep=()) -> None:
        """Keep positions 0..n-1, then the positions in ``keep`` (each ≥ n, in that order).

        A contiguous ``keep`` (a chain's accepted prefix) is a view, no copy; a scattered one (a tree's
        accepted path) gathers along the sequence axis.
        """
        keep = list(keep)
        if keep == list(range(n, n + len(keep))):
            if n + len(keep) < self.length:
                self.tensors = [t[:, :, :n + len(keep)] for t in self.tensors]
            return
        idx = np.concatenate([np.arange(n), np.asarray(keep, dtype=np.int64)])
        self.tensors = [np.take(t, idx, axis=2) for t in self.tensors]


class InPlaceKVCache(PreallocatedKV, Float32Copy):
    """Graph format 3: one preallocated buffer per layer and kind, float32 (1, kv_heads, capacity, head_dim) (int8
    with ``dtype`` for an export whose ``kv_cache`` is int8),
    that is both the graph's past and its present (formerly ``SharedKVCache``, still importable by that name).

    The graph reads the past from and writes the new rows into the same buffer (bound through IO binding to
    both ``past_key_values.{i}.*`` and ``present.{i}.*``), so a step copies only its own T rows and the cache
    is its ``length``: :meth:`crop` to a prefix is a length change. Rows past ``length`` are stale and never
    read. The buffer grows by doubling (one copy) when a step would pass ``capacity``, up to ``max_length``.
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, capacity: int, max_length: int,
                 dtype=np.float32):
        self.max_length = max_length
        self.length = 0
        self._shape = (1, num_kv_heads, head_dim)
        self.dtype = np.dtype(dtype)  # float32, or int8 (GraphSpec.kv_cache: the graph quantizes what it writes)
        self._alloc(min(capacity, max_length), 2 * num_layers)

    def _alloc(self, capacity: int, n: int, old: list[np.ndarray] | None = None) -> None:
        b, kv, hd = self._shape
        self.buffers = anonymous_zeros(n, (b, kv, capacity, hd), self.dtype)  # resident as rows are written
        if old is not None:
            for new, prev in zip(self.buffers, old):
                new[:, :, :self.length] = prev[:, :, :self.length]
        self.values = [ort.OrtValue.ortvalue_from_numpy(buf) for buf in self.buffers]  # share the numpy memory
        self.bindings: dict[int, ort.IOBinding] = {}  # per session, with the buffers bound as past and present

    def crop(self, n: int, keep=()) -> None:
        """Keep positions 0..n-1, then the positions in ``keep`` (each ≥ n, in that order).

        A contiguous ``keep`` is a length change; a scattered one (a tree's accepted path) moves just those
        rows down to n.. inside the buffer.
        """
        keep = list(keep)
        if keep != list(range(n, n + len(keep))):
            idx = np.asarray(keep, dtype=np.int64)
            for buf in self.buffers:
                buf[:, :, n:n + len(keep)] = buf[:, :, idx]  # fancy indexing copies first: overlap is safe
        self.length = min(self.length, n + len(keep))
        self.stale_from(n)  # rows from n on may have moved (an int8 cache's float32 copy)

    def load(self, tensors: list[np.ndarray]) -> None:
        """:meth:`PreallocatedKV.load`; an int8 cache's float32 copy is dropped (every row changes)."""
        self.drop_float32()
        super().load(tensors)


SharedKVCache = InPlaceKVCache  # the former name ("shared": past and present share one buffer)

ROTARY_POSITIONS = "edgespec.rotary_positions"  # graph metadata: the rows of its rotary table (exports since 2026-12-03)
CACHE_CAPACITY = 4096  # initial positions of a format-3 cache buffer; it doubles on demand up to the context
_ALL_ROWS = np.zeros(1, dtype=np.int64)  # logits_keep = 0: every row
PREFILL_GRAPH_ROWS = 64  # prefill chunks of at least this many rows run on the int8 prefill graph, when loaded


def causal_mask(past: int, new: int) -> np.ndarray:
    """bool (1, 1, T, P+T): each new query sees all past keys and the new keys up to itself."""
    m = np.ones((new, past + new), dtype=bool)
    m[:, past:] = np.tril(np.ones((new, new), dtype=bool))
    return m[None, None]


_POOL_THREADS = 0  # size of the process-wide intra-op pool once enabled


def pool_threads() -> int:
    """Threads of the process-wide intra-op pool, 0 while per-session pools are used."""
    return _POOL_THREADS


def use_shared_thread_pool(threads: int | None = None) -> bool:
    """Give every onnxruntime session of this process one shared intra-op thread pool (idempotent).

    Call before the first session; afterwards every session must be made with :func:`session_options`
    (onnxruntime refuses per-session pools once a global one exists). The CLI turns it on; an app that
    embeds edgespec and creates other sessions itself decides for itself. Returns False if this
    onnxruntime cannot.
    """
    global _POOL_THREADS
    if not _POOL_THREADS:
        try:
            from onnxruntime.capi import _pybind_state

            n = threads or os.cpu_count() or 1
            _pybind_state.set_global_thread_pool_sizes(n, 1)
            _POOL_THREADS = n
        except Exception:
            return False
    return True


@dataclass(frozen=True)
class SessionMemory:
    """onnxruntime's session memory switches, typed, for measuring them (``bench/memory.py``, issue 17).

    - ``cpu_arena``: the BFC arena for activations and outputs (graph format 2's KV ``present`` outputs live
      in it while the cache holds them: ``session.run`` returns arrays over onnxruntime's own buffers).
    - ``prepacking``: kernels repack constant weights at load (int4 MatMulNBits: a packed copy that replaces
      the memory-mapped original, about 1.3× its size on disk).
    - ``mem_pattern``: plan activation buffers from the first run's shapes.
    - ``release_pages``: after loading, give back the graph data file's pages the process still holds but
      never reads again (the int4 scales onnxruntime keeps after packing them; :mod:`edgespec.pages`).
    - ``release_while_loading``: do that every 50 ms while the session is being created too, so the load's
      peak does not hold every scale read so far (:class:`edgespec.pages.ReleaseWhileLoading`).
    - ``prefill_graph``: also load the export's int8 prefill graph where it has one (``edgespec export
      --prefill-int8``: about 2× faster prompt chunks, about 1.4 GB more RSS for the 1.5B target).

    Measured (docs/benchmarks.md, "Other benchmarks"): keep the arena (without it malloc fragments worse: more RSS
    growth per context token) and prepacking (without it an int4 step is about 37× slower: MatMulNBits
    dequantizes every call). ``mem_pattern`` changes no peak measurably (the peaks are at load and at the
    end of a conversation). What cuts memory is graph format 3 (an in-place KV cache: no per-step
    ``present`` copies), its buffers' pages becoming resident only as rows are written, and the two page
    releases.
    """

    cpu_arena: bool = True
    prepacking: bool = True
    mem_pattern: bool = True
    release_pages: bool = True
    release_while_loading: bool = True
    prefill_graph: bool = True

    @staticmethod
    def named(name: str) -> "SessionMemory":
        """``edgespec`` (:data:`DEFAULT_MEMORY`), ``ort-defaults`` (onnxruntime's defaults, no page release),
        or fields like ``cpu_arena=0+prepacking=0``.

        Raises:
            ValueError: an unknown name or field.
        """
        if name == "ort-defaults":
            return SessionMemory(release_pages=False, release_while_loading=False)
        if name == "edgespec":
            return DEFAULT_MEMORY
        try:
            fields = dict(kv.split("=") for kv in name.split("+"))
            return SessionMemory(**{k: v == "1" for k, v in fields.items()})
        except (ValueError, TypeError):
            raise ValueError(f"unknown session memory setting {name!r} "
                             "(edgespec, ort-defaults, or fields like cpu_arena=0+prepacking=0)") from None


DEFAULT_MEMORY = SessionMemory()


def session_options(threads: int | None = None, cpu: bool = True,
                    memory: SessionMemory | None = None) -> ort.SessionOptions:
    """SessionOptions for a graph: the shared pool when enabled, else (``cpu``: for the CPU provider) a
    per-session pool of ``threads`` without spinning; another provider keeps onnxruntime's thread defaults.
    Memory settings from ``memory`` (default :data:`DEFAULT_MEMORY`)."""
    memory = memory or DEFAULT_MEMORY
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if _POOL_THREADS:
        so.use_per_session_threads = False
    elif cpu:
        so.intra_op_num_threads = threads or (os.cpu_count() or 1)
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.enable_cpu_mem_arena = memory.cpu_arena
    so.enable_mem_pattern = memory.mem_pattern
    if not memory.prepacking:
        so.add_session_config_entry("session.disable_prepacking", "1")
    return so


class OnnxLM:
    """One graph of an export (target or draft) in an onnxruntime session.

    Thread pools: with a pool per session, the draft's and the target's threads spin-wait on the same few
    cores after each run and steal them from each other, so per-session pools run without spinning. One
    shared pool (:func:`use_shared_thread_pool`) is faster still: measured on the 2-core CI machine
    (Qwen2.5-Coder 1.5B/0.5B int4, K=4, greedy), 39 tok/s against 35 speculative, 31 against 28 plain.
    """

    def __init__(self, spec: GraphSpec, export_dir: str | Path, provider: str = "cpu", threads: int | None = None,
                 provider_options: dict | None = None, role: str = "target", memory: SessionMemory | None = None):
        """Open the graph ``spec.path`` of ``export_dir`` on ``provider`` (see :func:`open_session`) with the
        session memory settings ``memory`` (default :data:`DEFAULT_MEMORY`), and check it against ``spec``;
        likewise its int8 prefill graph ``spec.prefill_path`` where the export has one and
        ``memory.prefill_graph`` is set (:attr:`prefill_session`, else None).

        Raises:
            EdgespecError: an unknown provider, a graph (or prefill graph) onnxruntime cannot load, or one that
                does not match ``spec``.
        """
        memory = memory or DEFAULT_MEMORY
        path = Path(export_dir) / spec.path
        files = [f for f in path.parent.iterdir() if f.is_file()]
        loading = ReleaseWhileLoading(files) if memory.release_while_loading else None
        prefill_path = Path(export_dir) / spec.prefill_path if spec.prefill_path and memory.prefill_graph else None
        with loading or contextlib.nullcontext():
            session = open_session(path, provider, provider_options, threads, memory)
            prefill = open_session(prefill_path, provider, provider_options, threads, memory) if prefill_path else None
        self._setup(spec, session)
        self.export_dir = Path(export_dir)
        check_graph(session, spec, role, path, self._past, self._outputs)  # the manifest describes this graph
        if prefill is not None:
            check_graph(prefill, spec, f"{role} prefill graph", prefill_path, self._past, self._outputs,
                        spec.prefill_cache_type)
            self._check_format(prefill, prefill_path)
            self.prefill_session = prefill
            if spec.prefill_cache_type != spec.kv_cache:  # float32 prefill attention beside an int8 cache
                self.kv_scales = load_kv_scales(Path(export_dir) / spec.kv_scales, spec, self._past)
        # file pages given back while and after loading (SessionMemory.release_while_loading, release_pages)
        self.released_bytes = loading.released if loading else 0
        if memory.release_pages:
            self.released_bytes += release_file_pages(files)

    @classmethod
    def from_session(cls, spec: GraphSpec, session: ort.InferenceSession) -> "OnnxLM":
        """Wrap an already open session (the exporter's validation) described by ``spec``."""
        lm = cls.__new__(cls)
        lm._setup(spec, session)
        return lm

    def _setup(self, spec: GraphSpec, session: ort.InferenceSession) -> None:
        self.spec = spec
        self.session = session
        self.vocab_limit: int | None = None  # logits columns past this are cut off (ids the tokenizer lacks)
        self.provider = short_provider_name(session.get_providers()[0])  # the execution provider in use
        self.grouped = spec.graph_format == 4  # per-KV-head past inputs, one `present` output (grouped_kv.py)
        if self.grouped:
            from .grouped_kv import past_names

            self._past, self._outputs = past_names(spec.num_layers, spec.num_kv_heads), ["logits", "present"]
        else:
            self._past = [n for pair in spec.past_names() for n in pair]
            self._outputs = ["logits"] + [f"present.{i}.{kind}" for i in range(spec.num_layers)
                                          for kind in ("key", "value")]
        # exports since graph format 2 can compute the head for the last rows only (see forward's ``keep``)
        self.has_logits_keep = any(i.name == "logits_keep" for i in session.get_overridable_initializers()
                                   + session.get_inputs())  # format 3: a required input
        self.in_place = spec.graph_format >= 3
        self._logits_at = 2 * spec.num_layers  # IO binding lists outputs in binding order: presents, then logits
        self.prefill_session: ort.InferenceSession | None = None  # the int8 prefill graph, when loaded
        self.kv_scales: list[np.ndarray] | None = None  # an int8 cache's scales when the prefill graph's is float32
        self._check_format(session, spec.path)

    def _check_format(self, session: ort.InferenceSession, path) -> None:
        """The graph's own metadata against the manifest: its format, and the positions its rotary table holds
        (exports since 2026-12-03 record them; the manifest's ``context_length`` must not exceed them, or
        positions past the table would reach the attention kernel). Raises EdgespecError."""
        fmt = self.spec.graph_format
        meta = session.get_modelmeta().custom_metadata_map
        if self.in_place and meta.get("edgespec.graph_format") != str(fmt):
            raise EdgespecError(f"{path}: the manifest says graph format {fmt} but the graph is not a "
                                f"format-{fmt} graph (export again)")
        rows = meta.get(ROTARY_POSITIONS)
        if rows is not None and (not rows.isdigit() or self.spec.context_length > int(rows)):
            raise EdgespecError(f"{path}: the manifest says context_length {self.spec.context_length} but the "
                                f"graph's rotary table holds {rows[:24]} positions (export again)")

    def new_cache(self, capacity: int | None = None) -> KVCache | InPlaceKVCache:
        """An empty cache for this graph: a :class:`InPlaceKVCache` of ``capacity`` positions (default
        :data:`CACHE_CAPACITY`, grown on demand) for graph format 3, its per-KV-head variant
        :class:`edgespec.io.grouped_kv.GroupedKVCache` for format 4, else a :class:`KVCache`."""
        if self.grouped:
            from .grouped_kv import GroupedKVCache

            return GroupedKVCache(self.spec.num_layers, self.spec.num_kv_heads, self.spec.head_dim,
                                  capacity or CACHE_CAPACITY, self.spec.context_length)
        if self.in_place:
            return InPlaceKVCache(self.spec.num_layers, self.spec.num_kv_heads, self.spec.head_dim,
                                 capacity or CACHE_CAPACITY, self.spec.context_length,
                                 np.int8 if self.spec.kv_cache == "int8" else np.float32)
        return KVCache(self.spec.num_layers, self.spec.num_kv_heads, self.spec.head_dim)

    def forward(self, ids, cache: KVCache | InPlaceKVCache, position_ids: np.ndarray | None = None,
                mask: np.ndarray | None = None, keep: int = 0, prefill: bool = False) -> np.ndarray:
        """Run ``ids`` int64 (T,) after the cached positions; appends T positions to ``cache``.

        ``position_ids`` int64 (T,) defaults to ``cache.length + arange(T)``; ``mask`` bool (1, 1, T, P+T)
        defaults to causal. Returns logits float32 (T, V), or with ``keep`` = N > 0 those of the last N rows
        only, (min(N, T), V): the graph then skips the output head for the other rows (a prefill or catch-up
        needs one row), if the export has the ``logits_keep`` input; older exports slice afterwards. With
        ``vocab_limit`` set, V is cut to it (a head padded past the tokenizer's ids). ``prefill`` runs a chunk
        of T ≥ :data:`PREFILL_GRAPH_ROWS` on the export's int8 prefill graph when it is loaded
        (``export/prefill_graph.py``; same cache), else on the graph itself. Beside an int8 cache a float32
        prefill graph (``GraphSpec.prefill_kv_cache``) runs on :meth:`InPlaceKVCache.float32_copy`, and its new
        rows are quantized into the cache (:meth:`InPlaceKVCache.store_from`).
        """
        ids = np.asarray(ids, dtype=np.int64)
        p, t = cache.length, len(ids)
        session = (self.prefill_session if prefill and self.prefill_session is not None
                   and t >= PREFILL_GRAPH_ROWS else self.session)
        if position_ids is None:
            position_ids = np.arange(p, p + t, dtype=np.int64)
        feeds = {"input_ids": ids[None], "position_ids": np.asarray(position_ids, dtype=np.int64)[None],
                 "attention_mask": causal_mask(p, t) if mask is None else mask}
        if keep > 0 and self.has_logits_keep:
            feeds["logits_keep"] = np.array([keep], dtype=np.int64)
        if self.grouped:
            logits = cache.run(session, feeds, p + t, _ALL_ROWS if self.has_logits_keep else None)
        elif self.in_place and session is self.prefill_session and self.kv_scales is not None:
            shadow = cache.float32_copy(self.kv_scales)  # the float32 prefill graph attends to it
            logits = self._run_in_place(session, feeds, shadow, p + t)
            cache.store_from(shadow, self.kv_scales)
        elif self.in_place:
            cache.stale_from(p)  # the graph writes rows p.. of an int8 cache itself (its float32 copy re-reads them)
            logits = self._run_in_place(session, feeds, cache, p + t)
        else:
            feeds.update(zip(self._past, cache.tensors))
            out = session.run(self._outputs, feeds)
            cache.tensors = out[1:]
            logits = out[0]
        logits = logits[0][-keep:] if keep > 0 else logits[0]
        return logits[:, :self.vocab_limit] if self.vocab_limit is not None else logits

    def _run_in_place(self, session: ort.InferenceSession, feeds: dict, cache: InPlaceKVCache,
                      total: int) -> np.ndarray:
        """One run of ``session`` with IO binding: the cache buffers are both past and present; only ``logits``
        is new."""
        cache.reserve(total)
        io = cache.bindings.get(id(session))
        if io is None:
            io = cache.bindings[id(session)] = session.io_binding()
            for name, value in zip(self._past, cache.values):
                io.bind_ortvalue_input(name, value)
            for name, value in zip(self._outputs[1:], cache.values):
                io.bind_ortvalue_output(name, value)
        io.bind_output("logits", "cpu")  # rebound each run: onnxruntime allocates it at this run's shape
        for name, value in feeds.items():
            io.bind_cpu_input(name, value)
        if "logits_keep" not in feeds and self.has_logits_keep:
            io.bind_cpu_input("logits_keep", _ALL_ROWS)
        session.run_with_iobinding(io)
        cache.length = total
        return io.get_outputs()[self._logits_at].numpy()
