"""Microphone and speaker for ``edgespec voice`` through ``sounddevice`` (PortAudio; extra ``edgespec[voice]``).

The microphone is recorded as int16 at 16 kHz mono (float32 capture returned silence through ALSA's ``file``
plugin) in 30 ms blocks until the :class:`~edgespec.voice.audio.Endpointer` hears the end of speech.
"""

from __future__ import annotations


import numpy as np

from ..errors import EdgespecError
from .asr import SAMPLE_RATE
from .audio import FRAME_S, MAX_QUESTION_S, Endpointer
from .pipeline import NoSpeech
from .tts import VOICE_EXTRA

_USE_WAV = "use --wav-in FILE (and --wav-out FILE) instead"


def sounddevice():
    """The ``sounddevice`` module, or EdgespecError in one line saying what is missing and pointing to --wav-in."""
    try:
        import sounddevice as sd
    except ImportError:
        raise EdgespecError(f"no microphone support: sounddevice is not installed ({VOICE_EXTRA}); {_USE_WAV}") from None
    except OSError:  # sounddevice raises OSError when the PortAudio library is absent
        raise EdgespecError("no microphone support: the PortAudio library is missing (Debian/Ubuntu: apt install "
                            f"libportaudio2); {_USE_WAV}") from None
    return sd


def check_device(kind: str) -> None:
    """Raise EdgespecError (one line, pointing to --wav-in/--wav-out) unless a default ``kind`` ('input' or
    'output') device exists. Called before any model loads."""
    sd = sounddevice()
    try:
        sd.query_devices(kind=kind)
    except (sd.PortAudioError, ValueError) as e:
        raise _device_error("microphone" if kind == "input" else "speaker", e) from None


def _device_error(what: str, e: Exception) -> EdgespecError:
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    return EdgespecError(f"no usable {what} ({msg}); {_USE_WAV}")


def listen(wait_s: float = 10.0, hangover_s: float = 0.6, threshold: float = 0.01,
           max_s: float = MAX_QUESTION_S, on_pause=None, on_resume=None,
           pause_s: float = 0.2) -> tuple[np.ndarray, float]:
    """Record one spoken question from the default input device.

    Returns ``(audio, t_eos)``: float32 (S,) at 16 kHz, and the perf_counter time (s) of the end of speech:
    the end of the last loud frame, ``hangover_s`` before the endpointer decided (so a turn's report counts
    the endpointer's wait as part of the delay the speaker feels). ``on_pause(audio, t_eos)`` is called
    when speech has been followed by ``pause_s`` of quiet (the audio so far, the end of its speech),
    ``on_resume()`` when speech comes again after such a pause (see :class:`~edgespec.voice.live.EagerTurn`).
    Raises NoSpeech when nothing louder than ``threshold`` (RMS) came within ``wait_s``;
    EdgespecError when there is no input device.
    """
    from .live import follow_speech

    sd = sounddevice()
    block = int(SAMPLE_RATE * FRAME_S)
    ep = Endpointer(SAMPLE_RATE, threshold=threshold, hangover_s=hangover_s, wait_s=wait_s, max_s=max_s)

    def blocks(stream):
        while True:
            data, _overflowed = stream.read(block)
            yield data[:, 0].astype(np.float32) / 32768.0

    try:
        with sd.InputStream(samplerate=SAMPLE_RATE, channels=1, dtype="int16", blocksize=block) as stream:
            audio, t_eos = follow_speech(blocks(stream), ep, on_pause, on_resume, pause_s)
    except (sd.PortAudioError, ValueError) as e:
        raise _device_error("microphone", e) from None
    if ep.timed_out:
        raise NoSpeech(f"no speech heard in {wait_s:g} s")
    return audio, t_eos


class SpeakerSink:
    """Plays int16 samples on the default output device as they come (blocking writes, in the TTS thread)."""

    def __init__(self, rate: int):
        sd = sounddevice()
        try:
            self.stream = sd.OutputStream(samplerate=rate, channels=1, dtype="int16", latency="low")
            self.stream.start()
        except (sd.PortAudioError, ValueError) as e:
            raise _device_error("speaker", e) from None
        self.latency_ms = float(self.stream.latency) * 1e3  # PortAudio's output latency: written → heard

    def write(self, s: np.ndarray) -> None:
        self.stream.write(np.ascontiguousarray(s.reshape(-1, 1), dtype=np.int16))

    def close(self) -> None:
        self.stream.stop()
        self.stream.close()
