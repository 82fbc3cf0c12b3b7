"""Export profiles: which optional graphs an export writes, chosen by the memory of the machine exporting it.

Two profiles:

- ``small``: each model's int4 graph with a float32 KV cache, nothing else. The default pair runs in about
  1.7 GB (peak RSS of a four-turn ``edgespec chat``): the export for boards with less than 8 GB of RAM.
- ``full``: beside each int4 graph, its int8 prefill graph (``--prefill-int8``, prompt chunks of 64 tokens or
  more) and an int8 KV cache (``--kv-int8``, graph format 3). The default pair then runs in about 3.5 GB. Against
  ``small`` it prefilled 1.7–1.9× faster (Intel Xeon model 167, AMD EPYC Zen 4), decoded after a 3,500-token
  past 1.07–1.19× faster and after a short one at the same speed, and code completion, whose latency is mostly
  its prompt, ran at 1.48× llama.cpp's best mode (docs/benchmarks.md, "Export profiles"). Its accuracy is
  ``small``'s: the int4 graphs are the same, the prefill graph is validated against the source weights and the
  int8 cache against the float32 one (``edgespec info``).

``auto`` (what ``edgespec export`` does unless told) takes ``full`` on a machine with at least
:data:`FULL_MIN_RAM_GIB` GiB of physical memory, else ``small``: an export is normally made where it runs, and
``--profile`` names one for another machine. A piece of ``full`` applies to a model only where it can: the
prefill graph to int4 weights (any layout), the int8 cache to graph format 3 and only beside a prefill graph
(alone it prefills long prompts at about 0.7×). Explicit ``--prefill-int8``/``--kv-int8`` (or their ``--no-``
forms) override the profile for their piece. Not measured on an AVX2-only CPU.
"""

from __future__ import annotations

import os
from dataclasses import replace

from edgespec.errors import EdgespecError
from edgespec.io.manifest import PROFILE_NAMES

from .build import ExportOptions

PROFILES = ("auto", *PROFILE_NAMES)
FULL_MIN_RAM_GIB = 7.0  # a board sold as 8 GB reports ~7.6-7.8 GiB; the full pair peaks at ~3.5 GB
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")  # cgroup v2, v1


def physical_memory() -> int | None:
    """The memory this process may use, in bytes: the machine's physical memory (``os.sysconf``), or a cgroup's
    limit where one is lower (a container on a larger host); None where the OS says neither."""
    try:
        n = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        n = None
    for path in CGROUP_LIMITS:
        try:
            with open(path, encoding="ascii") as f:
                text = f.read().strip()
        except (OSError, UnicodeDecodeError):
            continue
        if text.isdigit() and int(text) > 0:  # "max" (v2) or a huge number (v1): no limit
            n = int(text) if n is None else min(n, int(text))
    return n if n is not None and n > 0 else None


def resolve_profile(profile: str, memory: int | None = None) -> tuple[str, str]:
    """(``"small"`` or ``"full"``, why) for ``profile``; ``"auto"`` reads ``memory`` (bytes; default: this
    machine's, :func:`physical_memory`).

    Raises:
        EdgespecError: ``profile`` is not one of :data:`PROFILES`.
    """
    if profile not in PROFILES:
        raise EdgespecError(f"export profile {profile!r}: one of {', '.join(PROFILES)} expected")
    if profile != "auto":
        return profile, "asked for"
    memory = physical_memory() if memory is None else memory
    if memory is None:
        return "small", "auto: this machine's memory is unknown"
    gib = memory / 2**30
    if gib >= FULL_MIN_RAM_GIB:
        return "full", f"auto: {gib:.1f} GiB of RAM (at least {FULL_MIN_RAM_GIB:g})"
    return "small", f"auto: {gib:.1f} GiB of RAM (under {FULL_MIN_RAM_GIB:g})"


def not_applicable(opts: ExportOptions) -> str | None:
    """Why the ``full`` profile adds nothing to a model with ``opts`` (graph format decided), or None."""
    if opts.precision != "int4":
        return f"{opts.precision} weights (a prefill graph is made from int4 blocks)"
    return None


def apply_profile(name: str, opts: ExportOptions) -> ExportOptions:
    """``opts`` (graph format decided) with the pieces it leaves unset (``prefill_int8``/``kv_int8`` None)
    taken from the resolved profile ``name`` where they apply to this model (module docstring)."""
    full = name == "full"
    prefill = opts.prefill_int8 if opts.prefill_int8 is not None else full and not_applicable(opts) is None
    kv = opts.kv_int8 if opts.kv_int8 is not None else full and prefill and opts.graph_format == 3
    return replace(opts, prefill_int8=bool(prefill), kv_int8=bool(kv))
