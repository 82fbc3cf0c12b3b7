"""How much of a real tensor does each int4 block layout lose, and does a searched scale win it back?

For a few of the target GGUF's tensors (dequantized), the relative squared error ‖w − ŵ‖² / ‖w‖² of ŵ, the
weights as onnxruntime's block quantizer stores them (``DefaultWeightOnlyQuantizer.qbits_block_quant``: symmetric or with
uint8 zero points, blocks of 32…256), and as its k-quant search stores them (``quant_tensor_k_quant_cpu``: llama.cpp's
weighted scale-and-offset search, zero points).

Usage: python bench/probes/block_error.py <target GGUF>
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from edgespec.export.weights.gguf import GGUFSource  # noqa: E402

TENSORS = ("model.layers.5.mlp.gate_proj.weight", "model.layers.5.mlp.down_proj.weight",
           "model.layers.5.self_attn.q_proj.weight")


def default_blocks(w: np.ndarray, block: int, symmetric: bool) -> np.ndarray:
    """``w`` float32 (N, K) as onnxruntime's default block quantizer stores it, dequantized."""
    from onnxruntime.quantization.matmul_nbits_quantizer import (DefaultWeightOnlyQuantConfig,
                                                                  DefaultWeightOnlyQuantizer)

    q = DefaultWeightOnlyQuantizer(DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=symmetric,
                                                                accuracy_level=4, bits=4))
    packed, scales, zp = q.qbits_block_quant(np.ascontiguousarray(w.T))
    n, k = w.shape
    nb = -(-k // block)
    b = packed.reshape(n, nb, block // 2)
    vals = np.stack([b & 15, b >> 4], -1).reshape(n, nb, block).astype(np.float32)
    if symmetric:
        z = np.full((n, nb), 8.0, np.float32)
    else:
        zb = zp.reshape(n, -1)
        z = np.stack([zb & 15, zb >> 4], -1).reshape(n, -1)[:, :nb].astype(np.float32)
    return ((vals - z[:, :, None]) * scales.reshape(n, nb)[:, :, None]).reshape(n, -1)[:, :k]


def k_quant(w: np.ndarray, block: int) -> np.ndarray:
    """``w`` as onnxruntime's k-quant search stores it, dequantized."""
    from onnxruntime.quantization.neural_compressor.weight_only import quant_tensor_k_quant_cpu

    q, s, z = quant_tensor_k_quant_cpu(w.copy(), 4, block)
    return ((q - z) * s).reshape(w.shape)


def main() -> None:
    src = GGUFSource(sys.argv[1])
    for name in TENSORS:
        w = np.asarray(src.get(name), np.float32)
        norm = float((w ** 2).mean())
        print(f"{name} {w.shape}, stored at {src.bits_per_weight(name)} bits per weight")
        for label, fn in (("b32", lambda: default_blocks(w, 32, True)), ("b32z", lambda: default_blocks(w, 32, False)),
                          ("b128", lambda: default_blocks(w, 128, True)),
                          ("b128z", lambda: default_blocks(w, 128, False)),
                          ("b256z", lambda: default_blocks(w, 256, False)),
                          ("k-quant b128", lambda: k_quant(w, 128)), ("k-quant b256", lambda: k_quant(w, 256))):
            print(f"  {label:14s} relative squared error {float(((fn() - w) ** 2).mean()) / norm:.5f}")


if __name__ == "__main__":
    main()
