"""``edgespec voice``: an offline voice assistant on the speculative runtime (speech in → answer → speech out).

Speech recognition (Moonshine base-en, MIT) runs on onnxruntime like the rest of the runtime. Text to speech
(Piper, espeak-ng) and the sound devices (sounddevice/PortAudio) come only with the optional extra
``edgespec[voice]``: Piper and espeak-ng are GPL and are imported only by :mod:`edgespec.voice.tts` when
speech output is asked for, so the Apache-2.0 runtime (this package included) imports without them.
"""

from .asr import MoonshineASR, Transcript
from .pipeline import VOICE_SYSTEM_PROMPT, NoSpeech, TurnReport, VoiceAssistant, WavSink

__all__ = ["MoonshineASR", "NoSpeech", "Transcript", "TurnReport", "VOICE_SYSTEM_PROMPT", "VoiceAssistant", "WavSink"]
