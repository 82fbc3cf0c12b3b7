"""Where weights come from: sources of named float32 numpy tensors, read one tensor at a time.

Every source gives the Hugging Face view of a model, whatever its file format: :class:`ModelConfig` with
Hugging Face's meanings, tensor names as in a Hugging Face ``model.safetensors`` (``model.layers.0.self_attn.
q_proj.weight``), each tensor float32 in Hugging Face's layout (a Linear weight is (out, in)) and meaning (a GGUF's
permuted Llama q/k rows are put back, Gemma's norm weights are w, not 1 + w). A graph writer or the numpy
reference (:mod:`export.reference`) then needs no knowledge of the file format, and holds one tensor at a time.

- :mod:`.gguf`: a GGUF file, memory-mapped (the ``gguf`` package's reader and dequantizers);
- :mod:`.safetensors`: a Hugging Face directory of ``*.safetensors`` (``safe_open``, lazily);
- :class:`DictSource`: tensors already in memory (tests; a transformers model's ``state_dict``).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..model_config import ModelConfig


class TensorSource(Protocol):
    """A model's config and its tensors by Hugging Face name (see the module docstring)."""

    config: ModelConfig

    def names(self) -> list[str]:
        """Every tensor name the source holds."""

    def get(self, name: str) -> np.ndarray:
        """The tensor ``name`` as float32 (a new array the caller may keep or drop).

        Raises:
            KeyError: the source has no tensor of that name (the exporter reports it as an EdgespecError).
        """


class DictSource:
    """A :class:`TensorSource` over tensors in memory: ``{name: array}`` (any float dtype; torch tensors too)."""

    def __init__(self, config: ModelConfig, tensors: dict):
        self.config = config
        self._tensors = tensors

    def names(self) -> list[str]:
        return list(self._tensors)

    def get(self, name: str) -> np.ndarray:
        t = self._tensors[name]
        if hasattr(t, "detach"):  # a torch tensor
            t = t.detach().to("cpu").float().numpy()
        return np.asarray(t, dtype=np.float32)


class Rows:
    """A 2-D tensor of a source read by rows when sliced (``rows[a:b]``, ``rows[int array]``) through the source's
    ``get_rows``, so a (V, H) table is never whole in float32: ``shape`` comes from the file's header."""

    def __init__(self, source, name: str, shape: tuple[int, int]):
        self.source, self.name, self.shape = source, name, shape

    def __getitem__(self, index) -> np.ndarray:
        return self.source.get_rows(self.name, index)


def rows(source: TensorSource, name: str) -> "Rows | np.ndarray":
    """``name`` as :class:`Rows` where the source can read rows and knows the shape, else the whole array."""
    shape = getattr(source, "shape", lambda n: None)(name)
    return Rows(source, name, shape) if shape is not None and hasattr(source, "get_rows") else source.get(name)


def has(source: TensorSource, name: str) -> bool:
    """Whether ``source`` holds a tensor ``name``."""
    return name in source.names()
