"""Gemma 3 (text): embeddings scaled by sqrt(hidden), RMSNorms that multiply by 1 + w, a norm after the
attention and after the MLP as well as before each (four per layer), q/k head norms, the attention scale
1/sqrt(query_pre_attn_scalar), sliding-window layers (a window mask by position, :meth:`Family.window_bias`) with
their own rotary base, and a GELU (tanh) gated MLP."""

from __future__ import annotations

import math

from .base import Family, add_norm, attention_scale, linear, rms_norm, rotary_tables
from .qwen3 import Qwen3


class Gemma3(Qwen3):
    architectures = ("gemma3_text",)

    activations = ("gelu_pytorch_tanh", "gelu_tanh")

    def norm(self, name):
        return 1.0 + self.src.get(name)

    def embedding_scale(self):
        return math.sqrt(self.cfg.hidden_size)

    def activation(self, gate, i):
        return self.g.node("FastGelu", [gate], f"layers.{i}/mlp/gelu_tanh", domain="com.microsoft")[0]

    def rotary(self, ctx):
        Family.rotary(self, ctx)
        if self.cfg.layer_types is not None:
            cos, sin = rotary_tables(self.cfg, ctx, "sliding_attention")
            self.g.init("rotary_local/cos", cos)
            self.g.init("rotary_local/sin", sin)

    def attention_attrs(self, i):
        attrs = {**Family.attention_attrs(self, i), "scale": attention_scale(self.cfg)}
        if "bias" in attrs:  # a sliding layer: its own rotary base
            attrs["rotary"] = "rotary_local"
        return attrs

    def layer(self, i, residual, pending, attn):
        g, eps, p = self.g, self.cfg.rms_norm_eps, self.p(i)
        x, residual = add_norm(g, pending, residual, self.norm(p + "input_layernorm.weight"), f"layers.{i}/input_norm",
                               eps)
        a = self.attention(i, x, attn)
        a = linear(g, a, self.src.get(p + "self_attn.o_proj.weight"), f"layers.{i}.attn.o_proj", self.layout)
        a = rms_norm(g, a, self.norm(p + "post_attention_layernorm.weight"), f"layers.{i}/post_attention_norm", eps)
        x, residual = add_norm(g, a, residual, self.norm(p + "pre_feedforward_layernorm.weight"),
                               f"layers.{i}/pre_feedforward_norm", eps)
        m = self.mlp(i, x)
        return residual, rms_norm(g, m, self.norm(p + "post_feedforward_layernorm.weight"),
                                  f"layers.{i}/post_feedforward_norm", eps)
