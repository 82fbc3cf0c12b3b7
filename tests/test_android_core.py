"""The TypeScript core (android_demo/core) against the Python runtime, and the app (android_demo/app) bundled.

Opt-in (``pytest --android-core``; CI runs it after ``npm ci`` in android_demo/core and android_demo/app):
- writes test vectors with ``android_demo/core/scripts/make_vectors.py`` for the tiny pair in graph formats 2,
  3 and 4, in format 3 with an int8 KV cache (``kv_int8``), and the tiny self-pair (draft == target), then runs
  ``npm test`` on them; with ``--real-pair`` also on
  the real default pair in the user cache;
- bundles the app with Metro (``react-native bundle``) and compiles the bundle with the ``hermesc`` that the
  ``react-native`` package ships, failing on any error;
- bundles the core's conformance suite the same way and runs that bundle on Node with no native TextDecoder
  (the polyfill Hermes needs takes its place): its results must equal the unbundled core's;
- with ``--hermes-vm PATH`` (marker ``hermes``), runs the compiled suite on that Hermes VM: its results must
  equal Node's on the same vectors (token ids, streamed text, the replayed loop's ids and stats, sampler).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest


CORE = Path(__file__).resolve().parents[1] / "android_demo" / "core"
APP = CORE.parent / "app"
HERMESC = APP / "node_modules" / "react-native" / "sdks" / "hermesc" / "linux64-bin" / "hermesc"
HBC_MAGIC = 0x1F1903C103BC1FC6  # the first 8 bytes of a Hermes bytecode file (little endian)
pytestmark = pytest.mark.android_core


def _make_vectors():
    spec = importlib.util.spec_from_file_location("make_vectors", CORE / "scripts" / "make_vectors.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main


def _need(d: Path) -> None:
    if shutil.which("npm") is None:
        pytest.fail("npm is not installed (the TypeScript core needs Node.js 20 and npm)")
    if not (d / "node_modules").is_dir():
        pytest.fail(f"android_demo/{d.name} has no node_modules: run `npm ci` there first (the README's test command does)")


def _run(cmd: list, cwd: Path, timeout: int = 900, env: dict | None = None) -> str:
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **(env or {})})
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{out[-6000:]}"
    return out


def _npm_test(vectors: list[Path]) -> str:
    _need(CORE)
    env = {"EDGESPEC_VECTORS": os.pathsep.join(str(v) for v in vectors)}
    out = _run(["npm", "test"], CORE, timeout=3600, env=env)
    assert "# fail 0" in out and "# skipped 0" in out, out[-4000:]
    return out


def _vectors(make, pairs, out_dir: Path) -> list[Path]:
    vectors = []
    for name, d, draws in pairs:
        vectors.append(out_dir / f"{name}.json")
        assert make([str(d), str(vectors[-1]), "--new-tokens", "24", "--draws", str(draws)]) == 0
    return vectors


def _int8_kv_pair(tmp_path_factory, tiny_dirs) -> Path:
    """The tiny pair in graph format 3, fp32 weights, with an int8 KV cache (as tests/test_kv_int8.py's)."""
    from edgespec.export import ExportOptions, export_pair

    o = ExportOptions(precision="fp32", graph_format=3, kv_int8=True)
    out = tmp_path_factory.mktemp("exports") / "core3int8"
    return export_pair(str(tiny_dirs["target"]), str(tiny_dirs["draft"]), out, o, o)


@pytest.fixture(scope="module")
def tiny_vectors(home, tiny_dirs, tiny_self_export, tiny_fim_export, tmp_path_factory):
    from conftest import _pair

    pairs = [("pair2", _pair(tmp_path_factory, tiny_dirs, "core2", "draft", 2), 2000),
             ("pair3", _pair(tmp_path_factory, tiny_dirs, "core3", "draft", 3), 1000),
             ("pair3int8", _int8_kv_pair(tmp_path_factory, tiny_dirs), 1000),
             ("pair4", _pair(tmp_path_factory, tiny_dirs, "core4", "draft", 4), 1000),
             ("self", tiny_self_export, 500),  # the self-pair's sampling check is mostly about full acceptance
             ("fim", tiny_fim_export, 300)]  # its tokenizer has the FIM tokens (special) and tool-call tokens
    return _vectors(_make_vectors(), pairs, tmp_path_factory.mktemp("vectors"))


def test_core_on_the_tiny_exports(tiny_vectors):
    _npm_test(tiny_vectors)


@pytest.mark.real
def test_core_on_the_real_pair(real_export, tmp_path):
    _npm_test(_vectors(_make_vectors(), [("real", real_export, 150)], tmp_path))


# -- the app: Metro bundle, hermesc, the bundled suite ------------------------------------------------------

def _bundle(entry: str, out: Path) -> Path:
    """Metro's release bundle of ``entry`` (a path in android_demo/app) with a source map, as a user builds it."""
    _need(APP)
    _run(["npx", "react-native", "bundle", "--platform", "android", "--dev", "false", "--entry-file", entry,
          "--bundle-output", out, "--sourcemap-output", f"{out}.map"], APP)
    return out


def _hermesc(bundle: Path) -> Path:
    """Compile ``bundle`` with react-native's own hermesc (-O, as a release build does); fails on any error."""
    hbc = bundle.with_suffix(".hbc")
    out = _run([HERMESC, "-emit-binary", "-O", "-out", hbc, bundle], APP)
    errors = [ln for ln in out.splitlines() if re.search(r": error: ", ln)]
    assert not errors, "\n".join(errors[:10])
    version = int(re.search(r"HBC bytecode version: (\d+)", _run([HERMESC, "-version"], APP)).group(1))
    head = hbc.read_bytes()[:12]
    assert int.from_bytes(head[:8], "little") == HBC_MAGIC and int.from_bytes(head[8:12], "little") == version
    return hbc


def test_app_bundles_and_compiles_for_hermes(tmp_path):
    """The app as a user builds it: type-check, Metro bundle (the core from its sources), hermesc."""
    _need(APP)
    app_pkg, core_pkg = (json.loads((d / "package.json").read_text()) for d in (APP, CORE))
    for dep, pin in core_pkg["dependencies"].items():  # Metro resolves the core's packages from the app
        assert app_pkg["dependencies"].get(dep) == pin, f"app/package.json: {dep} must be {pin}, as in core/"
    _run(["npx", "tsc", "--noEmit", "-p", "."], APP)
    bundle = _bundle("index.js", tmp_path / "index.android.bundle")
    sources = json.loads(Path(f"{bundle}.map").read_text())["sources"]
    rel = [os.path.relpath(s, APP.parent) if os.path.isabs(s) else s for s in sources]
    for want in ("core/src/decoder.ts", "core/src/generation.ts", "app/node_modules/@bacons/text-decoder/src/index.ts",
                 "app/node_modules/@huggingface/tokenizers/", "app/node_modules/onnxruntime-react-native/",
                 "app/node_modules/react-native-fs/"):
        assert any(s.startswith(want) for s in rel), f"{want} is not in the bundle"
    assert not any(s.startswith(("core/dist/", "core/node_modules/")) for s in rel), "the core must come from its sources"
    assert bundle.stat().st_size > 100_000
    _hermesc(bundle)


def _compare(a, b, where: str = "") -> str | None:
    """The first difference of two JSON values (floats to 1e-12 relative: libm's last bit), or None."""
    if isinstance(a, float) or isinstance(b, float):
        ok = isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-300)
        return None if ok else f"{where}: {a!r} != {b!r}"
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return f"{where}: keys {sorted(a)} != {sorted(b)}"
        return next((d for k in a if (d := _compare(a[k], b[k], f"{where}.{k}"))), None)
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{where}: length {len(a)} != {len(b)}"
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := _compare(x, y, f"{where}[{i}]"))), None)
    return None if a == b else f"{where}: {a!r} != {b!r}"


def _suite_on_node(vectors: list[Path], out: Path) -> list[str]:
    """Run the conformance suite on Node (unbundled, native TextDecoder); returns the input names."""
    _need(CORE)
    _run(["npx", "tsc", "-p", "."], CORE)
    env = {"EDGESPEC_VECTORS": os.pathsep.join(map(str, vectors)), "EDGESPEC_CONFORMANCE_OUT": str(out)}
    log = _run(["node", "--test", "dist/test/conformance.test.js"], CORE, timeout=1800, env=env)
    assert "# fail 0" in log, log[-4000:]
    return [v.stem for v in vectors]


def _bundled_suite(names: list[str], conf: Path, tmp_path: Path) -> Path:
    """app/hermes/conformance.js bundled by Metro with these inputs (a Hermes VM reads no files)."""
    build = APP / "hermes" / "build"
    build.mkdir(exist_ok=True)
    inputs = [json.loads((conf / f"{n}.input.json").read_text()) for n in names]
    (build / "inputs.json").write_text(json.dumps(inputs, ensure_ascii=False))
    return _bundle("hermes/conformance.js", tmp_path / "conformance.bundle")


def _results(out: str, names: list[str]) -> dict:
    errors = [ln for ln in out.splitlines() if ln.startswith("ERROR ")]
    assert not errors and "DONE" in out.splitlines(), (errors or [out[-3000:]])[0][:3000]
    results = [json.loads(ln[len("RESULT "):]) for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert [r["name"] for r in results] == names
    return {r["name"]: r for r in results}


def _check_equal(got: dict, conf: Path, engine: str) -> None:
    """Each result, from ``engine`` ("node" or "hermes") with the app's TextDecoder polyfill, equals Node's
    (unbundled, native TextDecoder)."""
    for name, r in got.items():
        node = json.loads((conf / f"{name}.node.json").read_text())
        ran = r.pop("engine")
        assert ran.startswith(engine) and ran.endswith("(TextDecoder: polyfill)"), f"{name}: ran on {ran}"
        assert node.pop("engine").endswith("(TextDecoder: engine)")
        diff = _compare(r, node)
        assert diff is None, f"{name}: {engine} differs from Node at {diff}"


# Node with no TextDecoder: the bundle's polyfill (@bacons/text-decoder, as index.js installs it) decodes
_NODE_AS_HERMES = ("delete globalThis.TextDecoder;"
                   "require('vm').runInThisContext(require('fs').readFileSync(process.argv[1], 'utf8'));")


def test_bundled_suite_on_node_without_textdecoder(tiny_vectors, tmp_path):
    """The Metro bundle of the suite (Babel's output, the app's resolver, the TextDecoder polyfill) gives the
    unbundled core's results; the bundle compiles with hermesc."""
    conf = tmp_path / "conf"
    names = _suite_on_node(tiny_vectors, conf)
    bundle = _bundled_suite(names, conf, tmp_path)
    _check_equal(_results(_run(["node", "-e", _NODE_AS_HERMES, bundle], APP), names), conf, "node")
    _hermesc(bundle)


def _on_hermes(vm: str, vectors: list[Path], tmp_path: Path) -> None:
    if not os.access(vm, os.X_OK):
        pytest.fail(f"--hermes-vm {vm}: not an executable")
    conf = tmp_path / "conf"
    names = _suite_on_node(vectors, conf)
    hbc = _hermesc(_bundled_suite(names, conf, tmp_path))
    out = _run([vm, hbc], APP, timeout=3600)
    _check_equal(_results(out, names), conf, "hermes")


@pytest.mark.hermes
def test_core_on_hermes(request, tiny_vectors, tmp_path):
    _on_hermes(request.config.getoption("--hermes-vm"), tiny_vectors, tmp_path)


@pytest.mark.hermes
@pytest.mark.real
def test_core_on_hermes_real_pair(request, real_export, tmp_path):
    vectors = _vectors(_make_vectors(), [("real", real_export, 150)], tmp_path)
    _on_hermes(request.config.getoption("--hermes-vm"), vectors, tmp_path)
