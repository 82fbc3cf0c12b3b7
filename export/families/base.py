"""The decoder graph of graph format 3, written from a :class:`export.weights.TensorSource` one tensor at a time.

A family (one file each: :mod:`.qwen2`, :mod:`.llama`, :mod:`.qwen3`, :mod:`.gemma3`, :mod:`.phi3`) is a
:class:`Family` subclass that says how its tensors are named and combined; :func:`build` runs the shared skeleton
— token embedding, per layer RMSNorm → packed Q/K/V → ``GroupQueryAttention`` over the in-place KV buffers
(:class:`export.gqa_graph.GQAWriter`) → output projection → RMSNorm → gated MLP, final RMSNorm, output head —
and asks the family at each step. Each matmul weight is quantized as it is read (:func:`linear`:
onnxruntime's own block quantizer for one tensor, ``MatMulNBits``) and appended to the graph's external data
file, so peak memory follows the largest tensor (the output head), not the model.

The graph's inputs, outputs and KV contract are format 3's (:mod:`export.gqa_graph`,
:class:`edgespec.io.manifest.GraphSpec`); node and initializer names are the ones onnxruntime's
``MatMulNBitsQuantizer`` gives a quantized fp32 graph, so :mod:`export.prefill_graph` and :mod:`export.kv_int8`
rewrite either.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgespec.errors import EdgespecError
from edgespec.io.onnx_model import ROTARY_POSITIONS

from ..gqa_graph import GQAWriter, GraphBuilder
from ..onnx_graph import LOGITS_KEEP, add_logits_keep
from ..quantize import quantize_rows
from ..weights import rows
from ..model_config import ModelConfig
from .rotary import inv_freq


ROWS_PER_CHUNK = 16384  # output rows quantized at a time (MatMulNBits stores each output row's blocks together)


@dataclass(frozen=True)
class Layout:
    """How the weights are stored: ``precision`` int4 / int8 (``MatMulNBits`` with ``block_size`` blocks along
    the input dimension, ``accuracy_level``, symmetric unless ``zero_points``) or fp32 (``MatMul``);
    ``lm_head_bits`` 4 / 8 / 32 for the output head (None: as the layers); ``embedding_bits`` 4 / 8 for the token
    table (``GatherBlockQuantized``; None: a float32 ``Gather``). ``bits`` maps a weight-name fragment
    (``down_proj``, ``layers.0.``) to the bits of the matmuls whose name contains it (4, 8 or 32), ``blocks``
    one to their block size (else ``block_size``)."""

    precision: str = "int4"
    block_size: int = 32
    accuracy_level: int = 4
    zero_points: bool = False
    lm_head_bits: int | None = None
    embedding_bits: int | None = 8
    bits: dict = field(default_factory=dict, hash=False)
    blocks: dict = field(default_factory=dict, hash=False)

    def block_of(self, name: str) -> int:
        """The block size of the matmul ``name`` (the first fragment of ``blocks`` in it, else ``block_size``)."""
        return next((b for frag, b in self.blocks.items() if frag in name), self.block_size)

    def bits_of(self, name: str) -> int:
        """The bits of the matmul ``name`` (``layers.3.mlp.down_proj``; ``lm_head``)."""
        base = {"int4": 4, "int8": 8, "fp32": 32}[self.precision]
        if name == "lm_head" and self.lm_head_bits is not None:
            return self.lm_head_bits
        return next((b for frag, b in self.bits.items() if frag in name), base)


# a Hugging Face weight → the matmul of format 3 that holds it (``linear``'s names; q/k/v and gate/up are packed)
_MATMULS = {"self_attn.q_proj": "attn.qkv_proj", "self_attn.k_proj": "attn.qkv_proj", "self_attn.v_proj":
            "attn.qkv_proj", "self_attn.qkv_proj": "attn.qkv_proj", "self_attn.o_proj": "attn.o_proj",
            "mlp.gate_proj": "mlp.gate_up_proj", "mlp.up_proj": "mlp.gate_up_proj", "mlp.gate_up_proj":
            "mlp.gate_up_proj", "mlp.down_proj": "mlp.down_proj"}


def matmul_of(weight: str, tied_head: bool = False) -> str | None:
    """The name :func:`linear` gives the matmul holding the Hugging Face weight ``weight``
    (``model.layers.3.self_attn.v_proj.weight`` → ``layers.3.attn.qkv_proj``; ``lm_head.weight`` → ``lm_head``,
    as does ``model.embed_tokens.weight`` where ``tied_head``), or None for a tensor that is no matmul weight."""
    if weight == "lm_head.weight" or (tied_head and weight == "model.embed_tokens.weight"):
        return "lm_head"
    parts = weight.split(".")
    if len(parts) == 6 and parts[:2] == ["model", "layers"] and parts[-1] == "weight":
        m = _MATMULS.get(".".join(parts[3:5]))
        return m and f"layers.{parts[2]}.{m}"
    return None


def linear(g: GraphBuilder, x: str, w: np.ndarray, name: str, layout: Layout, bias: np.ndarray | None = None,
           out: str | None = None) -> str:
    """``x @ w.T`` (+ ``bias``) for ``w`` float32 (N, K) as a Linear stores it (an array, or
    :class:`export.weights.Rows` read by chunks of output rows): ``MatMulNBits`` with the block
    values of onnxruntime's quantizer (``DefaultWeightOnlyQuantizer.qbits_block_quant``, the one
    ``MatMulNBitsQuantizer`` calls) at ``layout.bits_of(name)`` bits, or a float32 ``MatMul`` at 32 bits. The
    output is named ``out`` when given. Returns the output's name."""
    bits, block = layout.bits_of(name), layout.block_of(name)
    if bits == 32:
        y = g.node("MatMul", [x, g.init(f"{name}.weight", np.ascontiguousarray(np.asarray(w[:]).T))],
                   f"{name}/MatMul")[0]
    else:
        from onnxruntime.quantization.matmul_nbits_quantizer import (DefaultWeightOnlyQuantConfig,
                                                                      DefaultWeightOnlyQuantizer)

        n, k = w.shape  # a k that is no multiple of the block: the quantizer pads the last block with zeros
        q = DefaultWeightOnlyQuantizer(DefaultWeightOnlyQuantConfig(
            block_size=block, is_symmetric=not layout.zero_points, accuracy_level=layout.accuracy_level,
            bits=bits))
        parts = [q.qbits_block_quant(np.ascontiguousarray(w[r:r + ROWS_PER_CHUNK].T, dtype=np.float32))
                 for r in range(0, n, ROWS_PER_CHUNK)]  # output rows in chunks: no transposed copy of w
        packed, scales, zp = (np.concatenate([p[j] for p in parts]) for j in range(3))
        del parts
        ins = [x, g.init(f"{name}.weight_Q{bits}", packed), g.init(f"{name}.weight_scales", scales)]
        if layout.zero_points:
            ins.append(g.init(f"{name}.weight_zero_points", zp))
        y = g.node("MatMulNBits", ins, f"{name}/MatMul_Q{bits}", domain="com.microsoft", K=k, N=n, bits=bits,
                   block_size=block, accuracy_level=layout.accuracy_level)[0]
    if bias is not None:
        y = g.node("Add", [y, g.init(f"{name}.bias", bias)], f"{name}/Add")[0]
    if out is not None:  # the last node writes ``out`` itself (the output head's node produces ``logits``)
        g.nodes[-1].output[0] = out
        return out
    return y


def rotary_tables(cfg: ModelConfig, length: int, layer_type: str = "full_attention") -> tuple[np.ndarray, np.ndarray]:
    """cos, sin float32 (length, rotary_dim / 2) for positions 0..length-1 of one kind of layer, with the
    model's rotary scaling: linear, llama3 (Hugging Face's dict, or a GGUF's per-frequency ``factors``) and
    longrope (short factors, the context capped at the original length: :func:`context_length`), each
    multiplied by its attention factor as transformers' ``modeling_rope_utils`` does.

    Raises:
        EdgespecError: a rotary scaling type edgespec does not write.
    """
    freq, scale = inv_freq(cfg, layer_type)
    angles = np.outer(np.arange(length, dtype=np.float64), freq)
    return (np.cos(angles) * scale).astype(np.float32), (np.sin(angles) * scale).astype(np.float32)


def context_length(cfg: ModelConfig) -> int:
    """Positions the graph's rotary table holds: the model's, or the original length of a longrope model
    (whose long factors would change the rotation of keys already in the cache)."""
    if (cfg.rope_scaling or {}).get("rope_type") == "longrope" and cfg.original_max_position_embeddings:
        return cfg.original_max_position_embeddings
    return cfg.max_position_embeddings


class Family:
    """How one model family's tensors make a decoder; the defaults are Llama's (and Qwen2's).

    ``p(i)`` is layer ``i``'s Hugging Face name prefix. Hooks return float32 arrays (Linear layout (out, in))."""

    architectures: tuple[str, ...] = ()

    def __init__(self, src, layout: Layout, g: GraphBuilder):
        self.src, self.cfg, self.layout, self.g = src, src.config, layout, g
        self.names = set(src.names())

    # --- what a family may change ---
    activations: tuple[str, ...] = ("silu",)  # MLP activations the family writes (:meth:`activation`)
    partial_rotary = False  # whether it writes heads rotated only in part

    @classmethod
    def problem(cls, cfg: ModelConfig) -> str | None:
        """Why a model of this config cannot be written (a phrase), or None."""
        if cfg.head_dim % 16:
            return f"onnxruntime's GroupQueryAttention needs a head size that is a multiple of 16, not {cfg.head_dim}"
        if cfg.hidden_act not in cls.activations:
            return f"{cfg.architecture} with the {cfg.hidden_act} MLP is not supported"
        if cfg.partial_rotary_factor != 1.0 and not cls.partial_rotary:
            return f"{cfg.architecture} with a partial rotary embedding is not supported"
        half = int(cfg.head_dim * cfg.partial_rotary_factor) // 2
        if half % 8 or half > cfg.head_dim // 2:
            return (f"onnxruntime's GroupQueryAttention cannot rotate {2 * half} of {cfg.head_dim} head values "
                    "(it needs a multiple of 16)")
        try:  # a rotary scaling the graph cannot write (yarn, dynamic): another format may
            for kind in set(cfg.layer_types or ("full_attention",)):
                inv_freq(cfg, kind)
        except EdgespecError as e:
            return str(e)
        return None

    @staticmethod
    def p(i: int) -> str:
        return f"model.layers.{i}."

    def norm(self, name: str) -> np.ndarray:
        """An RMSNorm's weight as the fused op multiplies by it (Gemma: 1 + w)."""
        return self.src.get(name)

    def get(self, name: str) -> np.ndarray | None:
        return self.src.get(name) if name in self.names else None

    def qkv(self, i: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Layer ``i``'s packed q/k/v weight ((heads + 2 kv_heads) * head_dim, hidden) and bias (or None)."""
        a = self.p(i) + "self_attn."
        w = np.concatenate([self.src.get(a + f"{n}_proj.weight") for n in "qkv"])
        b = [self.get(a + f"{n}_proj.bias") for n in "qkv"]
        return w, (np.concatenate(b) if b[0] is not None else None)

    def gate_up(self, i: int) -> np.ndarray:
        """Layer ``i``'s packed gate and up weights (2 * intermediate, hidden)."""
        m = self.p(i) + "mlp."
        return np.concatenate([self.src.get(m + "gate_proj.weight"), self.src.get(m + "up_proj.weight")])

    def activation(self, gate: str, i: int) -> str:
        """The MLP's activation of ``gate`` (SiLU)."""
        g = self.g
        sig = g.node("Sigmoid", [gate], f"layers.{i}/mlp/Sigmoid")[0]
        return g.node("Mul", [gate, sig], f"layers.{i}/mlp/silu")[0]

    def attention(self, i: int, x: str, attn: GQAWriter) -> str:
        """Layer ``i``'s attention output (before o_proj) from the normed hidden state ``x``."""
        w, b = self.qkv(i)
        qkv = linear(self.g, x, w, f"layers.{i}.attn.qkv_proj", self.layout, b)
        del w
        return attn.layer(self.g, i, qkv, **self.attention_attrs(i))

    def attention_attrs(self, i: int) -> dict:
        """Extra GroupQueryAttention inputs/attributes of layer ``i`` (``rotary`` table prefix, ``bias``,
        ``scale``): a sliding layer's window mask (:meth:`window_bias`)."""
        types = self.cfg.layer_types
        return {"bias": self.window_bias()} if types is not None and types[i] == "sliding_attention" else {}

    def window_bias(self) -> str:
        """The sliding layers' additive mask float32 (B, 1, T, P+T): the graph's mask, and a query at position q
        sees a key at position k only if q - k < window (transformers' sliding window). Written once, by
        positions rather than GroupQueryAttention's ``local_window_size``, which counts buffer rows: a tree's rows
        sit at buffer rows past their positions. Keys of the cache are at their row (the runtime keeps the
        committed cache in position order); the new rows are at ``position_ids``."""
        g = self.g
        if "window/bias" not in {o for n in g.nodes for o in n.output}:
            i64 = lambda name, v: g.init(name, np.array(v, np.int64))  # noqa: E731
            total = g.node("Shape", ["attention_mask"], "window/total", start=3, end=4)[0]
            new = g.node("Shape", ["position_ids"], "window/new", start=1, end=2)[0]
            past = g.node("Sub", [total, new], "window/past")[0]
            rows = g.node("Range", [i64("window/zero", 0), g.node("Squeeze", [past], "window/past_scalar")[0],
                                    i64("window/one", 1)], "window/rows")[0]  # (P,)
            batch = g.node("Shape", ["position_ids"], "window/batch", start=0, end=1)[0]
            past_pos = g.node("Expand", [g.node("Unsqueeze", [rows, i64("window/axis0", [0])], "window/row")[0],
                                         g.node("Concat", [batch, past], "window/past_shape", axis=0)[0]],
                              "window/past_pos")[0]  # (B, P)
            keys = g.node("Concat", [past_pos, "position_ids"], "window/keys", axis=1)[0]  # (B, P+T)
            q = g.node("Unsqueeze", ["position_ids", i64("window/axis2", [2])], "window/q")[0]  # (B, T, 1)
            k = g.node("Unsqueeze", [keys, i64("window/axis1", [1])], "window/k")[0]  # (B, 1, P+T)
            near = g.node("Less", [g.node("Sub", [q, k], "window/dist")[0], i64("window/size", self.cfg.sliding_window)],
                          "window/near")[0]  # (B, T, P+T)
            near = g.node("Unsqueeze", [near, i64("window/axis1b", [1])], "window/near4")[0]
            seen = g.node("And", ["attention_mask", near], "window/seen")[0]
            g.nodes.append(helper.make_node("Where", [seen, "const/zero_f", "const/min_f"], ["window/bias"],
                                            name="window/bias"))
        return "window/bias"

    def rotary(self, ctx: int) -> None:
        """Write the rotary tables ``rotary/cos|sin`` (more for families with several)."""
        cos, sin = rotary_tables(self.cfg, ctx)
        self.g.init("rotary/cos", cos)
        self.g.init("rotary/sin", sin)

    def embedding_scale(self) -> float | None:
        return None

    def layer(self, i: int, residual: str, pending: str | None, attn: GQAWriter) -> tuple[str, str]:
        """One decoder layer: (the residual stream, this layer's output still to be added to it)."""
        g, eps, p = self.g, self.cfg.rms_norm_eps, self.p(i)
        x, residual = add_norm(g, pending, residual, self.norm(p + "input_layernorm.weight"), f"layers.{i}/input_norm",
                               eps)
        a = self.attention(i, x, attn)
        a = linear(g, a, self.src.get(p + "self_attn.o_proj.weight"), f"layers.{i}.attn.o_proj", self.layout,
                   self.get(p + "self_attn.o_proj.bias"))
        x, residual = add_norm(g, a, residual, self.norm(p + "post_attention_layernorm.weight"),
                               f"layers.{i}/post_attention_norm", eps)
        return residual, self.mlp(i, x)

    def mlp(self, i: int, x: str) -> str:
        g, inter = self.g, self.cfg.intermediate_size
        gate_up = linear(g, x, self.gate_up(i), f"layers.{i}.mlp.gate_up_proj", self.layout)
        split = g.init(f"layers.{i}.mlp.split", np.array([inter, inter], np.int64))
        gate, up = g.node("Split", [gate_up, split], f"layers.{i}/mlp/Split", n_out=2, axis=-1)
        act = g.node("Mul", [self.activation(gate, i), up], f"layers.{i}/mlp/Mul")[0]
        return linear(g, act, self.src.get(self.p(i) + "mlp.down_proj.weight"), f"layers.{i}.mlp.down_proj",
                      self.layout)


def add_norm(g: GraphBuilder, pending: str | None, residual: str, weight: np.ndarray, name: str,
             eps: float) -> tuple[str, str]:
    """RMSNorm of ``residual + pending`` (just ``residual`` when ``pending`` is None): (normed, the sum)."""
    w = g.init(f"{name}.weight", weight)
    if pending is None:
        return g.node("SimplifiedLayerNormalization", [residual, w], name, epsilon=eps, axis=-1, stash_type=1)[0], residual
    x, _, _, s = g.node("SkipSimplifiedLayerNormalization", [pending, residual, w], name, n_out=4,
                        domain="com.microsoft", epsilon=eps)
    return x, s


def rms_norm(g: GraphBuilder, x: str, weight: np.ndarray, name: str, eps: float) -> str:
    """RMSNorm of ``x`` over its last axis."""
    return g.node("SimplifiedLayerNormalization", [x, g.init(f"{name}.weight", weight)], name, epsilon=eps, axis=-1,
                  stash_type=1)[0]


def build(family: Family, ctx: int | None = None, kept: np.ndarray | None = None) -> onnx.ModelProto:
    """The format-3 ModelProto of ``family``'s model (its large initializers go to the family's GraphBuilder's
    data file as they are made); ``ctx`` caps the rotary table's positions (default :func:`context_length`);
    ``kept`` int64 (N,) keeps only those rows of the output head (a pruned draft vocabulary, :mod:`export.prune`).

    Raises:
        EdgespecError: the model has a feature the family cannot write, or a weight does not fit the layout.
    """
    cfg, g, layout = family.cfg, family.g, family.layout
    why = family.problem(cfg)
    if why:
        raise EdgespecError(why)
    layers, kv, hd = cfg.kv_shape
    ctx = min(ctx or context_length(cfg), context_length(cfg))
    attn = GQAWriter(cfg.num_heads, kv, hd)
    g.init("const/zero_f", np.array(0.0, np.float32))
    g.init("const/min_f", np.array(np.finfo(np.float32).min, np.float32))
    g.init("const/scalar_shape", np.zeros((0,), np.int64))
    family.rotary(ctx)
    attn.prelude(g)

    table = rows(family.src, "model.embed_tokens.weight")  # read by chunks of rows where the source can
    vocab_rows = table.shape[0]
    h = embedding(g, table, layout)
    scale = family.embedding_scale()
    if scale is not None:
        h = g.node("Mul", [h, g.init("embed/scale", np.array(scale, np.float32))], "embed/scale")[0]
    head_tied = cfg.tie_word_embeddings or "lm_head.weight" not in family.names  # as transformers ties it
    if not head_tied:
        table = None  # read again only if the head is tied to it
    residual, pending = h, None
    for i in range(layers):
        residual, pending = family.layer(i, residual, pending, attn)
    hidden, _ = add_norm(g, pending, residual, family.norm("model.norm.weight"), "final_norm", cfg.rms_norm_eps)
    head = table if head_tied else rows(family.src, "lm_head.weight")
    if kept is not None:
        head = head[kept]
    linear(g, hidden, head, "lm_head", layout, out="logits")
    n_vocab = head.shape[0]
    del head, table

    F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
    inputs = [helper.make_tensor_value_info("input_ids", I64, ["batch", "seq"]),
              helper.make_tensor_value_info("position_ids", I64, ["batch", "seq"]),
              helper.make_tensor_value_info("attention_mask", B, ["batch", 1, "seq", "total"])]
    outputs = [helper.make_tensor_value_info("logits", F, ["batch", "seq", n_vocab])]
    kv_in, kv_out = attn.kv_io(layers)
    graph = helper.make_graph(g.nodes, "edgespec-format3", inputs + kv_in, outputs + kv_out, g.inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                              producer_name="edgespec")
    proto.ir_version = 8
    helper.set_model_props(proto, {"edgespec.graph_format": "3", ROTARY_POSITIONS: str(ctx),
                                   "edgespec.embedding_rows": str(vocab_rows)})
    add_logits_keep(proto)
    keep = [t for t in proto.graph.initializer if t.name == LOGITS_KEEP]
    proto.graph.initializer.remove(keep[0])  # a required input: IO binding cannot bind an overridable initializer
    return proto


def embedding(g: GraphBuilder, table, layout: Layout) -> str:
    """The token embedding of ``input_ids``: ``GatherBlockQuantized`` over ``table`` float32 (V, H) (an array or
    :class:`export.weights.Rows`) quantized in blocks of ``layout.block_size``, or of the largest smaller power of
    two that divides H (:func:`export.quantize.quantize_rows`), or a float32 ``Gather``."""
    bits, h = layout.embedding_bits, table.shape[1]
    block = next((b for b in (layout.block_size, 128, 64, 32, 16) if b <= layout.block_size and h % b == 0), None)
    if bits is None or block is None:
        return g.node("Gather", [g.init("embed_tokens.weight", np.asarray(table[:])), "input_ids"], "embed/Gather")[0]
    data, scales = quantize_rows(table, bits, block)
    return g.node("GatherBlockQuantized", [g.init(f"embed_tokens.weight_Q{bits}", data), "input_ids",
                                           g.init("embed_tokens.weight_scales", scales)],
                  f"embed/Gather_Q{bits}", domain="com.microsoft", gather_axis=0, quantize_axis=1,
                  block_size=block, bits=bits)[0]


def attention_scale(cfg: ModelConfig) -> float:
    """The attention's softmax scale: 1/sqrt(query_pre_attn_scalar) where the model sets it, else 1/sqrt(head_dim)."""
    return 1.0 / math.sqrt(cfg.query_pre_attn_scalar or cfg.head_dim)
