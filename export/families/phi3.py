"""Phi-3 / Phi-4-mini: q, k and v in one ``qkv_proj`` and gate and up in one ``gate_up_proj`` (already packed as
the graph wants them), a partial rotary embedding (Phi-4-mini: 3/4 of each head; GroupQueryAttention rotates the
first 2 × its table's width values), LongRoPE (its short factors, over the original context) and, where the config
sets one, a sliding window over every layer (Phi-3-mini-4k: 2,047)."""

from __future__ import annotations

from .base import Family


class Phi3(Family):
    architectures = ("phi3",)

    partial_rotary = True

    def qkv(self, i):
        a = self.p(i) + "self_attn."
        if a + "qkv_proj.weight" not in self.names:  # a GGUF with q, k and v apart (llama.cpp takes both)
            return super().qkv(i)
        return self.src.get(a + "qkv_proj.weight"), self.get(a + "qkv_proj.bias")

    def gate_up(self, i):
        m = self.p(i) + "mlp."
        return self.src.get(m + "gate_up_proj.weight") if m + "gate_up_proj.weight" in self.names else super().gate_up(i)
