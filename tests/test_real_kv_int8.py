"""Tier (f): the real pair with an int8 KV cache alone (``edgespec export --profile small --kv-int8``), derived from
the cached small export's float32-cache graphs (their weights hard-linked, the graphs rewritten: ~3.5 minutes, no
second export).
"""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import user_home

from edgespec.bench.evaluate import greedy_check
from edgespec.engine.decoder import SpecDecoder, forward_tokens
from edgespec.io import onnx_model as om
from edgespec.io.manifest import load_manifest

pytestmark = pytest.mark.real

LONG = Path(__file__).resolve().parent.parent / "bench" / "prompts" / "long-code-edits.jsonl"


@pytest.fixture(scope="module")
def kv8_export(real_small_export, tmp_path_factory):
    from edgespec.export import ExportOptions, export_pair

    out = tmp_path_factory.mktemp("real_kv8") / "pair"
    with user_home():
        export_pair(None, None, out, ExportOptions(kv_int8=True), ExportOptions(kv_int8=True))
    return out


def _long_prompt(i: int) -> str:
    return json.loads(LONG.read_text().splitlines()[i])["prompt"]


def test_real_int8_cache_is_derived_and_validated(kv8_export, real_small_export):
    m, base = load_manifest(kv8_export), load_manifest(real_small_export)
    for role in ("target", "draft"):
        g = getattr(m, role)
        assert g.kv_cache == "int8" and getattr(base, role).kv_cache == "float32"
        assert g.validation["kv_int8"]["greedy_agreement"] >= 0.95  # measured 0.996 / 0.988
        mine, base_data = kv8_export / role / "model.onnx.data", real_small_export / role / "model.onnx.data"
        assert mine.stat().st_ino == base_data.stat().st_ino or mine.stat().st_size == base_data.stat().st_size


def test_real_int8_cache_agrees_with_the_float32_cache_teacher_forced(kv8_export, real_small_export):
    """~600 prompt tokens, then 48 steps on the same continuation: argmax agreement ≥ 0.9 with the float32
    cache (33/33 after 3,500 tokens, bench/probes/kv_int8_probe.py, docs/benchmarks.md)."""
    lms = [om.OnnxLM(load_manifest(d).target, d) for d in (real_small_export, kv8_export)]
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(real_small_export / "tokenizer.json")).encode(_long_prompt(1)).ids
    prompt, cont = ids[:-48], ids[-48:]
    rows = []
    for lm in lms:
        cache = lm.new_cache()
        rows.append(np.array([forward_tokens(lm, prompt, cache)] + [lm.forward([t], cache)[-1] for t in cont[:-1]]))
    assert lms[1].new_cache().buffers[0].dtype == np.int8
    agree = (rows[0].argmax(1) == rows[1].argmax(1)).mean()
    assert agree >= 0.9, agree
    assert 0 < np.abs(rows[0] - rows[1]).max() < 5.0


def test_real_speculative_greedy_matches_plain_with_the_int8_cache(kv8_export):
    """Plain and speculative decoding read and write the same int8 cache: greedy identical, or a divergence the
    verify path's own numbers explain (the lossless rule of ``edgespec eval``)."""
    dec = SpecDecoder.load(kv8_export)
    ids = dec.encode(messages=[{"role": "user", "content": _long_prompt(0)}])
    r = greedy_check(dec, ids, 32, k=3, proposers=("lookup", "draft"))
    assert r["ok"], r
