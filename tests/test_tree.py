"""Tree speculation: greedy identity, the multi-candidate sampling rule's distribution, the main path."""

import numpy as np
import pytest

import edgespec.engine.decoder as decoder_mod
from edgespec.engine.decoder import SpecDecoder
from edgespec.core.sampling import SamplingParams, probs, sample
from edgespec.core.sampling import verify_tree
from edgespec.core.token_tree import TokenTree, TreeShape, pick_children


def _tv(a, b):
    return 0.5 * np.abs(a - b).sum()


def test_tree_sampling_matches_target_distribution():
    """First and second emitted tokens over 50,000 seeded draws of a 3-way/2-way tree (TV < 0.01)."""
    rng = np.random.default_rng(7)
    v, draws, root = 6, 50_000, 2
    sp = SamplingParams(0.9, top_p=0.95)
    p_of = probs(rng.normal(size=(v, v)) * 1.3, sp)
    q_of = probs(rng.normal(size=(v, v)) * 1.3, sp)  # a poor draft: rejections are common
    first, second = np.zeros(v), np.zeros(v)
    for _ in range(draws):
        tree = TokenTree()
        tree.q[-1] = q_of[root]
        for x in pick_children(q_of[root], 3, sp, rng):
            c = tree.add(-1, x)
            tree.q[c] = q_of[x]
            for y in pick_children(q_of[x], 2, sp, rng):
                tree.add(c, y)
        p_rows = np.stack([p_of[root]] + [p_of[t] for t in tree.tokens])
        path, nxt = verify_tree(tree, p_rows, sp, rng)
        out = [tree.tokens[i] for i in path] + [nxt]
        if len(out) < 2:
            out.append(sample(p_of[out[0]], rng))
        first[out[0]] += 1
        second[out[1]] += 1
    assert _tv(first / draws, p_of[root]) < 0.01
    assert _tv(second / draws, p_of[root] @ p_of) < 0.01


def test_greedy_tree_follows_argmax():
    tree = TokenTree()
    a = tree.add(-1, 3)
    tree.add(-1, 1)
    tree.add(a, 0)
    p = np.zeros((4, 5))
    p[0, 3] = p[1, 0] = p[2, 4] = p[3, 2] = 1.0  # root → 3 (node 0), node 0 → 0 (node 2), node 2 → bonus 2
    path, nxt = verify_tree(tree, p, SamplingParams(0), np.random.default_rng(0))
    assert path == [0, 2] and nxt == 2
    m = tree.ancestors_mask()
    assert m[3].tolist() == [True, True, False, True] and m[2].tolist() == [True, False, True, False]


@pytest.fixture(scope="module")
def dec(export_each_format):
    return SpecDecoder.load(export_each_format)


@pytest.mark.parametrize("budget", [2, 5, 8, 12])
@pytest.mark.parametrize("prompt", ["def add(a, b):", "The quick brown", "class Node:\n"])
def test_tree_greedy_equals_target_greedy(dec, budget, prompt):
    ids = dec.encode(prompt)
    dec.reset()
    plain = dec.generate(input_ids=ids, max_new_tokens=50, proposers=()).run()
    dec.reset()
    g = dec.generate(input_ids=ids, max_new_tokens=50, proposers=("tree",), n_nodes=budget).run()
    assert g.token_ids == plain.token_ids
    assert g.stats.proposers["tree"].rounds > 0 and g.stats.accepted <= g.stats.proposed


def test_tree_sampling_on_the_tiny_pair_follows_p(dec):
    from edgespec.bench.evaluate import first_token_check

    r = first_token_check(dec, dec.encode("def add(a, b):"), SamplingParams(0.8, top_p=0.95), draws=2000, k=6,
                          tree=True)
    assert r["tv"] < 3 * r["tv_noise"] + 0.01


def test_draft_equal_to_target_accepts_the_whole_main_path(self_export_each_format, monkeypatch):
    d = SpecDecoder.load(self_export_each_format)
    seen = []
    real_verify = decoder_mod.verify_tree

    def spy(tree, p_rows, sp, rng):
        path, nxt = real_verify(tree, p_rows, sp, rng)
        main, node = [], -1
        while tree.children.get(node):
            node = tree.children[node][0]  # the draft's top choice at each level
            main.append(node)
        seen.append((path, main))
        return path, nxt

    monkeypatch.setattr(decoder_mod, "verify_tree", spy)
    ids = d.encode("def add(a, b):")
    d.reset()
    plain = d.generate(input_ids=ids, max_new_tokens=60, proposers=()).run()
    d.reset()
    g = d.generate(input_ids=ids, max_new_tokens=60, proposers=("tree",), n_nodes=8).run()
    assert g.token_ids == plain.token_ids
    assert seen and all(path == main for path, main in seen)


def test_tree_shape_for_budget():
    s = TreeShape.for_budget(8)
    assert s.budget == 8 and s.depth >= 2 and s.branch >= 2
