"""Execution providers: options from the CLI and the API, CPU fallback with one notice, the provider in use
reported in stats and ``edgespec info``, thread tuning on CPU only."""

import json
import logging
import os
import subprocess
import sys

import onnxruntime as ort
import pytest

import edgespec.io.onnx_model as onnx_model
from edgespec.engine.decoder import SpecDecoder
from edgespec.errors import EdgespecError
from edgespec.io.manifest import load_manifest
from edgespec.io.onnx_model import OnnxLM, parse_provider_options, session_options

QNN_HERE = "QNNExecutionProvider" in ort.get_available_providers()


def run(args, home):
    return subprocess.run([sys.executable, "-m", "edgespec.cli", *args], capture_output=True, text=True,
                          env=dict(os.environ, EDGESPEC_HOME=str(home)), timeout=300)


@pytest.mark.skipif(QNN_HERE, reason="this onnxruntime has QNN: nothing to fall back from")
def test_a_missing_provider_falls_back_to_cpu_with_one_notice(tiny_export, home):
    r = run(["generate", str(tiny_export), "--prompt", "def add", "--max-new-tokens", "6", "--json", "--provider",
             "qnn", "--provider-option", "backend_path=libQnnHtp.so"], home)
    assert r.returncode == 0, r.stderr
    notices = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(notices) == 1 and "'qnn' is not available" in notices[0] and "running on CPU" in notices[0]
    assert json.loads(r.stdout)["stats"]["provider"] == "cpu"
    r = run(["info", str(tiny_export), "--provider", "qnn"], home)
    assert r.returncode == 0 and "execution provider: cpu ('qnn' is not available" in r.stdout
    r = run(["info", str(tiny_export), "--json"], home)
    assert json.loads(r.stdout)["execution_provider"]["used"] == "cpu"


def test_a_provider_that_rejects_the_graph_falls_back_to_cpu(tiny_export, monkeypatch, caplog):
    real = ort.InferenceSession
    calls = []

    def session(path, so=None, providers=None, **kw):
        calls.append(providers)
        first = providers[0][0] if isinstance(providers[0], tuple) else providers[0]
        if first != "CPUExecutionProvider":
            raise RuntimeError("QNN: unsupported op GroupQueryAttention\nmore detail")
        return real(path, so, providers=providers, **kw)

    monkeypatch.setattr(onnx_model.ort, "InferenceSession", session)
    spec = load_manifest(tiny_export).draft
    with caplog.at_level(logging.WARNING, logger="edgespec"):
        lm = OnnxLM(spec, tiny_export, provider="azure", provider_options={"endpoint": "x"})
    assert lm.provider == "cpu"
    assert calls[0] == [("AzureExecutionProvider", {"endpoint": "x"}), "CPUExecutionProvider"]
    assert calls[1] == ["CPUExecutionProvider"]  # the other provider's options are not passed to CPU
    assert [r.getMessage() for r in caplog.records] == [
        "edgespec: execution provider 'azure' rejected model.onnx (QNN: unsupported op GroupQueryAttention); "
        "running on CPU"]


def test_provider_options_reach_onnxruntime_and_the_provider_is_in_the_stats(tiny_export, monkeypatch):
    real = ort.InferenceSession
    seen = []
    monkeypatch.setattr(onnx_model.ort, "InferenceSession",
                        lambda path, so=None, providers=None, **kw: seen.append(providers) or real(path, so,
                                                                                                 providers=providers))
    dec = SpecDecoder.load(tiny_export, provider="cpu", provider_options={"arena_extend_strategy": "kSameAsRequested"})
    assert seen == [[("CPUExecutionProvider", {"arena_extend_strategy": "kSameAsRequested"})]] * 2
    g = dec.generate("def", max_new_tokens=4).run()
    assert g.stats.provider == "cpu" and dec.target.provider == dec.draft.provider == "cpu"


def test_thread_tuning_applies_on_cpu_only():
    if onnx_model.pool_threads():
        pytest.skip("the process-wide thread pool is on in this process")
    cpu = session_options(3)
    assert cpu.intra_op_num_threads == 3 and cpu.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    other = session_options(3, cpu=False)
    assert other.intra_op_num_threads == 0
    with pytest.raises(RuntimeError):
        other.get_session_config_entry("session.intra_op.allow_spinning")


def test_provider_names_and_options_are_checked(tiny_export, home):
    assert parse_provider_options(["backend_path=/x/libQnnHtp.so", "device_type=NPU=1"]) == {
        "backend_path": "/x/libQnnHtp.so", "device_type": "NPU=1"}
    for bad in (["novalue"], ["=x"]):
        with pytest.raises(EdgespecError, match="KEY=VALUE"):
            parse_provider_options(bad)
    with pytest.raises(EdgespecError, match="unknown execution provider"):
        onnx_model.provider_name("nosuch")
    r = run(["generate", str(tiny_export), "--prompt", "x", "--provider-option", "novalue"], home)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "KEY=VALUE" in lines[0]
