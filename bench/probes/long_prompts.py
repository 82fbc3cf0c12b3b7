"""Long code-edit prompts (114–906 tokens in Qwen2.5's tokenizer on Python 3.11) from the Python standard
library's own source, which every machine has: one function or method each, with an instruction before it.

Prompts of 64 tokens or more are what run on an export's int8 prefill graph (``edgespec export --prefill-int8``),
which the built-in prompts of ``edgespec eval`` are too short to reach. Usage:

    python bench/probes/long_prompts.py > bench/prompts/long-code-edits.jsonl
    edgespec eval DIR --prompts bench/prompts/long-code-edits.jsonl

writes JSON lines ``{"class": "code-edit", "prompt": ...}`` (the format of ``edgespec bench --prompts``).
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import textwrap

PICKS = (
    ("textwrap", "TextWrapper._wrap_chunks", "Add type hints to this method and keep its behaviour unchanged."),
    ("json.decoder", "py_scanstring", "Rewrite this function so that it collects the chunks in a list comprehension "
                                      "where it can; keep the behaviour."),
    ("shlex", "split", "Explain what this function does, line by line."),
    ("fnmatch", "translate", "Add a docstring with two examples to this function, and return the whole function."),
    ("heapq", "merge", "Rename the variable `h` to `heap` throughout this function and return the whole function."),
    ("string", "Template.substitute", "Add type hints to this method and return it whole."),
)


def prompts() -> list[dict]:
    out = []
    for module, name, ask in PICKS:
        obj = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
        out.append({"class": "code-edit", "prompt": f"{ask}\n\n```python\n{textwrap.dedent(inspect.getsource(obj))}```"})
    return out


if __name__ == "__main__":
    sys.stdout.write("".join(json.dumps(p) + "\n" for p in prompts()))
