"""edgespec's exporter (installed as ``edgespec_export`` by the ``edgespec[export]`` extra).

Needs torch, transformers, optimum and onnx; the runtime in :mod:`edgespec` never imports it.
"""

from .pipeline import ExportOptions, export_pair

__all__ = ["ExportOptions", "export_pair"]
