"""An export directory edited, mixed up, corrupted or pointing outside itself (issue 18, cases 1, 6, 12):
one line on stderr naming the file or value, a non-zero exit, no traceback."""

from __future__ import annotations

import os
import shutil

import pytest

from faults import copy_export, manifest, one_line_error, run
from tinymodels import build_model

GEN = ["--prompt", "def add", "--max-new-tokens", "4", "--k", "2"]


@pytest.fixture(scope="module")
def odd_export(home, tiny_dirs, tmp_path_factory):
    """The tiny target with a draft of another shape: 3 layers, hidden 32, a 480-wide head."""
    from edgespec.export import ExportOptions, export_pair

    root = tmp_path_factory.mktemp("odd")
    draft = build_model(root / "draft3", "qwen2", seed=5, layers=3, hidden=32, vocab=480)
    fp32 = ExportOptions(precision="fp32")
    return export_pair(str(tiny_dirs["target"]), str(draft), root / "pair", fp32, fp32)


def _without_files(m):
    return {k: v for k, v in m.items() if k != "files"}


def _set(block, key, value):
    return lambda m: {**m, block: {**m[block], key: value}}


@pytest.mark.parametrize("edit, says", [
    (_set("target", "num_layers", 3), "has 2 layers, the manifest says target.num_layers 3"),
    (_set("draft", "num_kv_heads", 4), "the manifest says draft.num_kv_heads 4"),
    (_set("target", "head_dim", 8), "the manifest says target.head_dim 8"),
    (_set("target", "vocab_size", 600), "logits are 512 wide, the manifest says target.vocab_size 600"),
    (_set("special_tokens", "eos", 10 ** 30), "special_tokens.eos 1000000000000000000000000000000 is not a token id"),
    (_set("special_tokens", "stop", [2, 400]), "special_tokens.stop 400 is not a token id"),
    (_set("target", "input_names", ["input_ids"]), "input names differ from target.input_names"),
    (lambda m: {**m, "tokenizer": "chat_template.jinja"}, "cannot load tokenizer"),
    # positions past the graph's rotary table would reach the attention kernel
    (_set("target", "context_length", 10 ** 6), "the manifest says context_length 1000000 but the graph's rotary"),
])
def test_manifest_that_disagrees_with_the_graphs_or_tokenizer(tiny_export, home, tmp_path, edit, says):
    d = copy_export(tiny_export, tmp_path / "x", edit)
    one_line_error(run(["generate", str(d), *GEN], home), says)


def test_missing_chat_template(tiny_export, home, tmp_path):
    d = copy_export(tiny_export, tmp_path / "x")
    (d / "chat_template.jinja").unlink()
    for args in (["generate", str(d), *GEN], ["info", str(d)]):
        one_line_error(run(args, home), "chat_template.jinja is missing")


def test_swapped_graph_paths(odd_export, home, tmp_path):
    swap = lambda m: {**m, "target": {**m["target"], "path": m["draft"]["path"]},  # noqa: E731
                      "draft": {**m["draft"], "path": m["target"]["path"]}}
    d = copy_export(odd_export, tmp_path / "x", swap)
    one_line_error(run(["generate", str(d), *GEN], home), "target graph has 3 layers, the manifest says "
                                                          "target.num_layers 2")


def test_draft_of_another_export(odd_export, tiny_export, home, tmp_path):
    """draft/ replaced by another export's draft: the size check names the file; an old manifest without
    file sizes still gets a one-line error from the graph check, never an onnxruntime error at run time."""
    d = copy_export(tiny_export, tmp_path / "x")
    shutil.rmtree(d / "draft")
    shutil.copytree(odd_export / "draft", d / "draft")
    one_line_error(run(["generate", str(d), *GEN], home), ("draft/model.onnx", "bytes, the manifest records"))
    # an old manifest without file sizes (and the draft's graph format as the replaced draft has it)
    old = copy_export(d, tmp_path / "old", lambda m: {**_without_files(m), "draft": {**m["draft"], "graph_format": 2}})
    one_line_error(run(["generate", str(old), *GEN], home), "draft graph has 3 layers")


def test_draft_with_another_vocabulary(home, tiny_dirs, tiny_export, tmp_path):
    from edgespec.export import ExportOptions, export_pair

    wide = build_model(tmp_path / "wide", "qwen2", seed=0, noise=0.1, vocab=480)
    fp32 = ExportOptions(precision="fp32")
    other = export_pair(str(tiny_dirs["target"]), str(wide), tmp_path / "other", fp32, fp32)
    d = copy_export(tiny_export, tmp_path / "x", _without_files)
    shutil.rmtree(d / "draft")
    shutil.copytree(other / "draft", d / "draft")
    one_line_error(run(["generate", str(d), *GEN], home), "draft graph's logits are 480 wide, the manifest says "
                                                          "draft.vocab_size 512")


def _flip(path, offset=-100):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    st = path.stat()
    path.write_bytes(bytes(data))
    return st


def test_flipped_bytes_in_the_weights(tiny_export, home, tmp_path):
    d = copy_export(tiny_export, tmp_path / "x")
    _flip(d / "target" / "model.onnx.data")
    one_line_error(run(["generate", str(d), *GEN], home), ("target/model.onnx.data", "sha256 differs"))
    r = run(["info", str(d), "--verify"], home)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "target/model.onnx.data: sha256 differs" in r.stderr and "5/6 files match" in r.stdout


def test_hash_verdict_is_cached_by_path_size_and_mtime(tiny_export, home, tmp_path):
    """The first load hashes; a later one trusts the verdict while path, size and mtime are unchanged
    (so a flip that keeps them is only found by `info --verify`), and hashes again when mtime changes."""
    d = copy_export(tiny_export, tmp_path / "x")
    assert run(["generate", str(d), *GEN], home).returncode == 0
    f = d / "draft" / "model.onnx.data"
    st = _flip(f)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert run(["generate", str(d), *GEN], home).returncode == 0
    r = run(["info", str(d), "--verify"], home)
    assert r.returncode == 1 and "draft/model.onnx.data: sha256 differs" in r.stderr
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10 ** 9))
    one_line_error(run(["generate", str(d), *GEN], home), "draft/model.onnx.data: sha256 differs")


def test_truncated_file_and_old_exports(tiny_export, home, tmp_path):
    d = copy_export(tiny_export, tmp_path / "x")
    with open(d / "tokenizer.json", "ab") as f:
        f.write(b" ")
    one_line_error(run(["generate", str(d), *GEN], home), ("tokenizer.json", "the manifest records"))
    old = copy_export(tiny_export, tmp_path / "old", _without_files)
    assert run(["generate", str(old), *GEN], home).returncode == 0
    r = run(["info", str(old), "--verify"], home)
    assert r.returncode == 0 and "records no file sizes or hashes" in r.stderr


def test_info_verify_ok(tiny_export, home):
    r = run(["info", str(tiny_export), "--verify"], home)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == f"{len(manifest(tiny_export)['files'])}/6 files match the manifest"


@pytest.mark.parametrize("field, value", [
    ("chat_template", "/etc/hostname"), ("tokenizer", "../tokenizer.json"), ("chat_template", "..\\x"),
    ("target.path", "../../x/model.onnx"), ("draft.kept_token_ids", "/etc/passwd"),
])
def test_manifest_paths_outside_the_export_are_refused(tiny_export, home, tmp_path, field, value):
    def edit(m):
        if "." in field:
            block, key = field.split(".")
            return {**m, block: {**m[block], key: value}}
        return {**m, field: value}

    d = copy_export(tiny_export, tmp_path / "x", edit)
    one_line_error(run(["generate", str(d), *GEN], home), f"{field} must be a path inside the export directory")


@pytest.mark.parametrize("name", ["chat_template.jinja", "tokenizer.json", "target"])
def test_symlinks_out_of_the_export_are_refused(tiny_export, home, tmp_path, name):
    """A file (or a directory on the way) that is a symlink to outside: refused, never read."""
    outside = tmp_path / "outside"
    d = copy_export(tiny_export, tmp_path / "x")
    shutil.move(d / name, outside)
    os.symlink(outside, d / name)
    one_line_error(run(["generate", str(d), *GEN], home), "leads outside the export directory")


def test_symlink_inside_the_export_is_fine(tiny_export, home, tmp_path):
    d = copy_export(tiny_export, tmp_path / "x")
    os.rename(d / "chat_template.jinja", d / "template.j2")
    os.symlink("template.j2", d / "chat_template.jinja")
    r = run(["generate", str(d), *GEN], home)
    assert r.returncode == 0, r.stderr


def test_default_graph_format_falls_back_to_2_where_format_3_cannot_go(odd_export, home, tiny_dirs, tmp_path):
    """The odd draft's head size (8) is not a multiple of 16, which GroupQueryAttention needs: the default export
    is format 2 for both graphs (with a notice); asking for format 3 explicitly is a one-line error."""
    from edgespec.export.gqa_graph import format3_problem
    from transformers import AutoConfig

    from edgespec.io.manifest import load_manifest

    m = load_manifest(odd_export)
    assert m.target.graph_format == 2 and m.draft.graph_format == 2
    assert "multiple of 16" in format3_problem(AutoConfig.for_model("qwen2", hidden_size=32, num_attention_heads=4))
    assert format3_problem(AutoConfig.from_pretrained(tiny_dirs["target"])) is None
    draft = build_model(tmp_path / "d", "qwen2", seed=5, layers=3, hidden=32, vocab=480)
    r = run(["export", "--target", str(tiny_dirs["target"]), "--draft", str(draft), "--precision", "fp32",
             "--graph-format", "3", "--out", str(tmp_path / "f3")], home)
    one_line_error(r, "multiple of 16", progress=True)
    assert not (tmp_path / "f3").exists()
