"""A GGUF file as a :class:`export.weights.TensorSource`: memory-mapped, one tensor dequantized at a time.

The ``gguf`` package's reader maps the file; :func:`gguf.quants.dequantize` turns one tensor's blocks into
float32 when it is asked for, so a tensor costs its own fp32 size and nothing else stays in memory. What llama.cpp's
``convert_hf_to_gguf.py`` changed on the way in is undone here, so that callers see Hugging Face's tensors:

- names: ``blk.{i}.attn_q.weight`` → ``model.layers.{i}.self_attn.q_proj.weight`` (:data:`TENSOR_NAMES`);
- Llama's q/k rows: permuted for llama.cpp's interleaved rotary (``LlamaModel.permute``), put back;
- Gemma's RMSNorm weights: stored as 1 + w (``norm_shift``), given back as w;
- the header's ``{arch}.*`` keys become a :class:`ModelConfig` with Hugging Face's meanings.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgespec.errors import EdgespecError

from ..model_config import ModelConfig

# GGUF architecture → Hugging Face model_type, for the families edgespec writes
ARCHITECTURES = {"qwen2": "qwen2", "qwen3": "qwen3", "llama": "llama", "gemma3": "gemma3_text", "phi3": "phi3"}

# per-layer GGUF tensor stem → Hugging Face name under model.layers.{i}.; Gemma 3 and Phi-3 differ below
_LAYER = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
          "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_qkv": "self_attn.qkv_proj",
          "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
          "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj"}
_LAYER_BY_ARCH = {
    "gemma3": {"ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
               "post_ffw_norm": "post_feedforward_layernorm"},
    "phi3": {"ffn_up": "mlp.gate_up_proj"},  # gate and up fused, as in Hugging Face's Phi-3
}
_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# tensors with no Hugging Face counterpart: kept under their GGUF names (rotary factors of llama3 / longrope)
EXTRA_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")


def hf_name(gguf_name: str, arch: str) -> str | None:
    """The Hugging Face name of a GGUF tensor of architecture ``arch``, or None if it has none."""
    if gguf_name in EXTRA_TENSORS:
        return gguf_name
    stem, _, kind = gguf_name.rpartition(".")
    if stem in _GLOBAL:
        return f"{_GLOBAL[stem]}.{kind}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit():
        table = {**_LAYER, **_LAYER_BY_ARCH.get(arch, {})}
        if parts[2] in table:
            return f"model.layers.{parts[1]}.{table[parts[2]]}.{kind}"
    return None


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


class GGUFSource:
    """The tensors and config of a GGUF file of a supported architecture (module docstring).

    Raises (on construction):
        EdgespecError: unreadable file, an architecture edgespec does not write, or a header missing a key.
    """

    def __init__(self, path: str | Path):
        from gguf import GGUFReader

        self.path = Path(path)
        try:
            self.reader = GGUFReader(str(self.path))
        except (ValueError, OSError, IndexError, KeyError) as e:
            raise EdgespecError(f"{self.path}: not a readable GGUF file ({type(e).__name__}: {e})") from None
        self.arch = str(_field(self.reader, "general.architecture", "?"))
        if self.arch not in ARCHITECTURES:
            raise EdgespecError(f"{self.path}: unsupported architecture {self.arch!r} (supported: "
                                f"{', '.join(ARCHITECTURES)})")
        self._tensors = {}
        for t in self.reader.tensors:
            name = hf_name(t.name, self.arch)
            if name is not None:
                self._tensors[name] = t
        odd = sorted({t.tensor_type.name for t in self._tensors.values() if not readable(t.tensor_type)})
        if odd:  # from the header, before any graph is written
            raise EdgespecError(f"{self.path}: tensor types {', '.join(odd)} cannot be dequantized by the gguf package")
        self.config = self._config()

    def _config(self) -> ModelConfig:
        a, r = self.arch, self.reader
        get = lambda key, default=None: _field(r, f"{a}.{key}", default)  # noqa: E731
        try:
            heads = int(get("attention.head_count"))
            hidden = int(get("embedding_length"))
            head_dim = int(get("attention.key_length", hidden // heads))
            embed = self._tensors["model.embed_tokens.weight"]
            vocab = int((self._tensors.get("lm_head.weight") or embed).shape[-1])
            layers = int(get("block_count"))
            cfg = dict(
                architecture=ARCHITECTURES[a], num_layers=layers, hidden_size=hidden,
                intermediate_size=int(get("feed_forward_length")), num_heads=heads,
                num_kv_heads=int(get("attention.head_count_kv", heads)), head_dim=head_dim, vocab_size=vocab,
                rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
                rope_theta=float(get("rope.freq_base", 10000.0)),
                max_position_embeddings=int(get("context_length", 4096)),
                tie_word_embeddings="lm_head.weight" not in self._tensors,
                attention_bias="model.layers.0.self_attn.q_proj.bias" in self._tensors,
            )
        except (TypeError, ValueError, KeyError) as e:
            raise EdgespecError(f"{self.path}: the GGUF header lacks a model setting ({type(e).__name__}: "
                                f"{e})") from None
        scaling = get("rope.scaling.type")
        if scaling == "linear":
            cfg["rope_scaling"] = {"rope_type": "linear", "factor": float(get("rope.scaling.factor", 1.0))}
        elif scaling not in (None, "none"):
            raise EdgespecError(f"{self.path}: rope scaling {scaling!r} in a GGUF is not supported")
        if a == "gemma3":
            cfg.update(self._gemma3(get, layers, hidden, heads, head_dim))
        if a == "phi3":
            rot = get("rope.dimension_count")
            if rot:
                cfg["partial_rotary_factor"] = int(rot) / head_dim
            if "rope_factors_long.weight" in self._tensors:
                orig = get("rope.scaling.original_context_length", cfg["max_position_embeddings"])
                cfg["original_max_position_embeddings"] = int(orig)
                cfg["rope_scaling"] = {"rope_type": "longrope",
                                       "long_factor": self.get("rope_factors_long.weight").tolist(),
                                       "short_factor": self.get("rope_factors_short.weight").tolist()}
        if a == "llama" and "rope_freqs.weight" in self._tensors:  # llama3 scaling, as per-frequency factors
            cfg["rope_scaling"] = {"rope_type": "freq_factors", "factors": self.get("rope_freqs.weight").tolist()}
        return ModelConfig(**cfg)

    def _gemma3(self, get, layers: int, hidden: int, heads: int, head_dim: int) -> dict:
        """Gemma 3's settings as llama.cpp b11434 reads them (``src/models/gemma3.cpp``, ``load_swa_pattern``):
        sliding layers when ``attention.sliding_window`` is set, by ``attention.sliding_window_pattern`` (a
        per-layer bool array, or n: layer i slides unless i % n == n - 1; default 6, every 6th layer global);
        the sliding layers' rotary base ``rope.freq_base_swa`` (default 10,000); the attention scale
        1/sqrt(head_dim), except 1/sqrt(hidden / heads) for the 62-layer 27B (Hugging Face's
        ``query_pre_attn_scalar``: 256 for 270M-12B, 168 for 27B). A ``final_logit_softcapping`` is refused
        (Gemma 3 has none; ModelConfig cannot carry it)."""
        if get("final_logit_softcapping"):
            raise EdgespecError(f"{self.path}: final_logit_softcapping = {get('final_logit_softcapping')} is not "
                                "supported")
        window = get("attention.sliding_window")
        out = dict(hidden_act="gelu_pytorch_tanh", rope_local_theta=float(get("rope.freq_base_swa", 10000.0)),
                   query_pre_attn_scalar=float(hidden // heads if layers == 62 else head_dim))
        if window:
            pattern = get("attention.sliding_window_pattern", 6)
            slides = ([bool(x) for x in pattern] if isinstance(pattern, list)
                      else [int(pattern) == 0 or i % int(pattern) < int(pattern) - 1 for i in range(layers)])
            out.update(sliding_window=int(window),
                       layer_types=tuple("sliding_attention" if x else "full_attention" for x in slides))
        return out

    def names(self) -> list[str]:
        return list(self._tensors)

    def shape(self, name: str) -> tuple[int, ...] | None:
        """The Hugging Face shape of tensor ``name`` from the header (no data read), or None if absent."""
        t = self._tensors.get(name)
        return None if t is None else tuple(int(d) for d in reversed(t.shape))

    def bits_per_weight(self, name: str) -> float:
        """Bits the file spends per weight of tensor ``name``, scales included (its type's block bytes × 8 /
        block length: Q4_K 4.5, Q5_0 5.5, Q6_K 6.5625, Q8_0 8.5, F16 16).

        Raises:
            KeyError: no such tensor.
        """
        from gguf import GGML_QUANT_SIZES

        block, size = GGML_QUANT_SIZES[self._tensors[name].tensor_type]
        return size * 8 / block

    def get_rows(self, name: str, index) -> np.ndarray:
        """Rows ``index`` (a slice or int array) of the 2-D tensor ``name``, float32 (n, cols): only those rows'
        blocks are dequantized (a 150,000-row table costs its chunk, not its whole fp32 size).

        Raises:
            KeyError: no such tensor. ValueError: a 1-D tensor, or Llama's permuted q/k rows (read them whole).
        """

        t = self._tensors[name]
        shape = self.shape(name)
        if len(shape) != 2 or (self.arch == "llama" and ".self_attn." in name):
            raise ValueError(f"{name}: read it whole")
        w = _dequantize(t, t.data[index])
        if isinstance(index, slice) and index.stop is not None and index.stop >= shape[0]:
            self._release(t)  # the last chunk of a table read in order
        return np.ascontiguousarray(w, dtype=np.float32).reshape(-1, shape[1])

    def _release(self, t) -> None:
        """Let the kernel drop the file pages of tensor ``t`` once it is read (they would count in the resident
        set until the whole file is unmapped): ``madvise(MADV_DONTNEED)`` on its byte range, where supported."""
        import mmap

        m = getattr(self.reader.data, "_mmap", None)
        if m is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        start, length = _page_range(int(t.data_offset), int(t.n_bytes))
        try:
            m.madvise(mmap.MADV_DONTNEED, start, min(length, len(m) - start))
        except (OSError, ValueError):
            pass

    def get(self, name: str) -> np.ndarray:
        """One tensor as float32 in Hugging Face's layout and meaning (module docstring).

        Raises:
            KeyError: no such tensor.
            EdgespecError: a quantization type the ``gguf`` package cannot dequantize.
        """

        t = self._tensors[name]
        shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists dims innermost first
        w = np.ascontiguousarray(_dequantize(t, t.data), dtype=np.float32).reshape(shape)
        self._release(t)
        if self.arch == "llama" and name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                                    "self_attn.q_proj.bias", "self_attn.k_proj.bias")):
            heads = self.config.num_heads if ".q_proj." in name else self.config.num_kv_heads
            w = unpermute(w, heads)
        if self.arch == "gemma3" and name.endswith("norm.weight"):
            w -= 1.0
        return w


def readable(tensor_type) -> bool:
    """Whether the ``gguf`` package turns this GGUF tensor type into float32 (F32, F16 and its dequantizers)."""
    from gguf import GGMLQuantizationType, quants

    return tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16) or tensor_type in quants._type_traits


def _dequantize(t, data) -> np.ndarray:
    """float32 values of ``data`` (all or some rows of GGUF tensor ``t``'s blocks)."""
    from gguf import GGMLQuantizationType, quants

    if t.tensor_type == GGMLQuantizationType.F32:
        return np.array(data, dtype=np.float32)
    if t.tensor_type == GGMLQuantizationType.F16:
        return np.asarray(data).astype(np.float32)
    return quants.dequantize(np.ascontiguousarray(data), t.tensor_type)


def _page_range(offset: int, length: int, page: int = 4096) -> tuple[int, int]:
    start = offset - offset % page
    return start, offset + length - start


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (``convert_hf_to_gguf.LlamaModel.permute``) of ``w`` float32
    (heads * head_dim, ...): within each head, rows (0, 2, 4, …, 1, 3, …) ← (0, 1, 2, …)."""
    shape = w.shape
    return np.ascontiguousarray(w.reshape(heads, shape[0] // heads // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape))
