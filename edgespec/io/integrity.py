"""Is this export what its manifest says? Checks at load, where the export enters the runtime.

- files: every file the manifest lists in ``files`` has its recorded size (always checked: a stat) and
  sha256 (checked on the first load on this device; the verdict is cached in the user cache by resolved path,
  size and mtime, so a changed file is hashed again; ``edgespec info --verify`` always hashes).
- graphs: the ONNX session's own inputs and outputs against the manifest block: names, number of layers,
  KV heads, head_dim and the logits width.
- tokenizer: the special token ids are ids of the tokenizer, the graphs' vocabularies cover it, a pruned
  draft head's kept ids are target ids.

Every mismatch is an :class:`~edgespec.errors.EdgespecError` naming the file and the value in one line.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np

from . import paths
from ..errors import EdgespecError
from .manifest import MANIFEST_NAME, FileEntry, GraphSpec, Manifest

CHUNK = 1 << 22


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def _verdict_name(path: Path, size: int, mtime_ns: int, sha256: str) -> str:
    key = f"{path.resolve()}\0{size}\0{mtime_ns}\0{sha256}".encode("utf-8", "surrogateescape")
    return hashlib.sha256(key).hexdigest()[:32]


def check_file(path: Path, entry: FileEntry, verify: str = "auto") -> bool:
    """Check one file against its manifest entry; returns whether its sha256 was computed now.

    ``verify``: ``"auto"`` hashes unless an earlier load on this device verified the same path, size and
    mtime; ``"always"`` hashes; ``"size"`` checks only the size.

    Raises:
        EdgespecError: the file is missing, has another size, or another sha256.
    """
    try:
        st = path.stat()
    except OSError:
        raise EdgespecError(f"{path}: missing (incomplete or edited export; export it again)") from None
    if st.st_size != entry.size:
        raise EdgespecError(f"{path}: {st.st_size} bytes, the manifest records {entry.size} "
                            "(truncated or replaced; export it again)")
    if verify == "size":
        return False
    verdicts = paths.cache_dir("verified")  # None when the user cache is not writable: hash every load
    name = _verdict_name(path, st.st_size, st.st_mtime_ns, entry.sha256)
    if verify == "auto" and verdicts is not None and (verdicts / name).is_file():
        return False
    if sha256_file(path) != entry.sha256:
        raise EdgespecError(f"{path}: sha256 differs from the one recorded at export (corrupt or modified "
                            "file; export it again)")
    if verdicts is not None:
        paths.write_atomic(verdicts / name, b"")
    return True


def check_files(export_dir: Path, m: Manifest, verify: str = "auto") -> list[str]:
    """Check every file in ``m.files``; returns the ones hashed now. See :func:`check_file`."""
    return [rel for rel, entry in m.files.items() if check_file(export_dir / rel, entry, verify)]


_PAST = re.compile(r"past_key_values\.(\d+)\.key(?:\.0)?")  # graph format 4: one input per KV head (.0 first)


def check_graph(session, spec: GraphSpec, role: str, path: Path, feeds: list[str], fetches: list[str],
                kv_cache: str | None = None) -> None:
    """The graph in ``session`` against its manifest block ``spec``: inputs, outputs and their shapes.

    ``feeds``/``fetches`` are the KV input and output names the runtime will use; their element type is
    ``kv_cache`` (default ``spec.kv_cache``; a prefill graph's is ``spec.prefill_cache_type``). Dimensions the
    graph leaves symbolic are not compared.

    Raises:
        EdgespecError: a graph of another model (other layer count, KV heads, head_dim or vocabulary), or
            names that do not match.
    """
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = {o.name: o for o in session.get_outputs()}
    where = f"{path}: the {role} graph"
    layers = sum(1 for n in inputs if _PAST.fullmatch(n))
    if layers != spec.num_layers:
        raise EdgespecError(f"{where} has {layers} layers, the manifest says {role}.num_layers {spec.num_layers} "
                            "(graphs of another export or swapped?)")
    missing_in = [n for n in ["input_ids", "position_ids", "attention_mask", *feeds] if n not in inputs]
    missing_out = [n for n in fetches if n not in outputs]
    if missing_in or missing_out:
        name = (missing_in or missing_out)[0]
        raise EdgespecError(f"{where} has no {'input' if missing_in else 'output'} {name!r}")
    named, listed = set(inputs) - {"logits_keep"}, set(spec.input_names) - {"logits_keep"}  # listed or not
    if named != listed or set(outputs) != set(spec.output_names):
        kind, have, said = (("input", named, listed) if named != listed
                            else ("output", outputs, spec.output_names))
        odd = sorted(set(have) ^ set(said))[0]
        raise EdgespecError(f"{where}'s {kind} names differ from {role}.{kind}_names in the manifest ({odd!r})")
    if inputs["input_ids"].type != "tensor(int64)":
        raise EdgespecError(f"{where} takes input_ids as {inputs['input_ids'].type}, not int64")
    kv_type = kv_cache or getattr(spec, "kv_cache", "float32")
    want_type = f"tensor({kv_type.replace('float32', 'float')})"
    field_name = "prefill_kv_cache" if kv_cache is not None and kv_cache != getattr(spec, "kv_cache", "float32") \
        else "kv_cache"
    for name in feeds:
        if inputs[name].type != want_type:
            raise EdgespecError(f"{where} takes {name} as {inputs[name].type}, the manifest says {role}.{field_name} "
                                f"{kv_type} (export again)")
        shape = inputs[name].shape
        for axis, what, want in ((1, "num_kv_heads", spec.num_kv_heads), (3, "head_dim", spec.head_dim)):
            axis = {4: axis, 2: 1 if axis == 3 else None}.get(len(shape))  # format 4: (W, head_dim) per KV head
            if axis is not None and isinstance(shape[axis], int) and shape[axis] != want:
                raise EdgespecError(f"{where} has {what.replace('num_', '').replace('_', ' ')} {shape[axis]} "
                                    f"in {name}, the manifest says {role}.{what} {want}")
    width = outputs["logits"].shape[-1] if outputs["logits"].shape else None
    if isinstance(width, int) and width != spec.vocab_size:
        raise EdgespecError(f"{where}'s logits are {width} wide, the manifest says {role}.vocab_size "
                            f"{spec.vocab_size} (a graph of another model?)")


def tokenizer_width(tokenizer) -> int:
    """1 + the largest id of the tokenizer's real vocabulary (added tokens included).

    Filler entries at the top that only pad the vocabulary to the model's head width are not real tokens:
    a GGUF-converted Qwen tokenizer has ``[PAD151665]`` … ``[PAD151935]`` (each named after its own id), so
    its real vocabulary is 151665 ids, not 151936.
    """
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    if not vocab:
        return 0
    by_id = {i: t for t, i in vocab.items()}
    top = max(by_id)
    while top >= 0 and by_id.get(top) == f"[PAD{top}]":
        top -= 1
    return top + 1


def check_tokenizer(export_dir: Path, m: Manifest, n_tokens: int) -> np.ndarray | None:
    """The manifest's token ids against a tokenizer of ``n_tokens`` ids; returns a pruned draft head's kept
    ids int64 (N,) (None when the draft's head is not pruned).

    Raises:
        EdgespecError: a special token id is not an id of the tokenizer, a graph's vocabulary is narrower
            than the tokenizer's, or the kept ids file is unreadable or holds ids outside the vocabulary.
    """
    manifest = export_dir / MANIFEST_NAME
    st = m.special_tokens
    for name, ids in (("bos", [st.bos]), ("eos", [st.eos]), ("pad", [st.pad]), ("stop", list(st.stop))):
        for i in ids:
            if i is not None and not 0 <= i < n_tokens:
                raise EdgespecError(f"{manifest}: special_tokens.{name} {i} is not a token id of {m.tokenizer} "
                                    f"(ids 0..{n_tokens - 1})")
    if not st.stop:
        raise EdgespecError(f"{manifest}: special_tokens.stop is empty (generation would never stop)")
    kept = None
    for role, g in (("target", m.target), ("draft", m.draft)):
        if g.kept_token_ids:
            kept = _kept_ids(export_dir / g.kept_token_ids, g, n_tokens)
            continue
        if g.vocab_size < n_tokens:
            raise EdgespecError(f"{manifest}: {role}.vocab_size {g.vocab_size} is smaller than the tokenizer's "
                                f"{n_tokens} ids ({m.tokenizer} is not this model's tokenizer?)")
    if m.target.kept_token_ids:
        raise EdgespecError(f"{manifest}: target.kept_token_ids is set; only the draft's head may be pruned")
    return kept


def _kept_ids(path: Path, g: GraphSpec, n_tokens: int) -> np.ndarray:
    try:
        kept = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise EdgespecError(f"{path}: unreadable kept token ids ({str(e).splitlines()[0] if str(e) else e})") from None
    if kept.ndim != 1 or kept.dtype.kind not in "iu" or len(kept) != g.vocab_size:
        raise EdgespecError(f"{path}: expected {g.vocab_size} integer token ids, got {kept.dtype} {kept.shape}")
    if len(kept) and (kept.min() < 0 or kept.max() >= n_tokens or len(np.unique(kept)) != len(kept)):
        raise EdgespecError(f"{path}: kept token ids must be distinct ids in 0..{n_tokens - 1}")
    return kept.astype(np.int64)
