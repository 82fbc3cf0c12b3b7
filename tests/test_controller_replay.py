"""bench/probes/controller_replay.py: a recording fixes every greedy round's acceptance, so its replay of a fixed K
accepts exactly what a real run on the same models accepts, and its policies run the real controller."""

import importlib.util
import sys
from pathlib import Path

import pytest

from edgespec import SpecDecoder
from edgespec.core.stats import GenerationStats
from edgespec.engine.generation import GenerationOptions

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n\ndef fact(n):\n"


@pytest.fixture(scope="module")
def replay_mod():
    spec = importlib.util.spec_from_file_location("controller_replay", ROOT / "bench" / "probes" / "controller_replay.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["controller_replay"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def dec(tiny_export):
    return SpecDecoder.load(tiny_export)


@pytest.fixture(scope="module")
def rec(dec, replay_mod):
    r = replay_mod.record_ids(dec, dec.encode(PROMPT), max_new=40)
    return {"prompt": 0, "class": "code", **r}


def test_recording_is_plain_decoding(dec, rec):
    dec.reset()
    plain = dec.generate(input_ids=dec.encode(PROMPT), max_new_tokens=40).run().token_ids
    assert rec["answer"][:len(plain)] == list(plain)
    assert len(rec["match"]) == len(rec["top1"]) == len(rec["answer"])
    assert rec["target_agrees"] == 1.0  # teacher-forced rows give the same argmax as the steps (fp32 tiny model)
    assert all(0.0 < p <= 1.0 for p in rec["top1"])
    assert 0 < sum(rec["match"]) < len(rec["match"])  # the noisy draft agrees often, not always


@pytest.mark.parametrize("k", [1, 2, 3])
def test_fixed_k_replay_accepts_what_a_real_run_accepts(dec, rec, replay_mod, k):
    dec.reset()
    stats = GenerationStats()
    opts = GenerationOptions(max_new_tokens=40, k=k, proposers=("draft",))
    out = [t for toks, _ in dec.generate_ids(dec.encode(PROMPT), opts, None, stats) for t in toks]
    assert out == rec["answer"][:len(out)]
    costs = replay_mod.Costs([60.0, 70.0, 85.0, 100.0], 20.0, 3.0, 0.0, 0)
    r = replay_mod.replay(rec, f"k{k}", costs, costs.model, max_new=40)
    assert (r["rounds"], r["accepted"]) == (stats.rounds, stats.accepted)


def test_replay_times_and_policies(rec, replay_mod):
    costs = replay_mod.Costs([60.0, 70.0, 85.0, 100.0], 20.0, 3.0, 0.0, 0)
    plain = replay_mod.replay(rec, "plain", costs, costs.model, max_new=40)
    assert plain["ms"] == pytest.approx(60.0 * (len(rec["answer"]) - 1))
    assert plain["rounds"] == len(rec["answer"]) - 1
    for name in ("default", "adaptive", "default@decay=0.9"):
        r = replay_mod.replay(rec, name, costs, costs.model, max_new=40)
        assert r["rounds"] <= plain["rounds"] and r["ms"] > 0
    out = replay_mod.replay_all([rec], ["k1", "default"], [60.0, 70.0, 85.0, 100.0], 20.0, 3.0, 0.05, 2)
    assert set(out) == {"k1", "default"} and all(v > 0 for per in out.values() for v in per.values())
    with pytest.raises(SystemExit):
        replay_mod.replay(rec, "k", costs, costs.model)


def test_replay_cuts_answers_and_charges_the_true_costs(rec, replay_mod):
    """``--max-new-tokens``: answers cut to a shorter request; ``--true-cost``: rounds charged other t_v than the
    controller's calibration (a long past), which the controller sees only through the measured times."""
    n = min(10, len(rec["answer"]))
    true = replay_mod.Costs([90.0, 120.0, 150.0, 180.0], 20.0, 3.0, 0.0, 0)
    calibrated = replay_mod.CostModel([60.0, 70.0, 85.0, 100.0], 20.0, 3.0)
    plain = replay_mod.replay(rec, "plain", true, calibrated, max_new=n)
    assert plain["ms"] == pytest.approx(90.0 * (n - 1)) and plain["tokens"] == n - 1
    k1 = replay_mod.replay(rec, "k1", true, calibrated, max_new=n)
    assert k1["ms"] >= k1["rounds"] * (120.0 + 20.0)  # t_v(2) and a draft step a round, plus the catch-ups
    out = replay_mod.replay_all([rec], ["k1"], [90.0, 120.0, 150.0, 180.0], 20.0, 3.0, 0.0, 1,
                                calibration=calibrated, max_new=n)
    assert out["k1"][rec["prompt"]] == pytest.approx(plain["ms"] / k1["ms"])


def test_lookup_policy_runs_prompt_lookup_alone(rec, replay_mod):
    """``lookup`` is ``edgespec bench``'s lookup mode: prompt lookup with the adaptive controller, no draft model
    (so no draft time, whatever the draft would have accepted); the voice class gets the voice use's settings."""
    from edgespec.draft.lookup import PromptLookup

    props, policy = replay_mod._policy("lookup", replay_mod.CostModel([60.0, 70.0], 20.0, 3.0), "code")
    assert [type(p) for p in props] == [PromptLookup] and policy.catchup_weight == 1.0
    _, voice = replay_mod._policy("default", replay_mod.CostModel([60.0, 70.0], 20.0, 3.0), "voice")
    assert (voice.catchup_margin, voice.catchup_weight) == (0.15, 2.0) and voice.answer.prior == 24.0
    costs = replay_mod.Costs([60.0, 70.0, 85.0, 100.0], 20.0, 3.0, 0.0, 0)
    r = replay_mod.replay(rec, "lookup", costs, costs.model, max_new=40)
    plain = replay_mod.replay(rec, "plain", costs, costs.model, max_new=40)
    assert r["accepted"] <= r["proposed"] and r["rounds"] <= plain["rounds"] and r["ms"] > 0
