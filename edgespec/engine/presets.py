"""The one place that maps a mode to its proposers and its K policy, and the default draft length K.

``edgespec generate/chat/serve`` (``--mode``, ``--lookup``, ``--suffix``, ``--tree``, ``--k``) and ``edgespec
bench``'s modes (``k2+lookup``, ``adaptive+tree``, …) both resolve here.
"""

from __future__ import annotations

DEFAULT_K = 4  # the draft length K of a fixed-K generation without its own (GenerationOptions.k, --k, bench)


def proposers(first: tuple[str, ...] = (), draft: bool = True, tree: bool = False,
              fixed_k: bool = False) -> tuple[str, ...]:
    """A mode's proposers in priority order: ``first`` (proposers without a model, e.g. ``("lookup",)``), then,
    with ``draft``, the draft model's chain — a tree with ``tree``: one of a fixed size (``fixed_k``) replaces
    the chain, an adaptive one is offered beside it. ``draft=False``: ``first`` alone (``()``: plain decoding)."""
    if not draft:
        return tuple(first)
    chain = (("tree",) if fixed_k else ("draft", "tree")) if tree else ("draft",)
    return tuple(first) + chain


def k_policy(decoder, k: int | None, latency_budget_ms: float | None = None, memory: str | None = None):
    """The K policy of a mode: None when ``k`` fixes K (the generation options' fixed K), else an adaptive
    controller (:class:`~edgespec.control.adaptive.AdaptiveK`) calibrated on ``decoder``, with the latency budget
    ``latency_budget_ms`` (ms per round, None: none) and the controller memory ``memory`` (a use's name, None:
    start cold, save nothing; see :meth:`~edgespec.control.adaptive.AdaptiveK.for_decoder`)."""
    if k is not None:
        return None
    from ..control.adaptive import AdaptiveK

    return AdaptiveK.for_decoder(decoder, latency_budget_ms=latency_budget_ms, memory=memory)
