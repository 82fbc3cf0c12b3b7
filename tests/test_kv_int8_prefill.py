"""An int8 KV cache with a float32 prefill graph (``edgespec export --kv-int8 --prefill-int8``): the prefill graph
keeps a float32 cache (onnxruntime's int8-cache attention has no GEMM path for many query rows), the runtime
prefills through a float32 copy of the cached rows and quantizes the new rows into the int8 cache."""

import json
import shutil

import numpy as np
import onnx
import pytest

from edgespec import SpecDecoder
from edgespec.bench.evaluate import greedy_check
from edgespec.core.sampling import SamplingParams
from edgespec.errors import EdgespecError
from edgespec.io import onnx_model as om
from edgespec.io.manifest import load_manifest

IDS = [int(i) for i in np.random.default_rng(3).integers(3, 400, 240)]


@pytest.fixture(scope="module")
def exports(home, tiny_dirs, tmp_path_factory):
    """The tiny pair, format 3, int4 with int8 prefill graphs for both: with a float32 cache, then with an int8
    one derived from its cached graphs (the build-from-weights path: tests/test_kv_int8.py)."""
    from edgespec.export import ExportOptions, export_pair

    root = tmp_path_factory.mktemp("kv_int8_prefill")
    out = {}
    for name, kv_int8 in (("float32", False), ("int8", True)):
        o = ExportOptions(precision="int4", graph_format=3, prefill_int8=True, kv_int8=kv_int8)
        out[name] = export_pair(str(tiny_dirs["target"]), str(tiny_dirs["draft"]), root / name, o, o)
    return out


def _past_type(path) -> set[int]:
    g = onnx.load(str(path), load_external_data=False).graph
    return {i.type.tensor_type.elem_type for i in g.input if i.name.startswith("past_key_values.")}


def test_the_prefill_graph_keeps_a_float32_cache_and_the_scales_are_the_graphs(exports):
    d = exports["int8"]
    for role in ("target", "draft"):  # derived: the weights and the unchanged prefill graph are hard links
        for f in ("model.onnx.data", "prefill.onnx", "prefill.onnx.data"):
            assert (d / role / f).stat().st_ino == (exports["float32"] / role / f).stat().st_ino
    m = load_manifest(d)
    for role in ("target", "draft"):
        g = getattr(m, role)
        assert (g.kv_cache, g.prefill_kv_cache, g.prefill_cache_type) == ("int8", "float32", "float32")
        assert g.kv_scales == f"{role}/kv_scales.npz" and g.kv_scales in m.files
        v = g.validation["kv_int8"]["with_prefill_graph"]  # the exporter ran the runtime's float32 prefill
        assert v["positions"] == 128 and v["greedy_agreement"] >= 0.9 and 0 < v["max_abs_logit_error"] < 1.0
        assert _past_type(d / g.path) == {onnx.TensorProto.INT8}
        assert _past_type(d / g.prefill_path) == {onnx.TensorProto.FLOAT}
        graph = onnx.load(str(d / g.path), load_external_data=False).graph
        inits = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer if t.name.endswith("/scale")}
        with np.load(d / g.kv_scales) as z:
            assert sorted(z.files) == sorted(n.removesuffix("/scale") for n in inits)
            for name, s in inits.items():
                np.testing.assert_array_equal(z[name.removesuffix("/scale")], s)
    m32 = load_manifest(exports["float32"])
    assert m32.target.prefill_kv_cache is None and m32.target.kv_scales is None


def _editable_copy(src, dst):
    """A copy of the export ``src`` at ``dst`` whose manifest lists no file hashes (the test edits files; their
    presence is still checked); returns the manifest dict, already written back."""
    shutil.copytree(src, dst)
    m = json.loads((dst / "edgespec.json").read_text())
    del m["files"]
    (dst / "edgespec.json").write_text(json.dumps(m))
    return m


def _lm(d, role="target"):
    return om.OnnxLM(getattr(load_manifest(d), role), d)


def _quantize(rows, scales):
    return [np.clip(np.rint(r / s), -128, 127).astype(np.int8) for r, s in zip(rows, scales)]


def test_the_runtime_quantizes_as_onnxruntime_does(exports):
    """The runtime's q = clip(round(x / scale), −128, 127) against GroupQueryAttention's own int8 writes: the same
    int4 graph with a float32 cache and with an int8 one, one chunk on an empty cache: layer 0's K/V rows (the
    same inputs; later layers see attention over int8 rows) are quantized identically."""
    lm8, lm32 = _lm(exports["int8"]), _lm(exports["float32"])
    c8, c32 = lm8.new_cache(), lm32.new_cache()
    lm8.forward(IDS[:96], c8)
    lm32.forward(IDS[:96], c32)
    for ours, theirs in zip(_quantize(c32.tensors[:2], lm8.kv_scales), c8.tensors[:2]):
        np.testing.assert_array_equal(ours, theirs)


def test_a_prefill_quantizes_the_float32_prefill_graphs_rows_and_decodes_close_to_a_float32_cache(exports):
    """Prompt chunks on the float32 prefill graph, quantized into the int8 cache: the first chunk's rows are the
    float32 prefill graph's own (the float32 export's, the same graph) quantized exactly; after a second chunk and
    20 steps the logits stay within int8 rounding of the float32 cache's."""
    lm, ref = _lm(exports["int8"]), _lm(exports["float32"])
    assert lm.prefill_session is not None and lm.kv_scales is not None and ref.kv_scales is None
    c8, c32 = lm.new_cache(), ref.new_cache()
    lm.forward(IDS[:96], c8, keep=1, prefill=True)
    ref.forward(IDS[:96], c32, keep=1, prefill=True)
    assert c8.buffers[0].dtype == np.int8 and c8.length == 96
    for a, b in zip(c8.tensors, _quantize(c32.tensors, lm.kv_scales)):
        np.testing.assert_array_equal(a, b)
    lm.forward(IDS[96:192], c8, keep=1, prefill=True)
    ref.forward(IDS[96:192], c32, keep=1, prefill=True)
    steps = [(lm.forward([t], c8), ref.forward([t], c32)) for t in IDS[192:212]]
    a, b = (np.concatenate(x) for x in zip(*steps))
    assert 0 < np.abs(a - b).max() < 0.5 and (a.argmax(-1) == b.argmax(-1)).mean() >= 0.9


def test_the_float32_copy_always_holds_the_int8_rows(exports):
    """The copy a prefill attends to equals the int8 cache dequantized, whether it was kept from the chunk
    before, brought up to date after a decode step (which marks its rows stale) or made again after being dropped:
    the next chunk's logits are bit-identical."""
    lm = _lm(exports["int8"])
    kept, stepped, dropped = lm.new_cache(), lm.new_cache(), lm.new_cache()
    for c in (kept, stepped, dropped):
        lm.forward(IDS[:100], c, keep=1, prefill=True)
    assert kept._float32 is not None
    scales = lm.kv_scales
    for f, q, s in zip(kept._float32.tensors, kept.tensors, scales):
        np.testing.assert_array_equal(f, q * s)
    lm.forward([IDS[100]], stepped)  # a step on the int8 graph writes row 100: the copy ends before it
    assert stepped._float32.length == 100 and stepped.length == 101
    stepped.crop(100)
    dropped.drop_float32()
    out = [lm.forward(IDS[100:180], c, keep=4, prefill=True) for c in (kept, stepped, dropped)]
    for c in (stepped, dropped):
        np.testing.assert_array_equal(out[0], out[1 if c is stepped else 2])
        for x, y in zip(kept.tensors, c.tensors):
            np.testing.assert_array_equal(x, y)
    lm.forward(IDS[180:190], stepped)  # a short chunk on the int8 graph, then a prefill reads rows 180.. again
    lm.forward(IDS[180:190], kept)
    kept.drop_float32()
    np.testing.assert_array_equal(lm.forward(IDS[190:260], stepped, keep=2, prefill=True),
                                  lm.forward(IDS[190:260], kept, keep=2, prefill=True))


def test_a_crop_shortens_the_copy_and_the_next_prefill_continues_from_it(exports):
    lm = _lm(exports["int8"])
    c = lm.new_cache()
    lm.forward(IDS[:120], c, keep=1, prefill=True)
    c.crop(70)
    assert c._float32.length == 70
    fresh = lm.new_cache()
    lm.forward(IDS[:120], fresh, keep=1, prefill=True)
    fresh.drop_float32()
    fresh.crop(70)
    np.testing.assert_array_equal(lm.forward(IDS[70:150], c, keep=1, prefill=True),
                                  lm.forward(IDS[70:150], fresh, keep=1, prefill=True))


def test_the_decoder_is_lossless_on_it(exports):
    """Greedy speculative decoding on the int8 cache with float32 prefills equals plain decoding (the verify-path
    rule), for both a prompt long enough for the prefill graph and the catch-up of the draft."""
    dec = SpecDecoder.load(exports["int8"])
    assert dec.target.kv_scales is not None and dec.draft_model.lm.kv_scales is not None
    prompt = IDS[:130]
    res = greedy_check(dec, prompt, 24, k=3)
    assert res["ok"], res


def test_bad_scales_and_fields_are_refused_in_one_line(exports, tmp_path):
    src = exports["int8"]
    bad = tmp_path / "bad"
    m = _editable_copy(src, bad)
    np.savez(bad / "target" / "kv_scales.npz", nothing=np.ones(1, np.float32))
    with pytest.raises(EdgespecError, match="no KV scale") as e:
        _lm(bad)
    assert "\n" not in str(e.value)
    (bad / "target" / "kv_scales.npz").write_bytes(b"not a zip")
    with pytest.raises(EdgespecError, match="unreadable KV scales"):
        _lm(bad)
    lm = _lm(src)
    np.savez(bad / "target" / "kv_scales.npz", **{n: -s for n, s in zip(lm._past, lm.kv_scales)})
    with pytest.raises(EdgespecError, match="not finite, positive"):
        _lm(bad)
    for edit, msg in (({"kv_scales": None}, "needs kv_scales"),
                      ({"prefill_kv_cache": "int4"}, "needs a prefill graph and an int8 kv_cache"),
                      ({"prefill_path": None}, "needs a prefill graph"),
                      ({"prefill_kv_cache": None}, "kv_scales needs prefill_kv_cache float32"),
                      ({"prefill_kv_cache": "int8"}, "kv_scales needs prefill_kv_cache float32")):
        m2 = json.loads(json.dumps(m))
        m2["target"].update(edit)
        (bad / "edgespec.json").write_text(json.dumps(m2))
        with pytest.raises(EdgespecError, match=msg):
            load_manifest(bad)


def test_a_prefill_graph_of_the_wrong_cache_type_is_refused(exports, tmp_path):
    """The manifest says the prefill graph's cache is float32; an int8-cache prefill graph in its place (an older
    export's files) is refused where it loads."""
    bad = tmp_path / "swapped"
    m = _editable_copy(exports["int8"], bad)
    from edgespec.export.kv_int8 import rewrite

    lm = _lm(exports["int8"])
    rewrite(bad / "target" / "prefill.onnx", {n: s for n, s in zip(lm._past, lm.kv_scales)})
    with pytest.raises(EdgespecError, match="prefill_kv_cache float32"):
        _lm(bad)


def _dequantized(cache, scales):
    return [q.astype(np.float32) * s for q, s in zip(cache.tensors, scales)]


def _check_copy(cache, scales):
    """The float32 copy, where there is one, holds exactly the int8 rows dequantized, for every row it claims."""
    f = cache._float32
    if f is None:
        return
    assert f.length <= cache.length
    for a, b in zip(f.tensors, _dequantized(cache, scales)):
        np.testing.assert_array_equal(a, b[:, :, :f.length])


def test_the_copy_tracks_the_int8_cache_through_mixed_steps_crops_growth_and_load(exports):
    """Prefill chunks above and below PREFILL_GRAPH_ROWS, decode steps, contiguous and scattered crops, growth
    of a small buffer, and load(): after each, the copy equals the int8 rows dequantized, and a cache that
    went through it all yields the same next-chunk logits and rows as one loaded from its int8 rows."""
    lm = _lm(exports["int8"])
    s = lm.kv_scales
    c = lm.new_cache(capacity=64)  # grows during the first chunk (shadow) and in store_from
    ops = [("pre", IDS[:100]), ("pre", IDS[100:130]), ("pre", IDS[130:200]), ("crop", (150, [])),
           ("pre", IDS[150:230]), ("crop", (180, [185, 190, 199])), ("step", [IDS[5]]),
           ("crop", (120, [121, 130])), ("pre", IDS[20:100]), ("crop", (100, [101]))]
    for kind, arg in ops:
        if kind == "pre":
            lm.forward(arg, c, keep=1, prefill=True)
        elif kind == "step":
            lm.forward(arg, c)
        else:
            c.crop(arg[0], keep=arg[1])
        _check_copy(c, s)
    ref = lm.new_cache()
    ref.load([t.copy() for t in c.tensors])
    assert ref._float32 is None
    a = lm.forward(IDS[30:110], c, keep=3, prefill=True)
    b = lm.forward(IDS[30:110], ref, keep=3, prefill=True)
    np.testing.assert_array_equal(a, b)
    for x, y in zip(c.tensors, ref.tensors):
        np.testing.assert_array_equal(x, y)
    c.load([t.copy() for t in ref.tensors[:]])  # load drops the copy
    assert c._float32 is None


def test_the_runtime_saturates_as_onnxruntime_does(exports, tmp_path):
    """Scales a sixteenth of the calibrated ones: GroupQueryAttention saturates many rows; the runtime's clip
    bounds and rounding must give the very same int8 values (layer 0, one chunk on an empty cache)."""
    from edgespec.export.kv_int8 import rewrite

    d = tmp_path / "tight"
    m = _editable_copy(exports["int8"], d)
    lm = _lm(exports["int8"])
    tight = [sc / 16 for sc in lm.kv_scales]
    rewrite(exports["float32"] / "target" / "model.onnx", dict(zip(lm._past, tight)), d / "target" / "model.onnx")
    lm8, lm32 = _lm(d), _lm(exports["float32"])
    c8, c32 = lm8.new_cache(), lm32.new_cache()
    lm8.forward(IDS[:96], c8)
    lm32.forward(IDS[:96], c32)
    theirs = c8.tensors[:2]
    assert any((t == -128).any() or (t == 127).any() for t in theirs)  # saturated somewhere
    for ours, th in zip(_quantize(c32.tensors[:2], tight), theirs):
        np.testing.assert_array_equal(ours, th)


def test_a_kv_scales_file_that_is_not_an_npz_is_refused_in_one_line(exports, tmp_path):
    """A bare .npy under the name, and an .npz with a corrupt member: EdgespecError, not TypeError/BadZipFile."""
    bad = tmp_path / "npy"
    m = _editable_copy(exports["int8"], bad)
    with open(bad / "target" / "kv_scales.npz", "wb") as f:
        np.save(f, np.ones((1, 2, 1, 8), np.float32))
    with pytest.raises(EdgespecError, match="KV scales"):
        _lm(bad)
    z = bytearray((exports["int8"] / "target" / "kv_scales.npz").read_bytes())
    z[100] ^= 0xFF  # a member's CRC no longer matches (zipfile.BadZipFile on read)
    (bad / "target" / "kv_scales.npz").write_bytes(bytes(z))
    with pytest.raises(EdgespecError, match="unreadable KV scales"):
        _lm(bad)


def test_an_old_int8_export_with_an_int8_prefill_graph_still_loads_and_is_lossless(exports, tmp_path):
    """A session-10 export: the prefill graph reads the int8 cache itself, no prefill_kv_cache or kv_scales."""
    from edgespec.export.kv_int8 import rewrite

    old = tmp_path / "old"
    m = _editable_copy(exports["int8"], old)
    for role in ("target", "draft"):
        lm = _lm(exports["int8"], role)
        rewrite(old / role / "prefill.onnx", dict(zip(lm._past, lm.kv_scales)))
        (old / role / "kv_scales.npz").unlink()
        del m[role]["prefill_kv_cache"], m[role]["kv_scales"]
    (old / "edgespec.json").write_text(json.dumps(m))
    lm = _lm(old)
    assert lm.kv_scales is None and lm.prefill_session is not None
    c = lm.new_cache()
    lm.forward(IDS[:100], c, keep=1, prefill=True)
    assert c._float32 is None and c.length == 100
    dec = SpecDecoder.load(old)
    res = greedy_check(dec, IDS[:130], 24, k=3)
    assert res["ok"], res


def test_a_finished_prefill_frees_the_float32_copy(exports):
    """The decoder's prefill (forward_tokens, also cache_prefix for serve) leaves the int8 rows only."""
    from edgespec.engine.decoder import forward_tokens

    lm = _lm(exports["int8"])
    c = lm.new_cache()
    logits = forward_tokens(lm, IDS[:200], c)
    assert c.length == 200 and c._float32 is None and np.isfinite(logits).all()
    dec = SpecDecoder.load(exports["int8"])
    dec.cache_prefix(IDS[:150])
    assert dec.tcache.length >= 149 and dec.tcache._float32 is None


@pytest.mark.parametrize("cache", ["float32", "int8"])
def test_the_first_token_is_chosen_as_where_the_prompt_is_cached(exports, cache):
    """The prefill graph writes the prompt's cache; its last token runs alone on the graph itself, so a prompt asked
    again (the cache reused, the last token run again) is offered the very same first row (the AVX2 EPYC's server
    answered a repeated tools request '{{' in place of '```json': int8 weights moved a near tie)."""
    dec = SpecDecoder.load(exports[cache])
    rows = []
    dec.processor = lambda ids, logits: rows.append(np.array(logits)) or logits
    ids = IDS[:150]
    sp = SamplingParams(0.0)
    for _ in range(2):  # the second reuses positions 0..148
        dec.prefill(ids, sp, np.random.default_rng(0))
    dec.reset()
    dec.cache_prefix(ids)  # a server's fixed system prompt: ids[:-1] cached ahead
    dec.prefill(ids, sp, np.random.default_rng(0))
    assert len(rows) == 3
    assert np.array_equal(rows[0], rows[1]) and np.array_equal(rows[0], rows[2])
    assert dec.target.prefill_session is not None
