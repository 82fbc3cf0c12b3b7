"""Soak of ``edgespec chat``: N short turns in one session; RSS over time and greedy turns against fresh runs.

Drives a real ``edgespec chat`` process over pipes (one user line per turn; a turn ends with its statistics
line on stderr), reads its RSS (``/proc/<pid>/status``, Linux) after chosen turns, and replays the same
conversation in-process with :class:`edgespec.apps.chat.Conversation` (the same context fitting, oldest turns
dropped when full) to check that (1) the chat printed exactly the replies of that replay and (2) at the
chosen turns, a fresh decoder (caches emptied) given the same messages gives the same greedy reply, so KV
reuse over hundreds of turns changes nothing.

    python bench/soak.py [DIR] --turns 100 --max-new-tokens 16 --k 4     # DIR: default pair in the user cache

On the shared machine run it under ``flock /work/locks/real.lock`` for the real pair. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

PROMPTS = ["Reply with one word: a color.", "Reply with one word: an animal.", "Name a prime number.",
           "Reply with just the word OK.", "What is 2+2? Answer with a number.", "Say hi."]
STATS = re.compile(r"^\[\d+ tokens")


def rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` in MB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def user_line(turn: int) -> str:
    """The user message of turn ``turn`` (1-based)."""
    return f"{turn}. {PROMPTS[(turn - 1) % len(PROMPTS)]}"


def run_chat(export_dir: Path, turns: int, max_new_tokens: int, k: int, at: set[int],
             env: dict | None = None) -> tuple[str, dict[int, float], float]:
    """Run ``edgespec chat`` for ``turns`` turns; returns (stdout, RSS MB at the turns in ``at``, seconds)."""
    cmd = [sys.executable, "-m", "edgespec.cli", "chat", str(export_dir), "--max-new-tokens", str(max_new_tokens),
           "--k", str(k)]
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         encoding="utf-8", env=env or dict(os.environ), bufsize=1)
    rss, t0 = {}, time.perf_counter()
    try:
        for turn in range(1, turns + 1):
            p.stdin.write(user_line(turn) + "\n")
            p.stdin.flush()
            while True:
                line = p.stderr.readline()
                if not line:
                    raise RuntimeError(f"chat ended at turn {turn} (exit {p.wait()})")
                if "Traceback" in line or line.startswith("edgespec: error"):
                    raise RuntimeError(f"turn {turn}: {line.strip()} {p.stderr.read()}")
                if STATS.match(line):
                    break
            if turn in at:
                rss[turn] = rss_mb(p.pid)
        p.stdin.write("/exit\n")
        p.stdin.close()
        out = p.stdout.read()
        p.wait(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    return out, rss, time.perf_counter() - t0


def replay(export_dir: Path, turns: int, max_new_tokens: int, k: int, check: set[int]) -> tuple[list[str], dict]:
    """The same conversation in-process (KV reuse as in the chat); at the turns in ``check`` also a fresh
    decoder on the same messages. Returns (replies, {turn: fresh reply == reused reply})."""
    from edgespec.apps.chat import Conversation
    from edgespec.engine.decoder import SpecDecoder

    dec, fresh = SpecDecoder.load(export_dir), SpecDecoder.load(export_dir)
    conv = Conversation(dec, None, max_new_tokens)
    replies, same = [], {}
    for turn in range(1, turns + 1):
        conv.turns.append({"role": "user", "content": user_line(turn)})
        ids = conv.fit()
        g = dec.generate(input_ids=ids, max_new_tokens=max_new_tokens, k=k).run()
        replies.append(g.text)
        conv.turns.append({"role": "assistant", "content": g.text})
        if turn in check:
            fresh.reset()
            same[turn] = fresh.generate(input_ids=ids, max_new_tokens=max_new_tokens, k=k).run().text == g.text
    return replies, same


def soak(export_dir: Path, turns: int = 200, max_new_tokens: int = 8, k: int = 2,
         at=(1, 10, 50, 100, 200), env: dict | None = None) -> dict:
    """Chat soak: RSS MB at turns ``at``, whether the chat's output equals the in-process replay, and whether
    each checked turn equals a fresh run."""
    at = {t for t in at if t <= turns}
    out, rss, seconds = run_chat(export_dir, turns, max_new_tokens, k, at, env)
    replies, same = replay(export_dir, turns, max_new_tokens, k, at)
    return {"turns": turns, "max_new_tokens": max_new_tokens, "k": k, "rss_mb": rss, "chat_seconds": seconds,
            "output_equals_replay": out == "".join(r + "\n" for r in replies), "fresh_equals_reused": same,
            "reply_chars": sum(map(len, replies))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", nargs="?")
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--k", type=int, default=4)
    a = ap.parse_args()
    from edgespec.io import paths

    d = Path(a.dir) if a.dir else paths.default_export_dir()
    print(json.dumps(soak(d, a.turns, a.max_new_tokens, a.k, at=(1, 10, 25, 50, 75, 100, 200))))


if __name__ == "__main__":
    main()
