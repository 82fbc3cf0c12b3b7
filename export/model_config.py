"""The model facts a graph writer needs, read from a Hugging Face ``config.json`` or a GGUF header.

:class:`ModelConfig` is typed data, one per model, with Hugging Face's names and meanings (``model_type`` becomes
``architecture``); a weight source (:mod:`export.weights`) yields it beside its tensors, so every family writer,
the numpy reference and the pair check read the same facts whatever the file format.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edgespec.errors import EdgespecError


# settings transformers' config classes fill in when a config.json leaves them out (a Gemma 3 text_config lists
# few keys): they are the model's, not generic ones
DEFAULTS = {
    "gemma3_text": {"rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0, "head_dim": 256,
                    "query_pre_attn_scalar": 256, "sliding_window": 4096, "num_attention_heads": 8,
                    "num_key_value_heads": 4, "vocab_size": 262_208, "rms_norm_eps": 1e-6,
                    "max_position_embeddings": 131_072, "hidden_activation": "gelu_pytorch_tanh"},
    "qwen2": {"rope_theta": 10_000.0, "rms_norm_eps": 1e-6},
    "qwen3": {"rope_theta": 10_000.0, "rms_norm_eps": 1e-6},
    "llama": {"rope_theta": 10_000.0, "rms_norm_eps": 1e-6},
    "phi3": {"rope_theta": 10_000.0, "rms_norm_eps": 1e-5},
}
_ROPE_KEYS = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                                "original_max_position_embeddings"),
              "longrope": ("short_factor", "long_factor")}


def _rope_scaling(rs, arch) -> dict | None:
    """Hugging Face's ``rope_scaling`` with one spelling: ``rope_type`` (older configs write ``type``; Phi-3's
    ``su`` and ``yarn`` are longrope, as ``Phi3Config`` reads them), checked for the keys its type needs.

    Raises:
        ValueError: not a dict, or a key its type needs is missing.
    """
    if rs is None:
        return None
    if not isinstance(rs, dict):
        raise ValueError(f"rope_scaling must be an object, not {rs!r}")
    kind = rs.get("rope_type", rs.get("type", "default"))
    if arch == "phi3" and kind in ("su", "yarn"):
        kind = "longrope"
    missing = [k for k in _ROPE_KEYS.get(kind, ()) if k not in rs]
    if missing:
        raise ValueError(f"rope_scaling of type {kind} lacks {', '.join(missing)}")
    return None if kind == "default" else {**rs, "rope_type": kind}


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer's shape and hyperparameters (Hugging Face's meanings).

    ``architecture`` is the Hugging Face ``model_type`` (``qwen2``, ``qwen3``, ``llama``, ``mistral``,
    ``gemma3_text``, ``phi3``). ``rope_scaling`` is Hugging Face's dict (``rope_type`` llama3 / longrope / linear
    …) or None. ``layer_types`` names each layer's attention (``full_attention`` or ``sliding_attention``, as
    Gemma 3's config does); None means every layer is full attention. ``rope_local_theta`` is the rotary base of
    the sliding layers (Gemma 3's ``rope_local_base_freq``); ``query_pre_attn_scalar`` sets the attention scale
    1/sqrt(it) (Gemma 3) instead of 1/sqrt(head_dim). ``partial_rotary_factor`` < 1 rotates only the first part
    of each head (Phi-4-mini: 0.75).
    """

    architecture: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = field(default=None, hash=False)
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry biases (Qwen2)
    hidden_act: str = "silu"
    # Gemma 3
    layer_types: tuple[str, ...] | None = None
    sliding_window: int | None = None
    rope_local_theta: float | None = None
    query_pre_attn_scalar: float | None = None
    # Phi-3
    partial_rotary_factor: float = 1.0
    original_max_position_embeddings: int | None = None

    @property
    def kv_shape(self) -> tuple[int, int, int]:
        """(num_layers, num_kv_heads, head_dim)."""
        return self.num_layers, self.num_kv_heads, self.head_dim

    @classmethod
    def from_hf(cls, cfg: dict) -> "ModelConfig":
        """From a Hugging Face ``config.json`` dict (a multimodal Gemma 3 config's ``text_config`` is read).

        Raises:
            EdgespecError: a key the model needs is missing or has the wrong type, or a setting ModelConfig
                cannot carry is on (logit softcapping, bidirectional attention).
        """
        if cfg.get("model_type") == "gemma3" and isinstance(cfg.get("text_config"), dict):
            cfg = {"model_type": "gemma3_text", **cfg["text_config"]}
        cfg = {**DEFAULTS.get(cfg.get("model_type"), {}), **cfg}  # what transformers' config class fills in
        for key in ("attn_logit_softcapping", "final_logit_softcapping", "use_bidirectional_attention"):
            if cfg.get(key):
                raise EdgespecError(f"config.json: {key} = {cfg[key]} is not supported")
        try:
            arch = str(cfg["model_type"])
            cfg["rope_scaling"] = _rope_scaling(cfg.get("rope_scaling"), arch)
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            if min(heads, hidden, int(cfg["num_hidden_layers"]), int(cfg["intermediate_size"]),
                   int(cfg["vocab_size"])) <= 0:
                raise ValueError("sizes must be positive")
            kv = int(cfg.get("num_key_value_heads") or heads)
            head_dim = int(cfg.get("head_dim") or hidden // heads)
            layers = int(cfg["num_hidden_layers"])
            layer_types = cfg.get("layer_types")
            if layer_types is None and arch == "gemma3_text":  # configs before layer_types: every 6th is global
                pattern = max(1, int(cfg.get("sliding_window_pattern", 6)))
                layer_types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                               for i in range(layers)]
            elif layer_types is None and cfg.get("use_sliding_window") and cfg.get("sliding_window"):
                first = int(cfg.get("max_window_layers", layers))  # Qwen2's: layers from this one slide
                layer_types = ["full_attention" if i < first else "sliding_attention" for i in range(layers)]
            elif (layer_types is None and arch in ("mistral", "phi3") and cfg.get("sliding_window")
                  and int(cfg["sliding_window"]) < int(cfg.get("max_position_embeddings", 4096))):
                layer_types = ["sliding_attention"] * layers  # transformers windows every layer of these
            if layer_types is not None and all(t == "full_attention" for t in layer_types):
                layer_types = None
            if layer_types is not None and (len(layer_types) != layers or not cfg.get("sliding_window")):
                raise ValueError(f"{len(layer_types)} layer_types for {layers} layers, sliding window "
                                 f"{cfg.get('sliding_window')}")
            act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
            return cls(
                architecture=arch, num_layers=layers, hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]), num_heads=heads, num_kv_heads=kv,
                head_dim=head_dim, vocab_size=int(cfg["vocab_size"]),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope_theta=float(cfg.get("rope_theta", 10000.0)),
                rope_scaling=cfg["rope_scaling"],
                max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", arch == "gemma3_text")),
                attention_bias=bool(cfg.get("attention_bias", arch == "qwen2")), hidden_act=str(act),
                layer_types=tuple(layer_types) if layer_types is not None else None,
                sliding_window=int(cfg["sliding_window"]) if layer_types is not None and cfg.get("sliding_window")
                else None,
                rope_local_theta=float(cfg["rope_local_base_freq"]) if cfg.get("rope_local_base_freq") else None,
                query_pre_attn_scalar=float(cfg["query_pre_attn_scalar"]) if cfg.get("query_pre_attn_scalar")
                else None,
                partial_rotary_factor=float(cfg.get("partial_rotary_factor", 1.0)),
                original_max_position_embeddings=int(cfg["original_max_position_embeddings"])
                if cfg.get("original_max_position_embeddings") else None,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise EdgespecError(f"cannot read model config: config.json has a missing or bad setting "
                                f"({type(e).__name__}: {e})") from None
