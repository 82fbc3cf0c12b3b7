"""Trace a Hugging Face causal LM into the edgespec graph contract with ``torch.onnx``.

optimum's ``text-generation-with-past`` export feeds a 2-D padding mask, which cannot express a per-query
(tree) mask, so the model is wrapped here to take a 4-D boolean mask and flat ``past_key_values.{i}.key|value``
tensors, and traced with the TorchScript exporter. See :class:`edgespec.io.manifest.GraphSpec` for the contract.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import onnx
import torch

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


class ContractWrapper(torch.nn.Module):
    """``forward(input_ids, position_ids, attention_mask, *past) -> (logits, *present)``.

    ``attention_mask`` bool (B, 1, T, P+T) becomes an additive float mask that transformers uses as-is.
    """

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, position_ids, attention_mask, *past):
        from transformers.cache_utils import DynamicCache

        cache = DynamicCache()
        for i in range(len(past) // 2):
            cache.update(past[2 * i], past[2 * i + 1], i)
        additive = torch.zeros(attention_mask.shape, dtype=torch.float32).masked_fill(
            ~attention_mask, torch.finfo(torch.float32).min
        )
        out = self.model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=additive,
            past_key_values=cache,
            use_cache=True,
        )
        present = []
        for layer in out.past_key_values.layers:
            present += [layer.keys, layer.values]
        return (out.logits, *present)


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


def causal_mask(past_len: int, new_len: int) -> torch.Tensor:
    """bool (1, 1, T, P+T): query t sees every past key and new keys ≤ t."""
    m = torch.ones(new_len, past_len + new_len, dtype=torch.bool)
    m[:, past_len:] = torch.tril(torch.ones(new_len, new_len, dtype=torch.bool))
    return m[None, None]


def example_inputs(config, past_len: int, new_len: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Random, contract-shaped inputs (B=1) for tracing and validation."""
    g = torch.Generator().manual_seed(seed)
    layers, kv, hd = kv_shape(config)
    ids = torch.randint(0, config.vocab_size, (1, new_len), generator=g)
    pos = torch.arange(past_len, past_len + new_len)[None]
    past = []
    for _ in range(layers):
        past += [torch.randn(1, kv, past_len, hd, generator=g), torch.randn(1, kv, past_len, hd, generator=g)]
    return (ids, pos, causal_mask(past_len, new_len), *past)


def export_onnx(model, out_path: Path) -> tuple[list[str], list[str]]:
    """Trace ``model`` (fp32, eval) to ``out_path`` (+ ``model.onnx.data``); returns (input names, output names)."""
    config = model.config
    layers, _, _ = kv_shape(config)
    ins, outs = io_names(layers)
    dyn = {"input_ids": {0: "batch", 1: "seq"}, "position_ids": {0: "batch", 1: "seq"},
           "attention_mask": {0: "batch", 2: "seq", 3: "total"}, "logits": {0: "batch", 1: "seq"}}
    for n in ins[3:]:
        dyn[n] = {0: "batch", 2: "past"}
    for n in outs[1:]:
        dyn[n] = {0: "batch", 2: "total"}
    wrapper = ContractWrapper(model).eval()
    args = example_inputs(config, past_len=3, new_len=2)
    out_path = Path(out_path)
    raw_dir = out_path.parent / "_trace"
    raw_dir.mkdir(parents=True, exist_ok=True)
    raw = raw_dir / "model.onnx"
    # torch.onnx and transformers warn at length while tracing (TracerWarning on Python-value branches, deprecations):
    # none of it is actionable for the user, and validation against PyTorch checks the traced graph anyway
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            wrapper, args, str(raw), input_names=ins, output_names=outs, dynamic_axes=dyn,
            opset_version=17, do_constant_folding=True, dynamo=False,
        )
    proto = onnx.load(str(raw), load_external_data=True)
    add_logits_keep(proto)
    onnx.save_model(proto, str(out_path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=out_path.name + ".data", size_threshold=1024)
    for f in raw_dir.iterdir():
        f.unlink()
    os.rmdir(raw_dir)
    return ins, outs
