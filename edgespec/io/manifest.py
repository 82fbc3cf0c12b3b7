"""The export contract: ``edgespec.json``, loaded into frozen dataclasses.

One manifest per export directory describes both graphs (``target`` and ``draft`` blocks), the tokenizer,
the chat template, the special tokens and the validation figures measured at export time. The runtime reads
only this file to know how to feed the graphs; the exporter writes it last, so a directory without it (or
with a different ``format``) is not a complete export.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import paths
from ..errors import EdgespecError

MANIFEST_NAME = "edgespec.json"
FORMAT_VERSION = 1
GRAPH_FORMAT = 4  # newest graph format this runtime reads (GraphSpec.graph_format)
KV_CACHE_TYPES = ("float32", "int8")  # GraphSpec.kv_cache


@dataclass(frozen=True)
class Quantization:
    """How a graph's weights were quantized.

    ``precision`` is ``int4`` (onnxruntime MatMulNBits, ``block_size``, ``accuracy_level``, symmetric),
    ``int8`` (8-bit MatMulNBits in graphs streamed from GGUF or safetensors; dynamic QInt8 MatMul in graphs built
    through torch) or ``fp32``. ``lm_head_bits`` is the precision kept for the output head,
    ``embedding_bits`` that of the token embedding table (32: fp32 ``Gather``; 4 or 8: ``GatherBlockQuantized``
    in blocks of ``block_size`` where it divides the hidden size, else of the largest power of two below it that
    does; of 32 in int8 graphs built through torch). The graph's own ``block_size`` attributes are authoritative.
    ``zero_points``: the int4 blocks are asymmetric (a uint8 zero point each). ``tensor_bits`` maps a weight-name
    fragment (``down_proj``, ``layers.0.``) to the bits kept for the matmuls whose name contains it (4, 8 or 32;
    the first fragment that matches wins); ``tensor_blocks`` maps one to their block size (else ``block_size``).
    ``chosen_by`` says why the export has this layout (the default, the
    user's ``--layout``, or ``edgespec export --tune``'s measurements on a named CPU and date).
    """

    precision: str
    block_size: int | None = None
    accuracy_level: int | None = None
    lm_head_bits: int = 32
    embedding_bits: int = 32
    zero_points: bool = False
    tensor_bits: dict = field(default_factory=dict, hash=False)
    chosen_by: str | None = None
    tensor_blocks: dict = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class GraphSpec:
    """One ONNX causal LM graph with KV-cache inputs and outputs.

    Inputs: ``input_ids`` int64 (B, T); ``position_ids`` int64 (B, T); ``attention_mask`` bool (B, 1, T, P+T)
    (True = query may attend to that key; expresses causal, padding and tree masks);
    ``past_key_values.{i}.key|value`` float32 (B, kv_heads, P, head_dim).
    Outputs: ``logits`` float32 (B, T, vocab_size); ``present.{i}.key|value`` float32 (B, kv_heads, P+T, head_dim).
    Optional input (graph format 2, an overridable initializer, so not in ``input_names``): ``logits_keep``
    int64 (1,) = N > 0 computes ``logits`` for the last N rows only, float32 (B, N, vocab_size); 0 = all.

    ``graph_format`` 3 (absent = 2) changes only the KV cache: ``past_key_values.{i}.key|value`` are float32
    (B, kv_heads, C, head_dim) buffers of a capacity C ≥ P+T whose first P rows are the past (later rows are
    ignored), and ``present.{i}.key|value`` have the same shape C: the past rows unchanged and the T new rows
    written at P..P+T-1. P is read from the mask (P = its last dimension − T). Bound to the same memory
    (IO binding), past and present are one buffer that the graph updates in place. Attention is onnxruntime's
    ``com.microsoft.GroupQueryAttention`` (CPU kernel with ``position_ids`` and ``attention_bias``;
    tested on onnxruntime 1.32); the mask must be causal-compatible (each query sees no later slot).

    ``graph_format`` 4 keeps format 3's in-place cache with per-KV-head inputs and grouped attention
    (``export/grouped_graph.py``; B = 1): ``past_key_values.{i}.key|value.{h}`` float32 (W, head_dim) for each
    layer i and KV head h are the first W ≥ P rows of that head's buffer (bound by pointer); ``attention_mask``
    is bool (1, 1, T, W+T) with the columns P..W-1 False; the output ``present`` float32
    (2 · layers, kv_heads, T, head_dim) holds the T new rows (layer i's key at 2i, value at 2i+1), which the
    runtime stores at rows P..P+T-1 (:class:`edgespec.io.grouped_kv.GroupedKVCache`).

    ``kv_cache`` (optional, default ``"float32"``; ``edgespec export --kv-int8``): ``"int8"`` (graph format 3
    only) makes ``past_key_values.{i}.*`` and ``present.{i}.*`` int8 buffers of the same shapes, which
    ``GroupQueryAttention`` reads and writes natively (``k_quant_type``/``v_quant_type`` PER_CHANNEL,
    ``kv_cache_bit_width`` 8) with static per-channel scales stored in the graph (``export/kv_int8.py``).

    ``prefill_path`` (optional, ``edgespec export --prefill-int8``): a second graph with the same inputs,
    outputs and cache contract whose layer matmuls are int8 (``export/prefill_graph.py``), in ``path``'s
    directory (it reads their shared tensors from that directory's data file); the runtime runs prompt chunks
    of ≥ 64 rows on it and everything else on ``path``.

    ``prefill_kv_cache`` (optional, default ``kv_cache``): the element type of the prefill graph's cache. With
    ``kv_cache`` int8 and ``prefill_kv_cache`` ``"float32"`` (``edgespec export --kv-int8 --prefill-int8``), the
    prefill graph attends in float32 (onnxruntime's int8-cache kernel has no GEMM path for many query rows: 4×
    slower per prompt chunk), so the runtime prefills through a float32 copy of the cached rows and writes the
    new rows back quantized with ``kv_scales``: an ``.npz`` beside ``path`` of float32 (1, kv_heads, 1,
    head_dim) per-channel scales named ``past_key_values.{i}.key|value`` (the graph's own k_scale/v_scale;
    int8 value q stands for q · scale).
    """

    path: str
    architecture: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    quantization: Quantization
    source: str
    source_sha256: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    validation: dict[str, Any] = field(default_factory=dict)
    kept_token_ids: str | None = None  # .npy of int64 ids when the lm_head is pruned (draft only)
    graph_format: int = 2  # 1–2: traced graph, KV concatenated per step; 3: shared KV buffer, fused attention;
    # 4: per-KV-head shared buffers, grouped attention in plain ops
    prefill_path: str | None = None  # the same graph with int8 layer matmuls, for prompt chunks (export/prefill_graph.py)
    kv_cache: str = "float32"  # the KV cache's element type: "float32", or "int8" (format 3, export/kv_int8.py)
    prefill_kv_cache: str | None = None  # the prefill graph's cache type when it differs ("float32" beside int8)
    kv_scales: str | None = None  # .npz of the int8 cache's per-channel scales (with prefill_kv_cache float32)

    def past_names(self) -> list[tuple[str, str]]:
        """``[(key_name, value_name)]`` per layer, in layer order."""
        return [(f"past_key_values.{i}.key", f"past_key_values.{i}.value") for i in range(self.num_layers)]

    @property
    def prefill_cache_type(self) -> str:
        """The element type of the prefill graph's cache (``prefill_kv_cache``, default ``kv_cache``)."""
        return self.prefill_kv_cache or self.kv_cache


@dataclass(frozen=True)
class SpecialTokens:
    """Token ids; ``stop`` ends generation (both 151643 and 151645 for Qwen2.5)."""

    bos: int | None
    eos: int
    pad: int | None
    stop: tuple[int, ...]


@dataclass(frozen=True)
class FileEntry:
    """One file of the export: ``size`` in bytes and hex ``sha256``, recorded at export (since edgespec 0.1's
    integrity checks; older manifests have no ``files`` and are checked for presence only)."""

    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """The whole ``edgespec.json``. ``files`` maps every file of the export (paths relative to it, other than
    the manifest) to its :class:`FileEntry`; empty for exports written before it existed. ``profile``
    (``"small"`` or ``"full"``, ``edgespec export --profile``: which optional graphs were written) and
    ``profile_chosen_by`` (why, e.g. ``"auto: 23.4 GiB of RAM (at least 7)"``); None in exports made
    without a profile (before 2026-12-06, or by ``export_pair`` without one)."""

    name: str
    target: GraphSpec
    draft: GraphSpec
    tokenizer: str
    chat_template: str | None
    special_tokens: SpecialTokens
    tokenizer_sha256: str
    edgespec_version: str
    format: int = FORMAT_VERSION
    export_seconds: float | None = None
    files: dict[str, FileEntry] = field(default_factory=dict)
    profile: str | None = None
    profile_chosen_by: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=False)


class _Invalid(Exception):
    """A manifest field is missing or of the wrong type; ``str`` is the plain-words reason."""


def _show(v: Any) -> str:
    text = json.dumps(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# (test, description) per kind of field; None is allowed only where the kind says "or null"
_KINDS = {
    "str": (lambda v: isinstance(v, str), "a string"),
    "str?": (lambda v: v is None or isinstance(v, str), "a string or null"),
    "pos": (lambda v: _is_int(v) and v > 0, "a positive integer"),
    "pos?": (lambda v: v is None or (_is_int(v) and v > 0), "a positive integer or null"),
    "nonneg?": (lambda v: v is None or (_is_int(v) and v >= 0), "an integer ≥ 0 or null"),
    "token": (lambda v: _is_int(v) and v >= 0, "a token id (an integer ≥ 0)"),
    "token?": (lambda v: v is None or (_is_int(v) and v >= 0), "a token id (an integer ≥ 0) or null"),
    "tokens": (lambda v: isinstance(v, list) and all(_is_int(t) and t >= 0 for t in v),
               "a list of token ids (integers ≥ 0)"),
    "names": (lambda v: isinstance(v, (list, tuple)) and all(isinstance(t, str) for t in v), "a list of strings"),
    "object": (lambda v: isinstance(v, dict), "an object"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "bits": (lambda v: isinstance(v, dict) and all(isinstance(k, str) and k and v[k] in (4, 8, 32)
                                                   and not isinstance(v[k], bool) for k in v),
             "an object of weight-name fragments to bits (4, 8 or 32)"),
    "blocks": (lambda v: isinstance(v, dict) and all(isinstance(k, str) and k and v[k] in (16, 32, 64, 128, 256)
                                                     and not isinstance(v[k], bool) for k in v),
               "an object of weight-name fragments to block sizes (16, 32, 64, 128 or 256)"),
    "number?": (lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)),
                "a number or null"),
    "size": (lambda v: _is_int(v) and v >= 0, "a size in bytes (an integer ≥ 0)"),
    "sha256": (lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v) is not None,
               "a sha256 (64 lowercase hex digits)"),
}


def _fields(d: Any, where: str, spec: dict[str, tuple[str, bool]]) -> dict:
    """Check ``d`` against ``{key: (kind, required)}``; returns the known keys (unknown keys are ignored)."""
    if not isinstance(d, dict):
        raise _Invalid(f"{where} must be an object, got {_show(d)}")
    out = {}
    for key, (kind, required) in spec.items():
        if key not in d:
            if required:
                raise _Invalid(f'the "{key}" field is missing' + (f" in {where}" if where else ""))
            continue
        test, what = _KINDS[kind]
        if not test(d[key]):
            raise _Invalid(f"{where + '.' if where else ''}{key} must be {what}, got {_show(d[key])}")
        out[key] = d[key]
    return out


PRECISIONS = ("int4", "int8", "fp32")  # what the exporter writes (Quantization)
_QUANTIZATION = {"precision": ("str", True), "block_size": ("pos?", False), "accuracy_level": ("nonneg?", False),
                 "lm_head_bits": ("pos", False), "embedding_bits": ("pos", False), "zero_points": ("bool", False),
                 "tensor_bits": ("bits", False), "chosen_by": ("str?", False),
                 "tensor_blocks": ("blocks", False)}
_GRAPH = {"path": ("str", True), "architecture": ("str", True), "num_layers": ("pos", True),
          "num_kv_heads": ("pos", True), "head_dim": ("pos", True), "vocab_size": ("pos", True),
          "context_length": ("pos", True), "quantization": ("object", True), "source": ("str", True),
          "source_sha256": ("str", True), "input_names": ("names", True), "output_names": ("names", True),
          "validation": ("object", False), "kept_token_ids": ("str?", False), "graph_format": ("pos", False),
          "prefill_path": ("str?", False), "kv_cache": ("str", False), "prefill_kv_cache": ("str?", False),
          "kv_scales": ("str?", False)}
_SPECIAL = {"bos": ("token?", True), "eos": ("token", True), "pad": ("token?", True), "stop": ("tokens", True)}
_MANIFEST = {"name": ("str", True), "target": ("object", True), "draft": ("object", True), "tokenizer": ("str", True),
             "chat_template": ("str?", True), "special_tokens": ("object", True), "tokenizer_sha256": ("str", True),
             "edgespec_version": ("str", True), "format": ("pos", True), "export_seconds": ("number?", False),
             "files": ("object", False), "profile": ("str?", False), "profile_chosen_by": ("str?", False)}
PROFILE_NAMES = ("small", "full")  # Manifest.profile values (export/profiles.py)
_FILE = {"size": ("size", True), "sha256": ("sha256", True)}


def _relative(value: str, where: str) -> str:
    """A manifest path: relative, no ``..`` (symlinks are resolved against the directory in :func:`inside`)."""
    if not value or Path(value).is_absolute() or ".." in Path(value).parts or "\\" in value or ":" in value:
        raise _Invalid(f"{where} must be a path inside the export directory, got {_show(value)}")
    return value


def graph_spec(d: Any, role: str) -> GraphSpec:
    """A :class:`GraphSpec` from its JSON form (a manifest's ``target``/``draft`` block, or the exporter's cached
    graph metadata, whose paths are relative to the graph's own directory): the one place the graph schema is
    read.

    Raises:
        EdgespecError: a missing field, a wrong type or a path leaving the directory, named in one line.
    """
    try:
        return _graph(d, role)
    except _Invalid as e:
        raise EdgespecError(f"{role}: {e}") from None


def _graph(d: Any, role: str) -> GraphSpec:
    d = _fields(d, role, _GRAPH)
    _relative(d["path"], f"{role}.path")
    for key in ("kept_token_ids", "prefill_path", "kv_scales"):
        if d.get(key) is not None:
            _relative(d[key], f"{role}.{key}")
    pre = d.get("prefill_path")
    if pre is not None and (Path(pre).parent != Path(d["path"]).parent or Path(pre) == Path(d["path"])):
        # it reads the graph's shared tensors from the graph's own data file, by a path relative to itself
        raise _Invalid(f"{role}.prefill_path must name a graph beside {role}.path ({_show(d['path'])}), "
                       f"got {_show(pre)}")
    if d.get("kv_cache", "float32") not in KV_CACHE_TYPES:
        raise _Invalid(f"{role}.kv_cache must be one of {', '.join(KV_CACHE_TYPES)}, got {_show(d['kv_cache'])}")
    if d.get("kv_cache", "float32") == "int8" and d.get("graph_format", 2) != 3:
        raise _Invalid(f"{role}.kv_cache int8 needs graph format 3, not {d.get('graph_format', 2)}")
    kv, pkv = d.get("kv_cache", "float32"), d.get("prefill_kv_cache")
    if pkv is not None and pkv != kv:
        if pre is None or (kv, pkv) != ("int8", "float32"):
            raise _Invalid(f"{role}.prefill_kv_cache {_show(pkv)} needs a prefill graph and an int8 kv_cache "
                           f"(this edgespec reads a float32 prefill cache beside an int8 one only)")
        if d.get("kv_scales") is None:
            raise _Invalid(f"{role}.prefill_kv_cache float32 beside an int8 kv_cache needs kv_scales")
        if Path(d["kv_scales"]).parent != Path(d["path"]).parent:
            raise _Invalid(f"{role}.kv_scales must name a file beside {role}.path, got {_show(d['kv_scales'])}")
    elif d.get("kv_scales") is not None:  # accepted only where it is read
        raise _Invalid(f"{role}.kv_scales needs prefill_kv_cache float32 beside an int8 kv_cache (nothing else "
                       f"reads it)")
    d["quantization"] = Quantization(**_fields(d["quantization"], f"{role}.quantization", _QUANTIZATION))
    if d["quantization"].precision not in PRECISIONS:
        raise _Invalid(f"{role}.quantization.precision must be one of {', '.join(PRECISIONS)}, got "
                       f"{_show(d['quantization'].precision)}")
    d["input_names"] = tuple(d["input_names"])
    d["output_names"] = tuple(d["output_names"])
    if d.get("graph_format", 2) > GRAPH_FORMAT:
        raise _Invalid(f"{role}.graph_format is {d['graph_format']}; this edgespec reads graph formats up to "
                       f"{GRAPH_FORMAT} (update edgespec or export again)")
    return GraphSpec(**d)


def _manifest(raw: Any) -> Manifest:
    raw = _fields(raw, "", _MANIFEST)
    if raw.get("profile") not in (None, *PROFILE_NAMES):
        raise _Invalid(f"profile is {_show(raw['profile'])}, not one of {', '.join(PROFILE_NAMES)}")
    raw["target"] = _graph(raw["target"], "target")
    raw["draft"] = _graph(raw["draft"], "draft")
    st = _fields(raw["special_tokens"], "special_tokens", _SPECIAL)
    st["stop"] = tuple(st["stop"])
    raw["special_tokens"] = SpecialTokens(**st)
    _relative(raw["tokenizer"], "tokenizer")
    if raw["chat_template"] is not None:
        _relative(raw["chat_template"], "chat_template")
    files = {}
    for rel, entry in raw.get("files", {}).items():
        files[_relative(rel, "a key of files")] = FileEntry(**_fields(entry, f"files[{_show(rel)}]", _FILE))
    raw["files"] = files
    return Manifest(**raw)


def inside(export_dir: Path, rel: str, field_name: str) -> Path:
    """``export_dir/rel`` if it stays inside ``export_dir`` once symlinks are resolved.

    Raises:
        EdgespecError: the path (or a symlink on it) leads outside the export directory.
    """
    base = export_dir.resolve()
    target = (export_dir / rel).resolve()
    if target == base or not target.is_relative_to(base):
        raise EdgespecError(f"{export_dir / MANIFEST_NAME}: {field_name} {rel!r} leads outside the export directory "
                            f"(to {target}); refusing to read it")
    return target


def named_files(m: Manifest) -> list[tuple[str, str, bool]]:
    """``(field, relative path, required)`` for every file the manifest names."""
    out = [("target.path", m.target.path, True), ("draft.path", m.draft.path, True),
           ("tokenizer", m.tokenizer, True)]
    if m.chat_template:
        out.append(("chat_template", m.chat_template, True))
    for role, g in (("target", m.target), ("draft", m.draft)):
        if g.kept_token_ids:
            out.append((f"{role}.kept_token_ids", g.kept_token_ids, True))
        if g.prefill_path:
            out.append((f"{role}.prefill_path", g.prefill_path, True))
        if g.kv_scales:
            out.append((f"{role}.kv_scales", g.kv_scales, True))
    out += [("files", rel, True) for rel in m.files]
    return out


def load_manifest(export_dir: str | Path) -> Manifest:
    """Read and type-check ``DIR/edgespec.json``.

    Raises:
        EdgespecError: DIR is missing or not a directory, is an unfinished export, or the manifest is unreadable,
            not an edgespec manifest, of another format, has a missing or wrongly typed field, names a file
            that is missing or (symlinks resolved) outside DIR.
    """
    export_dir = Path(export_dir).expanduser()  # "~/…" in Python as in a shell
    paths.recover_export(export_dir)  # a re-export killed between its two renames: finish or undo it
    if export_dir.exists() and not export_dir.is_dir():
        raise EdgespecError(f"{export_dir}: not a directory (expected an edgespec export directory)")
    if not export_dir.is_dir():
        raise EdgespecError(f"{export_dir}: no such export directory (check the path; `edgespec export` writes "
                            f"the default pair to {paths.default_export_dir()})")
    path = export_dir / MANIFEST_NAME
    if path.is_dir():
        raise EdgespecError(f"{path}: a directory where the manifest file belongs (a broken export; export it again)")
    if not path.is_file():
        raise EdgespecError(
            f"{export_dir}: not a complete edgespec export (no {MANIFEST_NAME}; an interrupted export? run it again)"
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise EdgespecError(f"{path}: unreadable manifest (not valid JSON: {e})") from None
    except (OSError, ValueError) as e:  # ValueError: not UTF-8
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise EdgespecError(f"{path}: unreadable manifest ({reason})") from None
    if not isinstance(raw, dict):
        kind = {list: "a JSON list", str: "a JSON string", type(None): "JSON null", bool: "a JSON boolean"}.get(
            type(raw), "a JSON number")
        raise EdgespecError(f"{path}: not an edgespec manifest ({kind}, expected an object)")
    if "format" not in raw:
        raise EdgespecError(f"{path}: not an edgespec manifest (it has no \"format\" field)")
    if raw["format"] != FORMAT_VERSION or isinstance(raw["format"], bool):
        raise EdgespecError(f"{path}: manifest format {_show(raw['format'])}, this edgespec reads {FORMAT_VERSION}")
    try:
        manifest = _manifest(raw)
    except _Invalid as e:
        raise EdgespecError(f"{path}: invalid manifest: {e}") from None
    if "files" in raw:  # absent in exports older than the integrity checks; present, it must cover every file
        unrecorded = [rel for _, rel, _ in named_files(manifest) if rel not in manifest.files]
        if unrecorded:
            raise EdgespecError(f"{path}: files has no size and sha256 for {unrecorded[0]} (an edited manifest; "
                                "export it again)")
    for field_name, rel, required in named_files(manifest):
        p = inside(export_dir, rel, field_name)
        if required and not p.is_file():
            what = "graph " if field_name.endswith(".path") else ""
            raise EdgespecError(f"{export_dir}: {what}{rel} is missing (incomplete or edited export; export it again)")
    return manifest
