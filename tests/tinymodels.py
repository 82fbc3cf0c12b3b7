"""Tiny random decoder models and a tiny byte-level BPE tokenizer, built in the test from a fixed seed."""

from __future__ import annotations

import json
from pathlib import Path

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' "
    "+ '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CORPUS = [
    "def add(a, b):\n    return a + b\n", "for i in range(10):\n    print(i)\n",
    "The quick brown fox jumps over the lazy dog.", "Speculative decoding drafts tokens and verifies them.",
    "class Node:\n    def __init__(self, value):\n        self.value = value\n", "单发 A. 中文 测试 ünïcödé ✓",
] * 20
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2.5-Coder's FIM and repository tokens, added special as a GGUF-converted export has them (ids 400-405),
# and its tool-call tokens, added as ordinary text (406-407)
FIM_TOKENS = ["<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
TOOL_TOKENS = ["<tool_call>", "</tool_call>"]


def build_tokenizer(out: Path, vocab_size: int = 400, fim: bool = False):
    """Train a byte-level BPE on :data:`CORPUS` and save it as a Hugging Face tokenizer in ``out``; ``fim``:
    with :data:`FIM_TOKENS` (special) and :data:`TOOL_TOKENS` (not special) added after the trained ids."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    if fim:
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in FIM_TOKENS])
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None)
    fast.chat_template = CHATML
    fast.save_pretrained(out)
    return fast


def build_model(out: Path, family: str = "qwen2", seed: int = 0, layers: int = 2, hidden: int = 64,
                vocab: int = 512, noise: float = 0.0, noise_seed: int = 1, fim: bool = False) -> Path:
    """A random causal LM of ``family`` (qwen2 or llama) with the shared tiny tokenizer, saved to ``out``.

    ``noise`` > 0 perturbs every weight by that fraction of its std (seeded by ``noise_seed``): a draft
    that agrees with the seed-``seed`` model often but not always. ``fim``: the tokenizer has Qwen2.5-Coder's
    FIM tokens (:func:`build_tokenizer`).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    cls, cfg_cls = {"qwen2": (Qwen2ForCausalLM, Qwen2Config), "llama": (LlamaForCausalLM, LlamaConfig)}[family]
    tok = build_tokenizer(out, fim=fim)
    cfg = cfg_cls(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  tie_word_embeddings=False, eos_token_id=tok.eos_token_id,
                  pad_token_id=tok.pad_token_id, bos_token_id=None)
    torch.manual_seed(seed)
    model = cls(cfg)
    if noise:
        g = torch.Generator().manual_seed(noise_seed)
        with torch.no_grad():
            for prm in model.parameters():
                prm.add_(torch.randn(prm.shape, generator=g) * noise * (prm.std() if prm.numel() > 1 else 1.0))
    model.save_pretrained(out)
    return out


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data))
