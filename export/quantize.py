"""Weight quantization of an fp32 contract graph with onnxruntime's own quantizers.

- ``int4``: ``MatMulNBitsQuantizer`` (symmetric, ``block_size``, ``accuracy_level``), onnxruntime's MatMulNBits.
- ``int8``: ``quantize_dynamic`` (QInt8 weights, MatMul only).
- ``fp32``: the traced graph as is.

``lm_head_bits`` keeps the output head at 8 bits (MatMulNBits, 8-bit) or 32 bits (untouched) instead of the
graph's precision. ``embedding_bits`` (4 or 8) replaces the token embedding's fp32 ``Gather`` with
onnxruntime's ``com.microsoft.GatherBlockQuantized`` over a block-quantized table (:func:`quantize_embedding`).
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgespec.io.manifest import PRECISIONS  # the one list: what the exporter writes and the runtime reads


def lm_head_node(model: onnx.ModelProto) -> str | None:
    """Name of the MatMul that produces ``logits`` (the output head), if there is one."""
    for node in model.graph.node:
        if "logits" in node.output and node.op_type == "MatMul":
            return node.name
    return None


def quantize_embedding(model: onnx.ModelProto, bits: int, block_size: int, rows_per_chunk: int = 8192) -> str | None:
    """Replace the graph's fp32 embedding ``Gather`` (an initializer table float32 (V, H) gathered on axis 0 by
    ``input_ids``) with ``com.microsoft.GatherBlockQuantized``; returns the node's name, or None if the graph
    has no such Gather (or H is not a multiple of ``block_size``).

    Symmetric block quantization along H, blocks of ``block_size``: scale = max|w| / (2^(bits-1) - 1) per block
    (float32 (V, H / block_size)), q = round(w / scale) + 2^(bits-1) stored as uint8 — (V, H/2) with two 4-bit
    values per byte (low nibble first) for ``bits`` 4, (V, H) for 8 — which is the kernel's default zero point,
    so no zero points are stored. Dequantized rows differ from the fp32 table by at most scale / 2 per element.
    """
    if bits not in (4, 8):
        raise ValueError(f"embedding bits must be 4 or 8, got {bits}")
    inits = {t.name: t for t in model.graph.initializer}
    for i, node in enumerate(model.graph.node):
        if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or node.input[0] not in inits:
            continue
        table = inits[node.input[0]]
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if table.data_type != TensorProto.FLOAT or len(table.dims) != 2 or axis != 0 or table.dims[1] % block_size:
            continue
        data, scales = quantize_rows(numpy_helper.to_array(table), bits, block_size, rows_per_chunk)
        name = node.input[0]
        model.graph.initializer.remove(table)
        model.graph.initializer.extend([numpy_helper.from_array(data, f"{name}_Q{bits}"),
                                        numpy_helper.from_array(scales, f"{name}_scales")])
        new = helper.make_node("GatherBlockQuantized", [f"{name}_Q{bits}", node.input[1], f"{name}_scales"],
                               list(node.output), name=f"{node.name}_Q{bits}", domain="com.microsoft",
                               gather_axis=0, quantize_axis=1, block_size=block_size, bits=bits)
        model.graph.node.remove(node)
        model.graph.node.insert(i, new)
        if not any(o.domain == "com.microsoft" for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
        return new.name
    return None


def quantize_rows(w: np.ndarray, bits: int, block_size: int, rows_per_chunk: int = 8192) -> tuple[np.ndarray,
                                                                                                    np.ndarray]:
    """Symmetric block quantization of a table ``w`` float32 (V, H) along H, as ``GatherBlockQuantized`` reads it
    (:func:`quantize_embedding`): (data uint8 (V, H / 2) for 4 bits or (V, H) for 8, scales float32
    (V, H / block_size)). Works through ``rows_per_chunk`` rows at a time, so its temporaries stay small."""
    v, h = w.shape
    zero, qmax = 1 << (bits - 1), (1 << (bits - 1)) - 1
    data = np.empty((v, h // (8 // bits)), np.uint8)
    scales = np.empty((v, h // block_size), np.float32)
    for r in range(0, v, rows_per_chunk):  # chunks: a few fp32 temporaries of the chunk, not of the table
        blocks = w[r:r + rows_per_chunk].reshape(-1, h // block_size, block_size)
        s = np.abs(blocks).max(-1) / qmax
        s[s == 0] = 1.0
        q = (np.clip(np.rint(blocks / s[..., None]), -qmax, qmax) + zero).astype(np.uint8).reshape(-1, h)
        data[r:r + rows_per_chunk] = (q[:, 0::2] | (q[:, 1::2] << 4)) if bits == 4 else q
        scales[r:r + rows_per_chunk] = s
    return data, scales


def save_with_data(model: onnx.ModelProto, path: Path) -> None:
    """Write ``model`` to ``path`` with every tensor of 1 KiB or more in one external file ``<name>.data``."""
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data", size_threshold=1024)


def quantize(fp32_path: Path, out_path: Path, precision: str, block_size: int = 32, accuracy_level: int = 4,
             lm_head_bits: int | None = None, embedding_bits: int | None = None) -> None:
    """Write the quantized graph of ``fp32_path`` to ``out_path`` (+ ``.data``).

    ``lm_head_bits`` None means "same as the graph"; ``embedding_bits`` None keeps the embedding table fp32
    (else :func:`quantize_embedding`, blocks of ``block_size``). Raises ValueError for an unknown precision.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)
    model = onnx.load(str(fp32_path), load_external_data=True)
    head = lm_head_node(model)
    if precision == "fp32":
        save_with_data(model, out_path)
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
        if embedding_bits:
            quantize_embedding(model, embedding_bits, block_size)
        save_with_data(model, out_path)
        return
    with tempfile.TemporaryDirectory(dir=out_path.parent) as tmp:
        src = Path(tmp) / "in.onnx"
        save_with_data(model, src)
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
    if embedding_bits:
        quantize_embedding(m, embedding_bits, block_size)
    save_with_data(m, out_path)
