"""The fork image stays single-threaded and small, and the boundary's packages import one another one way
(docs/design.md "The fork image").

Every module of ``supervisor.boundary.forkimage``, and every supervisor module it reaches through its imports
(the packages above each one included: importing a module runs its parents' ``__init__``), is read as an AST,
so an import inside a function or under ``TYPE_CHECKING`` counts too. None may import an event loop, a thread,
a subprocess or DNS, nor the boundary's trio side, the capture, control or the link. The capture reaches nothing
of ``supervisor.boundary.process`` the same way (the process side may import the capture, not the reverse).
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.tracked import ROOT, tracked

FORK_IMAGE = "supervisor.boundary.forkimage"
CAPTURE = "supervisor.boundary.capture"
PROCESS = "supervisor.boundary.process"

# top-level modules the fork image never imports: each starts threads, an event loop or a pool, or registers an
# at-fork handler that every exec would then run (dnspython pulls in threading)
FORBIDDEN_TOP = ("trio", "threading", "subprocess", "asyncio", "dns", "concurrent")
# packages of ours the fork image never imports: they run under trio or belong to the other daemon
FORBIDDEN_OURS = (PROCESS, CAPTURE, "supervisor.control", "supervisor.link")


@dataclass(frozen=True)
class Import:
    """One import statement's target, where it was written."""

    module: str  # the importing module
    target: str  # the imported module, absolute
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, module: str, is_package: bool, known: Iterable[str] = ()) -> list[Import]:
    """Every import of ``source`` (relative ones made absolute); ``from p import name`` is an import of
    ``p.name`` when that is a known module, and of ``p`` otherwise (its parents are ``reach``'s to add)."""
    known = set(known)
    out: list[Import] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.extend(Import(module, alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, *([base] if base else [])])
            named = [f"{base}.{alias.name}" for alias in node.names]
            modules = [name for name in named if name in known]
            targets = modules if len(modules) == len(named) else [base, *modules]
            out.extend(Import(module, target, node.lineno) for target in targets)
    return out


def parents(module: str) -> Iterator[str]:
    """``a.b.c`` → ``a``, ``a.b``: the packages whose ``__init__`` runs before it."""
    parts = module.split(".")
    for end in range(1, len(parts)):
        yield ".".join(parts[:end])


def reach(roots: Iterable[str], graph: Mapping[str, list[Import]], stop: Iterable[str] = ()) -> dict[str, list[str]]:
    """Every supervisor module ``roots`` reach (parents included) → the shortest chain of modules that leads to
    it. A module under ``stop`` is not entered: the import that reaches it is the finding, not what it imports."""
    stop = tuple(stop)
    chains: dict[str, list[str]] = {}
    queue = deque((root, [root]) for root in sorted(roots))
    while queue:
        module, chain = queue.popleft()
        if module in chains or module not in graph:
            continue
        chains[module] = chain
        if _matches(module, stop) and len(chain) > 1:
            continue
        nexts = [*parents(module), *(imp.target for imp in graph[module])]
        queue.extend((n, [*chain, n]) for n in nexts if n in graph and n not in chains)
    return chains


def _matches(target: str, names: Iterable[str]) -> bool:
    return any(target == name or target.startswith(f"{name}.") for name in names)


def violations(
    roots: Iterable[str], graph: Mapping[str, list[Import]], forbidden: Iterable[str], what: str
) -> list[str]:
    """One line per forbidden import in the modules ``roots`` reach: the module, its line, the import and how
    the roots reach that module. The search stops at a forbidden package of ours (``reach``)."""
    forbidden = tuple(forbidden)
    found: list[str] = []
    for module, chain in sorted(reach(roots, graph, stop=FORBIDDEN_OURS).items()):
        if _matches(module, FORBIDDEN_OURS) and len(chain) > 1:
            continue  # reached through a forbidden import, which is reported where it is made
        for imp in graph[module]:
            if _matches(imp.target, forbidden):
                via = " → ".join(chain)
                found.append(f"{module} (line {imp.line}) imports {imp.target}: {what} (reached: {via})")
    return sorted(set(found))


def build_graph(sources: Mapping[str, tuple[str, bool]]) -> dict[str, list[Import]]:
    """Module name → its imports, from ``name → (source, is it a package's __init__)``."""
    return {name: imports_of(text, name, is_package, sources) for name, (text, is_package) in sources.items()}


def _graph() -> dict[str, list[Import]]:
    paths = tracked("supervisor")
    return build_graph({module_name(p): (p.read_text(encoding="utf-8"), p.name == "__init__.py") for p in paths})


def _package(graph: Mapping[str, list[Import]], package: str) -> list[str]:
    return [name for name in graph if _matches(name, [package])]


# --- the tree ------------------------------------------------------------------------------------------------


def test_the_fork_image_package_is_there() -> None:
    modules = _package(_graph(), FORK_IMAGE)
    assert {f"{FORK_IMAGE}.zygote", f"{FORK_IMAGE}.child", f"{FORK_IMAGE}.linux"} <= set(modules)


def test_the_fork_image_imports_no_thread_loop_or_subprocess() -> None:
    graph = _graph()
    found = violations(_package(graph, FORK_IMAGE), graph, FORBIDDEN_TOP, "the fork image is single-threaded")
    assert not found, "\n".join(found)


def test_the_fork_image_imports_nothing_of_the_trio_side_capture_control_or_link() -> None:
    graph = _graph()
    found = violations(_package(graph, FORK_IMAGE), graph, FORBIDDEN_OURS, "the fork image imports only itself")
    assert not found, "\n".join(found)


def test_the_capture_does_not_import_the_process_side() -> None:
    graph = _graph()
    found = violations(_package(graph, CAPTURE), graph, [PROCESS], "process imports capture, not the reverse")
    assert not found, "\n".join(found)


# --- the checker, on planted sources -------------------------------------------------------------------------


def _planted(files: Mapping[str, str]) -> dict[str, list[Import]]:
    """A graph of planted sources by path (``…/__init__.py`` is its package)."""
    return build_graph({module_name(ROOT / rel): (text, rel.endswith("/__init__.py")) for rel, text in files.items()})


def test_a_planted_import_deep_in_a_function_two_modules_away_is_found() -> None:
    graph = _planted(
        {
            "supervisor/boundary/forkimage/__init__.py": "",
            "supervisor/boundary/forkimage/a.py": "from . import b\n",
            "supervisor/boundary/forkimage/b.py": "from supervisor.protocol import c\n",
            "supervisor/protocol/__init__.py": "",
            "supervisor/protocol/c.py": "def f():\n    import threading.local\n",
        },
    )
    found = violations([f"{FORK_IMAGE}.a"], graph, FORBIDDEN_TOP, "single-threaded")
    assert found == [
        "supervisor.protocol.c (line 2) imports threading.local: single-threaded (reached: "
        "supervisor.boundary.forkimage.a → supervisor.boundary.forkimage.b → supervisor.protocol.c)"
    ]


def test_a_planted_parent_package_import_and_a_type_checking_one_are_found() -> None:
    graph = _planted(
        {
            "supervisor/boundary/__init__.py": "from supervisor.boundary.process import launcher\n",
            "supervisor/boundary/process/__init__.py": "",
            "supervisor/boundary/process/launcher.py": "",
            "supervisor/boundary/forkimage/__init__.py": "",
            "supervisor/boundary/forkimage/a.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from supervisor.link import h2link\n"
            ),
        },
    )
    found = violations([f"{FORK_IMAGE}.a"], graph, FORBIDDEN_OURS, "x")
    assert [line.split(":")[0] for line in found] == [
        "supervisor.boundary (line 1) imports supervisor.boundary.process.launcher",
        "supervisor.boundary.forkimage.a (line 3) imports supervisor.link",
    ]


def test_allowed_imports_pass() -> None:
    graph = _planted(
        {
            "supervisor/boundary/forkimage/__init__.py": "",
            "supervisor/boundary/forkimage/a.py": "import os, socket\nfrom . import b\nimport threadingx\n",
            "supervisor/boundary/forkimage/b.py": "from supervisor.protocol.exit_codes import ExitCode\n",
        },
    )
    assert violations([f"{FORK_IMAGE}.a"], graph, (*FORBIDDEN_TOP, *FORBIDDEN_OURS), "x") == []
