"""Read a resolved source: config and tokenizer first (cheap), weights later, one tensor at a time.

GGUF files and Hugging Face directories are read without torch or transformers: the config from the GGUF header
or ``config.json`` (:class:`export.model_config.ModelConfig`), the tokenizer with the ``tokenizers`` library
(:mod:`export.tokenizer`), the weights as a :class:`export.weights.TensorSource`. Hub ids, and the traced and
grouped graph formats, go through transformers and torch (the ``torch`` extra): :func:`load_weights`.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass
from functools import lru_cache

from edgespec.errors import EdgespecError

from .families import ARCHITECTURES as WRITTEN_ARCHITECTURES
from .model_config import ModelConfig
from .onnx_graph import SUPPORTED_ARCHITECTURES
from .sources import Source
from .tokenizer import STOP_TOKEN_TEXTS

TORCH_EXTRA = "pip install 'edgespec[torch]'"


@dataclass
class ModelInfo:
    """What the pair check needs, read without loading weights."""

    source: Source
    config: ModelConfig
    tokenizer: object  # .encode(text, add_special_tokens=False) -> ids; .backend_tokenizer (tokenizers)
    tokenizer_sha256: str
    chat_template: str | None
    eos: int
    bos: int | None
    pad: int | None
    stop: tuple[int, ...]

    @property
    def logits_width(self) -> int:
        return int(self.config.vocab_size)


def _pretrained_args(source: Source) -> tuple[str, dict]:
    if source.kind == "gguf":
        return str(source.path.parent), {"gguf_file": source.path.name}
    if source.kind == "hf":
        return str(source.path), {}
    return source.ref, {}


def tokenizer_sha256(tok) -> str:
    """Hash of the vocabulary (token → id, added tokens included) and merges; equal hash = same tokenizer."""
    state = json.loads(tok.backend_tokenizer.to_str())
    vocab = sorted(tok.backend_tokenizer.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
    merges = state.get("model", {}).get("merges", [])
    return hashlib.sha256(json.dumps([vocab, merges], ensure_ascii=False).encode()).hexdigest()


@lru_cache(maxsize=4)
def gguf_source(path: str):
    """The :class:`export.weights.gguf.GGUFSource` of a GGUF file, opened once per process (its reader parses
    the whole header: seconds for a 150,000-token vocabulary)."""
    from .weights.gguf import GGUFSource

    return GGUFSource(path)


def weights(info: ModelInfo):
    """The :class:`export.weights.TensorSource` of a GGUF file or a Hugging Face directory."""
    if info.source.kind == "gguf":
        return gguf_source(str(info.source.path))
    from .weights.safetensors import SafetensorsSource

    return SafetensorsSource(info.source.path)


def describe(source: Source, role: str) -> ModelInfo:
    """Config, tokenizer and special tokens of a source, without its weights: GGUF files and Hugging Face
    directories without transformers (module docstring), hub ids through transformers.

    Raises:
        EdgespecError: unreachable hub id, unreadable files, not a causal LM, or an unsupported architecture.
    """
    if source.kind == "hub":
        return _describe_transformers(source, role)
    from . import tokenizer as tk

    try:
        if source.kind == "gguf":
            src = gguf_source(str(source.path))
            config, tok = src.config, tk.from_gguf(src.reader, source.path)
        else:
            from .weights.safetensors import read_config

            config, tok = ModelConfig.from_hf(read_config(source.path)), tk.from_hf_dir(source.path)
    except EdgespecError as e:
        raise EdgespecError(f"{role}: {e}") from None
    except (KeyError, TypeError, ValueError, OSError, UnicodeDecodeError) as e:  # a malformed tokenizer or header
        raise EdgespecError(f"{role} {source.ref}: cannot read its tokenizer ({type(e).__name__}: {e})") from None
    if config.architecture not in WRITTEN_ARCHITECTURES:
        raise EdgespecError(f"{role} {source.ref}: unsupported architecture {config.architecture!r} "
                            f"(supported: {', '.join(WRITTEN_ARCHITECTURES)})")
    return ModelInfo(source=source, config=config, tokenizer=tok.tokenizer,
                     tokenizer_sha256=tokenizer_sha256(tok.tokenizer), chat_template=tok.chat_template, eos=tok.eos,
                     bos=tok.bos, pad=tok.pad, stop=tok.stop)


def _describe_transformers(source: Source, role: str) -> ModelInfo:
    """:func:`describe` through transformers (hub ids)."""
    try:
        from transformers import AutoConfig, AutoTokenizer
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:
        raise EdgespecError(f"{role} {source.ref}: a hub id is exported through transformers and torch "
                            f"({TORCH_EXTRA}), or download the model and give its directory") from None

    name, kw = _pretrained_args(source)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = AutoConfig.from_pretrained(name, **kw)
    except Exception as e:  # transformers raises OSError/ValueError/KeyError for bad or unreachable sources
        raise EdgespecError(f"{role} {source.ref}: cannot read model config ({type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else ''})") from None
    mt = getattr(config, "model_type", "?")
    if mt not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise EdgespecError(f"{role} {source.ref}: model type {mt!r} is not a causal language model")
    if mt not in SUPPORTED_ARCHITECTURES:
        raise EdgespecError(f"{role} {source.ref}: unsupported architecture {mt!r} "
                            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tok = AutoTokenizer.from_pretrained(name, **kw)
    except Exception as e:
        raise EdgespecError(f"{role} {source.ref}: cannot load tokenizer ({type(e).__name__}: {e})") from None
    if not getattr(tok, "is_fast", False):
        raise EdgespecError(f"{role} {source.ref}: needs a fast (tokenizers) tokenizer")
    vocab = tok.backend_tokenizer.get_vocab(with_added_tokens=True)
    eos, bos, pad = tok.eos_token_id, tok.bos_token_id, tok.pad_token_id
    gen_eos = []
    try:
        from transformers import GenerationConfig

        gc = GenerationConfig.from_model_config(config)
        gen_eos = gc.eos_token_id if isinstance(gc.eos_token_id, list) else [gc.eos_token_id]
    except Exception:
        pass
    if eos is None:
        eos = next((g for g in gen_eos if g is not None), None)
    if eos is None:
        raise EdgespecError(f"{role} {source.ref}: the tokenizer defines no end-of-sequence token")
    stop = {eos, *(g for g in gen_eos if g is not None)}
    stop |= {vocab[t] for t in STOP_TOKEN_TEXTS if t in vocab}
    return ModelInfo(source=source, config=ModelConfig.from_hf(config.to_dict()), tokenizer=tok,
                     tokenizer_sha256=tokenizer_sha256(tok), chat_template=getattr(tok, "chat_template", None),
                     eos=int(eos), bos=bos, pad=pad, stop=tuple(sorted(int(s) for s in stop)), )


def check_pair(target: ModelInfo, draft: ModelInfo) -> None:
    """Refuse a draft that cannot propose tokens for this target, with one line saying why.

    Same tokenizer (hash) and same special-token ids are required. Logits widths may differ (Qwen pads its
    embedding to 151936 or 152064): the runtime treats draft ids beyond the target's width as impossible and
    target ids beyond the draft's width as q = 0, which keeps rejection sampling exact.
    """
    if target.tokenizer_sha256 != draft.tokenizer_sha256:
        raise EdgespecError(
            f"draft and target tokenizers differ (sha256 {draft.tokenizer_sha256[:12]} vs "
            f"{target.tokenizer_sha256[:12]}): speculative decoding needs one shared vocabulary")
    for what in ("eos", "bos", "pad"):
        if getattr(target, what) != getattr(draft, what):
            raise EdgespecError(f"draft and target disagree on the {what} token id "
                                f"({getattr(draft, what)} vs {getattr(target, what)})")
    n_tok = len(target.tokenizer.backend_tokenizer.get_vocab(with_added_tokens=True))
    for info, role in ((target, "target"), (draft, "draft")):
        if info.logits_width < n_tok:
            raise EdgespecError(f"{role} logits width {info.logits_width} is smaller than the tokenizer's "
                                f"{n_tok} tokens")


def load_weights(info: ModelInfo, role: str):
    """The fp32 PyTorch model, eval mode, eager attention (the traced graph takes a 4-D mask).

    Raises:
        EdgespecError: the weights cannot be loaded (truncated file, missing shards).
    """
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise EdgespecError(f"{role} {info.source.ref}: this export goes through transformers and torch "
                            f"({TORCH_EXTRA})") from None

    name, kw = _pretrained_args(info.source)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32, attn_implementation="eager",
                                                         **kw)
    except Exception as e:
        raise EdgespecError(f"{role} {info.source.ref}: cannot load weights ({type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else ''})") from None
    return model.eval()
