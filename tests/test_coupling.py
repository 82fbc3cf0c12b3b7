"""Drafter-invariant seeded sampling (the Gumbel / exponential-race coupling of :mod:`edgespec.core.coupling`).

(a) the generator against a plain-Python transcription of its formula, and its distribution; (d) the race choice
is an exact sample of p, the draft's choice agrees with it at least as the paper's bound says; (c) the same seeded
request gives the same ids through plain decoding, every K, every proposer, a tree, and after a partial cache hit;
the first token of a coupled round over many seeds is distributed as p.
"""

import math

import numpy as np
import pytest

from edgespec import SpecDecoder
from edgespec.core.coupling import GumbelCoupling, exponentials, hash32, position_key
from edgespec.bench.evaluate import first_token_check
from edgespec.engine.generation import GenerationOptions
from edgespec.core.sampling import SamplingParams

M = 0xFFFFFFFF


def _h(x: int) -> int:
    x &= M
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M
    x ^= x >> 15
    x = (x * 0x846CA68B) & M
    return x ^ (x >> 16)


def _e(seed: int, n: int, v: int) -> float:
    """E_n(v) transcribed from the module docstring with Python ints (no numpy)."""
    seed %= 1 << 64
    b = _h(_h(_h((seed & M) ^ 0x243F6A88) ^ (seed >> 32)) ^ n)
    b2 = _h(b ^ 0x13198A2E)
    hv = _h(v ^ 0x85A308D3)
    w1, w2 = _h(b ^ hv), _h(b2 ^ hv)
    return -math.log(((w1 >> 5) * 67108864 + (w2 >> 6) + 0.5) / 9007199254740992)


def test_the_generator_is_its_documented_formula():
    for x in (0, 1, 0xDEADBEEF, M):
        assert int(hash32(x)) == _h(x)
    for seed, n in ((0, 0), (42, 7), (2**40 + 3, 123456), (2**64 + 42, 7)):
        ids = np.array([0, 1, 2, 151664, 99999])
        assert np.array_equal(exponentials(seed, n, ids), [_e(seed, n, int(v)) for v in ids])
    assert position_key(42, 7) == position_key(2**64 + 42, 7)  # the seed is taken mod 2^64
    c = GumbelCoupling(5, 1000)
    assert np.array_equal(c.noise(3)[[10, 500]], c.noise(3, np.array([10, 500])))


def test_the_noise_is_exponential_and_uncorrelated_across_positions_and_seeds():
    e = np.concatenate([exponentials(s, n, np.arange(4096)) for s in range(3) for n in range(8)])
    assert abs(e.mean() - 1) < 0.02 and abs(e.var() - 1) < 0.05
    # the exponential CDF: P(E > t) = exp(-t) at a few t
    for t in (0.1, 1.0, 3.0):
        assert abs((e > t).mean() - math.exp(-t)) < 0.01
    a, b = exponentials(1, 0, np.arange(20000)), exponentials(1, 1, np.arange(20000))
    c = exponentials(2, 0, np.arange(20000))
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.03 and abs(np.corrcoef(a, c)[0, 1]) < 0.03


def _tv(counts, p):
    return 0.5 * np.abs(counts / counts.sum() - p).sum()


def test_the_race_choice_is_a_sample_of_p_over_seeds():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.full(50, 0.3))
    p[7] = 0.0
    p /= p.sum()
    draws = 20000
    counts = np.zeros(50)
    for s in range(draws):
        counts[GumbelCoupling(s, 50).choose(p, 11)] += 1
    noise = np.mean([_tv(rng.multinomial(draws, p).astype(float), p) for _ in range(20)])
    assert counts[7] == 0  # never a zero-mass id
    assert _tv(counts, p) < 2 * noise + 0.005


def test_the_drafts_choice_agrees_at_least_as_the_papers_bound():
    """Daliri et al. 2024, Theorem 3: P(argmin E/p == argmin E/q) ≥ (1 − TV) / (1 + TV)."""
    rng = np.random.default_rng(1)
    for conc in (0.2, 1.0):
        p, q = rng.dirichlet(np.full(40, conc)), rng.dirichlet(np.full(40, conc))
        q = 0.5 * q + 0.5 * p  # a draft that is half right
        tv = 0.5 * np.abs(p - q).sum()
        same = np.mean([GumbelCoupling(s, 40).choose(p, 0) == GumbelCoupling(s, 40).choose(q, 0)
                        for s in range(4000)])
        assert same >= (1 - tv) / (1 + tv) - 0.02, (same, tv)


def test_candidates_are_the_races_best_first():
    c = GumbelCoupling(3, 30)
    p = np.random.default_rng(2).dirichlet(np.ones(30))
    top = c.candidates(p, 4, 5)
    keys = c.noise(4) / p
    assert top == [int(i) for i in np.argsort(keys)[:5]] and top[0] == c.choose(p, 4)
    assert c.candidates(np.eye(30)[3], 4, 5) == [3]  # no more than the support


def test_options_choose_the_rule():
    assert GenerationOptions(temperature=0.8, seed=1).coupled
    assert not GenerationOptions(temperature=0.8).coupled
    assert GenerationOptions(temperature=0.8, coupling="gumbel").coupled
    assert not GenerationOptions(temperature=0.8, seed=1, coupling="standard").coupled
    assert not GenerationOptions(temperature=0.0, seed=1, coupling="gumbel").coupled  # greedy is greedy
    with pytest.raises(ValueError, match="coupling must be one of auto, gumbel, standard"):
        GenerationOptions(coupling="metropolis")


# -- through the decoder, on the tiny fp32 pair ----------------------------------------------------------------

@pytest.fixture(scope="module")
def dec(export_each_format):
    return SpecDecoder.load(export_each_format)


SEEDED = dict(max_new_tokens=40, temperature=1.0, top_p=0.95, seed=42)


def _run(dec, ids, reset=True, **kw):
    if reset:
        dec.reset()
    g = dec.generate(input_ids=ids, **{**SEEDED, **kw}).run()
    assert g.stats.coupling == "gumbel"
    return g


def test_a_seeded_request_gives_the_same_ids_whatever_speculation_does(dec):
    ids = dec.encode("def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\nfib(")
    plain = _run(dec, ids, proposers=()).token_ids
    assert len(plain) == 40
    runs = {"k1": dict(k=1), "k2": dict(k=2), "k4": dict(k=4), "lookup": dict(proposers=("lookup",), k=3),
            "lookup+draft": dict(proposers=("lookup", "draft"), k=3), "tree": dict(proposers=("tree",), n_nodes=6),
            "suffix": dict(proposers=("suffix",), n_nodes=6)}
    for name, kw in runs.items():
        g = _run(dec, ids, **kw)
        assert g.token_ids == plain, name
    accepted = _run(dec, ids, k=4).stats.accepted
    assert accepted > 0  # the draft's coupled proposals do get accepted
    # after a partial cache hit: the cache holds a longer conversation sharing part of the prompt
    dec.reset()
    dec.generate(input_ids=ids[:-3] + [5, 6, 7, 8], **SEEDED).run()
    assert _run(dec, ids, reset=False, k=2).token_ids == plain
    # and another seed gives another answer (the seed is honoured)
    assert _run(dec, ids, proposers=(), seed=43).token_ids != plain


def test_the_standard_rule_stays_available_and_seeded(dec):
    ids = dec.encode("class Stack:\n")
    a = _run_standard(dec, ids)
    assert a == _run_standard(dec, ids)  # same seed, same K: same ids, as before


def _run_standard(dec, ids):
    dec.reset()
    g = dec.generate(input_ids=ids, **SEEDED, k=3, coupling="standard").run()
    assert g.stats.coupling == "standard"
    return g.token_ids


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_the_first_token_of_a_coupled_round_is_distributed_as_p(tiny_export, tree):
    """The distribution test of the sampling rule, for the coupled rule: over many seeds, the first token a
    speculative round emits (after a K = 4 draft, or a tree of 4 nodes) against the target's p there."""
    d = SpecDecoder.load(tiny_export)
    ids = d.encode("for i in range(")
    r = first_token_check(d, ids, SamplingParams(1.0), draws=1500, k=4, tree=tree, coupled=True)
    assert r["tv"] < 2 * r["tv_noise"] + 0.01, r


def test_coupled_rounds_on_the_self_pair_accept_everything(tiny_self_export):
    """draft == target: q == p at every position, so the draft's race choice is the target's."""
    d = SpecDecoder.load(tiny_self_export)
    ids = d.encode("while True:\n")
    d.reset()
    g = d.generate(input_ids=ids, max_new_tokens=30, temperature=0.9, seed=7, k=4).run()
    s = g.stats
    assert s.corrections == 0 and s.accepted == s.evaluated > 0


def test_the_cli_gives_one_seeded_answer_for_plain_and_speculation(tiny_export, home):
    import json
    import os
    import subprocess
    import sys

    def gen(*flags):
        r = subprocess.run([sys.executable, "-m", "edgespec.cli", "generate", str(tiny_export), "--json", "--raw",
                            "--prompt", "def main():", "--max-new-tokens", "24", "--temperature", "0.9",
                            "--seed", "3", *flags], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, EDGESPEC_HOME=str(home)))
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    plain, k2, std = gen("--mode", "plain"), gen("--k", "2"), gen("--k", "2", "--coupling", "standard")
    assert plain["token_ids"] == k2["token_ids"] and k2["stats"]["coupling"] == "gumbel"
    assert std["stats"]["coupling"] == "standard"
    bad = subprocess.run([sys.executable, "-m", "edgespec.cli", "generate", str(tiny_export), "--coupling", "x"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_the_server_repeats_a_seeded_request_whatever_its_cache_held(tiny_export, home, tmp_path):
    """Issue 22's report: the same seeded request sent three times gave text A, B, B (the server's KV cache held
    0, 24, 35 tokens of it). Now: the default adaptive server, other requests sharing part of the prompt in
    between, the same ids every time, and plain decoding's seeded ids."""
    from test_serve import Server

    s = Server(tiny_export, home, tmp_path / "server.log")
    try:
        msgs = [{"role": "user", "content": "Write a function that adds two numbers."}]
        kw = dict(model="m", messages=msgs, max_tokens=24, temperature=1.0, seed=42)
        texts = []
        for other in ("Write a function", None, "Write a function that adds two numbers. Then"):
            if other:
                s.client.chat.completions.create(**{**kw, "messages": [{"role": "user", "content": other}]})
            texts.append(s.client.chat.completions.create(**kw).choices[0].message.content)
        d = SpecDecoder.load(tiny_export, load_draft=False)
        plain = d.generate(messages=msgs, max_new_tokens=24, temperature=1.0, seed=42, proposers=()).run().text
        assert texts == [plain] * 3
    finally:
        s.close()


def test_the_acceptance_benchmark_runs_both_rules(tiny_export, home, tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "bench" / "probes" / "coupling_alpha.py"
    out = tmp_path / "alpha.json"
    r = subprocess.run([sys.executable, str(script), str(tiny_export), "--per-class", "1", "--seeds", "1",
                        "--max-new-tokens", "12", "--out", str(out)], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, EDGESPEC_HOME=str(home)))
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["rows"]
    assert 0 < rows["standard/all"]["alpha"] <= 1 and 0 < rows["gumbel/all"]["alpha"] <= 1
    assert "| all |" in r.stdout
