"""Test vectors for the TypeScript core, written by the Python runtime from one export directory.

    python android_demo/core/scripts/make_vectors.py EXPORT_DIR OUT.json [--new-tokens 24] [--draws 2000]

Writes what ``npm test`` compares the core against (see ``android_demo/core/test/``): the tokenizer's ids and
decoded text for a corpus (code, Chinese, emoji, control tokens), the chat template's rendered prompts and
their ids, plain greedy ids per prompt with the plain run's top-1/top-2 logit gap at every step (for the
near-tie rule of :mod:`edgespec.evaluate`), and a replay record: the logits rows the target and the draft
produce on every prefix a greedy speculative loop with K ≤ ``REPLAY_K_MAX`` can ask for, which
``core/test/conformance/replay.ts`` replays so that the core's loop runs without onnxruntime (on Hermes).
``tests/test_android_core.py`` runs this, then ``npm test``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from edgespec.decoder import SpecDecoder
from edgespec.evaluate import NEAR_TIE_LOGIT_GAP
from edgespec.text import decode

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "for (let i = 0; i < 10; i++) { console.log(`i=${i}`); }",
    "单发 A. 中文 测试：你好，世界！",
    "emoji 🙂👍🏽 and ünïcödé ✓ — done",
    "  leading spaces\tand\ttabs\r\n\n",
    "<|im_start|>user\nhi<|im_end|>\n",
    "<|fim_prefix|>def f(x):\n<|fim_suffix|>\n    return x<|fim_middle|>",
    "<tool_call>{\"name\": \"ls\"}</tool_call>",
    "<|fim_middle|>    return x\n<|file_sep|>b.py\n<|fim_pad|><|repo_name|>r<|im_end|><|endoftext|>",
]
MESSAGES = [
    [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "def add(a, b):"}],
    [{"role": "user", "content": "Fix the bug:\n```python\ndef mean(xs):\n    return sum(xs) / len(xs) + 1\n```"}],
    [{"role": "user", "content": "单发 A. 中文 🙂 in one line?"}],
]


def plain_greedy(dec: SpecDecoder, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """Plain greedy ids (stop tokens included, up to ``n``) and the top-1 minus top-2 logit at each step."""
    dec.reset()
    cache = dec.target.new_cache()
    row = dec.target.forward(ids, cache, keep=1)[-1]
    out, gaps = [], []
    for _ in range(n):
        top = np.sort(row)[-2:]
        gaps.append(float(top[1] - top[0]))
        out.append(int(np.argmax(row)))
        if out[-1] in dec.stop_ids or cache.length + 1 >= dec.context_length:
            break
        row = dec.target.forward(out[-1:], cache)[-1]
    return out, gaps


REPLAY_CHATS = 2  # the first two MESSAGES
REPLAY_K_MAX = 4
REPLAY_TOP = 16  # logits kept per row (the rest replay as -inf): greedy needs the argmax, top-k sampling more


def _top(row: np.ndarray, n: int = REPLAY_TOP) -> list[list]:
    """[ids, values]: the ``n`` largest entries of a logits row float32 (V,), largest first."""
    idx = np.argsort(-row, kind="stable")[:n]
    return [[int(i) for i in idx], [float(row[i]) for i in idx]]


def replay_record(dec: SpecDecoder, ids: list[int], path: list[int]) -> dict:
    """Logits rows keyed by the token prefix they follow (ids joined by ","), for a greedy speculative loop on
    prompt ``ids`` whose output is ``path`` (the plain greedy ids). target: the row after each prefix
    ids + path[:j] (the rows a correct loop uses; verify rows after a rejected draft token are never used).
    draft: the row after each such prefix and after the draft's own greedy chain of up to REPLAY_K_MAX − 1
    tokens from it (every row a draft proposal uses)."""
    if dec.kept_ids is not None:
        raise SystemExit("make_vectors: the replay record does not cover a pruned draft head (kept_token_ids)")
    key = lambda toks: ",".join(map(str, toks))
    target, draft = {}, {}
    tcache, dcache = dec.target.new_cache(), dec.draft.new_cache()
    trow = dec.target.forward(ids, tcache, keep=1)[-1]
    drow = dec.draft.forward(ids, dcache, keep=1)[-1]
    prefix = list(ids)
    for tok in path:
        target[key(prefix)] = _top(trow[:dec.width])
        draft[key(prefix)] = _top(drow[:dec.width])
        base, chain, row = dcache.length, list(prefix), drow
        for _ in range(REPLAY_K_MAX - 1):
            chain.append(dec.draft_argmax(row))
            row = dec.draft.forward(chain[-1:], dcache)[-1]
            draft[key(chain)] = _top(row[:dec.width])
        dcache.crop(base)
        prefix.append(tok)
        if tok in dec.stop_ids:
            break
        trow = dec.target.forward([tok], tcache)[-1]
        drow = dec.draft.forward([tok], dcache)[-1]
    return {"k_max": REPLAY_K_MAX, "top": REPLAY_TOP, "target": target, "draft": draft}


def make_vectors(export_dir: Path, new_tokens: int, draws: int) -> dict:
    dec = SpecDecoder.load(export_dir)
    m = dec.manifest
    tok = dec.tokenizer
    corpus = []
    for text in CORPUS:
        ids = tok.encode(text, add_special_tokens=False).ids
        # the runtime's decode: control tokens dropped, the non-special added tokens (FIM, tool calls) kept
        corpus.append({"text": text, "ids": ids, "decoded": decode(tok, ids, skip_special_tokens=False),
                       "decoded_skip_special": decode(tok, ids)})
    control = {t: tok.token_to_id(t) for t in ("<|fim_prefix|>", "<|file_sep|>", "<|im_start|>", "<|im_end|>",
                                               "<tool_call>")
               if tok.token_to_id(t) is not None}
    chats = []
    for messages in MESSAGES:
        prompt = dec.template.render(messages) if dec.template else None
        ids = dec.encode(messages=messages) if dec.template else dec.encode(messages[-1]["content"])
        greedy, gaps = plain_greedy(dec, ids, new_tokens)
        chat = {"messages": messages, "prompt": prompt, "ids": ids, "greedy": greedy, "gaps": gaps}
        if len(chats) < REPLAY_CHATS:
            chat["replay"] = replay_record(dec, ids, greedy)
        chats.append(chat)
    # fp32 graphs: one-row and many-row runs agree to ~1e-6, so greedy must match exactly (the tiny random
    # models' top-1/top-2 gaps are ~1e-3, below the near-tie gap meant for int4 kernels)
    exact = m.target.quantization.precision == "fp32"
    return {"export_dir": str(export_dir.resolve()), "new_tokens": new_tokens, "sampling_draws": draws,
            "near_tie_logit_gap": 0.0 if exact else NEAR_TIE_LOGIT_GAP,
            "draft_is_target": m.draft.source_sha256 == m.target.source_sha256 and m.draft.vocab_size == m.target.vocab_size
            and m.draft.quantization == m.target.quantization,
            "export_bytes": sum(f.stat().st_size for f in export_dir.rglob("*") if f.is_file()),
            "context_length": dec.context_length, "stop": sorted(dec.stop_ids), "control_tokens": control,
            "corpus": corpus, "chats": chats}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export_dir", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--new-tokens", type=int, default=24, help="plain greedy tokens per prompt")
    ap.add_argument("--draws", type=int, default=2000, help="seeds of the core's first-token sampling check")
    a = ap.parse_args(argv)
    vectors = make_vectors(a.export_dir, a.new_tokens, a.draws)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(vectors, ensure_ascii=False, indent=1))
    tmp.replace(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
