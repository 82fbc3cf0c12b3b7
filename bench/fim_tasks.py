"""Fill-in-the-middle tasks from code nobody here wrote: the Python standard library's own source files
(imported by ``bench/fim_bench.py``; ``python bench/fim_bench.py --help`` runs them).

From each of :data:`MODULES` (resolved with ``inspect.getsourcefile``, so the files of the Python that runs
the benchmark), functions are picked with a seeded RNG; in each, a span of 1–5 whole lines of its body is
blanked out. The task is to complete that span with the lines before it (the prefix, at most
``prefix_lines``) and after it (the suffix, at most ``suffix_lines``), as an editor plug-in sends them.

Scoring (the definitions of CodeXGLUE / RepoBench line completion): exact match after stripping trailing
whitespace of every line and leading and trailing blank lines, and edit similarity
1 − Levenshtein(completion, answer) / max(len) over those normalized strings, in [0, 1].
"""

from __future__ import annotations

import ast
import importlib
import inspect
import random
from dataclasses import dataclass
from pathlib import Path

# stdlib modules (pure Python in CPython 3.10-3.13), a few dozen files
MODULES = ("argparse", "base64", "bisect", "calendar", "colorsys", "configparser", "copy", "csv", "dataclasses",
           "difflib", "enum", "fnmatch", "fractions", "ftplib", "functools", "getopt", "gettext", "glob", "gzip",
           "heapq", "hmac", "ipaddress", "json.decoder", "json.encoder", "mimetypes", "netrc", "ntpath",
           "operator", "optparse", "pprint", "queue", "quopri", "random", "sched", "secrets", "shlex", "shutil",
           "statistics", "string", "tabnanny", "tempfile", "textwrap", "tokenize", "uuid", "weakref", "zipapp")


@dataclass(frozen=True)
class Task:
    """One blanked span: ``prefix`` + ``answer`` + ``suffix`` are consecutive whole lines of ``path``
    (``answer`` is ``n_lines`` lines starting at 1-based line ``line``, in function ``function``)."""

    module: str
    path: str
    function: str
    line: int
    n_lines: int
    prefix: str
    answer: str
    suffix: str


def _functions(tree: ast.AST) -> list[ast.FunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.body and n.end_lineno - n.body[0].lineno >= 2]


def _code_line(s: str) -> bool:
    t = s.strip()
    return bool(t) and not t.startswith("#")


def tasks_from_source(module: str, path: str, source: str, rng: random.Random, per_file: int,
                      prefix_lines: int, suffix_lines: int) -> list[Task]:
    """Up to ``per_file`` tasks from one source text (functions drawn without replacement)."""
    lines = source.splitlines(keepends=True)
    funcs = _functions(ast.parse(source))
    rng.shuffle(funcs)
    out = []
    for f in funcs:
        if len(out) >= per_file:
            break
        first = f.body[0].lineno
        if isinstance(f.body[0], ast.Expr) and isinstance(getattr(f.body[0], "value", None), ast.Constant):
            first = f.body[0].end_lineno + 1  # not the docstring
        last = f.end_lineno
        if last - first < 0:
            continue
        n = rng.randint(1, 5)
        n = min(n, last - first + 1)
        start = rng.randint(first, last - n + 1)  # 1-based
        span = lines[start - 1:start - 1 + n]
        if not _code_line(span[0]) or not any(_code_line(s) for s in span):
            continue
        before = lines[max(0, start - 1 - prefix_lines):start - 1]
        after = lines[start - 1 + n:start - 1 + n + suffix_lines]
        out.append(Task(module, path, f.name, start, n, "".join(before), "".join(span), "".join(after)))
    return out


def stdlib_tasks(n_files: int, per_file: int, prefix_lines: int, suffix_lines: int, seed: int = 0,
                 modules: tuple[str, ...] = MODULES) -> list[Task]:
    """Tasks from the first ``n_files`` modules of ``modules`` that import and have a source file."""
    rng = random.Random(seed)
    out, files = [], 0
    for name in modules:
        if files >= n_files:
            break
        try:
            path = inspect.getsourcefile(importlib.import_module(name))
        except (ImportError, TypeError):
            continue
        if not path:
            continue
        source = Path(path).read_text(encoding="utf-8")
        got = tasks_from_source(name, path, source, random.Random(rng.random()), per_file, prefix_lines,
                                suffix_lines)
        if got:
            out += got
            files += 1
    return out


def normalize(text: str) -> str:
    """Trailing whitespace of every line and leading/trailing blank lines removed."""
    return "\n".join(line.rstrip() for line in text.splitlines()).strip("\n")


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions; one character each)."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def score(completion: str, answer: str) -> dict:
    """``exact_match`` (bool) and ``edit_similarity`` in [0, 1] of a completion against the removed lines."""
    c, r = normalize(completion), normalize(answer)
    sim = 1.0 if not c and not r else 1.0 - levenshtein(c, r) / max(len(c), len(r))
    return {"exact_match": c == r, "edit_similarity": sim}
