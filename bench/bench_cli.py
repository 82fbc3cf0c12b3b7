"""The common end of the benchmark scripts that run against llama.cpp: run, write ``OUT.json`` atomically,
print the markdown table (and optional extras), with errors as one line and exit status 1."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

from llama_server import PeerError

from edgespec.errors import EdgespecError


def write_result(out: Path, result: dict) -> Path:
    """Write ``result`` to ``<out>.json`` through a temporary file (never a half-written result); returns the path."""
    out.parent.mkdir(parents=True, exist_ok=True)
    path = out.with_name(out.name + ".json")
    tmp = out.with_name(out.name + ".json.tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(path)
    return path


def finish(args, run: Callable[[object], dict], table: Callable[[dict], str],
           after: Callable[[dict], None] | None = None) -> int:
    """``run(args)``, write it to ``args.out``, print ``table(result)`` then ``after(result)``. Returns the exit
    status: 1 (message on stderr, nothing written) on an ``EdgespecError``, ``PeerError`` or ``ValueError``."""
    try:
        result = run(args)
    except (EdgespecError, PeerError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    write_result(args.out, result)
    print(table(result))
    if after is not None:
        after(result)
    if "headline" in result:
        print(json.dumps(result["headline"], indent=1))
    return 0
