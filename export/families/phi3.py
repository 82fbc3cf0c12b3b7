"""Phi-3 / Phi-4-mini: q, k and v in one ``qkv_proj`` and gate and up in one ``gate_up_proj`` (already packed as
the graph wants them), a partial rotary embedding (Phi-4-mini: 3/4 of each head; GroupQueryAttention rotates the
first 2 × its table's width values), LongRoPE (its short factors, over the original context) and, where the config
sets one, a sliding window over every layer (Phi-3-mini-4k: 2,047)."""

from __future__ import annotations

from .base import Family


class Phi3(Family):
    architectures = ("phi3",)

    @classmethod
    def problem(cls, cfg):
        if cfg.head_dim % 16:
            return f"onnxruntime's GroupQueryAttention needs a head size that is a multiple of 16, not {cfg.head_dim}"
        if cfg.hidden_act != "silu":
            return f"Phi-3 with the {cfg.hidden_act} MLP is not supported"
        return cls.rotary_problem(cfg)

    def qkv(self, i):
        a = self.p(i) + "self_attn."
        return self.src.get(a + "qkv_proj.weight"), self.get(a + "qkv_proj.bias")

    def gate_up(self, i):
        return self.src.get(self.p(i) + "mlp.gate_up_proj.weight")
