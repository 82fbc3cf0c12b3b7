"""The greedy lossless rule of :func:`edgespec.bench.evaluate.greedy_check`: a divergence from plain greedy is judged
by the verify path's own numbers (a replay of the speculative run's verify calls on a clean cache).

A real decoder bug (a stale KV row kept by the rollback, a verify call at the wrong positions) fails it; a
kernel-noise flip passes it: a near-tie built into a tiny model's weights (two tokens with identical output-head
rows: an exact tie) plus a shape-dependent perturbation of the target's many-row runs (what int4 kernels do
between a one-token step and a K+1-row verify, here 1e-4 on one logit) makes speculative greedy choose the
other token of the tie.
"""

import shutil
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest

from edgespec import Proposal, Proposer, SpecDecoder, register
from edgespec.core.token_tree import TokenTree
from edgespec.bench.evaluate import compare_rows, greedy_check, kernel_noise

PROMPT = "def fib(n):\n    if n < 2:\n"


@register
@dataclass(frozen=True)
class Never(Proposer):
    """Proposes the same rare id K times (a fixed proposal the target almost never takes)."""

    name: ClassVar[str] = "never"

    def propose(self, ctx, size, sp, rng) -> Proposal:
        return Proposal(TokenTree.chain([ctx.width - 1] * size))


@pytest.fixture(scope="module")
def dec(tiny_export):
    return SpecDecoder.load(tiny_export)


@pytest.mark.parametrize("proposers", [("draft",), ("tree",), ("lookup",), ("suffix",)])
def test_a_correct_decoder_is_consistent_with_its_replayed_verify_calls(dec, proposers):
    r = greedy_check(dec, dec.encode(PROMPT), 40, k=3, proposers=proposers)
    assert r["consistent"] and r["ok"] and r["identical"], r["problem"]
    assert r["stats"].proposed > 0


def test_seeded_sampling_is_checked_by_the_same_rule(dec, monkeypatch):
    ids = dec.encode(PROMPT)
    r = greedy_check(dec, ids, 30, k=3, temperature=1.0, seed=5)
    assert r["ok"] and r["identical"] and r["stats"].coupling == "gumbel", r["problem"]
    right = dec._roll_back

    def keeps_one_rejected_row(L, accepted_rows, draft_kept):
        extra = len(accepted_rows)
        if dec.tcache.length >= L + 2 + extra:
            accepted_rows = list(accepted_rows) + [extra]
        right(L, accepted_rows, draft_kept)

    monkeypatch.setattr(dec, "_roll_back", keeps_one_rejected_row)
    # proposals that are (nearly) always rejected: every round rolls back, so the bug shows in every round; a
    # low temperature, as the tiny random model's logits are nearly flat (a race at T = 1 is all noise there)
    r = greedy_check(dec, ids, 30, k=3, temperature=0.002, seed=5, proposers=("never",))
    assert not r["ok"] and not r["consistent"], r


def test_a_stale_kv_row_after_a_rollback_fails_the_rule(dec, monkeypatch):
    right = dec._roll_back

    def keeps_one_rejected_row(L, accepted_rows, draft_kept):
        extra = len(accepted_rows)  # the first rejected proposal row, if the verify wrote one
        if dec.tcache.length >= L + 2 + extra:
            accepted_rows = list(accepted_rows) + [extra]
        right(L, accepted_rows, draft_kept)

    monkeypatch.setattr(dec, "_roll_back", keeps_one_rejected_row)
    r = greedy_check(dec, dec.encode(PROMPT), 40, k=3)
    assert not r["ok"] and not r["consistent"], r
    assert "replayed on a clean cache" in r["problem"]


def test_a_verify_call_at_the_wrong_positions_fails_the_rule(dec, monkeypatch):
    def from_zero(L, tree):  # the verify rows' positions forget the cached prefix (0.. instead of L..)
        ids = [dec.tokens[-1]] + tree.tokens
        return dec.target.forward(ids, dec.tcache, np.arange(len(ids), dtype=np.int64))

    monkeypatch.setattr(dec, "_verify", from_zero)
    r = greedy_check(dec, dec.encode(PROMPT), 40, k=3)
    assert not r["ok"] and not r["consistent"], r


@pytest.fixture(scope="module")
def tied(tiny_dirs, tmp_path_factory, home):
    """The tiny target with token b's output-head row set to token a's (an exact tie), a = a token plain
    greedy emits after the prompt, b > a (so argmax's first-index rule picks a on an exact tie)."""
    import torch
    from transformers import AutoModelForCausalLM

    from edgespec.export import ExportOptions, export_pair

    base = SpecDecoder.load(_plain_export(tiny_dirs, tmp_path_factory), load_draft=False)
    ids = base.encode(PROMPT)
    plain = base.generate(input_ids=ids, max_new_tokens=12, proposers=()).run().token_ids
    a = plain[4]
    b = base.width - 1 if base.width - 1 != a else base.width - 2
    a, b = min(a, b), max(a, b)
    d = tmp_path_factory.mktemp("tied") / "target"
    shutil.copytree(tiny_dirs["target"], d)
    model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
    model.config.tie_word_embeddings = False
    with torch.no_grad():
        head = model.get_output_embeddings().weight.clone()
        head[b] = head[a]
        model.lm_head = torch.nn.Linear(head.shape[1], head.shape[0], bias=False)
        model.lm_head.weight.copy_(head)
    model.save_pretrained(d)
    fp32 = ExportOptions(precision="fp32")
    out = export_pair(str(d), str(tiny_dirs["draft"]), tmp_path_factory.mktemp("exports") / "tied", fp32, fp32)
    return out, a, b


def _plain_export(tiny_dirs, tmp_path_factory):
    from edgespec.export import ExportOptions, export_pair

    fp32 = ExportOptions(precision="fp32")
    return export_pair(str(tiny_dirs["target"]), str(tiny_dirs["draft"]),
                       tmp_path_factory.mktemp("exports") / "untied", fp32, fp32)


def test_a_kernel_noise_flip_at_a_built_in_tie_passes_the_rule(tied, monkeypatch):
    export, a, b = tied
    d = SpecDecoder.load(export)
    ids = d.encode(PROMPT)
    d.reset()
    row = d.target.forward(ids, d.target.new_cache())[-1]
    assert row[a] == row[b]  # the tie is in the weights
    forward = d.target.forward

    def many_rows_differ(ids, cache, position_ids=None, mask=None, keep=0, prefill=False):
        logits = forward(ids, cache, position_ids, mask, keep, prefill)
        if len(ids) > 1:  # a K+1-row verify (or a prefill chunk): another kernel, another rounding
            logits = logits.copy()
            logits[:, b] += 1e-4
        return logits

    monkeypatch.setattr(d.target, "forward", many_rows_differ)
    r = greedy_check(d, ids, 24, k=3)
    assert not r["identical"], "the flip did not happen: the test would prove nothing"
    i = r["first_divergence"]
    assert r["plain_tokens"][i] == a and r["spec_tokens"][i] == b
    assert r["ok"] and r["consistent"], r["problem"]
    assert r["plain_gap"] == 0.0 and r["delta"] == pytest.approx(1e-4, rel=1e-2)
    assert r["plain_top2"][0][0] == a and r["verify_top2"][0][0] == b


def test_the_cross_machine_rule_needs_the_same_two_candidates():
    ref = np.array([0.0, 5.0, 4.99, 1.0], dtype=np.float32)
    other = np.array([0.0, 4.985, 4.995, 1.0], dtype=np.float32)
    ok = compare_rows(1, ref, 2, other)
    assert ok["ok"] and ok["gap"] == pytest.approx(0.01, abs=1e-6) and ok["delta"] >= ok["gap"]
    bad = compare_rows(1, ref, 3, np.array([0.0, 4.0, 3.0, 6.0], dtype=np.float32))
    assert not bad["ok"] and "other tokens on top" in bad["problem"]
    assert not compare_rows(1, ref, 2, ref)["ok"]  # the other row does not choose its own token


def test_kernel_noise_is_measured_per_k(dec):
    r = kernel_noise(dec, [dec.encode(PROMPT)], ks=(1, 3), max_new_tokens=16)
    for k in ("1", "3"):
        s = r["by_k"][k]
        assert s["positions"] > 0 and 0 <= s["median_max_abs"] <= s["p99_max_abs"] <= s["max_abs"]
        assert s["max_abs"] < 1e-3  # fp32 tiny graphs: one-row and many-row runs agree to ~1e-6
        assert s["flips_per_1000"] >= 0
    assert r["compared_tokens"] > 0
