"""edgespec's exporter (imported as ``edgespec.export``; its dependencies come with the ``edgespec[export]`` extra).

Needs torch, transformers, optimum and onnx; the runtime in :mod:`edgespec` never imports it.
"""

from .pipeline import ExportOptions, export_pair

__all__ = ["ExportOptions", "export_pair"]
