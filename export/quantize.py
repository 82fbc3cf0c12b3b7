"""Weight quantization of an fp32 contract graph with onnxruntime's own quantizers.

- ``int4``: ``MatMulNBitsQuantizer`` (symmetric, ``block_size``, ``accuracy_level``), onnxruntime's MatMulNBits.
- ``int8``: ``quantize_dynamic`` (QInt8 weights, MatMul only).
- ``fp32``: the traced graph as is.

``lm_head_bits`` keeps the output head at 8 bits (MatMulNBits, 8-bit) or 32 bits (untouched) instead of the
graph's precision.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import onnx

PRECISIONS = ("int4", "int8", "fp32")


def lm_head_node(model: onnx.ModelProto) -> str | None:
    """Name of the MatMul that produces ``logits`` (the output head), if there is one."""
    for node in model.graph.node:
        if "logits" in node.output and node.op_type == "MatMul":
            return node.name
    return None


def _save(model: onnx.ModelProto, path: Path) -> None:
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data", size_threshold=1024)


def quantize(fp32_path: Path, out_path: Path, precision: str, block_size: int = 32, accuracy_level: int = 4,
             lm_head_bits: int | None = None) -> None:
    """Write the quantized graph of ``fp32_path`` to ``out_path`` (+ ``.data``).

    ``lm_head_bits`` None means "same as the graph". Raises ValueError for an unknown precision.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)
    model = onnx.load(str(fp32_path), load_external_data=True)
    head = lm_head_node(model)
    if precision == "fp32":
        _save(model, out_path)
        return
    keep_head = head is not None and lm_head_bits is not None and lm_head_bits > (4 if precision == "int4" else 8)
    exclude = [head] if keep_head else []
    if precision == "int4":
        q = MatMulNBitsQuantizer(model, bits=4, block_size=block_size, is_symmetric=True,
                                 accuracy_level=accuracy_level, nodes_to_exclude=exclude)
        q.process()
        model = q.model.model
        if keep_head and lm_head_bits == 8:
            q = MatMulNBitsQuantizer(model, bits=8, block_size=block_size, is_symmetric=True,
                                     accuracy_level=accuracy_level, nodes_to_include=[head])
            q.process()
            model = q.model.model
        _save(model, out_path)
        return
    with tempfile.TemporaryDirectory(dir=out_path.parent) as tmp:
        src = Path(tmp) / "in.onnx"
        _save(model, src)
        del model
        quantize_dynamic(str(src), str(out_path), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                         nodes_to_exclude=exclude, use_external_data_format=True,
                         extra_options={"MatMulConstBOnly": True,
                                        "DefaultTensorType": onnx.TensorProto.FLOAT})  # format 3: contrib ops stop shape inference
    # quantize_dynamic names the external data file itself; normalise to <model>.onnx.data
    m = onnx.load(str(out_path), load_external_data=True)
    for f in out_path.parent.iterdir():
        if f.name.startswith(out_path.name) and f != out_path:
            os.unlink(f)
    _save(m, out_path)
