"""Eager turns for a live microphone: answer during the endpointer's wait for silence, speak only after it.

The endpointer decides that the speaker has finished only after ``hangover_s`` (0.6 s) of quiet, and that
wait is part of the delay the speaker feels. An :class:`EagerTurn` starts the whole turn (speech recognition,
prefill, the first chunk and its synthesis) as soon as a shorter pause (``--eager-ms``, 0.1 s) is heard, on a
worker thread, into a :class:`GatedSink` that holds the audio. When the endpointer confirms the end of speech the
gate opens and the held audio plays at once; when the speaker goes on talking the turn is cancelled (its
audio is dropped, the conversation is unchanged) and a later pause starts it again. Nothing reaches the
speaker before the end of speech is confirmed, so an eager turn only moves work earlier.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np

from .audio import FRAME_S
from .pipeline import TurnReport

EAGER_S = 0.1  # quiet after speech before an eager turn starts (s); the endpointer confirms at 0.6 s


def follow_speech(blocks, ep, on_pause=None, on_resume=None, pause_s: float = EAGER_S) -> tuple[np.ndarray, float]:
    """Push float32 blocks (an iterator, 16 kHz, arriving in real time) into the endpointer ``ep`` until it is
    done; returns ``(audio float32 (S,), t_eos)``, ``t_eos`` the perf_counter time (s) the last loud frame
    ended. ``on_pause(audio so far, its t_eos)`` after ``pause_s`` of quiet following speech (again at each
    block of the pause while it returns False), ``on_resume()`` when speech comes again after a pause it
    accepted. An iterator that ends first ends the recording there."""
    got, paused = [], False
    for x in blocks:
        got.append(x)
        ep.push(x)
        if paused and ep.quiet == 0:
            paused = False
            if on_resume is not None:
                on_resume()
        if not paused and ep.started and not ep.done and ep.quiet * FRAME_S >= pause_s:
            # on_pause may refuse (returns False: busy); it is asked again at the next block of this pause
            paused = on_pause is None or on_pause(np.concatenate(got), time.perf_counter() - ep.quiet * FRAME_S) \
                is not False
        if ep.done:
            break
    audio = np.concatenate(got) if got else np.zeros(0, np.float32)
    return audio, time.perf_counter() - ep.quiet * FRAME_S


def paced_blocks(audio: np.ndarray, block: int = 480, rate: int = 16000):
    """Blocks of ``audio`` float32 (S,) released at the pace a microphone would deliver them (for the live
    benchmark: a WAV question replayed in real time)."""
    t0 = time.perf_counter()
    for i in range(0, len(audio), block):
        wait = t0 + (i + block) / rate - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        yield audio[i:i + block]


class GatedSink:
    """Holds int16 samples written to it until :meth:`open` gives it the sink they go to (thread-safe).
    ``t_first_out``: perf_counter time (s) the first samples went to that sink; None before."""

    def __init__(self):
        self.sink, self.latency_ms = None, 0.0
        self._lock = threading.Lock()
        self._held: list[np.ndarray] = []
        self._dropped = False
        self.t_first_out: float | None = None

    def write(self, s: np.ndarray) -> None:
        with self._lock:
            if self._dropped:
                return
            if self.sink is None:
                self._held.append(s)
                return
            if self.t_first_out is None:
                self.t_first_out = time.perf_counter()
        self.sink.write(s)  # outside the lock: a speaker's write blocks while it plays

    def open(self, sink) -> None:
        """From now on samples go to ``sink`` (``write(int16 (S,))``, optional ``latency_ms``), the held ones
        first."""
        with self._lock:
            held, self._held = self._held, []
            self.latency_ms = float(getattr(sink, "latency_ms", 0.0))
            if held and not self._dropped:
                self.t_first_out = time.perf_counter()
                for s in held:  # under the lock, so that a concurrent write() stays behind them
                    sink.write(s)
            self.sink = sink

    def drop(self) -> None:
        """Discard what is held and everything written from now on."""
        with self._lock:
            self._dropped, self._held = True, []


class EagerTurn:
    """At most one turn of ``va`` (a :class:`~edgespec.voice.pipeline.VoiceAssistant`) at a time, started
    eagerly on a worker thread (:meth:`start`), cancelled (:meth:`cancel`), or finished (:meth:`finish`)."""

    def __init__(self, va, mode: str | None = None):
        self.va, self.mode = va, mode  # mode: the turn's (spec or plain); None: va's own
        self.thread: threading.Thread | None = None
        self.restarts = 0  # eager turns cancelled because the speaker went on

    def start(self, audio: np.ndarray, t_eos: float) -> bool:
        """Start a turn on ``audio`` (float32 (S,), 16 kHz) whose speech ended at ``t_eos`` (perf_counter s),
        unless one is still running; returns whether it started."""
        if self.thread is not None and self.thread.is_alive():
            return False
        self.gate, self.cancel_event, self.result, self.t_eos = GatedSink(), threading.Event(), None, t_eos

        def run():
            try:
                self.result = self.va.turn(audio, self.gate, t_eos=t_eos, mode=self.mode, cancel=self.cancel_event)
            except BaseException as e:  # re-raised by finish()
                self.result = e

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        return True

    def cancel(self) -> None:
        """The speaker went on: stop the running turn (it ends at its next step) and drop its audio."""
        if self.thread is not None and not self.cancel_event.is_set():
            self.cancel_event.set()
            self.gate.drop()
            self.restarts += 1

    def finish(self, audio: np.ndarray, t_eos: float, sink) -> TurnReport:
        """The end of speech is confirmed: send the running eager turn's audio to ``sink`` and wait for it, or
        (none running, or it was cancelled) run the turn on ``audio`` now. The report's first audio is when
        the first sample went to ``sink`` plus its output latency.

        Raises what the turn raises (NoSpeech, EdgespecError)."""
        eager = self.thread is not None and not self.cancel_event.is_set()
        if eager:
            self.gate.open(sink)
            self.thread.join()
            self.thread, t_eos = None, self.t_eos
            if isinstance(self.result, BaseException):
                raise self.result
            result = self.result
        else:
            if self.thread is not None:
                self.thread.join()  # the cancelled turn must end before the decoder is used again
            self.gate = GatedSink()
            self.gate.open(sink)
            result = self.va.turn(audio, self.gate, t_eos=t_eos, mode=self.mode)
        self.thread = None
        if self.gate.t_first_out is not None:
            result = dataclasses.replace(
                result, eos_to_first_audio_ms=(self.gate.t_first_out - t_eos) * 1e3 + self.gate.latency_ms,
                audio_out_ms=self.gate.latency_ms)
        result.extra.update(eager=eager, eager_restarts=self.restarts)
        self.restarts = 0
        return result
