"""Qwen2 / Qwen2.5: Llama's block with biases on the q, k and v projections (read where the weights have them)."""

from .base import Family


class Qwen2(Family):
    architectures = ("qwen2",)
