"""The export contract on tiny random models: graph I/O, manifest, validation, cache, atomicity, bad input."""

import json
import shutil

import numpy as np
import onnxruntime as ort
import pytest

from edgespec.errors import EdgespecError
from edgespec.io.manifest import load_manifest
from tinymodels import build_model


def test_manifest_and_graph_contract(tiny_export):
    m = load_manifest(tiny_export)
    assert (tiny_export / "tokenizer.json").is_file() and (tiny_export / "chat_template.jinja").is_file()
    for g in (m.target, m.draft):
        assert g.architecture == "qwen2" and g.num_layers == 2 and g.num_kv_heads == 2 and g.head_dim == 16
        assert g.vocab_size == 512 and len(g.source_sha256) == 64
        s = ort.InferenceSession(str(tiny_export / g.path), providers=["CPUExecutionProvider"])
        ins = {i.name: i for i in s.get_inputs()}
        outs = {o.name: o for o in s.get_outputs()}
        assert list(ins) == list(g.input_names) and list(outs) == list(g.output_names)
        assert ins["input_ids"].type == "tensor(int64)" and ins["position_ids"].type == "tensor(int64)"
        assert ins["attention_mask"].type == "tensor(bool)" and len(ins["attention_mask"].shape) == 4
        assert ins["past_key_values.1.value"].type == "tensor(float)"
        assert outs["logits"].type == "tensor(float)" and "present.1.key" in outs
        v = g.validation["reference"]  # streamed from safetensors: checked against the numpy reference
        assert "numpy" in v["against"] and v["greedy_agreement"] == 1.0
        assert max(v["max_abs_logit_error"], v["max_abs_past_vs_full"]) <= 1e-3
    eos = m.special_tokens.eos
    assert eos in m.special_tokens.stop and m.tokenizer_sha256


def test_logits_keep_runs_the_head_on_the_last_rows_only(tiny_export):
    """The optional ``logits_keep`` input: default every row; N gives the last N rows, equal to the full run's."""
    from edgespec.io.onnx_model import OnnxLM

    m = load_manifest(tiny_export)
    lm = OnnxLM(m.target, tiny_export)
    assert lm.has_logits_keep
    ids = [5, 9, 3, 7, 11]
    full = lm.forward(ids, lm.new_cache())
    for n in (1, 2, 5):
        part = lm.forward(ids, lm.new_cache(), keep=n)
        assert part.shape == (n, m.target.vocab_size)
        np.testing.assert_allclose(part, full[-n:], atol=1e-5)
    feeds = {"input_ids": np.array([ids]), "position_ids": np.arange(5)[None],
             "attention_mask": np.tril(np.ones((5, 5), dtype=bool))[None, None],
             "logits_keep": np.array([2])}
    for i in range(m.target.num_layers):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = np.zeros((1, m.target.num_kv_heads, 0, m.target.head_dim),
                                                            dtype=np.float32)
    assert lm.session.run(["logits"], feeds)[0].shape == (1, 2, m.target.vocab_size)  # the graph itself slices


def test_tree_mask_is_honoured(tiny_export):
    """A per-query mask: two sibling candidates at the same position see the shared prefix, not each other."""
    from edgespec.io.onnx_model import OnnxLM, causal_mask

    m = load_manifest(tiny_export)
    lm = OnnxLM(m.target, tiny_export)
    prefix, a, b = [5, 6, 7], 11, 12
    cache = lm.new_cache()
    lm.forward(prefix, cache)
    past = cache.length
    mask = np.ones((1, 1, 2, past + 2), dtype=bool)
    mask[0, 0, 0, past + 1] = False  # a does not see b
    mask[0, 0, 1, past] = False  # b does not see a
    tree = lm.forward([a, b], cache, position_ids=np.array([past, past]), mask=mask)
    for i, tok in enumerate((a, b)):
        c = lm.new_cache()
        lm.forward(prefix, c)
        chain = lm.forward([tok], c)
        assert np.abs(tree[i] - chain[0]).max() < 1e-4
    assert causal_mask(1, 2).shape == (1, 1, 2, 3)


def test_llama_family_int8_and_int4(home, tiny_dirs, tmp_path):
    from edgespec.export import ExportOptions, export_pair

    with pytest.raises(EdgespecError, match="tokenizers differ|disagree"):
        # the llama model shares the tokenizer, so this must pass the pair check: build a mismatch instead
        bad = tmp_path / "other_tok"
        shutil.copytree(tiny_dirs["llama"], bad)
        tok = json.loads((bad / "tokenizer.json").read_text())
        vocab = tok["model"]["vocab"]
        k1, k2 = list(vocab)[300], list(vocab)[301]
        vocab[k1], vocab[k2] = vocab[k2], vocab[k1]
        (bad / "tokenizer.json").write_text(json.dumps(tok))
        export_pair(str(tiny_dirs["llama"]), str(bad), tmp_path / "x")
    out = export_pair(str(tiny_dirs["llama"]), str(tiny_dirs["llama"]), tmp_path / "llama",
                      ExportOptions("int8"), ExportOptions("int4", block_size=16, lm_head_bits=8))
    m = load_manifest(out)
    assert m.target.architecture == "llama"
    assert m.target.quantization.precision == "int8" and m.draft.quantization.precision == "int4"
    assert m.draft.quantization.lm_head_bits == 8
    for g in (m.target, m.draft):
        q = g.validation["reference"]
        assert q["positions"] == 256 and q["kl_mean"] >= 0 and 0.5 <= q["greedy_agreement"] <= 1 and q["max_abs_logit_error"] >= 0
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_model_with_a_context_shorter_than_the_validation_prompt(home, tmp_path, precision):
    """A model of 128 positions is validated on 128 tokens, not on the usual 256 (which it cannot take)."""
    from edgespec.export import ExportOptions, export_pair

    short = build_model(tmp_path / "short", "qwen2", seed=3, context=128)
    opts = ExportOptions(precision, block_size=16) if precision == "int4" else ExportOptions(precision)
    out = export_pair(str(short), str(short), tmp_path / "pair", opts, opts)
    m = load_manifest(out)
    assert m.target.validation["reference"]["positions"] == 128
    assert m.target.context_length == m.draft.context_length == 128


def test_second_export_reuses_the_cache(home, tiny_dirs, tiny_export, tmp_path, capfd):
    from edgespec.export import ExportOptions, export_pair

    graphs = sorted(p.name for p in (home / "graphs").iterdir())
    fp32 = ExportOptions("fp32")
    out = export_pair(str(tiny_dirs["target"]), str(tiny_dirs["draft"]), tmp_path / "again", fp32, fp32)
    assert "cached graph" in capfd.readouterr().err
    assert sorted(p.name for p in (home / "graphs").iterdir()) == graphs
    assert (out / "target" / "model.onnx").read_bytes() == (tiny_export / "target" / "model.onnx").read_bytes()


def test_interrupted_export_leaves_nothing_loadable(home, tiny_dirs, tmp_path, monkeypatch):
    import edgespec.export.pipeline as pipeline
    from edgespec.export import ExportOptions

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("edgespec.export.validate.reference_logits", boom)  # after the graph is written
    out = tmp_path / "interrupted"
    with pytest.raises(KeyboardInterrupt):
        pipeline.export_pair(str(tiny_dirs["target"]), str(tiny_dirs["draft"]), out, ExportOptions("int8"),
                             ExportOptions("int8"))
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if "interrupted" in p.name]
    assert not [p for p in (home / "graphs").iterdir() if ".tmp" in p.name]
    out.mkdir()
    (out / "target").mkdir()
    with pytest.raises(EdgespecError, match="not a complete edgespec export"):
        load_manifest(out)


def test_resolve_model_hub_ids_and_missing_paths(tmp_path, monkeypatch):
    from edgespec.export import sources

    monkeypatch.setattr(sources, "_hub_reachable", lambda timeout=3.0: True)  # no network in tests
    monkeypatch.chdir(tmp_path)
    for ref in ("Qwen/Qwen2.5-0.5B", "some-org/model_v1.2"):
        s = sources.resolve_model(ref)
        assert (s.kind, s.ref, s.path, s.sha256) == ("hub", ref, None, "hub:" + ref)
    for bad in ("./nope", "/abs/nope", "a/b/c", "nope", "../x/y", ".hidden/x", "a/..", "a/b c", "a//b", "a/"):
        with pytest.raises(EdgespecError, match="no such file or directory, and not a hub model id"):
            sources.resolve_model(bad)


def test_unreachable_hub_switches_to_offline(monkeypatch):
    import os

    from edgespec.export import sources

    monkeypatch.setenv("HF_HUB_OFFLINE", "")  # restored after the test
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(sources, "_hub_reachable", lambda timeout=3.0: False)
    assert sources.resolve_model("Qwen/Qwen2.5-0.5B").kind == "hub"
    assert os.environ["HF_HUB_OFFLINE"] == "1"


@pytest.mark.parametrize("case", ["missing", "not_gguf", "no_config", "bert", "gpt2", "out_not_dir", "out_foreign"])
def test_bad_input_is_one_clear_error(home, tiny_dirs, tmp_path, case):
    from edgespec.export import export_pair

    target, draft, out = str(tiny_dirs["target"]), str(tiny_dirs["draft"]), tmp_path / "out"
    if case == "missing":
        target = str(tmp_path / "nope.gguf")
    elif case == "not_gguf":
        (tmp_path / "f.gguf").write_bytes(b"not a gguf file")
        target = str(tmp_path / "f.gguf")
    elif case == "no_config":
        (tmp_path / "empty").mkdir()
        target = str(tmp_path / "empty")
    elif case in ("bert", "gpt2"):
        d = tmp_path / case
        shutil.copytree(tiny_dirs["target"], d)
        cfg = json.loads((d / "config.json").read_text())
        cfg["model_type"] = case
        cfg["architectures"] = ["BertModel" if case == "bert" else "GPT2LMHeadModel"]
        (d / "config.json").write_text(json.dumps(cfg))
        target = str(d)
    elif case == "out_not_dir":
        (tmp_path / "file").write_text("x")
        out = tmp_path / "file" / "sub"
    elif case == "out_foreign":
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    with pytest.raises(EdgespecError) as e:
        export_pair(target, draft, out)
    assert "\n" not in str(e.value)
    if case == "out_foreign":
        assert (out / "keep.txt").read_text() == "mine"
    elif case != "out_not_dir":
        assert not out.exists()


def test_pruned_draft_vocabulary(home, tiny_dirs, tmp_path):
    """FR-Spec: the draft head keeps N ids; greedy and sampling stay exact through the id map."""
    from edgespec.engine.decoder import SpecDecoder
    from edgespec.export import ExportOptions, export_pair

    out = export_pair(str(tiny_dirs["target"]), str(tiny_dirs["draft"]), tmp_path / "pruned",
                      ExportOptions("fp32"), ExportOptions("fp32", vocab_size=300))
    m = load_manifest(out)
    assert m.draft.vocab_size == 300 and m.draft.kept_token_ids == "draft/kept_token_ids.npy"
    kept = np.load(out / m.draft.kept_token_ids)
    assert len(kept) == 300 and np.all(np.diff(kept) > 0) and kept.max() < 512
    v = m.draft.validation
    assert v["pruned_vocab"]["size"] == 300 and "stdlib" in v["pruned_vocab"]["source"]
    assert 0 <= v["reference"]["target_top1_in_kept"] <= 1
    s = ort.InferenceSession(str(out / m.draft.path), providers=["CPUExecutionProvider"])
    assert s.get_outputs()[0].shape[2] == 300
    dec = SpecDecoder.load(out)
    for prompt in ("def add(a, b):", "The quick brown"):
        ids = dec.encode(prompt)
        dec.reset()
        plain = dec.generate(input_ids=ids, max_new_tokens=50, proposers=()).run()
        dec.reset()
        g = dec.generate(input_ids=ids, max_new_tokens=50, k=3).run()
        assert g.token_ids == plain.token_ids
        assert g.stats.proposed > 0
    from edgespec.bench.evaluate import first_token_check
    from edgespec.core.sampling import SamplingParams

    r = first_token_check(dec, dec.encode("def add(a, b):"), SamplingParams(0.8, top_p=0.95), draws=2000, k=3)
    assert r["tv"] < 3 * r["tv_noise"] + 0.01
