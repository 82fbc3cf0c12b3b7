"""The adaptive controller's memory: what it learned survives the process, validated where it is read back."""

import json
import os
import subprocess
import sys

import pytest

from edgespec.adaptive import AdaptiveK, CostModel
from edgespec.control.memory import memory_path, parse_state, read_state, write_state
from edgespec.decoder import SpecDecoder
from edgespec.kpolicy import Offer, RoundPlan, RoundResult, Situation
from edgespec.proposers import PROPOSERS

LINEAR = [100.0 + 10.0 * (n - 1) for n in range(1, 8)]
P = {name: cls() for name, cls in PROPOSERS.items()}


def _taught() -> AdaptiveK:
    """A controller that has seen draft chains, lookup rounds of two match lengths, a tree and two answers."""
    pol = AdaptiveK(CostModel(list(LINEAR), draft_ms=5.0, draft_prefill_ms=2.0))
    pol.begin()
    for k, acc, name in [(3, 3, "draft"), (3, 1, "draft"), (2, 2, "lookup"), (4, 0, "lookup"), (6, 3, "tree")]:
        p = P[name]
        pol._offered_match = {"lookup": k}
        plan = RoundPlan(p, n_nodes=k) if p.tree else RoundPlan(p, k=k)
        pol.observe(RoundResult(plan, [0] * (acc + 1), p, tuple(range(1, k + 1)), acc, draft_step_ms=6.0,
                                round_ms=1.3 * pol.predicted_ms(p, k)))
    pol.observe(RoundResult(RoundPlan(), [0], None, (), 0, round_ms=130.0, catchup_ms=90.0, catchup_tokens=30))
    pol.end(40)
    pol.begin()
    pol.end(75)
    return pol


def _plans(pol, lags=(1, 30, 200)):
    out = []
    for lag in lags:
        plan = pol.choose(Situation((Offer(P["lookup"], 3, 3), Offer(P["draft"], 99)), lag, 128))
        out.append((plan.proposer.name if plan.proposer else None, plan.size, plan.catchup_tokens))
    return out


def test_a_saved_state_restores_the_same_controller(tmp_path):
    a = _taught()
    path = tmp_path / "controller" / "pair.json"
    assert write_state(path, a.state())
    b = AdaptiveK(CostModel(list(LINEAR), draft_ms=5.0, draft_prefill_ms=2.0))
    state = read_state(path)
    assert state is not None
    b.load_state(state)
    assert b.state() == json.loads(json.dumps(a.state()))
    assert b.lengths == [40, 75] and b.rounds == a.rounds and b.scale("target") == a.scale("target") != 1.0
    assert b.alpha(P["draft"]) == a.alpha(P["draft"]) and b.alpha(P["lookup"], 4) == a.alpha(P["lookup"], 4)
    assert b._tree_tokens(P["tree"], 6) == a._tree_tokens(P["tree"], 6)
    a.begin()
    b.begin()
    assert _plans(b) == _plans(a)
    assert b.expected_remaining(128) == a.expected_remaining(128) == pytest.approx(57.5)


@pytest.mark.parametrize("edit", [
    lambda s: "not json",
    lambda s: [],
    lambda s: {**s, "version": 2},
    lambda s: {k: v for k, v in s.items() if k != "counts"},
    lambda s: {**s, "lengths": [10, "20"]},
    lambda s: {**s, "lengths": [True]},
    lambda s: {**s, "lengths": [-1]},
    lambda s: {**s, "counts": {"draft": [1.0, float("nan")]}},
    lambda s: {**s, "counts": {"draft": [1.0]}},
    lambda s: {**s, "counts": {"draft": [-1.0, 2.0]}},
    lambda s: {**s, "overhead": {"draft": 0.0}},
    lambda s: {**s, "overhead": {"draft": float("inf")}},
    lambda s: {**s, "scale_samples": {"gpu": [1.0]}},
    lambda s: {**s, "scale_samples": {"target": [0.0]}},
    lambda s: {**s, "catchup_measured_ms": "fast"},
    lambda s: {**s, "tree_accepted": {"tree": {"six": 1.0}}},
    lambda s: {**s, "tree_accepted": {"tree": {"0": 1.0}}},
    lambda s: {**s, "rounds": {str(i): 1 for i in range(1000)}},
])
def test_a_bad_state_is_refused_and_the_controller_starts_cold(tmp_path, edit):
    raw = edit(json.loads(json.dumps(_taught().state())))
    path = tmp_path / "controller" / "pair.json"
    path.parent.mkdir()
    path.write_text(raw if isinstance(raw, str) else json.dumps(raw))
    assert read_state(path) is None
    with pytest.raises(ValueError):
        parse_state(raw if not isinstance(raw, str) else None)


def test_a_directory_or_a_missing_file_reads_as_no_state(tmp_path):
    assert read_state(tmp_path / "missing.json") is None
    (tmp_path / "dir.json").mkdir()
    assert read_state(tmp_path / "dir.json") is None


def test_without_history_the_catch_up_is_priced_against_half_the_request():
    pol = AdaptiveK(CostModel(list(LINEAR), draft_ms=5.0, draft_prefill_ms=2.0))
    pol.begin()
    assert pol.expected_remaining(128) == 64.0  # not "as many as so far" (1) at the first token
    pol.generated = 100
    assert pol.expected_remaining(28) == 28.0  # never more than the request allows


@pytest.fixture(scope="module")
def dec(tiny_export):
    return SpecDecoder.load(tiny_export)


def test_for_decoder_with_memory_saves_after_each_answer_and_a_new_one_starts_from_it(dec, home):
    path = memory_path(dec, 6, "chat")
    path.unlink(missing_ok=True)
    pol = AdaptiveK.for_decoder(dec, memory="chat")
    assert pol.memory_path == path and not path.exists()
    dec.reset()
    g = dec.generate(prompt="def add", max_new_tokens=12, policy=pol).run()
    saved = read_state(path)
    assert saved is not None and saved["lengths"] == [g.stats.new_tokens]
    again = AdaptiveK.for_decoder(dec, memory="chat")
    assert again.lengths == [g.stats.new_tokens] and again.rounds == pol.rounds
    assert AdaptiveK.for_decoder(dec, memory="complete").lengths == []  # another use, another memory
    with pytest.raises(ValueError):
        memory_path(dec, 6, "../x")
    cold = AdaptiveK.for_decoder(dec)  # memory off (benchmarks, library default): nothing read
    assert cold.lengths == [] and cold.memory_path is None
    path.write_text("{broken")  # a bad entry: cold start, rewritten by the next answer
    fresh = AdaptiveK.for_decoder(dec, memory="chat")
    assert fresh.lengths == []
    dec.reset()
    dec.generate(prompt="def add", max_new_tokens=5, policy=fresh).run()
    assert read_state(path)["lengths"] == [fresh.lengths[0]]


def test_the_cli_keeps_the_controller_memory_unless_told_not_to(tiny_export, tmp_path):
    env = dict(os.environ, EDGESPEC_HOME=str(tmp_path))

    def generate(*extra):
        r = subprocess.run([sys.executable, "-m", "edgespec.cli", "generate", str(tiny_export), "--prompt", "def add",
                            "--max-new-tokens", "8", *extra], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        return r.stdout

    generate("--no-controller-memory")
    assert not (tmp_path / "controller").exists() or not list((tmp_path / "controller").iterdir())
    first = generate()
    files = list((tmp_path / "controller").glob("*.json"))
    assert len(files) == 1 and len(read_state(files[0])["lengths"]) == 1
    assert generate() == first  # greedy: the same text warm or cold
    assert len(read_state(files[0])["lengths"]) == 2
