"""Tier (e): the command line, exact output on a tiny export, in an isolated user directory."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from edgespec.engine.decoder import SpecDecoder


def run(args, home, stdin=None):
    env = dict(os.environ, EDGESPEC_HOME=str(home))
    return subprocess.run([sys.executable, "-m", "edgespec.cli", *args], input=stdin, capture_output=True,
                          text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def api(tiny_export):
    return SpecDecoder.load(tiny_export)


def test_generate_prints_exactly_the_greedy_text(tiny_export, home, api):
    api.reset()
    want = api.generate(messages=[{"role": "user", "content": "def add"}], max_new_tokens=12, proposers=()).run()
    r = run(["generate", str(tiny_export), "--prompt", "def add", "--max-new-tokens", "12", "--k", "3"], home)
    assert r.returncode == 0, r.stderr
    assert r.stdout == want.text + "\n"
    assert r.stderr.startswith("[12 tokens") or r.stderr.startswith(f"[{len(want.token_ids)} tokens")


def test_generate_json_from_stdin_and_plain_mode(tiny_export, home, api):
    api.reset()
    want = api.generate("class Node", max_new_tokens=10, proposers=()).run()
    for mode in ("spec", "plain"):
        r = run(["generate", str(tiny_export), "--raw", "--json", "--max-new-tokens", "10", "--mode", mode], home,
                stdin="class Node")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["text"] == want.text and out["token_ids"] == want.token_ids
        s = out["stats"]
        assert s["mode"] == mode and s["new_tokens"] >= len(want.token_ids)
        for key in ("alpha", "rounds", "proposed", "accepted", "accepted_per_position", "draft_ms", "verify_ms",
                    "tokens_per_s", "k_per_round", "corrections", "bonus"):
            assert key in s


def test_scripted_multi_turn_chat(tiny_export, home, api):
    turns = ["def add", "and again", "hi"]
    api.reset()
    conv, want = [], []
    for i, t in enumerate(turns):
        if i == 2:  # after /reset
            conv = []
        conv.append({"role": "user", "content": t})
        g = api.generate(messages=conv, max_new_tokens=8, proposers=()).run()
        conv.append({"role": "assistant", "content": g.text})
        want.append(g.text)
    script = "def add\n/stats\nand again\n/reset\nhi\n/exit\nnever read\n"
    r = run(["chat", str(tiny_export), "--max-new-tokens", "8", "--k", "2"], home, stdin=script)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "".join(w + "\n" for w in want)
    assert "[conversation reset]" in r.stderr and r.stderr.count("tokens,") == 4  # 3 replies + /stats


def test_info(tiny_export, home):
    r = run(["info", str(tiny_export)], home)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == f"target+draft  ({tiny_export})"
    assert "target: qwen2, 2 layers, 2 KV heads × 16, logits 512, fp32" in r.stdout
    r = run(["info", str(tiny_export), "--json"], home)
    assert json.loads(r.stdout)["target"]["num_layers"] == 2


@pytest.mark.parametrize("args", [
    ["generate", "{missing}", "--prompt", "x"],
    ["generate", "{partial}", "--prompt", "x"],
    ["generate", "{export}", "--prompt", "x", "--k", "-1"],
    ["generate", "{export}", "--prompt", "x", "--temperature", "-2"],
    ["generate", "{export}", "--prompt", "x", "--top-p", "2"],
    ["generate", "{export}", "--prompt", "x", "--max-new-tokens", "0"],
    ["generate", "{export}", "--prompt", "x", "--provider", "nosuch"],
    ["generate", "{export}", "--prompt", "   "],
    ["chat", "{missing}"],
    ["info", "{partial}"],
    ["export", "no-such-recipe"],
    ["export", "--target", "{missing}", "--draft", "{missing}"],
])
def test_bad_input_is_one_line_and_nonzero(tiny_export, home, tmp_path, args):
    partial = tmp_path / "partial"
    (partial / "target").mkdir(parents=True)
    subs = {"missing": str(tmp_path / "nope"), "partial": str(partial), "export": str(tiny_export)}
    r = run([a.format(**subs) for a in args], home, stdin="")
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("edgespec: error:"), r.stderr


def _corrupted(tiny_export, tmp_path, name, edit):
    """A copy of the tiny export whose manifest went through ``edit``."""
    d = tmp_path / name
    shutil.copytree(tiny_export, d)
    m = json.loads((d / "edgespec.json").read_text())
    (d / "edgespec.json").write_text(json.dumps(edit(m)))
    return d


CORRUPT = {
    "list_manifest": lambda m: [m],
    "layers_two": lambda m: {**m, "target": {**m["target"], "num_layers": "two"}},
    "negative_heads": lambda m: {**m, "draft": {**m["draft"], "num_kv_heads": -2}},
    "names_string": lambda m: {**m, "target": {**m["target"], "input_names": "input_ids"}},
    "stop_strings": lambda m: {**m, "special_tokens": {**m["special_tokens"], "stop": ["</s>"]}},
    "no_format": lambda m: {k: v for k, v in m.items() if k != "format"},
    "no_tokenizer": lambda m: {k: v for k, v in m.items() if k != "tokenizer"},
    "int3": lambda m: {**m, "target": {**m["target"], "quantization": {**m["target"]["quantization"],
                                                                       "precision": "int3"}}},
    "files_empty": lambda m: {**m, "files": {}},  # would turn every size and sha256 check off
}


@pytest.mark.parametrize("args, says", [
    (["generate", "{export}", "--prompt", "x", "--k", "abc"], "expected an integer ≥ 0, got 'abc'"),
    (["generate", "{export}", "--prompt", "x", "--max-new-tokens", "1.5"], "got '1.5'"),
    (["generate", "{export}", "--prompt", "x", "--top-p", "nan"], "--top-p"),
    (["generate", "{export}", "--prompt", "x", "--latency-budget-ms", "-1"], "--latency-budget-ms"),
    (["generate", "{export}", "--prompt", "x", "--latency-budget-ms", "0"], "--latency-budget-ms"),
    (["chat", "{export}", "--latency-budget-ms", "inf"], "--latency-budget-ms"),
    (["bench", "{export}", "--latency-budget-ms", "nan"], "--latency-budget-ms"),
    (["chat", "{export}", "--draft-p-min", "1.5"], "--draft-p-min"),
    ([], "choose a command: export, chat, generate, serve, bench, eval, info"),
    (["info", "{file}"], "not a directory"),
    (["info", "{list_manifest}"], "not an edgespec manifest"),
    (["info", "{no_format}"], "not an edgespec manifest"),
    (["info", "{layers_two}"], "num_layers must be a positive integer"),
    (["info", "{negative_heads}"], "num_kv_heads must be a positive integer"),
    (["info", "{names_string}"], "input_names must be a list of strings"),
    (["generate", "{stop_strings}", "--prompt", "x"], "stop must be a list of token ids"),
    (["info", "{no_tokenizer}"], '"tokenizer" field is missing'),
    (["info", "{int3}"], "target.quantization.precision must be one of int4, int8, fp32"),
    (["generate", "{files_empty}", "--prompt", "x"], "files has no size and sha256 for target/"),
    (["info", "{manifest_dir}"], "a directory where the manifest file belongs"),
    # a result file that cannot be written is refused before the run, not after it
    (["eval", "{export}", "--out", "{missing}/r.json"], "no such directory for --out"),
    (["eval", "{export}", "--out", "{dir}"], "is a directory, not a file for --out"),
    (["bench", "{export}", "--out", "{missing}/b"], "no such directory for --out"),
    (["bench", "{export}", "--out", "{dir}/b"], "b.json: is a directory"),
])
def test_bad_input_message(tiny_export, home, tmp_path, args, says):
    subs = {"export": str(tiny_export), "file": str(tmp_path / "file"), "missing": str(tmp_path / "nope"),
            "dir": str(tmp_path / "d")}
    (tmp_path / "file").write_text("x")
    (tmp_path / "d" / "b.json").mkdir(parents=True)
    (tmp_path / "manifest_dir" / "edgespec.json").mkdir(parents=True)
    subs["manifest_dir"] = str(tmp_path / "manifest_dir")
    for name, edit in CORRUPT.items():
        if any("{" + name + "}" in a for a in args):
            subs[name] = str(_corrupted(tiny_export, tmp_path, name, edit))
    r = run([a.format(**subs) for a in args], home, stdin="")
    assert r.returncode == 2 and r.stdout == ""
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("edgespec: error:") and says in lines[0], r.stderr


def test_write_json_leaves_nothing_behind_when_it_fails(tmp_path):
    from edgespec.errors import EdgespecError
    from edgespec.io.paths import write_json

    (tmp_path / "adir").mkdir()
    with pytest.raises(EdgespecError, match="cannot write the result"):
        write_json(tmp_path / "adir", {"a": 1})
    write_json(tmp_path / "r.json", {"a": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "r.json"]
    assert json.loads((tmp_path / "r.json").read_text()) == {"a": 1}
    umask = os.umask(0o022)
    try:
        write_json(tmp_path / "r.json", {"a": 2})
        assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o644  # an ordinary file, not mkstemp's 0600
    finally:
        os.umask(umask)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_check_out_refuses_a_read_only_folder(tmp_path):
    from edgespec.errors import EdgespecError
    from edgespec.io.paths import check_out

    (tmp_path / "ro").mkdir(mode=0o555)
    with pytest.raises(EdgespecError, match="not writable"):
        check_out(tmp_path / "ro" / "r.json")


def test_version(home):
    r = run(["--version"], home)
    assert r.returncode == 0 and r.stdout.startswith("edgespec ") and r.stdout.split()[1][0].isdigit()


def test_an_export_path_with_a_tilde_is_the_users(tiny_export, tmp_path, monkeypatch):
    """``SpecDecoder.load("~/.cache/…")`` as the README writes it, and a quoted ``"~/…"`` at the CLI."""
    from edgespec.apps.cli_common import export_dir

    (tmp_path / "exports").mkdir()
    (tmp_path / "exports" / "pair").symlink_to(tiny_export, target_is_directory=True)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert SpecDecoder.load("~/exports/pair").generate("def add", max_new_tokens=2).run()
    assert export_dir("~/exports/pair", auto_export=False) == tmp_path / "exports" / "pair"


@pytest.mark.parametrize("args", [
    ["info", "{export}"],
    ["info", "{export}", "--json"],
    ["generate", "{export}", "--prompt", "def add", "--max-new-tokens", "8"],
])
def test_closed_stdout_is_quiet(tiny_export, home, args):
    """`edgespec info | head -1`: the reader is gone before anything is written; no traceback, no noise."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = dict(os.environ, EDGESPEC_HOME=str(home))
    p = subprocess.Popen([sys.executable, "-m", "edgespec.cli", *[a.format(export=tiny_export) for a in args]],
                         stdout=write_end, stderr=subprocess.PIPE, text=True, env=env)
    os.close(write_end)
    err = p.communicate(timeout=300)[1]
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, err
    assert p.returncode in (0, 141)


def test_closed_stdout_after_one_byte(tiny_export, home):
    env = dict(os.environ, EDGESPEC_HOME=str(home))
    p = subprocess.Popen([sys.executable, "-m", "edgespec.cli", "info", str(tiny_export)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env)
    assert p.stdout.read(1) == b"t"
    p.stdout.close()
    err = p.stderr.read().decode()
    p.wait(timeout=300)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert p.returncode in (0, 141)


def test_runtime_imports_without_torch_transformers_or_optimum():
    code = ("import sys, edgespec, edgespec.cli, edgespec.engine.decoder, edgespec.control.adaptive, "
            "edgespec.bench.evaluate; "
            "print(sorted(m for m in ('torch', 'transformers', 'optimum', 'onnx') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr


def test_folder_names_are_the_last_part_of_the_import_names():
    """export/ imports as edgespec.export, models/ as edgespec.models (the old names still resolve there)."""
    from pathlib import Path

    import edgespec.export
    import edgespec.models
    import edgespec_models

    root = Path(edgespec.__file__).parent.parent
    assert Path(edgespec.export.__file__).parent == root / "export"
    assert Path(edgespec.models.__file__).parent == root / "models"
    assert "qwen2.5-coder-1.5b+0.5b" in edgespec.models.available()
    assert Path(edgespec_models.__file__) == Path(edgespec.models.__file__)


def test_default_mode_is_prompt_lookup_then_the_draft():
    """chat, generate and serve default to adaptive K with prompt lookup first (`--no-lookup`: the draft alone)."""
    from edgespec.apps.cli import _proposers, build_parser

    parse = build_parser().parse_args
    assert _proposers(parse(["generate"])) == ("lookup", "draft")
    assert _proposers(parse(["chat", "--no-lookup"])) == ("draft",)
    assert _proposers(parse(["serve", "--tree"])) == ("lookup", "draft", "tree")
    assert _proposers(parse(["generate", "--mode", "plain"])) == ()
