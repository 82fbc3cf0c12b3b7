"""What every graph format shares: the contract's input and output names, the KV shape of a config, and the
optional ``logits_keep`` input. No torch here (graph format 2's tracing is :mod:`export.traced_graph`)."""

from __future__ import annotations

import onnx

SUPPORTED_ARCHITECTURES = ("qwen2", "qwen3", "llama", "mistral")


def io_names(num_layers: int) -> tuple[list[str], list[str]]:
    """Input and output names of the contract for ``num_layers`` layers."""
    ins = ["input_ids", "position_ids", "attention_mask"]
    outs = ["logits"]
    for i in range(num_layers):
        ins += [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
        outs += [f"present.{i}.key", f"present.{i}.value"]
    return ins, outs


def kv_shape(config) -> tuple[int, int, int]:
    """``(num_layers, num_kv_heads, head_dim)`` of a transformers config."""
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return config.num_hidden_layers, kv, head_dim


LOGITS_KEEP = "logits_keep"


def add_logits_keep(model: onnx.ModelProto) -> None:
    """Give the graph an optional input ``logits_keep`` int64 (1,): compute logits for the last N rows only.

    The head runs on ``hidden[:, -N:]``; the default N = 0 keeps every row (the contract's ``logits`` float32
    (B, T, V)). A prefill or a draft catch-up needs the last row only: on the real draft (0.5B, 151,936-token
    head) a 42-token feed took 104 ms with every row and 81 ms with one (docs/benchmarks.md). The input is an
    overridable initializer, so callers that never feed it see the graph unchanged.

    Raises:
        ValueError: no node produces ``logits``.
    """
    from onnx import TensorProto, helper

    g = model.graph
    head = next((n for n in g.node if "logits" in n.output), None)
    if head is None:
        raise ValueError("no node produces logits")
    g.initializer.extend([
        helper.make_tensor(LOGITS_KEEP, TensorProto.INT64, [1], [0]),
        helper.make_tensor("logits_keep/end", TensorProto.INT64, [1], [2 ** 62]),
        helper.make_tensor("logits_keep/axis", TensorProto.INT64, [1], [1]),
    ])
    g.input.append(helper.make_tensor_value_info(LOGITS_KEEP, TensorProto.INT64, [1]))
    at = list(g.node).index(head)
    g.node.insert(at, helper.make_node("Slice", [head.input[0], "logits_keep/start", "logits_keep/end",
                                                 "logits_keep/axis"], ["logits_keep/hidden"], name="logits_keep/Slice"))
    g.node.insert(at, helper.make_node("Neg", [LOGITS_KEEP], ["logits_keep/start"], name="logits_keep/Neg"))
    head.input[0] = "logits_keep/hidden"
    for out in g.output:
        if out.name == "logits" and len(out.type.tensor_type.shape.dim) == 3:
            out.type.tensor_type.shape.dim[1].dim_param = "logits_rows"  # min(N, T), not the input's T
