"""``edgespec chat`` on a tiny export: through a pseudo-terminal (pexpect: paste, history, Ctrl-C, a conversation
longer than the context) and through a pipe (multi-line blocks, commands, "/" lines, invalid UTF-8)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from edgespec.apps.chat_input import PlainInput, clean_text, read_turn
from edgespec.engine.decoder import SpecDecoder

STATS = re.compile(r"\[\d+ tokens, ")
PROMPT = "\x1b[?2004h"  # prompt_toolkit turns bracketed paste on as each prompt starts


@pytest.fixture(scope="module")
def api(tiny_export):
    return SpecDecoder.load(tiny_export, load_draft=False)


def reply(api, messages, n):
    """The target's own greedy answer (plain decoding, fresh caches)."""
    api.reset()
    return api.generate(messages=messages, max_new_tokens=n, proposers=()).run().text


def piped(export, home, stdin: bytes, *args) -> subprocess.CompletedProcess:
    env = dict(os.environ, EDGESPEC_HOME=str(home))
    return subprocess.run([sys.executable, "-m", "edgespec.cli", "chat", str(export), "--k", "2", *args],
                          input=stdin, capture_output=True, env=env, timeout=300)


# -- through a pseudo-terminal ------------------------------------------------------------------------

pexpect = pytest.importorskip("pexpect")
pytest.importorskip("prompt_toolkit")


class Tty:
    def __init__(self, export, home, *args):
        env = dict(os.environ, EDGESPEC_HOME=str(home), TERM="xterm", PROMPT_TOOLKIT_NO_CPR="1")
        self.p = pexpect.spawn(sys.executable, ["-m", "edgespec.cli", "chat", str(export), "--k", "2", *args],
                               env=env, encoding="utf-8", codec_errors="replace", timeout=120,
                               dimensions=(40, 300))
        self.p.expect_exact(PROMPT)

    def turn(self, keys: str) -> str:
        """Send keys ending a turn; the output up to the reply's stats line (newlines normalised)."""
        self.p.send(keys)
        self.p.expect(STATS)
        out = self.p.before
        self.p.expect_exact(PROMPT)
        return out.replace("\r\n", "\n")

    def close(self):
        self.p.send("/exit\r")
        self.p.expect(pexpect.EOF)
        self.p.close()
        assert self.p.exitstatus == 0, self.p.before
        assert "Traceback" not in (self.p.before or "")


def test_a_pasted_function_after_a_question_is_one_turn(tiny_export, home, api):
    code = "def f(x):\n    y = x\n    return y"
    want = reply(api, [{"role": "user", "content": "Fix this: " + code}], 8)
    t = Tty(tiny_export, home, "--max-new-tokens", "8")
    out = t.turn("Fix this: " + "\x1b[200~" + code + "\x1b[201~" + "\r")
    assert len(STATS.findall(out)) == 0  # the stats line ends the turn: nothing before it was another reply
    assert want.strip() and want in out
    t.p.send("/stats\r")  # /stats prints the last reply's line: still only one reply was made
    t.p.expect(STATS)
    t.p.expect_exact(PROMPT)
    t.close()


def test_history_recall(tiny_export, home, api):
    first = reply(api, [{"role": "user", "content": "def add"}], 8)
    second = reply(api, [{"role": "user", "content": "def add"}, {"role": "assistant", "content": first},
                         {"role": "user", "content": "def add"}], 8)
    t = Tty(tiny_export, home, "--max-new-tokens", "8")
    assert first in t.turn("def add\r")
    assert second in t.turn("\x1b[A\r")  # ↑ recalls the line, Enter sends it again
    t.close()


def test_ctrl_c_at_the_prompt_and_during_a_reply_keeps_the_session(tiny_export, home, api):
    t = Tty(tiny_export, home, "--max-new-tokens", "200")
    t.p.send("half a lin")
    t.p.sendintr()  # at the prompt: the line is dropped, the chat goes on
    t.p.expect_exact(PROMPT)
    t.p.send("def add\r")
    t.p.sendintr()  # during (or just after) the reply
    t.p.expect(STATS)
    t.p.expect_exact(PROMPT)
    t.p.send('"""\rclass A:\r')  # inside a block
    t.p.expect_exact(PROMPT)
    t.p.sendintr()
    t.p.expect_exact(PROMPT)
    want = reply(api, [{"role": "user", "content": "hi"}], 200)
    t.p.send("/reset\r")
    t.p.expect_exact(PROMPT)
    assert want in t.turn("hi\r")
    t.close()


def test_a_conversation_longer_than_the_context_keeps_answering(tiny_export, home):
    t = Tty(tiny_export, home, "--max-new-tokens", "40", "--system", "You are a fox.")
    notices = 0
    for i in range(14):  # 14 turns of ~50 tokens: several times the 256-token context
        out = t.turn(f"tell me more, part {i}\r")
        notices += "context full: dropped the" in out
    assert notices >= 1
    t.close()


# -- through a pipe ----------------------------------------------------------------------------------


def test_blocks_commands_and_slash_lines(tiny_export, home, api):
    system = "You are terse."
    block = "Fix:\ndef f(x):\n    return x"
    convo = [{"role": "system", "content": system}, {"role": "user", "content": block}]
    convo.append({"role": "assistant", "content": reply(api, convo, 8)})
    convo.append({"role": "user", "content": "/tmp is full on my laptop, which files can I delete?"})
    convo.append({"role": "assistant", "content": reply(api, convo, 8)})
    script = ('/system You are terse.\n"""Fix:\ndef f(x):\n    return x"""\n'
              "/tmp is full on my laptop, which files can I delete?\n/system\n/help\n/exit\n")
    r = piped(tiny_export, home, script.encode(), "--max-new-tokens", "8")
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode() == convo[2]["content"] + "\n" + convo[4]["content"] + "\n"
    err = r.stderr.decode()
    assert "unknown command" not in err and "[system prompt: You are terse.]" in err and "/reset" in err


def test_invalid_utf8_in_a_line_does_not_end_the_session(tiny_export, home, api):
    r = piped(tiny_export, home, b"caf\xe9 \xff\nhi\n", "--max-new-tokens", "6")
    assert r.returncode == 0, r.stderr
    err = r.stderr.decode()
    assert "replaced by U+FFFD" in err and "Traceback" not in err
    first = [{"role": "user", "content": "caf\ufffd \ufffd"}]
    first.append({"role": "assistant", "content": reply(api, first, 6)})
    first.append({"role": "user", "content": "hi"})
    assert r.stdout.decode() == first[1]["content"] + "\n" + reply(api, first, 6) + "\n"


def test_a_long_piped_conversation_drops_the_oldest_turns(tiny_export, home):
    turns = "".join(f"the quick brown fox jumps over the lazy dog, part {i}\n" for i in range(12))
    r = piped(tiny_export, home, turns.encode(), "--max-new-tokens", "40")
    assert r.returncode == 0, r.stderr
    err = r.stderr.decode()
    assert "context full: dropped the" in err and len(STATS.findall(err)) == 12


def test_read_turn_blocks_and_clean_text():
    import io

    lines = PlainInput(io.StringIO('one\n"""\na\n  b\n"""\n"""x"""\n"""open\nend'))
    assert [read_turn(lines) for _ in range(5)] == ["one", "\na\n  b\n", "x", "open\nend", None]
    assert clean_text("caf\udce9") == ("caf\ufffd", True)
    assert clean_text("ok ✓") == ("ok ✓", False)
    assert clean_text("\ud800x") == ("\ufffdx", True)


def test_dropping_turns_keeps_the_system_prompt_and_the_kv_cache_serves_again(api, capsys):
    from edgespec.apps.chat import Conversation

    api.reset()
    conv = Conversation(api, "You are a fox.", max_new_tokens=40)
    room = api.context_length - 40
    prev, drops, reused = 0, 0, 0
    for i in range(16):
        conv.turns.append({"role": "user", "content": f"tell me more about the lazy dog, part {i}"})
        n = len(conv.turns)
        ids = conv.fit()
        assert len(ids) <= room and conv.messages()[0] == {"role": "system", "content": "You are a fox."}
        if len(conv.turns) < n:  # dropped: at most half the room is in use afterwards
            drops += 1
            assert len(ids) <= room // 2 and conv.turns[0]["role"] == "user"
        else:  # the previous prompt is a prefix of this one: the cache serves all of it
            common = next((j for j, (a, b) in enumerate(zip(api.tokens, ids)) if a != b), min(len(api.tokens), len(ids)))
            assert common >= prev
            reused += prev > 0
        g = api.generate(input_ids=ids, max_new_tokens=40, proposers=()).run()
        conv.turns.append({"role": "assistant", "content": g.text})
        prev = len(ids)
    err = capsys.readouterr().err
    assert drops >= 2 and reused >= 8 and err.count("context full: dropped the") == drops
