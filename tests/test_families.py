"""Every family the exporter writes, from a Hugging Face safetensors directory and from a GGUF file, through the
streaming exporter (no torch on its path): the fp32 graph equals transformers' forward, with and without a KV
cache, after a rollback and under a tree mask; int4 graphs agree with their source; the exporter's main path
imports no torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tinyfamilies import FAMILIES, build_hf, write_gguf

ROOT = Path(__file__).resolve().parent.parent
TOL = 1e-4  # relative to the logits' scale


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    # Phi-4-mini-like: 3/4 of a 64-value head rotated (GroupQueryAttention's rotary table: a multiple of 8 wide)
    wide = {"phi3-longrope": {"hidden": 256}}
    return {f: build_hf(root / f, f, seed=3, **wide.get(f, {})) for f in FAMILIES}


@pytest.fixture(scope="module")
def torch_logits(family_dirs):
    """transformers' fp32 logits (T, V) of each family over one prompt (longer than Gemma's window)."""
    import torch
    from transformers import AutoModelForCausalLM

    out = {}
    for f, d in family_dirs.items():
        m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
        ids = _ids(m.config.vocab_size)
        with torch.no_grad():
            out[f] = m(torch.from_numpy(ids)[None]).logits[0].numpy()
    return out


def _ids(vocab: int, n: int = 24) -> np.ndarray:
    return np.random.default_rng(7).integers(3, min(vocab, 400), n).astype(np.int64)


def _graph(src, tmp: Path, precision: str = "fp32", block: int = 16):
    """Write ``src``'s format-3 graph with the family writers; return an OnnxLM over it."""
    import onnx

    from edgespec.export.families import family_for
    from edgespec.export.families.base import Layout, build
    from edgespec.export.gqa_graph import GraphBuilder
    from edgespec.export.validate import _lm, session

    tmp.mkdir(parents=True, exist_ok=True)
    g = GraphBuilder(tmp / "model.onnx.data")
    layout = Layout(precision=precision, block_size=block, embedding_bits=None if precision == "fp32" else 8)
    try:
        proto = build(family_for(src.config.architecture)(src, layout, g))
    finally:
        g.close()
    onnx.save_model(proto, str(tmp / "model.onnx"))
    layers, kv, hd = src.config.kv_shape
    return _lm(session(tmp / "model.onnx"), layers, kv, hd, 256)


@pytest.mark.parametrize("family", FAMILIES)
def test_fp32_graph_equals_transformers_with_and_without_past(family, family_dirs, torch_logits, tmp_path):
    from edgespec.export.weights.safetensors import SafetensorsSource

    ref = torch_logits[family]
    scale = np.abs(ref).max()
    lm = _graph(SafetensorsSource(family_dirs[family]), tmp_path)
    ids = _ids(lm.spec.vocab_size if lm.spec.vocab_size > 1 else 512)[: len(ref)]
    full = lm.forward(ids, lm.new_cache())
    assert np.abs(full - ref).max() <= TOL * scale, family
    cache = lm.new_cache(capacity=8)  # grows while it runs
    steps = np.concatenate([lm.forward(ids[:10], cache), lm.forward(ids[10:13], cache)])
    cache.crop(11)  # a verify of 3 rows of which one is accepted: rollback
    steps = np.concatenate([steps[:11], lm.forward(ids[11:], cache)])
    assert np.abs(steps - ref).max() <= TOL * scale, family


@pytest.mark.parametrize("family", FAMILIES)
def test_gguf_source_gives_the_same_graph(family, family_dirs, torch_logits, tmp_path):
    """The GGUF written as llama.cpp's converter writes it (permuted Llama q/k, Gemma's 1 + w norms, fused Phi-3
    tensors, rope factors) reads back to the same model."""
    from edgespec.export.weights.gguf import GGUFSource

    gguf = write_gguf(family_dirs[family], tmp_path / f"{family}.gguf")
    ref = torch_logits[family]
    lm = _graph(GGUFSource(gguf), tmp_path / "g")
    got = lm.forward(_ids(512)[: len(ref)], lm.new_cache())
    assert np.abs(got - ref).max() <= TOL * np.abs(ref).max(), family


@pytest.mark.parametrize("family", ["qwen3", "gemma3", "phi3-longrope"])
def test_tree_verify_equals_each_branch_alone(family, family_dirs, tmp_path):
    """A tree of two branches verified in one call (a tree mask) gives each branch's logits as a chain would."""
    from edgespec.export.weights.safetensors import SafetensorsSource

    lm = _graph(SafetensorsSource(family_dirs[family]), tmp_path)
    ids = _ids(512, 12)
    a, b = [int(ids[8]), int(ids[9])], [int(ids[10]), int(ids[11])]
    chains = []
    for branch in (a, b):
        c = lm.new_cache()
        lm.forward(ids[:8], c)
        chains.append(lm.forward(np.array(branch), c))
    c = lm.new_cache()
    lm.forward(ids[:8], c)
    mask = np.ones((1, 1, 4, 12), dtype=bool)  # the prefix, then a0 → a1 and b0 → b1 side by side
    mask[0, 0, :, 8:] = [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]
    tree = lm.forward(np.array(a + b), c, position_ids=np.array([8, 9, 8, 9]), mask=mask)
    np.testing.assert_allclose(tree[:2], chains[0], atol=1e-4 * np.abs(chains[0]).max())
    np.testing.assert_allclose(tree[2:], chains[1], atol=1e-4 * np.abs(chains[1]).max())


@pytest.mark.parametrize("family", ["qwen3", "gemma3", "phi3"])
def test_int4_export_of_each_family_agrees_with_its_source(family, family_dirs, home, tmp_path):
    from edgespec.export import ExportOptions, export_pair
    from edgespec.io.manifest import load_manifest

    d = str(family_dirs[family])
    out = export_pair(d, d, tmp_path / "pair", ExportOptions("int4", block_size=16),
                      ExportOptions("int4", block_size=16))
    m = load_manifest(out)
    assert m.target.graph_format == 3 and m.target.architecture == json.loads(
        (family_dirs[family] / "config.json").read_text())["model_type"]
    r = m.target.validation["reference"]
    assert r["positions"] == 256 and 0.5 <= r["greedy_agreement"] <= 1 and 0 <= r["kl_mean"] < 0.5


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "phi3-longrope"])  # its 32-token context < 256
def test_the_full_profile_of_each_family_prefills_on_its_int8_graph_and_decodes_losslessly(family, family_dirs, home,
                                                                                          tmp_path):
    """``--profile full`` (the default on a machine with 7 GiB or more): each family's int8 prefill graph and int8
    KV cache are written, validated, and decode speculatively as plainly (a prompt long enough for the prefill
    graph, past Gemma's sliding window)."""
    from edgespec import SpecDecoder
    from edgespec.bench.evaluate import greedy_check
    from edgespec.export import ExportOptions, export_pair
    from edgespec.io.manifest import load_manifest

    d = str(family_dirs[family])
    o = ExportOptions("int4", block_size=16)
    out = export_pair(d, d, tmp_path / "pair", o, o, profile="full")
    m = load_manifest(out)
    assert m.profile == "full" and m.target.prefill_path and m.target.kv_cache == "int8"
    assert m.target.validation["kv_int8"]["greedy_agreement"] >= 0.9
    dec = SpecDecoder.load(out)
    assert dec.target.prefill_session is not None
    ids = [int(i) for i in _ids(m.target.vocab_size, 80)]
    r = greedy_check(dec, ids, max_new_tokens=24, k=3)
    assert r["ok"], r["problem"]


def test_the_exporters_main_path_imports_no_torch(family_dirs, tmp_path):
    """A whole export from a safetensors directory with torch and transformers made unimportable."""
    code = f"""
import sys
for name in ("torch", "transformers", "optimum", "accelerate"):
    sys.modules[name] = None  # any import of them raises ImportError
from edgespec.export import ExportOptions, export_pair
d = {str(family_dirs["qwen3"])!r}
export_pair(d, d, {str(tmp_path / "pair")!r}, ExportOptions("int4", block_size=16), ExportOptions("int4", block_size=16))
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                       env={**__import__("os").environ, "EDGESPEC_HOME": str(tmp_path / "home")})
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]


def test_unsupported_architecture_is_refused_from_the_gguf_header_before_hashing(tmp_path, monkeypatch):
    import gguf

    from edgespec.errors import EdgespecError
    from edgespec.export import sources

    path = tmp_path / "mamba.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    monkeypatch.setattr(sources, "sha256_file", lambda *a, **k: pytest.fail("hashed before the check"))
    with pytest.raises(EdgespecError, match="unsupported architecture 'mamba'"):
        sources.resolve_model(str(path))


def test_a_sliding_window_on_every_layer_as_transformers_applies_it(tmp_path):
    """Phi-3 (and Mistral) configs with a ``sliding_window`` shorter than the context: transformers windows every
    layer; so does the graph (by positions, also for rows past the window)."""
    import torch
    from transformers import AutoModelForCausalLM

    from edgespec.export.weights.safetensors import SafetensorsSource

    d = build_hf(tmp_path / "phi3w", "phi3", seed=4, overrides={"sliding_window": 6})
    src = SafetensorsSource(d)
    assert src.config.layer_types == ("sliding_attention",) * src.config.num_layers
    ids = _ids(512)
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        ref = m(torch.from_numpy(ids)[None]).logits[0].numpy()
    lm = _graph(src, tmp_path / "g")
    cache = lm.new_cache()
    got = np.concatenate([lm.forward(ids[:16], cache), lm.forward(ids[16:], cache)])
    assert np.abs(got - ref).max() <= TOL * np.abs(ref).max()


def test_a_block_larger_than_a_dimension_it_does_not_divide(family_dirs, tmp_path):
    """Block 256 on hidden 64: the quantizer pads each matmul's last block, the embedding takes the largest block
    that divides its width (a float32 table otherwise would cost 4× its int8 size)."""
    import onnx

    from edgespec.export.weights.safetensors import SafetensorsSource

    lm = _graph(SafetensorsSource(family_dirs["qwen2"]), tmp_path, precision="int4", block=256)
    g = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False).graph
    gbq = [n for n in g.node if n.op_type == "GatherBlockQuantized"]
    assert len(gbq) == 1 and {a.name: a.i for a in gbq[0].attribute}["block_size"] == 64
    assert {a.name: a.i for a in next(n for n in g.node if n.op_type == "MatMulNBits").attribute}["block_size"] == 256
    assert np.isfinite(lm.forward(_ids(512, 8), lm.new_cache())).all()


def test_bfloat16_safetensors_read_whole_and_by_rows(tmp_path):
    """bfloat16 (numpy has none) widened from the file's bytes, also a slice of rows alone."""
    import torch
    from safetensors.torch import save_file

    from edgespec.export.weights.safetensors import SafetensorsSource

    d = build_hf(tmp_path / "bf", "qwen2", seed=5)
    w = torch.randn(40, 24).to(torch.bfloat16)
    save_file({"extra.weight": w}, str(d / "extra.safetensors"))
    src = SafetensorsSource(d)
    whole = w.float().numpy()
    np.testing.assert_array_equal(src.get("extra.weight"), whole)
    np.testing.assert_array_equal(src.get_rows("extra.weight", slice(8, 100)), whole[8:])
    np.testing.assert_array_equal(src.get_rows("extra.weight", slice(0, 40, 3)), whole[::3])
    np.testing.assert_array_equal(src.get_rows("extra.weight", np.array([3, 1])), whole[[3, 1]])


def test_a_longrope_graph_holds_the_original_context_from_either_source(family_dirs, tmp_path):
    """Phi-4-mini-style configs write ``"type": "longrope"``: from safetensors and from GGUF the rotary table
    (short factors) covers the original context only, where the long factors would take over."""
    import onnx

    from edgespec.export.weights.gguf import GGUFSource
    from edgespec.export.weights.safetensors import SafetensorsSource
    from edgespec.io.onnx_model import ROTARY_POSITIONS

    d = family_dirs["phi3-longrope"]
    cfg = json.loads((d / "config.json").read_text())
    for name, src in (("st", SafetensorsSource(d)), ("gguf", GGUFSource(write_gguf(d, tmp_path / "p.gguf")))):
        assert src.config.rope_scaling["rope_type"] == "longrope"
        _graph(src, tmp_path / name)
        meta = {p.key: p.value for p in onnx.load(str(tmp_path / name / "model.onnx"), load_external_data=False)
                .metadata_props}
        assert int(meta[ROTARY_POSITIONS]) == cfg["original_max_position_embeddings"], name


def test_missing_tensors_and_unwritable_settings_are_one_line_errors(family_dirs, home, tmp_path):
    import shutil

    from safetensors.numpy import load_file, save_file

    from edgespec.errors import EdgespecError
    from edgespec.export import ExportOptions, export_pair
    from edgespec.export.build import _default_format
    from edgespec.export.load import describe
    from edgespec.export.sources import resolve_model

    d = tmp_path / "cut"
    shutil.copytree(family_dirs["qwen3"], d)
    f = next(d.glob("*.safetensors"))
    tensors = load_file(str(f))
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, str(f))
    with pytest.raises(EdgespecError, match="no tensor 'model.layers.1.mlp.down_proj.weight'"):
        export_pair(str(d), str(d), tmp_path / "out", ExportOptions("fp32"), ExportOptions("fp32"))
    assert not (tmp_path / "out").exists()
    y = tmp_path / "yarn"
    shutil.copytree(family_dirs["qwen2"], y)
    cfg = json.loads((y / "config.json").read_text())
    cfg["rope_scaling"] = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    (y / "config.json").write_text(json.dumps(cfg))
    fmt, why = _default_format([describe(resolve_model(str(y)), "target")])
    assert fmt == 2 and "yarn" in why  # the traced graph (through torch) takes what format 3 cannot write


@pytest.mark.parametrize("family", FAMILIES)
def test_gguf6_keeps_the_tensors_the_file_stores_at_six_bits_or_more(family, family_dirs, tmp_path):
    """``+gguf6=8`` names the matmuls holding a weight the GGUF stores at 6 bits or more: from an F32 file every
    matmul the family writes (its names are the writers' own), from a Q4_0 file with Q8_0 down projections and
    layer-0 attention those alone; the graph written with them has exactly those MatMulNBits at 8 bits."""
    from onnx import helper

    from edgespec.export.build import resolve_bits
    from edgespec.export.families import family_for
    from edgespec.export.families.base import Layout, build
    from edgespec.export.gqa_graph import GraphBuilder
    from edgespec.export.weights.gguf import GGUFSource

    def nbits(src, bits):
        g = GraphBuilder(tmp_path / "model.onnx.data")
        try:
            proto = build(family_for(src.config.architecture)(src, Layout(block_size=32, bits=bits), g))
        finally:
            g.close()
        return {n.name.split("/")[0]: {a.name: helper.get_attribute_value(a) for a in n.attribute}["bits"]
                for n in proto.graph.node if n.op_type == "MatMulNBits"}

    d = family_dirs[family]
    every = resolve_bits((("gguf6", 8),), GGUFSource(write_gguf(d, tmp_path / "f32.gguf")))
    assert set(every) == set(nbits(GGUFSource(write_gguf(d, tmp_path / "q4.gguf", "Q4_0")), {}))
    mixed = GGUFSource(write_gguf(d, tmp_path / "mixed.gguf", "Q4_0", types={"ffn_down": "Q8_0", "blk.0.attn_": "Q8_0"}))
    layers = mixed.config.num_layers
    want = {f"layers.{i}.mlp.down_proj" for i in range(layers)} | {"layers.0.attn.qkv_proj", "layers.0.attn.o_proj"}
    got = resolve_bits((("down_proj", 4), ("gguf6", 8)), mixed)  # an earlier fragment wins
    assert got == {"down_proj": 4, **{m: 8 for m in want}}
    written = nbits(mixed, resolve_bits((("gguf6", 8),), mixed))
    assert {m for m, b in written.items() if b == 8} == want and set(written.values()) == {4, 8}


def test_gguf6_export_records_the_head_bits_it_wrote(family_dirs, home, tmp_path):
    """An export at ``b32+gguf6=8`` from an F32 GGUF: every matmul at 8 bits, and the manifest says so for the head
    (its ``lm_head_bits`` is what the layout resolved to, not the graph's 4), the layout as spelled."""
    from edgespec.export import ExportOptions, export_pair
    from edgespec.export.build import parse_layout
    from edgespec.io.manifest import load_manifest

    gguf = str(write_gguf(family_dirs["qwen2"], tmp_path / "f32.gguf"))
    opts = ExportOptions(**parse_layout("b32+gguf6=8"))
    m = load_manifest(export_pair(gguf, gguf, tmp_path / "pair", opts, opts))
    q = m.target.quantization
    assert (q.lm_head_bits, q.tensor_bits, q.block_size) == (8, {"gguf6": 8}, 32)


@pytest.mark.parametrize("qtype,offered", [("Q8_0", True), ("Q4_0", False)])
def test_tune_offers_gguf6_layouts_only_where_they_change_something(qtype, offered, family_dirs, tmp_path,
                                                                     monkeypatch):
    """From a GGUF with tensors at 6 bits or more the candidates include the gguf6 layouts, resolved against it
    when timed; from one without, gguf6 would equal the plain layout and is not offered."""
    import edgespec.export.tune as tune
    from edgespec.export.build import ExportOptions
    from edgespec.export.load import describe
    from edgespec.export.sources import resolve_model

    class Stop(Exception):
        pass

    seen = {}

    def kernel_ms(cfg, layouts, rows, rounds=None, src=None):
        seen.update(layouts=set(layouts), src=src)
        raise Stop

    monkeypatch.setattr(tune, "kernel_ms", kernel_ms)
    info = describe(resolve_model(str(write_gguf(family_dirs["qwen2"], tmp_path / f"{qtype}.gguf", qtype))), "target")
    with pytest.raises(Stop):
        tune.tune(info, ExportOptions(), "target")
    assert any("gguf6" in c for c in seen["layouts"]) is offered and hasattr(seen["src"], "bits_per_weight")
