"""The import direction of export/ (``edgespec.export``), as tests/test_layers.py checks edgespec/: each layer
imports only the layers below it, the numpy reference imports no graph writer (it must stay independent of what
it checks), and no module imports itself back through others. Every import counts, those inside functions too."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "export"

# bottom to top; a module may import its own layer's modules and lower ranks
LAYERS = {
    "export.model_config": 0, "export.onnx_graph": 0,
    "export.weights": 1, "export.tokenizer": 1, "export.sources": 1, "export.quantize": 1, "export.reference": 1,
    "export.gqa_graph": 2, "export.grouped_graph": 2, "export.prefill_graph": 2, "export.prune": 2,
    "export.traced_graph": 2,
    "export.families": 3,
    "export.validate": 4, "export.load": 4,
    "export.kv_int8": 5,  # its scales are calibrated by running the graph (export.validate's sessions)
    "export.build": 6, "export.voice": 6,  # export.build: one graph (cached); export.pipeline: the pair around it
    "export.tune": 6.5,  # builds candidate graphs (export.build) to choose one layout; export.pipeline calls it
    "export.profiles": 6.5,  # which optional graphs an export writes (export.build's options)
    "export.pipeline": 7, "export": 8,
}


def module_name(path: Path) -> str:
    parts = ["export", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def layer(module: str) -> str:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYERS:
            return ".".join(parts[:n])
    raise KeyError(module)


def imports(module: str) -> set[str]:
    """The export modules ``module`` imports (relative imports resolved; ``from pkg import name`` is pkg.name
    where that is a module)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        base = ".".join(up + ([node.module] if node.module else []))
        for a in node.names:
            full = f"{base}.{a.name}"
            out.add(full if full in MODULES else base)
    return {m for m in out if m in MODULES}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_export_imports_go_down_the_layers(module):
    rank = LAYERS[layer(module)]
    up = sorted(m for m in imports(module) if LAYERS[layer(m)] > rank)
    assert not up, f"{module} imports {up}: a layer above it"


def test_the_reference_is_independent_of_the_graph_writers():
    bad = {m for m in imports("export.reference") if layer(m) not in ("export.model_config", "export.weights")}
    assert not bad, f"export.reference imports {sorted(bad)}"


def test_no_import_circle_in_export():
    graph = {m: imports(m) - {m} for m in MODULES}
    seen, stack, circles = set(), [], []

    def visit(m):
        if m in stack:
            circles.append(stack[stack.index(m):] + [m])
            return
        if m in seen:
            return
        seen.add(m)
        stack.append(m)
        for n in graph[m]:
            if not (m.startswith(n + ".") or n == "export"):  # a package's own __init__ is not a circle
                visit(n)
        stack.pop()

    for m in sorted(graph):
        visit(m)
    assert not circles, f"import circles: {circles[:3]}"
