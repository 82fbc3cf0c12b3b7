"""The module paths of the flat layout (before the layer folders) as aliases of the modules that replaced them.

``import edgespec.decoder`` gives the module :mod:`edgespec.engine.decoder` itself (the same object, so its
attributes, monkeypatches included, are shared), through a finder on ``sys.meta_path`` that the package installs
on import. New code imports the new paths; these keep older scripts and branches working. ``edgespec.bench`` (now
a package) and ``edgespec.cli`` (the entry point) are real modules, not aliases.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

MOVED = {
    "kpolicy": "control.kpolicy", "sampling": "core.sampling", "tree": "core.token_tree", "stats": "core.stats",
    "coupling": "core.coupling", "processors": "core.processors", "constrain": "core.constrain",
    "onnx_model": "io.onnx_model", "pages": "io.pages", "manifest": "io.manifest", "integrity": "io.integrity",
    "text": "io.text", "paths": "io.paths", "proposers": "draft", "lookup": "draft.lookup",
    "suffix": "draft.suffix", "adaptive": "control.adaptive", "calibrate": "control.calibrate",
    "decoder": "engine.decoder", "generation": "engine.generation", "chat": "apps.chat",
    "chat_input": "apps.chat_input", "serve": "apps.serve", "serve_fields": "apps.serve_fields",
    "serve_output": "apps.serve_output", "openai_api": "apps.openai_api", "openai_fields": "apps.openai_fields",
    "tools": "apps.tools", "fim": "apps.fim", "fim_api": "apps.fim_api", "fim_cli": "apps.fim_cli",
    "fim_serve": "apps.fim_serve", "context_bench": "bench.context", "evaluate": "bench.evaluate",
    "prompts": "bench.prompts", "progress": "bench.progress", "controller_memory": "control.memory",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``edgespec.<old>`` and loads it as the module ``edgespec.<new>``."""

    def find_spec(self, fullname, path=None, target=None):
        package, _, leaf = fullname.rpartition(".")
        if package != "edgespec" or leaf not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module(f"edgespec.{MOVED[spec.name.rpartition('.')[2]]}")
        spec.loader_state = module.__spec__  # the import system overwrites __spec__ with the alias's spec
        return module

    def exec_module(self, module):
        """The module ran when :meth:`create_module` imported it under its own name; its own ``__spec__`` goes
        back (so that ``importlib.reload`` of it still reloads it)."""
        alias = module.__spec__
        if alias is not None and alias.loader is self and alias.loader_state is not None:
            module.__spec__ = alias.loader_state


def install() -> None:
    """Put the alias finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())
