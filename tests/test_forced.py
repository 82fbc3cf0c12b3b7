"""The grammar proposer (tiny pair): a constraint's forced tokens proposed at no model cost, always accepted, lossless.

Forced tokens (:meth:`~edgespec.core.constrain.Matcher.forced`) are those the grammar's mask leaves alone at their
position; proposed as a fixed proposal they have p = 1 under the masked target and are always accepted. With
them first among the proposers, greedy output equals plain decoding, sampling follows the masked p, and nothing
changes without a constraint.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgespec.decoder import SpecDecoder
from edgespec.kpolicy import Offer, RoundPlan
from edgespec.processors import Pipeline, Processing
from edgespec.sampling import SamplingParams, probs

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from edgespec.constrain import FORCED_MAX, Constraint, Matcher  # noqa: E402
from edgespec.draft.grammar import GrammarForced, with_grammar  # noqa: E402

# long property names in the tiny BPE vocabulary: each is several tokens, all forced once its first byte is
SCHEMA = {"type": "object", "properties": {"identifier": {"type": "string", "maxLength": 8},
                                           "accepted": {"type": "boolean"},
                                           "category": {"enum": ["alpha", "beta"]}},
          "required": ["identifier", "accepted", "category"], "additionalProperties": False}
SPEC = dict(proposers=("lookup", "draft"), k=4)  # the default mode's proposers (serve, generate, chat)


@pytest.fixture(scope="module")
def dec(tiny_export):
    return SpecDecoder.load(tiny_export)


def _enc(dec, text):
    return dec.tokenizer.encode(text, add_special_tokens=False).ids


def run(dec, ids, **kw):
    dec.reset()
    return dec.generate(input_ids=ids, **kw).run()


def test_forced_tokens_of_a_small_schema(dec):
    m = Matcher(Constraint.json_schema(SCHEMA), dec.tokenizer, dec.width, dec.stop_ids)
    prefix = _enc(dec, '{"')
    run_ = m.forced(prefix)
    text = dec.tokenizer.decode(run_)
    assert len(run_) >= 2 and 'identifier"'.startswith(text), text  # the property name, several tokens
    for i, t in enumerate(run_):  # each is the only token its position allows
        mask = m.allowed(prefix + run_[:i])
        assert mask[t] and mask.sum() == 1
    assert m.allowed(prefix + run_).sum() > 1  # the run is maximal: the next position has a choice
    assert m.forced(prefix, 1) == run_[:1] and m.forced(prefix) == run_  # a limit, and the cache
    assert m.forced(prefix + _enc(dec, 'identifier": "')) == []  # inside a string: a choice
    assert len(m.forced(prefix, 99)) <= FORCED_MAX
    # later properties: after the first value, the next name is forced from its opening quote
    mid = _enc(dec, '{"identifier": "ab", "')
    assert dec.tokenizer.decode(m.forced(mid)).startswith("acc")
    # a complete object: only the stop token(s) remain; a single stop id is forced, and the run ends with it
    done = _enc(dec, '{"identifier": "ab", "accepted": true, "category": "beta"}')
    stops = m.forced(done)
    assert stops == ([int(next(iter(dec.stop_ids)))] if len(dec.stop_ids) == 1 else [])
    assert m.forced(_enc(dec, "[")) == []  # outside the grammar: nothing


def test_no_constraint_no_grammar_proposals(dec):
    ids = dec.encode(messages=[{"role": "user", "content": "json please"}])
    g = GrammarForced()
    for processing in (None, Processing(presence_penalty=1.0)):  # no pipeline, a pipeline without a matcher
        dec.reset()
        gen = dec.generate(input_ids=ids, max_new_tokens=30, processing=processing,
                           proposers=("grammar", "lookup", "draft"), k=3)
        seen = []
        for _ in gen:
            seen.append(g.offer(dec.context(), 8))
        assert seen and all(o == Offer(g, 0) for o in seen)
        assert "grammar" not in gen.stats.proposers
    names = [p.name for p in dec.proposers_for(_options(proposers=("lookup",), processing=Processing(0.5)))]
    assert names == ["lookup"]  # without a constraint the proposers are the options' own


def _options(**kw):
    from edgespec.generation import GenerationOptions

    return GenerationOptions(**kw)


def test_a_constraint_puts_the_grammar_proposer_first(dec):
    proc = Processing(constraint=Constraint.json_schema(SCHEMA))
    names = [p.name for p in dec.proposers_for(_options(proposers=("lookup", "draft"), processing=proc))]
    assert names == ["grammar", "lookup", "draft"]
    assert dec.proposers_for(_options(proposers=(), processing=proc)) == []  # plain stays plain
    assert [p.name for p in with_grammar([GrammarForced()], proc)] == ["grammar"]  # not twice


@pytest.mark.parametrize("kw", [dict(proposers=("grammar",), k=8), SPEC, dict(SPEC, adaptive=True)],
                         ids=["grammar", "default-fixed", "default-adaptive"])
def test_greedy_with_forced_tokens_equals_plain_and_every_forced_token_is_accepted(dec, kw):
    proc = Processing(constraint=Constraint.json_schema(SCHEMA))
    ids = dec.encode(messages=[{"role": "user", "content": "identifier please"}])
    plain = run(dec, ids, max_new_tokens=80, proposers=(), processing=proc)
    kw = dict(kw)
    policy = None
    if kw.pop("adaptive", False):
        from edgespec.adaptive import AdaptiveK, CostModel

        policy = AdaptiveK(CostModel([1.0 + 0.1 * n for n in range(17)], draft_ms=0.5))
    g = run(dec, ids, max_new_tokens=80, processing=proc, policy=policy, **kw)
    assert g.token_ids == plain.token_ids
    s = g.stats.proposers["grammar"]
    assert s.rounds > 0 and s.proposed >= s.rounds and s.accepted == s.proposed  # always accepted


@pytest.mark.parametrize("seeded", [False, True], ids=["standard", "gumbel"])
def test_sampled_forced_tokens_are_always_accepted_and_outputs_validate(dec, seeded):
    proc = Processing(constraint=Constraint.json_schema(SCHEMA))
    ids = dec.encode(messages=[{"role": "user", "content": "json please"}])
    proposed = 0
    for seed in range(6):
        kw = dict(seed=seed) if seeded else dict(coupling="standard")
        g = run(dec, ids, max_new_tokens=200, temperature=1.0, processing=proc, **kw, **SPEC)
        assert g.stats.stop_reason == "stop_token", g.text
        jsonschema.validate(json.loads(g.text), SCHEMA)
        s = g.stats.proposers.get("grammar")
        if s is not None:
            assert s.accepted == s.proposed
            proposed += s.proposed
        if seeded:  # the Gumbel coupling: the text depends on the seed and the masked target only
            assert g.token_ids == run(dec, ids, max_new_tokens=200, temperature=1.0, processing=proc, seed=seed,
                                      proposers=()).token_ids
    assert proposed > 0


def test_the_token_after_a_forced_run_follows_the_masked_p(dec):
    """Tier (d): a grammar round proposes the forced run of a property name; the token after it (the bonus, drawn
    from the target's row after the run, with the run in its history) follows the masked p within sampling
    noise, and the run itself is emitted every time."""
    sp, draws = SamplingParams(1.0), 1500
    prompt = dec.encode(messages=[{"role": "user", "content": "identifier?"}])
    ids = prompt + _enc(dec, '{"')
    c = Constraint.json_schema(SCHEMA)
    dec.reset()
    dec.processor = Pipeline(Processing(constraint=c), dec.width, len(prompt),
                             Matcher(c, dec.tokenizer, dec.width, dec.stop_ids))
    try:
        dec.prefill(ids, sp, np.random.default_rng(0))  # commits one sampled token after ids
        forced = dec.processor.matcher.forced(dec.tokens[len(prompt):])
        assert len(forced) >= 1
        after = dec.tokens + forced
        raw = dec.target.forward(after, dec.target.new_cache(), keep=1)[-1]
        p = probs(dec.processor(after, raw), sp)
        assert (p > 0).sum() > 1  # a real choice after the run
        n = len(dec.tokens)
        counts = np.zeros_like(p)
        for s in range(draws):
            dec.rewind_to(n)
            r = dec.run_round(RoundPlan(GrammarForced(), k=8), sp, np.random.default_rng(s))
            assert r.tokens[:len(forced)] == forced and r.accepted == len(forced)
            counts[r.tokens[len(forced)]] += 1
    finally:
        dec.processor = None
        dec.reset()
    assert counts[p == 0].sum() == 0  # never a token the grammar forbids
    rng = np.random.default_rng(0)
    noise = np.mean([0.5 * np.abs(rng.multinomial(draws, p) / draws - p).sum() for _ in range(20)])
    assert 0.5 * np.abs(counts / draws - p).sum() < 3 * noise + 0.01


@pytest.mark.parametrize("body", [
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}},
    {"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
        "additionalProperties": False}}}], "tool_choice": "required"}], ids=["response_format", "tool_call"])
def test_the_servers_default_mode_proposes_the_forced_tokens(tiny_tool_export, home, body):
    """What ``edgespec serve`` runs for a constrained request (its default flags' options and controller, the
    request's overrides): the grammar's forced tokens are proposed and all accepted, the output that of plain."""
    from edgespec.apps.cli import _gen_kwargs, build_parser
    from edgespec.openai_fields import parse_extras
    from edgespec.serve_fields import generation_overrides

    d = SpecDecoder.load(tiny_tool_export)
    kw = _gen_kwargs(build_parser().parse_args(["serve", str(tiny_tool_export), "--max-new-tokens", "120"]), d)
    x = parse_extras(body, chat=True)
    over = generation_overrides(d, x)
    assert over["processing"].constraint is not None
    ids = d.encode(messages=[{"role": "user", "content": "identifier and weather, as JSON"}],
                   tools=list(x.tools) if x.tools else None)
    d.reset()
    g = d.generate(input_ids=ids, **kw, **over).run()
    d.reset()
    plain = d.generate(input_ids=ids, options=kw["options"], proposers=(), **over).run()
    assert g.token_ids == plain.token_ids
    s = g.stats.proposers["grammar"]
    assert s.rounds > 0 and s.accepted == s.proposed
