"""``edgespec bench`` / ``eval`` on the tiny export: every field, paired ratios, the PNG."""

import json
import os
import subprocess
import sys

import pytest

from edgespec.bench.runner import Mode, summarize

RUN_FIELDS = {"class", "mode", "prompt", "prompt_tokens", "new_tokens", "ttft_ms", "wall_ms", "e2e_tok_s",
              "decode_tok_s", "itl_p50_ms", "itl_p95_ms", "alpha", "mean_accepted_length", "accepted_per_position",
              "mean_k", "round_p50_ms", "round_p95_ms"}
SUMMARY_FIELDS = {"prompts", "decode_tok_s", "e2e_tok_s", "ttft_ms", "speedup_decode_median", "speedup_decode_min",
                  "speedup_e2e_median", "alpha", "mean_accepted_length", "mean_k", "itl_p50_ms", "itl_p95_ms",
                  "acceptance_by_position"}


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    f = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    f.write_text("\n".join(json.dumps(d) for d in [
        {"class": "code", "prompt": "def add(a, b):"}, {"class": "code", "prompt": "class Node:"},
        {"class": "chat", "prompt": "The quick brown fox"}, {"class": "voice", "prompt": "单发"}]) + "\n")
    return f


def test_bench_writes_json_and_png(tiny_export, home, prompts_file, tmp_path):
    out = tmp_path / "b"
    r = subprocess.run([sys.executable, "-m", "edgespec.cli", "bench", str(tiny_export), "--prompts", str(prompts_file),
                        "--modes", "plain,k2,adaptive", "--latency-budget-ms", "50", "--max-new-tokens", "16",
                        "--cost-curve", "--out", str(out)], capture_output=True, text=True,
                       env=dict(os.environ, EDGESPEC_HOME=str(home)), timeout=600)
    assert r.returncode == 0, r.stderr
    assert "| mode | class |" in r.stdout
    res = json.loads(out.with_suffix(".json").read_text())
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert res["modes"] == ["plain", "k2", "adaptive", "adaptive@50"]
    assert len(res["runs"]) == 4 * 4
    for run in res["runs"]:
        assert RUN_FIELDS <= set(run)
    for mode, per in res["summary"].items():
        assert set(per) == {"code", "chat", "voice", "all"}
        for s in per.values():
            assert SUMMARY_FIELDS <= set(s)
    assert res["summary"]["plain"]["all"]["speedup_decode_median"] == 1.0
    noise = res["kernel_noise"]["by_k"]
    assert set(noise) == {"1", "2", "4"} and all(v["positions"] > 0 and v["max_abs"] < 1e-3 for v in noise.values())
    assert "cpu_model" in res["machine"] and isinstance(res["machine"]["cpu_flags"], list)
    assert "share_rounds_over_budget" in res["summary"]["adaptive@50"]["all"]
    c = res["cost_curve"]
    assert len(c["ratio"]) == 9 and c["ratio"][0] == 1.0 and c["c"] > 0
    assert set(res["predicted"]) == {"k2"}
    assert res["peak_rss_mb"] > 0


def _bench_json(tiny_export, home, prompts_file, tmp_path, *extra):
    r = subprocess.run([sys.executable, "-m", "edgespec.cli", "bench", str(tiny_export), "--prompts", str(prompts_file),
                        "--modes", "plain,adaptive", "--max-new-tokens", "8", "--json", "--out", str(tmp_path / "b"),
                        *extra], capture_output=True, text=True, env=dict(os.environ, EDGESPEC_HOME=str(home)),
                       timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_adaptive_controllers_carry_across_a_class_and_repeats_start_from_the_same_state(tiny_export, home,
                                                                                          prompts_file, tmp_path):
    """In a subprocess: the bench turns on onnxruntime's process-wide thread pool."""
    res = _bench_json(tiny_export, home, prompts_file, tmp_path, "--repeats", "3")
    runs = [r for r in res["runs"] if r["mode"] == "adaptive"]
    assert [r["warm_controller"] for r in runs] == [False, True, False, False]  # code, code, chat, voice
    assert all(len(r["decode_tok_s_repeats"]) == 3 for r in res["runs"])
    assert all(r["decode_tok_s_repeats"][1] == r["decode_tok_s"] for r in res["runs"])  # the median run
    assert res["summary"]["adaptive"]["code"]["speedup_decode_new_controller"] is not None
    cold = _bench_json(tiny_export, home, prompts_file, tmp_path, "--new-controller-per-prompt")
    assert not any(r["warm_controller"] for r in cold["runs"])


def test_speedups_are_paired_ratios():
    runs = []
    for prompt, (plain, spec) in enumerate([(10.0, 20.0), (10.0, 5.0), (1.0, 3.0)]):
        for mode, tps in (("plain", plain), ("k2", spec)):
            runs.append({"prompt": prompt, "class": "code", "mode": mode, "decode_tok_s": tps, "e2e_tok_s": tps,
                         "ttft_ms": 1.0, "accepted": 1, "evaluated": 2, "accepted_per_position": [1],
                         "proposed_per_position": [2], "mean_accepted_length": 1.5, "mean_k": 2.0,
                         "itl_p50_ms": 1.0, "itl_p95_ms": 2.0, "rounds": 1, "accepted_per_target_run": 1.0})
    s = summarize(runs, ["plain", "k2"])["k2"]["all"]
    # paired ratios 2.0, 0.5, 3.0 → median 2.0 (a ratio of medians would say 5/10 = 0.5)
    assert s["speedup_decode_median"] == 2.0 and s["speedup_decode_min"] == 0.5
    assert s["alpha"] == 0.5 and s["acceptance_by_position"] == [0.5]


def test_a_prompt_file_line_may_carry_a_system_message(tmp_path):
    from edgespec.bench.prompts import VOICE_SYSTEM, load_file

    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"class": "voice", "prompt": "Hi", "system": VOICE_SYSTEM}) + "\n"
                 + json.dumps({"class": "chat", "prompt": "Yo"}) + "\nplain text\n")
    voice, chat, plain = load_file(f)
    assert voice.cls == "voice" and voice.messages == ({"role": "system", "content": VOICE_SYSTEM},
                                                       {"role": "user", "content": "Hi"})
    assert chat.messages == ({"role": "user", "content": "Yo"},) and plain.cls == "custom"


def test_mode_names():
    assert Mode.parse("k4").k == 4 and Mode.parse("adaptive@120").budget_ms == 120
    with pytest.raises(ValueError):
        Mode.parse("fast")


def test_eval_on_the_tiny_pair(tiny_export, home, prompts_file):
    r = subprocess.run([sys.executable, "-m", "edgespec.cli", "eval", str(tiny_export), "--prompts", str(prompts_file),
                        "--draws", "200", "--ll-samples", "4", "--max-new-tokens", "16", "--json"],
                       capture_output=True, text=True, env=dict(os.environ, EDGESPEC_HOME=str(home)), timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert len(res["greedy"]) == 4 and all(g["identical"] and g["ok"] for g in res["greedy"])
    assert len(res["seeded"]) == 2 and all(g["identical"] and g["ok"] for g in res["seeded"])
    assert len(res["sampling"]) == 4 and all(s["tv"] < 3 * s["tv_noise"] + 0.02 for s in res["sampling"])
    assert {s["coupling"] for s in res["sampling"]} == {"standard", "gumbel"}
    assert res["kernel_noise"]["by_k"]["4"]["positions"] > 0 and res["kernel_noise"]["by_k"]["4"]["max_abs"] < 1e-3
    ll = res["likelihood"]
    assert ll["spec_standard"]["samples"] == ll["spec_gumbel"]["samples"] == ll["plain"]["samples"] == 4
    assert 0 < ll["spec_gumbel"]["alpha"] <= 1 and 0 < ll["spec_standard"]["alpha"] <= 1
    human = subprocess.run([sys.executable, "-m", "edgespec.cli", "eval", str(tiny_export), "--prompts",
                            str(prompts_file), "--draws", "50", "--ll-samples", "1", "--max-new-tokens", "8"],
                           capture_output=True, text=True, env=dict(os.environ, EDGESPEC_HOME=str(home)), timeout=600)
    assert human.returncode == 0, human.stderr
    assert "greedy: 4/4 speculative runs identical to plain" in human.stdout and "kernel noise" in human.stdout
    assert "likelihood (plain): mean log p" in human.stdout  # one text: no standard error, no traceback


def test_context_sweep_runs_two_exports_side_by_side(export_each_format, tiny_export, home, tmp_path):
    """``--context`` with ``--also``: every (export, length, mode) row, prompts of the asked length, the PNG."""
    out = tmp_path / "ctx"
    r = subprocess.run([sys.executable, "-m", "edgespec.cli", "bench", str(tiny_export), "--also",
                        str(export_each_format), "--context", "120,200", "--max-new-tokens", "8", "--out", str(out)],
                       capture_output=True, text=True, env=dict(os.environ, EDGESPEC_HOME=str(home)), timeout=600)
    assert r.returncode == 0, r.stderr
    assert "| export (graph format) | mode | decode after 120 | decode after 200 |" in r.stdout
    res = json.loads(out.with_suffix(".json").read_text())
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(res["rows"]) == 2 * 2 * 2 and res["modes"] == ["plain", "adaptive+lookup"]
    for row in res["rows"]:
        assert abs(row["prompt_tokens"] - row["context"]) <= 3  # the source is cut to fit the asked length
        assert row["decode_tok_s"] > 0 and row["prefill_tok_s"] > 0
    assert sorted(res["graph_formats"].values())[-1] in (2, 3, 4) and set(res["flat"]) == set(res["exports"])
    bad = subprocess.run([sys.executable, "-m", "edgespec.cli", "bench", str(tiny_export), "--context", "250"],
                         capture_output=True, text=True, env=dict(os.environ, EDGESPEC_HOME=str(home)), timeout=600)
    assert bad.returncode != 0 and bad.stderr.count("\n") == 1 and "exceeds" in bad.stderr


def test_a_context_length_given_twice_is_refused():
    """One sweep row per length: ``--context 128,128`` would merge two rows, so it is a usage error."""
    import argparse

    from edgespec.engine import flags

    assert flags.contexts("128, 3500") == [128, 3500]
    with pytest.raises(argparse.ArgumentTypeError, match="128 more than once"):
        flags.contexts("128,3500,128")


def test_context_sweep_repeats_cycle_through_every_cell(tiny_export, home, monkeypatch):
    """Each repeat runs every (length, mode) cell once, in the same order, so that a slow stretch of the machine
    hits short and long contexts alike (all repeats of one cell back to back biased their ratio)."""
    from edgespec.bench import context

    calls = []

    def fake_run(dec, mode, prompt, max_new, temperature, seed):
        calls.append((id(prompt), mode.name))
        rate = [5.0, 9.0, 7.0][(len(calls) - 1) // 4]  # each cell: 5, 9, then 7 over the three repeats
        return {"decode_tok_s": rate, "prefill_tok_s": 1.0, "prompt_tokens": 1, "new_tokens": max_new, "alpha": None}

    monkeypatch.setattr(context, "run_one", fake_run)
    res = context.context_sweep([tiny_export], [120, 200], ["plain", "adaptive+lookup"], 8, repeats=3)
    assert len(calls) == 12 and calls[:4] == calls[4:8] == calls[8:] and len(set(calls[:4])) == 4
    assert all(r["decode_tok_s_repeats"] == [5.0, 7.0, 9.0] and r["decode_tok_s"] == 7.0 for r in res["rows"])


BLOCKED = ["tqdm", "matplotlib", "torch", "transformers", "optimum", "onnx", "gguf", "accelerate"]


@pytest.mark.parametrize("command", ["bench", "eval"])
def test_bench_and_eval_run_on_a_runtime_only_install(tiny_export, home, prompts_file, tmp_path, command):
    """Import hygiene: with every extra's package unimportable (as after `pip install edgespec`), both commands
    still run (no progress bar, no plot)."""
    block = "; ".join(f"sys.modules[{m!r}] = None" for m in BLOCKED)
    args = [command, str(tiny_export), "--prompts", str(prompts_file), "--max-new-tokens", "6", "--json"]
    args += ["--modes", "plain,k2", "--out", str(tmp_path / "b")] if command == "bench" else [
        "--draws", "20", "--ll-samples", "2", "--per-class", "1"]
    code = f"import sys; {block}; from edgespec.cli import main; sys.exit(main({args!r}))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, EDGESPEC_HOME=str(home)))
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and json.loads(r.stdout)
