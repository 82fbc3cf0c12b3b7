"""``edgespec chat``: a multi-turn chat loop on stdin/stdout with KV reuse across turns.

Commands: ``/reset`` (new conversation, caches emptied; the system prompt kept), ``/stats`` (last reply's
statistics), ``/system TEXT`` (set the system prompt; ``/system`` alone shows it), ``/help``, ``/exit``; any
other line, also one starting with "/", goes to the model. Multi-line turns: a pasted block on a terminal, or
a ``\"\"\"`` … ``\"\"\"`` block (see :mod:`.chat_input`). When the conversation outgrows the context, the
oldest turns are dropped (the system prompt kept) with a one-line notice. Ctrl-C stops the current reply or
clears the line being typed and keeps the session; /exit or end of input (Ctrl-D) ends it.
"""

from __future__ import annotations

import sys

from .chat_input import clean_text, open_input, read_turn
from ..core.stats import format_stats

UNDERLINE, RESET = "\x1b[4m", "\x1b[0m"
HELP = 'commands: /reset  /stats  /system TEXT  /help  /exit   (multi-line: paste, or a """ … """ block)'


def _note(text: str) -> None:
    print(f"[{text}]", file=sys.stderr, flush=True)


class Conversation:
    """The messages of one chat, fitted into the decoder's context before each reply."""

    def __init__(self, decoder, system: str | None, max_new_tokens: int):
        self.decoder, self.system, self.max_new_tokens = decoder, system, max_new_tokens
        self.turns: list[dict] = []  # user/assistant messages, oldest first
        self.last = None  # statistics of the last reply (GenerationStats)

    def messages(self) -> list[dict]:
        return ([{"role": "system", "content": self.system}] if self.system else []) + self.turns

    def fit(self) -> list[int] | None:
        """Token ids of the conversation, ending in the newest user message, with room for a reply.

        If it does not fit (prompt + min(max_new_tokens, context/4) > context), the oldest turns go until
        it fills at most half of that room, so that the next turns again reuse the KV cache; a one-line
        notice says so. None (and the message dropped) if the newest message alone does not fit.
        """
        ctx = self.decoder.context_length
        room = ctx - min(self.max_new_tokens, ctx // 4)
        ids = self.decoder.encode(messages=self.messages())
        if len(ids) <= room:
            return ids
        dropped = 0
        while len(self.turns) > 1 and len(ids) > room // 2:
            del self.turns[:2]  # a user message and its reply
            dropped += 1
            ids = self.decoder.encode(messages=self.messages())
        if len(ids) > room:
            self.turns.pop()
            _note(f"the message is {len(ids)} tokens with the system prompt; the context holds {ctx} with "
                  f"room for a reply: not sent")
            return None
        _note(f"context full: dropped the {dropped} oldest turn{'s' * (dropped != 1)}, kept the system prompt; "
              f"{len(ids)} of {ctx} tokens in use")
        return ids


def _command(text: str, conv: Conversation) -> bool | None:
    """Run ``text`` if it is one of the chat's own commands: True to go on, False to exit; None if it is
    not a command (it goes to the model)."""
    word, _, rest = text.partition(" ")
    if text == "/exit":
        return False
    if text == "/reset":
        conv.turns = []
        conv.decoder.reset()
        _note("conversation reset")
    elif text == "/stats":
        print(format_stats(conv.last) if conv.last else "[no reply yet]", file=sys.stderr)
    elif text == "/help":
        _note(HELP)
    elif word == "/system":
        if rest.strip():
            conv.system = rest.strip()
            _note("system prompt set")
        else:
            _note(f"system prompt: {conv.system}" if conv.system else "no system prompt")
    else:
        return None
    return True


def _reply(conv: Conversation, kwargs: dict, underline: bool) -> None:
    """Generate and stream the answer to the newest user message (its stats become ``conv.last``)."""
    g = None
    try:
        ids = conv.fit()
        if ids is None:
            return
        g = conv.decoder.generate(input_ids=ids, **kwargs)
        for piece, from_draft in g.chunks():
            sys.stdout.write(f"{UNDERLINE}{piece}{RESET}" if underline and from_draft else piece)
            sys.stdout.flush()
    except KeyboardInterrupt:
        sys.stdout.write(" [stopped]")
    except ValueError as e:  # e.g. a chat template that refuses the messages
        conv.turns.pop()
        _note(f"error: {e}")
        return
    sys.stdout.write("\n")
    sys.stdout.flush()
    conv.turns.append({"role": "assistant", "content": g.text if g is not None else ""})
    if g is not None:
        conv.last = g.stats
        print(format_stats(g.stats), file=sys.stderr)


def run_chat(args, decoder, gen_kwargs) -> int:
    """Read user turns until end of input or /exit; stream each reply to stdout, stats to stderr."""
    interactive = sys.stdin.isatty()
    reader = open_input(interactive and sys.stdout.isatty())
    conv = Conversation(decoder, args.system, args.max_new_tokens)
    if interactive:
        name = decoder.manifest.name if decoder.manifest else ""
        print(f"edgespec chat — {name} ({args.mode}). {HELP}", file=sys.stderr)
    kwargs = gen_kwargs(args, decoder)
    underline = args.show_accept and sys.stdout.isatty()  # no escape codes into files and pipes
    while True:
        reading = True
        try:
            text = read_turn(reader)
            reading = False
            if text is None:
                return 0
            if _turn(text, conv, kwargs, underline) is False:
                return 0
        except KeyboardInterrupt:  # at any moment: the session goes on
            if reading:  # the line being typed is dropped (prompt_toolkit has cleared it itself)
                if not hasattr(reader, "session"):
                    print(file=sys.stderr)
                continue
            if conv.turns and conv.turns[-1]["role"] == "user":  # keep user/assistant alternating
                conv.turns.append({"role": "assistant", "content": ""})
            _note("stopped")


def _turn(text: str, conv: Conversation, kwargs: dict, underline: bool) -> bool:
    """One line or block of input: a command, or a message answered by the model. False to exit."""
    text, replaced = clean_text(text)
    if replaced:
        _note("input that is not valid UTF-8 was replaced by U+FFFD")
    text = text.strip() if "\n" not in text else text.strip("\n").rstrip()
    if not text:
        return True
    go_on = _command(text, conv)
    if go_on is None:
        conv.turns.append({"role": "user", "content": text})
        _reply(conv, kwargs, underline)
        return True
    return go_on
