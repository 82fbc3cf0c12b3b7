"""export/reference.py against transformers on a tiny random model of every family, and the tiny GGUF files of
tests/tinyfamilies.py: they load with the gguf package's reader, carry llama.cpp's keys, and undoing the documented
conventions gives back the Hugging Face tensors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgespec.errors import EdgespecError
from edgespec.export.model_config import ModelConfig
from edgespec.export.reference import forward, rotary_inv_freq
from edgespec.export.weights import DictSource
from tinyfamilies import FAMILIES, build_hf, write_gguf

T = 12  # prompt length: longer than Gemma 3's window of 4


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """family → its tiny Hugging Face directory, built on first use."""
    built = {}

    def get(family):
        if family not in built:
            built[family] = build_hf(tmp_path_factory.mktemp(family), family)
        return built[family]
    return get


def _hf_logits(model, ids: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.from_numpy(ids)[None]).logits[0].float().numpy()


def _load(hf_dir):
    from transformers import AutoModelForCausalLM

    import torch

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager")
    cfg = ModelConfig.from_hf(json.loads((hf_dir / "config.json").read_text()))
    return model.eval(), DictSource(cfg, model.state_dict())


@pytest.mark.parametrize("family", FAMILIES)
def test_reference_matches_transformers(hf_dirs, family):
    model, source = _load(hf_dirs(family))
    lengths = (T, 40) if family == "phi3-longrope" else (T,)  # 40 > the original 32 positions: long factors
    for n in lengths:
        ids = np.random.default_rng(n).integers(0, 408, size=n).astype(np.int64)
        want = _hf_logits(model, ids)
        got = forward(source, ids)
        assert got.shape == want.shape and got.dtype == np.float32
        scale = max(1.0, float(np.abs(want).max()))
        assert np.abs(got - want).max() <= 1e-4 * scale, (family, n, float(np.abs(got - want).max()), scale)
        assert (got.argmax(-1) == want.argmax(-1)).all()
        assert len(set(want.argmax(-1).tolist())) > 1, "degenerate tiny model: one greedy token everywhere"
    if family == "gemma3":
        assert "sliding_attention" in source.config.layer_types and "full_attention" in source.config.layer_types


def test_layers_at_once_and_head_chunks_agree(hf_dirs, monkeypatch):
    import edgespec.export.reference as reference

    _, source = _load(hf_dirs("qwen3"))
    ids = np.arange(T, dtype=np.int64)
    one = forward(source, ids)
    monkeypatch.setattr(reference, "HEAD_ROWS", 100)  # 512 rows in 6 chunks
    np.testing.assert_allclose(forward(source, ids, layers_at_once=2), one, rtol=0, atol=1e-5)


def test_gemma_query_pre_attn_scalar_is_not_head_dim(tmp_path):
    """The attention scale follows query_pre_attn_scalar, not head_dim (the default tiny Gemma has them equal)."""
    model, source = _load(build_hf(tmp_path, "gemma3", layers=2, overrides={"query_pre_attn_scalar": 8}))
    ids = np.arange(T, dtype=np.int64) * 7
    want = _hf_logits(model, ids)
    assert np.abs(forward(source, ids) - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max()))


def test_rotary_inv_freq_per_layer_type():
    cfg = ModelConfig(architecture="gemma3_text", num_layers=6, hidden_size=64, intermediate_size=128, num_heads=4,
                      num_kv_heads=1, head_dim=32, vocab_size=8, rope_theta=1e6, rope_local_theta=1e4,
                      rope_scaling={"rope_type": "linear", "factor": 8.0})
    full, a = rotary_inv_freq(cfg, "full_attention")
    local, b = rotary_inv_freq(cfg, "sliding_attention")
    assert full.dtype == np.float64 and full.shape == (16,) and a == b == 1.0
    np.testing.assert_allclose(full, 1 / 1e6 ** (np.arange(0, 32, 2) / 32) / 8)
    np.testing.assert_allclose(local, 1 / 1e4 ** (np.arange(0, 32, 2) / 32))


def test_refuses_unsupported_in_one_line():
    base = dict(num_layers=1, hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2, head_dim=16,
                vocab_size=8)
    for cfg, words in [(ModelConfig(architecture="gpt2", **base), "unsupported architecture 'gpt2'"),
                       (ModelConfig(architecture="llama", rope_scaling={"rope_type": "dynamic", "factor": 2.0},
                                    **base), "'dynamic'"),
                       (ModelConfig(architecture="llama", hidden_act="relu", **base), "'relu'")]:
        with pytest.raises(EdgespecError) as e:
            forward(DictSource(cfg, {}), np.zeros(2, dtype=np.int64))
        assert words in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(EdgespecError, match="final_logit_softcapping"):
        ModelConfig.from_hf({"model_type": "gemma3_text", "num_attention_heads": 4, "hidden_size": 64,
                             "num_hidden_layers": 1, "intermediate_size": 128, "vocab_size": 8,
                             "final_logit_softcapping": 30.0})


# ---------------------------------------------------------------------------------------------------- GGUF

KEYS = ("block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
        "attention.head_count_kv", "rope.freq_base", "attention.layer_norm_rms_epsilon")
EXTRA_KEYS = {"llama": ("vocab_size", "rope.dimension_count", "attention.key_length"),
              "llama3": ("vocab_size", "rope.dimension_count"), "qwen3": ("attention.key_length",),
              "gemma3": ("attention.sliding_window", "attention.key_length", "attention.value_length",
                         "rope.scaling.type", "rope.scaling.factor"),
              "phi3": ("rope.dimension_count", "rope.scaling.original_context_length", "attention.sliding_window"),
              "phi3-longrope": ("rope.dimension_count", "rope.scaling.attn_factor")}


def _undo(arch: str, name: str, w: np.ndarray, hp: dict) -> np.ndarray:
    """A GGUF tensor back in Hugging Face's meaning, undoing exactly what write_gguf documents."""
    if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
        heads = hp["num_attention_heads"] if ".attn_q." in name else hp["num_key_value_heads"]
        w = w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    if arch == "gemma3" and name.endswith("norm.weight"):
        w = w - 1.0
    return w


@pytest.mark.parametrize("family,qtype", [(f, None) for f in FAMILIES] + [("llama", "Q8_0"), ("qwen2", "Q4_0")])
def test_gguf_loads_with_llama_cpp_keys_and_tensors(hf_dirs, tmp_path, family, qtype):
    import gguf
    from safetensors.numpy import load_file

    hf = hf_dirs(family)
    hp = json.loads((hf / "config.json").read_text())
    r = gguf.GGUFReader(str(write_gguf(hf, tmp_path / f"{family}.gguf", qtype=qtype)))
    arch = r.fields["general.architecture"].contents()
    assert arch == {"gemma3": "gemma3", "phi3-longrope": "phi3", "llama3": "llama"}.get(family, family)
    for key in KEYS + EXTRA_KEYS.get(family, ()):
        assert f"{arch}.{key}" in r.fields, key
    assert r.fields[f"{arch}.block_count"].contents() == hp["num_hidden_layers"]
    assert r.fields["tokenizer.ggml.model"].contents() == "gpt2"
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    assert len(tokens) == len(types) == hp["vocab_size"]
    assert tokens[1] == "<|im_start|>" and types[1] == gguf.TokenType.CONTROL  # a trained special
    assert tokens[400] == "<|fim_prefix|>" and types[400] == gguf.TokenType.CONTROL  # an added special
    assert tokens[406] == "<tool_call>" and types[406] == gguf.TokenType.USER_DEFINED  # added, not special
    assert tokens[-1] == f"[PAD{hp['vocab_size'] - 1}]" or family == "gemma3"
    assert r.fields["tokenizer.ggml.eos_token_id"].contents() == hp["eos_token_id"]
    assert "tokenizer.ggml.merges" in r.fields and "tokenizer.chat_template" in r.fields

    hf_tensors = load_file(str(hf / "model.safetensors"))
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], hp["num_hidden_layers"])
    by_name = {t.name: t for t in r.tensors}
    extra = {"llama3": {"rope_freqs.weight"}, "phi3-longrope": {"rope_factors_long.weight",
                                                                "rope_factors_short.weight"}}.get(family, set())
    assert set(by_name) == {tmap.get_name(n, try_suffixes=(".weight", ".bias")) for n in hf_tensors} | extra
    for name, want in hf_tensors.items():
        t = by_name[tmap.get_name(name, try_suffixes=(".weight", ".bias"))]
        w = np.asarray(t.data, dtype=np.float32) if t.tensor_type == gguf.GGMLQuantizationType.F32 \
            else gguf.quants.dequantize(t.data, t.tensor_type)
        w = _undo(arch, t.name, w.reshape([int(d) for d in reversed(t.shape)]), hp)
        want = want[:w.shape[0]] if name.endswith("embed_tokens.weight") else want  # Gemma's trimmed rows
        tol = {None: 0.0, "Q8_0": 0.01, "Q4_0": 0.15}[qtype if want.ndim == 2 else None] * float(np.abs(want).max())
        np.testing.assert_allclose(w, want, rtol=0, atol=tol + 1e-7, err_msg=name)
    if family == "llama3":
        factors = np.asarray(by_name["rope_freqs.weight"].data)
        inv, _ = rotary_inv_freq(ModelConfig.from_hf(hp))
        base = 1 / hp["rope_theta"] ** (np.arange(0, 16, 2) / 16)
        np.testing.assert_allclose(base / factors, inv, rtol=1e-5)  # llama.cpp's divisors = transformers' llama3
