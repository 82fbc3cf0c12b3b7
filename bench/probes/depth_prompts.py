"""Long-context prompts for a replay recording at depth: about 3,400 tokens of standard-library source (which every
machine has) and a question, in ``edgespec bench --prompts`` format (JSON lines ``{"class", "prompt"}``):

    python bench/probes/depth_prompts.py [EXPORT] > /tmp/depth-prompts.jsonl
    python bench/probes/controller_replay.py record EXPORT --prompts-file /tmp/depth-prompts.jsonl --out REC.json

The first is the context sweep's prompt (``edgespec bench --context 3500``: argparse and textwrap, "What does this
code do?"); the others ask about other modules, one for an edit and one for a short judgement. Sources are cut in
the export's tokenizer, so the same Python version gives the same prompts.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

from tokenizers import Tokenizer

from edgespec.bench.context import QUESTION
from edgespec.io import paths

PICKS = (  # class, modules, source tokens, question
    ("code", ("argparse", "textwrap"), 3440, QUESTION),
    ("code", ("json.decoder", "json.encoder", "shlex"), 3440, QUESTION),
    ("code-edit", ("string", "fnmatch", "heapq"), 3400,
     "\n```\n\nAdd type hints to the last function in this code and return that function whole."),
    ("chat", ("textwrap",), 3440, "\n```\n\nIs this code thread-safe? Explain briefly."),
)


def main() -> None:
    export = Path(sys.argv[1]).expanduser() if len(sys.argv) > 1 else paths.default_export_dir()
    tok = Tokenizer.from_file(str(export / "tokenizer.json"))
    for cls, modules, n, question in PICKS:
        text = "".join(Path(importlib.import_module(m).__file__).read_text(encoding="utf-8") for m in modules)
        body = tok.decode(tok.encode(text, add_special_tokens=False).ids[:n])
        print(json.dumps({"class": cls, "prompt": "```python\n" + body + question}))


if __name__ == "__main__":
    main()
