"""Shared fixtures: an isolated user directory and tiny exported pairs (built once per session)."""

from __future__ import annotations

import contextlib
import os
import signal

import pytest

from tinymodels import build_model


@pytest.fixture(autouse=True)
def _per_session_thread_pools(monkeypatch):
    """Keep onnxruntime's process-wide thread pool out of the pytest process.

    The CLI's loaders (bench, the context sweep) ask ``SpecDecoder.load(shared_thread_pool=True)``; once a global
    pool exists onnxruntime refuses every later ``ort.InferenceSession`` made without
    :func:`edgespec.io.onnx_model.session_options` ("use_per_session_threads must be false"), so one in-process
    call would fail unrelated tests that run after it. Subprocess tests still use the real pool.
    """
    monkeypatch.setattr("edgespec.engine.decoder.use_shared_thread_pool", lambda threads=None: False)


def pytest_addoption(parser):
    parser.addoption("--real-pair", action="store_true", help="also run the real Qwen2.5-Coder pair tier")
    parser.addoption("--android-core", action="store_true",
                     help="also test the TypeScript core in android_demo/core (needs Node.js and `npm ci` there)")
    parser.addoption("--hermes-vm", metavar="PATH", default=None,
                     help="also run the TypeScript core on this Hermes VM binary (the `hermes` CLI of React Native's "
                          "Hermes; android_demo/README.md says how to build one): needs --android-core")
    parser.addoption("--aarch64", action="store_true",
                     help="also run scripts/aarch64-check.sh on the tiny export (root, qemu; ~15 min the first time)")


def pytest_configure(config):
    config.addinivalue_line("markers", "hermes: runs the TypeScript core on a Hermes VM (run with --hermes-vm PATH)")


def pytest_collection_modifyitems(config, items):
    skip_real = pytest.mark.skip(reason="real-pair tier: run with --real-pair")
    skip_core = pytest.mark.skip(reason="TypeScript core: run with --android-core (after `npm ci` in android_demo/core)")
    skip_arm = pytest.mark.skip(reason="aarch64 tier: run with --aarch64 (root, qemu)")
    skip_hermes = pytest.mark.skip(reason="Hermes tier: run with --android-core --hermes-vm PATH (no npm package "
                                          "ships a Hermes VM recent enough; android_demo/README.md)")
    for item in items:
        if "real" in item.keywords and not config.getoption("--real-pair"):
            item.add_marker(skip_real)
        if "android_core" in item.keywords and not config.getoption("--android-core"):
            item.add_marker(skip_core)
        # by marker, not keyword: a checkout in a folder named aarch64 would match every test
        if item.get_closest_marker("aarch64") and not config.getoption("--aarch64"):
            item.add_marker(skip_arm)
        if item.get_closest_marker("hermes") and not config.getoption("--hermes-vm"):
            item.add_marker(skip_hermes)


# A CI runner may start the tests with SIGINT ignored (a background job): restore Python's handler, so the
# subprocesses the tests interrupt start with SIGINT at its default, as under a user's terminal.
signal.signal(signal.SIGINT, signal.default_int_handler)

USER_HOME = os.environ.get("EDGESPEC_HOME")  # as the user set it, before the tiny tiers isolate it


def _set_home(value: str | None) -> None:
    if value is None:
        os.environ.pop("EDGESPEC_HOME", None)
    else:
        os.environ["EDGESPEC_HOME"] = value


@contextlib.contextmanager
def edgespec_home(value: str | None):
    """EDGESPEC_HOME set to ``value`` (None: unset) for the duration of a block."""
    saved = os.environ.get("EDGESPEC_HOME")
    _set_home(value)
    try:
        yield
    finally:
        _set_home(saved)


def user_home():
    """The user's own EDGESPEC_HOME (the real cache) for the duration of a block."""
    return edgespec_home(USER_HOME)


@pytest.fixture(scope="session")
def home(tmp_path_factory):
    """EDGESPEC_HOME for the tiny tier (the real tier keeps the user's cache)."""
    d = tmp_path_factory.mktemp("edgespec_home")
    with edgespec_home(str(d)):
        yield d


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """HF directories: qwen2 target, qwen2 draft (the target with 10% weight noise), llama target."""
    root = tmp_path_factory.mktemp("hf")
    return {
        "target": build_model(root / "target", "qwen2", seed=0, layers=2, hidden=64),
        "draft": build_model(root / "draft", "qwen2", seed=0, noise=0.1),
        "llama": build_model(root / "llama", "llama", seed=2, layers=2, hidden=64),
    }


@pytest.fixture(scope="session")
def tiny_fim_export(home, tmp_path_factory):
    """fp32 export of a tiny qwen2 pair whose tokenizer has Qwen2.5-Coder's FIM tokens (special, as in an
    export converted from a GGUF) and tool-call tokens (plain text)."""
    from edgespec.export import ExportOptions, export_pair

    root = tmp_path_factory.mktemp("hf_fim")
    target = build_model(root / "target", "qwen2", seed=0, layers=2, hidden=64, fim=True)
    draft = build_model(root / "draft", "qwen2", seed=0, noise=0.1, fim=True)
    fp32 = ExportOptions(precision="fp32")
    return export_pair(str(target), str(draft), tmp_path_factory.mktemp("exports") / "fim", fp32, fp32)


def _pair(tmp_path_factory, tiny_dirs, name: str, draft: str, graph_format: int | None):
    from edgespec.export import ExportOptions, export_pair

    out = tmp_path_factory.mktemp("exports") / name
    fp32 = ExportOptions(precision="fp32", **({} if graph_format is None else {"graph_format": graph_format}))
    return export_pair(str(tiny_dirs["target"]), str(tiny_dirs[draft]), out, fp32, fp32)


@pytest.fixture(scope="session")
def tiny_export(home, tiny_dirs, tmp_path_factory):
    """fp32 export of the tiny qwen2 target with the tiny qwen2 draft (the exporter's default graph format)."""
    return _pair(tmp_path_factory, tiny_dirs, "pair", "draft", None)


@pytest.fixture(scope="session")
def tiny_tool_export(home, tmp_path_factory):
    """The tiny pair (same seeds) with ``<tool_call>``/``</tool_call>`` added tokens and a Qwen2.5-style tools
    chat template (:data:`tinymodels.TOOLS_CHATML`); a context of 2,048 (tool definitions are long prompts in
    the tiny vocabulary)."""
    root = tmp_path_factory.mktemp("hf_tools")
    dirs = {"target": build_model(root / "target", "qwen2", seed=0, tools=True, context=2048),
            "draft": build_model(root / "draft", "qwen2", seed=0, noise=0.1, tools=True, context=2048)}
    return _pair(tmp_path_factory, dirs, "tools", "draft", None)


@pytest.fixture(scope="session")
def tiny_self_export(home, tiny_dirs, tmp_path_factory):
    """The tiny target as its own draft (same graph): every draft token must be accepted."""
    return _pair(tmp_path_factory, tiny_dirs, "self", "target", None)


@pytest.fixture(scope="session", params=[2, 3, 4], ids=["format2", "format3", "format4"])
def export_each_format(request, home, tiny_dirs, tmp_path_factory):
    """:func:`tiny_export` in each graph format: 2 (traced, KV concatenated), 3 (in-place KV, fused GQA) and 4
    (in-place per-KV-head KV, grouped attention)."""
    return _pair(tmp_path_factory, tiny_dirs, f"pair{request.param}", "draft", request.param)


@pytest.fixture(scope="session", params=[2, 3, 4], ids=["format2", "format3", "format4"])
def self_export_each_format(request, home, tiny_dirs, tmp_path_factory):
    """:func:`tiny_self_export` in each graph format."""
    return _pair(tmp_path_factory, tiny_dirs, f"self{request.param}", "target", request.param)


@pytest.fixture(scope="session")
def real_export():
    """The default pair in the user's cache, as ``edgespec export`` makes it on this machine (its profile
    included): exported there once, then reused by every later run."""
    from edgespec.io import paths
    from edgespec.export import export_pair

    from edgespec.export.build import DEFAULT_GRAPH_FORMAT
    from edgespec.export.profiles import resolve_profile
    from edgespec.io.manifest import load_manifest

    with user_home():
        d = paths.default_export_dir()
        fresh = False
        if (d / "edgespec.json").is_file():
            try:
                m = load_manifest(d)
                fresh = (m.target.graph_format == DEFAULT_GRAPH_FORMAT
                         and m.profile == resolve_profile("auto")[0])
            except Exception:  # an unreadable or older export: made again, as `edgespec export` would
                fresh = False
        if not fresh:
            export_pair(None, None, profile="auto")
    return d


@pytest.fixture(scope="session")
def real_small_export(real_export):
    """The default pair at ``--profile small`` (int4 graphs with a float32 cache, no prefill graphs) in the user's
    cache beside :func:`real_export`: the base the int8-cache and prefill-graph tests derive their exports from.
    The same directory when the default export is small itself (a machine under 7 GiB)."""
    from edgespec.io import paths
    from edgespec.export import export_pair
    from edgespec.io.manifest import load_manifest

    with user_home():
        if load_manifest(real_export).profile == "small":
            return real_export
        d = paths.default_export_dir()
        d = d.with_name(d.name + "-small")
        try:
            fresh = load_manifest(d).profile == "small"
        except Exception:  # missing, unreadable or older: made again
            fresh = False
        if not fresh:
            export_pair(None, None, d, profile="small")
    return d
