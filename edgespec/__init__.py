"""edgespec: lossless speculative sampling on onnxruntime for edge devices.

The runtime needs only onnxruntime, numpy, tokenizers and jinja2. The exporter lives in the separate
``edgespec_export`` package (``pip install edgespec[export]``).
"""

__version__ = "0.1.0"
