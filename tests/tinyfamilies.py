"""Tiny random models of every family edgespec exports, as Hugging Face directories and as GGUF files.

:func:`build_hf` saves a random transformers model (Qwen2, Llama, Llama 3.x with llama3 rotary scaling, Qwen3,
Gemma 3 text, Phi-3, Phi-4-mini-like Phi-3 with partial rotary and LongRoPE) with the tiny tokenizer of
:mod:`tests.tinymodels`; :func:`write_gguf` converts such a directory to GGUF the way llama.cpp's
``convert_hf_to_gguf.py`` does for that architecture (no torch: safetensors and numpy), so a GGUF reader can be
tested against the same weights in Hugging Face form.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from tinymodels import build_tokenizer

FAMILIES = ("qwen2", "llama", "llama3", "qwen3", "gemma3", "phi3", "phi3-longrope")
GGUF_ARCH = {"qwen2": "qwen2", "llama": "llama", "mistral": "llama", "qwen3": "qwen3", "gemma3_text": "gemma3",
             "phi3": "phi3"}
# tokenizer.ggml.pre of the real models of each family (llama.cpp would hash the tokenizer; ours is not listed)
GGUF_PRE = {"qwen2": "qwen2", "qwen3": "qwen2", "llama": "llama-bpe", "gemma3": "default", "phi3": "gpt-4o"}


def _config(family: str, vocab: int, hidden: int, layers: int, eos: int, pad: int):
    """The transformers config of a tiny ``family`` model (heads 4, key/value heads 2 unless said otherwise)."""
    from transformers import Gemma3TextConfig, LlamaConfig, Phi3Config, Qwen2Config, Qwen3Config

    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, eos_token_id=eos,
                  pad_token_id=pad, bos_token_id=None, attn_implementation="eager")
    if family == "qwen2":  # Qwen2.5-0.5B: q/k/v biases, tied head
        return Qwen2Config(**common, rope_theta=1e6, tie_word_embeddings=True)
    if family == "llama":
        return LlamaConfig(**common, rope_theta=1e4, rms_norm_eps=1e-5, tie_word_embeddings=False)
    if family == "llama3":  # Llama 3.2 1B's rotary scaling and tied head
        return LlamaConfig(**{**common, "max_position_embeddings": 131072}, rope_theta=5e5, rms_norm_eps=1e-5,
                           tie_word_embeddings=True,
                           rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    if family == "qwen3":  # head_dim * heads != hidden, as in Qwen3
        return Qwen3Config(**common, head_dim=32, rope_theta=1e6, tie_word_embeddings=True)
    if family == "gemma3":  # Gemma 3 270M's shape of layers: 5 sliding (window 4 here) then 1 full, 1 kv head
        return Gemma3TextConfig(**{**common, "num_key_value_heads": 1}, head_dim=32, query_pre_attn_scalar=32,
                                sliding_window=4, rope_theta=1e6, rope_local_base_freq=1e4,
                                rope_scaling={"rope_type": "linear", "factor": 8.0},  # as Gemma 3 4B+
                                hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                                final_logit_softcapping=None, attn_logit_softcapping=None)
    if family == "phi3":
        return Phi3Config(**common, rope_theta=1e4, rms_norm_eps=1e-5, original_max_position_embeddings=256,
                          tie_word_embeddings=False)
    if family == "phi3-longrope":  # Phi-4-mini: 3/4 of each head rotates, LongRoPE, tied head
        rot = int(hidden // 4 * 0.75) // 2
        short = [1.0 + 0.1 * i for i in range(rot)]
        long = [1.0 + 2.0 * i for i in range(rot)]
        return Phi3Config(**common, rope_theta=1e4, rms_norm_eps=1e-5, partial_rotary_factor=0.75,
                          original_max_position_embeddings=32, tie_word_embeddings=True,
                          rope_scaling={"type": "longrope", "short_factor": short, "long_factor": long})
    raise ValueError(f"unknown family {family!r} (one of {', '.join(FAMILIES)})")


def build_hf(out: Path, family: str, seed: int = 0, layers: int | None = None, hidden: int = 64,
             vocab: int | None = None, std: float = 0.08, overrides: dict | None = None) -> Path:
    """A random causal LM of ``family`` (:data:`FAMILIES`) saved to ``out`` as safetensors with the tiny tokenizer
    (:func:`tinymodels.build_tokenizer` with its FIM specials and non-special tool tokens: ids 0-407).

    Head sizes are 16 or 32 (a multiple of 16, as onnxruntime's GroupQueryAttention needs). ``layers``: 2, or 6
    for Gemma 3 (llama.cpp's fixed pattern: every 6th layer full, the others sliding, window 4). ``vocab``: 512,
    or for Gemma 3 the count llama.cpp keeps of its embedding rows (:func:`write_gguf`). Weights are drawn
    N(0, ``std``) (biases N(0, std / 2)), norm weights 1 + N(0, 0.1) (Gemma's stored w: N(0, 0.1)), so logits
    spread and greedy argmax varies. ``overrides``: config attributes set after the family's defaults.
    """
    import torch
    from transformers import AutoModelForCausalLM

    out = Path(out)
    tok = build_tokenizer(out, fim=True)
    gemma = family == "gemma3"
    if vocab is None:
        vocab = _gemma_vocab_rows(out) if gemma else 512
    cfg = _config(family, vocab, hidden, layers or (6 if gemma else 2), tok.eos_token_id, tok.pad_token_id)
    for k, v in (overrides or {}).items():
        setattr(cfg, k, v)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, prm in model.named_parameters():
            noise = torch.randn(prm.shape, generator=g)
            if "norm" in name:
                prm.copy_(0.1 * noise + (0.0 if gemma else 1.0))
            else:
                prm.copy_(noise * (std / 2 if name.endswith(".bias") else std))
    model.save_pretrained(out, safe_serialization=True)
    return out


def _gemma_vocab_rows(hf_dir: Path) -> int:
    """The embedding rows llama.cpp's Gemma3Model keeps when there is no tokenizer.model: the tokenizer.json's
    ``model.vocab`` entries plus its ``added_tokens`` (specials counted in both, as llama.cpp counts them)."""
    tj = json.loads((Path(hf_dir) / "tokenizer.json").read_text())
    return len(tj["model"]["vocab"]) + len(tj["added_tokens"])


# ---------------------------------------------------------------------------------------------------- GGUF


def write_gguf(hf_dir: Path, out: Path, qtype: str | None = None, types: dict[str, str] | None = None) -> Path:
    """Convert the Hugging Face model in ``hf_dir`` (:func:`build_hf`) to the GGUF file ``out``, following
    llama.cpp's ``convert_hf_to_gguf.py`` (``TextModel`` and the family's class). ``qtype`` None: every tensor F32
    (llama.cpp ``--outtype f32``); ``"Q8_0"`` / ``"Q4_0"``: 2-D weights quantized with ``gguf.quants.quantize``,
    1-D tensors (norms, biases, rotary factors) kept F32, as llama.cpp's quantizer keeps them. ``types`` maps a
    fragment of a GGUF tensor name (``ffn_down``, ``blk.0.attn_``) to the type of the 2-D weights it names (the
    first match), as a Q4_K_M file keeps some tensors at Q6_K.

    Conventions reproduced (what a reader must undo):

    - names: ``gguf.get_tensor_name_map(arch, n_blocks)`` (``model.layers.{i}.self_attn.q_proj.weight`` →
      ``blk.{i}.attn_q.weight``, ``lm_head`` → ``output``, …); Gemma 3's ``pre_feedforward_layernorm`` →
      ``ffn_norm``, ``post_attention_layernorm`` → ``post_attention_norm``, ``post_feedforward_layernorm`` →
      ``post_ffw_norm``; Phi-3's fused ``qkv_proj`` → ``attn_qkv`` and ``gate_up_proj`` → ``ffn_up``, unsplit;
      a tied head is not written (no ``output.weight``: safetensors has no ``lm_head``); Mistral is ``llama``.
    - shapes: the numpy (out, in) array is written as is (GGUF lists dims innermost first: ne = [in, out]).
    - Llama only (``LlamaModel.modify_tensors``): q_proj and k_proj weights (and biases) have their rows
      permuted per head, ``w.reshape(n_head, 2, d // n_head // 2, ...).swapaxes(1, 2)`` (k with n_head_kv).
    - Llama 3 rotary scaling (``LlamaModel.generate_extra_tensors``): no scaling keys; a tensor
      ``rope_freqs.weight`` float32 (head_dim / 2,) of per-frequency divisors (1, factor, or the smoothed
      1 / ((1 - s) / factor + s)), with ``original_max_position_embeddings`` read from the config's top level,
      8192 if absent (not from ``rope_scaling``).
    - Gemma 3: every ``*norm.weight`` stored as 1 + w; ``token_embd`` trimmed to the tokenizer.json's
      vocab + added_tokens rows (:func:`_gemma_vocab_rows`); keys ``attention.sliding_window``,
      ``attention.key_length`` / ``value_length``; no key for the layer pattern, the sliding layers' rotary
      base, or ``query_pre_attn_scalar`` (llama.cpp fixes them: every 6th layer full, base 10000,
      scale 1/sqrt(head_dim) below 27B); linear rotary scaling as ``rope.scaling.type`` / ``.factor``.
    - Phi-3 (``Phi3MiniModel``, no ``TextModel`` keys): ``rope.dimension_count`` = int(partial_rotary_factor *
      hidden) // heads, ``rope.scaling.original_context_length``, ``attention.sliding_window`` (0 when None);
      with LongRoPE, ``rope.scaling.attn_factor`` (sqrt(1 + ln(s) / ln(original)), s = context / original) and
      tensors ``rope_factors_long.weight`` / ``rope_factors_short.weight`` float32 (rot_dim / 2,).
    - keys of the others (``TextModel.set_gguf_parameters``): ``{arch}.block_count``, ``.context_length``,
      ``.embedding_length``, ``.feed_forward_length``, ``.attention.head_count``, ``.attention.head_count_kv``,
      ``.rope.freq_base``, ``.attention.layer_norm_rms_epsilon``, ``.attention.key_length`` / ``value_length``
      only when the config has ``head_dim`` (Llama, Qwen3, Gemma 3; not Qwen2), linear scaling as above;
      Llama adds ``.vocab_size`` and ``.rope.dimension_count`` (head_dim). ``general.file_type``,
      ``general.quantization_version``, ``general.name``.
    - tokenizer (``_set_vocab_gpt2`` / ``get_vocab_base``): ``tokenizer.ggml.model`` "gpt2",
      ``tokenizer.ggml.pre`` (:data:`GGUF_PRE`: the real model's), ``tokens`` padded to the config's
      vocab_size with ``[PAD{i}]`` (UNUSED), ``token_type`` NORMAL, CONTROL for special added tokens and
      added tokens that look special (``<|…|>``), USER_DEFINED for other added tokens; then ``gguf.SpecialVocab``
      (merges, bos/eos/padding ids, add_bos/add_eos flags, ``tokenizer.chat_template``).
    """
    import gguf
    from safetensors.numpy import load_file

    hf_dir, out = Path(hf_dir), Path(out)
    hp = json.loads((hf_dir / "config.json").read_text())
    arch = GGUF_ARCH[hp["model_type"]]
    n_layers = int(hp["num_hidden_layers"])
    q = None if qtype is None else gguf.GGMLQuantizationType[qtype]
    ftype = gguf.LlamaFileType.ALL_F32 if q is None else gguf.LlamaFileType[f"MOSTLY_{qtype}"]
    w = gguf.GGUFWriter(str(out), arch)
    w.add_name(hf_dir.name)
    _hparams(w, arch, hp)
    w.add_file_type(ftype)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _vocab(w, hf_dir, hp, arch)
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], n_layers)
    tensors = {}
    for part in sorted(hf_dir.glob("*.safetensors")):
        tensors.update(load_file(str(part)))
    for name, t in tensors.items():
        t = np.asarray(t, dtype=np.float32)
        if arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            t = _permute(t, hp["num_attention_heads"])
        if arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            t = _permute(t, hp.get("num_key_value_heads") or hp["num_attention_heads"])
        if arch == "gemma3" and name.endswith("embed_tokens.weight"):
            t = t[:_gemma_vocab_rows(hf_dir)]
        if arch == "gemma3" and name.endswith("norm.weight"):
            t = t + 1.0
        new = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise ValueError(f"cannot map tensor {name!r}")
        own = next((v for k, v in (types or {}).items() if k in new), None)
        _add(w, new, t, q if own is None else gguf.GGMLQuantizationType[own])
    for new, t in _extra_tensors(arch, hp):
        _add(w, new, t, None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _add(w, name: str, t: np.ndarray, q) -> None:
    """One tensor: F32, or quantized to ``q`` when it is a 2-D weight."""
    import gguf

    if q is None or t.ndim < 2:
        w.add_tensor(name, np.ascontiguousarray(t, dtype=np.float32))
    else:
        w.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(t), q), raw_dtype=q)


def _permute(t: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute``: each head's rows (half-split rotary pairs) interleaved."""
    return t.reshape(n_head, 2, t.shape[0] // n_head // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)


def _rope_scaling(hp: dict) -> dict:
    return hp.get("rope_scaling") or {}


def _hparams(w, arch: str, hp: dict) -> None:
    """The ``{arch}.*`` keys (:func:`write_gguf`'s docstring)."""
    import gguf

    heads = int(hp["num_attention_heads"])
    kv = int(hp.get("num_key_value_heads") or heads)
    rs = _rope_scaling(hp)
    if arch == "phi3":  # Phi3MiniModel.set_gguf_parameters (it does not call TextModel's)
        original = int(hp.get("original_max_position_embeddings") or hp["max_position_embeddings"])
        w.add_context_length(hp["max_position_embeddings"])
        w.add_rope_scaling_orig_ctx_len(original)
        w.add_embedding_length(hp["hidden_size"])
        w.add_feed_forward_length(hp["intermediate_size"])
        w.add_block_count(hp["num_hidden_layers"])
        w.add_head_count(heads)
        w.add_head_count_kv(kv)
        w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
        w.add_rope_dimension_count(int(hp.get("partial_rotary_factor", 1.0) * hp["hidden_size"]) // heads)
        w.add_rope_freq_base(hp.get("rope_theta", 10000.0))
        w.add_sliding_window(hp.get("sliding_window") or 0)
        if rs.get("long_factor"):
            scale = hp["max_position_embeddings"] / original
            w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)
        return
    w.add_block_count(hp["num_hidden_layers"])
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(hp.get("rope_theta", 10000.0))
    w.add_layer_norm_rms_eps(hp.get("rms_norm_eps", 1e-6))
    if hp.get("head_dim") is not None:
        w.add_key_length(hp["head_dim"])
        w.add_value_length(hp["head_dim"])
    if rs.get("rope_type", rs.get("type")) == "linear" and rs.get("factor") is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rs["factor"])
    if arch == "llama":
        w.add_vocab_size(hp["vocab_size"])
        w.add_rope_dimension_count(hp.get("head_dim") or hp["hidden_size"] // heads)
    if arch == "gemma3":
        assert hp.get("attn_logit_softcapping") is None
        if hp.get("final_logit_softcapping"):
            w.add_final_logit_softcapping(hp["final_logit_softcapping"])
        if hp.get("sliding_window_pattern") != 1:
            w.add_sliding_window(hp["sliding_window"])


def _extra_tensors(arch: str, hp: dict):
    """llama.cpp's generated tensors: Llama 3's ``rope_freqs``, Phi-3's LongRoPE factors."""
    rs = _rope_scaling(hp)
    if arch == "llama" and rs.get("rope_type", "").lower() == "llama3":
        dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
        freqs = 1.0 / (hp.get("rope_theta", 10000.0) ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
        factor, low, high = rs.get("factor", 8.0), rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
        old = hp.get("original_max_position_embeddings", 8192)
        factors = []
        for f in freqs:
            wavelen = 2 * math.pi / f
            if wavelen < old / high:
                factors.append(1.0)
            elif wavelen > old / low:
                factors.append(factor)
            else:
                smooth = (old / wavelen - low) / (high - low)
                factors.append(1 / ((1 - smooth) / factor + smooth))
        yield "rope_freqs.weight", np.asarray(factors, dtype=np.float32)
    if arch == "phi3" and rs.get("long_factor"):
        yield "rope_factors_long.weight", np.asarray(rs["long_factor"], dtype=np.float32)
        yield "rope_factors_short.weight", np.asarray(rs["short_factor"], dtype=np.float32)


def _looks_special(token: str) -> bool:
    """llama.cpp's ``does_token_look_special``."""
    return (token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (token.startswith("<|") and token.endswith("|>"))
            or (token.startswith("<｜") and token.endswith("｜>"))
            or (token.startswith("<unused") and token.endswith(">")))


def _vocab(w, hf_dir: Path, hp: dict, arch: str) -> None:
    """A GPT-2 BPE vocabulary as ``_set_vocab_gpt2`` writes it (:func:`write_gguf`'s docstring)."""
    import gguf
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_dir)
    size = int(hp.get("vocab_size", len(tok.vocab)))
    reverse = {i: t for t, i in tok.vocab.items()}
    added, decoder = tok.get_added_vocab(), tok.added_tokens_decoder
    tokens, types = [], []
    for i in range(size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        token = reverse[i]
        if token in added:
            if not decoder[i].normalized:
                token = tok.decode(tok.encode(token, add_special_tokens=False))
            if decoder[i].special or _looks_special(token):
                types.append(gguf.TokenType.CONTROL)
            else:
                token = token.replace("\u2581", " ")
                types.append(gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
        tokens.append(token)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(GGUF_PRE["llama" if arch == "llama" else arch])
    w.add_token_list(tokens)
    w.add_token_types(types)
    gguf.SpecialVocab(hf_dir, load_merges=True, n_vocab=len(tokens)).add_to_gguf(w, quiet=True)
