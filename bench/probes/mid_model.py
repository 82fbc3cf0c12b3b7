"""A random-weight Qwen2 with Qwen2.5-0.5B's shapes, exported int4 in graph formats 2 and 3, for memory studies
that need neither the real pair nor its lock (``bench/memory.py --soak``).

    python bench/probes/mid_model.py OUT_DIR      # writes OUT_DIR/hf, OUT_DIR/format2, OUT_DIR/format3 (~10 min each)

Shapes: 24 layers, hidden 896, 14 query / 2 KV heads of 64, MLP 4864, vocab 151,936, tied embeddings: the
KV cache is 24.6 KB per token (float32), the int4 MatMulNBits weights 294 MB and the fp32 embedding 519 MB
on disk. The tokenizer is the tests' tiny one (its ids are a subset of the vocabulary); the weights are
random, so only sizes and speeds mean anything. Needs the exporter (``pip install -e '.[export,test]'``).
"""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main(out: Path) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    sys.path.insert(0, str(REPO / "tests"))
    from tinymodels import build_tokenizer

    from edgespec.export import ExportOptions, export_pair

    hf = out / "hf"
    tok = build_tokenizer(hf)
    cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                      num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      bos_token_id=None)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(hf)
    for fmt in (2, 3):
        opts = ExportOptions("int4", graph_format=fmt)
        export_pair(str(hf), str(hf), out / f"format{fmt}", opts, opts)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
