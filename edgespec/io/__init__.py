"""Model I/O: onnxruntime sessions and providers, the KV caches, file pages, the export's manifest and integrity
checks, the tokenizer and chat template, and edgespec's paths. Imports only :mod:`edgespec.errors` and
:mod:`edgespec.core`."""
