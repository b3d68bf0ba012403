"""No import circle between the integration's modules, ``if TYPE_CHECKING:`` imports included.

The graph is read from the source (the AST), not from ``sys.modules``: an import inside a function or
under ``TYPE_CHECKING`` counts as much as one at the top, since a circle that only a late import or a
type-checking guard keeps from failing is still two modules that cannot be understood apart. An
import of a package's module counts as an edge to that module alone (not to the packages above it,
whose ``__init__`` Python runs first: Home Assistant's entry module imports its platforms).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "custom_components" / "llm_lanes"
ROOT = "custom_components.llm_lanes"


def _module_name(path: Path) -> str:
    """Return the dotted name of a file of the package."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([ROOT, *parts])


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    """Return the absolute name of what a ``from ... import`` names, relative or not."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    # A package's own ``from . import`` is relative to itself, a module's to its package.
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, node.module] if node.module else base)


def import_graph() -> dict[str, set[str]]:
    """Return every module of the package with the package's modules it imports."""
    files = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                source = _resolve(name, node, is_package)
                for alias in node.names:
                    # ``from .core import pool`` imports the module ``core.pool``.
                    submodule = f"{source}.{alias.name}"
                    targets.append(submodule if submodule in files else source)
            graph[name].update(
                target for target in targets if target in files and target != name
            )
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Return the strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def describe(graph: dict[str, set[str]], circle: list[str]) -> str:
    """Say which module of a circle imports which others of it."""
    short = {name: name.removeprefix(f"{ROOT}.") for name in circle}
    return "; ".join(
        f"{short[name]} -> {', '.join(sorted(short[t] for t in graph[name] if t in short))}"
        for name in circle
    )


def test_the_graph_is_read() -> None:
    """The reader finds known edges: at the top of a module and under ``TYPE_CHECKING``."""
    graph = import_graph()
    assert f"{ROOT}.core.model" in graph[f"{ROOT}.core.scheduler"]
    assert f"{ROOT}.coordinator" in graph[f"{ROOT}.jobs.recalibration"]  # TYPE_CHECKING
    assert f"{ROOT}.core.ticket" in graph[f"{ROOT}.core.slots"]  # TYPE_CHECKING
    assert len(graph) > 100


def test_relative_imports_are_resolved() -> None:
    """``from .x import y`` and ``from .. import y``: from a module and from a package."""
    (sibling,) = ast.parse("from .const import DOMAIN").body
    (parent,) = ast.parse("from ..core import pool").body
    assert isinstance(sibling, ast.ImportFrom) and isinstance(parent, ast.ImportFrom)
    assert _resolve(f"{ROOT}.sensor", sibling, False) == f"{ROOT}.const"
    assert _resolve(f"{ROOT}.jobs", sibling, True) == f"{ROOT}.jobs.const"
    assert _resolve(f"{ROOT}.jobs.model", parent, False) == f"{ROOT}.core"


def test_circles_are_found() -> None:
    """A made-up graph's circles are reported, each once, and a line of modules is not one."""
    graph = {
        "a": {"b"},
        "b": {"c"},
        "c": {"a"},
        "d": {"a", "e"},
        "e": {"d"},
        "f": {"a"},
    }
    assert circles(graph) == [["a", "b", "c"], ["d", "e"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle() -> None:
    """No two modules of the integration import each other, directly or through others."""
    graph = import_graph()
    found = circles(graph)
    assert not found, "import circles: " + " | ".join(describe(graph, c) for c in found)
