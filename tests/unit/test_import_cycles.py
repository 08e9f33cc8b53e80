"""No import cycles in supervisor/ — not at module level, not inside functions, not under ``TYPE_CHECKING``
(a cycle kept only for typing is still a cycle; the shared type belongs where both can import it).

The graph is read from the source (AST), so an import inside a function or a ``TYPE_CHECKING`` block counts.
``from package import submodule`` is an edge to the submodule only, not to the package's ``__init__``."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.tracked import tracked

ROOT = Path(__file__).resolve().parents[2]


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in tracked("supervisor"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _edges(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            submodules = [f"{base}.{alias.name}" for alias in node.names]
            targets = submodules if all(s in modules for s in submodules) else [base, *submodules]
        out.update(t for t in targets if t in modules and t != name)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    modules = _modules()
    graph = {name: _edges(name, path, modules) for name, path in modules.items()}
    assert _cycles(graph) == []


def test_the_walk_sees_cycles(tmp_path: Path) -> None:
    """The check itself can fail: imports under TYPE_CHECKING and inside functions are edges, and a two-module
    cycle is found."""
    source = tmp_path / "y.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from supervisor.x import T\n"
        "def f():\n    from supervisor.z import U\n"
    )
    modules = {"supervisor.x": tmp_path, "supervisor.y": source, "supervisor.z": tmp_path}
    assert _edges("supervisor.y", source, modules) == {"supervisor.x", "supervisor.z"}
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
