"""Logits processors and grammars under speculation (tiny pair): penalties, logit bias, JSON schemas, logprobs.

The processors are applied to the target's p and the draft's q alike, so speculative output must equal plain
output under greedy decoding and follow the processed p when sampling.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgespec.engine.decoder import SpecDecoder
from edgespec.core.round import RoundPlan
from edgespec.core.processors import Pipeline, Processing, process_rows, token_logprobs
from edgespec.draft import DraftChain
from edgespec.core.sampling import SamplingParams, probs
from edgespec.core.token_tree import TokenTree

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from edgespec.core.constrain import Constraint, Matcher  # noqa: E402

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "ok": {"type": "boolean"},
                                           "kind": {"enum": ["add", "node", "fox"]}},
          "required": ["name", "ok", "kind"], "additionalProperties": False}
MODES = {"draft": dict(proposers=("draft",), k=3), "lookup": dict(proposers=("lookup",), k=3),
         "tree": dict(proposers=("tree",), n_nodes=6), "lookup+draft": dict(proposers=("lookup", "draft"), k=4)}


@pytest.fixture(scope="module")
def dec(tiny_export):
    return SpecDecoder.load(tiny_export)


def run(dec, ids, **kw):
    dec.reset()
    return dec.generate(input_ids=ids, **kw).run()


def test_processing_is_validated():
    with pytest.raises(ValueError, match="presence_penalty"):
        Processing(presence_penalty=3)
    with pytest.raises(ValueError, match="repetition_penalty"):
        Processing(repetition_penalty=0)
    with pytest.raises(ValueError, match="logit_bias"):
        Processing(logit_bias={5: 200})
    assert not Processing().active and Processing(logit_bias={3: -1}).logit_bias == ((3, -1.0),)


def test_pipeline_formulas_on_hand_made_logits():
    z = np.array([1.0, -1.0, 2.0, 0.5], dtype=np.float32)
    hist = [2, 1, 0, 0, 1]  # prompt [2, 1], generated [0, 0, 1]
    pen = Pipeline(Processing(presence_penalty=0.5, frequency_penalty=0.25), 4, start=2)(hist, z)
    assert pen.tolist() == pytest.approx([1 - 0.5 - 0.5, -1 - 0.5 - 0.25, 2.0, 0.5])  # the prompt's 2 is free
    rep = Pipeline(Processing(repetition_penalty=2.0), 4, start=2)(hist, z)
    assert rep.tolist() == pytest.approx([0.5, -2.0, 1.0, 0.5])  # prompt and generated, CTRL's rule
    bias = Pipeline(Processing(logit_bias={3: 10}), 4, start=2)(hist, z)
    assert bias.tolist() == pytest.approx([1.0, -1.0, 2.0, 10.5])
    with pytest.raises(ValueError, match="not a token id"):
        Pipeline(Processing(logit_bias={9: 1}), 4, start=0)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_penalties_change_plain_output_and_speculative_equals_plain(dec, mode):
    ids = dec.encode(messages=[{"role": "user", "content": "for i in range(10):"}])
    base = run(dec, ids, max_new_tokens=40, proposers=())
    proc = Processing(presence_penalty=1.5, frequency_penalty=0.5, repetition_penalty=1.3,
                      logit_bias=((base.token_ids[3], -5.0),))
    plain = run(dec, ids, max_new_tokens=40, proposers=(), processing=proc)
    assert plain.token_ids != base.token_ids  # the processors act
    spec = run(dec, ids, max_new_tokens=40, processing=proc, **MODES[mode])
    assert spec.token_ids == plain.token_ids
    assert dec.processor is None  # only for the generation's duration


def test_verify_rows_see_the_proposal_prefix():
    """Row i+1 of a chain is processed with the first i+1 proposal tokens in its history."""
    pipe = Pipeline(Processing(frequency_penalty=1.0), 6, start=1)
    tree = TokenTree.chain([3, 3, 4])
    rows = process_rows(pipe, [0, 5], tree, np.zeros((4, 6), dtype=np.float32))
    assert rows[:, 3].tolist() == [0, -1, -2, -2] and rows[:, 5].tolist() == [-1, -1, -1, -1]


def test_json_schema_output_validates_on_every_seed(dec):
    c = Constraint.json_schema(SCHEMA)
    ids = dec.encode(messages=[{"role": "user", "content": "json please"}])
    for seed in range(12):
        mode = list(MODES.values())[seed % len(MODES)]
        g = run(dec, ids, max_new_tokens=120, temperature=1.0, seed=seed, processing=Processing(constraint=c),
                **mode)
        assert g.stats.stop_reason == "stop_token", g.text
        jsonschema.validate(json.loads(g.text), SCHEMA)


def test_greedy_under_a_grammar_speculative_equals_plain(dec):
    proc = Processing(constraint=Constraint.json_object())
    ids = dec.encode(messages=[{"role": "user", "content": "def add"}])
    plain = run(dec, ids, max_new_tokens=60, proposers=(), processing=proc)
    assert plain.text.lstrip().startswith("{")
    for mode in MODES.values():
        assert run(dec, ids, max_new_tokens=60, processing=proc, **mode).token_ids == plain.token_ids


def test_matcher_follows_rollbacks(dec):
    m = Matcher(Constraint.json_schema(SCHEMA), dec.tokenizer, dec.width, dec.stop_ids)
    good = dec.tokenizer.encode('{"name": "ab", "ok": true, "kind": "fox"}', add_special_tokens=False).ids
    masks = [m.allowed(good[:i]).copy() for i in range(len(good) + 1)]
    assert all(masks[i][good[i]] for i in range(len(good)))
    assert masks[-1][sorted(dec.stop_ids)].all() and masks[-1].sum() == len(dec.stop_ids)  # complete: stop only
    bad = dec.tokenizer.encode("[", add_special_tokens=False).ids
    assert m.allowed(bad) is None  # the history left the grammar
    m.cache.clear()
    for i in (5, 2, len(good), 0, 7):  # jump back and forth: the matcher rolls back and re-consumes
        assert (m.allowed(good[:i]) == masks[i]).all()


def test_first_constrained_token_of_a_round_follows_the_masked_p(dec):
    """Tier (d) under a grammar: the first token a speculative round (noisy draft, K = 3) emits inside a JSON
    string follows the target's masked p, within sampling noise."""
    sp, draws = SamplingParams(1.0), 1500
    prompt = dec.encode(messages=[{"role": "user", "content": "name?"}])
    ids = prompt + dec.tokenizer.encode('{"name": "', add_special_tokens=False).ids
    c = Constraint.json_schema(SCHEMA)
    dec.reset()
    dec.processor = Pipeline(Processing(constraint=c), dec.width, len(prompt),
                             Matcher(c, dec.tokenizer, dec.width, dec.stop_ids))
    try:
        raw = dec.target.forward(ids, dec.target.new_cache(), keep=1)[-1]
        p = probs(dec.processor(ids, raw), sp)
        assert 10 < (p > 0).sum() < dec.width  # the mask bites, and leaves a real choice
        dec.prefill(ids, sp, np.random.default_rng(0))
        counts = np.zeros_like(p)
        for s in range(draws):
            dec.rewind_to(len(ids))
            r = dec.run_round(RoundPlan(DraftChain(), k=3), sp, np.random.default_rng(s))
            counts[r.tokens[0]] += 1
    finally:
        dec.processor = None
        dec.reset()
    assert counts[p == 0].sum() == 0  # never a token the grammar forbids
    rng = np.random.default_rng(0)
    noise = np.mean([0.5 * np.abs(rng.multinomial(draws, p) / draws - p).sum() for _ in range(20)])
    assert 0.5 * np.abs(counts / draws - p).sum() < 3 * noise + 0.01


@pytest.mark.parametrize("mode", ["plain", "draft", "lookup+draft"])
def test_logprobs_equal_log_softmax_of_the_target_at_the_emitted_tokens(dec, mode):
    ids = dec.encode(messages=[{"role": "user", "content": "class Node"}])
    kw = dict(proposers=()) if mode == "plain" else MODES[mode]
    g = run(dec, ids, max_new_tokens=30, temperature=0.8, seed=3, logprobs=3, **kw)
    lps = g.stats.token_logprobs
    assert [e.token_id for e in lps] == g.token_ids
    full = dec.target.forward(ids + g.token_ids[:-1], dec.target.new_cache())[len(ids) - 1:].astype(np.float64)
    want = full - full.max(-1, keepdims=True)
    want -= np.log(np.exp(want).sum(-1, keepdims=True))
    got = np.array([e.logprob for e in lps])
    assert np.abs(got - want[np.arange(len(lps)), g.token_ids]).max() < 1e-3  # fp32 kernel noise
    for e, row in zip(lps, want):
        assert len(e.top) == 3 and [t for t, _ in e.top] == list(np.argsort(-row, kind="stable")[:3])
    assert "token_logprobs" not in g.stats.to_dict()


def test_token_logprobs_top_alternatives():
    rows = np.log(np.array([[0.5, 0.3, 0.2]], dtype=np.float32))
    (e,) = token_logprobs(rows, [1], 2)
    assert e.logprob == pytest.approx(np.log(0.3)) and [t for t, _ in e.top] == [0, 1]


def test_generate_json_schema_flag(tiny_export, home, tmp_path):
    from test_cli import run as run_cli

    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(SCHEMA))
    r = run_cli(["generate", str(tiny_export), "--prompt", "json", "--json", "--json-schema", str(schema),
                 "--max-new-tokens", "120", "--temperature", "0.9", "--seed", "2"], home)
    assert r.returncode == 0, r.stderr
    jsonschema.validate(json.loads(json.loads(r.stdout)["text"]), SCHEMA)
    for bad, why in (("nope.json", "No such file"), ("bad.json", "not JSON"), ("type.json", "invalid JSON schema")):
        if bad != "nope.json":
            (tmp_path / bad).write_text("{" if bad == "bad.json" else '{"type": "frobnicate"}')
        r = run_cli(["generate", str(tiny_export), "--prompt", "x", "--json-schema", str(tmp_path / bad)], home)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode != 0 and len(lines) == 1 and why in lines[0] and "Traceback" not in r.stderr, r.stderr


def test_seeded_sampling_under_processors_is_drafter_invariant(dec):
    """With a seed (the Gumbel coupling) a sampled text depends only on the seed and the processed target: the
    same under every proposer as plain, with a grammar and penalties on p and q."""
    ids = dec.encode(messages=[{"role": "user", "content": "json please"}])
    proc = Processing(presence_penalty=0.8, repetition_penalty=1.2, constraint=Constraint.json_schema(SCHEMA))
    for seed in (1, 2):
        plain = run(dec, ids, max_new_tokens=80, temperature=0.9, seed=seed, proposers=(), processing=proc)
        assert plain.stats.coupling == "gumbel"
        for mode in MODES.values():
            assert run(dec, ids, max_new_tokens=80, temperature=0.9, seed=seed, processing=proc,
                       **mode).token_ids == plain.token_ids
