"""Tokenizer, chat template and streaming detokenization."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from .errors import EdgespecError


class IncrementalDetokenizer:
    """Turns a growing token list into text pieces without ever emitting a partial UTF-8 character.

    Keeps a short window of already-emitted tokens as context (byte-level BPE and SentencePiece decoders
    depend on neighbours), decodes window+new, and emits only the part past the already-emitted text once
    it no longer ends in U+FFFD. The concatenation of all pieces equals ``decode(all tokens)``.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix = 0  # start of the context window
        self.read = 0  # tokens whose text has been emitted

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=self.skip)

    def push(self, ids) -> str:
        """Add token ids; returns the newly completed text (possibly empty)."""
        self.ids.extend(int(i) for i in ids)
        done = self._decode(self.ids[self.prefix:self.read])
        full = self._decode(self.ids[self.prefix:])
        if len(full) > len(done) and not full.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return full[len(done):]
        return ""

    def flush(self) -> str:
        """Whatever is left (a trailing invalid byte sequence decodes as U+FFFD here, as in a full decode)."""
        done = self._decode(self.ids[self.prefix:self.read])
        full = self._decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return full[len(done):]


def load_tokenizer(path: Path) -> Tokenizer:
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:
        raise EdgespecError(f"{path}: cannot load tokenizer ({e})") from None


class ChatTemplate:
    """A Hugging Face style Jinja chat template rendered in a sandbox."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(msg):
            raise ValueError(msg)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        self.template = env.from_string(source)
        self.bos_token, self.eos_token = bos_token, eos_token

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text for ``messages`` (``[{"role": ..., "content": ...}]``)."""
        return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                    bos_token=self.bos_token, eos_token=self.eos_token)
