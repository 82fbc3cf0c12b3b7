"""Qwen3: Llama's block with an RMSNorm over each head of q and of k (``q_norm``, ``k_norm``, weights (head_dim,))
before the rotary embedding, which GroupQueryAttention then applies to the separate q, k and v."""

from __future__ import annotations

import numpy as np

from .base import Family, linear, rms_norm


class Qwen3(Family):
    architectures = ("qwen3",)

    def attention(self, i, x, attn):
        g, cfg, a = self.g, self.cfg, self.p(i) + "self_attn."
        w, b = self.qkv(i)
        qkv = linear(g, x, w, f"layers.{i}.attn.qkv_proj", self.layout, b)
        del w
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        split = g.init(f"layers.{i}.attn.qkv_split", np.array([q_size, kv_size, kv_size], np.int64))
        q, k, v = g.node("Split", [qkv, split], f"layers.{i}/attn/Split", n_out=3, axis=-1)
        return attn.layer(g, i, self.head_norm(q, a + "q_norm.weight", f"layers.{i}/attn/q_norm"),
                          self.head_norm(k, a + "k_norm.weight", f"layers.{i}/attn/k_norm"), v,
                          **self.attention_attrs(i))

    def head_norm(self, x: str, weight: str, name: str) -> str:
        """RMSNorm of ``x`` float32 (B, T, n * head_dim) over each head's head_dim values."""
        g, hd = self.g, self.cfg.head_dim
        shape = g.init(f"{name}/shape", np.array([0, 0, -1, hd], np.int64))
        heads = g.node("Reshape", [x, shape], f"{name}/Reshape")[0]  # (B, T, n, head_dim)
        normed = rms_norm(g, heads, self.norm(weight), name, self.cfg.rms_norm_eps)
        flat = g.init(f"{name}/flat", np.array([0, 0, -1], np.int64))
        return g.node("Reshape", [normed, flat], f"{name}/Flatten")[0]
