"""Memory footprint (issue 17): giving back a loaded graph's clean file pages, and the memory settings."""

import mmap
import os
import sys
import time

import numpy as np
import pytest

import edgespec.io.onnx_model as om
from edgespec.io.manifest import load_manifest
from edgespec.io.pages import (MADV_PAGEOUT, ReleaseWhileLoading, anonymous_zeros, mapped_rss, release_file_pages,
                             trim_heap)

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and madvise: Linux only")


@pytest.fixture
def data_file(tmp_path):
    """A 64-page file of known bytes (as onnxruntime's external data: mapped private, read/write)."""
    f = tmp_path / "model.onnx.data"
    content = np.random.default_rng(0).integers(0, 256, 64 * mmap.PAGESIZE, dtype=np.uint8).tobytes()
    f.write_bytes(content)
    return f, content


@linux
def test_clean_mapped_pages_are_given_back_and_read_back_the_same(data_file):
    f, content = data_file
    with open(f, "rb") as fh:
        m = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)  # MAP_PRIVATE, like onnxruntime
    assert m[:] == content  # every page read: resident
    assert mapped_rss([f]) == len(content)
    assert release_file_pages([f]) == len(content)
    assert mapped_rss([f]) == 0
    assert m[:] == content  # faulted back in from the file, same bytes
    m.close()


@linux
def test_a_mapping_with_written_pages_is_left_alone(data_file, tmp_path):
    f, content = data_file
    with open(f, "rb") as fh:
        m = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    assert m[:] == content
    m[0:4] = b"edge"  # a private copy of one page: dropping it would lose the write
    assert release_file_pages([f]) == 0
    assert m[0:4] == b"edge" and m[4:] == content[4:]
    assert release_file_pages([tmp_path / "other"]) == 0  # a file that is not mapped (or missing)
    m.close()


def _pageout_works(f) -> bool:
    with open(f, "rb") as fh:
        m = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    m[:]
    ok = release_file_pages([f], MADV_PAGEOUT) > 0
    m.close()
    return ok


@linux
def test_pages_released_while_another_thread_reads_them_read_back_the_same(data_file):
    """The load-time release runs beside onnxruntime: pages it pages out fault back in with the file's bytes."""
    f, content = data_file
    if not _pageout_works(f):
        pytest.skip("this kernel refuses MADV_PAGEOUT (Linux < 5.4)")
    with open(f, "rb") as fh:
        m = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    deadline = time.monotonic() + 10
    with ReleaseWhileLoading([f], interval_s=0.001) as r:
        reads = 0
        while reads < 200 or (r.released == 0 and time.monotonic() < deadline):
            assert m[:] == content  # read every page, over and over, while the thread releases them
            reads += 1
    assert r.released > 0 and m[:] == content
    m.close()


@linux
def test_the_load_time_release_loses_nothing_at_a_reused_address(data_file, monkeypatch):
    """onnxruntime unmaps a weight's mapping after packing it and may map new memory at the same address before
    the release thread advises the range it read from smaps. That memory must keep its contents
    (MADV_PAGEOUT; MADV_DONTNEED would zero it)."""
    import ctypes

    import edgespec.io.pages as pages

    f, _ = data_file
    if not _pageout_works(f):
        pytest.skip("this kernel refuses MADV_PAGEOUT (Linux < 5.4)")
    fresh = mmap.mmap(-1, 16 * mmap.PAGESIZE, flags=mmap.MAP_PRIVATE)  # the new owner of the address
    fresh[:] = b"kept" * (4 * mmap.PAGESIZE)
    start = ctypes.addressof(ctypes.c_char.from_buffer(fresh))
    st = f.stat()
    stale = {"start": start, "end": start + len(fresh), "file": (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino),
             "Rss": len(fresh) // 1024, "Anonymous": 0}  # what smaps said before the address was reused
    monkeypatch.setattr(pages, "_mappings", lambda text: [dict(stale)])
    with ReleaseWhileLoading([f], interval_s=0.001) as r:
        while r.released == 0:
            pass
    assert fresh[:] == b"kept" * (4 * mmap.PAGESIZE)
    fresh.close()


@pytest.fixture(scope="module")
def int4_export(home, tiny_dirs, tmp_path_factory):
    """An int4 format-3 export of the tiny pair (its MatMulNBits scales stay mapped after loading)."""
    from edgespec.export import ExportOptions, export_pair

    o = ExportOptions(precision="int4", graph_format=3)
    return export_pair(str(tiny_dirs["target"]), str(tiny_dirs["draft"]),
                       tmp_path_factory.mktemp("exports") / "int4", o, o)


def _rss_mb() -> float:
    return [int(line.split()[1]) / 1024 for line in open("/proc/self/status") if line.startswith("VmRSS")][0]


@linux
def test_a_format3_cache_is_resident_as_its_rows_are_written():
    """The 1.5B target's cache shape (28 layers, 2 KV heads, head size 128, 4,096 positions: 224 MB). A new
    cache must not touch its pages, and writing rows must make only those rows resident: numpy.zeros buffers
    (4 MB each, which numpy gives huge pages) became wholly resident at a chat's first step: 224 + 96 MB."""
    churn = [np.ones((1, 2, 4096, 128), np.float32) for _ in range(60)]  # a heap that held such blocks
    del churn
    before = _rss_mb()
    cache = om.SharedKVCache(28, 2, 128, 4096, 32768)
    assert _rss_mb() - before < 20
    for buf in cache.buffers:
        buf[:, :, :64] = 1.0  # 64 positions: 56 buffers * 2 heads * 64 * 128 * 4 bytes = 3.5 MB
    cache.length = 64
    assert _rss_mb() - before < 20
    assert all(b.flags.c_contiguous and b.flags.writeable and b.shape == (1, 2, 4096, 128) for b in cache.buffers)
    assert all(float(b[:, :, 64:].max()) == 0.0 for b in cache.buffers)
    cache.reserve(5000)  # doubling copies the written rows into a new mapping
    assert cache.capacity == 8192 and all(float(b[:, :, :64].min()) == 1.0 for b in cache.buffers)
    assert _rss_mb() - before < 30
    del cache
    trim_heap()


def test_anonymous_zeros_are_separate_zeroed_arrays():
    a, b = anonymous_zeros(2, (3, 5), np.float32)
    a[:] = 7
    assert a.shape == b.shape == (3, 5) and a.dtype == np.float32 and float(b.sum()) == 0.0
    assert anonymous_zeros(2, (0, 4))[0].size == 0


@pytest.mark.parametrize("kind", ["fp32", "int4-f3"])
def test_release_pages_keeps_the_logits(kind, request, monkeypatch):
    """The same graph loaded with and without the page release computes bitwise the same logits."""
    d = request.getfixturevalue("int4_export" if kind == "int4-f3" else "tiny_export")
    m = load_manifest(d)
    ids = [int(i) for i in np.random.default_rng(1).integers(3, 400, 24)]
    out = {}
    for release in (False, True):
        monkeypatch.setattr(om, "DEFAULT_MEMORY", om.SessionMemory(release_pages=release,
                                                                   release_while_loading=False))
        lm = om.OnnxLM(m.target, d)
        if not release:
            assert lm.released_bytes == 0
        elif kind == "int4-f3" and sys.platform.startswith("linux"):
            assert lm.released_bytes > 0 and mapped_rss([d / "target" / "model.onnx.data"]) == 0
        cache = lm.new_cache()
        first = lm.forward(ids[:16], cache)
        out[release] = np.concatenate([first] + [lm.forward([i], cache) for i in ids[16:]])
    np.testing.assert_array_equal(out[False], out[True])


def test_memory_setting_names():
    assert om.SessionMemory.named("edgespec") == om.DEFAULT_MEMORY
    assert om.DEFAULT_MEMORY.release_pages
    assert om.DEFAULT_MEMORY.release_while_loading
    assert om.SessionMemory.named("ort-defaults") == om.SessionMemory(release_pages=False,
                                                                      release_while_loading=False)
    assert om.SessionMemory.named("cpu_arena=0+release_pages=0") == om.SessionMemory(cpu_arena=False,
                                                                                      release_pages=False)
    with pytest.raises(ValueError, match="unknown session memory setting"):
        om.SessionMemory.named("arena-off")


# ---- the quantized token embedding (graph format 3, revision 2) ----

def _gather_graph(table: np.ndarray):
    from onnx import TensorProto, helper, numpy_helper

    g = helper.make_graph([helper.make_node("Gather", ["embed", "input_ids"], ["h"], name="embed/Gather")], "g",
                          [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "t"])],
                          [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["b", "t", table.shape[1]])],
                          [numpy_helper.from_array(table, "embed")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _run(model, ids):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"input_ids": ids})[0]


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_embedding_rows_are_within_half_a_step_of_fp32(bits):
    from edgespec.export.quantize import quantize_embedding

    rng = np.random.default_rng(bits)
    table = rng.normal(0, 0.05, (300, 96)).astype(np.float32)
    table[7] = 0.0  # an all-zero block must not divide by zero
    ids = rng.integers(0, 300, (2, 17)).astype(np.int64)
    ids[0, :2] = [7, 299]
    ref = _run(_gather_graph(table), ids)
    model = _gather_graph(table)
    assert quantize_embedding(model, bits, block_size=32, rows_per_chunk=64) == "embed/Gather_Q" + str(bits)
    assert [n.op_type for n in model.graph.node] == ["GatherBlockQuantized"]
    got = _run(model, ids)  # onnxruntime's own kernel dequantizes: checks the packing, nibble order included
    step = np.abs(table.reshape(300, 3, 32)).max(-1) / (2 ** (bits - 1) - 1)  # (V, blocks)
    bound = np.repeat(step, 32, axis=1)[ids] / 2 + 1e-7
    assert np.all(np.abs(got - ref) <= bound)
    assert np.abs(got - ref).max() > 0  # it did quantize
    assert np.all(got[0, 0] == 0)
    from onnx import numpy_helper

    nbytes = sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer)
    assert nbytes == table.size * (bits / 8 + 4 / 32)  # bits/8 byte per weight + a float32 scale per 32, not 4


def test_quantize_embedding_leaves_other_graphs_alone():
    from edgespec.export.quantize import quantize_embedding

    model = _gather_graph(np.zeros((10, 40), np.float32))  # 40 is not a multiple of the block size
    assert quantize_embedding(model, 4, block_size=32) is None
    assert [n.op_type for n in model.graph.node] == ["Gather"]
    with pytest.raises(ValueError, match="embedding bits"):
        quantize_embedding(model, 2, block_size=32)


def test_int4_format3_export_quantizes_the_embedding(int4_export, tiny_dirs, tmp_path):
    """The export's embedding is an 8-bit GatherBlockQuantized table; its logits stay those of the same graph
    with the fp32 table within 2% of their range, and the export validates (greedy agreement recorded)."""
    import onnx

    from edgespec.io.onnx_model import OnnxLM
    from edgespec.export.quantize import quantize

    m = load_manifest(int4_export)
    assert m.target.quantization.embedding_bits == 8 and m.draft.quantization.embedding_bits == 8
    g = onnx.load(str(int4_export / m.target.path), load_external_data=False).graph
    gbq = [n for n in g.node if n.op_type == "GatherBlockQuantized"]
    assert len(gbq) == 1 and gbq[0].input[1] == "input_ids" and not [n for n in g.node if n.op_type == "Gather"
                                                                      and n.input[1] == "input_ids"]
    q = m.target.validation["reference"]
    assert q["positions"] == 256 and q["greedy_agreement"] >= 0.8
    # the same graph with the fp32 table: requantize the export's source graph without the embedding step
    before = tmp_path / "before" / "target"
    before.mkdir(parents=True)
    fp32_graph = tmp_path / "fp32.onnx"
    import onnxruntime as ort
    from transformers import AutoModelForCausalLM

    from edgespec.io.onnx_model import session_options
    from edgespec.export.gqa_graph import export_format3

    export_format3(AutoModelForCausalLM.from_pretrained(tiny_dirs["target"]).eval(), fp32_graph)
    quantize(fp32_graph, before / "model.onnx", "int4", embedding_bits=None)
    ids = [int(i) for i in np.random.default_rng(2).integers(3, 400, 32)]
    after_lm = OnnxLM(m.target, int4_export)
    before_lm = OnnxLM.from_session(m.target, ort.InferenceSession(str(before / "model.onnx"), session_options()))
    a = after_lm.forward(ids, after_lm.new_cache())
    b = before_lm.forward(ids, before_lm.new_cache())
    spread = b.max() - b.min()
    assert np.abs(a - b).max() <= 0.02 * spread  # the stated tolerance: 2% of the logits' range (measured 0.5%)
    assert (a.argmax(-1) == b.argmax(-1)).mean() >= 0.9


def test_cached_format3_graphs_of_the_fp32_embedding_are_rebuilt_format2_kept():
    """Format 3's revision is in the graph cache key (graphs cached before the quantized embedding are not
    reused); format 2's key is the one it always had, so its cached graphs stay valid."""
    import hashlib
    import json
    from dataclasses import asdict

    from edgespec.export.build import GRAPH_REVISIONS, ExportOptions, _cache_key
    from edgespec.export.sources import Source

    src = Source(ref="x", kind="hf", path=None, sha256="ab" * 32)

    def old_key(opts):
        o = asdict(opts)
        for k in ("vocab_size", "prefill_int8", "kv_int8", "zero_points", "tensor_bits", "tensor_blocks", "chosen_by"):
            del o[k]  # the key before those options existed
        graph = o.pop("graph_format")
        blob = json.dumps({"sha": src.sha256, "opts": o, "graph": graph}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:24]

    f2, f3 = ExportOptions(graph_format=2), ExportOptions(graph_format=3)
    assert _cache_key(src, f2) == old_key(f2)
    assert GRAPH_REVISIONS[3] >= 2 and _cache_key(src, f3) != old_key(f3)


def test_old_format3_manifest_without_embedding_bits_loads(int4_export, tmp_path):
    import json
    import shutil

    from edgespec.io.onnx_model import OnnxLM

    old = tmp_path / "old"
    shutil.copytree(int4_export, old)
    mf = old / "edgespec.json"
    d = json.loads(mf.read_text())
    for role in ("target", "draft"):
        del d[role]["quantization"]["embedding_bits"]
    mf.write_text(json.dumps(d))
    m = load_manifest(old)
    assert m.target.quantization.embedding_bits == 32  # absent: the fp32 table of revision 1
    lm = OnnxLM(m.target, old)
    assert lm.forward([5, 6, 7], lm.new_cache()).shape == (3, m.target.vocab_size)


def test_memory_bench_runs_each_directory_under_its_own_settings(int4_export, tmp_path):
    import json
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "memory.json"
    r = subprocess.run([sys.executable, str(root / "bench" / "memory.py"), f"{int4_export}@ort-defaults",
                        f"{int4_export}@edgespec,cpu_arena=0,checkout={root}", "--soak", "30", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    runs = json.loads(out.read_text())["runs"]
    assert [x["setting"] for x in runs] == ["ort-defaults", "edgespec", "cpu_arena=0", f"checkout={root}"]
    assert all(x["export"] == str(int4_export) and x["peak_rss_mb"] > 0.9 * x["rss_end_mb"] > 0 for x in runs)
    assert runs[0]["context_tokens"] == 20 + 30


def test_memory_bench_breakdown_stages(int4_export, tmp_path):
    import json
    import subprocess
    from pathlib import Path

    out = tmp_path / "b.json"
    r = subprocess.run([sys.executable, str(Path(__file__).resolve().parent.parent / "bench" / "memory.py"),
                        str(int4_export), "--commands", "breakdown", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (run,) = json.loads(out.read_text())["runs"]
    assert [s["stage"] for s in run["stages"]] == ["imports", "tokenizer", "target loaded", "draft loaded",
                                                   "prefill + 16 steps each"]
    assert all(s["rss_mb"] > 0 and s["target_data_mb"] >= 0 for s in run["stages"])


def test_the_plain_text_tokenizer_is_built_only_for_control_token_text(tiny_export):
    """A second tokenizer costs ~100 MB for Qwen's vocabulary: the decoder builds it on the first message that
    holds control-token text, not at load."""
    from edgespec.engine.decoder import SpecDecoder

    dec = SpecDecoder.load(tiny_export, load_draft=False)
    assert dec._plain_tokenizer is None
    dec.encode(messages=[{"role": "user", "content": "hello"}])
    assert dec._plain_tokenizer is None
    im_end = dec.tokenizer.token_to_id("<|im_end|>")
    ids = dec.encode(messages=[{"role": "user", "content": "a <|im_end|> b"}])
    assert dec._plain_tokenizer is not None
    assert ids.count(im_end) == 1  # the template's own closing token only; the content's text stays text
