"""Tier (f), second architecture: Gemma-3-270M (recipe ``gemma-3-270m``, the PyPI-packaged Q4_K_M GGUF) against
llama.cpp on the same file.

``tests/data/gemma3-270m-llamacpp.json`` holds llama.cpp b11434's prompt ids and greedy ids (24 new tokens) for four
short prompts and 16 after a 700-token one (past Gemma's 512-token sliding window), and its ids for 25 varied texts,
recorded once (the program, command, date and CPU are in the file). The export's tokenizer must give the same ids.
Plain greedy decoding of the export must give llama.cpp's tokens until the first difference, and that difference
must be a near tie: llama.cpp multiplies the Q4_K/Q5_0/Q6_K/Q8_0 blocks with activations quantized to 8 bits,
edgespec the dequantized weights (fp32) or those quantized again (int8), so where the export's two best logits are
within :data:`NEAR_TIE` of each other either may win.

Measured 2026-12-04 (AMD EPYC Zen 4, onnxruntime's CPU kernels), tokens equal to llama.cpp's per prompt: fp32 15,
24, 24, 2 and 16 of 16 after the long prompt (the export's gaps at the differences 0.012 and 0.167 logits) and int8
15, 24, 4, 2 and 9 or 16 of 16 (0.041, 0.071, 0.295; two runs of the long prompt differed at a 0.21 tie); on an
AVX2-only EPYC (2026-12-07) int8 gave 11, 24, 4, 2 and 16, so only fp32's counts are asserted as floors. The
default int4 export (weights quantized again to 4 bits, blocks of 32) gives 1, 2, 1, 2: for this small model it
leaves the GGUF's own greedy path within a few tokens (its export validation: 65% greedy agreement with the
dequantized weights, KL 0.9; an 8-bit head or accuracy level 1 change little), so int4 is not asserted here.

Opt-in (``pytest --real-pair``); the exports land in the user cache and are reused by later runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from conftest import user_home

pytestmark = pytest.mark.real

VECTOR = json.loads((Path(__file__).parent / "data" / "gemma3-270m-llamacpp.json").read_text(encoding="utf-8"))
RECIPE = "gemma-3-270m"
# logits: llama.cpp's 8-bit activations move this model's logits by ~0.1-0.2; int8 weights add their own noise
# (its validation against the dequantized weights: max |Δ logit| 3.5, KL 0.01 over 256 positions)
NEAR_TIE = {"fp32": 0.25, "int8": 0.5}
# tokens equal to llama.cpp's, per prompt, at least; int8's near ties move with the CPU's int8 kernels (AVX2-only
# EPYC, 2026-12-07: 11, 24, 4, 2, 16), so for int8 only the near tie is asserted
MEASURED = {"fp32": [15, 24, 24, 2, 16]}


def export(precision: str) -> Path:
    """The recipe exported at ``precision`` (target and draft) into the user cache, once."""
    from edgespec.export import export_pair
    from edgespec.export.pipeline import ExportOptions
    from edgespec.io import paths

    with user_home():
        out = paths.exports_dir() / f"{RECIPE}-{precision}"
        if not (out / "edgespec.json").is_file():
            opts = ExportOptions(precision=precision)
            export_pair(RECIPE, None, out, opts, opts)
    return out


def test_manifest_and_tokenizer_equal_llamacpps():
    from edgespec.io.encoding import PromptEncoder
    from edgespec.io.manifest import load_manifest

    d = export("fp32")
    m = load_manifest(d)
    assert (m.target.num_layers, m.target.num_kv_heads, m.target.head_dim) == (18, 1, 256)
    assert m.target.source_sha256 == VECTOR["gguf"]["sha256"]
    assert m.special_tokens.bos == 2 and 1 in m.special_tokens.stop
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    enc = PromptEncoder(tok)
    for case in VECTOR["generate"]:
        assert tok.encode(case["prompt"], add_special_tokens=True).ids == case["prompt_ids"], case["prompt"]
        assert enc.encode(prompt=case["prompt"]) == case["prompt_ids"], case["prompt"]  # a raw prompt: <bos> first
    for case in VECTOR["tokenize"]:
        assert tok.encode(case["text"], add_special_tokens=False).ids == case["ids"], repr(case["text"])


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_plain_greedy_equals_llamacpp_until_a_near_tie(precision):
    from edgespec.engine.decoder import SpecDecoder
    from edgespec.engine.generation import GenerationOptions
    from edgespec.export.validate import graph_logits

    d = export(precision)
    dec = SpecDecoder.load(d, load_draft=False)
    opts = GenerationOptions(max_new_tokens=24, temperature=0.0, proposers=())  # plain decoding
    equal = []
    for case in VECTOR["generate"]:
        want = case["ids"]
        got = [t for new, _ in dec.generate_ids(list(case["prompt_ids"]), opts) for t in new]
        n = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), len(want))
        equal.append(n)
        if n < len(want):  # the export's own logits there: llama.cpp's token a near second
            row = graph_logits(d / "target" / "model.onnx", np.array(case["prompt_ids"] + want[:n], np.int64),
                               18, 1, 256)[-1]
            gap = float(row[got[n]] - row[want[n]])  # < 0 where one forward with the cache and one without differ
            print(f"{precision} {case['prompt']!r}: {n}/{len(want)} equal, then ours {got[n]} over llama.cpp's "
                  f"{want[n]} by {gap:.3f}")
            assert abs(gap) < NEAR_TIE[precision], (case["prompt"], n, gap)
    assert all(e >= m for e, m in zip(equal, MEASURED.get(precision, []))), equal
