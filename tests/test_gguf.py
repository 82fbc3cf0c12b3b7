"""The exporter's GGUF path on a tiny Qwen2 written as an F32 GGUF inside the test.

The GGUF vocabulary carries extra CONTROL (type 3) and USER_DEFINED (type 4) tokens at fixed ids, as
llama.cpp's converter writes them for Qwen2.5 (``<|fim_prefix|>``, ``<tool_call>``, …), plus ``[PAD{i}]``
UNUSED padding up to the embedding width. Checks: the exported tokenizer keeps each of them as one token at
its GGUF id; the manifest (hash, validation, architecture, stop ids); the exported graph reproduces the
original PyTorch model's logits and greedy tokens (the GGUF round trip kept the weights); truncated or
non-GGUF files give EdgespecError.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from tinymodels import CHATML, build_model

VOCAB = 512
# Fixed ids inside the 512-wide vocabulary, away from the trained BPE ids (0..399) and not contiguous.
CONTROL_EXTRA = {420: "<|fim_prefix|>", 421: "<|fim_suffix|>", 430: "<|fim_middle|>"}
USER_EXTRA = {480: "<tool_call>", 481: "</tool_call>", 500: "<think>"}
PLAIN_TEXTS = ["def add(a, b):\n    return a + b\n", "The quick brown fox.", "单发 A. 中文 测试 ünïcödé ✓",
               "  spaces\tand\ttabs\n\n", "x = [PAD430] <tool  call>"]
TT_NORMAL, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED = 1, 3, 4, 5


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_gguf(hf_dir: Path, path: Path, token_types: bool = True, add_bos: bool | None = False) -> dict:
    """Write the HF model + tokenizer in ``hf_dir`` as an F32 qwen2 GGUF; returns ``{text: id}`` of the vocab.

    ``token_types=False`` leaves out ``tokenizer.ggml.token_type`` (optional in the GGUF spec);
    ``add_bos`` is ``tokenizer.ggml.add_bos_token`` (None: the key is left out).
    """
    import gguf
    import torch
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(hf_dir)
    assert cfg.vocab_size == VOCAB
    state = json.loads((hf_dir / "tokenizer.json").read_text())
    vocab = dict(state["model"]["vocab"])
    specials = set()
    for t in state["added_tokens"]:
        vocab[t["content"]] = t["id"]
        if t["special"]:
            specials.add(t["content"])
    n = len(vocab)
    assert sorted(vocab.values()) == list(range(n)) and n <= min(CONTROL_EXTRA | USER_EXTRA)
    tokens = [None] * VOCAB
    types = [TT_UNUSED] * VOCAB
    for text, i in vocab.items():
        tokens[i], types[i] = text, TT_CONTROL if text in specials else TT_NORMAL
    for extra, tt in ((CONTROL_EXTRA, TT_CONTROL), (USER_EXTRA, TT_USER_DEFINED)):
        for i, text in extra.items():
            assert text not in vocab
            tokens[i], types[i] = text, tt
    for i in range(VOCAB):
        if tokens[i] is None:
            tokens[i] = f"[PAD{i}]"  # what llama.cpp's converter writes for ids the tokenizer lacks
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["model"]["merges"]]

    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name("tiny-qwen2")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(cfg.rope_theta))
    w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    if token_types:
        w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.add_pad_token_id(vocab["<|endoftext|>"])
    w.add_bos_token_id(vocab["<|endoftext|>"])
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    w.add_chat_template(CHATML)

    from safetensors.torch import load_file

    sd = load_file(hf_dir / "model.safetensors")
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, cfg.num_hidden_layers)
    written = set()
    for hf_name, t in sd.items():
        name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf_name
        w.add_tensor(name, t.to(torch.float32).numpy())
        written.add(name)
    assert {"token_embd.weight", "output.weight", "output_norm.weight", "blk.0.attn_q.bias",
            "blk.1.ffn_down.weight"} <= written
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {t: i for i, t in enumerate(tokens)}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("gguf_hf") / "qwen2", "qwen2", seed=5, layers=2, hidden=64)


@pytest.fixture(scope="module")
def gguf_file(hf_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny-qwen2-f32.gguf"
    vocab = write_gguf(hf_dir, path)
    return path, vocab


@pytest.fixture(scope="module")
def gguf_export(home, gguf_file, tmp_path_factory):
    from edgespec.export import ExportOptions, export_pair

    out = tmp_path_factory.mktemp("gguf_exports") / "pair"
    fp32 = ExportOptions(precision="fp32")
    return export_pair(str(gguf_file[0]), str(gguf_file[0]), out, fp32, fp32)


@pytest.fixture(scope="module")
def hf_model(hf_dir):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()


def test_tokenizer_keeps_control_and_user_defined_tokens(gguf_export, gguf_file):
    from tokenizers import Tokenizer

    _, vocab = gguf_file
    tok = Tokenizer.from_file(str(gguf_export / "tokenizer.json"))
    singles = {**CONTROL_EXTRA, **USER_EXTRA,
               **{vocab[t]: t for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")}}
    for i, text in singles.items():
        assert tok.token_to_id(text) == i, text
        assert tok.encode(text, add_special_tokens=False).ids == [i], text
        assert tok.decode([i], skip_special_tokens=False) == text
    # control tokens are special (skipped on decode), user-defined ones are ordinary text
    for i, text in CONTROL_EXTRA.items():
        assert tok.decode([i], skip_special_tokens=True) == ""
    for i, text in USER_EXTRA.items():
        assert tok.decode([i], skip_special_tokens=True) == text
    # inside running text too
    ids = tok.encode("<|fim_prefix|>def f():<tool_call>x</tool_call><|fim_suffix|>", add_special_tokens=False).ids
    for i in (420, 480, 481, 421):
        assert ids.count(i) == 1
    assert ids[0] == 420 and ids[-1] == 421
    assert all(i < VOCAB for i in ids)
    for text in PLAIN_TEXTS:
        ids = tok.encode(text, add_special_tokens=False).ids
        assert ids and all(i < VOCAB for i in ids)
        assert not set(ids) & (set(CONTROL_EXTRA) | set(USER_EXTRA))
        assert tok.decode(ids, skip_special_tokens=False) == text


def test_manifest(gguf_export, gguf_file):
    from edgespec.io.manifest import load_manifest

    path, vocab = gguf_file
    m = load_manifest(gguf_export)
    sha = _sha256(path)
    for g in (m.target, m.draft):
        assert g.architecture == "qwen2"
        assert g.source_sha256 == sha
        assert g.vocab_size == VOCAB
        assert g.num_layers == 2 and g.num_kv_heads == 2 and g.head_dim == 16
        assert g.quantization.precision == "fp32"
        f = g.validation["reference"]  # streamed from the GGUF: the numpy reference of the same weights
        assert f["greedy_agreement"] == 1.0
        for k in ("max_abs_logit_error", "max_abs_past_vs_full"):
            assert 0 <= f[k] <= 1e-3, (k, f[k])
    st = m.special_tokens
    assert st.eos == vocab["<|im_end|>"]
    assert st.pad == vocab["<|endoftext|>"]
    assert st.eos in st.stop and vocab["<|endoftext|>"] in st.stop
    assert m.chat_template and (gguf_export / m.chat_template).read_text() == CHATML
    assert (gguf_export / "target" / "model.onnx").is_file() and (gguf_export / "draft" / "model.onnx").is_file()


def test_onnx_logits_match_original_pytorch(gguf_export, hf_model):
    import torch
    from tokenizers import Tokenizer

    from edgespec.io.manifest import load_manifest
    from edgespec.export.validate import run_onnx, session

    g = load_manifest(gguf_export).target
    tok = Tokenizer.from_file(str(gguf_export / "tokenizer.json"))
    ids = np.array(tok.encode("<|im_start|>user\ndef add(a, b):<tool_call><|fim_prefix|>",
                              add_special_tokens=False).ids, dtype=np.int64)
    assert len(ids) > 5
    with torch.no_grad():
        ref = hf_model(torch.from_numpy(ids)[None]).logits[0].numpy()
    got, _ = run_onnx(session(gguf_export / g.path), ids, [], g.num_layers, g.num_kv_heads, g.head_dim)
    assert got.shape == ref.shape == (len(ids), VOCAB)
    assert np.abs(got - ref).max() < 1e-3


def test_greedy_matches_original_pytorch(gguf_export, hf_model):
    import torch
    from tokenizers import Tokenizer

    from edgespec.engine.decoder import SpecDecoder
    from edgespec.io.integrity import tokenizer_width
    from edgespec.io.manifest import load_manifest

    stop = set(load_manifest(gguf_export).special_tokens.stop)
    ids = Tokenizer.from_file(str(gguf_export / "tokenizer.json")).encode("def add(a, b):",
                                                                       add_special_tokens=False).ids
    n = 24
    # one torch thread: tiny matmuls gain nothing from more, and on a busy machine OpenMP waits cost seconds
    ref, seq, threads = [], list(ids), torch.get_num_threads()
    width = tokenizer_width(Tokenizer.from_file(str(gguf_export / "tokenizer.json")))
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            for _ in range(n):
                # over the tokenizer's ids only: the head (512) is wider than the vocabulary, and edgespec
                # never emits an id the tokenizer does not have (issue 18)
                t = int(hf_model(torch.tensor([seq])).logits[0, -1, :width].argmax())
                if t in stop:
                    break
                ref.append(t)
                seq.append(t)
    finally:
        torch.set_num_threads(threads)
    assert len(ref) >= 8  # not a stop token straight away: a real comparison
    dec = SpecDecoder.load(gguf_export)
    assert dec.encode("def add(a, b):") == ids
    g = dec.generate(input_ids=ids, max_new_tokens=n, proposers=()).run()
    assert g.token_ids == ref
    dec.reset()
    spec = dec.generate(input_ids=ids, max_new_tokens=n, k=3).run()  # the draft is the same graph
    assert spec.token_ids == ref
    assert spec.stats.accepted == spec.stats.proposed


@pytest.mark.parametrize("fraction", [0.5, 0.02])
def test_truncated_gguf_is_an_edgespec_error(home, gguf_file, tmp_path, fraction):
    from edgespec.errors import EdgespecError
    from edgespec.export import ExportOptions, export_pair

    data = gguf_file[0].read_bytes()
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(data[:int(len(data) * fraction)])
    fp32 = ExportOptions(precision="fp32")
    with pytest.raises(EdgespecError):
        export_pair(str(bad), str(bad), tmp_path / "out", fp32, fp32)
    assert not (tmp_path / "out" / "edgespec.json").exists()


@pytest.mark.parametrize("content", [b"not a gguf file at all\n" * 100, b"", b"GGU"])
def test_non_gguf_file_is_an_edgespec_error(home, gguf_file, tmp_path, content):
    from edgespec.errors import EdgespecError
    from edgespec.export import ExportOptions, export_pair

    bad = tmp_path / "model.gguf"
    bad.write_bytes(content)
    fp32 = ExportOptions(precision="fp32")
    with pytest.raises(EdgespecError):
        export_pair(str(bad), str(gguf_file[0]), tmp_path / "out", fp32, fp32)
    with pytest.raises(EdgespecError):
        export_pair(str(gguf_file[0]), str(bad), tmp_path / "out", fp32, fp32)


def test_gguf_without_token_types(home, hf_dir, tmp_path):
    """``tokenizer.ggml.token_type`` is optional: no repair to do, but no KeyError either."""
    from tokenizers import Tokenizer

    from edgespec.export.load import describe
    from edgespec.export.sources import resolve_model

    path = tmp_path / "no-types.gguf"
    vocab = write_gguf(hf_dir, path, token_types=False)
    info = describe(resolve_model(str(path)), "target")
    assert info.eos == vocab["<|im_end|>"] and info.eos in info.stop
    tok = Tokenizer.from_str(info.tokenizer.backend_tokenizer.to_str())
    assert tok.encode("<|im_start|>", add_special_tokens=False).ids == [vocab["<|im_start|>"]]


@pytest.mark.parametrize("add_bos", [True, False, None])
def test_raw_prompt_gets_bos_when_the_header_says_so(home, hf_dir, tmp_path, add_bos):
    """A byte-level BPE GGUF whose ``tokenizer.ggml.add_bos_token`` is true (Llama 3's) puts ``<bos>`` in front
    of a raw prompt, as llama.cpp does; false or absent (Qwen's) puts nothing; chat messages get it from the
    template alone."""
    from tokenizers import Tokenizer

    from edgespec.export.load import describe
    from edgespec.export.sources import resolve_model
    from edgespec.io.encoding import PromptEncoder
    from edgespec.io.text import ChatTemplate

    path = tmp_path / "bos.gguf"
    vocab = write_gguf(hf_dir, path, add_bos=add_bos)
    info = describe(resolve_model(str(path)), "target")
    tok = Tokenizer.from_str(info.tokenizer.backend_tokenizer.to_str())
    enc = PromptEncoder(tok, ChatTemplate(CHATML))
    text = tok.encode("def f(x):\n    return x", add_special_tokens=False).ids
    bos = [vocab["<|endoftext|>"]] if add_bos else []
    assert enc.encode(prompt="def f(x):\n    return x") == bos + text
    chat = enc.encode(messages=[{"role": "user", "content": "hi"}])
    assert chat[0] == vocab["<|im_start|>"] and vocab["<|endoftext|>"] not in chat
    assert tok.decode(bos + text, skip_special_tokens=True) == "def f(x):\n    return x"
