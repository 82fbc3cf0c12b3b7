"""Speech recognition for ``edgespec voice``: Moonshine base-en on onnxruntime (encoder once, greedy decoder).

The model directory is prepared once by the exporter (``edgespec export --voice``, see
``edgespec.export.voice``): fp32 ``encoder.onnx`` and ``decoder.onnx`` (the merged decoder of optimum's
layout: an ``If`` on ``use_cache_branch``), the vocabulary ``tokenizer.bin`` and ``moonshine.json`` with the
size and sha256 of every file. This module only validates and runs it.

Decoding (Jeffries et al. 2024, "Moonshine: Speech Recognition for Live Transcription and Voice Commands"):
the encoder maps 16 kHz float32 samples (1, S) to hidden states (1, T_enc, 416) once; the decoder starts from
``<s>`` (id 1) and is run one token at a time, greedy, with its self-attention KV cache (grown per step) and
the cross-attention KV computed at the first step and reused, until ``</s>`` (id 2) or 6 tokens per second of
audio.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..io import paths
from ..errors import EdgespecError

ASR_FORMAT = 1
MOONSHINE_NAME = "moonshine-base-en"
SAMPLE_RATE = 16000
_PREPARE_HINT = "run `edgespec export --voice` to prepare it again"


def default_asr_dir() -> Path:
    """Where the prepared Moonshine model lives in the user cache."""
    return paths.home() / "voice" / MOONSHINE_NAME


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def validate_asr_dir(d: Path, check_hashes: bool = True) -> dict:
    """Check a prepared Moonshine directory; returns its manifest (dict).

    Raises:
        EdgespecError: naming the missing or corrupt file (manifest, a graph or the vocabulary).
    """
    d = Path(d)
    mf = d / "moonshine.json"
    if not mf.is_file():
        raise EdgespecError(f"{mf}: missing (the speech model is not prepared; {_PREPARE_HINT})")
    try:
        m = json.loads(mf.read_text())
        files = m["files"]
        ok = m.get("format") == ASR_FORMAT and all(k in files for k in ("encoder", "decoder", "vocabulary"))
    except (ValueError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise EdgespecError(f"{mf}: not a valid speech-model manifest ({_PREPARE_HINT})")
    for role in ("encoder", "decoder", "vocabulary"):
        f = files[role]
        p = d / f["path"]
        if not p.is_file():
            raise EdgespecError(f"{p}: missing speech-model file ({_PREPARE_HINT})")
        if p.stat().st_size != f["size"] or (check_hashes and _sha256(p) != f["sha256"]):
            raise EdgespecError(f"{p}: corrupt speech-model file (size or sha256 differ; {_PREPARE_HINT})")
    return m


def load_vocabulary(path: Path) -> list[bytes]:
    """Moonshine's ``tokenizer.bin``: for each token id in order, one length byte then that many UTF-8 bytes
    (byte-fallback tokens are the raw byte). Raises EdgespecError when the file does not parse exactly."""
    b = Path(path).read_bytes()
    toks, i = [], 0
    while i < len(b):
        n = b[i]
        if n >= 128 or i + 1 + n > len(b):
            raise EdgespecError(f"{path}: not a Moonshine vocabulary (bad length byte at offset {i})")
        toks.append(b[i + 1:i + 1 + n])
        i += 1 + n
    if len(toks) < 259:
        raise EdgespecError(f"{path}: not a Moonshine vocabulary ({len(toks)} tokens)")
    return toks


@dataclass
class Transcript:
    """One recognition: the text, its token ids, and timings (ms); ``rtf`` = compute time / audio time."""

    text: str
    token_ids: list[int]
    audio_s: float
    encoder_ms: float
    decoder_ms: float

    @property
    def ms(self) -> float:
        return self.encoder_ms + self.decoder_ms

    @property
    def rtf(self) -> float:
        return self.ms / 1e3 / max(self.audio_s, 1e-9)


class MoonshineASR:
    """Moonshine base-en on onnxruntime. Not thread-safe (one transcription at a time)."""

    def __init__(self, model_dir: str | Path | None = None, threads: int | None = None, check_hashes: bool = True):
        """Load a prepared directory (default: the user cache).

        Raises:
            EdgespecError: the directory is missing, incomplete or corrupt (names the file), or a graph does
                not load in onnxruntime.
        """
        import onnxruntime as ort

        self.dir = Path(model_dir) if model_dir is not None else default_asr_dir()
        m = validate_asr_dir(self.dir, check_hashes)
        self.bos, self.eos = int(m.get("bos", 1)), int(m.get("eos", 2))
        self.tokens_per_second = float(m.get("tokens_per_second", 6.0))
        self.vocab = load_vocabulary(self.dir / m["files"]["vocabulary"]["path"])
        from ..io.onnx_model import session_options

        so = session_options(threads)  # the process-wide pool when the decoder enabled one
        sessions = {}
        for role in ("encoder", "decoder"):
            p = self.dir / m["files"][role]["path"]
            try:
                sessions[role] = ort.InferenceSession(str(p), so, providers=["CPUExecutionProvider"])
            except Exception as e:  # onnxruntime raises its own exception types
                raise EdgespecError(f"{p}: onnxruntime cannot load it ({str(e).splitlines()[0][:200]}; "
                                    f"{_PREPARE_HINT})") from None
        self.encoder, self.decoder = sessions["encoder"], sessions["decoder"]
        self.past_names = [i.name for i in self.decoder.get_inputs() if i.name.startswith("past_key_values.")]
        self.present_names = [o.name for o in self.decoder.get_outputs()[1:]]
        shape = self.decoder.get_inputs()[2].shape  # (batch, heads, seq, head_dim)
        self.kv_heads, self.head_dim = int(shape[1]), int(shape[3])

    def transcribe(self, audio: np.ndarray) -> Transcript:
        """Recognize 16 kHz mono float32 samples in [-1, 1], shape (S,). Greedy decoding.

        Raises ValueError for an empty or non-1-D array.
        """
        audio = np.asarray(audio, dtype=np.float32)
        if audio.ndim != 1 or audio.size == 0:
            raise ValueError(f"expected non-empty 1-D audio, got shape {audio.shape}")
        audio_s = audio.size / SAMPLE_RATE
        t0 = time.perf_counter()
        hidden = self.encoder.run(None, {"input_values": audio[None]})[0]  # float32 (1, T_enc, 416)
        t1 = time.perf_counter()
        empty = np.zeros((1, self.kv_heads, 0, self.head_dim), np.float32)
        past = {n: empty for n in self.past_names}
        ids = [self.bos]
        max_tokens = max(4, int(audio_s * self.tokens_per_second))
        for step in range(max_tokens):
            feed = {"input_ids": np.array([[ids[-1]]], np.int64), "encoder_hidden_states": hidden,
                    "use_cache_branch": np.array([step > 0]), **past}
            out = self.decoder.run(None, feed)
            logits = out[0][0, -1, :len(self.vocab)]  # float32 (V,): ids past the vocabulary are padding
            nxt = int(np.argmax(logits))
            for name, value in zip(self.present_names, out[1:]):
                key = name.replace("present.", "past_key_values.", 1)
                if step == 0 or ".decoder." in key:  # cross-attention KV: computed once at step 0
                    past[key] = value
            if nxt == self.eos:
                break
            ids.append(nxt)
        t2 = time.perf_counter()
        return Transcript(self.detokenize(ids[1:]), ids[1:], audio_s, (t1 - t0) * 1e3, (t2 - t1) * 1e3)

    def detokenize(self, ids: list[int]) -> str:
        """Token ids → text (``▁`` is a space; special tokens 0–2 dropped)."""
        raw = b"".join(self.vocab[i] for i in ids if i > 2 and i < len(self.vocab))
        return raw.replace("\u2581".encode(), b" ").decode("utf-8", "replace").strip()
