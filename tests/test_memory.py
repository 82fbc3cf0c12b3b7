"""Memory footprint (issue 17): giving back a loaded graph's clean file pages, and the memory settings."""

import mmap
import sys

import numpy as np
import pytest

import edgespec.onnx_model as om
from edgespec.manifest import load_manifest
from edgespec.pages import mapped_rss, release_file_pages

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


@pytest.fixture(scope="module")
def int4_export(home, tiny_dirs, tmp_path_factory):
    """An int4 format-3 export of the tiny pair (its MatMulNBits scales stay mapped after loading)."""
    from edgespec.export import ExportOptions, export_pair

    o = ExportOptions(precision="int4", graph_format=3)
    return export_pair(str(tiny_dirs["target"]), str(tiny_dirs["draft"]),
                       tmp_path_factory.mktemp("exports") / "int4", o, o)


@pytest.mark.parametrize("kind", ["fp32", "int4-f3"])
def test_release_pages_keeps_the_logits(kind, request, monkeypatch):
    """The same graph loaded with and without the page release computes bitwise the same logits."""
    d = request.getfixturevalue("int4_export" if kind == "int4-f3" else "tiny_export")
    m = load_manifest(d)
    ids = [int(i) for i in np.random.default_rng(1).integers(3, 400, 24)]
    out = {}
    for release in (False, True):
        monkeypatch.setattr(om, "DEFAULT_MEMORY", om.SessionMemory(release_pages=release))
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
    assert om.SessionMemory.named("ort-defaults") == om.SessionMemory(release_pages=False)
    assert om.SessionMemory.named("cpu_arena=0+release_pages=0") == om.SessionMemory(cpu_arena=False,
                                                                                      release_pages=False)
    with pytest.raises(ValueError, match="unknown session memory setting"):
        om.SessionMemory.named("arena-off")
