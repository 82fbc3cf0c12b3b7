"""The GGUF SentencePiece BPE tokenizer (``tokenizer.ggml.model == "llama"``, Gemma 3's) against an independent
Python copy of llama.cpp's algorithm (``llm_tokenizer_spm_session`` and ``tokenizer_st_partition`` in
``llama-vocab.cpp``): added tokens cut out of the raw text longest first, then spaces written "▁" and the adjacent
pair whose joined text is the best-scoring token merged until none is (ties: the leftmost), characters outside the
vocabulary as ``<0xNN>`` bytes. A tiny random vocabulary written as a GGUF header; the real Gemma 3 vocabulary
is checked against llama.cpp itself in tests/test_gemma3_real.py."""

from __future__ import annotations

import heapq
from pathlib import Path

import numpy as np
import pytest

from edgespec.export.tokenizer import GGUF_CONTROL, GGUF_USER_DEFINED, from_gguf, spm_merges

NORMAL, BYTE = 1, 6


def spm_reference(text: str, tokens: list[str], scores: list[float], types: list[int]) -> list[int]:
    """llama.cpp's SPM tokenization of ``text`` (no BOS; no space prefix, as Gemma 3's header says)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    added = sorted((i for i, t in enumerate(types) if t in (GGUF_CONTROL, GGUF_USER_DEFINED)),
                   key=lambda i: -len(tokens[i]))
    fragments: list[str | int] = [text]
    for i in added:  # tokenizer_st_partition: each added token, longest first, over the raw fragments left
        out = []
        for f in fragments:
            while isinstance(f, str) and tokens[i] in f:
                before, f = f.split(tokens[i], 1)
                out += [before, i] if before else [i]
            if f != "":
                out.append(f)
        fragments = out
    ids: list[int] = []
    for f in fragments:
        ids += [f] if isinstance(f, int) else _spm(f.replace(" ", "▁"), vocab, scores)
    return ids


def _spm(text: str, vocab: dict, scores: list[float]) -> list[int]:
    syms = list(text)
    nxt, prev = list(range(1, len(syms) + 1)), list(range(-1, len(syms) - 1))
    heap: list = []

    def bigram(left: int, right: int) -> None:
        if left < 0 or right >= len(syms):
            return
        i = vocab.get(syms[left] + syms[right])
        if i is not None:  # highest score first, then the leftmost
            heapq.heappush(heap, (-scores[i], left, len(syms[left]) + len(syms[right]), right))

    for k in range(1, len(syms)):
        bigram(k - 1, k)
    while heap:
        _, left, size, right = heapq.heappop(heap)
        if not syms[left] or not syms[right] or len(syms[left]) + len(syms[right]) != size:
            continue  # a stale pair: one side was merged since
        syms[left], syms[right] = syms[left] + syms[right], ""
        nxt[left] = nxt[right]
        if nxt[left] < len(syms):
            prev[nxt[left]] = left
        bigram(prev[left], left)
        bigram(left, nxt[left])
    ids = []
    k = 0
    while k < len(syms):
        s = syms[k]
        ids += [vocab[s]] if s in vocab else [vocab[f"<0x{b:02X}>"] for b in s.encode()]
        k = nxt[k]
    return ids


def tiny_vocab(seed: int = 0, n_merged: int = 300):
    """(tokens, scores, types): control <pad> <eos> <bos> <unk> <start_of_turn>, user-defined "\\n", "  ",
    "\\t\\t", the 256 byte tokens, single characters, then tokens made of two earlier ones with random
    SentencePiece scores (-rank)."""
    rng = np.random.default_rng(seed)
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "\n", "  ", "\t\t"]
    types = [GGUF_CONTROL] * 5 + [GGUF_USER_DEFINED] * 3
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [BYTE] * 256
    chars = list("abcdeo▁xy(){}:=.,") + ["世", "界"]
    tokens += chars
    types += [NORMAL] * len(chars)
    pool = list(chars)
    while len(pool) < len(chars) + n_merged:
        t = pool[rng.integers(len(pool))] + pool[rng.integers(len(pool))]
        if t not in pool and len(t) <= 6:
            pool.append(t)
    merged = pool[len(chars):]
    tokens += merged
    types += [NORMAL] * len(merged)
    order = rng.permutation(len(merged))  # scores unrelated to the order the tokens were made in
    scores = [-1000.0] * 8 + [0.0] * 256 + [-float(len(merged) + k) for k in range(len(chars))]
    scores += [-float(order[k]) for k in range(len(merged))]
    return tokens, scores, types


def write_header(path: Path, tokens, scores, types, add_bos: bool = True) -> Path:
    """A tensor-free GGUF with Gemma 3's tokenizer keys."""
    import gguf

    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(add_bos)
    w.add_add_space_prefix(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _load(path: Path):
    from gguf import GGUFReader

    return from_gguf(GGUFReader(str(path)), path)


TEXTS = ["abc", "a b  c", "  lead", "trail  ", "x = (a)\n\n\t\tb", "世界 é ü", "<start_of_turn>ab<eos>", "", " ",
         "aaaa bbbb cccc", "é" * 3, "▁a▁"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tokens, scores, types = tiny_vocab()
    path = write_header(tmp_path_factory.mktemp("spm") / "tok.gguf", tokens, scores, types)
    return _load(path), tokens, scores, types


def test_ids_equal_llamacpps_algorithm(tiny):
    info, tokens, scores, types = tiny
    rng = np.random.default_rng(1)
    alphabet = list("abcdeoxy(){}:=., \n\t世界é") + ["  ", "<bos>", "<start_of_turn>"]
    texts = TEXTS + ["".join(rng.choice(alphabet, size=rng.integers(1, 40))) for _ in range(400)]
    for text in texts:
        assert info.tokenizer.encode(text) == spm_reference(text, tokens, scores, types), repr(text)


def test_bos_added_decoding_undoes_spaces_and_bytes(tiny):
    info, tokens, *_ = tiny
    tok = info.tokenizer.backend_tokenizer
    assert (info.bos, info.eos, info.pad) == (2, 1, 0)
    for text in TEXTS:
        ids = info.tokenizer.encode(text, add_special_tokens=True)
        assert ids[:1] == [2] and ids[1:] == info.tokenizer.encode(text)
        if "▁" not in text:  # a literal "▁" comes back as a space (SentencePiece's own behaviour)
            assert tok.decode(ids, skip_special_tokens=True) == text.replace("<start_of_turn>", "").replace("<eos>", "")
    assert info.tokenizer.encode("é") == [tokens.index("<0xC3>"), tokens.index("<0xA9>")]
    assert info.tokenizer.encode("<start_of_turn>\n  ") == [4, 5, 6]  # control and user-defined: one token each


def test_no_bos_when_the_header_says_so(tmp_path):
    tokens, scores, types = tiny_vocab()
    info = _load(write_header(tmp_path / "t.gguf", tokens, scores, types, add_bos=False))
    assert info.tokenizer.encode("ab", add_special_tokens=True) == info.tokenizer.encode("ab")


def test_merges_rank_every_split_by_the_joined_tokens_score():
    tokens = ["a", "b", "c", "ab", "bc", "abc"]
    scores = [0.0, 0.0, 0.0, -2.0, -1.0, -3.0]  # bc before ab; abc from (a, bc) and (ab, c)
    assert spm_merges(tokens, scores) == [("b", "c"), ("a", "b"), ("a", "bc"), ("ab", "c")]
