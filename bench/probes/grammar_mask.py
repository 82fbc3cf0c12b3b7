"""Grammar libraries on this CPU: the cost of one token mask under a JSON schema (llguidance, outlines-core,
xgrammar), a micro-benchmark behind edgespec's choice of llguidance (edgespec/constrain.py).

For each library installed: build its tokenizer view of the export's ``tokenizer.json`` (ms), compile the
schema (ms), then walk the tokens of a JSON document that matches it, computing the full-vocabulary mask before
each token and advancing past it; reports the median and p90 µs per mask. Only an indication on a loaded
machine; the per-token share of a decode step is what matters (a 1.5B target step is ~100 ms here).

Usage:
    python bench/probes/grammar_mask.py [EXPORT_DIR] [--repeats 3]   # default: the default pair in the user cache
Install the other libraries to compare (they are not edgespec dependencies): pip install outlines-core
xgrammar apache-tvm-ffi (xgrammar needs torch).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city", "zip"], "additionalProperties": False}},
    "required": ["name", "age", "tags", "address"], "additionalProperties": False}
DOC = json.dumps({"name": "Ada Lovelace", "age": 36, "tags": ["math", "engines", "poetry"],
                  "address": {"city": "London", "zip": "W1"}})


def _walk(ids, mask, advance) -> list[float]:
    times = []
    for t in ids:
        t0 = time.perf_counter()
        mask()
        times.append((time.perf_counter() - t0) * 1e6)
        advance(t)
    return times


def bench_llguidance(tok, width, eos, ids):
    import llguidance as llg

    t0 = time.perf_counter()
    llt = llg.LLTokenizer(tok.to_str(), n_vocab=max(width, tok.get_vocab_size(True)), eos_token=eos)
    t1 = time.perf_counter()
    grammar = llg.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    m = llg.LLMatcher(llt, grammar, log_level=0)
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3, _walk(ids, m.compute_bitmask, m.consume_token)


def bench_outlines(tok, width, eos, ids):
    import outlines_core as oc

    from edgespec.apps.openai_fields import token_piece

    t0 = time.perf_counter()
    vocab: dict[bytes, list[int]] = {}
    special = {a.content for a in tok.get_added_tokens_decoder().values()}
    for i in range(width):
        if i == eos or tok.id_to_token(i) in special or tok.id_to_token(i) is None:
            continue
        vocab.setdefault(bytes(token_piece(tok, i)[1]), []).append(i)
    v = oc.Vocabulary(eos, vocab)
    t1 = time.perf_counter()
    index = oc.Index(oc.json_schema.build_regex_from_schema(json.dumps(SCHEMA)), v)
    g = oc.Guide(index)
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3, _walk(ids, g.get_tokens, g.advance)


def bench_xgrammar(tok, width, eos, ids):
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast

    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(PreTrainedTokenizerFast(tokenizer_object=tok), vocab_size=width,
                                              stop_token_ids=[eos])
    t1 = time.perf_counter()
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA))
    m = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3, _walk(ids, lambda: m.fill_next_token_bitmask(bitmask), m.accept_token)


LIBRARIES = {"llguidance": bench_llguidance, "outlines-core": bench_outlines, "xgrammar": bench_xgrammar}


def run(export: Path, repeats: int) -> dict:
    from edgespec.io.integrity import tokenizer_width
    from edgespec.io.manifest import load_manifest
    from edgespec.io.text import load_tokenizer

    m = load_manifest(export)
    tok = load_tokenizer(export / m.tokenizer)
    width = min(m.target.vocab_size, tokenizer_width(tok))
    eos = m.special_tokens.eos
    ids = tok.encode(DOC, add_special_tokens=False).ids
    out = {"export": str(export), "vocab": width, "doc_tokens": len(ids), "libraries": {}}
    for name, fn in LIBRARIES.items():
        try:
            runs = [fn(tok, width, eos, ids) for _ in range(repeats)]
        except ImportError as e:
            out["libraries"][name] = {"error": f"not installed ({e.name})"}
            continue
        except Exception as e:  # a library that cannot take this tokenizer: reported, the others still run
            out["libraries"][name] = {"error": f"{type(e).__name__}: {str(e)[:120]}"}
            continue
        masks = np.concatenate([r[2] for r in runs])
        out["libraries"][name] = {"tokenizer_ms": float(np.median([r[0] for r in runs])),
                                  "compile_ms": float(np.median([r[1] for r in runs])),
                                  "mask_us_p50": float(np.median(masks)), "mask_us_p90": float(np.percentile(masks, 90))}
    return out


def main(argv=None) -> int:
    from edgespec.io import paths

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("export", nargs="?", help="export directory (default: the default pair in the user cache)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    res = run(Path(a.export).expanduser() if a.export else paths.default_export_dir(), a.repeats)
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    print(f"vocabulary {res['vocab']}, document {res['doc_tokens']} tokens")
    print("| library | tokenizer ms | compile ms | mask µs p50 | mask µs p90 |\n|---|---|---|---|---|")
    for name, r in res["libraries"].items():
        if "error" in r:
            print(f"| {name} | {r['error']} | | | |")
        else:
            print(f"| {name} | {r['tokenizer_ms']:.0f} | {r['compile_ms']:.1f} | {r['mask_us_p50']:.0f} | "
                  f"{r['mask_us_p90']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
