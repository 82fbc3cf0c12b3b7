"""The int8 KV cache (``edgespec export --kv-int8``, export/kv_int8.py): GroupQueryAttention quantizes the rows it
writes and reads the past as int8; the runtime keeps int8 buffers; the contract is checked where it enters."""

import json
import shutil

import numpy as np
import onnx
import pytest

from edgespec import SpecDecoder
from edgespec.bench.evaluate import greedy_check
from edgespec.errors import EdgespecError
from edgespec.io import onnx_model as om
from edgespec.io.manifest import load_manifest

IDS = [int(i) for i in np.random.default_rng(2).integers(3, 400, 160)]


@pytest.fixture(scope="module")
def exports(home, tiny_dirs, tmp_path_factory):
    """The tiny pair in format 3, fp32 weights, with a float32 cache and with an int8 one."""
    from edgespec.export import ExportOptions, export_pair

    root = tmp_path_factory.mktemp("kv_int8")
    out = {}
    for name, kv_int8 in (("float32", False), ("int8", True)):
        o = ExportOptions(precision="fp32", graph_format=3, kv_int8=kv_int8)
        out[name] = export_pair(str(tiny_dirs["target"]), str(tiny_dirs["draft"]), root / name, o, o)
    return out


def test_the_export_writes_int8_buffers_with_per_channel_scales_and_validates_them(exports):
    m = load_manifest(exports["int8"])
    for role in ("target", "draft"):
        g = getattr(m, role)
        assert g.kv_cache == "int8" and g.graph_format == 3
        v = g.validation["kv_int8"]
        assert v["positions"] >= 256 and v["greedy_agreement"] >= 0.9 and 0 < v["max_abs_logit_error"] < 1.0
        graph = onnx.load(str(exports["int8"] / g.path), load_external_data=False)
        past = [i for i in graph.graph.input if i.name.startswith("past_key_values.")]
        assert past and all(i.type.tensor_type.elem_type == onnx.TensorProto.INT8 for i in past)
        gqa = [n for n in graph.graph.node if n.op_type == "GroupQueryAttention"]
        assert len(gqa) == g.num_layers
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in gqa[0].attribute}
        assert attrs["k_quant_type"] == attrs["v_quant_type"] == b"PER_CHANNEL" and attrs["kv_cache_bit_width"] == 8
        scales = {t.name: onnx.numpy_helper.to_array(t) for t in graph.graph.initializer if t.name.endswith("/scale")}
        assert len(scales) == 2 * g.num_layers
        assert all(s.shape == (1, g.num_kv_heads, 1, g.head_dim) and (s > 0).all() for s in scales.values())
    assert load_manifest(exports["float32"]).target.kv_cache == "float32"


def test_the_cache_is_int8_and_the_logits_stay_close_to_the_float32_cache(exports):
    """The same weights and inputs, prefilled in chunks then stepped: the int8 cache's logits within the int8
    rounding of K and V (here < 0.5 on logits of spread ~10) of the float32 cache's, same argmax nearly
    everywhere."""
    rows = {}
    for name, d in exports.items():
        m = load_manifest(d)
        lm = om.OnnxLM(m.target, d)
        cache = lm.new_cache()
        assert cache.buffers[0].dtype == (np.int8 if name == "int8" else np.float32)
        out = [lm.forward(IDS[i:i + 40], cache) for i in range(0, 120, 40)]
        out += [lm.forward([t], cache) for t in IDS[120:140]]
        rows[name] = np.concatenate(out)
        assert cache.length == 140
    diff = np.abs(rows["int8"] - rows["float32"]).max()
    assert 0 < diff < 0.5, diff
    assert (rows["int8"].argmax(-1) == rows["float32"].argmax(-1)).mean() >= 0.9


def test_rollback_and_a_tree_path_move_int8_rows_and_decode_as_a_fresh_cache(exports):
    """Crop to a prefix and a scattered keep (a tree's accepted path) on int8 buffers: the kept prefix is
    untouched and the moved rows land at n.. (layer 0's V rows, which do not depend on position or context, equal
    those of a cache fed only the kept tokens)."""
    d = exports["int8"]
    lm = om.OnnxLM(load_manifest(d).target, d)
    a, b = lm.new_cache(), lm.new_cache()
    lm.forward(IDS[:50], a)
    lm.forward(IDS[:30], b)
    a.crop(30, keep=[33, 35])
    lm.forward([IDS[33], IDS[35]], b, position_ids=np.array([30, 31]))
    assert a.length == b.length == 32
    np.testing.assert_array_equal(a.buffers[0][:, :, :30], b.buffers[0][:, :, :30])
    # rows 30, 31 of a were written at positions 33 and 35 (rotary of those positions), b's at 30 and 31:
    # compare the V rows (no rotary) only
    np.testing.assert_array_equal(a.buffers[1][:, :, 30:32], b.buffers[1][:, :, 30:32])


def test_plain_and_speculative_greedy_stay_identical_with_the_int8_cache(exports):
    dec = SpecDecoder.load(exports["int8"])
    for proposers in (("draft",), ("lookup", "draft"), ("tree",)):  # a tree verifies under attention_bias
        r = greedy_check(dec, IDS[:24], 24, k=3, proposers=proposers)
        assert r["identical"], r


def test_a_graph_whose_cache_type_differs_from_the_manifest_is_caught_on_load(exports, tmp_path):
    """The manifest says float32 over an int8 graph (or the reverse): one clear line on load, no traceback."""
    for src, other in (("int8", "float32"), ("float32", "int8")):
        d = tmp_path / src
        shutil.copytree(exports[src], d)
        raw = json.loads((d / "edgespec.json").read_text())
        raw["target"]["kv_cache"] = other
        (d / "edgespec.json").write_text(json.dumps(raw))
        with pytest.raises(EdgespecError, match="kv_cache"):
            om.OnnxLM(load_manifest(d).target, d)


@pytest.mark.parametrize("value, said", [("fp8", "must be one of"), (8, "must be a string"),
                                         ("int8@4", "must be one of")])
def test_a_bad_kv_cache_field_is_refused_in_one_line(exports, tmp_path, value, said):
    d = tmp_path / "bad"
    shutil.copytree(exports["float32"], d)
    raw = json.loads((d / "edgespec.json").read_text())
    raw["draft"]["kv_cache"] = value
    (d / "edgespec.json").write_text(json.dumps(raw))
    with pytest.raises(EdgespecError, match="draft.kv_cache"):
        load_manifest(d)


def test_an_int8_cache_needs_graph_format_3(tmp_path):
    from edgespec.export import ExportOptions

    for fmt in (2, 4):
        with pytest.raises(EdgespecError, match="graph format 3"):
            ExportOptions(graph_format=fmt, kv_int8=True)


def test_the_graph_cache_key_tells_the_kv_caches_apart():
    from edgespec.export import ExportOptions
    from edgespec.export.build import _cache_key
    from edgespec.export.sources import Source

    src = Source(ref="x", kind="hf", path=None, sha256="ab" * 32)
    keys = {kv: _cache_key(src, ExportOptions(precision="int4", graph_format=3, kv_int8=kv)) for kv in (False, True)}
    assert keys[False] != keys[True]
    # a float32 cache keeps the key it had before the option existed (cached graphs stay valid)
    assert keys[False] == _cache_key(src, ExportOptions(precision="int4", graph_format=3))


def test_the_int8_export_is_derived_from_the_cached_float32_graphs(exports):
    """With the float32-cache graph of the same weights and options in the graph cache (the fixture exported it
    first), ``--kv-int8`` rewrites its graphs instead of exporting again: the weights are the same file."""
    for role in ("target", "draft"):
        a = exports["float32"] / role / "model.onnx.data"
        b = exports["int8"] / role / "model.onnx.data"
        assert a.stat().st_ino == b.stat().st_ino
        assert (exports["float32"] / role / "model.onnx").stat().st_ino != (exports["int8"] / role / "model.onnx").stat().st_ino


def test_built_from_the_weights_with_a_prefill_graph_both_graphs_read_the_int8_cache(home, tiny_dirs, tmp_path, capfd):
    """No float32 graph cached for these options (block 16): the exporter builds, calibrates and rewrites the
    graph; the int8 prefill graph keeps its float32 cache (tests/test_kv_int8_prefill.py), and long prompt chunks
    run on it through a float32 copy of the int8 cache; plain and speculative greedy stay identical."""
    from edgespec.export import ExportOptions, export_pair

    t = ExportOptions(precision="int4", block_size=16, graph_format=3, kv_int8=True, prefill_int8=True)
    d_opts = ExportOptions(precision="int4", block_size=16, graph_format=3, kv_int8=True)
    d = export_pair(str(tiny_dirs["target"]), str(tiny_dirs["draft"]), tmp_path / "p", t, d_opts)
    assert "from the cached graph" not in capfd.readouterr().err
    m = load_manifest(d)
    lm = om.OnnxLM(m.target, d)
    assert m.target.kv_cache == "int8" and m.target.prefill_kv_cache == "float32" and lm.prefill_session is not None
    for s, want in ((lm.session, "tensor(int8)"), (lm.prefill_session, "tensor(float)")):
        assert {i.type for i in s.get_inputs() if i.name.startswith("past_key_values.")} == {want}
    cache = lm.new_cache()
    lm.forward(IDS[:om.PREFILL_GRAPH_ROWS + 8], cache, prefill=True)
    row = lm.forward([IDS[100]], cache)
    assert cache.length == om.PREFILL_GRAPH_ROWS + 9 and np.isfinite(row).all()
    r = greedy_check(SpecDecoder.load(d), IDS[:24], 24, k=3, proposers=("draft",))
    assert r["identical"], r
