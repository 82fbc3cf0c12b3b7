"""Tokenizer, chat template, prompt encoding and streaming detokenization.

Text enters the runtime here, so this is where it is checked: message lists and their roles, text that is
not valid UTF-8, chat templates that do not parse, raise, loop or read what they should not (jinja2's
immutable sandbox, plus bounds on time and on the size of ``*``/``**`` results), and control-token text
typed by a user (``<|im_end|>`` in a message stays plain text; only the template's markup makes control
tokens).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tokenizers import Tokenizer

from ..errors import EdgespecError

ROLES = ("system", "user", "assistant", "tool")
RENDER_SECONDS = 2.0  # a chat template that runs longer is stopped (a runaway loop)
MAX_SIZE = 10_000_000  # largest int argument, string/list repetition or power a template may compute


# Added tokens that Qwen2.5's own tokenizer configuration marks ``"special": false`` (ordinary text when decoded),
# while a GGUF marks the six FIM/repository ones CONTROL, so an export converted from a GGUF has them special:
# decoding keeps them as text (a FIM answer's ``<|file_sep|>`` is a file boundary, ``<tool_call>`` a tool call).
# Source: tokenizer_config.json of Qwen/Qwen2.5-Coder-1.5B-Instruct, ids 151657-151664.
TEXT_TOKENS = frozenset({"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                         "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"})


def control_ids(tokenizer: Tokenizer) -> frozenset[int]:
    """Ids of the control tokens that decoding drops: the added tokens marked special, but :data:`TEXT_TOKENS`."""
    return frozenset(i for i, t in tokenizer.get_added_tokens_decoder().items()
                     if t.special and t.content not in TEXT_TOKENS)


def decode(tokenizer: Tokenizer, ids, skip_special_tokens: bool = True, skip: frozenset[int] | None = None) -> str:
    """Text of token ids (int). With ``skip_special_tokens``, control tokens (``<|im_end|>``) are dropped and
    :data:`TEXT_TOKENS` kept as text, as the model's own tokenizer configuration says; ``skip``: precomputed
    :func:`control_ids`."""
    ids = [int(i) for i in ids]
    if skip_special_tokens:
        skip = control_ids(tokenizer) if skip is None else skip
        ids = [i for i in ids if i not in skip]
    return tokenizer.decode(ids, skip_special_tokens=False)


class IncrementalDetokenizer:
    """Turns a growing token list into text pieces without ever emitting a partial UTF-8 character.

    Keeps a short window of already-emitted tokens as context (byte-level BPE and SentencePiece decoders
    depend on neighbours), decodes window+new, and emits only the part past the already-emitted text once
    it no longer ends in U+FFFD. The concatenation of all pieces equals :func:`decode` of all tokens (control
    tokens dropped, :data:`TEXT_TOKENS` kept, unless ``skip_special_tokens`` is False: then every token is text).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tok = tokenizer
        self.skip = control_ids(tokenizer) if skip_special_tokens else frozenset()
        self.ids: list[int] = []
        self.prefix = 0  # start of the context window
        self.read = 0  # tokens whose text has been emitted

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode([i for i in ids if i not in self.skip], skip_special_tokens=False)

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
    """A ``tokenizers`` tokenizer from its JSON file.

    Raises:
        EdgespecError: unreadable or not a tokenizer.
    """
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise EdgespecError(f"{path}: cannot load tokenizer ({reason})") from None


def check_text(text, name: str) -> str:
    """``text`` if it is a str that is valid UTF-8 (no lone surrogates, as undecodable bytes become).

    Raises:
        ValueError: naming ``name``: not a str, or not encodable as UTF-8.
    """
    if not isinstance(text, str):
        raise ValueError(f"{name} must be a str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{name} is not valid UTF-8 text (undecodable bytes at character {e.start})") from None
    return text


def check_messages(messages) -> list[dict]:
    """Chat messages: a non-empty list of ``{"role": one of ROLES, "content": str}`` dicts (other keys kept).

    Raises:
        ValueError: naming the argument (``messages``, ``messages[i].role`` …).
    """
    if not isinstance(messages, (list, tuple)):
        raise ValueError(f"messages must be a list of {{'role', 'content'}} dicts, got {type(messages).__name__}")
    if not messages:
        raise ValueError("messages is empty")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {type(m).__name__}")
        if m.get("role") not in ROLES:
            raise ValueError(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {m.get('role')!r}")
        if "content" not in m:
            raise ValueError(f"messages[{i}] has no 'content'")
        check_text(m["content"], f"messages[{i}].content")
    return list(messages)


class _RenderTimeout(Exception):
    pass


@contextlib.contextmanager
def _time_bound(seconds: float):
    """Stop template code (frames compiled from a template) that runs past ``seconds``."""
    deadline = time.monotonic() + seconds

    def local(frame, event, arg):
        if time.monotonic() > deadline:
            raise _RenderTimeout
        return local

    def calls(frame, event, arg):
        if time.monotonic() > deadline:
            raise _RenderTimeout
        return local if frame.f_code.co_filename == "<template>" else None

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        yield
    finally:
        sys.settrace(previous)


def _sandbox():
    from jinja2.exceptions import SecurityError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def too_big(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_SIZE

    class Sandbox(ImmutableSandboxedEnvironment):
        """The immutable sandbox, with ``*`` and ``**`` and int arguments bounded."""

        intercepted_binops = frozenset(["*", "**"])

        def call_binop(self, context, operator, left, right):
            if operator == "**" and isinstance(right, (int, float)) and abs(right) > 64 and \
                    isinstance(left, (int, float)) and abs(left) > 1:
                raise SecurityError("chat template computes a too large power")
            if operator == "*" and (too_big(left) or too_big(right) or (
                    isinstance(left, (str, list, tuple)) and isinstance(right, int) and len(left) * right > MAX_SIZE)
                    or (isinstance(right, (str, list, tuple)) and isinstance(left, int)
                        and len(right) * left > MAX_SIZE)):
                raise SecurityError("chat template builds a too large value")
            return super().call_binop(context, operator, left, right)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's signature)
            if any(too_big(a) for a in (*args, *kwargs.values())):
                raise SecurityError("chat template passes a too large number")
            return super().call(__context, __obj, *args, **kwargs)

    return Sandbox


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    """Hugging Face's ``tojson`` for chat templates (transformers' ``chat_template_utils``): plain
    ``json.dumps``, keys in their order, no HTML escaping (jinja2's own sorts keys and escapes ``<``)."""
    import json

    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class ChatTemplate:
    """A Hugging Face style Jinja chat template rendered in jinja2's immutable sandbox, bounded in time
    (:data:`RENDER_SECONDS`) and in the size of values it builds.

    Raises:
        EdgespecError: the template does not parse (``name`` says which file).
    """

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", name: str = "chat template"):
        from jinja2 import TemplateSyntaxError

        def raise_exception(msg):
            raise ValueError(msg)

        env = _sandbox()(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        env.filters["tojson"] = _tojson
        self.name, self.source = name, source
        try:
            self.template = env.from_string(source)
        except TemplateSyntaxError as e:
            raise EdgespecError(f"{name}: chat template syntax error at line {e.lineno}: {e.message}") from None
        except (RecursionError, MemoryError):
            raise EdgespecError(f"{name}: chat template too deeply nested") from None
        self.bos_token, self.eos_token = bos_token, eos_token

    def render(self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None) -> str:
        """The prompt text for ``messages`` (``[{"role": ..., "content": ...}]``); ``tools`` (OpenAI tool objects)
        are passed to the template as ``tools`` when given, as Hugging Face's ``apply_chat_template`` does.

        Raises:
            ValueError: the template raised (``raise_exception``, an undefined name, a sandbox violation,
                any error of its code) or ran longer than :data:`RENDER_SECONDS`.
        """
        try:
            with _time_bound(RENDER_SECONDS):
                extra = {"tools": tools} if tools else {}
                out = self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                           bos_token=self.bos_token, eos_token=self.eos_token, **extra)
        except _RenderTimeout:
            raise ValueError(f"{self.name}: rendering took longer than {RENDER_SECONDS:g} s "
                             "(a runaway loop in the chat template?)") from None
        except Exception as e:  # a template is code from the export: any error it raises is its own
            reason = str(e).splitlines()[0] if str(e) else ""
            raise ValueError(f"{self.name}: {reason or type(e).__name__}") from None
        if not isinstance(out, str):
            raise ValueError(f"{self.name}: rendering did not give text")
        return out


def load_template(path: Path, bos_token: str = "", eos_token: str = "") -> ChatTemplate:
    """The chat template in ``path``.

    Raises:
        EdgespecError: unreadable, not UTF-8, or a syntax error (naming the file).
    """
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = getattr(e, "strerror", None) or str(e).splitlines()[0]
        raise EdgespecError(f"{path}: cannot read the chat template ({reason})") from None
    return ChatTemplate(source, bos_token, eos_token, name=str(path))


def plain_text_tokenizer(tokenizer: Tokenizer) -> Tokenizer:
    """A copy of ``tokenizer`` that encodes control-token text (``<|im_end|>``) as ordinary text."""
    plain = Tokenizer.from_str(tokenizer.to_str())
    plain.encode_special_tokens = True
    return plain


def encode_chat(tokenizer: Tokenizer, plain: Callable[[], Tokenizer], template: ChatTemplate, messages: list[dict],
                add_generation_prompt: bool = True, tools: list[dict] | None = None) -> list[int]:
    """Token ids of ``messages`` rendered with ``template``; message content is plain text.

    Only the template's own markup produces control tokens: when a message holds the text of an added token
    (``<|im_end|>``), the template is rendered around placeholders and each content is encoded with
    the tokenizer ``plain()`` returns (:func:`plain_text_tokenizer`; called only then, as it costs ~100 MB).
    Otherwise the rendered text is encoded as a whole, exactly as Hugging Face's
    ``apply_chat_template(tokenize=True)`` does. ``tools`` go to the template (:meth:`ChatTemplate.render`).

    Raises:
        ValueError: invalid messages (see :func:`check_messages`) or a failing template.
    """
    messages = check_messages(messages)
    text = template.render(messages, add_generation_prompt, tools)
    added = [t.content for t in tokenizer.get_added_tokens_decoder().values() if t.content]
    if not any(a in m["content"] for m in messages for a in added):
        return tokenizer.encode(text, add_special_tokens=False).ids
    marks = [f"\ue000{i}\ue001" for i in range(len(messages))]
    if any("\ue000" in m["content"] for m in messages):
        raise ValueError("message content holds the private-use character U+E000; cannot keep it plain text")
    skeleton = template.render([{**m, "content": mk} for m, mk in zip(messages, marks)], add_generation_prompt, tools)
    ids: list[int] = []
    rest = skeleton
    plain = plain()
    for m, mk in zip(messages, marks):
        if rest.count(mk) != 1:
            raise ValueError("the chat template rewrites message content, so control-token text in a message "
                             "cannot be kept plain; remove it from the message")
        before, rest = rest.split(mk)
        ids += tokenizer.encode(before, add_special_tokens=False).ids
        ids += plain.encode(m["content"], add_special_tokens=False).ids
    ids += tokenizer.encode(rest, add_special_tokens=False).ids
    return ids
