"""One graph of an export: its options, graph formats and cache (the pair and its directory: :mod:`.pipeline`).

Each graph is built once per (source sha256, export options) into ``<cache>/graphs/<key>/`` — export, validate,
quantize, validate, then rename — so an interrupted run leaves only a temporary directory and a second export of the
same sources is a few hard links. Builders of one key take turns on a lock (``<key>.lock``), so concurrent exports
of one pair wait rather than collide; a cached entry is checked (its ``meta.json`` and every file's size and sha256)
before use and rebuilt if it does not check out. Temporaries of killed runs are swept on the next run.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx
from tqdm.auto import tqdm

from edgespec import paths
from edgespec.errors import EdgespecError
from edgespec.io.integrity import check_file, sha256_file
from edgespec.io.manifest import FileEntry, GraphSpec, Quantization, graph_spec

from .load import ModelInfo, load_weights, weights
from .quantize import PRECISIONS, quantize
from .sources import Source

# graph formats: 2 = traced graph with the optional logits_keep input (KV concatenated per step); 3 = written
# graph with a shared in-place KV buffer and fused GroupQueryAttention (export/gqa_graph.py). A format's
# number is part of the graph cache key: bump it when that graph changes, to invalidate cached graphs.
# GRAPH_REVISIONS changes a format's graphs without a new format (the runtime reads both revisions): it is
# part of the key when present, so graphs of the formats it does not name keep their keys.
GRAPH_FORMATS = (2, 3, 4)  # 4: format 3 with grouped attention over per-KV-head buffers (export/grouped_graph.py)
KV_INT8_REVISION = 2  # export/kv_int8.py's rewrite, in the graph cache key of --kv-int8 graphs (2: the prefill
# graph keeps a float32 cache, and kv_scales.npz)
GRAPH_REVISIONS = {3: 4}  # format 3, revision 2: the token embedding quantized (GatherBlockQuantized); 3: written
# from the source weights one tensor at a time (export/families), int8 as 8-bit MatMulNBits, validated against the
# numpy reference; 4: padded blocks, the embedding's own block, Gemma 3's GGUF settings as llama.cpp reads them.
# Bump it with every change to what the streamed writers write.
EMBEDDING_BITS = {"int4": 8, "int8": 8}  # format 3 from revision 2: embedding table bits per graph precision
DEFAULT_GRAPH_FORMAT = 3  # where the model allows it (format_problem); format 2 stays loadable
QUANT_POSITIONS = 256


@dataclass(frozen=True)
class ExportOptions:
    """Per-graph export settings. ``lm_head_bits`` None keeps the head at the graph's precision;
    ``zero_points`` makes the int4 blocks asymmetric; ``tensor_bits`` ((fragment, bits), …) keeps the matmuls
    whose weight name contains a fragment at those bits (4, 8 or 32; graph format 3 only); ``tensor_blocks``
    ((fragment, block), …) gives those matmuls their own block size (a finer one where accuracy is lost).
    :func:`parse_layout` reads all five from one spelling (``b128z+down_proj=8+lm_head=8``, ``b256+gguf6=b32``);
    ``chosen_by`` says why (manifest only, not part of the graph cache key)."""

    precision: str = "int4"
    block_size: int = 32
    accuracy_level: int = 4
    lm_head_bits: int | None = None
    vocab_size: int | None = None  # prune the lm_head to this many frequent ids (FR-Spec; draft only)
    graph_format: int | None = None  # None: DEFAULT_GRAPH_FORMAT where both models allow it, else 2
    # None for either of the next two: as the export profile says (export/profiles.py; without one, off)
    prefill_int8: bool | None = None  # also write the int8 prefill graph (export/prefill_graph.py; int4 only)
    kv_int8: bool | None = None  # an int8 KV cache read and written by GroupQueryAttention (export/kv_int8.py)
    zero_points: bool = False
    tensor_bits: tuple[tuple[str, int], ...] = ()
    tensor_blocks: tuple[tuple[str, int], ...] = ()
    chosen_by: str | None = field(default=None, compare=False)

    def __post_init__(self):
        if self.graph_format is not None and self.graph_format not in GRAPH_FORMATS:
            raise EdgespecError(f"graph format must be one of {', '.join(map(str, GRAPH_FORMATS))}, "
                                f"not {self.graph_format}")
        if self.precision not in PRECISIONS:
            raise EdgespecError(f"precision must be one of {', '.join(PRECISIONS)}, not {self.precision!r}")
        if self.block_size not in BLOCK_SIZES:
            raise EdgespecError(f"block size must be 16, 32, 64, 128 or 256, not {self.block_size}")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise EdgespecError(f"accuracy level must be 0..4, not {self.accuracy_level}")
        if self.lm_head_bits not in (None, 4, 8, 32):
            raise EdgespecError(f"lm_head bits must be 4, 8 or 32, not {self.lm_head_bits}")
        if self.prefill_int8 and self.precision != "int4":
            raise EdgespecError(f"an int8 prefill graph needs int4 weights, not {self.precision} "
                                "(its int8 weights are made from the int4 blocks)")
        if self.kv_int8 and self.graph_format not in (None, 3):
            raise EdgespecError(f"an int8 KV cache needs graph format 3, not {self.graph_format}")
        if self.vocab_size is not None and self.vocab_size < 256:
            raise EdgespecError(f"a pruned draft vocabulary needs at least 256 ids, not {self.vocab_size}")
        for frag, bits in self.tensor_bits:
            if not isinstance(frag, str) or not frag or frag == "lm_head" or bits not in (4, 8, 32):
                raise EdgespecError(f"per-tensor bits must map a weight-name fragment (not lm_head: use lm_head "
                                    f"bits) to 4, 8 or 32, not {frag!r}={bits!r}")
        for frag, block in self.tensor_blocks:
            if not isinstance(frag, str) or not frag or block not in BLOCK_SIZES:
                raise EdgespecError(f"per-tensor blocks must map a weight-name fragment to a block size "
                                    f"({', '.join(map(str, BLOCK_SIZES))}), not {frag!r}={block!r}")
        if self.streamed_only and self.graph_format not in (None, 3):
            raise EdgespecError(f"zero points and per-tensor bits or blocks are written by the streamed exporter only "
                                f"(graph format 3), not graph format {self.graph_format}")
        if self.streamed_only and self.precision == "fp32":
            raise EdgespecError("zero points and per-tensor bits or blocks apply to int4 and int8 weights, not fp32")

    @property
    def streamed_only(self) -> bool:
        """Whether the layout has zero points or per-tensor bits or blocks, which only format 3 writes."""
        return bool(self.zero_points or self.tensor_bits or self.tensor_blocks)

    @property
    def layout(self) -> str:
        """This layout in :func:`parse_layout`'s spelling (``b32``, ``b128z+down_proj=8+lm_head=8``)."""
        mix = list(self.tensor_bits) + ([("lm_head", self.lm_head_bits)] if self.lm_head_bits else [])
        mix += [(f, f"b{b}") for f, b in self.tensor_blocks]
        return f"b{self.block_size}{'z' if self.zero_points else ''}" + "".join(f"+{f}={b}" for f, b in mix)


BLOCK_SIZES = (16, 32, 64, 128, 256)  # MatMulNBits block sizes (weights per block along the input dimension)
LAYOUT_SYNTAX = ("b<block>[z][+<fragment>=<bits>|b<block>]…, e.g. b128z+down_proj=8+lm_head=8, b128z+gguf6=8 or "
                 "b256+gguf6=b32")
SOURCE_BITS = "gguf6"  # the fragment that names the matmuls a GGUF stores at 6 bits or more (resolve_bits)
SOURCE_BITS_FLOOR = 6.0  # bits per weight, scales included: Q6_K (6.56), Q8_0 (8.5), F16; not Q5_0/Q5_K (5.5)


def uses_source_bits(tensor_bits: tuple[tuple[str, int], ...]) -> bool:
    """Whether per-tensor bits name :data:`SOURCE_BITS` (and so need a GGUF source, :func:`resolve_bits`)."""
    return any(frag == SOURCE_BITS for frag, _ in tensor_bits)


def resolve_bits(tensor_bits: tuple[tuple[str, int], ...], src) -> dict[str, int]:
    """``tensor_bits`` as :class:`export.families.base.Layout` reads them: each fragment as given, except
    :data:`SOURCE_BITS`, which becomes the names of the matmuls (:func:`export.families.base.matmul_of`) holding
    a weight the GGUF ``src`` stores at :data:`SOURCE_BITS_FLOOR` bits per weight or more — the tensors a
    Q4_K_M file keeps at Q6_K (the output head, half the layers' down and value projections; q/k/v are one
    packed matmul, so a Q6_K value projection takes its layer's q and k along) — so a coarse int4 layout keeps
    the source's own precision where its quantizer judged it needed. Earlier fragments win; a layout's
    ``lm_head_bits`` (``+lm_head=N``) wins over all of them for the head (:meth:`Layout.bits_of`). Per-tensor
    block sizes (``tensor_blocks``) resolve the same way.

    Raises:
        EdgespecError: :data:`SOURCE_BITS` without a GGUF source (``src`` None, or a source with no stored
            tensor types).
    """
    from .families.base import matmul_of

    out: dict[str, int] = {}
    for frag, bits in tensor_bits:
        if frag == "lm_head":  # named outright (a block size: +lm_head=b256): whatever gguf6 says of the head
            out["lm_head"] = bits
            continue
        if frag != SOURCE_BITS:
            out.setdefault(frag, bits)
            continue
        if not hasattr(src, "bits_per_weight"):
            raise EdgespecError(f"+{SOURCE_BITS} follows the tensor types of a GGUF file; "
                                + ("no source was given" if src is None else "this source is not a GGUF file")
                                + " (name the tensors instead: +down_proj=8)")
        names = src.names()
        tied = src.config.tie_word_embeddings or "lm_head.weight" not in names  # as families.base ties the head
        for name in names:
            m = matmul_of(name, tied)
            if m is not None and src.bits_per_weight(name) >= SOURCE_BITS_FLOOR:
                out.setdefault(m, bits)
    return out


def weight_layout(opts: ExportOptions, src):
    """The :class:`export.families.base.Layout` a streamed graph of ``opts`` is written in, its per-tensor bits
    and blocks resolved against the source ``src`` (:func:`resolve_bits`).

    Raises:
        EdgespecError: as :func:`resolve_bits`.
    """
    from .families.base import Layout

    return Layout(precision=opts.precision, block_size=opts.block_size, accuracy_level=opts.accuracy_level,
                  zero_points=opts.zero_points, lm_head_bits=opts.lm_head_bits,
                  embedding_bits=EMBEDDING_BITS.get(opts.precision), bits=resolve_bits(opts.tensor_bits, src),
                  blocks=resolve_bits(opts.tensor_blocks, src))


def parse_layout(spec: str) -> dict:
    """The :class:`ExportOptions` fields of a weight layout: ``b<block>`` (16…256), ``z`` for zero points, then
    ``+fragment=bits`` for the matmuls whose weight name contains the fragment (``down_proj``, ``layers.0.``;
    ``lm_head`` is the output head; ``gguf6`` the matmuls the source GGUF stores at 6 bits or more,
    :func:`resolve_bits`), bits 4, 8 or 32, or ``+fragment=b<block>`` for their own block size. Returns
    ``block_size``, ``zero_points``, ``lm_head_bits``, ``tensor_bits`` and ``tensor_blocks``.

    Raises:
        EdgespecError: a spelling that is not a layout (one line, with the syntax).
    """
    import re

    head, *mix = spec.strip().split("+")
    m = re.fullmatch(r"b(\d+)(z?)", head)
    bits: dict[str, int] = {}
    blocks: dict[str, int] = {}
    for part in mix:
        frag, eq, b = part.partition("=")
        into = blocks if b.startswith("b") else bits
        if (not eq or not re.fullmatch(r"[A-Za-z0-9_.]+", frag) or frag in into
                or (b not in ("4", "8", "32") if into is bits else b[1:] not in map(str, BLOCK_SIZES))):
            m = None
            break
        into[frag] = int(b.lstrip("b"))
    if m is None or int(m.group(1)) not in BLOCK_SIZES:
        raise EdgespecError(f"not a weight layout: {spec!r} (block 16, 32, 64, 128 or 256; {LAYOUT_SYNTAX})")
    return {"block_size": int(m.group(1)), "zero_points": m.group(2) == "z", "lm_head_bits": bits.pop("lm_head", None),
            "tensor_bits": tuple(bits.items()), "tensor_blocks": tuple(blocks.items())}


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def format_problem(info: ModelInfo, graph_format: int) -> str | None:
    """Why ``info``'s model cannot be written as a graph of ``graph_format`` (a phrase), or None.

    Format 3 is written by the model's family (:mod:`.families`) from GGUF files and safetensors directories,
    and by the torch builder (:mod:`.gqa_graph`, Qwen2 and Llama) from hub ids; format 4 by the torch builder;
    format 2 is traced (:mod:`.traced_graph`)."""
    from .families import family_for
    from .gqa_graph import FORMAT3_ARCHITECTURES
    from .onnx_graph import SUPPORTED_ARCHITECTURES

    cfg = info.config
    if graph_format == 2:
        return None if cfg.architecture in SUPPORTED_ARCHITECTURES else \
            f"graph format 2 supports {', '.join(SUPPORTED_ARCHITECTURES)}, not {cfg.architecture}"
    if graph_format == 4 or info.source.kind == "hub":  # the torch builder (export/gqa_graph.py)
        what = "graph format 4" if graph_format == 4 else "graph format 3 from a hub id"
        if cfg.architecture not in FORMAT3_ARCHITECTURES:
            return f"{what} supports {', '.join(FORMAT3_ARCHITECTURES)}, not {cfg.architecture}"
        if cfg.layer_types is not None or cfg.hidden_act != "silu" or cfg.partial_rotary_factor != 1.0:
            return f"{what} has no sliding-window layers, partial rotary embedding or MLP other than SiLU"
        if graph_format == 4:
            return None  # plain ops: any head size
    try:
        return family_for(cfg.architecture).problem(cfg)
    except EdgespecError as e:
        return str(e)


def _default_format(infos) -> tuple[int, str | None]:
    """(:data:`DEFAULT_GRAPH_FORMAT`, None) when every model of ``infos`` can be written as a format-3 graph, else
    (2, why)."""
    why = next(filter(None, (format_problem(i, DEFAULT_GRAPH_FORMAT) for i in infos)), None)
    return (2, why) if why else (DEFAULT_GRAPH_FORMAT, None)


def _cache_key(source: Source, opts: ExportOptions) -> str:
    o = asdict(opts)
    del o["chosen_by"]  # the manifest's note, not the graph
    for k in ("zero_points", "tensor_bits", "tensor_blocks"):  # absent when unset: graphs cached before them stay valid
        if not o[k]:
            del o[k]
    if o["vocab_size"] is None:  # absent when unset, so graphs cached before the option existed stay valid
        del o["vocab_size"]
    if not o["prefill_int8"]:  # the same
        del o["prefill_int8"]
    else:
        from .prefill_graph import REVISION, REVISIONS

        o["prefill_int8"] = REVISIONS.get(opts.graph_format, REVISION)
    if not o["kv_int8"]:  # the same
        del o["kv_int8"]
    else:
        o["kv_int8"] = KV_INT8_REVISION
    graph = o.pop("graph_format")
    key = {"sha": source.sha256, "opts": o, "graph": graph}
    if graph in GRAPH_REVISIONS:
        key["revision"] = GRAPH_REVISIONS[graph]
    blob = json.dumps(key, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


GRAPH_FILES = ("model.onnx", "model.onnx.data", "kept_token_ids.npy", "prefill.onnx", "prefill.onnx.data",
               "kv_scales.npz")
KV_SCALES_NAME = "kv_scales.npz"  # an int8 cache's scales, for the runtime's float32 prefill (GraphSpec.kv_scales)


def _cached_meta(entry: Path) -> dict | None:
    """The metadata of a cached graph entry if it checks out (meta.json readable, every file of its
    ``files`` with the recorded size and sha256), else None: the caller rebuilds it."""
    try:
        meta = json.loads((entry / "meta.json").read_text(encoding="utf-8"))
        if "files" not in meta and (entry / "model.onnx").is_file():  # built before sizes/hashes were kept
            meta["files"] = {f: {"size": (entry / f).stat().st_size, "sha256": sha256_file(entry / f)}
                             for f in GRAPH_FILES if (entry / f).is_file()}
            paths.write_atomic(entry / "meta.json", json.dumps(meta, indent=2))
        files = meta["files"]
        graph_spec({"path": "model.onnx", **meta}, "cached graph")  # the graph schema, checked where it is read
        named = {"model.onnx"} | {meta[k] for k in ("kept_token_ids", "prefill_path", "kv_scales") if meta.get(k)}
        if meta.get("prefill_path"):
            named.add(meta["prefill_path"] + ".data")
        if named - set(files) or set(files) - set(GRAPH_FILES):  # a graph it names that it does not keep
            return None
        for name, f in files.items():
            check_file(entry / name, FileEntry(int(f["size"]), str(f["sha256"])))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, EdgespecError):
        return None
    return meta


def build_graph(info: ModelInfo, opts: ExportOptions, role: str, cache: Path | None = None) -> tuple[Path, dict]:
    """The cached graph directory for ``info`` and ``opts`` (built if absent or broken) and its metadata.

    ``cache`` is the graph cache (default ``<user cache>/graphs``); concurrent builders of one key wait for
    each other on ``<key>.lock``.
    """
    if opts.graph_format is None:
        opts = replace(opts, graph_format=_default_format((info,))[0])
    if opts.kv_int8 and opts.graph_format != 3:
        raise EdgespecError(f"{role}: an int8 KV cache needs graph format 3; this model gets format "
                            f"{opts.graph_format}")
    if opts.streamed_only and (opts.graph_format != 3 or info.source.kind == "hub"):
        raise EdgespecError(f"{role}: the layout {opts.layout} (zero points, per-tensor bits or blocks) is written by "
                            f"the streamed exporter only (graph format 3 from a GGUF file or a model directory); this "
                            f"model gets " + ("a hub download" if info.source.kind == "hub"
                                              else f"graph format {opts.graph_format}"))
    if uses_source_bits(opts.tensor_bits + opts.tensor_blocks) and info.source.kind != "gguf":
        raise EdgespecError(f"{role}: the layout {opts.layout} follows the tensor types of a GGUF file "
                            f"(+{SOURCE_BITS}); {info.source.ref} is not a GGUF file (name the tensors instead: "
                            "+down_proj=8)")
    cache = cache or paths.home() / "graphs"
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise EdgespecError(f"{cache}: cannot create the graph cache ({e.strerror or e})") from None
    final = cache / _cache_key(info.source, opts)
    with paths.file_lock(cache / f"{final.name}.lock", f"building the {role} graph {final.name}"):
        paths.sweep_stale(cache)
        if final.exists():
            meta = _cached_meta(final)
            if meta is not None:
                _log(f"{role}: cached graph {final.name}")
                return final, meta
            _log(f"{role}: the cached graph {final.name} is incomplete or corrupt; building it again")
            paths.remove(final)
        if opts.kv_int8:
            base = cache / _cache_key(info.source, replace(opts, kv_int8=False))
            base_meta = _cached_meta(base) if base.is_dir() else None
            if base_meta is not None:
                return _derive_kv_int8(info, role, base, base_meta, final)
        return _build(info, opts, role, final)


def _kv_int8(info: ModelInfo, plain: Path, out_dir: Path, ids: np.ndarray, layers: int, kv: int, hd: int,
             prefill: Path | None) -> dict:
    """Write ``out_dir/model.onnx``: the float32-cache graph ``plain`` with an int8 KV cache (:mod:`.kv_int8`,
    scales calibrated on ``plain``); returns the int8 cache's validation against ``plain`` over ``ids``. With a
    ``prefill`` graph (which keeps its float32 cache: onnxruntime's int8-cache attention is 4× slower on prompt
    chunks), also ``out_dir/kv_scales.npz``, the scales the runtime quantizes the prefill's rows with."""
    from .kv_int8 import calibrate, calibration_ids, rewrite
    from .validate import validate_float32_prefill, validate_kv_cache

    context = _context(plain, info)
    calib = calibration_ids(info.tokenizer, ids, info.logits_width, n=max(0, min(768, context - len(ids) - 16)))
    scales = calibrate(plain, calib, layers, kv, hd)
    rewrite(plain, scales, out_dir / "model.onnx")
    val = validate_kv_cache(plain, out_dir / "model.onnx", ids, layers, kv, hd)
    if prefill is not None:
        with open(out_dir / KV_SCALES_NAME, "wb") as f:
            np.savez(f, **scales)
        val["with_prefill_graph"] = validate_float32_prefill(plain, out_dir / "model.onnx", prefill, scales, ids,
                                                             layers, kv, hd)
    return val


def _derive_kv_int8(info: ModelInfo, role: str, base: Path, base_meta: dict, final: Path) -> tuple[Path, dict]:
    """The ``--kv-int8`` graph made from the cached float32-cache graph ``base`` of the same weights and options:
    its data files hard-linked, its graphs rewritten (:func:`_kv_int8`), in a third of the time of a new
    export."""
    tmp = final.with_name(final.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        t0 = time.perf_counter()
        _log(f"{role}: int8 KV cache from the cached graph {base.name}")
        spec = graph_spec({"path": "model.onnx", **base_meta}, role)
        for f in base_meta["files"]:
            if f != "model.onnx":  # the prefill graph keeps its float32 cache: linked as it is
                _link_or_copy(base / f, tmp / f)
        ids = _validation_ids(info)
        val = dict(base_meta["validation"])
        val["kv_int8"] = _kv_int8(info, base / "model.onnx", tmp, ids, spec.num_layers, spec.num_kv_heads,
                                  spec.head_dim, base / spec.prefill_path if spec.prefill_path else None)
        meta = _commit(tmp, final, {**base_meta, "kv_cache": "int8", "validation": val,
                                    **(_float32_prefill() if spec.prefill_path else {})}, t0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _print_validation(role, meta)
    return final, meta


def _validation_ids(info: ModelInfo):
    """int64 (n,) token ids an export is validated on: :data:`QUANT_POSITIONS`, or the model's context where
    that is shorter (a small model's 128 positions)."""
    from .validate import validation_ids

    return validation_ids(info.tokenizer, min(QUANT_POSITIONS, int(info.config.max_position_embeddings)),
                          info.logits_width)


def _context(graph: Path, info: ModelInfo) -> int:
    """The positions a graph serves: its rotary table's rows where it records them, else the model's."""
    from edgespec.io.onnx_model import ROTARY_POSITIONS

    meta = {p.key: p.value for p in onnx.load(str(graph), load_external_data=False).metadata_props}
    return int(meta.get(ROTARY_POSITIONS, info.config.max_position_embeddings))


def _build(info: ModelInfo, opts: ExportOptions, role: str, final: Path) -> tuple[Path, dict]:
    """Build a graph: streamed from the source weights (:func:`_build_streamed`) where its family writes it,
    else through transformers and torch (:func:`_build_torch`)."""
    if opts.graph_format == 3 and info.source.kind != "hub":
        return _build_streamed(info, opts, role, final)
    return _build_torch(info, opts, role, final)


def _build_streamed(info: ModelInfo, opts: ExportOptions, role: str, final: Path) -> tuple[Path, dict]:
    """The format-3 graph of a GGUF file or safetensors directory, written one tensor at a time
    (:mod:`.families`), then validated against the numpy reference of the same weights."""
    from .families import family_for
    from .families.base import build
    from .gqa_graph import GraphBuilder
    from .validate import (AGREEMENT_FLOOR, FP32_TOLERANCE, _agreement, graph_logits, reference_logits,
                           validate_reference)

    tmp = final.with_name(final.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        with tqdm(total=3, desc=f"{role}: write", unit="step", bar_format="{desc} [{n_fmt}/{total_fmt}] {elapsed}") as bar:
            t0 = time.perf_counter()
            src = weights(info)
            cfg = src.config
            layers, kv, hd = cfg.kv_shape
            kept, val = None, {}
            if opts.vocab_size is not None and opts.vocab_size < info.logits_width:
                from .prune import kept_token_ids

                kept, how = kept_token_ids(info.tokenizer, info.logits_width, opts.vocab_size)
                np.save(tmp / "kept_token_ids.npy", kept)
                val["pruned_vocab"] = {"size": int(len(kept)), "source": how}
            layout = weight_layout(opts, src)
            out = tmp / "model.onnx"
            g = GraphBuilder(tmp / "model.onnx.data")
            try:
                proto = build(family_for(cfg.architecture)(src, layout, g), kept=kept)
            except KeyError as e:  # a tensor the family needs is not in the file
                raise EdgespecError(f"{role} {info.source.ref}: the weights have no tensor {e}") from None
            finally:
                g.close()
            onnx.save_model(proto, str(out))
            ins, outs = [i.name for i in proto.graph.input], [o.name for o in proto.graph.output]
            del proto
            gc.collect()
            bar.set_description(f"{role}: validate against the source"); bar.update()
            ids = _validation_ids(info)
            ref = reference_logits(src, ids)
            val["reference"] = rv = validate_reference(ref, out, ids, layers, kv, hd, kept)
            if opts.precision == "fp32" and kept is None and rv["max_abs_logit_error"] > FP32_TOLERANCE:
                raise EdgespecError(f"{role}: the fp32 graph differs from the numpy reference of its weights by "
                                    f"{rv['max_abs_logit_error']:.2e} (> {FP32_TOLERANCE:g}); not writing a broken "
                                    "export")
            if opts.precision != "fp32" and rv["greedy_agreement"] < AGREEMENT_FLOOR:
                _log(f"warning: {role}: the {opts.precision} graph agrees with its source weights on only "
                     f"{rv['greedy_agreement']:.1%} of greedy tokens (below {AGREEMENT_FLOOR:.0%}): its answers may "
                     "differ noticeably from the model's (a finer --block-size, or --lm-head-bits 8, may help)")
            bar.update()
            if opts.prefill_int8:
                from .prefill_graph import PREFILL_NAME, write_prefill_graph

                bar.set_description(f"{role}: int8 prefill graph")
                try:
                    write_prefill_graph(tmp)
                except ValueError:  # every layer matmul kept at 8 or 32 bits by the layout
                    raise EdgespecError(f"{role}: the layout {opts.layout} leaves no 4-bit layer matmul for an int8 "
                                        "prefill graph; export with --no-prefill-int8 (or --profile small)") from None
                pre = graph_logits(tmp / PREFILL_NAME, ids, layers, kv, hd)
                val["prefill_int8"] = {"vs_fp32": _agreement(ref if kept is None else ref[:, kept], pre),
                                       "vs_graph": _agreement(graph_logits(out, ids, layers, kv, hd), pre)}
            del ref
            if opts.kv_int8:
                bar.set_description(f"{role}: int8 KV cache")
                plain = tmp / "float32-kv.onnx"  # the same graph with a float32 cache, reading the same data file
                shutil.copy2(out, plain)
                val["kv_int8"] = _kv_int8(info, plain, tmp, ids, layers, kv, hd,
                                          tmp / PREFILL_NAME if opts.prefill_int8 else None)
                plain.unlink()
            bar.update()
        meta = _commit(tmp, final, asdict(_spec(info, opts, ins, outs, val, kept, _context(out, info),
                                                layout.bits_of("lm_head"))), t0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _print_validation(role, meta)
    return final, meta


def _spec(info: ModelInfo, opts: ExportOptions, ins, outs, val: dict, kept, context: int,
          head_bits: int | None = None) -> GraphSpec:
    """The graph's manifest entry (paths relative to the graph's directory; the export prefixes its role).
    ``head_bits``: the output head's bits as the streamed writer wrote them (a ``+gguf6`` layout resolves
    them from the source); None: from ``opts``."""
    layers, kv, hd = info.config.kv_shape
    embedding_bits = EMBEDDING_BITS.get(opts.precision) if opts.graph_format >= 3 else None
    return GraphSpec(
        path="model.onnx", architecture=info.config.architecture, num_layers=layers, num_kv_heads=kv,
        head_dim=hd, vocab_size=int(len(kept)) if kept is not None else info.logits_width,
        context_length=context,
        quantization=Quantization(opts.precision, opts.block_size if opts.precision == "int4" else None,
                                  opts.accuracy_level if opts.precision == "int4" else None,
                                  head_bits or opts.lm_head_bits or {"int4": 4, "int8": 8}.get(opts.precision, 32),
                                  embedding_bits or 32, opts.zero_points, dict(opts.tensor_bits),
                                  tensor_blocks=dict(opts.tensor_blocks)),
        source=info.source.ref, source_sha256=info.source.sha256, input_names=tuple(ins),
        output_names=tuple(outs), validation=val,
        kept_token_ids="kept_token_ids.npy" if kept is not None else None, graph_format=opts.graph_format,
        prefill_path="prefill.onnx" if opts.prefill_int8 else None, kv_cache="int8" if opts.kv_int8 else "float32",
        **(_float32_prefill() if opts.kv_int8 and opts.prefill_int8 else {}))


def _build_torch(info: ModelInfo, opts: ExportOptions, role: str, final: Path) -> tuple[Path, dict]:
    """A graph through transformers and torch: hub ids, and graph formats 2 (traced) and 4."""
    from .gqa_graph import export_format3
    from .onnx_graph import kv_shape
    from .traced_graph import export_onnx
    from .validate import FP32_TOLERANCE, validate_fp32, validate_quantized

    tmp = final.with_name(final.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        with tqdm(total=4, desc=f"{role}: convert", unit="step", bar_format="{desc} [{n_fmt}/{total_fmt}] {elapsed}") as bar:
            t0 = time.perf_counter()
            model = load_weights(info, role)
            bar.set_description(f"{role}: export ONNX"); bar.update()
            fp32 = tmp / "fp32.onnx"
            if opts.graph_format == 4:
                from .grouped_graph import GroupedWriter

                ins, outs = export_format3(model, fp32, GroupedWriter)
            else:
                ins, outs = (export_format3 if opts.graph_format == 3 else export_onnx)(model, fp32)
            bar.set_description(f"{role}: validate fp32"); bar.update()
            layers, kv, hd = kv_shape(model.config)
            ids = _validation_ids(info)
            val = {"fp32": validate_fp32(model, fp32, ids)}
            del model
            gc.collect()
            worst = max(val["fp32"][k] for k in ("max_abs_prefill", "max_abs_with_past", "max_abs_past_vs_full"))
            if worst > FP32_TOLERANCE:
                raise EdgespecError(f"{role}: fp32 ONNX graph differs from PyTorch by {worst:.2e} "
                                    f"(> {FP32_TOLERANCE:g}); not writing a broken export")
            bar.set_description(f"{role}: quantize {opts.precision}"); bar.update()
            out = tmp / "model.onnx"
            kept, ref = None, fp32
            if opts.vocab_size is not None and opts.vocab_size < info.logits_width:
                from .prune import kept_token_ids, prune_lm_head

                kept, how = kept_token_ids(info.tokenizer, info.logits_width, opts.vocab_size)
                np.save(tmp / "kept_token_ids.npy", kept)
                ref = tmp / "full.onnx"
                quantize(fp32, ref, "fp32")  # a full-vocabulary copy: the reference for the figures below
                prune_lm_head(fp32, kept)
                val["pruned_vocab"] = {"size": int(len(kept)), "source": how}
            embedding_bits = EMBEDDING_BITS.get(opts.precision) if opts.graph_format >= 3 else None
            quantize(fp32, out, opts.precision, opts.block_size, opts.accuracy_level, opts.lm_head_bits,
                     embedding_bits)
            if opts.precision != "fp32" or kept is not None:
                val["quantized"] = validate_quantized(ref, out, ids, layers, kv, hd, kept)
            if opts.prefill_int8:
                from .prefill_graph import PREFILL_NAME, write_prefill_graph

                bar.set_description(f"{role}: int8 prefill graph")
                write_prefill_graph(tmp)
                val["prefill_int8"] = {"vs_fp32": validate_quantized(ref, tmp / PREFILL_NAME, ids, layers, kv, hd,
                                                                     kept),
                                       "vs_graph": validate_quantized(out, tmp / PREFILL_NAME, ids, layers, kv,
                                                                      hd)}
            if opts.kv_int8:
                bar.set_description(f"{role}: int8 KV cache")
                plain = tmp / "float32-kv.onnx"  # the same graph with a float32 cache, reading the same data file
                shutil.copy2(out, plain)
                val["kv_int8"] = _kv_int8(info, plain, tmp, ids, layers, kv, hd,
                                          tmp / PREFILL_NAME if opts.prefill_int8 else None)
                plain.unlink()
            for f in {fp32, ref}:
                f.unlink()
                f.with_name(f.name + ".data").unlink()
            bar.update()
        spec = _spec(info, opts, ins, outs, val, kept, int(info.config.max_position_embeddings))
        meta = _commit(tmp, final, asdict(spec), t0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _print_validation(role, meta)
    return final, meta


def _float32_prefill() -> dict:
    """The manifest fields of an int8 cache whose prefill graph attends in float32 (GraphSpec.prefill_kv_cache)."""
    return {"prefill_kv_cache": "float32", "kv_scales": KV_SCALES_NAME}


def _commit(tmp: Path, final: Path, meta: dict, t0: float) -> dict:
    """``meta`` with the build time and every graph file's size and sha256, written to ``tmp/meta.json``; then
    ``tmp`` replaces the cache entry ``final``. Returns the metadata."""
    meta = {**meta, "build_seconds": round(time.perf_counter() - t0, 1),
            "files": {f: {"size": (tmp / f).stat().st_size, "sha256": sha256_file(tmp / f)}
                      for f in GRAPH_FILES if (tmp / f).is_file()}}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return meta


def _print_validation(role: str, meta: dict) -> None:
    v, precision = meta["validation"], meta["quantization"]["precision"]
    parts = []
    if "reference" in v:
        r = v["reference"]
        parts.append(f"{precision} graph vs the numpy reference of its weights: greedy agreement "
                     f"{r['greedy_agreement']:.3f} over {r['positions']} positions, max|Δ logit| "
                     f"{r['max_abs_logit_error']:.2g}" + (f", KL {r['kl_mean']:.4f}" if "kl_mean" in r else "")
                     + f"; past vs full {r['max_abs_past_vs_full']:.1e}")
    if "fp32" in v:
        f = v["fp32"]
        parts.append(f"fp32 vs PyTorch max|Δ| prefill {f['max_abs_prefill']:.1e}, with past "
                     f"{f['max_abs_with_past']:.1e}; past vs full {f['max_abs_past_vs_full']:.1e}")
    if "quantized" in v:
        q = v["quantized"]
        parts.append(f"{precision} greedy agreement {q['greedy_agreement']:.3f} over {q['positions']} positions, "
                     f"max|Δ logit| {q['max_abs_logit_error']:.2f}")
    if "prefill_int8" in v:
        p = v["prefill_int8"]
        parts.append(f"int8 prefill graph greedy agreement {p['vs_fp32']['greedy_agreement']:.3f} with fp32, "
                     f"{p['vs_graph']['greedy_agreement']:.3f} with the {precision} graph")
    if "kv_int8" in v:
        k = v["kv_int8"]
        line = (f"int8 KV cache greedy agreement {k['greedy_agreement']:.3f} with the float32 cache, "
                f"max|Δ logit| {k['max_abs_logit_error']:.2f}")
        if "with_prefill_graph" in k:
            line += f" ({k['with_prefill_graph']['greedy_agreement']:.3f} after a prefill on the prefill graph)"
        parts.append(line)
    _log(f"{role}: " + "; ".join(parts))
