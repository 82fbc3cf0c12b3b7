"""A new drafting source is one class and its registration: a toy 'repeat the last token' proposer, defined
here only, runs through the decoder, the adaptive controller and the bench."""

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from edgespec import AdaptiveK, Proposal, Proposer, SpecDecoder, register
from edgespec.control.adaptive import CostModel
from edgespec.core.token_tree import TokenTree


@register
@dataclass(frozen=True)
class RepeatLast(Proposer):
    """Proposes the last committed token K times (a fixed proposal: one-hot q)."""

    name: ClassVar[str] = "repeat"

    def propose(self, ctx, size, sp, rng) -> Proposal:
        return Proposal(TokenTree.chain([ctx.tokens[-1]] * size))


@pytest.fixture(scope="module")
def dec(tiny_export):
    return SpecDecoder.load(tiny_export)


def test_the_toy_proposer_keeps_greedy_and_sampling_valid(dec):
    ids = dec.encode("aaaa aaaa aaaa")
    dec.reset()
    plain = dec.generate(input_ids=ids, max_new_tokens=40, proposers=()).run()
    dec.reset()
    g = dec.generate(input_ids=ids, max_new_tokens=40, k=3, proposers=("repeat",)).run()
    assert g.token_ids == plain.token_ids
    s = g.stats.proposers["repeat"]
    assert g.stats.mode == "repeat" and s.rounds > 0 and 0 <= s.accepted <= s.proposed
    assert dec.dcache.length == 0  # no draft model involved
    dec.reset()
    g = dec.generate(input_ids=ids, max_new_tokens=20, k=3, temperature=0.8, seed=3, proposers=("repeat",)).run()
    assert 0 < len(g.token_ids) <= 20


def test_the_adaptive_controller_keeps_its_own_estimates_for_it(dec):
    ids = dec.encode("def add(a, b):")
    dec.reset()
    plain = dec.generate(input_ids=ids, max_new_tokens=40, proposers=()).run()
    pol = AdaptiveK(CostModel([1.0 + 0.1 * n for n in range(8)], draft_ms=0.05), probe_every=2)
    dec.reset()
    g = dec.generate(input_ids=ids, max_new_tokens=40, policy=pol, proposers=("repeat", "draft")).run()
    assert g.token_ids == plain.token_ids
    assert "repeat" in pol.counts and pol.rounds.get("repeat", 0) > 0  # tried at least once, keyed by name
    assert g.stats.proposers["repeat"].rounds == pol.rounds["repeat"]


BENCH = """
import json, sys
sys.path.insert(0, {tests!r})
import test_toy_proposer  # registers the proposer
from edgespec.bench.runner import run_bench
from edgespec.bench.prompts import load_file
r = run_bench({export!r}, ["plain", "repeat", "k2+repeat"], load_file({prompts!r}), max_new_tokens=12, progress=False)
print(json.dumps(r))
"""


def test_the_bench_runs_it_as_a_mode(tiny_export, home, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"class": "code", "prompt": "aaaa aaaa aaaa"}) + "\n")
    code = BENCH.format(tests=str(Path(__file__).parent), export=str(tiny_export), prompts=str(prompts))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, EDGESPEC_HOME=str(home)))
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    runs = {run["mode"]: run for run in res["runs"]}
    assert set(runs) == {"plain", "repeat", "k2+repeat"}
    assert runs["repeat"]["proposers"]["repeat"]["rounds"] > 0 and runs["repeat"]["adaptive"]
    assert runs["k2+repeat"]["proposers"]["repeat"]["rounds"] > 0
    assert res["summary"]["repeat"]["all"]["speedup_decode_median"] is not None
