"""Fill-in-the-middle (FIM): the export's FIM tokens, the FIM prompt, and where the middle ends.

A FIM model (Qwen2.5-Coder) completes the code at a cursor from the code before it (prefix) and after it
(suffix): ``<|fim_prefix|>`` prefix ``<|fim_suffix|>`` suffix ``<|fim_middle|>`` → the missing middle, ended
by EOS, ``<|fim_pad|>`` or ``<|file_sep|>``. Alone, the file is the file-level format of the Qwen2.5-Coder
README; with other files of the repository, they go first in its repo-level format (Qwen2.5-Coder technical
report, Hui et al. 2024, Fig. 4), which llama.cpp's ``/infill`` writes even without other files::

    <|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>{prompt}
    <|repo_name|>{repo}\\n<|file_sep|>{path 1}\\n{text 1}<|file_sep|>{path 2}\\n{text 2}…
    <|file_sep|>{current path}\\n<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>{prompt}

Why not always repo-level, as llama.cpp: the default pair's Qwen2.5-Coder-1.5B-*Instruct* target, asked for a
one-line middle (two one-file prompts tried by hand), stopped after it in the file-level format and ran on past
it (repeating the suffix, then prose) to the token limit with the repo-level header. With another file, all four
layouts tried repeated the suffix after the middle.

The tokens are looked up by name in the export's own tokenizer (never by hard-coded id); an export without
them has no FIM (:func:`fim_tokens` returns None and the server answers 400). Text (prefix, suffix, files)
is encoded as plain text, each piece on its own, as llama.cpp does: a file that holds the text
``<|fim_prefix|>`` does not make a control token.

:class:`MiddleCutter` applies the completion-time limits of llama.cpp's server to streamed text: stop
strings, ``n_indent`` (stop at a line indented less than the cursor) and ``t_max_predict_ms`` (stop at a new
line once generation has run that long).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .openai_api import StopMatcher

NAMES = {"prefix": "<|fim_prefix|>", "suffix": "<|fim_suffix|>", "middle": "<|fim_middle|>",
         "pad": "<|fim_pad|>", "repo_name": "<|repo_name|>", "file_sep": "<|file_sep|>"}
DEFAULT_REPO = "myproject"  # the repository and current-file names llama.cpp's /infill writes when none is given
DEFAULT_FILENAME = "filename"


@dataclass(frozen=True)
class FimTokens:
    """The FIM token ids of one tokenizer: ``prefix``, ``suffix``, ``middle`` (required), ``pad``,
    ``repo_name``, ``file_sep`` (None when the tokenizer lacks them)."""

    prefix: int
    suffix: int
    middle: int
    pad: int | None = None
    repo_name: int | None = None
    file_sep: int | None = None

    @property
    def repo_level(self) -> bool:
        """Whether other files can go in as ``<|repo_name|>``/``<|file_sep|>`` sections."""
        return self.repo_name is not None and self.file_sep is not None

    @property
    def stop_ids(self) -> frozenset[int]:
        """Tokens that end the middle besides the export's stop tokens (EOS): ``<|fim_pad|>``, ``<|file_sep|>``."""
        return frozenset(t for t in (self.pad, self.file_sep) if t is not None)


def fim_tokens(tokenizer) -> FimTokens | None:
    """The FIM tokens of ``tokenizer`` (a ``tokenizers.Tokenizer``) by name (:data:`NAMES`), or None when it has
    no ``<|fim_prefix|>``/``<|fim_suffix|>``/``<|fim_middle|>`` (each must be one added token)."""
    added = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items()}
    ids = {key: added.get(name) for key, name in NAMES.items()}
    if ids["prefix"] is None or ids["suffix"] is None or ids["middle"] is None:
        return None
    return FimTokens(**ids)


@dataclass(frozen=True)
class FimPrompt:
    """What to fill: ``prefix`` (code before the cursor), ``suffix`` (after it), ``extra`` other files as
    ``(path, text)`` pairs, ``prompt`` text that starts the middle (after ``<|fim_middle|>``, as llama.cpp's
    ``prompt`` field), and the repository and current file names of the repo-level format."""

    prefix: str
    suffix: str = ""
    extra: tuple[tuple[str, str], ...] = ()
    prompt: str = ""
    repo: str = DEFAULT_REPO
    filename: str = DEFAULT_FILENAME


def _encoder(tokenizer, plain):
    """text → ids (int) as plain text: with ``plain()``'s tokenizer where the text holds an added token's text."""
    added = [t.content for t in tokenizer.get_added_tokens_decoder().values() if t.content]

    def enc(text: str) -> list[int]:
        if not text:
            return []
        tok = plain() if any(a in text for a in added) else tokenizer
        return tok.encode(text, add_special_tokens=False).ids

    return enc


def build_ids(tokenizer, plain, tokens: FimTokens, p: FimPrompt) -> list[int]:
    """The token ids (int) of the FIM prompt for ``p`` (the module docstring's layout: file-level without extra
    files; with them repo-level, or, without the repo-level tokens, their text first, unmarked, as llama.cpp).

    ``plain()`` returns a tokenizer that encodes control-token text as plain text
    (:func:`~edgespec.io.text.plain_text_tokenizer`); it is called only for text that holds such text.

    Raises:
        ValueError: the prompt would be empty (no prefix, suffix, files or prompt text is fine: the FIM
            markers alone are a prompt).
    """
    enc = _encoder(tokenizer, plain)
    ids: list[int] = []
    if p.extra and tokens.repo_level:
        ids += [tokens.repo_name] + enc(p.repo + "\n")
        for path, text in p.extra:
            ids += [tokens.file_sep] + enc(path + "\n") + enc(text if not text or text.endswith("\n") else text + "\n")
        ids += [tokens.file_sep] + enc(p.filename + "\n")
    else:
        for _, text in p.extra:
            ids += enc(text if not text or text.endswith("\n") else text + "\n")
    ids += [tokens.prefix] + enc(p.prefix) + [tokens.suffix] + enc(p.suffix) + [tokens.middle] + enc(p.prompt)
    return ids


DRAFT_WINDOW = 256  # tokens of the draft's FIM prompt (:func:`build_draft_ids`); 0: the draft reads the whole prompt


def build_draft_ids(tokenizer, plain, tokens: FimTokens, p: FimPrompt, window: int = DRAFT_WINDOW,
                    full: int | None = None) -> list[int] | None:
    """The draft model's FIM prompt (token ids) for ``p``: the file-level layout over the code around the cursor,
    about ``window`` tokens of it, or None when that is not shorter than :func:`build_ids`'s prompt (or
    ``window`` is 0). The draft reads it in place of the target's prompt
    (:attr:`~edgespec.engine.generation.GenerationOptions.draft_prompt`), so its catch-up before it can
    draft is ``window`` tokens, not the whole file; losslessness does not depend on it (any q is exact under
    the accept/reject rule), only alpha.

    Three quarters of the window go to the end of the prefix, one quarter to the start of the suffix; other
    files are left out. The prefix's cut moves in steps of a quarter of its share, so that consecutive
    keystrokes' prompts (the prefix growing at its end) share the draft's cached rows, as the target's.
    ``plain`` as for :func:`build_ids`; ``full``: the length (tokens) of :func:`build_ids`'s prompt for ``p`` where
    the caller has it (else it is built again: the whole prompt, other files included, tokenized once more).

    Raises:
        ValueError: ``window`` < 0.
    """
    if window < 0:
        raise ValueError(f"the draft's FIM window must be ≥ 0 tokens, got {window}")
    if window == 0:
        return None
    if full is None:
        full = len(build_ids(tokenizer, plain, tokens, p))
    enc = _encoder(tokenizer, plain)
    before, after = enc(p.prefix), enc(p.suffix)
    n_before = window - window // 4
    step = max(1, n_before // 4)
    cut = max(0, len(before) - n_before) // step * step
    ids = [tokens.prefix] + before[cut:] + [tokens.suffix] + after[:window // 4] + [tokens.middle] + enc(p.prompt)
    return ids if len(ids) < full else None


def draft_prompt_for(decoder, tokens: FimTokens, p: FimPrompt, window: int, full: int) -> tuple[int, ...] | None:
    """``GenerationOptions.draft_prompt`` of a FIM generation on ``decoder`` (a
    :class:`~edgespec.engine.decoder.SpecDecoder`) whose prompt for ``p`` is ``full`` tokens:
    :func:`build_draft_ids` with ``window``, or None where the decoder has no draft model or nothing is cut."""
    if decoder.draft_model is None:
        return None
    ids = build_draft_ids(decoder.tokenizer, lambda: decoder.plain_tokenizer, tokens, p, window, full)
    return tuple(ids) if ids is not None else None


class MiddleCutter:
    """Stop strings plus llama.cpp's completion limits on streamed text (``push``/``flush``/``hit`` as
    :class:`~edgespec.apps.openai_api.StopMatcher`, which it wraps).

    ``n_indent`` > 0: once a line after the first has a non-blank character at an indentation (spaces and
    tabs, counted as one each) below ``n_indent``, the text is cut before that character and generation stops.
    ``t_max_predict_ms`` > 0: once the first text has been out that long (ms) and a new line has been
    generated, generation stops after the current piece. ``t_max_prompt_ms`` > 0: if the first text came
    later than that after :meth:`start` (the prompt took longer to process), nothing is predicted.
    ``stop_type`` after a hit: ``"word"`` (``stopping_word`` set) or ``"limit"``.
    """

    def __init__(self, stops: tuple[str, ...] = (), n_indent: int = 0, t_max_predict_ms: float = 0.0,
                 t_max_prompt_ms: float = 0.0, clock=time.perf_counter):
        self.words = StopMatcher(stops)
        self.n_indent, self.t_max_predict_ms, self.t_max_prompt_ms = n_indent, t_max_predict_ms, t_max_prompt_ms
        self.clock = clock
        self.text = ""  # what has been let through
        self.raw = ""  # what was pushed
        self.hit = False
        self.stop_type, self.stopping_word = "", ""
        self.t_start = clock()
        self.t_first: float | None = None

    def start(self) -> None:
        """Mark the start of the prompt phase (for ``t_max_prompt_ms``)."""
        self.t_start = self.clock()

    def push(self, piece: str) -> str:
        if self.hit:
            return ""
        now = self.clock()
        if self.t_first is None:
            self.t_first = now
            if self.t_max_prompt_ms > 0 and (now - self.t_start) * 1e3 > self.t_max_prompt_ms:
                self._stop("limit")
                return ""
        self.raw += piece
        out = self.words.push(piece)
        if self.words.hit:
            self._stop("word")
            found = [(self.raw.find(s), s) for s in self.words.stops if s in self.raw]
            self.stopping_word = min(found)[1] if found else ""
        out = self._indent(out)
        self.text += out
        if (not self.hit and self.t_max_predict_ms > 0 and "\n" in self.text
                and (now - self.t_first) * 1e3 > self.t_max_predict_ms):
            self._stop("limit")
        return out

    def flush(self) -> str:
        if self.hit:
            return ""
        out = self._indent(self.words.flush())
        self.text += out
        return out

    def _stop(self, kind: str) -> None:
        self.hit, self.stop_type = True, kind

    def _indent(self, out: str) -> str:
        """``out`` cut before the first non-blank character of a line (after the first) indented less than
        ``n_indent``."""
        if self.n_indent <= 0 or not out:
            return out
        text = self.text + out
        start = text.find("\n") + 1  # lines after the first
        if start == 0:
            return out
        for nl in _line_starts(text, start):
            j = nl
            while j < len(text) and text[j] in " \t":
                j += 1
            if j < len(text) and text[j] != "\n" and j - nl < self.n_indent:
                self._stop("limit")
                return text[len(self.text):j] if j > len(self.text) else ""
        return out


def _line_starts(text: str, first: int):
    i = first
    while i <= len(text):
        yield i
        nl = text.find("\n", i)
        if nl < 0:
            return
        i = nl + 1
