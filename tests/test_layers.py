"""The import direction of edgespec/: each layer folder imports only the layers below it, and no module imports
itself back through others (no circle). Read from the source with ``ast``: every import counts, those inside
functions and under ``TYPE_CHECKING`` too."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "edgespec"

# bottom to top; a module may import its own folder and the folders of lower rank. bench and voice are peers (same
# rank: neither imports the other); apps sits over both; the package itself and its entry point over everything.
LAYERS = {
    "edgespec.errors": 0, "edgespec._moved": 0,
    "edgespec.core": 1,
    "edgespec.io": 2,
    "edgespec.draft": 3,
    "edgespec.control": 4,
    "edgespec.engine": 5,
    "edgespec.bench": 6, "edgespec.voice": 6,
    "edgespec.apps": 7,
    "edgespec": 8, "edgespec.cli": 8,
}


def module_name(path: Path) -> str:
    parts = ["edgespec", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def layer(module: str) -> str:
    """The layer a module belongs to: the longest declared prefix."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYERS:
            return ".".join(parts[:n])
    raise KeyError(module)


def imports(module: str) -> set[str]:
    """The edgespec modules ``module`` imports (``from pkg import name`` counts as pkg.name where that is a
    module of its own), outside ``edgespec.export`` and ``edgespec.models`` (their own packages)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names]  # a module of its own, or a name in `base`
        else:
            continue
        for t in targets:
            if t.split(".")[0] != "edgespec" or t.split(".")[:2] in (["edgespec", "export"], ["edgespec", "models"]):
                continue
            while t not in MODULES:  # `from edgespec.x import name`: the module edgespec.x
                t = t.rpartition(".")[0]
            if t != module:
                out.add(t)
    return out


GRAPH = {m: imports(m) for m in MODULES}


def test_every_module_is_in_a_declared_layer():
    unknown = []
    for m in MODULES:
        try:
            layer(m)
        except KeyError:
            unknown.append(m)
    assert not unknown, f"declare a layer for {unknown} in LAYERS"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_down_the_layers(module):
    own = layer(module)
    up = sorted(t for t in GRAPH[module] if layer(t) != own and LAYERS[layer(t)] >= LAYERS[own])
    assert not up, f"{module} ({own}) imports {up}: a layer above it or beside it"


def test_no_import_circle():
    """Depth-first search for a back edge; reports the circle it closes."""
    state, stack, circles = {}, [], []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in sorted(GRAPH[m]):
            if state.get(t) == "open":
                circles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = "done"

    for m in sorted(MODULES):
        if m not in state:
            visit(m)
    assert not circles, "import circles: " + "; ".join(" → ".join(c) for c in circles)


def test_the_check_sees_imports():
    """The graph is not empty where imports are known to exist (the test would pass vacuously otherwise)."""
    assert "edgespec.core.sampling" in GRAPH["edgespec.core.token_tree"]
    assert "edgespec.draft.base" in GRAPH["edgespec.draft.chain"]
    assert "edgespec.io.paths" in GRAPH["edgespec.io.manifest"]  # `from . import paths`


def test_the_flat_layout_paths_are_the_moved_modules():
    """``edgespec.decoder`` and the other module paths of the flat layout import the moved module itself (the same
    object: a monkeypatch of one is a monkeypatch of the other)."""
    import importlib

    from edgespec._moved import MOVED

    for old, new in MOVED.items():
        assert importlib.import_module(f"edgespec.{old}") is importlib.import_module(f"edgespec.{new}"), old
    from edgespec.decoder import SpecDecoder
    from edgespec.engine.decoder import SpecDecoder as moved

    assert SpecDecoder is moved
    assert importlib.import_module("edgespec.decoder").__spec__.name == "edgespec.engine.decoder"  # reload works


def _imports_exporter(module: str) -> bool:
    for node in ast.walk(ast.parse(MODULES[module].read_text(), str(MODULES[module]))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        if any(n == "edgespec.export" or n.startswith("edgespec.export.") for n in names):
            return True
    return False


def test_only_apps_and_voice_import_the_exporter():
    """``edgespec.export`` (torch, optimum: the ``export`` extra) is reached only from the apps and voice layers,
    lazily, never from the runtime below them."""
    users = {m for m in MODULES if _imports_exporter(m)}
    assert users, "the check found no importer of edgespec.export at all (the CLI's export command is one)"
    below = sorted(m for m in users if layer(m) not in ("edgespec.apps", "edgespec.voice"))
    assert not below, f"{below} import edgespec.export"
