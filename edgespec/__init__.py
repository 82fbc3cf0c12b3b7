"""edgespec: lossless speculative sampling on onnxruntime for edge devices.

The runtime needs only onnxruntime, numpy, tokenizers and jinja2. The exporter lives in the separate
``edgespec_export`` package (``pip install edgespec[export]``).

Importing edgespec opts this process out of onnxruntime's telemetry (``ORT_DISABLE_TELEMETRY=1``, and
``ORT_TELEMETRY_DISABLED=1`` for newer releases) unless the variables are already set: onnxruntime ≥ 1.29 on
Linux otherwise writes a device id and an event database under ``~/.cache/Microsoft/DeveloperTools`` and
queues usage events when it initialises. It only takes effect if onnxruntime was not imported before
edgespec. The public names are imported lazily, so ``import edgespec.cli`` stays light.
"""

import os as _os

for _var in ("ORT_DISABLE_TELEMETRY", "ORT_TELEMETRY_DISABLED"):
    _os.environ.setdefault(_var, "1")

__version__ = "0.1.0"

_PUBLIC = {"AdaptiveK": "adaptive", "EdgespecError": "errors", "Generation": "decoder", "GenerationStats": "stats",
           "SpecDecoder": "decoder"}
__all__ = sorted(_PUBLIC) + ["__version__"]


def __getattr__(name: str):
    if name in _PUBLIC:
        import importlib

        return getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    raise AttributeError(f"module 'edgespec' has no attribute {name!r}")
