"""The export contract: ``edgespec.json``, loaded into frozen dataclasses.

One manifest per export directory describes both graphs (``target`` and ``draft`` blocks), the tokenizer,
the chat template, the special tokens and the validation figures measured at export time. The runtime reads
only this file to know how to feed the graphs; the exporter writes it last, so a directory without it (or
with a different ``format``) is not a complete export.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import EdgespecError

MANIFEST_NAME = "edgespec.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Quantization:
    """How a graph's weights were quantized.

    ``precision`` is ``int4`` (onnxruntime MatMulNBits, ``block_size``, ``accuracy_level``, symmetric),
    ``int8`` (dynamic QInt8 MatMul) or ``fp32``. ``lm_head_bits`` is the precision kept for the output head.
    """

    precision: str
    block_size: int | None = None
    accuracy_level: int | None = None
    lm_head_bits: int = 32


@dataclass(frozen=True)
class GraphSpec:
    """One ONNX causal LM graph with KV-cache inputs and outputs.

    Inputs: ``input_ids`` int64 (B, T); ``position_ids`` int64 (B, T); ``attention_mask`` bool (B, 1, T, P+T)
    (True = query may attend to that key; expresses causal, padding and tree masks);
    ``past_key_values.{i}.key|value`` float32 (B, kv_heads, P, head_dim).
    Outputs: ``logits`` float32 (B, T, vocab_size); ``present.{i}.key|value`` float32 (B, kv_heads, P+T, head_dim).
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

    def past_names(self) -> list[tuple[str, str]]:
        """``[(key_name, value_name)]`` per layer, in layer order."""
        return [(f"past_key_values.{i}.key", f"past_key_values.{i}.value") for i in range(self.num_layers)]


@dataclass(frozen=True)
class SpecialTokens:
    """Token ids; ``stop`` ends generation (both 151643 and 151645 for Qwen2.5)."""

    bos: int | None
    eos: int
    pad: int | None
    stop: tuple[int, ...]


@dataclass(frozen=True)
class Manifest:
    """The whole ``edgespec.json``."""

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

    @property
    def vocab_size(self) -> int:
        """Common logits width used for sampling: the smaller of the two graphs' widths."""
        return min(self.target.vocab_size, self.draft.vocab_size)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=False)


def _graph(d: dict) -> GraphSpec:
    d = dict(d)
    d["quantization"] = Quantization(**d["quantization"])
    d["input_names"] = tuple(d["input_names"])
    d["output_names"] = tuple(d["output_names"])
    return GraphSpec(**d)


def load_manifest(export_dir: str | Path) -> Manifest:
    """Read ``DIR/edgespec.json``.

    Raises:
        EdgespecError: DIR is missing, is an unfinished export, or the manifest is unreadable or of another format.
    """
    export_dir = Path(export_dir)
    if not export_dir.is_dir():
        raise EdgespecError(f"{export_dir}: no such export directory (run `edgespec export` first)")
    path = export_dir / MANIFEST_NAME
    if not path.is_file():
        raise EdgespecError(
            f"{export_dir}: not a complete edgespec export (no {MANIFEST_NAME}; an interrupted export? run it again)"
        )
    try:
        raw = json.loads(path.read_text())
        if raw.get("format") != FORMAT_VERSION:
            raise EdgespecError(f"{path}: manifest format {raw.get('format')!r}, this edgespec reads {FORMAT_VERSION}")
        raw = dict(raw)
        raw["target"] = _graph(raw["target"])
        raw["draft"] = _graph(raw["draft"])
        st = dict(raw["special_tokens"])
        st["stop"] = tuple(st["stop"])
        raw["special_tokens"] = SpecialTokens(**st)
        manifest = Manifest(**raw)
    except EdgespecError:
        raise
    except (ValueError, KeyError, TypeError) as e:
        raise EdgespecError(f"{path}: unreadable manifest ({type(e).__name__}: {e})") from None
    for g in (manifest.target, manifest.draft):
        if not (export_dir / g.path).is_file():
            raise EdgespecError(f"{export_dir}: graph {g.path} is missing (incomplete export)")
    return manifest
