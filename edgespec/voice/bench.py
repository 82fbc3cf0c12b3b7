"""``edgespec voice --bench``: medians over spoken questions, speculation on and off, in one run.

Each question (a WAV file) is answered in every mode, order alternating per question, the conversation reset to
the cached system prompt before each turn so every mode answers the same prompt from the same cache. ``wav``
turns start at the end of the file (no endpointing wait); with ``--live`` each question is also replayed in
real time, followed by silence, through the microphone's endpointer (:func:`~edgespec.voice.live.follow_speech`),
once with eager turns (:class:`~edgespec.voice.live.EagerTurn`) and once without, so end of speech → first
audio includes what a speaker at a microphone waits for.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from ..io.paths import write_json

MODES = ("spec", "plain")
# the stages of end of speech → first audio, in order (TurnReport fields, ms)
STAGES = ("endpoint_ms", "asr_ms", "prefill_ms", "first_chunk_decode_ms", "first_chunk_tts_ms", "audio_out_ms")
KEYS = ("eos_to_transcript_ms", "eos_to_first_token_ms", "eos_to_first_audio_ms", "asr_rtf", "tts_rtf",
        "decode_tok_s", "alpha", "new_tokens") + STAGES + ("first_chunk_tokens", "stall_ms")
TRAILING_SILENCE_S = 1.5  # after a live question: the endpointer needs 0.6 s of it


def _median(xs):
    xs = [x for x in xs if x is not None]
    return float(np.median(xs)) if xs else None


def live_turn(va, audio: np.ndarray, mode: str, eager: bool, pause_s: float = 0.2):
    """One turn on ``audio`` (float32 (S,), 16 kHz) replayed in real time, then silence, through the
    microphone's endpointer; with ``eager`` the turn starts after ``pause_s`` of quiet. Returns the TurnReport."""
    from .audio import Endpointer
    from .live import EagerTurn, follow_speech, paced_blocks
    from .pipeline import WavSink

    x = np.concatenate([audio, np.zeros(int(TRAILING_SILENCE_S * 16000), np.float32)])
    et = EagerTurn(va, mode=mode)
    hooks = (et.start, et.cancel) if eager else (None, None)
    audio, t_eos = follow_speech(paced_blocks(x), Endpointer(16000), *hooks, pause_s=pause_s)
    return et.finish(audio, t_eos, WavSink())


def run_voice_bench(va, wavs: list[Path], a, format_turn) -> int:
    """Run the benchmark (arguments ``a``: json, out, live, eager_ms) on ``va`` after its warm-up; prints and writes it."""
    from .audio import read_wav
    from .pipeline import NoSpeech, WavSink

    questions = [(p.name, read_wav(p)) for p in wavs]
    for mode in MODES:  # warm-up, not counted: first runs of every session
        va.reset()
        try:
            va.turn(questions[0][1], WavSink(), mode=mode)
        except NoSpeech:
            pass
    kinds = ("wav", "live", "live, not eager") if a.live else ("wav",)
    turns = []
    for i, (name, audio) in enumerate(questions):
        for kind in kinds:
            for mode in (MODES if i % 2 == 0 else MODES[::-1]):
                va.reset()
                try:
                    r = va.turn(audio, WavSink(), mode=mode) if kind == "wav" else \
                        live_turn(va, audio, mode, eager=kind == "live", pause_s=a.eager_ms / 1e3)
                except NoSpeech as e:
                    print(f"edgespec: {name}: {e}; skipped", file=sys.stderr)
                    continue
                key = mode if kind == "wav" else f"{mode} {kind}"
                turns.append({"question": name, "kind": kind, "key": key, **r.to_dict()})
                if not a.json:
                    print(f"{name} {key}: {format_turn(r)}", file=sys.stderr)
    keys = [m if k == "wav" else f"{m} {k}" for k in kinds for m in MODES]
    summary = {m: {k: _median([t[k] for t in turns if t["key"] == m]) for k in KEYS} for m in keys}
    on, off = summary["spec"]["eos_to_first_audio_ms"], summary["plain"]["eos_to_first_audio_ms"]
    result = {"command": "edgespec " + " ".join(sys.argv[1:]), "questions": len(questions),
              "first_chunk": va.first_chunk, "eager_ms": a.eager_ms if a.live else None, "tts_engine": va.tts.name, "summary": summary, "turns": turns,
              "first_audio_spec_over_plain": (on / off) if on and off else None}
    if a.out:
        write_json(Path(a.out).expanduser(), result)  # checked before loading (voice/cli.py)
    print(json.dumps(result) if a.json else format_bench(result))
    return 0


def format_bench(result: dict) -> str:
    """Markdown tables of the medians, one row per mode: the latencies, then the stages of the first audio."""
    rows = ["| mode | end of speech → transcript ms | → first token ms | → first audio ms | ASR RTF | TTS RTF "
            "| decode tok/s | alpha |", "|---|---|---|---|---|---|---|---|"]
    f = lambda v, p=0: "—" if v is None else f"{v:.{p}f}"  # noqa: E731
    for m, s in result["summary"].items():
        rows.append(f"| {m} | {f(s['eos_to_transcript_ms'])} | {f(s['eos_to_first_token_ms'])} | "
                    f"{f(s['eos_to_first_audio_ms'])} | {f(s['asr_rtf'], 3)} | {f(s['tts_rtf'], 3)} | "
                    f"{f(s['decode_tok_s'], 1)} | {f(s['alpha'], 2)} |")
    rows += ["", "| mode | end-of-speech detection ms | ASR ms | prefill ms | first chunk decode ms (tokens) "
             "| first chunk TTS ms | audio out ms | stalls after ms |", "|---|---|---|---|---|---|---|---|"]
    for m, s in result["summary"].items():
        rows.append(f"| {m} | {f(s['endpoint_ms'])} | {f(s['asr_ms'])} | {f(s['prefill_ms'])} | "
                    f"{f(s['first_chunk_decode_ms'])} ({f(s['first_chunk_tokens'])}) | "
                    f"{f(s['first_chunk_tts_ms'])} | {f(s['audio_out_ms'])} | {f(s['stall_ms'])} |")
    r = result["first_audio_spec_over_plain"]
    rows.append(f"\n{result['questions']} questions, TTS {result['tts_engine']}; median first audio spec/plain: "
                f"{'—' if r is None else f'{r:.2f}×'}")
    return "\n".join(rows)
