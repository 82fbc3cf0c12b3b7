"""A model's tokenizer, chat template and special tokens, read without transformers.

- A Hugging Face directory: ``tokenizer.json`` (the ``tokenizers`` library reads it as it is), the chat template
  from ``tokenizer_config.json`` or ``chat_template.jinja``, special tokens from ``tokenizer_config.json`` and
  ``generation_config.json``.
- A GGUF file: its ``tokenizer.ggml.*`` keys become a ``tokenizers`` byte-level BPE — vocabulary and merges as
  stored, the pre-tokenizer that ``tokenizer.ggml.pre`` names (:data:`PRE_TOKENIZERS`), control tokens added as
  special and user-defined ones as plain added tokens at their GGUF ids (``<|fim_prefix|>`` is one token) — and
  ``tokenizer.chat_template`` and the bos/eos/padding ids are read from the header; ``<bos>`` goes in front of an
  encoded text (with special tokens) when ``tokenizer.ggml.add_bos_token`` says so (Llama 3; not Qwen).
- A GGUF file with a SentencePiece BPE tokenizer (``tokenizer.ggml.model == "llama"``: tokens and scores, no
  merges; Gemma 3, Llama 2): a ``tokenizers`` BPE with byte fallback whose merges come from the scores
  (:func:`spm_merges`), spaces written "▁", ``<0xNN>`` byte tokens, the same added tokens, and ``<bos>`` put in
  front by the post-processor when ``tokenizer.ggml.add_bos_token`` says so, as Gemma's own tokenizer.json does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from edgespec.errors import EdgespecError

GGUF_CONTROL, GGUF_USER_DEFINED = 3, 4
STOP_TOKEN_TEXTS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|end|>", "<end_of_turn>")
# tokenizer.ggml.pre → the split regex before byte-level BPE (llama.cpp's llama-vocab.cpp names), and whether
# the text is NFC-normalized first (Qwen2's tokenizer.json does)
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")  # Phi-4-mini's (o200k)
PRE_TOKENIZERS = {"gpt-4o": (_GPT4O, False), "qwen2": (_QWEN2, True), "llama-bpe": (_LLAMA3, False), "llama3": (_LLAMA3, False),
                  "smaug-bpe": (_LLAMA3, False), "gpt-2": (None, False), "default": (None, False)}


class Tokenizer:
    """A ``tokenizers.Tokenizer`` with the two calls the exporter makes: :meth:`encode` (ids, no special tokens
    added) and ``backend_tokenizer`` (the ``tokenizers`` object, saved as the export's ``tokenizer.json``)."""

    def __init__(self, backend):
        self.backend_tokenizer = backend

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids


@dataclass
class TokenizerInfo:
    """A model's tokenizer and the ids the pair check and the manifest need."""

    tokenizer: Tokenizer
    chat_template: str | None
    eos: int
    bos: int | None
    pad: int | None
    stop: tuple[int, ...]


def _stop(tok: Tokenizer, eos: int, extra: list[int]) -> tuple[int, ...]:
    vocab = tok.backend_tokenizer.get_vocab(with_added_tokens=True)
    return tuple(sorted({int(eos), *map(int, extra), *(vocab[t] for t in STOP_TOKEN_TEXTS if t in vocab)}))


def from_gguf(reader, path: Path) -> TokenizerInfo:
    """The tokenizer of an open ``gguf.GGUFReader`` (module docstring).

    Raises:
        EdgespecError: no tokenizer in the file, a tokenizer model other than byte-level BPE (``gpt2``) or
            SentencePiece BPE (``llama``), or an unknown pre-tokenizer.
    """
    from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers import Tokenizer as Backend

    def field(key, default=None):
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    model = field("tokenizer.ggml.model")
    if model is None:
        raise EdgespecError(f"{path}: the GGUF file has no tokenizer (tokenizer.ggml.model)")
    if model == "llama":
        return _info(_spm_backend(field), field, path)
    if model != "gpt2":
        raise EdgespecError(f"{path}: GGUF tokenizer model {model!r} is not supported (byte-level BPE 'gpt2' and "
                            "SentencePiece BPE 'llama' are); export from the model's Hugging Face directory instead")
    pre = field("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise EdgespecError(f"{path}: GGUF pre-tokenizer {pre!r} is not supported (supported: "
                            f"{', '.join(PRE_TOKENIZERS)})")
    tokens = field("tokenizer.ggml.tokens")
    types = field("tokenizer.ggml.token_type")
    if types is None:  # optional in GGUF: the header's special ids and <|…|> tokens are the control tokens
        ids = {field(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "bos", "padding", "eot")}
        types = [GGUF_CONTROL if i in ids or (t.startswith("<|") and t.endswith("|>")) else 1
                 for i, t in enumerate(tokens)]
    merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges", [])]
    backend = Backend(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, dropout=None,
                                 unk_token=None, continuing_subword_prefix="", end_of_word_suffix="",
                                 fuse_unk=False, byte_fallback=False))
    regex, nfc = PRE_TOKENIZERS[pre]
    if nfc:
        backend.normalizer = normalizers.NFC()
    if regex is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    ends = _ends_processor(field, tokens, add_bos_default=False)  # Llama 3's <|begin_of_text|>; none for Qwen
    backend.post_processor = processors.ByteLevel(trim_offsets=False) if ends is None else \
        processors.Sequence([processors.ByteLevel(trim_offsets=False), ends])
    special = [AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types)
               if t == GGUF_CONTROL]
    plain = [AddedToken(tokens[i], special=False, normalized=False) for i, t in enumerate(types)
             if t == GGUF_USER_DEFINED]
    backend.add_special_tokens(special)
    backend.add_tokens(plain)
    return _info(backend, field, path)


def _info(backend, field, path: Path) -> TokenizerInfo:
    """The :class:`TokenizerInfo` of a GGUF tokenizer built as ``backend``: template and special ids from the
    header (``field(key)`` reads one key)."""
    tok = Tokenizer(backend)
    eos = field("tokenizer.ggml.eos_token_id")
    if eos is None:
        raise EdgespecError(f"{path}: the GGUF tokenizer defines no end-of-sequence token")
    bos, pad = field("tokenizer.ggml.bos_token_id"), field("tokenizer.ggml.padding_token_id")
    eot = field("tokenizer.ggml.eot_token_id")
    return TokenizerInfo(tok, field("tokenizer.chat_template"), int(eos), None if bos is None else int(bos),
                         None if pad is None else int(pad), _stop(tok, int(eos), [eot] if eot is not None else []))


def spm_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """BPE merges, highest priority first, that reproduce SentencePiece BPE (llama.cpp's ``llm_tokenizer_spm``):
    that tokenizer repeatedly joins the adjacent pair whose joined text is the best-scoring token (ties: the
    leftmost). So every split of a token into two tokens is a merge, ranked by the whole token's score (stable:
    equal scores keep vocabulary order); splits of one token by the scores of their halves, as transformers'
    ``GGUFTokenizerSkeleton`` ranks them. One dict lookup per split (262,144 tokens: ~2 s)."""
    ids = {t: i for i, t in enumerate(tokens)}
    found = []  # (score, token id, left score, right score, left, right)
    for i, (t, s) in enumerate(zip(tokens, scores)):
        for k in range(1, len(t)):
            left, right = t[:k], t[k:]
            a, b = ids.get(left), ids.get(right)
            if a is not None and b is not None:
                found.append((-s, i, -scores[a], -scores[b], left, right))
    found.sort(key=lambda m: m[:4])
    return [(m[4], m[5]) for m in found]


def _spm_backend(field):
    """A ``tokenizers`` BPE equal to the GGUF's SentencePiece BPE tokenizer (module docstring): text with spaces
    as "▁" (and one in front of each piece of text when ``add_space_prefix``, llama.cpp's default for this
    model: it prefixes the text after every added token too), merged by score, characters outside the vocabulary
    as ``<0xNN>`` bytes; decoding undoes the "▁" and fuses the bytes."""
    from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    tokens, scores = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.scores")
    if scores is None:
        scores = [0.0] * len(tokens)
    types = field("tokenizer.ggml.token_type") or [1] * len(tokens)
    unk = field("tokenizer.ggml.unknown_token_id")
    backend = Backend(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=spm_merges(tokens, scores),
                                 dropout=None, unk_token=None if unk is None else tokens[unk], fuse_unk=True,
                                 byte_fallback=True))
    prefix = field("tokenizer.ggml.add_space_prefix", True)
    if prefix:  # untested against llama.cpp here (Gemma 3 has no prefix)
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=False)
    else:
        backend.normalizer = normalizers.Replace(" ", "▁")
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    backend.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    # added tokens are matched in the raw text, longest first, before the spaces are replaced: llama.cpp's
    # user-defined whitespace runs ("  ", "\n\n", "\t") are stored with real spaces, as the text has them
    backend.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                for i, t in enumerate(types) if t == GGUF_CONTROL])
    backend.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                        for i, t in enumerate(types) if t == GGUF_USER_DEFINED])
    ends = _ends_processor(field, tokens, add_bos_default=True)
    if ends is not None:
        backend.post_processor = ends
    return backend


def _ends_processor(field, tokens: list[str], add_bos_default: bool):
    """The post-processor that puts ``<bos>`` in front of (and ``<eos>`` after) an encoded text when the header's
    ``tokenizer.ggml.add_bos_token`` (``add_eos_token``) says so, as llama.cpp does for a prompt; None when it
    adds nothing. An absent ``add_bos_token`` counts as ``add_bos_default`` (llama.cpp: yes for SentencePiece,
    and byte-level BPE files from its converter state it)."""
    from tokenizers import processors

    ends = [(k, field(f"tokenizer.ggml.{k}_token_id")) for k in ("bos", "eos")]
    ends = [(k, int(i)) for k, i in ends
            if i is not None and field(f"tokenizer.ggml.add_{k}_token", k == "bos" and add_bos_default)]
    if not ends:
        return None
    bos = [tokens[i] for k, i in ends if k == "bos"]
    eos = [tokens[i] for k, i in ends if k == "eos"]
    return processors.TemplateProcessing(
        single=" ".join(bos + ["$A"] + eos), pair=" ".join(bos + ["$A"] + eos + bos + ["$B:1"] + eos),
        special_tokens=[(tokens[i], i) for _, i in ends])


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError) as e:
        raise EdgespecError(f"{path}: cannot read it ({e})") from None
    return data if isinstance(data, dict) else {}


def _token_text(v) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


def from_hf_dir(path: Path) -> TokenizerInfo:
    """The tokenizer of a Hugging Face directory (module docstring).

    Raises:
        EdgespecError: no ``tokenizer.json`` (a slow-only tokenizer), an unreadable one, or no end-of-sequence token.
    """
    from tokenizers import Tokenizer as Backend

    path = Path(path)
    if not (path / "tokenizer.json").is_file():
        raise EdgespecError(f"{path}: no tokenizer.json (edgespec needs a fast, tokenizers-format tokenizer)")
    try:
        tok = Tokenizer(Backend.from_file(str(path / "tokenizer.json")))
    except Exception as e:  # tokenizers raises a plain Exception for a malformed file
        raise EdgespecError(f"{path}/tokenizer.json: cannot load it ({e})") from None
    cfg = _json(path / "tokenizer_config.json")
    template = cfg.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"),
                        None)
    if template is None and (path / "chat_template.jinja").is_file():
        template = (path / "chat_template.jinja").read_text(encoding="utf-8")
    if template is None:
        template = _json(path / "chat_template.json").get("chat_template")
    vocab = tok.backend_tokenizer.get_vocab(with_added_tokens=True)
    ids = {k: vocab.get(_token_text(cfg.get(f"{k}_token"))) for k in ("eos", "bos", "pad")}
    gen = _json(path / "generation_config.json")
    gen_eos = gen.get("eos_token_id")
    gen_eos = [gen_eos] if isinstance(gen_eos, int) else [i for i in gen_eos or [] if isinstance(i, int)]
    model_cfg = _json(path / "config.json")
    eos = ids["eos"] if ids["eos"] is not None else next(iter(gen_eos), model_cfg.get("eos_token_id"))
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    if eos is None:
        raise EdgespecError(f"{path}: the tokenizer defines no end-of-sequence token")
    bos = ids["bos"] if ids["bos"] is not None else gen.get("bos_token_id")
    return TokenizerInfo(tok, template if isinstance(template, str) else None, int(eos),
                         bos if isinstance(bos, int) else None, ids["pad"], _stop(tok, int(eos), gen_eos))
