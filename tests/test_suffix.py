"""The suffix proposer (SuffixDecoding): the index and its trie, greedy identity, the sampling rule's
distribution on its fixed-frequency q, earlier conversations as a corpus."""

import numpy as np
import pytest

from edgespec.control.adaptive import AdaptiveK, CostModel
from edgespec.engine.decoder import SpecDecoder
from edgespec.core.sampling import SamplingParams, probs, verify_tree
from edgespec.draft.suffix import SuffixIndex, SuffixTree, _resample, _trie


def test_longest_suffix_wins_and_the_trie_is_scored_by_frequency():
    #         0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15
    tokens = [7, 1, 2, 3, 4, 5, 7, 1, 2, 3, 4, 6, 8, 1, 2, 3]
    tree, counts, n = SuffixTree().candidates(tokens, cap=8)
    assert n == 3  # [1, 2, 3] occurred twice; [8, 1, 2, 3] never before
    assert tree.tokens[0] == 4 and tree.parents[0] == -1  # both continuations start with 4 …
    assert counts[-1] == {4: 2}
    assert sorted(counts[0].items()) == [(5, 1), (6, 1)]  # … then branch
    assert all(par < i for i, par in enumerate(tree.parents))  # breadth-first: parents first
    small, _, _ = SuffixTree().candidates(tokens, cap=2)
    assert len(small) == 2 and small.tokens[0] == 4


def test_trie_keeps_the_best_scored_connected_nodes():
    tree, counts = _trie([[1, 2, 3], [1, 2, 4], [1, 5]], budget=3)
    assert tree.tokens == [1, 2, 5] and tree.parents == [-1, 0, 0]  # (1) 3×, (1, 2) 2×, then the shorter tie
    assert counts[-1] == {1: 3} and counts[0] == {2: 2, 5: 1}


def test_index_extends_incrementally():
    idx = SuffixIndex(min_ngram=2, max_ngram=3)
    idx.extend([1, 2, 3])
    idx.extend([1, 2])
    assert idx.follow[(1, 2)] == [2, 5] and idx.continuations((1, 2), 4, 8) == [[3, 1, 2]]


def test_resampled_suffix_tree_keeps_the_target_distribution():
    """Children drawn without replacement from the frequency q, then the multi-candidate rule: the first
    emitted token follows p (20,000 seeded draws, TV < 0.015)."""
    rng = np.random.default_rng(3)
    v, draws = 6, 20_000
    sp = SamplingParams(1.0)
    p_root = probs(rng.normal(size=v) * 1.5, sp)
    tree, counts = _trie([[1, 2], [1, 3], [4], [1, 2], [5]], budget=5)
    first = np.zeros(v)
    for _ in range(draws):
        t = _resample(tree, counts, v, sp, rng)
        p_rows = np.stack([p_root] + [probs(rng.normal(size=v), sp) for _ in t.tokens])
        path, nxt = verify_tree(t, p_rows, sp, rng)
        first[([t.tokens[i] for i in path] + [nxt])[0]] += 1
    assert 0.5 * np.abs(first / draws - p_root).sum() < 0.015


@pytest.fixture(scope="module")
def dec(tiny_export):
    return SpecDecoder.load(tiny_export, load_draft=False)


@pytest.mark.parametrize("prompt", ["def add(a, b):\n    return a + b\n\ndef add(a, b):", "The quick brown"])
def test_suffix_greedy_equals_target_greedy(dec, prompt):
    ids = dec.encode(prompt)
    dec.reset()
    plain = dec.generate(input_ids=ids, max_new_tokens=48, proposers=()).run()
    dec.reset()
    g = dec.generate(input_ids=ids, max_new_tokens=48, proposers=("suffix",), n_nodes=8).run()
    assert g.token_ids == plain.token_ids
    dec.reset()
    pol = AdaptiveK(CostModel([1.0 + 0.1 * n for n in range(8)], draft_ms=0.05))
    g = dec.generate(input_ids=ids, max_new_tokens=48, policy=pol, proposers=("suffix",)).run()
    assert g.token_ids == plain.token_ids and g.stats.proposers["suffix"].rounds > 0


def test_an_earlier_answer_is_a_corpus_after_a_reset(dec):
    """The same question again after a reset: the first answer, archived, is proposed and accepted."""
    ids = dec.encode("The quick brown")
    dec.reset()
    first = dec.generate(input_ids=ids, max_new_tokens=32, proposers=()).run()
    dec.reset()
    g = dec.generate(input_ids=ids, max_new_tokens=32, proposers=("suffix",), n_nodes=12).run()
    assert g.token_ids == first.token_ids
    s = g.stats.proposers["suffix"]
    assert s.accepted >= 16  # most of the answer came from the archived first answer


def test_cli_suffix_mode_and_flag_print_the_greedy_ids(tiny_export, home):
    import json
    import os
    import subprocess
    import sys

    d = SpecDecoder.load(tiny_export, load_draft=False)
    want = d.generate("def f(x):\n    return x\n\ndef f(", max_new_tokens=16, proposers=()).run()
    for flags in (["--mode", "suffix"], ["--suffix", "--lookup"]):
        r = subprocess.run([sys.executable, "-m", "edgespec.cli", "generate", str(tiny_export), "--raw", "--json",
                            "--max-new-tokens", "16", *flags], input="def f(x):\n    return x\n\ndef f(",
                           capture_output=True, text=True, env=dict(os.environ, EDGESPEC_HOME=str(home)), timeout=300)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["token_ids"] == want.token_ids
