"""``edgespec voice``: Moonshine ASR, Piper/espeak-ng TTS, the turn pipeline, the CLI and its bad inputs.

The speech models are real (Moonshine base-en from the moonshine-cpp wheel, prepared once into the user cache
by this test run; Piper's en_US joe voice from the voice extra); the LLM is the tiny export of conftest.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import wave

import numpy as np
import pytest

from conftest import user_home
from edgespec.voice.audio import Endpointer, find_speech, read_wav, resample, write_wav
from edgespec.voice.pipeline import split_sentences

BECKETT = "Ever tried ever failed, no matter try again fail again fail better."
SENTENCES = ["What is the capital of France?", "How do I reverse a list in Python?",
             "Tell me a short joke about computers.", "Turn off the lights in the kitchen."]


def words(s: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]", " ", s.lower()).split()


def wer(ref: str, hyp: str) -> tuple[int, int]:
    """(word edits, reference words): Levenshtein distance over words."""
    r, h = words(ref), words(hyp)
    d = list(range(len(h) + 1))
    for i, rw in enumerate(r, 1):
        prev, d[0] = d[0], i
        for j, hw in enumerate(h, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (rw != hw))
    return d[len(h)], len(r)


@pytest.fixture(scope="session")
def asr_dir():
    """Moonshine prepared by the exporter into the user's cache (downloaded and prepared on a fresh machine)."""
    from edgespec.export.voice import prepare_moonshine

    with user_home():
        return prepare_moonshine(progress=False)


@pytest.fixture(scope="session")
def asr(asr_dir):
    from edgespec.voice.asr import MoonshineASR

    return MoonshineASR(asr_dir)


@pytest.fixture(scope="session")
def piper():
    from edgespec.voice.tts import PiperTTS

    return PiperTTS()


@pytest.fixture(scope="session")
def question(piper, tmp_path_factory):
    """The first sentence spoken by Piper, with 0.5 s of silence either side, as a 22,050 Hz WAV."""
    s = piper.synthesize(SENTENCES[0])
    pad = np.zeros(piper.rate // 2, np.int16)
    p = tmp_path_factory.mktemp("voice") / "question.wav"
    write_wav(p, np.concatenate([pad, s, pad]), piper.rate)
    return p


def run(args, home, env_extra=None):
    env = dict(os.environ, EDGESPEC_HOME=str(home), **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "edgespec.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def one_line_error(r, *needles):
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgespec: error: "), r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


# -- speech recognition and synthesis ----------------------------------------------------------------------

def test_moonshine_sample_recording_transcribes_to_its_sentence(asr, asr_dir):
    t = asr.transcribe(read_wav(asr_dir / "beckett.wav"))
    assert words(t.text) == words(BECKETT)
    assert t.rtf > 0 and t.token_ids


def test_piper_speech_is_recognized_with_low_word_error_rate(asr, piper):
    edits = total = 0
    for s in SENTENCES:
        audio = piper.synthesize(s)
        assert audio.dtype == np.int16 and audio.size > piper.rate // 2
        t = asr.transcribe(resample(audio.astype(np.float32) / 32768, piper.rate, 16000))
        e, n = wer(s, t.text)
        edits, total = edits + e, total + n
    assert edits / total <= 0.1


def test_espeak_fallback_speaks(asr):
    from edgespec.voice.tts import EspeakTTS

    tts = EspeakTTS()
    audio = tts.synthesize("Hello world")
    assert audio.dtype == np.int16 and audio.size > tts.rate // 4 and np.abs(audio).max() > 1000


def test_converted_inputs_give_the_same_transcript(asr, question, tmp_path):
    """48 kHz, stereo, 8-bit: read_wav converts; the transcript stays the same."""
    ref = asr.transcribe(read_wav(question)).text
    assert words(ref) == words(SENTENCES[0])
    x = read_wav(question, rate=48000)
    stereo = np.stack([x, 0.5 * x], axis=1)
    u8 = np.clip(np.round(stereo * 127 + 128), 0, 255).astype(np.uint8)
    p = tmp_path / "q8.wav"
    with wave.open(str(p), "wb") as w:
        w.setnchannels(2), w.setsampwidth(1), w.setframerate(48000)
        w.writeframes(u8.tobytes())
    y = read_wav(p)
    assert abs(len(y) - len(read_wav(question))) <= 2
    assert words(asr.transcribe(y).text) == words(SENTENCES[0])


# -- pieces of the pipeline --------------------------------------------------------------------------------

def test_split_sentences_streams_complete_sentences_only():
    done, rest = split_sentences("Paris is the capital. It is in Fr")
    assert done == ["Paris is the capital."] and rest == "It is in Fr"
    done, rest = split_sentences(rest + "ance.", final=True)
    assert done == ["It is in France."] and rest == ""
    long = "word " * 30 + ", and then some more words"
    done, rest = split_sentences(long)
    assert len(done) == 1 and done[0].endswith(",") and rest == "and then some more words"
    assert split_sentences("** ``` ", final=True)[0] == []
    assert split_sentences("To reverse a list, use it", first=True) == (["To reverse a list,"], "use it")
    assert split_sentences("To reverse a list, use it") == ([], "To reverse a list, use it")
    assert split_sentences("Yes, it is", first=True) == ([], "Yes, it is")  # too short a clause
    # phrase: the first chunk may also end before a phrase's first word, once that word is complete
    assert split_sentences("The sky is blue because of", first=True, phrase=True) == (["The sky is blue"],
                                                                                     "because of")
    assert split_sentences("The sky is blue because", first=True, phrase=True) == ([], "The sky is blue because")
    assert split_sentences("The sky is blue because of", first=True) == ([], "The sky is blue because of")
    assert split_sentences("To reverse a list in Python, you", first=True, phrase=True) == (
        ["To reverse a list"], "in Python, you")  # whichever comes first: the phrase or the comma
    assert split_sentences("It is in a box", first=True, phrase=True) == ([], "It is in a box")  # 2 words
    assert split_sentences("The sky is blue because of", phrase=True) == ([], "The sky is blue because of")


def test_find_speech_and_endpointer():
    rate = 16000
    t = np.arange(rate) / rate
    tone = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    x = np.concatenate([np.zeros(rate, np.float32), tone, np.zeros(rate, np.float32)])
    sp = find_speech(x, rate)
    assert sp.found and abs(sp.start - int(0.8 * rate)) < 0.05 * rate and abs(sp.end - int(2.2 * rate)) < 0.05 * rate
    assert not find_speech(np.zeros(rate, np.float32), rate).found
    assert not find_speech(np.random.default_rng(0).normal(0, 1e-3, rate).astype(np.float32), rate).found
    ep = Endpointer(rate, hangover_s=0.3)
    for i in range(0, len(x), 480):
        ep.push(x[i:i + 480])
        if ep.done:
            break
    assert ep.done and not ep.timed_out and abs(i - int(2.3 * rate)) < 0.06 * rate


class _Log:
    """A test double pair: a decoder that streams fixed pieces and a TTS that records what it speaks, both
    writing to one event log, to check the order of decoding and speaking."""

    def __init__(self, pieces, pause=None):
        self.pieces, self.events, self.rate, self.name = pieces, [], 16000, "log"
        self.pause = pause  # (piece index, seconds): the decoder sleeps before yielding that piece
        self.tokenizer = None

    def generate(self, messages, **kw):
        from edgespec.core.stats import GenerationStats

        log, pieces = self, self.pieces

        class Gen:
            stats, text = GenerationStats(new_tokens=len(pieces)), "".join(pieces)

            def __iter__(self):
                for i, p in enumerate(pieces):
                    if log.pause and i == log.pause[0]:
                        time.sleep(log.pause[1])
                    log.events.append(("decode", p))
                    yield p

        log.messages, log.kw = messages, kw
        return Gen()

    def synthesize(self, text):
        self.events.append(("speak", text))
        return np.ones(1600, np.int16)


def test_first_sentence_is_spoken_before_decoding_goes_on(asr, question):
    from edgespec.voice.pipeline import VoiceAssistant, WavSink

    fake = _Log(["Paris", " is the capital.", " It is", " big.", " Yes"])
    va = VoiceAssistant(asr, fake, fake, policy=2)
    r = va.turn(read_wav(question), WavSink())
    assert fake.events == [("decode", "Paris"), ("decode", " is the capital."), ("decode", " It is"),
                           ("speak", "Paris is the capital."), ("decode", " big."), ("decode", " Yes"),
                           ("speak", "It is big."), ("speak", "Yes")]
    assert fake.messages[0]["role"] == "system" and words(fake.messages[-1]["content"]) == words(SENTENCES[0])
    assert r.sentences == 3 and r.answer_audio_s == pytest.approx(3 * 0.1)
    assert r.eos_to_transcript_ms <= r.eos_to_first_token_ms <= r.eos_to_first_audio_ms
    va.turn(read_wav(question), WavSink())  # the conversation is kept: the earlier turn is in the prompt
    assert [m["role"] for m in fake.messages] == ["system", "user", "assistant", "user"]


def test_warm_up_caches_the_system_prompt_and_every_turn_starts_from_it(tiny_export, asr, question, monkeypatch):
    """warm_up prefills the system prompt into both KV caches; a turn then feeds neither model the system
    prompt again, answers as a cold turn does (greedy), reports its stages in order; reset() goes back to it."""
    from edgespec.engine.decoder import SpecDecoder
    from edgespec.voice.pipeline import VOICE_SYSTEM_PROMPT, VoiceAssistant, WavSink
    from edgespec.voice.tts import EspeakTTS

    dec = SpecDecoder.load(tiny_export)
    va = VoiceAssistant(asr, dec, EspeakTTS(), policy=2, max_new_tokens=12)
    audio = read_wav(question)
    cold = va.turn(audio, WavSink())
    va.reset()
    dec.reset()
    va.warm_up()
    n = len(va.prefix)
    q = dec.encode(messages=[{"role": "system", "content": VOICE_SYSTEM_PROMPT}, {"role": "user", "content": "x"}])
    assert 0 < n < len(q) and q[:n] == va.prefix == dec.tokens
    assert dec.tcache.length == dec.dcache.length == n - 1
    starts = []
    for lm in (dec.target, dec.draft):
        def forward(ids, cache, *a, _f=lm.forward, **kw):
            starts.append(cache.length)
            return _f(ids, cache, *a, **kw)
        monkeypatch.setattr(lm, "forward", forward)
    r = va.turn(audio, WavSink())
    assert min(starts) == n - 1
    assert r.answer == cold.answer and r.first_chunk and r.first_chunk_tokens >= 1
    assert r.endpoint_ms >= 0 and r.asr_ms > 0 and r.prefill_ms > 0 and r.first_chunk_tts_ms > 0
    assert r.endpoint_ms + r.asr_ms <= r.eos_to_transcript_ms <= r.eos_to_first_token_ms - r.prefill_ms
    assert r.eos_to_first_token_ms + r.first_chunk_decode_ms + r.first_chunk_tts_ms <= r.eos_to_first_audio_ms
    assert r.audio_out_ms == 0.0
    va.reset()
    assert dec.tokens == va.prefix and dec.tcache.length == dec.dcache.length == n - 1


def test_first_chunk_rule_and_stalls(asr, question):
    """first_chunk picks where the first spoken chunk ends; stall_ms counts the silence when a later chunk is
    not ready by the time the one before it has played out (a 0.1 s chunk, then the decoder sleeps 0.4 s)."""
    from edgespec.voice.pipeline import VoiceAssistant, WavSink

    pieces = ["The sky is blue", " because", " of light", " in the air."]
    audio = read_wav(question)
    for rule, first in (("sentence", "The sky is blue because of light in the air."),
                        ("clause", "The sky is blue because of light in the air."), ("phrase", "The sky is blue")):
        fake = _Log(pieces)
        r = VoiceAssistant(asr, fake, fake, policy=2, first_chunk=rule).turn(audio, WavSink())
        assert r.first_chunk == first and fake.events[-1][0] == "speak"
        assert r.stall_ms == 0.0 if rule != "phrase" else r.stall_ms >= 0.0

    slow = _Log(["Paris is the capital.", " It is", " big."], pause=(2, 0.4))
    r = VoiceAssistant(asr, slow, slow, policy=2).turn(audio, WavSink())
    assert r.sentences == 2 and r.stall_ms >= 300  # 0.1 s of audio, then at least 0.4 s to the next chunk
    with pytest.raises(ValueError):
        VoiceAssistant(asr, slow, slow, first_chunk="word")


def test_speculation_waits_for_the_first_chunk(asr, question):
    """first_chunk_plain (default): the turn's policy holds plain steps until the first chunk is out."""
    from edgespec.control.kpolicy import FixedK, HoldPlain
    from edgespec.voice.pipeline import VoiceAssistant, WavSink

    audio = read_wav(question)
    fake = _Log(["Paris is the capital.", " It is big."])
    held = []
    fake.synthesize = lambda text: held.append(getattr(fake.kw.get("policy"), "held", None)) or np.ones(1600, np.int16)
    VoiceAssistant(asr, fake, fake, policy=2).turn(audio, WavSink())
    policy = fake.kw["policy"]
    assert isinstance(policy, HoldPlain) and isinstance(policy.inner, FixedK) and policy.inner.k == 2
    assert held[:2] == [False, False] and not policy.held  # released once the first chunk was queued
    inner = FixedK(3)
    VoiceAssistant(asr, fake, fake, policy=inner, first_chunk_plain=False).turn(audio, WavSink())
    assert fake.kw["policy"] is inner
    VoiceAssistant(asr, fake, fake, policy=inner, mode="plain").turn(audio, WavSink())
    assert "policy" not in fake.kw and fake.kw["proposers"] == ()


# -- the whole turn, through the command line --------------------------------------------------------------

def test_wav_question_to_spoken_answer(tiny_export, home, asr_dir, question, tmp_path):
    out = tmp_path / "answer.wav"
    r = run(["voice", str(tiny_export), "--wav-in", str(question), "--wav-out", str(out), "--json", "--k", "2",
             "--max-new-tokens", "24", "--asr-dir", str(asr_dir)], home)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert words(rep["transcript"]) == words(SENTENCES[0])
    assert rep["answer"] and rep["new_tokens"] >= 1 and rep["mode"] == "spec" and rep["tts_engine"] == "piper"
    assert 0 < rep["eos_to_transcript_ms"] <= rep["eos_to_first_token_ms"] <= rep["eos_to_first_audio_ms"]
    assert rep["asr_rtf"] > 0 and rep["tts_rtf"] > 0 and 0 <= rep["alpha"] <= 1
    with wave.open(str(out)) as w:
        assert w.getframerate() == 22050 and w.getnchannels() == 1 and w.getnframes() > 2205
        assert rep["answer_audio_s"] == pytest.approx(w.getnframes() / 22050)


# -- bad input: one line, no traceback, no LLM call --------------------------------------------------------

def test_bad_inputs_one_line_each(home, asr_dir, tmp_path):
    nope = str(tmp_path / "no-export")  # any LLM load would fail with a different message
    (tmp_path / "text.wav").write_text("hello")
    one_line_error(run(["voice", nope, "--wav-in", str(tmp_path / "text.wav")], home), "not a PCM WAV")
    write_wav(tmp_path / "empty.wav", np.zeros(0, np.int16), 16000)
    one_line_error(run(["voice", nope, "--wav-in", str(tmp_path / "empty.wav")], home), "no speech")
    write_wav(tmp_path / "silent.wav", np.zeros(48000, np.int16), 16000)
    one_line_error(run(["voice", nope, "--wav-in", str(tmp_path / "silent.wav")], home), "no speech",
                   "nothing was sent to the model")
    with wave.open(str(tmp_path / "long.wav"), "wb") as w:  # 10 minutes, 8 kHz 8-bit
        w.setnchannels(1), w.setsampwidth(1), w.setframerate(8000)
        w.writeframes(bytes([128]) * 8000 * 600)
    one_line_error(run(["voice", nope, "--wav-in", str(tmp_path / "long.wav")], home), "600.0 s", "at most 30 s")
    one_line_error(run(["voice", nope, "--wav-in", str(tmp_path / "missing.wav")], home), "no such file")
    one_line_error(run(["voice", "--bench", str(tmp_path / "nodir")], home), "not a directory")
    one_line_error(run(["voice", "--say", "hi", "--wav-out", str(tmp_path / "x" / "y.wav")], home),
                   "no such directory for --wav-out")
    bad_voice = tmp_path / "bad.onnx"
    bad_voice.write_bytes(b"\0" * 100)
    (tmp_path / "bad.onnx.json").write_text("{}")
    one_line_error(run(["voice", "--say", "hi", "--wav-out", str(tmp_path / "a.wav"), "--voice-model",
                        str(bad_voice)], home), str(bad_voice), "not a usable Piper voice")
    one_line_error(run(["voice", "--say", "hi", "--wav-out", str(tmp_path / "a.wav"), "--voice-model",
                        str(tmp_path / "none.onnx")], home), "none.onnx", "missing")
    assert not (tmp_path / "a.wav").exists()


def test_corrupt_speech_model_names_the_file(home, asr_dir, question, tmp_path):
    import shutil

    bad = tmp_path / "moonshine"
    shutil.copytree(asr_dir, bad)
    with open(bad / "decoder.onnx", "r+b") as f:
        f.seek(1000)
        f.write(b"\xff" * 16)
    args = ["voice", str(tmp_path / "x"), "--wav-in", str(question), "--wav-out", str(tmp_path / "a.wav"),
            "--asr-dir", str(bad)]
    one_line_error(run(args, home), str(bad / "decoder.onnx"), "corrupt", "edgespec export --voice")
    (bad / "moonshine.json").unlink()
    one_line_error(run(args, home), "moonshine.json", "missing")
    assert not (tmp_path / "a.wav").exists()


def test_voice_extra_missing_names_the_extra(home, tmp_path):
    block = tmp_path / "block"
    block.mkdir()
    for mod in ("piper", "espeakng_loader", "sounddevice"):  # shadow the installed packages with failing ones
        (block / f"{mod}.py").write_text("raise ImportError('blocked by the test')\n")
    r = run(["voice", "--say", "hi", "--wav-out", str(tmp_path / "a.wav")], home,
            {"PYTHONPATH": str(block) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    one_line_error(r, "not installed", "[voice]")
    r = run(["voice", "--say", "hi", "--tts", "espeak", "--wav-out", str(tmp_path / "a.wav")], home,
            {"PYTHONPATH": str(block) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    one_line_error(r, "espeakng-loader", "[voice]")
    r = run(["voice", str(tmp_path / "no-export")], home,
            {"PYTHONPATH": str(block) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    one_line_error(r, "no microphone support", "sounddevice is not installed", "--wav-in")
    assert not (tmp_path / "a.wav").exists()


def test_runtime_imports_without_the_voice_extra(tmp_path):
    """The Apache-2.0 runtime (edgespec and edgespec.voice) never imports the GPL engines at import time."""
    code = ("import sys, edgespec, edgespec.voice, edgespec.cli; edgespec.cli.build_parser(); "
            "bad = [m for m in ('piper', 'espeakng_loader', 'sounddevice') if m in sys.modules]; "
            "assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


# -- the real pair (pytest --real-pair) ---------------------------------------------------------------------

@pytest.mark.real
def test_real_pair_answers_a_spoken_question_losslessly(asr, piper, question):
    """Greedy: the speculative answer equals the plain one, and it is spoken; Paris is named."""
    from edgespec.io import paths
    from edgespec.engine.decoder import SpecDecoder
    from edgespec.voice.pipeline import VoiceAssistant, WavSink
    from edgespec.export import export_pair

    with user_home():
        d = paths.default_export_dir()
        if not (d / "edgespec.json").is_file():
            export_pair(None, None, profile="auto")
    va = VoiceAssistant(asr, SpecDecoder.load(d), piper, policy=3, max_new_tokens=48, first_chunk_plain=False)
    reports = {}
    for mode in ("spec", "plain"):
        va.reset()
        sink = WavSink()
        reports[mode] = va.turn(read_wav(question), sink, mode=mode)
        assert sink.samples().size / piper.rate == pytest.approx(reports[mode].answer_audio_s)
        assert reports[mode].answer_audio_s > 0.5
    assert reports["spec"].answer == reports["plain"].answer
    assert "paris" in words(reports["spec"].answer)
    assert reports["spec"].alpha is not None and reports["plain"].alpha is None
