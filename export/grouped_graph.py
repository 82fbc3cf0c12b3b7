"""Graph format 4: attention that reads each KV head once for its whole query group, past bound in place.

onnxruntime's CPU ``GroupQueryAttention`` (format 3) runs one GEMM per *query* head, so each KV head is read
once for each of the heads_per_kv query heads it serves. Here each layer's attention is written in plain ops
(``com.microsoft.RotaryEmbedding``, ``FusedMatMul`` with transB, ``Softmax``, ``MatMul``): per KV head h, the
G = heads / kv_heads query heads' rows are one (G·T, D) matrix Q_h, and

    scores = [Q_h · K_past_hᵀ | Q_h · K_new_hᵀ] / sqrt(D) + bias      (G·T, W+T): two blocks, one Softmax
    out_h  = P[:, :W] · V_past_h + P[:, W:] · V_new_h                  (G·T, D)

so the past is never concatenated with the new rows (only the small score block is). ``K_past_h``/``V_past_h``
are graph inputs ``past_key_values.{i}.key|value.{h}`` float32 (W, D): the first W rows of the runtime's
per-KV-head buffer, bound by pointer through IO binding (no copy; :mod:`edgespec.io.grouped_kv`). W ≥ P may
exceed the past length P (the runtime rounds it up, so it rebinds rarely); the columns P..W-1 are False in
``attention_mask`` bool (1, 1, T, W+T), which also carries the causal or tree mask of the new rows. The new
rows' K (after rotary) and V of every layer leave the graph as one output ``present`` float32
(2 · layers, kv_heads, T, D) (layer i's key at 2i, value at 2i+1), which the runtime copies to rows P..P+T-1.
Batch size 1. See :class:`edgespec.io.manifest.GraphSpec` for the contract; the rest of the graph (fused RMSNorms,
packed QKV and gate/up MatMuls, ``logits_keep``) is format 3's (:mod:`.gqa_graph`).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

GRAPH_FORMAT = 4


def past_name(layer: int, kind: str, head: int) -> str:
    """``past_key_values.{layer}.{kind}.{head}``: one KV head's past rows, float32 (W, head_dim)."""
    return f"past_key_values.{layer}.{kind}.{head}"


class GroupedWriter:
    """Format 4's attention (the module docstring), for :func:`export.gqa_graph.build_model`."""

    graph_format = GRAPH_FORMAT

    def __init__(self, heads: int, kv: int, hd: int):
        if heads % kv:
            raise ValueError(f"{heads} query heads do not group evenly over {kv} KV heads")
        self.heads, self.kv, self.hd, self.group = heads, kv, hd, heads // kv
        self.present: list[str] = []

    def prelude(self, g) -> None:
        """Once per run: the additive bias float32 (1, G·T, W+T) (rows g·T + t = the mask's row t) and the
        score split sizes [W, T] int64 (2,)."""
        G = self.group
        bias = g.node("Where", ["attention_mask", "const/zero_f", "const/min_f"], "mask/bias")[0]  # (1, 1, T, W+T)
        tiled = g.node("Tile", [bias, g.init("mask/repeats", np.array([1, 1, G, 1], np.int64))], "mask/Tile")[0]
        self.bias = g.node("Squeeze", [tiled, g.init("mask/axes", np.array([1], np.int64))],
                           "mask/grouped")[0]  # (1, G·T, W+T)
        w = g.node("Shape", [past_name(0, "key", 0)], "sizes/past", start=0, end=1)[0]
        t = g.node("Shape", ["input_ids"], "sizes/new", start=1, end=2)[0]
        self.sizes = g.node("Concat", [w, t], "sizes/Concat", axis=0)[0]
        g.init("attn/qkv_shape", np.array([1, 0, self.heads + 2 * self.kv, self.hd], np.int64))  # (1, T, N, D)
        g.init("attn/qkv_split", np.array([self.heads + self.kv, self.kv], np.int64))
        g.init("attn/qk_split", np.array([self.heads, self.kv], np.int64))
        g.init("attn/q_shape", np.array([self.kv, -1, self.hd], np.int64))  # (kv, G·T, D)
        g.init("attn/kv_shape", np.array([self.kv, -1, self.hd], np.int64))  # (kv, T, D)
        g.init("attn/heads_shape", np.array([self.heads, -1, self.hd], np.int64))  # (H, T, D)
        g.init("attn/out_shape", np.array([1, -1, self.heads * self.hd], np.int64))  # (1, T, H·D)

    def layer(self, g, i: int, qkv: str) -> str:
        """The attention output float32 (1, T, heads · head_dim) of layer ``i`` from its packed ``qkv``
        float32 (1, T, (heads + 2 kv) · head_dim)."""
        n, kv, alpha = f"layers.{i}/attn", self.kv, 1.0 / float(np.sqrt(self.hd))
        x = g.node("Reshape", [qkv, "attn/qkv_shape"], f"{n}/Reshape")[0]
        x = g.node("Transpose", [x], f"{n}/Transpose", perm=[0, 2, 1, 3])[0]  # (1, H + 2kv, T, D)
        qk, v = g.node("Split", [x, "attn/qkv_split"], f"{n}/Split", n_out=2, axis=1)
        qk = g.node("RotaryEmbedding", [qk, "position_ids", "rotary/cos", "rotary/sin"], f"{n}/Rotary",
                    domain="com.microsoft", interleaved=0)[0]
        q, k = g.node("Split", [qk, "attn/qk_split"], f"{n}/SplitQK", n_out=2, axis=1)
        q = g.node("Reshape", [q, "attn/q_shape"], f"{n}/q")[0]  # (kv, G·T, D): row g·T + t of KV head h
        self.present += [k, v]  # (1, kv, T, D) each
        k = g.node("Reshape", [k, "attn/kv_shape"], f"{n}/k")[0]
        v = g.node("Reshape", [v, "attn/kv_shape"], f"{n}/v")[0]
        qs = g.node("Split", [q], f"{n}/q/Split", n_out=kv, axis=0) if kv > 1 else [q]
        ks = g.node("Split", [k], f"{n}/k/Split", n_out=kv, axis=0) if kv > 1 else [k]
        vs = g.node("Split", [v], f"{n}/v/Split", n_out=kv, axis=0) if kv > 1 else [v]
        outs = []
        for h in range(kv):
            m = f"{n}/head{h}"
            sp = g.node("FusedMatMul", [qs[h], past_name(i, "key", h)], f"{m}/past_scores", domain="com.microsoft",
                        transB=1, alpha=alpha)[0]  # (1, G·T, W)
            sn = g.node("FusedMatMul", [qs[h], ks[h]], f"{m}/new_scores", domain="com.microsoft",
                        transB=1, alpha=alpha)[0]  # (1, G·T, T)
            s = g.node("Concat", [sp, sn], f"{m}/Concat", axis=-1)[0]
            s = g.node("Add", [s, self.bias], f"{m}/bias")[0]
            p = g.node("Softmax", [s], f"{m}/Softmax", axis=-1)[0]
            pp, pn = g.node("Split", [p, self.sizes], f"{m}/SplitP", n_out=2, axis=-1)
            op = g.node("MatMul", [pp, past_name(i, "value", h)], f"{m}/past_out")[0]
            on = g.node("MatMul", [pn, vs[h]], f"{m}/new_out")[0]
            outs.append(g.node("Add", [op, on], f"{m}/out")[0])  # (1, G·T, D)
        o = g.node("Concat", outs, f"{n}/heads", axis=0)[0] if kv > 1 else outs[0]  # (kv, G·T, D)
        o = g.node("Reshape", [o, "attn/heads_shape"], f"{n}/heads/Reshape")[0]  # (H, T, D)
        o = g.node("Transpose", [o], f"{n}/heads/Transpose", perm=[1, 0, 2])[0]  # (T, H, D)
        return g.node("Reshape", [o, "attn/out_shape"], f"{n}/out")[0]

    def finish(self, g, layers: int) -> None:
        """The ``present`` output: every layer's new K and V rows, float32 (2 · layers, kv, T, D)."""
        g.nodes.append(helper.make_node("Concat", self.present, ["present"], name="present/Concat", axis=0))

    def kv_io(self, layers: int) -> tuple[list, list]:
        """(KV graph inputs: per layer, kind and KV head, float32 (W, D); the output ``present``)."""
        F = TensorProto.FLOAT
        ins = [helper.make_tensor_value_info(past_name(i, kind, h), F, ["past", self.hd])
               for i in range(layers) for kind in ("key", "value") for h in range(self.kv)]
        return ins, [helper.make_tensor_value_info("present", F, [2 * layers, self.kv, "seq", self.hd])]
