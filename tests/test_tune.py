"""Weight layouts: the ``--layout`` spelling, graphs written in it (zero points, per-tensor bits and blocks), the
manifest and ``edgespec info`` saying which layout an export has and why, and ``edgespec export --tune`` choosing
one."""

import json

import onnx
import pytest
from onnx import helper

from edgespec.errors import EdgespecError
from edgespec.io.manifest import load_manifest


@pytest.mark.parametrize("spec", ["b32", "b128z", "b64+down_proj=8", "b256z+layers.0.=8+down_proj=32+lm_head=8",
                                  "b16+lm_head=4", "b256+down_proj=b32", "b128z+gguf6=8+lm_head=8+gguf6=b64"])
def test_a_layout_spelling_reads_back_as_itself(spec):
    from edgespec.export.build import ExportOptions, parse_layout

    assert ExportOptions(**parse_layout(spec)).layout == spec


@pytest.mark.parametrize("spec", ["", "b48", "128", "b128x", "b128+down_proj", "b128+down_proj=6",
                                  "b128+down proj=8", "b64+down_proj=8+down_proj=4", "b512", "b128+down_proj=b48",
                                  "b128+down_proj=b32+down_proj=b64", "b128+down_proj=bb32"])
def test_a_bad_layout_is_one_line_naming_the_syntax(spec):
    from edgespec.export.build import parse_layout

    with pytest.raises(EdgespecError) as e:
        parse_layout(spec)
    assert "\n" not in str(e.value) and "b128z+down_proj=8+lm_head=8" in str(e.value)


def test_the_output_head_named_outright_wins_over_gguf6_in_either_order():
    from types import SimpleNamespace

    from edgespec.export.build import parse_layout, resolve_bits

    names = ["lm_head.weight", "model.layers.0.mlp.down_proj.weight", "model.layers.0.mlp.up_proj.weight"]
    src = SimpleNamespace(names=lambda: names, config=SimpleNamespace(tie_word_embeddings=False),
                          bits_per_weight=lambda n: 4.5 if "up_proj" in n else 6.5625)
    for spec in ("b64+gguf6=b32+lm_head=b256", "b64+lm_head=b256+gguf6=b32"):
        blocks = resolve_bits(parse_layout(spec)["tensor_blocks"], src)
        assert blocks == {"lm_head": 256, "layers.0.mlp.down_proj": 32}, spec


def test_the_default_layout_keeps_its_graph_cache_key():
    """Graphs cached before zero points and per-tensor bits existed are still found; each layout has its own key;
    ``chosen_by`` (the manifest's note) does not change the graph."""
    import hashlib
    from dataclasses import asdict

    from edgespec.export.build import GRAPH_REVISIONS, ExportOptions, _cache_key, parse_layout
    from edgespec.export.sources import Source

    src = Source(ref="x", kind="hf", path=None, sha256="ab" * 32)
    o = {k: v for k, v in asdict(ExportOptions(graph_format=3)).items()
         if k not in ("vocab_size", "prefill_int8", "kv_int8", "graph_format", "zero_points", "tensor_bits",
                      "tensor_blocks", "chosen_by")}
    old = hashlib.sha256(json.dumps({"sha": src.sha256, "opts": o, "graph": 3, "revision": GRAPH_REVISIONS[3]},
                                    sort_keys=True).encode()).hexdigest()[:24]
    assert _cache_key(src, ExportOptions(graph_format=3)) == old
    assert _cache_key(src, ExportOptions(graph_format=3, chosen_by="tuned")) == old
    keys = {_cache_key(src, ExportOptions(graph_format=3, **parse_layout(s)))
            for s in ("b32", "b32z", "b32+down_proj=8", "b32+down_proj=4", "b32+lm_head=8", "b32+down_proj=b64")}
    assert len(keys) == 6


def _nbits_nodes(graph_dir):
    m = onnx.load(str(graph_dir / "model.onnx"), load_external_data=False)
    return {n.name: ({a.name: helper.get_attribute_value(a) for a in n.attribute}, list(n.input))
            for n in m.graph.node if n.op_type == "MatMulNBits"}


def test_a_layout_is_written_recorded_and_shown(home, tiny_dirs, tmp_path, capsys):
    from edgespec.apps.cli import main

    out = tmp_path / "mixed"
    code = main(["export", "--target", str(tiny_dirs["target"]), "--draft", str(tiny_dirs["draft"]),
                 "--out", str(out), "--layout", "b16z+down_proj=8+lm_head=8", "--draft-layout", "b64"])
    assert code == 0, capsys.readouterr().err
    m = load_manifest(out)
    q, dq = m.target.quantization, m.draft.quantization
    assert (q.block_size, q.zero_points, q.tensor_bits, q.lm_head_bits) == (16, True, {"down_proj": 8}, 8)
    assert q.chosen_by == "given (b16z+down_proj=8+lm_head=8)"
    assert (dq.block_size, dq.zero_points, dq.tensor_bits, dq.lm_head_bits) == (64, False, {}, 4)
    nodes = _nbits_nodes(out / "target")
    for name, (attrs, ins) in nodes.items():
        want = 8 if ("down_proj" in name or name.startswith("lm_head")) else 4
        assert attrs["bits"] == want and attrs["block_size"] == 16 and len(ins) == 4, name  # 4: zero points
    assert any("down_proj" in n for n in nodes) and any(n.startswith("lm_head") for n in nodes)
    assert all(len(ins) == 3 and a["block_size"] == 64 for a, ins in _nbits_nodes(out / "draft").values())
    assert 0.5 <= m.target.validation["reference"]["greedy_agreement"] <= 1
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "block 16, zero points, accuracy level 4), down_proj 8 bits, lm_head 8 bits" in text
    assert "layout: given (b16z+down_proj=8+lm_head=8)" in text


def test_per_tensor_blocks_are_written_recorded_shown_and_carry_a_prefill_graph(home, tiny_dirs, tmp_path, capsys):
    """``+fragment=b<block>`` gives the matmuls it names their own block size (bits as the rest say); a prefill
    graph is made from those blocks too."""
    from edgespec.apps.cli import main

    out = tmp_path / "blocks"
    code = main(["export", "--target", str(tiny_dirs["target"]), "--draft", str(tiny_dirs["draft"]),
                 "--out", str(out), "--layout", "b64z+down_proj=8+down_proj=b16+qkv_proj=b32", "--profile", "full"])
    assert code == 0, capsys.readouterr().err
    m = load_manifest(out)
    q = m.target.quantization
    assert (q.block_size, q.zero_points, q.tensor_bits, q.tensor_blocks) == (
        64, True, {"down_proj": 8}, {"down_proj": 16, "qkv_proj": 32})
    nodes = _nbits_nodes(out / "target")
    for name, (attrs, ins) in nodes.items():
        want = 16 if "down_proj" in name else 32 if "qkv_proj" in name else 64
        assert (attrs["block_size"], attrs["bits"], len(ins)) == (want, 8 if "down_proj" in name else 4, 4), name
    assert {a["block_size"] for a, _ in nodes.values()} == {16, 32, 64}
    assert m.target.prefill_path and m.target.kv_cache == "int8"  # zero points: a prefill graph all the same
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    assert "down_proj 8 bits, down_proj block 16, qkv_proj block 32, lm_head" in capsys.readouterr().out


def test_the_default_layout_says_so(tiny_export, capsys):
    from edgespec.apps.cli import main

    assert load_manifest(tiny_export).target.quantization.chosen_by == "the default layout"
    assert main(["info", str(tiny_export)]) == 0
    assert "layout: the default layout" in capsys.readouterr().out


@pytest.mark.parametrize("args,said", [
    (["--tune", "--layout", "b64"], "--tune chooses the layout itself"),
    (["--tune", "--block-size", "64"], "--tune chooses the layout itself"),
    (["--layout", "b64", "--lm-head-bits", "8"], "--layout already gives"),
    (["--layout", "b64q"], "not a weight layout"),
    (["--draft-layout", "b64+x=3"], "not a weight layout"),
    (["--tune-min-agreement", "0.9"], "--tune-min-agreement needs --tune"),
    (["--tune", "--tune-min-agreement", "1.5"], "--tune-min-agreement needs --tune and a value"),
    (["--tune", "--precision", "int8"], "--tune chooses among int4 layouts"),
    (["--layout", "b32z", "--precision", "fp32"], "not fp32"),
    (["--layout", "b32z", "--graph-format", "2"], "streamed exporter only"),
    (["--voice", "--tune"], "--tune applies to a pair export"),
    (["--layout", "b64z+gguf6=8"], "is not a GGUF file"),
    (["--layout", "b256+gguf6=b32"], "is not a GGUF file"),
    (["--layout", "b64+down_proj=b32", "--graph-format", "2"], "streamed exporter only"),
    (["--layout", "b32+layers.=8", "--profile", "full"], "no 4-bit layer matmul for an int8 prefill graph"),
])
def test_the_cli_refuses_a_layout_it_cannot_honour_in_one_line(home, tiny_dirs, tmp_path, capsys, args, said):
    from edgespec.apps.cli import main

    code = main(["export", "--target", str(tiny_dirs["target"]), "--draft", str(tiny_dirs["draft"]),
                 "--out", str(tmp_path / "out")] + args)
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "error" in line]
    assert code == 2 and len(err) == 1 and said in err[0], err
    assert not (tmp_path / "out").exists()


def test_kernel_timing_runs_every_layout_at_the_model_shapes():
    from edgespec.export.build import ExportOptions, parse_layout
    from edgespec.export.model_config import ModelConfig
    from edgespec.export.tune import kernel_ms

    cfg = ModelConfig(architecture="qwen2", num_layers=12, hidden_size=256, intermediate_size=512, num_heads=4,
                      num_kv_heads=2, head_dim=64, vocab_size=1000)
    lays = {s: ExportOptions(**parse_layout(s)) for s in ("b32", "b128z+down_proj=8+lm_head=8", "b64+lm_head=32",
                                                   "b256+down_proj=b16")}
    ms, drift = kernel_ms(cfg, lays, (1, 3), rounds=3)
    assert set(ms) == set(lays) and all(set(v) == {1, 3} and min(v.values()) > 0 for v in ms.values())
    assert drift > 0


@pytest.mark.parametrize("layers,want", [(1, [0]), (4, [0, 1, 2, 3]), (8, list(range(8))),
                                         (28, [0, 4, 8, 12, 15, 19, 23, 27]), (30, [0, 4, 8, 12, 17, 21, 25, 29])])
def test_timed_layers_spread_over_the_depth(layers, want):
    from edgespec.export.tune import timed_layers

    assert timed_layers(layers) == want


def test_real_graph_steps_are_timed_through_the_runtime(tiny_export):
    from edgespec.export.tune import graph_step_ms

    m = load_manifest(tiny_export)
    ms = graph_step_ms({"t": tiny_export / "target", "d": tiny_export / "target"},
                       (m.target.num_layers, m.target.num_kv_heads, m.target.head_dim), (1, 3), past=16, repeats=1,
                       calls=2)
    assert set(ms) == {"t", "d"} and all(v[1] > 0 and v[3] > 0 for v in ms.values())


def _fake_timings(monkeypatch, fast: list[str]):
    """kernel_ms and graph_step_ms stand-ins: the layouts in ``fast`` take half the default's time, the others
    as long (real timings of a tiny model are noise)."""
    def kernel_ms(cfg, layouts, rows, rounds=None, src=None):
        return {c: {r: (5.0 if c in fast else 10.0) * r for r in rows} for c in layouts}, 1.0

    def graph_step_ms(graphs, kv_shape, rows):
        return {c: {r: (5.0 if c in fast else 10.0) * r for r in rows} for c in graphs}

    monkeypatch.setattr("edgespec.export.tune.kernel_ms", kernel_ms)
    monkeypatch.setattr("edgespec.export.tune.graph_step_ms", graph_step_ms)


def test_tune_under_the_full_profile_adds_the_prefill_graphs_to_the_chosen_layout(
        home, tiny_dirs, tmp_path, monkeypatch, capsys):
    """Under ``--profile full`` every layout is a candidate (a prefill graph is made from any int4 blocks), and
    the chosen layout's graph carries the prefill graph, the int8 cache and the tune report."""
    from edgespec.apps.cli import main

    _fake_timings(monkeypatch, ["b64", "b128z"])
    out = tmp_path / "tuned-full"
    assert main(["export", "--target", str(tiny_dirs["target"]), "--draft", str(tiny_dirs["draft"]), "--out",
                 str(out), "--tune", "--tune-min-agreement", "0.01", "--profile", "full"]) == 0, \
        capsys.readouterr().err
    m = load_manifest(out)
    for g in (m.target, m.draft):
        layouts = [c["layout"] for c in g.validation["tune"]["candidates"]]
        assert {"b64", "b128z"} <= set(layouts)
        assert g.quantization.block_size in (64, 128)
        assert g.prefill_path and g.kv_cache == "int8" and "kv_int8" in g.validation
    assert m.profile == "full"


def test_tune_keeps_the_fastest_layout_that_holds_the_accuracy_floor(home, tiny_dirs, tmp_path, monkeypatch,
                                                                     capsys):
    from edgespec.apps.cli import main

    _fake_timings(monkeypatch, ["b64", "b128z"])
    out = tmp_path / "tuned"
    assert main(["export", "--target", str(tiny_dirs["target"]), "--draft", str(tiny_dirs["draft"]),
                 "--out", str(out), "--tune", "--tune-min-agreement", "0.01", "--profile", "small"]) == 0, \
        capsys.readouterr().err
    m = load_manifest(out)
    t = m.target.validation["tune"]
    built = [c for c in t["candidates"] if "greedy_agreement" in c]
    assert not any("gguf6" in c["layout"] for c in t["candidates"])  # a model directory has no tensor types
    assert m.target.quantization.chosen_by.startswith("tuned on ") and t["date"] and t["cpu"]
    assert m.target.quantization.block_size in (64, 128)  # one of the two faster ones (same speed: either order)
    assert [c["layout"] for c in t["candidates"] if c.get("chosen")] == [built[-1]["layout"]]
    assert built[0]["layout"] == "b32" and built[-1]["accepted"] is True
    assert built[-1]["step_ms"][0] < built[0]["step_ms"][0]
    # the draft: by expected speculative decoding speed (acceptance against the chosen target, step time)
    dt = m.draft.validation["tune"]
    scored = {c["layout"]: c for c in dt["candidates"] if "tokens_per_s" in c}
    assert set(scored) == {"b32", "b64", "b128z"} and dt["k"] == 4 and dt["target_verify_ms"] == 50.0
    for c in scored.values():
        k, a = 4, c["acceptance"]
        tokens = (1 - a ** (k + 1)) / (1 - a) if a < 1 else k + 1
        assert 0 <= a <= 1 and c["tokens_per_s"] == pytest.approx(1e3 * tokens / (k * c["step_ms"][0] + 50), rel=1e-3)
    best = max(scored, key=lambda c: scored[c]["tokens_per_s"])
    assert [c for c in scored if scored[c].get("chosen")] == [best]
    assert m.draft.quantization.block_size == {"b32": 32, "b64": 64, "b128z": 128}[best]
    assert "expected speculative decoding at K=4" in m.draft.quantization.chosen_by
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "tuned on" in text and "(chosen)" in text


def test_tune_keeps_the_default_when_nothing_faster_is_as_accurate(home, tiny_dirs, tmp_path, monkeypatch):
    import edgespec.export.tune as tune
    from edgespec.export import export_pair

    _fake_timings(monkeypatch, ["b256z", "b128"])
    built, real = [], tune.build_graph

    def build(info, opts, role, cache=None):
        d, meta = real(info, opts, role, cache)
        built.append((role, opts.layout, d))
        if opts.layout != "b32":  # worse than the default on every measure
            ref = {**meta["validation"]["reference"], "greedy_agreement": 0.0, "kl_mean": 99.0}
            meta = {**meta, "validation": {**meta["validation"], "reference": ref}}
        return d, meta

    monkeypatch.setattr(tune, "build_graph", build)
    out = export_pair(str(tiny_dirs["target"]), str(tiny_dirs["draft"]), tmp_path / "kept", tune=True)
    q, t = load_manifest(out).target.quantization, load_manifest(out).target.validation["tune"]
    assert (q.block_size, q.zero_points, q.tensor_bits) == (32, False, {})
    assert "no layout both faster than b32 and as accurate (built and measured: b128, b256z)" in q.chosen_by
    assert [c["accepted"] for c in t["candidates"] if "accepted" in c] == [False, False]
    assert sorted(lay for role, lay, _ in built if role == "target") == ["b128", "b256z", "b32"]
    for role, lay, d in built:  # rejected target candidates leave the graph cache; the default stays
        if role == "target":
            assert d.exists() == (lay == "b32"), lay


def test_the_target_floor_includes_the_likelihood_of_held_text(home, tiny_dirs, tmp_path, monkeypatch):
    """A candidate at the default's agreement and KL is then judged by the NLL of held text, measured on the real
    graphs: both figures recorded and the verdict consistent with them (which side it falls on depends on the
    random model; tests/test_tune.py's bisection test forces each)."""
    import edgespec.export.tune as tune
    from edgespec.export import export_pair

    _fake_timings(monkeypatch, ["b128z"])
    real = tune.build_graph

    def build(info, opts, role, cache=None):
        d, meta = real(info, opts, role, cache)
        if role == "target" and opts.layout != "b32":  # as accurate as the default by agreement and KL
            ref = {**meta["validation"]["reference"], "greedy_agreement": 1.0, "kl_mean": 0.0}
            meta = {**meta, "validation": {**meta["validation"], "reference": ref}}
        return d, meta

    monkeypatch.setattr(tune, "build_graph", build)
    out = export_pair(str(tiny_dirs["target"]), str(tiny_dirs["draft"]), tmp_path / "t", tune=True)
    t = load_manifest(out).target.validation["tune"]
    rows = {c["layout"]: c for c in t["candidates"]}
    nll, floor = rows["b128z"]["nll"], t["floor"]["nll"]
    assert 0 < nll < 20 and 0 < floor < 20 and rows["b32"]["nll"] == floor
    assert rows["b128z"]["accepted"] is (nll <= floor)


def test_the_accuracy_search_bisects_the_faster_layouts(monkeypatch):
    """Fastest first, a faster layout taken to be no more accurate: 7 candidates cost 3 builds, the fastest
    one at the floor (agreement, KL, then the NLL of held text) wins, every one tried but the winner leaves the
    cache, and the winner's real step decides."""
    from types import SimpleNamespace

    import edgespec.export.tune as tune

    faster = [f"b{i}" for i in range(7)]  # fastest first; b0-b3 below the floor, b4-b6 at it (b3: by NLL only)
    built, dropped = [], []

    def build(info, opts, role, cache=None):
        built.append(opts.layout)
        ok = int(opts.layout[1:]) >= 3
        return opts.layout, {"validation": {"reference": {"greedy_agreement": 0.9 if ok else 0.5, "kl_mean": 0.1}}}

    def step(graphs, kv_shape, rows):
        return {c: {r: (5.0 if c == "b4" else 10.0) * r for r in rows} for c in graphs}

    monkeypatch.setattr(tune, "build_graph", build)
    monkeypatch.setattr(tune, "graph_step_ms", step)
    monkeypatch.setattr(tune, "_drop", dropped.append)
    monkeypatch.setattr(tune, "_held_nll", lambda info, d: {"b32-dir": 1.5, "b3": 1.6}.get(d, 1.4))
    opts = {c: SimpleNamespace(layout=c) for c in ["b32", *faster]}
    rows = {c: {"layout": c, "ms": [1.0, 2.0]} for c in opts}
    default = opts["b32"]
    base = {"validation": {"reference": {"greedy_agreement": 0.9, "kl_mean": 0.1}}}

    info = SimpleNamespace(config=SimpleNamespace(kv_shape=(1, 1, 1)))
    chosen, g_dir, _, why = tune._pick_target(info, opts, default, ("b32-dir", base), faster, rows, {}, "target",
                                              None, verify_rows=5, max_builds=4, min_agreement=None, target=None)
    assert built == ["b3", "b5", "b4"] and chosen is opts["b4"] and g_dir == "b4"
    assert sorted(dropped) == ["b3", "b5"] and rows["b4"]["accepted"] and rows["b5"]["accepted"]
    assert not rows["b3"]["accepted"] and rows["b3"]["nll"] == 1.6 and rows["b32"]["nll"] == 1.5
    assert "decode step 5.0 ms" in why and "NLL of held text 1.4000 (floor 1.5000)" in why
    # at the floor but no faster in the real graph: the default stays, the candidate leaves the cache
    monkeypatch.setattr(tune, "graph_step_ms", lambda graphs, kv, r: {c: {x: 10.0 for x in r} for c in graphs})
    built.clear(), dropped.clear()
    chosen, g_dir, _, why = tune._pick_target(info, opts, default, ("b32-dir", base), faster, rows, {}, "target",
                                              None, verify_rows=5, max_builds=4, min_agreement=None, target=None)
    assert chosen is default and g_dir == "b32-dir" and "b4" in dropped and "was not faster" in why
