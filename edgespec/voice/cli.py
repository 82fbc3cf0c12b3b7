"""``edgespec voice``: the command (arguments, loading, the hands-free loop, ``--bench``).

Bad input ends as one line (EdgespecError → the main CLI prints it): the input is read and checked for
speech before any model is loaded, so a silent or broken WAV never reaches the LLM.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..engine import flags

MODES = ("spec", "plain")
DEFAULT_BUDGET_MS = 250.0


def add_voice_parser(sub) -> None:
    """Add the ``voice`` subcommand to the CLI's subparsers."""
    p = sub.add_parser("voice", help="offline voice assistant: speech in → speculative answer → speech out")
    p.add_argument("dir", nargs="?", help="export directory (default: the default pair in the user cache)")
    p.add_argument("--wav-in", help="answer the question spoken in this WAV file instead of the microphone")
    p.add_argument("--wav-out", help="write the spoken answer to this WAV file instead of the speaker")
    p.add_argument("--say", help="text to speech only: speak TEXT (to --wav-out or the speaker) and exit")
    p.add_argument("--bench", metavar="DIR_OF_WAVS",
                   help="median latencies over the spoken questions in DIR, speculation on and off in one run")
    p.add_argument("--json", action="store_true", help="print the turn report (or the bench result) as JSON")
    p.add_argument("--mode", choices=MODES, default="spec", help="spec: draft + target (default); plain: target only")
    p.add_argument("--k", type=flags.nonneg_int, default=None,
                   help="fixed draft length K (default: adaptive K within --latency-budget-ms)")
    p.add_argument("--latency-budget-ms", type=flags.checked(float, "milliseconds > 0", lambda v: v > 0),
                   default=DEFAULT_BUDGET_MS, help="adaptive K keeps each round under this (default %(default)g)")
    p.add_argument("--max-new-tokens", type=flags.pos_int, default=96)
    p.add_argument("--temperature", type=flags.checked(float, "a number ≥ 0", lambda v: v >= 0), default=0.0)
    p.add_argument("--seed", type=flags.integer, default=None)
    p.add_argument("--first-chunk", choices=("sentence", "clause", "phrase"), default="phrase",
                   help="where the first spoken chunk may end: a sentence, also a comma (clause), or also before "
                        "a phrase's first word such as 'because' or 'in' (phrase, default)")
    p.add_argument("--system", default=None, help="system prompt (default: answer in one or two short sentences)")
    p.add_argument("--tts", choices=("auto", "piper", "espeak"), default="auto",
                   help="text-to-speech engine (auto: Piper, else espeak-ng)")
    p.add_argument("--voice-model", help="a Piper voice .onnx (its .onnx.json next to it); default: en_US joe")
    p.add_argument("--asr-dir", help="prepared Moonshine directory (default: the user cache; edgespec export --voice)")
    p.add_argument("--provider", default="cpu", help="execution provider of the LLM (default cpu)")
    p.add_argument("--provider-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the LLM's execution provider, e.g. backend_path=libQnnHtp.so (repeatable)")
    p.add_argument("--threads", type=flags.pos_int, default=None)
    p.add_argument("--turns", type=flags.pos_int, default=None,
                   help="microphone: stop after this many answered questions (default: until Ctrl-C)")
    p.add_argument("--out", help="--bench: also write the JSON result to this file")
    p.add_argument("--eager-ms", type=flags.checked(float, "milliseconds ≥ 30", lambda v: v >= 30), default=100.0,
                   help="microphone: start answering after this much quiet, before the end of speech is confirmed "
                        "(0.6 s); nothing is played until then (default %(default)g)")
    p.add_argument("--live", action="store_true",
                   help="--bench: also replay each question in real time through the endpointer, as from a "
                        "microphone, with eager turns and without (end of speech → first audio then includes "
                        "the endpointer's wait)")


def load_asr(asr_dir: str | None, threads: int | None = None):
    """The prepared Moonshine model; the default cache entry is prepared (or rebuilt) when the exporter is
    installed. Raises EdgespecError naming the missing/corrupt file otherwise."""
    from ..errors import EdgespecError
    from .asr import MoonshineASR

    try:
        return MoonshineASR(asr_dir, threads=threads)
    except EdgespecError as e:
        if asr_dir is not None:
            raise
        try:
            from edgespec.export.voice import prepare_moonshine
        except ImportError:
            raise e from None
        prepare_moonshine()
        return MoonshineASR(None, threads=threads)


def _question_wavs(d: str) -> list[Path]:
    from ..errors import EdgespecError

    p = Path(d)
    if not p.is_dir():
        raise EdgespecError(f"{p}: not a directory of WAV files")
    wavs = sorted(p.glob("*.wav"))
    if not wavs:
        raise EdgespecError(f"{p}: no .wav files in it")
    return wavs


def _check_out(path: str | None, flag: str) -> None:
    """Before anything loads: ``path`` can be written (:func:`~edgespec.io.paths.check_out`)."""
    from ..io.paths import check_out

    if path is not None:
        check_out(Path(path), flag)


def _policy(a, decoder):
    """The fixed K of ``--k`` (an int), else an adaptive controller within ``--latency-budget-ms``
    (:func:`~edgespec.engine.presets.k_policy`; no controller memory: each voice session starts cold, with the
    voice use's answer-length prior)."""
    if a.k is not None:
        return a.k
    from ..engine.presets import k_policy

    return k_policy(decoder, None, a.latency_budget_ms, use="voice")


def run_voice(a, export_dir) -> int:
    """Run ``edgespec voice`` with parsed arguments ``a``; ``export_dir(arg, auto_export)`` resolves the export."""
    from ..errors import EdgespecError
    from .audio import find_speech, read_wav, write_wav
    from .pipeline import VOICE_SYSTEM_PROMPT, NoSpeech, VoiceAssistant, WavSink
    from .tts import load_tts

    from ..io.onnx_model import parse_provider_options

    modes_given = sum(x is not None for x in (a.say, a.bench, a.wav_in))
    if modes_given > 1:
        raise EdgespecError("give one of --say, --bench and --wav-in")
    provider_options = parse_provider_options(a.provider_option)  # a malformed one is said before any loading
    _check_out(a.wav_out, "--wav-out")
    _check_out(a.out, "--out")
    wavs = _question_wavs(a.bench) if a.bench else None
    question = None
    if a.wav_in is not None:  # read and check before loading any model
        question = read_wav(a.wav_in)
        if not find_speech(question, 16000).found:
            raise NoSpeech(f"{a.wav_in}: no speech in the recording (silent or too quiet); nothing was sent to the model")
    if wavs is None:  # no sound device support: one line pointing to --wav-in/--wav-out, before models load
        from .devices import check_device

        if a.wav_in is None and a.say is None:
            check_device("input")
        if a.wav_out is None:
            check_device("output")
    tts = load_tts(a.tts, a.voice_model)
    if a.say is not None:
        from .tts import speakable

        if not speakable(a.say):
            raise EdgespecError("--say needs some text")
        s = tts.synthesize(speakable(a.say))
        _emit(s, tts.rate, a.wav_out, write_wav)
        return 0
    asr = load_asr(a.asr_dir, a.threads)
    from ..engine.decoder import SpecDecoder

    d = export_dir(a.dir, True)
    dec = SpecDecoder.load(d, provider=a.provider, threads=a.threads, load_draft=a.mode == "spec" or bool(wavs),
                           shared_thread_pool=True, provider_options=provider_options)
    va = VoiceAssistant(asr, dec, tts, _policy(a, dec), a.mode,
                        VOICE_SYSTEM_PROMPT if a.system is None else a.system, a.max_new_tokens, a.temperature,
                        a.seed, first_chunk=a.first_chunk)
    va.warm_up()  # every session run once, the system prompt in both KV caches: the first turn pays neither
    if wavs is not None:
        from .bench import run_voice_bench

        return run_voice_bench(va, wavs, a, format_turn)
    if question is not None:
        sink = WavSink()
        report = va.turn(question, sink)
        _emit(sink.samples(), tts.rate, a.wav_out, write_wav)
        _print_turn(report, a.json)
        return 0
    return _loop(va, a)


def _emit(samples, rate, wav_out, write_wav) -> None:
    if wav_out is not None:
        write_wav(wav_out, samples, rate)
        return
    from .devices import SpeakerSink

    sink = SpeakerSink(rate)
    sink.write(samples)
    sink.close()


def _print_turn(r, as_json: bool) -> None:
    if as_json:
        print(json.dumps(r.to_dict()))
        return
    print(f"you: {r.transcript}")
    print(f"assistant: {r.answer}")
    print(format_turn(r), file=sys.stderr)


def format_turn(r) -> str:
    """One line: the latencies a listener feels, then the rates."""
    f = lambda v: "—" if v is None else f"{v:.0f} ms"  # noqa: E731
    alpha = "" if r.alpha is None else f", alpha {r.alpha:.2f}"
    tts = "—" if r.tts_rtf is None else f"{r.tts_rtf:.3f}"
    return (f"[end of speech → transcript {f(r.eos_to_transcript_ms)}, → first token {f(r.eos_to_first_token_ms)}, "
            f"→ first audio {f(r.eos_to_first_audio_ms)}; ASR RTF {r.asr_rtf:.3f}, TTS RTF {tts} ({r.tts_engine}); "
            f"{r.new_tokens} tokens, {r.decode_tok_s:.1f} tok/s{alpha}; {r.mode}; stages: detection "
            f"{f(r.endpoint_ms)}, ASR {f(r.asr_ms)}, prefill {f(r.prefill_ms)}, first chunk "
            f"{r.first_chunk_tokens} tokens {f(r.first_chunk_decode_ms)}, its TTS {f(r.first_chunk_tts_ms)}, "
            f"out {f(r.audio_out_ms)}]")


def _loop(va, a) -> int:
    from .devices import SpeakerSink, listen
    from .live import EagerTurn
    from .pipeline import NoSpeech

    print("edgespec voice: listening (speak a question; Ctrl-C to quit)", file=sys.stderr)
    answered = 0
    eager = EagerTurn(va)  # answers during the endpointer's wait for silence, speaks after it
    while a.turns is None or answered < a.turns:
        try:
            audio, t_eos = listen(on_pause=eager.start, on_resume=eager.cancel, pause_s=a.eager_ms / 1e3)
        except NoSpeech:
            eager.cancel()
            continue
        sink = SpeakerSink(va.tts.rate)
        try:
            report = eager.finish(audio, t_eos, sink)
        except NoSpeech as e:
            print(f"edgespec: {e}", file=sys.stderr)
            continue
        finally:
            sink.close()
        _print_turn(report, a.json)
        answered += 1
    return 0
