"""Graph format 2: trace a Hugging Face causal LM into the edgespec graph contract with ``torch.onnx``.

optimum's ``text-generation-with-past`` export feeds a 2-D padding mask, which cannot express a per-query
(tree) mask, so the model is wrapped here to take a 4-D boolean mask and flat ``past_key_values.{i}.key|value``
tensors, and traced with the TorchScript exporter. See :class:`edgespec.io.manifest.GraphSpec` for the contract.
Needs torch and transformers (the ``torch`` extra).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import onnx
import torch

from .onnx_graph import add_logits_keep, io_names, kv_shape


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
