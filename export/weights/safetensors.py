"""A Hugging Face directory as a :class:`export.weights.TensorSource`: ``config.json`` and ``*.safetensors``
shards read lazily with ``safetensors``' ``safe_open``, one tensor at a time (bf16 and fp16 widened to float32)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from edgespec.errors import EdgespecError

from ..model_config import ModelConfig


def read_config(path: Path) -> dict:
    """``config.json`` of a Hugging Face directory as a dict.

    Raises:
        EdgespecError: missing, unreadable or not a JSON object.
    """
    try:
        cfg = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise EdgespecError(f"{path}/config.json: cannot read it ({e})") from None
    if not isinstance(cfg, dict):
        raise EdgespecError(f"{path}/config.json: not a JSON object")
    return cfg


class SafetensorsSource:
    """The tensors and config of a Hugging Face directory (module docstring); prefix ``language_model.`` (a
    multimodal Gemma 3 checkpoint) is dropped from names.

    Raises (on construction):
        EdgespecError: no ``*.safetensors`` file (a PyTorch ``.bin`` checkpoint needs the torch path), an
            unreadable shard, or a bad config.
    """

    def __init__(self, path: str | Path):
        from safetensors import safe_open

        self.path = Path(path)
        self.config = ModelConfig.from_hf(read_config(self.path))
        shards = sorted(self.path.glob("*.safetensors"))
        if not shards:
            raise EdgespecError(f"{self.path}: no *.safetensors weights (PyTorch .bin checkpoints are exported "
                                "through transformers: pip install 'edgespec[torch]')")
        self._where: dict[str, tuple[Path, str]] = {}
        for shard in shards:
            try:
                with safe_open(str(shard), framework="numpy") as f:
                    for key in f.keys():
                        name = key.replace("model.language_model.", "model.").replace("language_model.", "")
                        self._where[name] = (shard, key)
            except Exception as e:  # safetensors raises its own SafetensorError for a bad header
                raise EdgespecError(f"{shard}: not a readable safetensors file ({e})") from None

    def names(self) -> list[str]:
        return list(self._where)

    def shape(self, name: str) -> tuple[int, ...] | None:
        """The shape of tensor ``name`` from its shard's header, or None if absent."""
        from safetensors import safe_open

        if name not in self._where:
            return None
        shard, key = self._where[name]
        with safe_open(str(shard), framework="numpy") as f:
            return tuple(f.get_slice(key).get_shape())

    def get_rows(self, name: str, index) -> np.ndarray:
        """Rows ``index`` (a slice or int array) of the 2-D tensor ``name``, float32: a slice reads only its
        rows (bfloat16 included); an int array reads the tensor."""
        from safetensors import safe_open

        shard, key = self._where[name]
        if not isinstance(index, slice):
            return self.get(name)[index]
        with safe_open(str(shard), framework="numpy") as f:
            part = f.get_slice(key)
            start, stop, step = index.indices(part.get_shape()[0])  # safetensors does not clamp
            try:
                return np.asarray(part[start:stop:step], dtype=np.float32)
            except TypeError:  # bfloat16
                pass
        return _bf16(shard, key, slice(start, stop, step))

    def get(self, name: str) -> np.ndarray:
        from safetensors import safe_open

        shard, key = self._where[name]
        with safe_open(str(shard), framework="numpy") as f:
            try:
                return np.asarray(f.get_tensor(key), dtype=np.float32)
            except TypeError:  # bfloat16: numpy has no such dtype; read the raw bits
                pass
        return _bf16(shard, key)


def _bf16(shard: Path, key: str, rows: slice = slice(None)) -> np.ndarray:
    """A bfloat16 tensor (or the rows ``rows`` of its first dimension) widened to float32 from the file's bytes
    (numpy has no bfloat16): only those rows' bytes are read."""
    import struct

    with open(shard, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        info = json.loads(f.read(n))[key]
        if info["dtype"] != "BF16":
            raise EdgespecError(f"{shard}: tensor {key} has dtype {info['dtype']}, which numpy cannot read")
        shape = list(info["shape"])
        start, stop, step = rows.indices(shape[0] if shape else 1)
        row = int(np.prod(shape[1:], dtype=np.int64)) * 2 if shape else 2
        f.seek(8 + n + info["data_offsets"][0] + start * row)
        raw = np.frombuffer(f.read(max(0, stop - start) * row), dtype=np.uint16)
    out = (raw.astype(np.uint32) << 16).view(np.float32)
    if not shape:
        return out.reshape(())
    return out.reshape([max(0, stop - start)] + shape[1:])[::step]
