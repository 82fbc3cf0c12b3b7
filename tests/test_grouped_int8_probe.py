"""bench/grouped_int8_cost.py's grouped int8 attention (two integer GEMMs, the query and P in two levels) computes
float32 attention over the dequantized int8 cache, for decode rows and multi-row verifies, and writes the new rows
as the cache's int8 codes (docs/benchmarks.md, "Session 18")."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("grouped_int8_cost", ROOT / "bench" / "grouped_int8_cost.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("past,t", [(1, 1), (70, 1), (70, 4), (300, 5)])
def test_grouped_int8_attention_equals_float32_over_the_dequantized_cache(probe, past, t):
    kv_d = probe.KV * probe.D
    rng = np.random.default_rng(past + t)
    chan = np.exp(rng.normal(0, 1.0, kv_d)).astype(np.float32)
    k32 = (rng.standard_normal((past, kv_d)) * chan).astype(np.float32)
    v32 = rng.standard_normal((past, kv_d)).astype(np.float32)
    ks, vs = np.abs(k32).max(0) / 127, np.abs(v32).max(0) / 127
    k8 = (np.clip(np.rint(k32 / ks), -127, 127) + 128).astype(np.uint8)
    v8 = np.clip(np.rint(v32 / vs), -127, 127).astype(np.int8)
    q = rng.standard_normal((t, probe.H, probe.D)).astype(np.float32)
    k_new = (rng.standard_normal((t, kv_d)) * chan).astype(np.float32)
    v_new = rng.standard_normal((t, kv_d)).astype(np.float32)
    sess = probe.session(probe.grouped_model(1, [(ks, vs)], 2), 2, False)
    out, kq, vq = sess.run(["out0", "kq0", "vq0"], {"q0": q, "k_new0": k_new, "v_new0": v_new,
                                                     "mask": probe.causal(t), "k0": k8, "v0": v8})
    ref = probe.reference(q, (k8.astype(np.float32) - 128) * ks, v8.astype(np.float32) * vs, k_new, v_new)
    assert np.abs(out - ref).max() <= 1e-3 * np.abs(ref).max()
    np.testing.assert_array_equal(kq, (np.clip(np.rint(k_new / ks), -127, 127) + 128).astype(np.uint8))
    np.testing.assert_array_equal(vq, np.clip(np.rint(v_new / vs), -127, 127).astype(np.int8))


def test_every_layer_reads_its_own_buffers_and_scales_and_one_query_level_is_not_enough(probe):
    """Two layers with their own scales and caches: layer 1 is checked too. The one-level query (timed beside it)
    runs, and its error is what the second level removes (above the 1e-3 the two-level graph meets)."""
    kv_d, past, t = probe.KV * probe.D, 200, 2
    rng = np.random.default_rng(7)
    feeds, refs, scales = {"mask": probe.causal(t)}, [], []
    for i in range(2):
        chan = np.exp(rng.normal(0, 1.0, kv_d)).astype(np.float32)
        k32 = (rng.standard_normal((past, kv_d)) * chan).astype(np.float32)
        v32 = (rng.standard_normal((past, kv_d)) * (i + 1)).astype(np.float32)
        ks, vs = np.abs(k32).max(0) / 127, np.abs(v32).max(0) / 127
        k8 = (np.clip(np.rint(k32 / ks), -127, 127) + 128).astype(np.uint8)
        v8 = np.clip(np.rint(v32 / vs), -127, 127).astype(np.int8)
        q = rng.standard_normal((t, probe.H, probe.D)).astype(np.float32)
        k_new = (rng.standard_normal((t, kv_d)) * chan).astype(np.float32)
        v_new = rng.standard_normal((t, kv_d)).astype(np.float32)
        feeds.update({f"k{i}": k8, f"v{i}": v8, f"q{i}": q, f"k_new{i}": k_new, f"v_new{i}": v_new})
        refs.append(probe.reference(q, (k8.astype(np.float32) - 128) * ks, v8.astype(np.float32) * vs, k_new, v_new))
        scales.append((ks, vs))
    errs = {}
    for levels in (1, 2):
        outs = probe.session(probe.grouped_model(2, scales, levels), 2, False).run(["out0", "out1"], feeds)
        errs[levels] = [np.abs(o - r).max() / np.abs(r).max() for o, r in zip(outs, refs)]
    assert max(errs[2]) <= 1e-3
    assert min(errs[1]) > 1e-3
