"""Graph format 3 on the tiny models: the in-place KV buffer, fused attention, and agreement with format 2."""

import json
import shutil

import numpy as np
import onnx
import pytest

from edgespec.errors import EdgespecError
from edgespec.io.manifest import load_manifest
from edgespec.io.onnx_model import KVCache, OnnxLM, SharedKVCache


@pytest.fixture(scope="module")
def exports(home, tiny_dirs, tmp_path_factory):
    """{2: format-2 export, 3: format-3 export} of the same tiny qwen2 pair (fp32)."""
    from conftest import _pair

    return {f: _pair(tmp_path_factory, tiny_dirs, f"f{f}", "draft", f) for f in (2, 3)}


@pytest.fixture(scope="module")
def lms(exports):
    return {f: OnnxLM(load_manifest(d).target, d) for f, d in exports.items()}


IDS = [int(i) for i in np.random.default_rng(0).integers(3, 400, 48)]


def test_format3_graph_uses_fused_ops_and_a_shared_buffer(exports):
    m = load_manifest(exports[3])
    assert m.target.graph_format == 3 and m.draft.graph_format == 3
    assert load_manifest(exports[2]).target.graph_format == 2
    g = onnx.load(str(exports[3] / m.target.path), load_external_data=False).graph
    ops = {n.op_type for n in g.node}
    assert {"GroupQueryAttention", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"} <= ops
    gqa = [n for n in g.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == m.target.num_layers and all(n.input[9] == "position_ids" for n in gqa)  # rotary inside
    past = {i.name: i for i in g.input}["past_key_values.0.key"].type.tensor_type.shape.dim
    present = {o.name: o for o in g.output}["present.0.key"].type.tensor_type.shape.dim
    assert past[2].dim_param == present[2].dim_param == "capacity"  # same buffer length, not P vs P+T
    v = m.target.validation["reference"]
    assert max(v["max_abs_logit_error"], v["max_abs_past_vs_full"]) < 1e-4


def test_in_place_cache_after_rollback_equals_full_recompute(lms):
    lm = lms[3]
    full = lm.forward(IDS, lm.new_cache())
    cache = lm.new_cache(capacity=8)  # small: it must grow (by doubling) and stay correct
    assert isinstance(cache, SharedKVCache)
    lm.forward(IDS[:20], cache)
    buffers = list(cache.buffers)
    lm.forward(IDS[20:23], cache)  # a "verify" of 3 rows ...
    assert all(a is b for a, b in zip(buffers, cache.buffers))  # ... written in place, no new tensors
    cache.crop(21)  # ... of which one is accepted: rollback is a length change
    assert cache.length == 21 and all(a is b for a, b in zip(buffers, cache.buffers))
    out = lm.forward(IDS[21:30], cache)
    np.testing.assert_allclose(out, full[21:30], atol=1e-5)
    cache.crop(10)
    out = lm.forward(IDS[10:48], cache)  # past the first capacity
    assert cache.capacity >= 48
    np.testing.assert_allclose(out, full[10:48], atol=1e-5)


def test_scattered_accepted_path_moves_only_its_rows(lms):
    """A tree's accepted path (slots 2 and 4 of 5 candidates) is moved down in the buffer, then decoding
    continues as if the path had been fed as a chain."""
    lm = lms[3]
    prefix, cand = IDS[:12], [7, 8, 9, 10, 11]
    cache = lm.new_cache()
    lm.forward(prefix, cache)
    p = cache.length
    mask = np.zeros((1, 1, 5, p + 5), dtype=bool)
    mask[..., :p] = True
    parent = {0: None, 1: None, 2: 0, 3: 1, 4: 2}  # two branches: 0→2→4 and 1→3
    depth = {}
    for j in range(5):
        node, depth[j] = j, 0
        while node is not None:
            mask[0, 0, j, p + node] = True
            node = parent[node]
            depth[j] += 1
    pos = np.array([p + depth[j] - 1 for j in range(5)])
    tree = lm.forward(cand, cache, position_ids=pos, mask=mask)
    cache.crop(p, keep=[p + 0, p + 2, p + 4])
    nxt = lm.forward([5], cache)
    chain = lm.forward(prefix + [cand[0], cand[2], cand[4], 5], lm.new_cache())
    np.testing.assert_allclose(tree[[0, 2, 4]], chain[p:p + 3], atol=1e-5)
    np.testing.assert_allclose(nxt[0], chain[-1], atol=1e-5)


def test_tree_mask_through_gqa_equals_format2_logits(lms):
    """The same random tree mask and positions through the fused GroupQueryAttention and the traced graph."""
    rng = np.random.default_rng(1)
    prefix, n = IDS[:16], 8
    parent = [-1] + [int(rng.integers(-1, j)) for j in range(1, n)]  # each node's parent precedes it
    rows = {}
    for f, lm in lms.items():
        cache = lm.new_cache()
        lm.forward(prefix, cache)
        p = cache.length
        mask = np.zeros((1, 1, n, p + n), dtype=bool)
        mask[..., :p] = True
        pos = np.zeros(n, dtype=np.int64)
        for j in range(n):
            node, d = j, 0
            while node != -1:
                mask[0, 0, j, p + node] = True
                node, d = parent[node], d + 1
            pos[j] = p + d - 1
        rows[f] = lm.forward(IDS[16:16 + n], cache, position_ids=pos, mask=mask)
    assert np.abs(rows[3] - rows[2]).max() < 1e-4


def test_format2_and_format3_agree_on_a_long_chain(lms):
    a = lms[2].forward(IDS, lms[2].new_cache())
    b = lms[3].forward(IDS, lms[3].new_cache())
    assert np.abs(a - b).max() < 1e-4
    assert isinstance(lms[2].new_cache(), KVCache)


def test_cache_past_the_context_length_is_a_clear_error(lms):
    lm = lms[3]
    cache = lm.new_cache()
    with pytest.raises(EdgespecError, match="longer than the model"):
        cache.reserve(lm.spec.context_length + 1)


def _edited_copy(src, dst, edit):
    shutil.copytree(src, dst)
    raw = json.loads((dst / "edgespec.json").read_text())
    edit(raw)
    (dst / "edgespec.json").write_text(json.dumps(raw))
    return dst


def test_unknown_or_mismatched_graph_format_is_a_clear_error(exports, tmp_path):
    newer = _edited_copy(exports[3], tmp_path / "newer", lambda r: r["target"].update(graph_format=5))
    with pytest.raises(EdgespecError, match="graph formats up to 4"):
        load_manifest(newer)
    lying = _edited_copy(exports[2], tmp_path / "lying", lambda r: r["target"].update(graph_format=3))
    m = load_manifest(lying)
    with pytest.raises(EdgespecError, match="not a format-3 graph"):
        OnnxLM(m.target, lying)
