"""Gemma 3's settings from a GGUF header, read as llama.cpp b11434 reads them (``src/models/gemma3.cpp``):
optional ``sliding_window_pattern`` (a number or a per-layer array), ``rope.freq_base_swa``, the 27B's attention
scale, and a refused ``final_logit_softcapping``."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from edgespec.errors import EdgespecError
from edgespec.export.weights.gguf import GGUFSource


def settings(keys: dict, layers: int = 18, hidden: int = 640, heads: int = 4, head_dim: int = 256) -> dict:
    get = lambda key, default=None: keys.get(key, default)  # noqa: E731
    return GGUFSource._gemma3(SimpleNamespace(path=Path("m.gguf")), get, layers, hidden, heads, head_dim)


def test_defaults_every_sixth_layer_global_local_base_10000():
    s = settings({"attention.sliding_window": 512})
    assert [i for i, t in enumerate(s["layer_types"]) if t == "full_attention"] == [5, 11, 17]
    assert (s["sliding_window"], s["rope_local_theta"], s["query_pre_attn_scalar"]) == (512, 10000.0, 256.0)


def test_pattern_key_and_swa_base_are_read():
    s = settings({"attention.sliding_window": 1024, "attention.sliding_window_pattern": 3,
                  "rope.freq_base_swa": 5000.0}, layers=6)
    assert s["layer_types"] == ("sliding_attention", "sliding_attention", "full_attention") * 2
    assert s["rope_local_theta"] == 5000.0
    s = settings({"attention.sliding_window": 8, "attention.sliding_window_pattern": [True, False, True]}, layers=3)
    assert s["layer_types"] == ("sliding_attention", "full_attention", "sliding_attention")


def test_no_window_no_sliding_layers_and_27b_scale():
    assert "layer_types" not in settings({})
    assert settings({}, layers=62, hidden=5376, heads=32, head_dim=128)["query_pre_attn_scalar"] == 168.0


def test_final_logit_softcapping_is_refused():
    with pytest.raises(EdgespecError, match="final_logit_softcapping"):
        settings({"final_logit_softcapping": 30.0})
