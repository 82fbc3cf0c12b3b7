"""``edgespec chat``: a multi-turn chat loop on stdin/stdout with KV reuse across turns.

Commands: ``/reset`` (new conversation, caches emptied), ``/stats`` (last reply's statistics), ``/exit``.
Ctrl-C stops the current reply and keeps the session; at the prompt it exits.
"""

from __future__ import annotations

import sys

from .stats import format_stats

UNDERLINE, RESET = "\x1b[4m", "\x1b[0m"
HELP = "commands: /reset  /stats  /exit"


def run_chat(args, decoder, gen_kwargs) -> int:
    """Read user turns from stdin until EOF or /exit; stream each reply to stdout, stats to stderr."""
    interactive = sys.stdin.isatty()
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(system)
    last = None
    if interactive:
        print(f"edgespec chat — {decoder.manifest.name if decoder.manifest else ''} ({args.mode}). {HELP}",
              file=sys.stderr)
    kwargs = gen_kwargs(args, decoder)
    underline = args.show_accept and sys.stdout.isatty()  # no escape codes into files and pipes
    while True:
        try:
            if interactive:
                sys.stdout.write("> ")
                sys.stdout.flush()
            line = sys.stdin.readline()
        except KeyboardInterrupt:
            print(file=sys.stderr)
            return 0
        if not line:
            return 0
        text = line.strip()
        if not text:
            continue
        if text == "/exit":
            return 0
        if text == "/reset":
            messages = list(system)
            decoder.reset()
            print("[conversation reset]", file=sys.stderr)
            continue
        if text == "/stats":
            print(format_stats(last) if last else "[no reply yet]", file=sys.stderr)
            continue
        if text.startswith("/"):
            print(f"[unknown command {text.split()[0]}; {HELP}]", file=sys.stderr)
            continue
        messages.append({"role": "user", "content": text})
        g = decoder.generate(messages=messages, **kwargs)
        try:
            for piece, from_draft in g.chunks():
                sys.stdout.write(f"{UNDERLINE}{piece}{RESET}" if underline and from_draft else piece)
                sys.stdout.flush()
        except KeyboardInterrupt:
            sys.stdout.write(" [stopped]")
        sys.stdout.write("\n")
        sys.stdout.flush()
        messages.append({"role": "assistant", "content": g.text})
        last = g.stats
        print(format_stats(g.stats), file=sys.stderr)
