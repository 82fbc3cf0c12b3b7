"""A cost model that cannot go stale: a calibration off by 3× (a busy machine at calibration, or a faster one
since) reaches the K choices of a fresh calibration within a few rounds, and a stale cache is re-measured."""

import json

import numpy as np
import pytest

from edgespec.control.adaptive import AdaptiveK
from edgespec.control.calibrate import CostModel, calibrate, calibration_path
from edgespec.core.round import Offer, RoundResult, Situation
from edgespec.draft import DraftChain

TRUE_VERIFY = [79.0, 91.0, 105.0, 115.0, 129.0, 139.0, 154.0]  # t_v(1..7) ms of an idle machine (issue 12)
TRUE_DRAFT = 27.0
SITUATION = Situation((Offer(DraftChain(), 99),), lag=1, horizon=1000)


def _result(plan, rng, alpha=0.9):
    """What the plan costs on the true machine, with each drafted token accepted with probability alpha."""
    k = plan.size
    if k == 0:
        return RoundResult(plan, [0], round_ms=TRUE_VERIFY[0])
    accepted = 0
    while accepted < k and rng.random() < alpha:
        accepted += 1
    draft_ms = k * TRUE_DRAFT
    return RoundResult(plan, [0] * (accepted + 1), plan.proposer, tuple(range(1, k + 1)), accepted,
                       draft_ms=draft_ms, round_ms=draft_ms + TRUE_VERIFY[k], draft_step_ms=TRUE_DRAFT)


@pytest.mark.parametrize("target_factor, draft_factor",
                         [(2.5, 4.1), (3.0, 3.0), (1 / 3, 1 / 3), (1 / 3, 1.0), (3.0, 1 / 3)])
def test_a_stale_calibration_reaches_the_fresh_k_choices_within_a_few_rounds(target_factor, draft_factor):
    """Both controllers see the same rounds (the stale one's plans, run on the true machine); from round 6 on
    the stale one plans exactly what the fresh one does (here it takes 1–4 rounds)."""
    fresh = AdaptiveK(CostModel(list(TRUE_VERIFY), TRUE_DRAFT), k_max=6, probe_every=4)
    stale = AdaptiveK(CostModel([v * target_factor for v in TRUE_VERIFY], TRUE_DRAFT * draft_factor),
                      k_max=6, probe_every=4)
    rng = np.random.default_rng(0)
    for pol in (fresh, stale):
        pol.begin()
    same = []
    for _ in range(40):
        f, s = fresh.choose(SITUATION), stale.choose(SITUATION)
        same.append(f.size == s.size)
        r = _result(s, rng)
        fresh.observe(r)
        stale.observe(r)
    assert all(same[6:]), same
    assert stale.plain_ms == pytest.approx(TRUE_VERIFY[0])  # its scale now describes the true machine
    assert stale.draft_step_ms == pytest.approx(TRUE_DRAFT)


def test_a_stale_cached_calibration_is_re_measured_at_load(tiny_export, home):
    """A cached cost model 1000× too slow (or too fast) fails the one-plain-step check at load: re-measured and
    rewritten; the bad cache never reaches the controller."""
    from edgespec.engine.decoder import SpecDecoder

    dec = SpecDecoder.load(tiny_export)
    fresh = calibrate(dec, k_max=3, reps=1)
    path = calibration_path(dec, 3)
    for factor in (1000.0, 1e-3):
        stale = [v * factor for v in fresh.verify_ms]
        path.write_text(json.dumps({"verify_ms": stale, "draft_ms": fresh.draft_ms * factor,
                                    "draft_prefill_ms": fresh.draft_prefill_ms * factor}))
        again = calibrate(dec, k_max=3, reps=1)
        assert again.verify_ms != stale  # measured on this machine, not the cached value
        assert json.loads(path.read_text())["verify_ms"] == again.verify_ms
