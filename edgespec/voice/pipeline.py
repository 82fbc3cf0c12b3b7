"""One voice turn: question audio → end of speech → transcript → speculative answer → spoken sentences.

The answer streams out of ``SpecDecoder.generate`` on the calling thread; each complete sentence goes to a
text-to-speech thread at once, so the first sentence is being synthesized (and played) while the decoder
still works on the rest. onnxruntime releases the GIL, so the two overlap on separate cores.

All latencies of a :class:`TurnReport` are measured from the end of speech (``t_eos``, perf_counter s): for
a live microphone the moment the endpointer heard the speaker stop, for a WAV file the moment it was read.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import EdgespecError
from ..engine.generation import GenerationOptions
from ..engine.presets import mode_proposers
from ..control.kpolicy import FixedK, HoldPlain
from .asr import SAMPLE_RATE
from .audio import find_speech
from .tts import speakable, timed_synthesize

VOICE_SYSTEM_PROMPT = ("You are a voice assistant. Answer in one or two short spoken sentences of plain words: "
                       "no lists, no code, no Markdown.")
_BOUNDARY = re.compile(r"(?<=[.!?;:])\s+|\n+")
LONG_CLAUSE_CHARS = 120  # a clause longer than this is spoken up to its last comma
FIRST_CLAUSE_WORDS = 4  # the answer's first chunk may end at a comma (or a phrase) once it has this many words
# words that open a phrase (conjunctions, relatives, prepositions): the first chunk may end before one of them
PHRASE_OPENERS = frozenset(
    "and but or because so that which who whose where when while if unless although though since like with "
    "without in on at for from by into through using".split())
FIRST_CHUNKS = ("sentence", "clause", "phrase")


class NoSpeech(EdgespecError):
    """The recording holds no speech (silent, too quiet, or nothing recognized); the LLM is not called."""


class Cancelled(Exception):
    """A turn stopped because its ``cancel`` event was set (an eager turn whose speaker went on talking)."""


def _first_cut(buf: str, phrase: bool) -> tuple[int, int] | None:
    """Where the answer's first chunk may end early, as (end of the chunk, start of the rest) in ``buf``: after
    a comma, or (``phrase``) before a complete word of :data:`PHRASE_OPENERS`, whichever comes first once
    :data:`FIRST_CLAUSE_WORDS` words precede it; None if neither."""
    for i, m in enumerate(re.finditer(r"\S+", buf)):
        if i >= FIRST_CLAUSE_WORDS and phrase and m.end() < len(buf) and m.group().lower() in PHRASE_OPENERS:
            return m.start(), m.start()
        if m.group().endswith(",") and m.end() < len(buf) and i + 1 >= FIRST_CLAUSE_WORDS:
            return m.end(), m.end()
    return None


def split_sentences(buf: str, final: bool = False, first: bool = False,
                    phrase: bool = False) -> tuple[list[str], str]:
    """Complete sentences at the front of ``buf`` and the unfinished rest. A sentence ends at . ! ? ; : followed
    by whitespace, or a newline; a clause over :data:`LONG_CLAUSE_CHARS` characters ends at its last comma.
    ``first`` (nothing of the answer spoken yet): a comma after :data:`FIRST_CLAUSE_WORDS` words also ends
    the chunk, and with ``phrase`` so does the start of a phrase (``The sky is blue | because ...``), so that
    the first sound does not wait for a long first sentence. ``final`` flushes the rest."""
    out = []
    while True:
        m = _BOUNDARY.search(buf)
        if m is None:
            break
        out.append(buf[:m.start()])
        buf = buf[m.end():]
    if first and not out:
        cut = _first_cut(buf, phrase)
        if cut is not None:
            out.append(buf[:cut[0]])
            buf = buf[cut[1]:].lstrip()
    if len(buf) > LONG_CLAUSE_CHARS and ", " in buf:
        cut = buf.rindex(", ") + 1
        out.append(buf[:cut])
        buf = buf[cut + 1:]
    if final:
        out.append(buf)
        buf = ""
    return [s.strip() for s in out if speakable(s)], buf


@dataclass
class TurnReport:
    """What one turn took. Times in ms from the end of speech; rtf = compute time / audio time."""

    transcript: str
    answer: str
    mode: str
    question_s: float
    eos_to_transcript_ms: float
    eos_to_first_token_ms: float | None
    eos_to_first_audio_ms: float | None
    asr_rtf: float
    tts_rtf: float | None
    answer_audio_s: float
    decode_tok_s: float
    new_tokens: int
    alpha: float | None
    sentences: int
    tts_engine: str
    prefill_ms: float = 0.0
    # where the delay to the first sound goes, in order (ms): end-of-speech detection (WAV: finding the
    # speech; microphone: the endpointer's wait for silence), speech recognition, the LLM's prefill, decoding
    # the rest of the first chunk after its first token, synthesizing the first chunk, the sink's output latency
    endpoint_ms: float = 0.0
    asr_ms: float = 0.0
    first_chunk_decode_ms: float | None = None
    first_chunk_tts_ms: float | None = None
    audio_out_ms: float = 0.0
    first_chunk: str = ""
    first_chunk_tokens: int = 0
    stall_ms: float = 0.0  # silence inside the answer: chunks not ready when the one before finished playing
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


class _Speaker(threading.Thread):
    """TTS worker: synthesizes queued sentences in order and hands the samples to ``sink.write``."""

    def __init__(self, tts, sink, cancel: threading.Event | None = None):
        super().__init__(daemon=True)
        self.tts, self.sink, self.cancel = tts, sink, cancel  # cancel set: skip what is still queued
        self.q: queue.Queue = queue.Queue()
        self.first_audio: float | None = None
        self.first_done = threading.Event()  # the first sentence is synthesized (or came out empty, or failed)
        self.tts_ms, self.samples, self.error = 0.0, 0, None
        self.first_tts_ms: float | None = None  # synthesis of the chunk that made the first sound
        self.play_end: float | None = None  # when the audio so far has played out (real-time playback)
        self.stall_s = 0.0

    def run(self):
        while (text := self.q.get()) is not None:
            if self.error is not None or (self.cancel is not None and self.cancel.is_set()):
                continue
            try:
                s, ms = timed_synthesize(self.tts, speakable(text))
                self.tts_ms += ms
                if s.size:
                    now = time.perf_counter()
                    if self.first_audio is None:
                        self.first_audio, self.first_tts_ms = now, ms
                    start = now if self.play_end is None else max(now, self.play_end)
                    self.stall_s += start - (self.play_end or start)
                    self.play_end = start + s.size / self.tts.rate
                    self.samples += s.size
                    self.first_done.set()
                    self.sink.write(s)
            except Exception as e:  # reported on the calling thread
                self.error = e
            finally:
                self.first_done.set()
        self.first_done.set()


class VoiceAssistant:
    """ASR + speculative decoder + TTS, with one K controller and the conversation kept across turns."""

    def __init__(self, asr, decoder, tts, policy=None, mode: str = "spec", system: str = VOICE_SYSTEM_PROMPT,
                 max_new_tokens: int = 96, temperature: float = 0.0, seed: int | None = None,
                 history_turns: int = 4, first_sentence_first: bool = True, first_chunk: str = "phrase",
                 first_chunk_plain: bool = True):
        """``mode``: ``spec`` (the draft model proposes) or ``plain`` (the target alone). ``policy``: a K policy
        (e.g. :class:`~edgespec.control.adaptive.AdaptiveK` with a latency budget) or a fixed int K.
        ``history_turns`` earlier question/answer pairs are kept.
        ``first_sentence_first``: the decoder waits while the first sentence is synthesized (on a 2-core CPU
        the two would share the cores and delay the first sound); it resumes while that sentence plays.
        ``first_chunk``: where the first spoken chunk may end (:data:`FIRST_CHUNKS`): ``sentence``, ``clause``
        (also a comma) or ``phrase`` (also before a phrase's first word; see :func:`split_sentences`).
        ``first_chunk_plain``: speculation decodes the first chunk with plain steps and ``policy`` (None: the
        default K) plans only after it (:class:`~edgespec.control.kpolicy.HoldPlain`; measured on the real pair,
        ``docs/benchmarks.md``: drafting in the first chunk made the first sound later, never earlier).

        Raises ValueError: an unknown ``first_chunk``."""
        if first_chunk not in FIRST_CHUNKS:
            raise ValueError(f"first_chunk must be one of {', '.join(FIRST_CHUNKS)}, got {first_chunk!r}")
        self.first_chunk, self.first_chunk_plain = first_chunk, first_chunk_plain
        self.asr, self.decoder, self.tts, self.policy = asr, decoder, tts, policy
        self.mode, self.system, self.max_new_tokens = mode, system, max_new_tokens
        self.temperature, self.seed, self.history_turns = temperature, seed, history_turns
        self.first_sentence_first = first_sentence_first
        self.history: list[dict] = []
        self.prefix: list[int] | None = None  # the system prompt's ids, cached by warm_up()

    def system_prefix(self) -> list[int]:
        """Token ids every turn's prompt starts with: the chat template's rendering of the system prompt (the
        common prefix of two renderings with different questions)."""
        sys_msg = [{"role": "system", "content": self.system}] if self.system else []
        a, b = (self.decoder.encode(messages=sys_msg + [{"role": "user", "content": q}]) for q in ("a", "b"))
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return a[:n]

    def warm_up(self) -> float:
        """Before the first turn: run every session once (speech recognition, text to speech, target and
        draft at one and several rows) and prefill the system prompt into both KV caches
        (:meth:`SpecDecoder.cache_prefix`), so that a turn pays only for its question. Returns the ms taken."""
        t0 = time.perf_counter()
        rng = np.random.default_rng(0)
        self.asr.transcribe((0.01 * rng.standard_normal(SAMPLE_RATE)).astype(np.float32))
        self.tts.synthesize("Hello.")
        self.prefix = self.system_prefix()
        if self.prefix:
            msgs = ([{"role": "system", "content": self.system}] if self.system else [])
            msgs = msgs + [{"role": "user", "content": "Hello."}]
            proposers = ("draft",) if self.decoder.draft is not None else ()
            for _ in self.decoder.generate(messages=msgs, proposers=proposers, policy=FixedK(2),
                                           max_new_tokens=4, temperature=0.0):
                pass
            self.decoder.cache_prefix(self.prefix)
        return (time.perf_counter() - t0) * 1e3

    def reset(self) -> None:
        """Forget the conversation (after warm_up(): the caches go back to the system prompt)."""
        self.history = []
        if self.prefix:
            self.decoder.cache_prefix(self.prefix)

    def turn(self, audio: np.ndarray, sink, t_eos: float | None = None, mode: str | None = None,
             cancel: threading.Event | None = None) -> TurnReport:
        """Answer one spoken question: 16 kHz mono float32 (S,) → spoken answer written to ``sink``.

        ``cancel`` (set from another thread) stops the turn at its next step; the conversation is not changed.

        Raises:
            NoSpeech: silence or nothing recognized (nothing is sent to the LLM, the sink gets nothing).
            Cancelled: ``cancel`` was set.
        """
        t_eos = time.perf_counter() if t_eos is None else t_eos
        mode = mode or self.mode
        sp = find_speech(audio, SAMPLE_RATE)
        if not sp.found:
            raise NoSpeech("no speech in the recording (silent or too quiet); nothing was sent to the model")
        t_asr = time.perf_counter()
        tr = self.asr.transcribe(audio[sp.start:sp.end])
        t_transcript = time.perf_counter()
        if not tr.text.strip():
            raise NoSpeech("no words recognized in the recording; nothing was sent to the model")
        if cancel is not None and cancel.is_set():
            raise Cancelled("the turn was cancelled")
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + self.history
        messages = messages + [{"role": "user", "content": tr.text}]
        kw = dict(max_new_tokens=self.max_new_tokens, temperature=self.temperature, seed=self.seed)
        policy = self.policy if self.policy is not None else GenerationOptions().k
        policy = FixedK(policy) if isinstance(policy, int) else policy
        hold = HoldPlain(policy) if self.first_chunk_plain and mode != "plain" else None
        proposers = mode_proposers("plain" if mode == "plain" else "spec", lookup=False)  # () or the draft chain
        if mode == "plain":
            gen = self.decoder.generate(messages=messages, proposers=proposers, **kw)
        else:
            gen = self.decoder.generate(messages=messages, proposers=proposers, policy=hold or policy, **kw)
        speaker = _Speaker(self.tts, sink, cancel)
        speaker.start()
        t_first_token, t_first_chunk, first_chunk, first_tokens, buf, n_sent = None, None, "", 0, "", 0
        try:
            for piece in gen:
                if cancel is not None and cancel.is_set():
                    break
                if t_first_token is None:
                    t_first_token = time.perf_counter()
                sentences, buf = split_sentences(buf + piece, first=n_sent == 0 and self.first_chunk != "sentence",
                                                 phrase=self.first_chunk == "phrase")
                if sentences and n_sent == 0:
                    t_first_chunk, first_chunk, first_tokens = time.perf_counter(), sentences[0], gen.stats.new_tokens
                    if hold is not None:
                        hold.release()
                for s in sentences:
                    speaker.q.put(s)
                    n_sent += 1
                if sentences and n_sent == len(sentences) and self.first_sentence_first:
                    speaker.first_done.wait()
            sentences, _ = split_sentences(buf, final=True) if not (cancel and cancel.is_set()) else ([], "")
            if sentences and n_sent == 0:
                t_first_chunk, first_chunk, first_tokens = time.perf_counter(), sentences[0], gen.stats.new_tokens
            for s in sentences:
                speaker.q.put(s)
                n_sent += 1
        finally:
            speaker.q.put(None)
            speaker.join()
        if speaker.error is not None:
            raise EdgespecError(f"text to speech failed: {speaker.error}")
        if cancel is not None and cancel.is_set():
            raise Cancelled("the turn was cancelled")
        self.history = (self.history + [{"role": "user", "content": tr.text},
                                        {"role": "assistant", "content": gen.text}])[-2 * self.history_turns:]
        st = gen.stats
        audio_s = speaker.samples / self.tts.rate
        ms = lambda t: None if t is None else (t - t_eos) * 1e3  # noqa: E731
        out_ms = float(getattr(sink, "latency_ms", 0.0))  # first sample written → heard
        first_audio = ms(speaker.first_audio)
        return TurnReport(
            transcript=tr.text, answer=gen.text.strip(), mode=mode, question_s=tr.audio_s,
            eos_to_transcript_ms=ms(t_transcript), eos_to_first_token_ms=ms(t_first_token),
            eos_to_first_audio_ms=None if first_audio is None else first_audio + out_ms, asr_rtf=tr.rtf,
            tts_rtf=speaker.tts_ms / 1e3 / audio_s if audio_s > 0 else None, answer_audio_s=audio_s,
            decode_tok_s=st.decode_tokens_per_s, new_tokens=st.new_tokens,
            alpha=st.alpha if mode != "plain" and st.proposed else None, sentences=n_sent,
            tts_engine=self.tts.name, prefill_ms=st.prefill_ms, endpoint_ms=ms(t_asr), asr_ms=tr.ms,
            first_chunk_decode_ms=None if t_first_chunk is None else (t_first_chunk - t_first_token) * 1e3,
            first_chunk_tts_ms=speaker.first_tts_ms, audio_out_ms=out_ms, first_chunk=first_chunk,
            first_chunk_tokens=first_tokens, stall_ms=speaker.stall_s * 1e3)


class WavSink:
    """Collects int16 samples in memory; ``samples()`` joins them. No output latency."""

    latency_ms = 0.0

    def __init__(self):
        self.parts: list[np.ndarray] = []

    def write(self, s: np.ndarray) -> None:
        self.parts.append(s)

    def samples(self) -> np.ndarray:
        return np.concatenate(self.parts) if self.parts else np.zeros(0, np.int16)
