"""Audio for ``edgespec voice``: WAV files (stdlib ``wave``), resampling, and end-of-speech detection.

Everything inside the pipeline is mono float32 in [-1, 1] at a known rate; :func:`read_wav` converts any PCM
WAV (8-bit unsigned, 16/24/32-bit signed, any rate, any channel count) to that, and :func:`write_wav` writes
int16 mono. The endpointer is energy based: 30 ms frames, speech where the frame RMS is well above the
recording's noise floor.
"""

from __future__ import annotations

import os
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import EdgespecError

MAX_QUESTION_S = 30.0  # longest spoken question accepted (Moonshine is trained on segments up to ~30 s)
FRAME_S = 0.03


def read_wav(path: str | Path, rate: int = 16000, max_s: float | None = MAX_QUESTION_S) -> np.ndarray:
    """Read a PCM WAV file as mono float32 (S,) in [-1, 1] at ``rate`` Hz (channels averaged, resampled).

    Raises:
        EdgespecError: missing file, not a PCM WAV, or longer than ``max_s`` seconds (the limit is named).
    """
    path = Path(path)
    if not path.is_file():
        raise EdgespecError(f"{path}: no such file")
    try:
        with wave.open(str(path), "rb") as w:
            ch, width, sr, n = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
            if max_s is not None and n > max_s * sr:
                raise EdgespecError(f"{path}: the recording is {n / sr:.1f} s long; a spoken question may be at "
                                    f"most {max_s:.0f} s (trim it)")
            raw = w.readframes(n)
    except (wave.Error, EOFError) as e:
        raise EdgespecError(f"{path}: not a PCM WAV file ({e})") from None
    if width not in (1, 2, 3, 4) or ch < 1 or sr < 1000:
        raise EdgespecError(f"{path}: unsupported WAV ({width * 8}-bit, {ch} channels, {sr} Hz)")
    x = pcm_to_float(raw, width)
    x = x[: len(x) // ch * ch].reshape(-1, ch).mean(axis=1)  # mix down
    return resample(x, sr, rate)


def pcm_to_float(raw: bytes, width: int) -> np.ndarray:
    """Little-endian PCM bytes → float32 in [-1, 1]: 8-bit unsigned, 16/24/32-bit signed."""
    if width == 1:
        return (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    if width == 3:
        b = np.frombuffer(raw[: len(raw) // 3 * 3], np.uint8).reshape(-1, 3).astype(np.int32)
        v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        return (np.where(v >= 1 << 23, v - (1 << 24), v) / float(1 << 23)).astype(np.float32)
    dt = {2: np.int16, 4: np.int32}[width]
    return (np.frombuffer(raw[: len(raw) // width * width], dt).astype(np.float64) / float(2 ** (8 * width - 1))
            ).astype(np.float32)


def resample(x: np.ndarray, src: int, dst: int) -> np.ndarray:
    """Resample float32 (S,) from ``src`` Hz to ``dst`` Hz: FFT low-pass below the lower Nyquist frequency
    when downsampling, then linear interpolation. Plenty for speech recognition and playback."""
    x = np.asarray(x, np.float32)
    if src == dst or x.size == 0:
        return x
    if dst < src and x.size > 1:  # anti-alias
        spec = np.fft.rfft(x)
        freqs = np.fft.rfftfreq(x.size, 1.0 / src)
        spec[freqs > 0.45 * dst] = 0
        x = np.fft.irfft(spec, n=x.size).astype(np.float32)
    n_out = max(1, int(round(x.size * dst / src)))
    t = np.arange(n_out, dtype=np.float64) * (src / dst)
    return np.interp(t, np.arange(x.size), x).astype(np.float32)


def to_int16(x: np.ndarray) -> np.ndarray:
    """float32 in [-1, 1] → int16 (clipped)."""
    return (np.clip(np.asarray(x, np.float32), -1.0, 1.0) * 32767.0).astype(np.int16)


def write_wav(path: str | Path, samples: np.ndarray, rate: int) -> None:
    """Write mono int16 (S,) (or float32 in [-1, 1], converted) to ``path`` atomically (temp file, rename)."""
    path = Path(path)
    s = samples if samples.dtype == np.int16 else to_int16(samples)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with wave.open(str(tmp), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(int(rate))
            w.writeframes(np.ascontiguousarray(s, "<i2").tobytes())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@dataclass(frozen=True)
class Speech:
    """Where speech is in a recording: sample indices [start, end) and whether any was found."""

    start: int
    end: int

    @property
    def found(self) -> bool:
        return self.end > self.start


def frame_rms(x: np.ndarray, rate: int) -> np.ndarray:
    """RMS of consecutive 30 ms frames: float32 (F,)."""
    n = max(1, int(rate * FRAME_S))
    f = x[: len(x) // n * n].reshape(-1, n)
    return np.sqrt((f.astype(np.float64) ** 2).mean(axis=1)).astype(np.float32) if len(f) else np.zeros(0, np.float32)


def speech_threshold(rms: np.ndarray, min_rms: float = 0.004) -> float:
    """Frame RMS above which a frame counts as speech: 4× the noise floor (10th percentile), at least
    ``min_rms`` (about -48 dBFS) so that digital silence and faint hiss never count."""
    floor = float(np.percentile(rms, 10)) if rms.size else 0.0
    return max(min_rms, 4.0 * floor)


def find_speech(x: np.ndarray, rate: int, pad_s: float = 0.2, min_speech_s: float = 0.15) -> Speech:
    """The span from the first to the last speech frame, padded by ``pad_s`` each side. No speech (silence,
    or less than ``min_speech_s`` of it) gives an empty span."""
    rms = frame_rms(x, rate)
    voiced = np.flatnonzero(rms > speech_threshold(rms))
    n = max(1, int(rate * FRAME_S))
    if voiced.size * FRAME_S < min_speech_s:
        return Speech(0, 0)
    pad = int(pad_s * rate)
    return Speech(max(0, int(voiced[0]) * n - pad), min(len(x), (int(voiced[-1]) + 1) * n + pad))


class Endpointer:
    """Streaming end-of-speech detection for a live microphone (push 30 ms blocks of float32 samples).

    Speech starts at the first frame above an absolute threshold; it ends after ``hangover_s`` of frames
    below it. ``done`` turns True then; ``timed_out`` when no speech came within ``wait_s``.
    """

    def __init__(self, rate: int, threshold: float = 0.01, hangover_s: float = 0.6, wait_s: float = 10.0,
                 max_s: float = MAX_QUESTION_S):
        self.rate, self.threshold = rate, threshold
        self.hangover, self.wait, self.max = int(hangover_s / FRAME_S), int(wait_s / FRAME_S), int(max_s / FRAME_S)
        self.frames, self.started, self.quiet, self.done, self.timed_out = 0, False, 0, False, False

    def push(self, block: np.ndarray) -> None:
        for r in frame_rms(block, self.rate):
            self.frames += 1
            if r > self.threshold:
                self.started, self.quiet = True, 0
            elif self.started:
                self.quiet += 1
            if self.started and (self.quiet >= self.hangover or self.frames >= self.max):
                self.done = True
            if not self.started and self.frames >= self.wait:
                self.done = self.timed_out = True
