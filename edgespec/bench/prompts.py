"""The built-in benchmark prompt set: four classes a coding assistant on a device meets.

- ``code``: write new code from a description.
- ``code-edit``: the user pastes code and asks for a change (the answer repeats much of the input).
- ``chat``: general questions answered in prose.
- ``voice``: short spoken-style answers (a voice assistant's system prompt, one or two sentences).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import EdgespecError

VOICE_SYSTEM = "You are a voice assistant. Answer in one or two short spoken sentences, no lists, no code."

_EDIT_SRC = '''def load_users(path):
    users = []
    with open(path) as f:
        for line in f:
            name, age, email = line.strip().split(",")
            users.append({"name": name, "age": int(age), "email": email})
    return users


def adults(users):
    result = []
    for u in users:
        if u["age"] >= 18:
            result.append(u)
    return result
'''

_EDIT_SRC2 = '''class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        return self.items.pop()

    def peek(self):
        return self.items[-1]

    def is_empty(self):
        return len(self.items) == 0
'''

BUILTIN: dict[str, list[str]] = {
    "code": [
        "Write a Python function that checks whether a number is prime.",
        "Write a Python function that returns the n-th Fibonacci number using memoization.",
        "Write a JavaScript function that debounces another function.",
        "Write a Python class for an LRU cache with get and put methods.",
    ],
    "code-edit": [
        "Add type hints and docstrings to this code, and return the whole file:\n```python\n" + _EDIT_SRC + "```",
        "Rename the field `email` to `mail` everywhere in this code and return the whole file:\n```python\n"
        + _EDIT_SRC + "```",
        "Make pop and peek raise IndexError with a clear message when the stack is empty. Return the whole "
        "class:\n```python\n" + _EDIT_SRC2 + "```",
        "Add a `size` method and a `__len__` to this class and return the whole class:\n```python\n"
        + _EDIT_SRC2 + "```",
    ],
    "chat": [
        "Explain what a KV cache is in a transformer, in one paragraph.",
        "What are the differences between a process and a thread?",
        "Give me three tips for writing readable code.",
        "Why is the sky blue?",
    ],
    "voice": [
        "What time zone is Tokyo in?",
        "How long should I boil an egg for a soft yolk?",
        "What's a good name for a grey cat?",
        "Remind me what the capital of Australia is.",
    ],
}


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt: its class and chat messages."""

    cls: str
    messages: tuple[dict, ...]

    @property
    def text(self) -> str:
        return self.messages[-1]["content"]


def builtin(per_class: int | None = None, classes: list[str] | None = None) -> list[Prompt]:
    """The built-in set (``per_class`` prompts of each class, all by default)."""
    out = []
    for cls, prompts in BUILTIN.items():
        if classes and cls not in classes:
            continue
        for text in prompts[:per_class]:
            msgs = [{"role": "user", "content": text}]
            if cls == "voice":
                msgs.insert(0, {"role": "system", "content": VOICE_SYSTEM})
            out.append(Prompt(cls, tuple(msgs)))
    return out


def load_file(path: str | Path) -> list[Prompt]:
    """Prompts from a file: JSON lines ``{"class": ..., "prompt": ...}`` (an optional ``"system"`` adds a system
    message before it) or plain text, one prompt per line.

    Raises:
        EdgespecError: the file is missing, not UTF-8 text, or holds no prompt.
    """
    p = Path(path)
    try:
        lines = [ln for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]
    except OSError as e:
        raise EdgespecError(f"{path}: cannot read prompts ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise EdgespecError(f"{path}: not a UTF-8 text file of prompts (undecodable byte at offset {e.start})") from None
    out = []
    for i, ln in enumerate(lines, 1):
        if ln.lstrip().startswith("{"):
            try:
                d = json.loads(ln)
                msgs = ({"role": "user", "content": str(d["prompt"])},)
                if d.get("system") is not None:
                    msgs = ({"role": "system", "content": str(d["system"])},) + msgs
                out.append(Prompt(str(d.get("class", "custom")), msgs))
            except (ValueError, KeyError, AttributeError):
                raise EdgespecError(f"{path}:{i}: expected {{\"class\": ..., \"prompt\": ...}}") from None
        else:
            out.append(Prompt("custom", ({"role": "user", "content": ln},)))
    if not out:
        raise EdgespecError(f"{path}: no prompts")
    return out
