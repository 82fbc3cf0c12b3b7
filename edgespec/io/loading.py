"""Opening an export directory (what ``edgespec export`` wrote): the manifest and its integrity checks, the
tokenizer and chat template, the target and draft graphs in onnxruntime sessions, and the heap trims between them.

Two steps, so that a caller can make a process-wide choice between them (the decoder turns on the shared
onnxruntime thread pool there, before the first session): :func:`check_export` reads what is cheap and refuses
an incomplete or altered export; :func:`open_export` loads the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .integrity import check_files, check_tokenizer, tokenizer_width
from .manifest import Manifest, load_manifest
from .onnx_model import OnnxLM, SessionMemory
from .pages import trim_heap
from .text import ChatTemplate, load_template, load_tokenizer


@dataclass(frozen=True)
class OpenExport:
    """An opened export: its manifest, tokenizer, chat template (None: the export has none), the target and
    draft graphs (``draft`` None: loaded without it), and the context in tokens both graphs hold."""

    manifest: Manifest
    tokenizer: object  # tokenizers.Tokenizer
    template: ChatTemplate | None
    target: OnnxLM
    draft: OnnxLM | None
    context_length: int


def check_export(export_dir: str | Path) -> Manifest:
    """The manifest of ``export_dir``, after checking its files against it (:mod:`edgespec.io.integrity`: sizes
    always, sha256 on the first load on this device).

    Raises:
        EdgespecError: not a complete export, or a file that does not match the manifest.
    """
    export_dir = Path(export_dir).expanduser()
    m = load_manifest(export_dir)
    check_files(export_dir, m)
    return m


def open_export(export_dir: str | Path, m: Manifest, provider: str = "cpu", threads: int | None = None,
                provider_options: dict | None = None, load_draft: bool = True, context_length: int | None = None,
                memory: SessionMemory | None = None) -> OpenExport:
    """Load the tokenizer, the chat template and the graphs of ``export_dir`` (whose manifest :func:`check_export`
    returned as ``m``) on ``provider`` with ``provider_options`` and ``threads`` (see
    :class:`~edgespec.io.onnx_model.OnnxLM`), with the session memory settings ``memory`` (default
    :data:`~edgespec.io.onnx_model.DEFAULT_MEMORY`). The tokenizer is checked against the manifest's token ids,
    each graph's inputs and outputs against its spec. ``context_length`` (tokens) caps the context of the two
    graphs' manifests. ``load_draft=False``: the target alone.

    Raises:
        EdgespecError: a tokenizer or graph that does not match the manifest, or an unknown execution provider.
    """
    export_dir = Path(export_dir)
    tok = load_tokenizer(export_dir / m.tokenizer)
    trim_heap()  # its JSON parse leaves ~37 MB of free heap blocks; give them back before the graphs load
    check_tokenizer(export_dir, m, tokenizer_width(tok))
    template = None
    if m.chat_template:
        bos = tok.id_to_token(m.special_tokens.bos) if m.special_tokens.bos is not None else ""
        template = load_template(export_dir / m.chat_template, bos or "",
                                 tok.id_to_token(m.special_tokens.eos) or "")
    target = OnnxLM(m.target, export_dir, provider, threads, provider_options, role="target", memory=memory)
    draft = (OnnxLM(m.draft, export_dir, provider, threads, provider_options, role="draft", memory=memory)
             if load_draft else None)
    trim_heap()  # and what loading the graphs left
    ctx = min(m.target.context_length, m.draft.context_length)
    if context_length is not None:
        ctx = min(ctx, context_length)
    return OpenExport(m, tok, template, target, draft, ctx)
