"""Graph format 3: write a causal LM directly as an ONNX graph with fused onnxruntime attention.

Instead of tracing the Hugging Face model, the graph is assembled node by node from its weights (as
onnxruntime-genai's model builder does): per layer one packed Q/K/V MatMul, onnxruntime's
``com.microsoft.GroupQueryAttention`` with the rotary embedding inside it (``do_rotary``, cos/sin caches,
``position_ids``), a packed gate/up MatMul, and the ``SimplifiedLayerNormalization`` /
``SkipSimplifiedLayerNormalization`` fused RMSNorms that also carry the residual adds.

The KV cache is one preallocated buffer per layer and kind: ``past_key_values.{i}.key`` float32
(B, kv_heads, capacity, head_dim) is also where ``present.{i}.key`` is written (the runtime binds both to the
same memory; GroupQueryAttention then writes only the new rows, at positions P..P+T-1). The number of valid
positions is the last dimension of ``attention_mask`` bool (B, 1, T, P+T), which also becomes the additive
``attention_bias`` that carries a tree mask. See :class:`edgespec.io.manifest.GraphSpec` for the contract.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgespec.errors import EdgespecError
from edgespec.io.onnx_model import ROTARY_POSITIONS

from .onnx_graph import LOGITS_KEEP, add_logits_keep, kv_shape

FORMAT3_ARCHITECTURES = ("qwen2", "llama")


def _np(t) -> np.ndarray:
    return t.detach().to("cpu").float().numpy()


class GraphBuilder:
    """A growing list of nodes and initializers with unique names.

    Initializers of 1 KiB or more go straight to the external data file ``data`` as they are made, so the
    graph never holds a second copy of the weights in memory.
    """

    def __init__(self, data: Path | None = None):
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.data = data
        self._file = open(data, "wb") if data is not None else None

    def init(self, name: str, array: np.ndarray) -> str:
        array = np.ascontiguousarray(array)
        if self._file is None or array.nbytes < 1024:
            self.inits.append(numpy_helper.from_array(array, name))
            return name
        offset = self._file.tell()
        pad = -offset % 4096  # page-aligned, so onnxruntime can map the weights
        self._file.write(b"\0" * pad)
        array.tofile(self._file)
        t = onnx.TensorProto(name=name, dims=array.shape, data_type=helper.np_dtype_to_tensor_dtype(array.dtype),
                             data_location=onnx.TensorProto.EXTERNAL)
        for k, v in (("location", self.data.name), ("offset", str(offset + pad)), ("length", str(array.nbytes))):
            t.external_data.add(key=k, value=v)
        self.inits.append(t)
        return name

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def node(self, op: str, inputs: list[str], name: str, n_out: int = 1, domain: str = "", **attrs) -> list[str]:
        outs = [f"{name}/out{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, domain=domain or None, **attrs))
        return outs

    def matmul(self, x: str, weight: np.ndarray, name: str, bias: np.ndarray | None = None) -> str:
        """``x @ weight.T`` (+ bias); ``weight`` float32 (out, in) as in torch.nn.Linear."""
        out = self.node("MatMul", [x, self.init(f"{name}.weight", weight.T)], f"{name}/MatMul")[0]
        if bias is not None:
            out = self.node("Add", [out, self.init(f"{name}.bias", bias)], f"{name}/Add")[0]
        return out


def format3_problem(config, graph_format: int = 3) -> str | None:
    """Why a transformers ``config`` cannot be written as a graph of ``graph_format`` 3 (or 4, which shares
    this builder: :mod:`.grouped_graph`) (a phrase), or None if it can."""
    arch = config.model_type
    if arch not in FORMAT3_ARCHITECTURES:
        return f"graph format 3 supports {', '.join(FORMAT3_ARCHITECTURES)}, not {arch}"
    if getattr(config, "use_sliding_window", False):
        return "graph format 3 has no sliding-window attention"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"graph format 3 supports the SiLU MLP, not {config.hidden_act}"
    if getattr(config, "partial_rotary_factor", 1.0) != 1.0:
        return "graph format 3 needs the rotary embedding over the whole head"
    head_dim = kv_shape(config)[2]
    if graph_format == 4:
        return None  # plain ops: any head size (rotary needs an even one, as every rotary model has)
    if head_dim % 16:
        return f"graph format 3 needs a head size that is a multiple of 16 (onnxruntime's GroupQueryAttention), not {head_dim}"
    return None


def _check(config, graph_format: int = 3) -> None:
    why = format3_problem(config, graph_format)
    if why:
        raise EdgespecError(f"{why} (export with --graph-format 2)")


def rotary_caches(model, length: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin float32 (length, head_dim / 2) of the model's own rotary embedding (its inv_freq and scaling)."""
    rot = model.model.rotary_emb
    inv_freq = _np(rot.inv_freq).astype(np.float64)
    scale = float(getattr(rot, "attention_scaling", 1.0))
    angles = np.outer(np.arange(length, dtype=np.float64), inv_freq)
    return (np.cos(angles) * scale).astype(np.float32), (np.sin(angles) * scale).astype(np.float32)


class GQAWriter:
    """Format 3's attention: onnxruntime's ``GroupQueryAttention`` per layer over the shared KV buffers
    ``past_key_values.{i}.key|value`` float32 (B, kv_heads, capacity, head_dim), aliased as ``present.{i}.*``."""

    graph_format = 3

    def __init__(self, heads: int, kv: int, hd: int):
        self.heads, self.kv, self.hd = heads, kv, hd

    def prelude(self, g: GraphBuilder) -> None:
        """Lengths from the mask: total = P+T (int32 scalar), seqlens_k = total - 1 per batch row (int32 (B,))."""
        g.init("const/one_i32", np.array([1], np.int32))
        total64 = g.node("Shape", ["attention_mask"], "mask/Shape", start=3, end=4)[0]
        total32 = g.node("Cast", [total64], "mask/Cast", to=TensorProto.INT32)[0]
        self.total = g.node("Reshape", [total32, "const/scalar_shape"], "mask/total")[0]
        batch = g.node("Shape", ["input_ids"], "mask/batch", start=0, end=1)[0]
        last = g.node("Sub", [total32, "const/one_i32"], "mask/Sub")[0]
        self.seqlens_k = g.node("Expand", [last, batch], "mask/seqlens_k")[0]
        self.bias = g.node("Where", ["attention_mask", "const/zero_f", "const/min_f"], "mask/bias")[0]

    def layer(self, g: GraphBuilder, i: int, qkv: str, k: str = "", v: str = "", rotary: str = "rotary",
              bias: str | None = None, **attrs) -> str:
        """The attention output float32 (B, T, heads * head_dim) of layer ``i`` from its packed ``qkv`` (or,
        with ``k`` and ``v``, from separate q, k and v), rotated with the tables ``{rotary}/cos|sin``, masked by
        ``bias`` (default: the graph's, from ``attention_mask``); ``attrs`` are further GroupQueryAttention
        attributes (``scale``)."""
        past_k, past_v = f"past_key_values.{i}.key", f"past_key_values.{i}.value"
        attn, pk, pv = g.node(
            "GroupQueryAttention",
            [qkv, k, v, past_k, past_v, self.seqlens_k, self.total, f"{rotary}/cos", f"{rotary}/sin", "position_ids",
             bias or self.bias],
            f"layers.{i}/GroupQueryAttention", n_out=3, domain="com.microsoft",
            num_heads=self.heads, kv_num_heads=self.kv, do_rotary=1, rotary_interleaved=0, **attrs)
        g.nodes.append(helper.make_node("Identity", [pk], [f"present.{i}.key"], name=f"layers.{i}/present_k"))
        g.nodes.append(helper.make_node("Identity", [pv], [f"present.{i}.value"], name=f"layers.{i}/present_v"))
        return attn

    def finish(self, g: GraphBuilder, layers: int) -> None:
        """Nodes after the last layer (none here)."""

    def kv_io(self, layers: int) -> tuple[list, list]:
        """(KV graph inputs, KV graph outputs) as value infos, in layer order."""
        F, kv, hd = TensorProto.FLOAT, self.kv, self.hd
        ins, outs = [], []
        for i in range(layers):
            for kind in ("key", "value"):
                ins.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", F, ["batch", kv, "capacity", hd]))
                outs.append(helper.make_tensor_value_info(f"present.{i}.{kind}", F, ["batch", kv, "capacity", hd]))
        return ins, outs


def build_model(model, data: Path | None = None, writer: type = GQAWriter) -> onnx.ModelProto:
    """The ModelProto (fp32 weights) of a transformers Qwen2/Llama causal LM with the attention of ``writer``
    (:class:`GQAWriter`: format 3; :class:`export.grouped_graph.GroupedWriter`: format 4); with ``data``, its
    large initializers are written to that file (external data next to the model) instead of held inline."""
    config = model.config
    _check(config, writer.graph_format)
    g = GraphBuilder(data)
    try:
        return _build(model, g, writer)
    finally:
        g.close()


def _build(model, g: GraphBuilder, writer_cls: type) -> onnx.ModelProto:
    config = model.config
    layers, kv, hd = kv_shape(config)
    heads, eps = config.num_attention_heads, float(config.rms_norm_eps)
    writer = writer_cls(heads, kv, hd)
    ctx = int(getattr(config, "max_position_embeddings", 4096))
    g.init("const/zero_f", np.array(0.0, np.float32))
    g.init("const/min_f", np.array(np.finfo(np.float32).min, np.float32))
    g.init("const/scalar_shape", np.zeros((0,), np.int64))
    cos, sin = rotary_caches(model, ctx)
    g.init("rotary/cos", cos)
    g.init("rotary/sin", sin)
    writer.prelude(g)

    sd = {k: v for k, v in model.state_dict().items()}
    h = g.node("Gather", [g.init("embed_tokens.weight", _np(sd["model.embed_tokens.weight"])), "input_ids"],
               "embed/Gather")[0]
    residual, pending = h, None
    for i in range(layers):
        p = f"model.layers.{i}."
        ln1 = g.init(f"layers.{i}.input_layernorm.weight", _np(sd[p + "input_layernorm.weight"]))
        if pending is None:
            x = g.node("SimplifiedLayerNormalization", [residual, ln1], f"layers.{i}/input_norm",
                       epsilon=eps, axis=-1, stash_type=1)[0]
        else:
            x, _, _, residual = g.node("SkipSimplifiedLayerNormalization", [pending, residual, ln1],
                                       f"layers.{i}/input_norm", n_out=4, domain="com.microsoft", epsilon=eps)
        a = p + "self_attn."
        w_qkv = np.concatenate([_np(sd[a + f"{n}_proj.weight"]) for n in "qkv"], axis=0)
        b_qkv = (np.concatenate([_np(sd[a + f"{n}_proj.bias"]) for n in "qkv"])
                 if a + "q_proj.bias" in sd else None)
        qkv = g.matmul(x, w_qkv, f"layers.{i}.attn.qkv_proj", b_qkv)
        attn = writer.layer(g, i, qkv)
        o_bias = _np(sd[a + "o_proj.bias"]) if a + "o_proj.bias" in sd else None
        attn_out = g.matmul(attn, _np(sd[a + "o_proj.weight"]), f"layers.{i}.attn.o_proj", o_bias)
        ln2 = g.init(f"layers.{i}.post_attention_layernorm.weight", _np(sd[p + "post_attention_layernorm.weight"]))
        x, _, _, residual = g.node("SkipSimplifiedLayerNormalization", [attn_out, residual, ln2],
                                   f"layers.{i}/post_attention_norm", n_out=4, domain="com.microsoft", epsilon=eps)
        m = p + "mlp."
        inter = sd[m + "gate_proj.weight"].shape[0]
        gate_up = g.matmul(x, np.concatenate([_np(sd[m + "gate_proj.weight"]), _np(sd[m + "up_proj.weight"])]),
                           f"layers.{i}.mlp.gate_up_proj")
        split = g.init(f"layers.{i}.mlp.split", np.array([inter, inter], np.int64))
        gate, up = g.node("Split", [gate_up, split], f"layers.{i}/mlp/Split", n_out=2, axis=-1)
        sig = g.node("Sigmoid", [gate], f"layers.{i}/mlp/Sigmoid")[0]
        act = g.node("Mul", [g.node("Mul", [gate, sig], f"layers.{i}/mlp/silu")[0], up], f"layers.{i}/mlp/Mul")[0]
        pending = g.matmul(act, _np(sd[m + "down_proj.weight"]), f"layers.{i}.mlp.down_proj")
    writer.finish(g, layers)
    norm = g.init("norm.weight", _np(sd["model.norm.weight"]))
    hidden = g.node("SkipSimplifiedLayerNormalization", [pending, residual, norm], "final_norm", n_out=4,
                    domain="com.microsoft", epsilon=eps)[0]
    head = _np(sd["lm_head.weight"]) if "lm_head.weight" in sd else _np(sd["model.embed_tokens.weight"])
    g.nodes.append(helper.make_node("MatMul", [hidden, g.init("lm_head.weight", head.T)], ["logits"],
                                    name="lm_head/MatMul"))
    del sd

    F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
    inputs = [helper.make_tensor_value_info("input_ids", I64, ["batch", "seq"]),
              helper.make_tensor_value_info("position_ids", I64, ["batch", "seq"]),
              helper.make_tensor_value_info("attention_mask", B, ["batch", 1, "seq", "total"])]
    outputs = [helper.make_tensor_value_info("logits", F, ["batch", "seq", head.shape[0]])]
    kv_in, kv_out = writer.kv_io(layers)
    inputs += kv_in
    outputs += kv_out
    fmt = writer.graph_format
    graph = helper.make_graph(g.nodes, f"edgespec-format{fmt}", inputs, outputs, g.inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)],
                              producer_name="edgespec")
    proto.ir_version = 8
    # the rotary table's rows: the runtime refuses a manifest context_length beyond them (edgespec.io.onnx_model)
    helper.set_model_props(proto, {"edgespec.graph_format": str(fmt), ROTARY_POSITIONS: str(ctx)})
    add_logits_keep(proto)
    # a required input here: onnxruntime's IO binding cannot bind an overridable initializer
    keep = [t for t in proto.graph.initializer if t.name == LOGITS_KEEP]
    proto.graph.initializer.remove(keep[0])
    return proto


def export_format3(model, out_path: Path, writer: type = GQAWriter) -> tuple[list[str], list[str]]:
    """Write the format-3 graph of ``model`` (with ``writer``: its format) to ``out_path`` (+ ``.data``);
    returns (input names, output names).

    Raises:
        EdgespecError: the architecture or one of its options has no format-3 graph.
    """
    out_path = Path(out_path)
    proto = build_model(model, out_path.with_name(out_path.name + ".data"), writer)
    onnx.save_model(proto, str(out_path))
    ins = [i.name for i in proto.graph.input]
    outs = [o.name for o in proto.graph.output]
    del proto
    return ins, outs
