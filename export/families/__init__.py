"""Model families the exporter writes into graph format 3, one file each; :func:`family_for` picks one by the
Hugging Face ``model_type``. Adding a family: a :class:`export.families.base.Family` subclass in a file of its own,
listed in :data:`FAMILIES`, with a tiny random model of it in ``tests/tinyfamilies.py``."""

from __future__ import annotations

from edgespec.errors import EdgespecError

from .base import Family
from .gemma3 import Gemma3
from .llama import Llama
from .phi3 import Phi3
from .qwen2 import Qwen2
from .qwen3 import Qwen3

FAMILIES: tuple[type[Family], ...] = (Qwen2, Qwen3, Llama, Gemma3, Phi3)
ARCHITECTURES = tuple(a for f in FAMILIES for a in f.architectures)


def family_for(architecture: str) -> type[Family]:
    """The family class that writes ``architecture`` (a Hugging Face ``model_type``).

    Raises:
        EdgespecError: no family writes it.
    """
    for f in FAMILIES:
        if architecture in f.architectures:
            return f
    raise EdgespecError(f"unsupported architecture {architecture!r} (supported: {', '.join(ARCHITECTURES)})")
