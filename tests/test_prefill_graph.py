"""The int8 prefill graph (``edgespec export --prefill-int8``, export/prefill_graph.py): written beside the int4
graph, validated where it enters, run for prompt chunks of ≥ PREFILL_GRAPH_ROWS rows only, on the same cache."""

import shutil
from dataclasses import replace

import numpy as np
import onnx
import pytest

from edgespec import SpecDecoder
from edgespec.bench.evaluate import greedy_check
from edgespec.errors import EdgespecError
from edgespec.io import onnx_model as om
from edgespec.io.manifest import load_manifest

IDS = [int(i) for i in np.random.default_rng(1).integers(3, 400, 200)]


@pytest.fixture(scope="module", params=[2, 3, 4], ids=["format2", "format3", "format4"])
def export(request, home, tiny_dirs, tmp_path_factory):
    from edgespec.export import ExportOptions, export_pair

    t = ExportOptions(precision="int4", graph_format=request.param, prefill_int8=True)
    d = ExportOptions(precision="int4", graph_format=request.param)
    out = tmp_path_factory.mktemp("prefill") / f"f{request.param}"
    return export_pair(str(tiny_dirs["target"]), str(tiny_dirs["draft"]), out, t, d)


class Counting:
    """Counts a session's runs (either run method), delegating everything else."""

    def __init__(self, session):
        self.session, self.runs = session, 0

    def run(self, *a, **k):
        self.runs += 1
        return self.session.run(*a, **k)

    def run_with_iobinding(self, *a, **k):
        self.runs += 1
        return self.session.run_with_iobinding(*a, **k)

    def __getattr__(self, name):
        return getattr(self.session, name)


def test_the_export_writes_an_int8_prefill_graph_that_shares_the_int4_data(export):
    m = load_manifest(export)
    assert m.target.prefill_path == "target/prefill.onnx" and m.draft.prefill_path is None
    assert {"target/prefill.onnx", "target/prefill.onnx.data"} <= set(m.files)
    v = m.target.validation["prefill_int8"]
    assert v["vs_graph"]["positions"] == 256 and 0 <= v["vs_fp32"]["greedy_agreement"] <= 1
    g = onnx.load(str(export / m.target.prefill_path), load_external_data=False).graph
    ops = {}
    for n in g.node:
        ops.setdefault(n.op_type, []).append(n)
    kept = ops["MatMulNBits"]  # down_proj and the head: by node name (format 2 names weights onnx::MatMul_N)
    assert ops["DynamicQuantizeMatMul"] and len(kept) == m.target.num_layers + 1
    assert all("down_proj" in n.name or "logits" in n.output for n in kept)
    assert not any("down_proj" in n.name + n.output[0] for n in ops["DynamicQuantizeMatMul"])
    where = {t.name: {e.key: e.value for e in t.external_data}.get("location") for t in g.initializer}
    assert "model.onnx.data" in where.values()  # what both graphs use is read from the int4 graph's file
    assert all(where[n.input[1]] == "prefill.onnx.data" for n in ops["DynamicQuantizeMatMul"])


def test_the_int8_weights_are_the_int4_values_within_half_a_step(export):
    from edgespec.export.prefill_graph import _array, dequantize_nbits

    m = load_manifest(export)
    gdir = export / "target"
    int4 = onnx.load(str(gdir / "model.onnx"), load_external_data=False).graph
    int8 = onnx.load(str(gdir / "prefill.onnx"), load_external_data=False).graph
    i4, i8 = {t.name: t for t in int4.initializer}, {t.name: t for t in int8.initializer}
    checked, layer_matmuls = 0, [n for n in int4.node if n.op_type == "MatMulNBits" and "logits" not in n.output
                                  and "down_proj" not in n.name]
    for node in int4.node:
        if node.op_type == "MatMulNBits" and node.input[1] + "_i8" in i8:
            w = dequantize_nbits(node, i4, gdir)
            q = _array(i8[node.input[1] + "_i8"], gdir).astype(np.float32)
            s = _array(i8[node.input[1] + "_i8_scale"], gdir)
            assert np.abs(q * s[None] - w.T).max() <= s.max() / 2 + 1e-7
            assert np.abs(q).max() == 63  # 7 bits: AVX2's saturating u8 × s8 pairs never overflow
            checked += 1
    assert checked == len(layer_matmuls) >= 3 * m.target.num_layers  # packed qkv, o, gate/up; down_proj stays int4


def test_long_prompt_chunks_run_on_the_prefill_graph_and_nothing_else_does(export):
    from edgespec.engine.decoder import forward_tokens

    m = load_manifest(export)
    lm = om.OnnxLM(m.target, export)
    assert lm.prefill_session is not None
    lm.session, lm.prefill_session = Counting(lm.session), Counting(lm.prefill_session)
    cache = lm.new_cache()
    forward_tokens(lm, IDS[:150], cache)  # one chunk of 150 rows
    assert (lm.prefill_session.runs, lm.session.runs) == (1, 0)
    assert om.PREFILL_GRAPH_ROWS > 40
    forward_tokens(lm, IDS[150:190], cache)  # too short for it
    lm.forward(IDS[-5:], cache)  # a verify
    lm.forward(IDS[-1:], cache)  # a step
    assert (lm.prefill_session.runs, lm.session.runs) == (1, 3) and cache.length == 150 + 40 + 6
    lm.forward(IDS[:100], lm.new_cache())  # a long run that is not a prefill: the int4 graph
    assert lm.prefill_session.runs == 1


def test_the_prefill_graph_continues_on_the_same_cache_close_to_int4(export):
    """Logits after an int8 prefill, and int4 steps after it, stay close to int4 throughout (the int8 graph
    quantizes the activations per tensor; the bound is loose enough for any CPU's QGEMM rounding)."""
    from edgespec.engine.decoder import forward_tokens

    m = load_manifest(export)
    lm = om.OnnxLM(m.target, export)
    ref = om.OnnxLM(m.target, export, memory=replace(om.DEFAULT_MEMORY, prefill_graph=False))
    assert ref.prefill_session is None
    a, b = ref.new_cache(), lm.new_cache()
    la, lb = forward_tokens(ref, IDS[:128], a), forward_tokens(lm, IDS[:128], b)
    steps_a = [ref.forward([t], a)[-1] for t in IDS[128:140]]
    steps_b = [lm.forward([t], b)[-1] for t in IDS[128:140]]
    x, y = np.array([la] + steps_a), np.array([lb] + steps_b)
    spread = x.max(1) - x.min(1)
    assert (np.abs(x - y).max(1) < 0.25 * spread).all()
    assert not np.array_equal(x[0], y[0])  # it did run a different graph


def test_plain_and_speculative_greedy_stay_identical_with_the_prefill_graph(export):
    dec = SpecDecoder.load(export)
    assert dec.target.prefill_session is not None
    r = greedy_check(dec, IDS[:140], 24, k=3, proposers=("draft",))
    assert r["ok"] and r["identical"], r["problem"]
    assert r["stats"].proposed > 0


def test_a_damaged_prefill_graph_is_caught_on_load(export, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(export, bad)
    data = bad / "target" / "prefill.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(EdgespecError, match="prefill.onnx.data"):
        SpecDecoder.load(bad)
    (bad / "target" / "prefill.onnx").unlink()
    with pytest.raises(EdgespecError, match="prefill.onnx is missing"):
        SpecDecoder.load(bad)


def test_a_prefill_graph_needs_int4_weights():
    from edgespec.export import ExportOptions

    with pytest.raises(EdgespecError, match="needs int4"):
        ExportOptions(precision="fp32", prefill_int8=True)


@pytest.mark.parametrize("command", ["generate", "chat", "complete", "serve"])
def test_the_cli_leaves_it_unloaded_on_request(export, monkeypatch, command):
    from edgespec.apps.cli import main

    seen = []

    def load(cls, d, **kw):
        seen.append(kw["memory"])
        raise EdgespecError("loaded")

    monkeypatch.setattr(SpecDecoder, "load", classmethod(load))
    monkeypatch.setattr("edgespec.apps.serve.listen", lambda host, port: None)  # no port taken
    extra = {"generate": ["--prompt", "x"], "complete": ["--prefix-text", "x"]}.get(command, [])
    for flag in (["--no-prefill-graph"], []):
        assert main([command, str(export)] + extra + flag) == 2  # the command loads, with the flag
    assert [m.prefill_graph for m in seen] == [False, True]


@pytest.fixture(scope="module")
def both_export(home, tiny_dirs, tmp_path_factory):
    """Format 3, the target's and the draft's prefill graphs (``--prefill-int8 --draft-prefill-int8``)."""
    from edgespec.export import ExportOptions, export_pair

    o = ExportOptions(precision="int4", graph_format=3, prefill_int8=True)
    return export_pair(str(tiny_dirs["target"]), str(tiny_dirs["draft"]), tmp_path_factory.mktemp("both") / "p",
                       o, o)


def test_the_drafts_prompt_catch_up_runs_on_its_prefill_graph(both_export):
    dec = SpecDecoder.load(both_export)
    assert dec.draft.prefill_session is not None
    dec.draft.prefill_session = Counting(dec.draft.prefill_session)
    dec.generate(input_ids=IDS[:150], max_new_tokens=4, proposers=("draft",), k=3, temperature=0).run()
    assert dec.draft.prefill_session.runs == 1  # its first proposal's feed: the 150-token prompt
    tokens = dec.tokens + IDS
    dec.draft_model.keep(100)
    dec.draft_model.catch_up(tokens, 60)  # a plain step's catch-up, too short
    dec.draft_model.catch_up(tokens, 64)
    assert dec.draft.prefill_session.runs == 2 and dec.dcache.length == 224


def test_the_calibration_prices_the_catch_up_on_the_prefill_graph_and_keys_it(both_export, home):
    """The cost model's draft catch-up per token is timed on the path a catch-up takes (the draft's prefill graph),
    and a load without the prefill graphs has a calibration of its own (its catch-up and prefill cost more)."""
    from edgespec.control.calibrate import calibrate, calibration_path
    from edgespec.io.onnx_model import SessionMemory

    dec = SpecDecoder.load(both_export)
    dec.draft.prefill_session = Counting(dec.draft.prefill_session)
    dec.target.prefill_session = Counting(dec.target.prefill_session)
    calibrate(dec, k_max=2, reps=1, use_cache=False)
    assert dec.draft.prefill_session.runs == 2  # a warm-up, then the timed 128-token feed
    assert dec.target.prefill_session.runs == 0  # the target's feed prices nothing beside a draft
    plain = SpecDecoder.load(both_export, memory=SessionMemory(prefill_graph=False))
    assert plain.draft.prefill_session is None
    keys = [calibration_path(d, 2).name for d in (dec, plain)]
    assert keys[0] != keys[1] and "-p8" in keys[0] and "-p8" not in keys[1]


def test_a_later_turn_prefills_alike_after_plain_and_speculative_decoding(both_export):
    """A speculative round that runs past a stop token commits tokens plain decoding never has; the next
    prompt must still reuse the same cached positions, or its rest goes to the int8 graph in one mode and to
    the int4 graph in the other (here: 64 rows after plain, 63 after speculative)."""
    dec = SpecDecoder.load(both_export)
    prompt, rest = IDS[:100], IDS[100:163]
    out = dec.generate(input_ids=prompt, max_new_tokens=14, temperature=0).run().token_ids
    run_round, longest = dec.run_round, []

    def recording(*a, **k):
        r = run_round(*a, **k)
        longest.append(len(dec.tokens))
        return r

    dec.run_round = recording
    past_stop = 0
    for j in range(2, 12):
        if out[j] in out[:j]:
            continue
        dec.stop_ids = frozenset({out[j]})
        seen = {}
        for proposers in ((), ("draft",)):
            dec.reset()
            longest.clear()
            g = dec.generate(input_ids=prompt, max_new_tokens=14, proposers=proposers, k=3, temperature=0).run()
            assert g.token_ids == out[:j]
            past_stop += max(longest, default=0) > len(prompt) + j + 1
            dec.target.prefill_session = Counting(dec.target.prefill_session)
            second = dec.generate(input_ids=prompt + out[:j + 1] + rest, max_new_tokens=3, proposers=proposers,
                                  temperature=0).run()
            seen[proposers] = (dec.target.prefill_session.runs, second.token_ids)
            dec.target.prefill_session = dec.target.prefill_session.session
        assert seen[()] == seen[("draft",)] and seen[()][0] == 1, j
    assert past_stop  # some speculative round did commit tokens past the stop


@pytest.mark.parametrize("where", ["draft/model.onnx", "target/model.onnx", "prefill.onnx"])
def test_a_prefill_path_must_name_another_graph_beside_the_graph(export, tmp_path, where):
    import json

    bad = tmp_path / "bad"
    shutil.copytree(export, bad)
    raw = json.loads((bad / "edgespec.json").read_text())
    raw["target"]["prefill_path"] = where  # the draft's graph has the tiny target's shapes: it would run
    (bad / "edgespec.json").write_text(json.dumps(raw))
    with pytest.raises(EdgespecError, match="target.prefill_path must name a graph beside target.path"):
        SpecDecoder.load(bad)


def test_a_cached_graph_without_its_prefill_graph_is_built_again(export, home, tmp_path):
    import json

    from edgespec.export.build import _cached_meta

    src = next(e for e in (home / "graphs").iterdir() if (e / "meta.json").is_file()
               and json.loads((e / "meta.json").read_text()).get("prefill_path"))
    assert _cached_meta(src) is not None
    for case in ("file", "entry"):
        entry = tmp_path / case
        shutil.copytree(src, entry)
        (entry / "prefill.onnx").unlink()
        if case == "entry":  # its meta no longer lists the prefill graph it names
            meta = json.loads((entry / "meta.json").read_text())
            del meta["files"]["prefill.onnx"], meta["files"]["prefill.onnx.data"]
            (entry / "meta.json").write_text(json.dumps(meta))
        assert _cached_meta(entry) is None, case


@pytest.mark.parametrize("args, said", [
    (["--voice", "--prefill-int8"], "--prefill-int8 applies to a pair export, not to --voice"),
    (["--voice", "--draft-prefill-int8"], "--draft-prefill-int8 applies to a pair export, not to --voice"),
    (["--precision", "int8", "--prefill-int8"], "needs int4 weights, not int8"),
    (["--precision", "fp32", "--draft-prefill-int8"], "needs int4 weights, not fp32"),
    (["--draft-precision", "int8", "--draft-prefill-int8"], "needs int4 weights, not int8"),
])
def test_the_cli_refuses_a_prefill_graph_it_cannot_build_in_one_line(tiny_dirs, tmp_path, capsys, args, said):
    from edgespec.apps.cli import main

    code = main(["export", "--target", str(tiny_dirs["target"]), "--draft", str(tiny_dirs["draft"]),
                 "--out", str(tmp_path / "out")] + args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and said in err[0], err
    assert not (tmp_path / "out").exists()


def test_the_graph_cache_key_tells_the_prefill_graphs_apart():
    from edgespec.export import ExportOptions
    from edgespec.export.build import _cache_key
    from edgespec.export.sources import Source

    src = Source(ref="x", kind="hf", path=None, sha256="ab" * 32)
    keys = {(f, p): _cache_key(src, ExportOptions(precision="int4", graph_format=f, prefill_int8=p))
            for f in (2, 3, 4) for p in (False, True)}
    assert len(set(keys.values())) == 6  # with and without it, per format


@pytest.mark.parametrize("block,zero_points,k", [(32, False, 96), (64, True, 160), (128, True, 200)])
def test_dequantized_blocks_are_what_onnxruntime_multiplies_by(tmp_path, block, zero_points, k):
    """The prefill graph's float weights of a ``MatMulNBits`` (symmetric or with zero points, K a multiple of
    the block or not) are the ones onnxruntime's own kernel uses: its output for the identity matrix."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from edgespec.export.families.base import Layout, linear
    from edgespec.export.gqa_graph import GraphBuilder
    from edgespec.export.prefill_graph import dequantize_nbits

    n = 48
    w = np.random.default_rng(block).standard_normal((n, k)).astype(np.float32)
    g = GraphBuilder(tmp_path / "m.onnx.data")
    y = linear(g, "x", w, "layers.0.mlp.up_proj", Layout(block_size=block, zero_points=zero_points,
                                                           accuracy_level=1))
    g.close()
    graph = helper.make_graph(g.nodes, "one", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, ["M", n])], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    onnx.save_model(model, str(tmp_path / "m.onnx"))
    node = model.graph.node[0]
    assert (len(node.input) == 4) == zero_points
    got = dequantize_nbits(node, {t.name: t for t in model.graph.initializer}, tmp_path)
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": np.eye(k, dtype=np.float32)})[0].T  # (N, K): accuracy level 1 is float32
    assert got.shape == (n, k)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert np.abs(got - w).max() < np.abs(w).max() / 4  # and they are the weights, coarsely
