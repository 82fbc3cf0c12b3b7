"""Tier (f): the real pair's int8 prefill graph (``edgespec export --prefill-int8``), built beside the cached
default export's int4 target in a hard-linked copy (what the exporter writes, without a second 6-minute export).
"""

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from edgespec.bench.evaluate import greedy_check
from edgespec.engine.decoder import SpecDecoder, forward_tokens
from edgespec.io import onnx_model as om
from edgespec.io.integrity import sha256_file
from edgespec.io.manifest import load_manifest

pytestmark = pytest.mark.real

LONG = Path(__file__).resolve().parent.parent / "bench" / "prompts" / "long-code-edits.jsonl"


@pytest.fixture(scope="module")
def prefill_export(real_small_export, tmp_path_factory):
    from edgespec.export.prefill_graph import PREFILL_DATA, PREFILL_NAME, write_prefill_graph

    out = tmp_path_factory.mktemp("real_prefill") / "pair"  # the small export's int4 graphs, plus a prefill graph
    for src in Path(real_small_export).rglob("*"):
        dst = out / src.relative_to(real_small_export)
        if src.is_dir():
            dst.mkdir(parents=True, exist_ok=True)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src, dst)
            except OSError:  # another file system
                shutil.copy2(src, dst)
    assert write_prefill_graph(out / "target") == 84  # packed qkv, o_proj, gate/up of 28 layers
    raw = json.loads((out / "edgespec.json").read_text())
    raw["target"]["prefill_path"] = f"target/{PREFILL_NAME}"
    for f in (PREFILL_NAME, PREFILL_DATA):
        raw["files"][f"target/{f}"] = {"size": (out / "target" / f).stat().st_size,
                                       "sha256": sha256_file(out / "target" / f)}
    (out / "edgespec.json").unlink()  # a hard link into the cache: replaced, not written through
    (out / "edgespec.json").write_text(json.dumps(raw, indent=2))
    return out


def _long_prompt(i: int) -> str:
    return json.loads(LONG.read_text().splitlines()[i])["prompt"]


def test_real_prefill_graph_agrees_with_int4_teacher_forced(prefill_export):
    """Prefill ~600 tokens on the int8 graph, then 48 int4 steps on the cache it wrote, teacher-forced, against
    int4 throughout: greedy agreement ≥ 0.9 (measured 0.98–1.00 over 3 prompts × 64, docs/benchmarks.md)."""
    m = load_manifest(prefill_export)
    lm = om.OnnxLM(m.target, prefill_export)
    ref = om.OnnxLM(m.target, prefill_export, memory=replace(om.DEFAULT_MEMORY, prefill_graph=False))
    assert lm.prefill_session is not None and ref.prefill_session is None
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(prefill_export / "tokenizer.json")).encode(_long_prompt(1)).ids
    prompt, cont = ids[:-48], ids[-48:]
    rows = {}
    for name, pre in (("int4", ref), ("int8", lm)):
        cache = ref.new_cache()
        rows[name] = np.array([forward_tokens(pre, prompt, cache)] + [ref.forward([t], cache)[-1] for t in cont[:-1]])
    agree = (rows["int4"].argmax(1) == rows["int8"].argmax(1)).mean()
    assert agree >= 0.9 and not np.array_equal(rows["int4"][0], rows["int8"][0])


def test_real_speculative_greedy_matches_plain_with_the_prefill_graph(prefill_export):
    """Plain and speculative decoding both prefill on the int8 graph: greedy identical, or a divergence the
    verify path's own numbers explain (the lossless rule of ``edgespec eval``)."""
    dec = SpecDecoder.load(prefill_export)
    ids = dec.encode(messages=[{"role": "user", "content": _long_prompt(1)}])
    assert len(ids) > 500
    r = greedy_check(dec, ids, 32, k=3, proposers=("lookup", "draft"))
    assert r["ok"], r["problem"]
    assert r["stats"].proposed > 0
