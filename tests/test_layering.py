"""localchat's import graph, read from the sources (ast, function-level imports too): no import
cycles between modules, whatever the level of the imports (a function-level or TYPE_CHECKING import
closes a cycle too); none between subpackages at module level; and each layer imports only the
layers below it.

From the bottom: kernels/ (compute), models/ (the model store: finding, pulling and listing
models), engine/ (loading and running them), then server/ (server/multimodel/ included), tui/,
bench/ and the `localchat` command. The top-level helper modules (errors, utils, config, envs, ...)
sit below them all.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

import localchat

ROOT = Path(localchat.__file__).parent
PACKAGE = "localchat"

# what each layer must never import, function-level and TYPE_CHECKING imports included
_ABOVE_ENGINE = ("server", "tui", "bench", "cli")
FORBIDDEN = {
    "kernels": ("engine", "models", *_ABOVE_ENGINE),
    "models": ("engine", *_ABOVE_ENGINE),
    "engine": _ABOVE_ENGINE,
}


@dataclass(frozen=True)
class Import:
    """One import of a localchat module by another."""

    source: str
    target: str
    line: int
    at_import_time: bool  # at module level, not in a function nor under `if TYPE_CHECKING:`


def modules() -> dict[str, Path]:
    """Every module of the package, by dotted name (a package by its __init__.py)."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _module_of(name: str, known: dict[str, Path]) -> str:
    """The innermost known module that `name` (a module, or a name inside one) lies in."""
    while name not in known and "." in name:
        name = name.rpartition(".")[0]
    return name


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", None)
    return name == "TYPE_CHECKING"


def _imports_of(name: str, path: Path, known: dict[str, Path]) -> list[Import]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, at_import_time: bool) -> None:
        for child in ast.iter_child_nodes(node):
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{alias.name}" for alias in child.names]
            for target in targets:
                if target.split(".")[0] == PACKAGE:
                    module = _module_of(target, known)
                    found.append(Import(name, module, child.lineno, at_import_time))
            nested = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            deferred = nested or (isinstance(child, ast.If) and _is_type_checking(child))
            visit(child, at_import_time and not deferred)

    visit(ast.parse(path.read_text(), str(path)), True)
    return found


def imports() -> list[Import]:
    known = modules()
    return [i for name, path in known.items() for i in _imports_of(name, path, known)]


def unit(module: str) -> str:
    """The subpackage or top-level module that `module` belongs to (engine, models, cli, ...)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            connect(node)
    return found


def _graph(key, found: list[Import]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for i in found:
        if key(i.source) != key(i.target):
            edges[key(i.source)].add(key(i.target))
    return edges


def _described(cycle: list[str], found: list[Import]) -> list[str]:
    """The imports that close `cycle`, each with its line and level."""
    members = set(cycle)
    described = (
        f"{i.source}:{i.line} imports {i.target}"
        + ("" if i.at_import_time else " (in a function or under TYPE_CHECKING)")
        for i in found
        if i.source != i.target and {i.source, i.target} <= members
    )
    return list(dict.fromkeys(described))


def test_the_parser_sees_every_kind_of_import():
    """Relative, function-level and TYPE_CHECKING imports all count (a guard on the parser)."""
    found = imports()
    sources = {i.source for i in found}
    assert len(modules()) > 150 and "localchat.cli" in sources
    assert any(not i.at_import_time for i in found)
    assert all(i.target in modules() for i in found)


def test_no_import_cycles_between_modules():
    """Not even through a function-level or TYPE_CHECKING import: two modules that need each
    other share a piece that belongs in a module below both."""
    found = imports()
    assert [_described(c, found) for c in cycles(_graph(lambda module: module, found))] == []


def test_no_import_cycles_between_subpackages():
    at_import_time = [i for i in imports() if i.at_import_time]
    assert cycles(_graph(unit, at_import_time)) == []


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_layer_imports_a_layer_above_it(layer):
    upward = [
        f"{i.source}:{i.line} imports {i.target}"
        for i in imports()
        if unit(i.source) == layer and unit(i.target) in FORBIDDEN[layer]
    ]
    assert upward == []
