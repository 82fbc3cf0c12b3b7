"""edgespec: lossless speculative sampling on onnxruntime for edge devices.

The runtime needs only onnxruntime, numpy, tokenizers and jinja2. The exporter is the
``edgespec.export`` subpackage (directory ``export/``; its dependencies: ``pip install edgespec[export]``),
never imported by the runtime; pair recipes in ``edgespec.models`` (directory ``models/``).

Importing edgespec opts this process out of onnxruntime's telemetry (``ORT_DISABLE_TELEMETRY=1``, and
``ORT_TELEMETRY_DISABLED=1`` for newer releases) unless the variables are already set: onnxruntime ≥ 1.29 on
Linux otherwise writes a device id and an event database under ``~/.cache/Microsoft/DeveloperTools`` and
queues usage events when it initialises. It only takes effect if onnxruntime was not imported before
edgespec. The public names are imported on first use, so ``import edgespec.cli`` stays light (a Ctrl-C
during start-up reaches the CLI's handler).
"""

import os as _os

for _var in ("ORT_DISABLE_TELEMETRY", "ORT_TELEMETRY_DISABLED"):
    _os.environ.setdefault(_var, "1")

__version__ = "0.1.0"

from . import _moved  # noqa: E402  (the flat layout's module paths, e.g. edgespec.decoder, as aliases)

_moved.install()

_PUBLIC = {"AdaptiveK": "control.adaptive", "SpecDecoder": "engine.decoder", "EdgespecError": "errors",
           "Generation": "engine.generation", "GenerationOptions": "engine.generation", "KPolicy": "control.kpolicy",
           "RoundPlan": "core.round", "RoundResult": "core.round", "Proposal": "core.round",
           "Proposer": "draft.base", "register": "draft.base", "GenerationStats": "core.stats",
           "Processing": "core.processors", "Constraint": "core.constrain"}
__all__ = sorted(_PUBLIC) + ["__version__"]


def __getattr__(name: str):
    if name in _PUBLIC:
        import importlib

        return getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    raise AttributeError(f"module 'edgespec' has no attribute {name!r}")
