"""Names the outside world reads are defined once: event names in supervisor/protocol/event_names.py. No module
spells one as a string literal (docstrings and other enums' member values aside); the daemons' emitters, the
CLI's human rendering and dev mode's console all use the catalogue's members."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from supervisor.protocol.event_names import EventName

REPO = Path(__file__).resolve().parents[2]
SUPERVISOR = REPO / "supervisor"
EMITTERS = {"emit", "_event", "log_event", "_on_event", "on_event"}


def _modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(SUPERVISOR.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def _docstrings(tree: ast.AST) -> set[int]:
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _enum_member_values(tree: ast.AST) -> set[int]:
    """Values of members of enums: another catalogue's definitions (EndReason's ``enforcement-lost``)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any("Enum" in ast.unparse(base) for base in node.bases):
            found |= {id(s.value) for s in node.body if isinstance(s, ast.Assign)}
    return found


def _constants(node: ast.AST) -> list[ast.Constant]:
    if isinstance(node, ast.Constant):
        return [node]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [c for c in node.elts if isinstance(c, ast.Constant)]
    return []


def _name_positions(tree: ast.AST, subject: re.Pattern[str], call_names: set[str], holder: str) -> set[int]:
    """Constants standing where a name of the catalogue goes: the first argument of an emitter, a comparison
    with something named like ``subject``, a constant (or tuple of them) assigned to a name holding ``holder``."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in call_names:
                found |= {id(c) for c in _constants(node.args[0])}
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(subject.search(ast.unparse(s)) for s in sides if not _constants(s)):
                found |= {id(c) for s in sides for c in _constants(s)}
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and holder in t.id.upper() for t in node.targets
        ):
            found |= {id(c) for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
    return found


def spelled_out(values: set[str], catalogue: Path, subject: str, call_names: set[str], holder: str) -> list[str]:
    """Every literal spelling of one of ``values`` outside ``catalogue``: anywhere for a name with a dot or a dash
    (nothing else looks like one), in a name's position for a bare word (``dns`` is also a socket's name)."""
    pattern = re.compile(subject)
    offenders = []
    for path, tree in _modules():
        if path == catalogue:
            continue
        skip = _docstrings(tree) | _enum_member_values(tree)
        positions = _name_positions(tree, pattern, call_names, holder)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in values):
                continue
            if id(node) in skip:
                continue
            if re.search(r"[.-]", node.value) or id(node) in positions:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}")
    return offenders


def test_no_event_name_is_spelled_outside_its_catalogue() -> None:
    catalogue = SUPERVISOR / "protocol" / "event_names.py"
    offenders = spelled_out({str(e) for e in EventName}, catalogue, r"event|kind", EMITTERS, "EVENT")
    assert offenders == [], "use supervisor.protocol.event_names.EventName:\n" + "\n".join(offenders)


def test_every_emitter_is_given_a_member() -> None:
    """A new event is added to the catalogue first: no emitter is called with a string of its own."""
    offenders = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
                if name in EMITTERS and isinstance(node.args[0].value, str):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.args[0].value!r}")
    assert offenders == [], "add the name to supervisor.protocol.event_names.EventName:\n" + "\n".join(offenders)


def test_event_names_follow_the_naming_rule() -> None:
    for name in EventName:
        assert re.fullmatch(r"[a-z]+(-[a-z]+)*(\.[a-z]+(-[a-z]+)*)?", name.value), name
        assert name.name == name.value.upper().replace(".", "_").replace("-", "_")
