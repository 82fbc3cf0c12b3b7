"""The one place that maps a mode to its proposers and its K policy, and the default draft length K.

``edgespec generate/chat/serve/complete`` (``--mode``, ``--lookup``, ``--suffix``, ``--tree``, ``--k``: through
:func:`generation_options` and :func:`k_policy`), ``edgespec voice`` and ``edgespec bench``'s modes (``k2+lookup``, ``adaptive+tree``, …)
all resolve here.
"""

from __future__ import annotations

from .generation import DEFAULT_K, GenerationOptions

__all__ = ["ANSWER_PRIORS", "CATCHUP_MARGINS", "DEFAULT_K", "controller_settings", "generation_options", "k_policy",
           "mode_proposers", "proposers"]

#: The expected answer length (new tokens) of a use before its controller has seen an answer (its
#: ``answer_prior``). Voice: the voice system prompt asks for one or two short spoken sentences; the bench's voice
#: prompts answered in 12–20 tokens in every recorded run (``bench/results/peers-*.json``), so a cold controller
#: that priced the draft's ~45-token prompt catch-up against half of ``max_new_tokens`` (64) started the draft on
#: answers it could not pay back in (0.80–0.89× of plain, docs/benchmarks.md, Intel Xeon family 6 model 207, 2026-12-01). Other uses: None (half of
#: what the request allows).
ANSWER_PRIORS: dict[str, float] = {"voice": 24.0}

#: A use's draft catch-up margin, ``(catchup_margin, catchup_weight)`` of
#: :class:`~edgespec.control.adaptive.AdaptiveK` (default (0.10, 1.0)). Voice: (0.15, 2.0). Its answers run 14–18
#: tokens, too few to learn the draft's acceptance before the answer ends, and prompt lookup pays on them at no
#: catch-up; with the default margin a cold controller started the draft on a voice prompt where it ran 0.78×
#: plain (lookup alone 1.06×; Intel Xeon family 6 model 167, 2026-12-05, ``bench/results/heldout-2026-12-05-xeon167.json``).
#: Replayed over two recordings and five cost curves (``bench/probes/controller_replay.py``, docs/benchmarks.md) the
#: voice margin is never slower on voice and lifts it 0.94× → 1.05× (built-in prompts) and 1.00× → 1.16× (held-out)
#: on that Xeon's costs; rerun there, the held-out voice prompts ran 1.09× plain (lowest 1.05×, lookup alone 1.09×,
#: ``bench/results/heldout-voice-2026-12-05-xeon167.json``). The same
#: margin for every use slowed code (on the Zen 4's costs 1.24× → 1.08× plain: a code answer is long enough to
#: repay the catch-up), so the other uses keep the default.
CATCHUP_MARGINS: dict[str, tuple[float, float]] = {"voice": (0.15, 2.0)}


def controller_settings(use: str | None) -> dict:
    """The :class:`~edgespec.control.adaptive.AdaptiveK` keywords of a use (``"voice"``, ``"chat"``, … or None):
    its ``answer_prior`` (:data:`ANSWER_PRIORS`) and, where it has one, its catch-up margin
    (:data:`CATCHUP_MARGINS`)."""
    key = use or ""
    settings: dict = {"answer_prior": ANSWER_PRIORS.get(key)}
    if key in CATCHUP_MARGINS:
        settings["catchup_margin"], settings["catchup_weight"] = CATCHUP_MARGINS[key]
    return settings


def proposers(first: tuple[str, ...] = (), draft: bool = True, tree: bool = False,
              fixed_k: bool = False) -> tuple[str, ...]:
    """A mode's proposers in priority order: ``first`` (proposers without a model, e.g. ``("lookup",)``), then,
    with ``draft``, the draft model's chain — a tree with ``tree``: one of a fixed size (``fixed_k``) replaces
    the chain, an adaptive one is offered beside it. ``draft=False``: ``first`` alone (``()``: plain decoding)."""
    if not draft:
        return tuple(first)
    chain = (("tree",) if fixed_k else ("draft", "tree")) if tree else ("draft",)
    return tuple(first) + chain


def k_policy(decoder, k: int | None, latency_budget_ms: float | None = None, memory: str | None = None,
             use: str | None = None):
    """The K policy of a mode: None when ``k`` fixes K (the generation options' fixed K), else an adaptive
    controller (:class:`~edgespec.control.adaptive.AdaptiveK`) calibrated on ``decoder``, with the latency budget
    ``latency_budget_ms`` (ms per round, None: none), the controller memory ``memory`` (a use's name, None:
    start cold, save nothing; see :meth:`~edgespec.control.adaptive.AdaptiveK.for_decoder`) and the answer-length
    prior and catch-up margin of ``use`` (default: ``memory``'s; :func:`controller_settings`, e.g. ``"voice"``)."""
    if k is not None:
        return None
    from ..control.adaptive import AdaptiveK

    settings = controller_settings(use if use is not None else memory)
    return AdaptiveK.for_decoder(decoder, latency_budget_ms=latency_budget_ms, memory=memory, **settings)


def mode_proposers(mode: str = "spec", lookup: bool = True, suffix: bool = False, tree: bool = False,
                   fixed_k: bool = False) -> tuple[str, ...]:
    """The proposers of a generation mode, in priority order: ``plain`` (none: the target alone), ``lookup`` or
    ``suffix`` (that proposer alone), or ``spec`` (the draft model, after prompt lookup with ``lookup`` and suffix
    trees with ``suffix``; token trees with ``tree``, see :func:`proposers`)."""
    if mode == "plain":
        return proposers(draft=False)
    if mode in ("lookup", "suffix"):
        return proposers((mode,), draft=False)
    first = (("suffix",) if suffix else ()) + (("lookup",) if lookup else ())
    return proposers(first, tree=tree, fixed_k=fixed_k)


def generation_options(mode: str = "spec", lookup: bool = True, suffix: bool = False, tree: bool = False,
                       k: int | None = None, **fields) -> GenerationOptions:
    """The :class:`GenerationOptions` of a mode: its proposers (:func:`mode_proposers`; ``k`` given: a fixed K),
    K = ``k`` or :data:`DEFAULT_K` as the draft length and the tree node budget, and ``fields``: the options'
    other fields (``max_new_tokens``, ``temperature``, ``seed``, …). Its K policy is :func:`k_policy` with the
    same ``k`` (when the options have proposers).

    Raises:
        ValueError: an invalid option value. TypeError: an unknown field.
    """
    fixed = k if k is not None else DEFAULT_K
    return GenerationOptions(proposers=mode_proposers(mode, lookup, suffix, tree, fixed_k=k is not None),
                             k=fixed, n_nodes=fixed, **fields)
