"""Test vectors for the TypeScript core, written by the Python runtime from one export directory.

    python android_demo/core/scripts/make_vectors.py EXPORT_DIR OUT.json [--new-tokens 24] [--draws 2000]

Writes what ``npm test`` compares the core against (see ``android_demo/core/test/``): the tokenizer's ids and
decoded text for a corpus (code, Chinese, emoji, control tokens), the chat template's rendered prompts and
their ids; per prompt the plain greedy ids with the top two (id, logit) of the plain row at every step (the
cross-implementation rule of :func:`edgespec.bench.evaluate.compare_rows`; the top-1/top-2 ``gaps`` stay as a figure),
and the seeded plain ids of the Gumbel coupling (temperature 0.8, top-p 0.95, a seed per prompt) with the top
two (id, race score) of each step (:func:`edgespec.bench.evaluate.race_scores`); and the coupling's noise E_n(v)
(:mod:`edgespec.core.coupling`) with its exact 53-bit uniform numerators for a few (seed, n, v);
and a replay record: the logits rows the target and the draft
produce on every prefix a greedy speculative loop with K ≤ ``REPLAY_K_MAX`` can ask for, which
``core/test/conformance/replay.ts`` replays so that the core's loop runs without onnxruntime (on Hermes);
and a tree record: the target's rows of a tree verify (the decoder's ancestor mask and per-node position ids),
of the run after its accepted root-to-leaf path is kept by a scattered crop, and of a run whose mask hides
past slots (a draft tree's frontier), so the core's graph feeds match the Python runtime's in every format.
``tests/test_android_core.py`` runs this, then ``npm test``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from edgespec.core.coupling import exponentials, hash32, position_key
from edgespec.engine.decoder import SpecDecoder
from edgespec.bench.evaluate import NEAR_TIE_LOGIT_GAP, plain_row, race_scores
from edgespec.control.kpolicy import FixedK
from edgespec.core.sampling import SamplingParams
from edgespec.io.text import decode

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


SEEDED = {"temperature": 0.8, "top_p": 0.95}  # the seeded plain decoding the core must reproduce
SEEDS = [7, 2**33 + 5, 123456789, 2**52 + 1]  # one per prompt; ≥ 2^32 too (the core takes seeds < 2^53)
NOISE_SEEDS = [0, 42, 2**32 + 7, 2**64 - 1]
NOISE_POSITIONS = [0, 1, 77, 4095, 2**31 + 3]
NOISE_IDS = [0, 1, 2, 511, 4097, 151643, 151664]


def top2(row: np.ndarray) -> list[list]:
    """[[top-1 id, value], [top-2 id, value]] of a row (ties: the lower id), as the core's ``top2``; a value of
    −inf (a race score outside the nucleus) is written as null (JSON has no infinities)."""
    row = np.asarray(row, dtype=np.float64)
    i = int(np.argmax(row))
    rest = row.copy()
    rest[i] = -np.inf
    j = int(np.argmax(rest))
    return [[t, float(row[t]) if np.isfinite(row[t]) else None] for t in (i, j)]


def plain_greedy(dec: SpecDecoder, ids: list[int], n: int) -> tuple[list[int], list[float], list[list]]:
    """Plain greedy ids (stop tokens included, up to ``n``), the top-1 minus top-2 logit at each step, and the
    top two (id, logit) of each step's row (over the ids the tokenizer has, as the core's rows)."""
    dec.reset()
    cache = dec.target.new_cache()
    row = dec.target.forward(ids, cache, keep=1)[-1]
    out, gaps, tops = [], [], []
    for _ in range(n):
        top = np.sort(row)[-2:]
        gaps.append(float(top[1] - top[0]))
        tops.append(top2(row[:dec.width]))
        out.append(int(np.argmax(row)))
        if out[-1] in dec.stop_ids or cache.length + 1 >= dec.context_length:
            break
        row = dec.target.forward(out[-1:], cache)[-1]
    return out, gaps, tops


class _Rows(FixedK):
    """K = 0 (plain steps) keeping each step's logits row."""

    def __init__(self):
        super().__init__(0)
        self.rows = []

    def observe(self, result) -> None:
        self.rows.append(result.logits)


def seeded_plain(dec: SpecDecoder, ids: list[int], n: int, seed: int) -> tuple[list[int], list[list]]:
    """Python's seeded plain decoding (the Gumbel coupling) of ``n`` tokens and the top two (id, race score)
    of the row that chose each token."""
    dec.reset()
    rec = _Rows()
    g = dec.generate(input_ids=ids, proposers=(), policy=rec, max_new_tokens=n, seed=seed, **SEEDED).run()
    assert g.stats.coupling == "gumbel", g.stats.coupling
    score = race_scores(dec, SamplingParams(SEEDED["temperature"], top_p=SEEDED["top_p"]), seed)
    rows = [plain_row(dec, ids, [])] + rec.rows
    dec.reset()
    return g.token_ids, [top2(score(rows[i], len(ids) + i)) for i in range(len(g.token_ids))]


def noise_vectors() -> list[dict]:
    """E_n(v) and the integer m of U_n(v) = (m + 0.5) / 2^53, per (seed, n, v); seeds as decimal strings."""
    out = []
    for seed in NOISE_SEEDS:
        for n in NOISE_POSITIONS:
            b, b2 = position_key(seed, n)
            h = hash32(np.asarray(NOISE_IDS, dtype=np.uint32) ^ np.uint32(0x85A308D3))
            m = (hash32(h ^ np.uint32(b)) >> np.uint32(5)).astype(np.int64) * (1 << 26) + (
                hash32(h ^ np.uint32(b2)) >> np.uint32(6)).astype(np.int64)
            out.append({"seed": str(seed), "n": n, "ids": NOISE_IDS, "key": [b, b2], "numerators": m.tolist(),
                        "e": exponentials(seed, n, np.asarray(NOISE_IDS)).tolist()})
    return out


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
    if dec.draft_model.kept_ids is not None:
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
            chain.append(dec.draft_model.argmax(row))
            row = dec.draft.forward(chain[-1:], dcache)[-1]
            draft[key(chain)] = _top(row[:dec.width])
        dcache.crop(base)
        prefix.append(tok)
        if tok in dec.stop_ids:
            break
        trow = dec.target.forward([tok], tcache)[-1]
        drow = dec.draft.forward([tok], dcache)[-1]
    return {"k_max": REPLAY_K_MAX, "top": REPLAY_TOP, "target": target, "draft": draft}


TREE_PARENTS = [-1, 0, 0, 1, 2, 2, 4]  # node i's parent (-1: the root, the last committed token)
TREE_PATH = [0, 2, 4, 6]  # an accepted root-to-leaf path (node indices)
TREE_HIDDEN = [1, 4]  # past slots the frontier run's mask hides


def tree_record(dec: SpecDecoder, ids: list[int]) -> dict:
    """The target's rows (top ``REPLAY_TOP`` of each, :func:`_top`) for prompt ``ids`` (≥ 6 tokens): a tree
    verify as :meth:`SpecDecoder._verify` feeds it (``last`` = the prompt's last token and the nodes, the
    ancestor mask, positions L + depth; node tokens: the prompt's first tokens), then
    ``crop(L + 1, keep=TREE_PATH rows)`` and a two-token causal run after it; and, on a fresh cache, a
    three-token run after the prompt whose mask hides the past slots ``TREE_HIDDEN``."""
    from edgespec.core.token_tree import TokenTree

    lm, width = dec.target, dec.width
    tree = TokenTree()
    for j, par in enumerate(TREE_PARENTS):
        tree.add(par, ids[j % len(ids)])
    cache = lm.new_cache()
    lm.forward(ids[:-1], cache)
    L, n = cache.length, len(tree)
    mask = np.ones((1, 1, n + 1, L + n + 1), dtype=bool)
    mask[0, 0, :, L:] = tree.ancestors_mask()
    pos = L + np.array([0] + tree.depth, dtype=np.int64)
    rows = lm.forward([ids[-1]] + tree.tokens, cache, pos, mask)
    cache.crop(L + 1, keep=[L + 1 + i for i in TREE_PATH])
    after = [ids[1], ids[2]]
    after_rows = lm.forward(after, cache)
    cache = lm.new_cache()
    lm.forward(ids, cache)
    p = cache.length
    hidden = np.ones((1, 1, 3, p + 3), dtype=bool)
    hidden[0, 0, :, TREE_HIDDEN] = False
    hidden[0, 0, :, p:] = np.tril(np.ones((3, 3), dtype=bool))
    frontier = ids[3:6]
    frontier_rows = lm.forward(frontier, cache, mask=hidden)
    return {"parents": TREE_PARENTS, "tokens": tree.tokens, "depth": tree.depth,
            "rows": [_top(r[:width]) for r in rows], "path": TREE_PATH, "after": after,
            "after_rows": [_top(r[:width]) for r in after_rows], "hidden": TREE_HIDDEN, "frontier": frontier,
            "frontier_rows": [_top(r[:width]) for r in frontier_rows]}


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
        greedy, gaps, tops = plain_greedy(dec, ids, new_tokens)
        seed = SEEDS[len(chats) % len(SEEDS)]
        seeded, seeded_tops = seeded_plain(dec, ids, new_tokens, seed)
        chat = {"messages": messages, "prompt": prompt, "ids": ids, "greedy": greedy, "gaps": gaps,
                "greedy_top2": tops, "seed": seed, "seeded": seeded, "seeded_top2": seeded_tops}
        if len(chats) < REPLAY_CHATS:
            chat["replay"] = replay_record(dec, ids, greedy)
        chats.append(chat)
    # fp32 graphs: one-row and many-row runs agree to ~1e-6, so greedy and seeded ids must match exactly (the
    # tiny random models' top-1/top-2 gaps are ~1e-3); int4 kernels differ more: the verify-path rules decide
    exact = m.target.quantization.precision == "fp32"
    return {"export_dir": str(export_dir.resolve()), "new_tokens": new_tokens, "sampling_draws": draws,
            "exact": exact, "near_tie_logit_gap": NEAR_TIE_LOGIT_GAP, "seeded_sampling": SEEDED,
            "noise": noise_vectors(),
            "draft_is_target": m.draft.source_sha256 == m.target.source_sha256 and m.draft.vocab_size == m.target.vocab_size
            and m.draft.quantization == m.target.quantization,
            "export_bytes": sum(f.stat().st_size for f in export_dir.rglob("*") if f.is_file()),
            "context_length": dec.context_length, "stop": sorted(dec.stop_ids), "control_tokens": control,
            "corpus": corpus, "chats": chats, "tree": tree_record(dec, chats[0]["ids"])}


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
    tmp.write_text(json.dumps(vectors, ensure_ascii=False, indent=1, allow_nan=False))
    tmp.replace(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
