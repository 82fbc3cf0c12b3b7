"""Tiny random decoder models and a tiny byte-level BPE tokenizer, built in the test from a fixed seed."""

from __future__ import annotations

import json
from pathlib import Path

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' "
    "+ '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# CHATML with Qwen2.5's tools blocks (its format, a shorter system text): tools in the system turn, an assistant's
# tool_calls as <tool_call> blocks, tool results as a user turn of <tool_response> blocks
TOOLS_CHATML = (
    "{%- if tools %}{{ '<|im_start|>system\\n' }}{% if messages[0]['role'] == 'system' %}"
    "{{ messages[0]['content'] + '\\n\\n' }}{% endif %}{{ '# Tools\\n<tools>' }}{% for tool in tools %}"
    "{{ '\\n' + (tool | tojson) }}{% endfor %}{{ '\\n</tools>\\nCall one as <tool_call>\\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}{% endif %}"
    "{%- for message in messages %}"
    "{%- if tools and loop.first and message['role'] == 'system' %}"
    "{%- elif message['role'] == 'assistant' and message.tool_calls %}{{ '<|im_start|>assistant' }}"
    "{% if message['content'] %}{{ '\\n' + message['content'] }}{% endif %}{% for tc in message.tool_calls %}"
    "{% set f = tc.function if tc.function is defined else tc %}{{ '\\n<tool_call>\\n{\"name\": \"' + f.name + "
    "'\", \"arguments\": ' + (f.arguments | tojson) + '}\\n</tool_call>' }}{% endfor %}{{ '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}"
    "{{ '<|im_start|>user' }}{% endif %}{{ '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{%- else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endif %}{%- endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TOOL_TOKENS = ["<tool_call>", "</tool_call>"]  # added (not special) tokens, as in Qwen2.5's tokenizer
CORPUS = [
    "def add(a, b):\n    return a + b\n", "for i in range(10):\n    print(i)\n",
    "The quick brown fox jumps over the lazy dog.", "Speculative decoding drafts tokens and verifies them.",
    "class Node:\n    def __init__(self, value):\n        self.value = value\n", "单发 A. 中文 测试 ünïcödé ✓",
] * 20
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2.5-Coder's FIM and repository tokens, added special as a GGUF-converted export has them (ids 400-405),
# and its tool-call tokens, added as ordinary text (406-407)
FIM_TOKENS = ["<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]


def build_tokenizer(out: Path, vocab_size: int = 400, fim: bool = False, tools: bool = False):
    """Train a byte-level BPE on :data:`CORPUS` and save it as a Hugging Face tokenizer in ``out``. ``fim``:
    with :data:`FIM_TOKENS` (special) and :data:`TOOL_TOKENS` (not special) added after the trained ids;
    ``tools``: with :data:`TOOL_TOKENS` added after the trained ids (ids 400, 401) and :data:`TOOLS_CHATML`."""
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
    if tools:
        fast.add_tokens(TOOL_TOKENS)
        fast.chat_template = TOOLS_CHATML
    fast.save_pretrained(out)
    return fast


def build_model(out: Path, family: str = "qwen2", seed: int = 0, layers: int = 2, hidden: int = 64,
                vocab: int = 512, noise: float = 0.0, noise_seed: int = 1, fim: bool = False,
                tools: bool = False, context: int = 256) -> Path:
    """A random causal LM of ``family`` (qwen2 or llama) with the shared tiny tokenizer, saved to ``out``.

    ``noise`` > 0 perturbs every weight by that fraction of its std (seeded by ``noise_seed``): a draft
    that agrees with the seed-``seed`` model often but not always. ``fim``: the tokenizer has Qwen2.5-Coder's
    FIM tokens; ``tools``: tool tokens and the tools chat template (:func:`build_tokenizer`). ``context``:
    positions the model takes.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    cls, cfg_cls = {"qwen2": (Qwen2ForCausalLM, Qwen2Config), "llama": (LlamaForCausalLM, LlamaConfig)}[family]
    tok = build_tokenizer(out, fim=fim, tools=tools)
    cfg = cfg_cls(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
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
