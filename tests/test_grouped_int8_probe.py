"""bench/probes/grouped_int8_cost.py's grouped int8 attention (two integer GEMMs, the query and P in two levels) computes
float32 attention over the dequantized int8 cache, for decode rows and multi-row verifies, and writes the new rows
as the cache's int8 codes (docs/benchmarks.md, "Why onnxruntime's attention sets the long-context floor")."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("grouped_int8_cost", ROOT / "bench" / "probes" / "grouped_int8_cost.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def layer_data(probe, rng, past: int, t: int, v_scale: float = 1.0) -> dict:
    """One layer's int8 cache (uint8 K = code + 128, int8 V, per-channel scales from its absmax), new rows and
    query, and the float32 attention over the dequantized cache (``ref``)."""
    kv_d = probe.KV * probe.D
    chan = np.exp(rng.normal(0, 1.0, kv_d)).astype(np.float32)  # outlier channels, as real K has
    k32 = (rng.standard_normal((past, kv_d)) * chan).astype(np.float32)
    v32 = (rng.standard_normal((past, kv_d)) * v_scale).astype(np.float32)
    ks, vs = np.abs(k32).max(0) / 127, np.abs(v32).max(0) / 127
    d = {"ks": ks, "vs": vs, "k8": (np.clip(np.rint(k32 / ks), -127, 127) + 128).astype(np.uint8),
         "v8": np.clip(np.rint(v32 / vs), -127, 127).astype(np.int8),
         "q": rng.standard_normal((t, probe.H, probe.D)).astype(np.float32),
         "k_new": (rng.standard_normal((t, kv_d)) * chan).astype(np.float32),
         "v_new": rng.standard_normal((t, kv_d)).astype(np.float32)}
    d["ref"] = probe.reference(d["q"], (d["k8"].astype(np.float32) - 128) * ks, d["v8"].astype(np.float32) * vs,
                               d["k_new"], d["v_new"])
    return d


def feeds(d: dict, i: int) -> dict:
    return {f"k{i}": d["k8"], f"v{i}": d["v8"], f"q{i}": d["q"], f"k_new{i}": d["k_new"], f"v_new{i}": d["v_new"]}


@pytest.mark.parametrize("past,t", [(1, 1), (70, 1), (70, 4), (300, 5)])
def test_grouped_int8_attention_equals_float32_over_the_dequantized_cache(probe, past, t):
    d = layer_data(probe, np.random.default_rng(past + t), past, t)
    sess = probe.session(probe.grouped_model(1, [(d["ks"], d["vs"])], 2), 2, False)
    out, kq, vq = sess.run(["out0", "kq0", "vq0"], {"mask": probe.causal(t), **feeds(d, 0)})
    np.testing.assert_array_equal(kq, (np.clip(np.rint(d["k_new"] / d["ks"]), -127, 127) + 128).astype(np.uint8))
    np.testing.assert_array_equal(vq, np.clip(np.rint(d["v_new"] / d["vs"]), -127, 127).astype(np.int8))
    if probe.integer_gemm_saturates():
        pytest.skip("x86 without VNNI/AMX: MLAS's u8 × s8 kernel saturates in int16 (the probe's 8-bit levels)")
    assert np.abs(out - d["ref"]).max() <= 1e-3 * np.abs(d["ref"]).max()


def test_every_layer_reads_its_own_buffers_and_scales_and_one_query_level_is_not_enough(probe):
    """Two layers with their own scales and caches: layer 1 is checked too. The one-level query (timed beside it)
    runs, and its error is what the second level removes (above the 1e-3 the two-level graph meets)."""
    if probe.integer_gemm_saturates():
        pytest.skip("x86 without VNNI/AMX: MLAS's u8 × s8 kernel saturates in int16 (the probe's 8-bit levels)")
    rng, t = np.random.default_rng(7), 2
    layers = [layer_data(probe, rng, 200, t, v_scale=i + 1) for i in range(2)]
    inputs = {"mask": probe.causal(t), **feeds(layers[0], 0), **feeds(layers[1], 1)}
    errs = {}
    for levels in (1, 2):
        model = probe.grouped_model(2, [(d["ks"], d["vs"]) for d in layers], levels)
        outs = probe.session(model, 2, False).run(["out0", "out1"], inputs)
        errs[levels] = [np.abs(o - d["ref"]).max() / np.abs(d["ref"]).max() for o, d in zip(outs, layers)]
    assert max(errs[2]) <= 1e-3
    assert min(errs[1]) > 1e-3
