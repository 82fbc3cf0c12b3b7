"""edgespec's exporter (imported as ``edgespec.export``; its dependencies come with the ``edgespec[export]`` extra).

Layers, each importing only the ones below it:

- :mod:`.pipeline` — ``edgespec export``: sources → pair check → per-model graph → export directory;
  :mod:`.profiles` decides which optional graphs (int8 prefill graph, int8 KV cache) it writes, :mod:`.tune` the
  int4 layout by measurement;
- :mod:`.build` — one graph: its options, the graph formats a model allows, built once into the graph cache;
- :mod:`.validate` — the graph against the numpy reference of its weights (:mod:`.reference`), or PyTorch;
- :mod:`.families` — one file per model family: how its tensors make a decoder (graph format 3);
- :mod:`.gqa_graph`, :mod:`.kv_int8`, :mod:`.prefill_graph`, :mod:`.quantize` — graph formats and rewrites;
- :mod:`.weights` and :mod:`.tokenizer` — GGUF files and safetensors directories, read one tensor at a time;
  :mod:`.sources` resolves what the user named (a file, a directory, a hub id, a recipe).

GGUF files and safetensors directories need onnx, onnxruntime, numpy, gguf, safetensors and tokenizers; hub ids and
graph formats 2 (:mod:`.traced_graph`) and 4 need torch and transformers (the ``torch`` extra). The runtime in
:mod:`edgespec` never imports the exporter.
"""

from .build import ExportOptions
from .pipeline import export_pair

__all__ = ["ExportOptions", "export_pair"]
