"""Pair recipes: one JSON file per draft/target pair (imported as ``edgespec.models``).

A recipe names where each model's weights come from and how to export them. Exports never go here: they are
written to the user cache (see :mod:`edgespec.io.paths`).
"""

from __future__ import annotations

import json
from importlib import resources


def available() -> list[str]:
    """Names of the shipped recipes."""
    return sorted(p.name[:-5] for p in resources.files(__name__).iterdir() if p.name.endswith(".json"))


def load(name: str) -> dict:
    """The recipe ``name`` as a dict; KeyError if there is none."""
    f = resources.files(__name__) / f"{name}.json"
    if not f.is_file():
        raise KeyError(name)
    return json.loads(f.read_text())
