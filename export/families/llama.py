"""Llama 2 / 3.x (and Mistral, the same block): the defaults of :class:`export.families.base.Family`; Llama 3's
rotary scaling comes from the config (:mod:`.rotary`)."""

from .base import Family


class Llama(Family):
    architectures = ("llama", "mistral")
