"""Graph format 4 on the tiny models: grouped attention over per-KV-head buffers bound in place, against format 3.

Every comparison is fp32 logits of the same tiny qwen2 target exported both ways (4 query heads over 2 KV
heads, so each KV head serves a group of 2): prefill, one-token steps, K+1-row chain verifies with rollbacks,
tree verifies (the target's ancestor mask and the draft's frontier mask, which hides past slots), scattered
accepted paths and buffer growth, all within 1e-4.
"""

import json
import shutil

import numpy as np
import onnx
import pytest

from edgespec.errors import EdgespecError
from edgespec.io.grouped_kv import WINDOW, GroupedKVCache, widen_mask
from edgespec.io.manifest import load_manifest
from edgespec.io.onnx_model import OnnxLM, causal_mask

TOL = 1e-4


@pytest.fixture(scope="module")
def exports(home, tiny_dirs, tmp_path_factory):
    """{3: format-3 export, 4: format-4 export} of the same tiny qwen2 pair (fp32)."""
    from conftest import _pair

    return {f: _pair(tmp_path_factory, tiny_dirs, f"g{f}", "draft", f) for f in (3, 4)}


@pytest.fixture(scope="module")
def lms(exports):
    return {f: OnnxLM(load_manifest(d).target, d) for f, d in exports.items()}


IDS = [int(i) for i in np.random.default_rng(0).integers(3, 400, 160)]


def _tree_mask(parent: list[int], p: int, past_visible: np.ndarray | None = None):
    """bool (1, 1, n, p+n) ancestor mask and positions int64 (n,) of a tree (``parent[j]`` < j, -1 = root)."""
    n = len(parent)
    mask = np.zeros((1, 1, n, p + n), dtype=bool)
    mask[..., :p] = True if past_visible is None else past_visible
    pos = np.zeros(n, dtype=np.int64)
    for j in range(n):
        node, d = j, 0
        while node != -1:
            mask[0, 0, j, p + node] = True
            node, d = parent[node], d + 1
        pos[j] = p + d - 1
    return mask, pos


def test_format4_graph_reads_each_kv_head_in_place_without_a_concat_of_the_past(exports):
    m = load_manifest(exports[4])
    assert m.target.graph_format == 4 and m.draft.graph_format == 4
    g = onnx.load(str(exports[4] / m.target.path), load_external_data=False).graph
    ops = {n.op_type for n in g.node}
    assert "GroupQueryAttention" not in ops and {"RotaryEmbedding", "FusedMatMul", "Softmax"} <= ops
    kv, hd, layers = m.target.num_kv_heads, m.target.head_dim, m.target.num_layers
    past = [i for i in g.input if i.name.startswith("past_key_values.")]
    assert len(past) == 2 * layers * kv
    dims = past[0].type.tensor_type.shape.dim
    assert len(dims) == 2 and dims[1].dim_value == hd  # one (W, head_dim) block per KV head
    for n in g.node:  # the past only enters score and output MatMuls: never concatenated, sliced or copied
        if any(x.startswith("past_key_values.") for x in n.input):
            assert n.op_type in ("FusedMatMul", "MatMul", "Shape"), n.op_type
    assert [o.name for o in g.output] == ["logits", "present"]
    v = m.target.validation["fp32"]
    assert max(v["max_abs_prefill"], v["max_abs_with_past"], v["max_abs_past_vs_full"]) < TOL


def test_prefill_and_one_token_steps_equal_format3(lms):
    c3, c4 = lms[3].new_cache(), lms[4].new_cache()
    assert isinstance(c4, GroupedKVCache)
    a, b = lms[3].forward(IDS[:40], c3), lms[4].forward(IDS[:40], c4)
    assert np.abs(a - b).max() < TOL
    for tok in IDS[40:110]:  # crosses the bound window's edges (WINDOW rows) at 64
        a, b = lms[3].forward([tok], c3), lms[4].forward([tok], c4)
        assert np.abs(a - b).max() < TOL
    assert c4.length == 110
    for t3, t4 in zip(c3.tensors, c4.tensors):  # the cached rows themselves: same K (after rotary) and V
        assert np.abs(np.asarray(t3) - np.asarray(t4)).max() < TOL


def test_chain_verifies_with_rollbacks_and_growth_equal_format3(lms):
    """K+1-row verifies of varying K, each rolled back to a random accepted prefix; the format-4 buffer starts
    at 8 positions and must double several times."""
    rng = np.random.default_rng(3)
    c3, c4 = lms[3].new_cache(), lms[4].new_cache(capacity=8)
    lms[3].forward(IDS[:5], c3), lms[4].forward(IDS[:5], c4)
    caps = {c4.capacity}
    while c4.length < 140:
        n = c4.length
        k = int(rng.integers(1, 6))
        rows = [int(x) for x in rng.integers(3, 400, k + 1)]
        a, b = lms[3].forward(rows, c3), lms[4].forward(rows, c4)
        assert np.abs(a - b).max() < TOL
        accepted = int(rng.integers(0, k + 1))
        c3.crop(n + 1 + accepted), c4.crop(n + 1 + accepted)
        caps.add(c4.capacity)
    assert len(caps) >= 4  # 8 → 16 → … → 256: grown, and still equal
    full = lms[3].forward(IDS[:60], lms[3].new_cache())
    c4.crop(5)  # far back to the prompt: stale rows stay in the bound window, masked off
    out = lms[4].forward(IDS[5:60], c4)
    assert np.abs(out - full[5:60]).max() < TOL


def test_tree_verify_and_scattered_path_equal_format3(lms):
    rng = np.random.default_rng(1)
    n = 8
    parent = [-1] + [int(rng.integers(-1, j)) for j in range(1, n)]
    rows, nxt = {}, {}
    for f, lm in lms.items():
        cache = lm.new_cache()
        lm.forward(IDS[:70], cache)
        mask, pos = _tree_mask(parent, cache.length)
        rows[f] = lm.forward(IDS[70:70 + n], cache, position_ids=pos, mask=mask)
        path, node = [], n - 1
        while node != -1:
            path.insert(0, 70 + node)
            node = parent[node]
        cache.crop(70, keep=path)  # the accepted root-to-leaf path: only its rows move
        nxt[f] = lm.forward([5, 6], cache)
    assert np.abs(rows[4] - rows[3]).max() < TOL
    assert np.abs(nxt[4] - nxt[3]).max() < TOL


def test_mask_hiding_past_slots_equals_format3(lms):
    """The draft's tree frontier runs with past slots hidden (siblings fed earlier): the past block of the
    mask is honoured, not assumed all True."""
    hidden = np.ones(30, dtype=bool)
    hidden[[4, 17, 25, 29]] = False
    out = {}
    for f, lm in lms.items():
        cache = lm.new_cache()
        lm.forward(IDS[:30], cache)
        mask, pos = _tree_mask([-1, 0, 0], 30, hidden)
        out[f] = lm.forward(IDS[30:33], cache, position_ids=pos, mask=mask)
    assert np.abs(out[4] - out[3]).max() < TOL


def test_logits_keep_and_prefix_cache_load(lms):
    lm = lms[4]
    full = lm.forward(IDS[:20], lm.new_cache())
    last = lm.forward(IDS[:20], lm.new_cache(), keep=2)
    assert last.shape == (2, full.shape[1]) and np.abs(last - full[-2:]).max() < TOL
    src = lm.new_cache()
    lm.forward(IDS[:12], src)
    dst = lm.new_cache(capacity=4)
    dst.load([np.array(t) for t in src.tensors])  # as the exporter's validation and a prefix cache do
    assert np.abs(lm.forward(IDS[12:20], dst) - full[12:20]).max() < TOL


def test_window_is_rebound_only_when_the_past_leaves_it(lms):
    lm = lms[4]
    cache = lm.new_cache()
    lm.forward(IDS[:3], cache)
    io = cache.bindings[id(lm.session)]
    assert io[1] == 0  # empty past: a zero-row window
    lm.forward([7], cache)
    assert io[1] == WINDOW
    for tok in IDS[:WINDOW - 4]:
        lm.forward([tok], cache)
    assert io[1] == WINDOW and cache.length == WINDOW
    lm.forward([7], cache)
    assert io[1] == WINDOW
    lm.forward([7], cache)
    assert io[1] == 2 * WINDOW


def test_widen_mask_hides_the_window_rows_past_the_cache():
    m = causal_mask(3, 2)
    w = widen_mask(m, 3, 6)
    assert w.shape == (1, 1, 2, 8)
    assert w[0, 0, :, :3].all() and not w[0, 0, :, 3:6].any()
    assert np.array_equal(w[0, 0, :, 6:], m[0, 0, :, 3:])
    assert widen_mask(m, 3, 3) is m


def test_a_format4_manifest_on_a_format3_graph_is_a_clear_error(exports, tmp_path):
    lying = tmp_path / "lying"
    shutil.copytree(exports[3], lying)
    raw = json.loads((lying / "edgespec.json").read_text())
    raw["target"]["graph_format"] = 4
    (lying / "edgespec.json").write_text(json.dumps(raw))
    with pytest.raises(EdgespecError, match="not a format-4 graph"):
        OnnxLM(load_manifest(lying).target, lying)


def test_format4_takes_a_head_size_format3_cannot(home, tiny_dirs, tmp_path):
    """Head size 8 (not a multiple of 16, which GroupQueryAttention needs): format 4 exports it, and its
    logits are the traced format-2 graph's."""
    from edgespec.export import ExportOptions, export_pair
    from tinymodels import build_model

    odd = build_model(tmp_path / "odd", "qwen2", seed=5, layers=3, hidden=32, vocab=480)
    lms = {}
    for f in (2, 4):
        o = ExportOptions(precision="fp32", graph_format=f)
        d = export_pair(str(tiny_dirs["target"]), str(odd), tmp_path / f"f{f}", o, o)
        m = load_manifest(d)
        assert m.draft.graph_format == f and m.draft.head_dim == 8
        lms[f] = OnnxLM(m.draft, d)
    ids = IDS[:30]
    c2, c4 = lms[2].new_cache(), lms[4].new_cache()
    assert np.abs(lms[2].forward(ids[:20], c2) - lms[4].forward(ids[:20], c4)).max() < TOL
    assert np.abs(lms[2].forward(ids[20:], c2) - lms[4].forward(ids[20:], c4)).max() < TOL


def test_int4_format4_equals_int4_format3(home, tiny_dirs, tmp_path):
    """The int4 quantizer leaves the attention's products (their B is the KV cache, not a weight) alone, and
    both formats quantize the same weights the same way: their logits agree as the fp32 graphs do."""
    from edgespec.export import ExportOptions, export_pair

    lms = {}
    for f in (3, 4):
        o = ExportOptions(precision="int4", graph_format=f)
        d = export_pair(str(tiny_dirs["target"]), str(tiny_dirs["draft"]), tmp_path / f"q{f}", o, o)
        lms[f] = OnnxLM(load_manifest(d).target, d)
    g = onnx.load(str(lms[4].export_dir / lms[4].spec.path), load_external_data=False).graph
    assert {"MatMulNBits", "FusedMatMul"} <= {n.op_type for n in g.node}
    caches = {f: lm.new_cache() for f, lm in lms.items()}
    for chunk in (IDS[:30], IDS[30:31], IDS[31:36]):
        a, b = (lms[f].forward(chunk, caches[f]) for f in (3, 4))
        assert np.abs(a - b).max() < 1e-3 and (a.argmax(-1) == b.argmax(-1)).all()
