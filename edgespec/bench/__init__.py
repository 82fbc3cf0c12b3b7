"""Benchmarks and evaluation: ``edgespec bench`` (:mod:`.runner`), the context sweep (:mod:`.context`), ``edgespec
eval`` and the lossless checks (:mod:`.evaluate`), the built-in prompts. Imports the engine and the layers below.

``from edgespec.bench import run_bench`` (the names of :mod:`.runner`, where ``edgespec.bench`` was one module)
still works: they are imported on first use.
"""


_SUBMODULES = ("context", "evaluate", "progress", "prompts", "runner")


def __getattr__(name: str):
    if name.startswith("__") or name in _SUBMODULES:
        raise AttributeError(f"module 'edgespec.bench' has no attribute {name!r}")
    from . import runner

    try:
        return getattr(runner, name)
    except AttributeError:
        raise AttributeError(f"module 'edgespec.bench' has no attribute {name!r}") from None
