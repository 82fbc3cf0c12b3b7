"""A draft that reads its own prompt (:attr:`GenerationOptions.draft_prompt`, :meth:`DraftModel.set_prompt`): a
fill-in-the-middle prompt cut to the code around the cursor (:func:`edgespec.apps.fim.build_draft_ids`).

The output never depends on what the draft read (greedy and seeded sampling equal plain decoding); the draft's
cache always holds its view of the committed tokens (its rows equal a fresh run over that view, after rounds,
rollbacks, a second prompt that shares a prefix, and a rewind into the prompt); its catch-up is the draft
prompt, not the prompt; bad draft prompts are refused before any work.
"""

import json

import numpy as np
import pytest

from edgespec import SpecDecoder
from edgespec.apps.fim import FimPrompt, build_draft_ids, build_ids, fim_tokens
from edgespec.core.round import RoundPlan
from edgespec.core.sampling import SamplingParams
from edgespec.engine.generation import GenerationOptions

PROMPT = "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n\ndef fact(n):\n"
# the tiny tokenizer spends about a token per character, its context is 256 tokens
LONG_PREFIX = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(4)) + "def g(y):\n    z = "
SUFFIX = "\n    return z\n\n" + "".join(f"h{i} = g({i})\n" for i in range(2))


@pytest.fixture(scope="module")
def dec(tiny_export):
    return SpecDecoder.load(tiny_export)


def _ids(dec, **kw):
    dec.reset()
    return dec.generate(input_ids=dec.encode(PROMPT), max_new_tokens=30, **kw).run().token_ids


def _cut(dec):
    ids = dec.encode(PROMPT)
    return ids, tuple(ids[-6:])  # the prompt's last tokens only


def _assert_view_cached(dm, tokens):
    """The draft's cached rows are those of a fresh run over its view of ``tokens``: the next row's logits agree."""
    view = list(dm.view(tokens))
    assert dm.cache.length < len(view)
    cached = dm.lm.forward(view[dm.cache.length:], dm.cache)[-1]
    fresh = dm.lm.forward(view, dm.lm.new_cache())[-1]
    dm.keep(len(tokens) - 1)  # back to the state before this check (the last token unread)
    np.testing.assert_allclose(cached, fresh, atol=1e-4)


@pytest.mark.parametrize("proposers", [("draft",), ("tree",), ("lookup", "draft")])
def test_greedy_output_is_plain_decoding_whatever_the_draft_reads(dec, proposers):
    ids, cut = _cut(dec)
    plain = _ids(dec, proposers=())
    dec.reset()
    g = dec.generate(input_ids=ids, max_new_tokens=30, k=3, proposers=proposers, draft_prompt=cut).run()
    assert g.token_ids == plain and g.stats.proposed > 0
    _assert_view_cached(dec.draft_model, dec.tokens)


def test_seeded_sampling_is_plain_sampling_whatever_the_draft_reads(dec):
    ids, cut = _cut(dec)
    kw = dict(temperature=1.0, top_p=0.95, seed=11)
    plain = _ids(dec, proposers=(), **kw)
    assert _ids(dec, k=3, draft_prompt=cut, **kw) == plain
    assert _ids(dec, k=3, draft_prompt=(ids[0],), **kw) == plain  # a one-token draft prompt


def test_the_catch_up_reads_the_draft_prompt_not_the_prompt(dec):
    ids, cut = _cut(dec)
    sp, rng = SamplingParams(0.0), np.random.default_rng(0)
    proposer = dec.proposers_for(GenerationOptions())[0]
    for draft_prompt, want in ((None, len(ids)), (list(cut), len(cut))):
        dec.reset()
        dec.prefill(ids, sp, rng, draft_prompt=draft_prompt)
        r = dec.run_round(RoundPlan(proposer, k=2), sp, rng)
        assert r.catchup_tokens == want  # the first feed: the prompt (or draft prompt) + the first new token
        # it read that feed and the first drafted token; the rollback keeps the rows of the accepted ones
        assert dec.dcache.length == want + 1 + min(r.accepted, 1)


def test_the_draft_cache_follows_its_view_through_reuse_and_rewinds(dec):
    ids, cut = _cut(dec)
    dm = dec.draft_model
    dec.reset()
    dec.generate(input_ids=ids, max_new_tokens=12, k=3, draft_prompt=cut).run()
    assert dm.prompts is not None
    _assert_view_cached(dm, dec.tokens)
    # a longer prompt that starts with the last one, its draft prompt with the last draft prompt: rows are kept
    more = dec.tokens + dec.encode("    return 1\n")
    cut2 = cut + tuple(more[len(ids):])
    dec.prefill(more, SamplingParams(0.0), np.random.default_rng(0), draft_prompt=list(cut2))
    assert dm.cache.length >= len(cut) + 12 - 1
    dec.generate(input_ids=more, max_new_tokens=8, k=2, draft_prompt=cut2).run()
    _assert_view_cached(dm, dec.tokens)
    # a rewind into the prompt: the view becomes the committed tokens, the cache keeps what both prompts share
    dec.rewind_to(3)
    assert dm.prompts is None and dm.cache.length <= 2
    _assert_view_cached(dm, dec.tokens)
    # then a generation without a draft prompt reads the prompt itself
    dec.generate(input_ids=ids, max_new_tokens=8, k=2).run()
    assert dm.prompts is None
    _assert_view_cached(dm, dec.tokens)
    # and a cached prefix with a draft prompt (the server's prompt-only /infill)
    dec.cache_prefix(ids, list(cut))
    assert dm.cache.length == len(cut) - 1 and dec.tcache.length == len(ids) - 1
    _assert_view_cached(dm, dec.tokens)


@pytest.mark.parametrize("bad", [(), ("a",), (1.5,), (True,), (-1,), "ab"])
def test_bad_draft_prompts_are_refused(bad):
    with pytest.raises(ValueError, match="draft_prompt"):
        GenerationOptions(draft_prompt=bad)


def test_a_draft_prompt_out_of_range_or_longer_than_the_prompt_is_refused(dec):
    ids = dec.encode(PROMPT)
    with pytest.raises(ValueError, match="draft_prompt.*longer"):
        dec.generate(input_ids=ids, draft_prompt=tuple(ids) + (1,))
    with pytest.raises(ValueError, match="draft_prompt.*not a token id"):
        dec.generate(input_ids=ids, draft_prompt=(dec.encoder.n_tokens + 5,))
    with pytest.raises(ValueError, match="draft prompt"):
        dec.cache_prefix(ids, [])
    with pytest.raises(ValueError, match="^draft_prompt: .*not a token id"):
        dec.cache_prefix(ids, [dec.encoder.n_tokens + 5])


# -- the FIM draft prompt --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fim_dec(tiny_fim_export):
    return SpecDecoder.load(tiny_fim_export)


def _fim(d, p, window):
    t = fim_tokens(d.tokenizer)
    return (build_ids(d.tokenizer, lambda: d.plain_tokenizer, t, p),
            build_draft_ids(d.tokenizer, lambda: d.plain_tokenizer, t, p, window), t)


def test_the_fim_draft_prompt_is_the_code_around_the_cursor(fim_dec):
    p = FimPrompt(LONG_PREFIX, SUFFIX, (("other.py", "x = 1\n"),))
    full, draft, t = _fim(fim_dec, p, 64)
    assert draft is not None and len(draft) < len(full)
    enc = lambda s: fim_dec.tokenizer.encode(s, add_special_tokens=False).ids  # noqa: E731
    before, after = enc(LONG_PREFIX), enc(SUFFIX)
    assert draft[0] == t.prefix and draft[-1] == t.middle and t.repo_name not in draft and t.file_sep not in draft
    s = draft.index(t.suffix)
    assert 48 <= s - 1 < 48 + 12 and draft[1:s] == before[-(s - 1):]  # ~3/4 of the window: the prefix's end
    assert draft[s + 1:-1] == after[:16]  # 1/4: the suffix's start
    assert _fim(fim_dec, p, 0)[1] is None  # 0: the whole prompt
    assert _fim(fim_dec, FimPrompt("a = ", "\n"), 64)[1] is None  # nothing to cut
    with pytest.raises(ValueError):
        _fim(fim_dec, p, -1)
    # typing at the cursor: the draft prompt's start stays, so its cached rows are reused
    later = _fim(fim_dec, FimPrompt(LONG_PREFIX + "y +", SUFFIX), 64)[1]
    assert later[:s - 4] == draft[:s - 4]


def test_fim_with_a_draft_window_equals_plain_decoding(fim_dec):
    full, draft, _ = _fim(fim_dec, FimPrompt(LONG_PREFIX, SUFFIX), 64)
    fim_dec.reset()
    plain = fim_dec.generate(input_ids=full, max_new_tokens=24, proposers=()).run().token_ids
    fim_dec.reset()
    g = fim_dec.generate(input_ids=full, max_new_tokens=24, k=3, draft_prompt=tuple(draft)).run()
    assert g.token_ids == plain and g.stats.proposed > 0


def test_the_server_and_complete_use_the_draft_window(tiny_fim_export, fim_dec, home, tmp_path):
    from test_fim import _cli
    from test_serve import Server

    outs = []
    for flags in (("--draft-window", "64"), ("--draft-window", "0"), ("--mode", "plain")):
        r = _cli(home, tiny_fim_export, "--prefix-text", LONG_PREFIX, "--suffix-text", SUFFIX, "--max-new-tokens", 16,
                 *flags, "--json")
        assert r.returncode == 0, r.stderr
        outs.append(json.loads(r.stdout))
    assert outs[0]["text"] == outs[1]["text"] == outs[2]["text"] and outs[0]["stats"]["proposed"] > 0
    n_draft = len(_fim(fim_dec, FimPrompt(LONG_PREFIX, SUFFIX), 64)[1])
    assert outs[0]["stats"]["draft_prompt_tokens"] == n_draft and outs[1]["stats"]["draft_prompt_tokens"] is None
    r = _cli(home, tiny_fim_export, "--prefix-text", "a", "--draft-window", "-3")
    assert r.returncode == 2 and "--draft-window" in r.stderr and "Traceback" not in r.stderr
    s = Server(tiny_fim_export, home, tmp_path / "server.log", "--draft-window", "64")
    try:
        body = {"input_prefix": LONG_PREFIX, "input_suffix": SUFFIX, "n_predict": 16, "temperature": 0}
        status, res = s.post("/infill", json.dumps(body).encode())
        assert status == 200, res
        status, res2 = s.post("/v1/completions", json.dumps({"prompt": LONG_PREFIX, "suffix": SUFFIX, "max_tokens": 16,
                                                             "temperature": 0}).encode())
        assert status == 200, res2
        assert res["content"] == outs[0]["text"] and res2["choices"][0]["text"] == res["content"]
        # each FIM endpoint gave its job the draft's own prompt
        assert res["edgespec"]["draft_prompt_tokens"] == res2["edgespec"]["draft_prompt_tokens"] == n_draft
        ollama = {"model": "m", "prompt": LONG_PREFIX, "suffix": SUFFIX, "stream": False,
                  "options": {"num_predict": 16, "temperature": 0}}
        status, res3 = s.post("/api/generate", json.dumps(ollama).encode())
        assert status == 200 and res3["response"] == res["content"], res3
        assert res3["edgespec"]["draft_prompt_tokens"] == n_draft
        status, r0 = s.post("/infill", json.dumps({**body, "n_predict": 0}).encode())  # prompt only, then reuse
        status, r1 = s.post("/infill", json.dumps(body).encode())
        assert status == 200 and r1["content"] == res["content"] and r1["tokens_cached"] == r1["tokens_evaluated"] - 1
    finally:
        s.close()


def test_the_server_sets_the_draft_prompt_of_a_fim_job(fim_dec, monkeypatch):
    from types import SimpleNamespace

    from edgespec.apps import fim
    from edgespec.apps.fim_serve import draft_view

    p = FimPrompt(LONG_PREFIX, SUFFIX)
    full, want, _ = _fim(fim_dec, p, 64)
    # the job's prompt is the FIM prompt already: it is not tokenized again (other files and all) for its length
    monkeypatch.setattr(fim, "build_ids", lambda *a: pytest.fail("the FIM prompt was built twice"))
    for window, expect in ((64, tuple(want)), (0, None)):
        job = SimpleNamespace(overrides={}, ids=full)
        draft_view(SimpleNamespace(decoder=fim_dec, fim_draft_window=window), p, job)
        assert job.overrides.get("draft_prompt") == expect


# -- review: rewinds to the prompt, tree positions, the standard rule, direct prefill ------------------------


def test_a_rewind_to_the_prompt_keeps_the_draft_view(dec):
    """rewind_to(len(prompt)) keeps the whole prompt committed: the draft keeps reading its own prompt (its
    rows of all of it but the last token), not the target's from the start."""
    ids, cut = _cut(dec)
    dm, sp, rng = dec.draft_model, SamplingParams(0.0), np.random.default_rng(0)
    proposer = dec.proposers_for(GenerationOptions())[0]
    dec.reset()
    dec.prefill(ids, sp, rng, draft_prompt=list(cut))
    dec.run_round(RoundPlan(proposer, k=3), sp, rng)
    dec.rewind_to(len(ids))
    assert dm.prompts is not None and dm.cache.length == len(cut) - 1
    _assert_view_cached(dm, dec.tokens)
    assert dm.prompts is not None  # the check's own rollback (to len(prompt) - 1 positions) keeps it too
    r = dec.run_round(RoundPlan(proposer, k=3), sp, rng)
    assert r.catchup_tokens == 0  # the first feed: the draft prompt's last token only (a draft step)
    dec.rewind_to(len(ids) - 1)  # into the prompt: the view is the committed tokens again
    assert dm.prompts is None
    _assert_view_cached(dm, dec.tokens)


def test_tree_nodes_are_drafted_at_their_positions_in_the_drafts_view(dec):
    """Each tree node's q is the draft's distribution after its view + the node's path, as a fresh run of the
    draft over them gives (a node drafted at the target's positions would differ: only alpha would show it)."""
    ids, cut = _cut(dec)
    dm, sp = dec.draft_model, SamplingParams(0.0)
    tree_proposer = dec.proposers_for(GenerationOptions(proposers=("tree",)))[0]
    dec.reset()
    dec.prefill(ids, sp, np.random.default_rng(0), draft_prompt=list(cut))
    view = list(dm.view(dec.tokens))
    prop = tree_proposer.propose(dec.context(), 12, sp, np.random.default_rng(0))
    deep = [v for v in prop.tree.q if v >= 0]
    assert deep  # a tree of more than one level
    for v in deep:
        path = prop.tree.path_tokens(v)
        fresh = dm.lm.forward(view + path, dm.lm.new_cache(), keep=1)[-1]
        np.testing.assert_allclose(prop.tree.q[v], dm.probs(fresh, SamplingParams(1.0), dec.tokens, path), atol=1e-5)
    dec.reset()


def test_the_first_token_follows_p_under_the_standard_rule_with_a_draft_prompt(dec):
    """The accept/reject rule with the q of a draft that read its own prompt: the first token's histogram is
    within sampling noise of p (the seeded test above runs the Gumbel coupling, exact whatever q is)."""
    from edgespec.core.sampling import probs
    from edgespec.engine.decoder import forward_tokens

    ids, cut = _cut(dec)
    sp, draws = SamplingParams(0.8, top_p=0.95), 2000
    cache = dec.target.new_cache()
    forward_tokens(dec.target, ids[:-1], cache)  # as the prefill (then cropped to them) holds the prompt
    p = probs(dec.target.forward(ids[-1:], cache)[-1], sp)
    proposer = dec.proposers_for(GenerationOptions())[0]
    dec.reset()
    dec.prefill(ids, sp, np.random.default_rng(0), draft_prompt=list(cut))
    counts = np.zeros_like(p)
    for s in range(draws):
        dec.rewind_to(len(ids))
        assert dec.draft_model.prompts is not None
        counts[dec.run_round(RoundPlan(proposer, k=3), sp, np.random.default_rng(s)).tokens[0]] += 1
    rng = np.random.default_rng(0)
    noise = np.mean([0.5 * np.abs(rng.multinomial(draws, p / p.sum()) / draws - p).sum() for _ in range(20)])
    assert 0.5 * np.abs(counts / draws - p).sum() < 3 * noise + 0.01
    dec.reset()


@pytest.mark.parametrize("bad", [lambda ids: list(ids) + [1], lambda ids: []])
def test_a_direct_prefill_refuses_a_draft_prompt_longer_than_the_prompt_before_any_change(dec, bad):
    ids = dec.encode(PROMPT)
    dec.reset()
    dec.generate(input_ids=ids, max_new_tokens=4).run()
    before = (list(dec.tokens), dec.tcache.length, dec.dcache.length)
    with pytest.raises(ValueError, match="draft prompt needs"):
        dec.prefill(ids, SamplingParams(0.0), np.random.default_rng(0), draft_prompt=bad(ids))
    assert (list(dec.tokens), dec.tcache.length, dec.dcache.length) == before


def test_a_one_pass_iterable_is_a_draft_prompt():
    assert GenerationOptions(draft_prompt=(t for t in (5, 6))).draft_prompt == (5, 6)
    with pytest.raises(ValueError, match="draft_prompt"):
        GenerationOptions(draft_prompt=iter(()))


def test_the_draft_window_flag_reaches_the_generation_and_the_server(fim_dec, tiny_fim_export, monkeypatch, capsys):
    """``complete --draft-window`` gives the generation its draft prompt, ``serve --draft-window`` the engine its
    window (the outputs alone cannot tell: they equal plain decoding whatever the draft reads)."""
    from edgespec.apps import cli, serve

    seen = []
    real = fim_dec.generate

    def generate(*args, **kw):
        seen.append(kw["options"].draft_prompt)
        return real(*args, **kw)

    monkeypatch.setattr(fim_dec, "generate", generate)
    monkeypatch.setattr(cli, "_load", lambda a: fim_dec)
    want = _fim(fim_dec, FimPrompt(LONG_PREFIX, SUFFIX), 64)[1]
    for window, expect in (("64", tuple(want)), ("0", None)):
        assert cli.main(["complete", str(tiny_fim_export), "--prefix-text", LONG_PREFIX, "--suffix-text", SUFFIX,
                         "--max-new-tokens", "4", "--draft-window", window, "--json"]) == 0
        assert seen[-1] == expect
    capsys.readouterr()
    engines = []
    monkeypatch.setattr(serve, "listen", lambda host, port: None)
    monkeypatch.setattr(serve, "serve", lambda engine, sock, limit: engines.append(engine) or 0)
    try:
        assert cli.main(["serve", str(tiny_fim_export), "--draft-window", "48"]) == 0
        assert engines[0].fim_draft_window == 48
    finally:
        for e in engines:
            e.stop()


def test_a_long_bad_draft_prompt_is_refused_in_a_short_line(dec):
    with pytest.raises(ValueError) as e:
        GenerationOptions(draft_prompt=[-1] * 100_000)
    assert len(str(e.value)) < 200 and "\n" not in str(e.value)
    ids = dec.encode(PROMPT)
    with pytest.raises(ValueError) as e:
        dec.generate(input_ids=ids, draft_prompt=[1] * (len(ids) - 1) + [dec.encoder.n_tokens])
    assert len(str(e.value)) < 200 and "draft_prompt" in str(e.value)
