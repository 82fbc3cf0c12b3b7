"""Pruned draft vocabulary (FR-Spec, Zhao et al. 2025): the draft's lm_head keeps only frequent token ids.

The draft then spends far less time in its output head; the target still verifies over the full vocabulary,
and the runtime gives every dropped id q = 0, so rejection sampling stays exact.

Token frequencies come from a corpus that ships with every Python: the standard library's own source
files (code, comments and docstrings), read up to a byte budget in sorted path order. Ids never seen there
are ranked by id, which for a byte-level BPE vocabulary is the merge rank (earlier merges are more frequent
pairs). Special and added tokens are always kept.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

CORPUS_BYTES = 8 << 20


def stdlib_corpus(max_bytes: int = CORPUS_BYTES) -> tuple[list[str], str]:
    """Texts of the standard library's ``.py`` files (sorted paths) up to ``max_bytes``; and a description."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for p in sorted(root.rglob("*.py")):
        if "site-packages" in p.parts or "test" in p.parts:
            continue
        try:
            t = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        texts.append(t)
        total += len(t)
        if total >= max_bytes:
            break
    return texts, f"python {sysconfig.get_python_version()} stdlib .py files, {total} chars"


def kept_token_ids(tokenizer, vocab_width: int, size: int) -> tuple[np.ndarray, str]:
    """The ``size`` ids to keep (sorted int64), most frequent in the corpus first, then by merge rank."""
    backend = tokenizer.backend_tokenizer
    texts, corpus = stdlib_corpus()
    counts = np.zeros(vocab_width, dtype=np.int64)
    for enc in backend.encode_batch(texts, add_special_tokens=False):
        ids = np.asarray(enc.ids, dtype=np.int64)
        np.add.at(counts, ids[ids < vocab_width], 1)
    added = [i for i in backend.get_added_tokens_decoder() if i < vocab_width]
    n_real = min(vocab_width, len(backend.get_vocab(with_added_tokens=True)))
    order = sorted(range(n_real), key=lambda i: (-counts[i], i))
    keep = list(dict.fromkeys(added + order))[:max(size, len(added))]
    return np.array(sorted(keep), dtype=np.int64), f"frequencies from {corpus}; unseen ids by merge rank"


def prune_lm_head(path: Path, kept: np.ndarray) -> None:
    """Rewrite the graph at ``path`` so ``logits`` has only the ``kept`` columns: float32 (B, T, len(kept))."""
    from .quantize import save_with_data, lm_head_node

    model = onnx.load(str(path), load_external_data=True)
    head = lm_head_node(model)
    if head is None:
        raise ValueError("no MatMul produces logits: cannot prune the lm_head")
    node = next(n for n in model.graph.node if n.name == head)
    inits = {t.name: t for t in model.graph.initializer}
    w = numpy_helper.to_array(inits[node.input[1]])  # (hidden, V)
    new = numpy_helper.from_array(np.ascontiguousarray(w[:, kept]), node.input[1])
    inits[node.input[1]].CopyFrom(new)
    for out in model.graph.output:
        if out.name == "logits":
            out.type.tensor_type.shape.dim[2].dim_value = len(kept)
    save_with_data(model, path)
