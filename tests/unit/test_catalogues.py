"""Names the outside world reads are defined once: event names in supervisor/protocol/event_names.py, the
``error`` codes an agent reads in supervisor/protocol/responses.py, the reasons of upstream refusals in
supervisor/protocol/upstream_reasons.py. No module spells one as a string literal
(docstrings, ``__all__`` and other enums' member values aside); the daemons' emitters, the CLI's human rendering,
dev mode's console and every refusal use the catalogues' members; docs/policy.md lists exactly the codes."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from supervisor.protocol.event_names import EventName
from supervisor.protocol.outcome_reasons import OutcomeReason
from supervisor.protocol.responses import STATUS, ErrorCode
from supervisor.protocol.upstream_reasons import UpstreamReason
from tests.tracked import tracked

REPO = Path(__file__).resolve().parents[2]
SUPERVISOR = REPO / "supervisor"
EMITTERS = {"emit", "_event", "log_event", "_on_event", "on_event"}


def _modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in tracked("supervisor"):
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
    """Values of members of enums (another catalogue's definitions: EndReason's ``enforcement-lost``) and the
    names in ``__all__`` (``answers.policy_denied`` is a function)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any("Enum" in ast.unparse(base) for base in node.bases):
            found |= {id(s.value) for s in node.body if isinstance(s, ast.Assign)}
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            found |= {id(c) for c in ast.walk(node.value)}
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
    """Every literal spelling of one of ``values`` outside ``catalogue``: anywhere for a name with a dot, a dash
    or an underscore (nothing else looks like one), in a name's position for a bare word (``dns`` is also a
    socket's name)."""
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
            if re.search(r"[._-]", node.value) or id(node) in positions:
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


def test_no_agent_visible_code_is_spelled_outside_its_catalogue() -> None:
    catalogue = SUPERVISOR / "protocol" / "responses.py"
    offenders = spelled_out({str(c) for c in ErrorCode}, catalogue, r"error|code", set(), "ERROR")
    assert offenders == [], "use supervisor.protocol.responses.ErrorCode:\n" + "\n".join(offenders)


def test_no_upstream_reason_is_spelled_outside_its_catalogue() -> None:
    """The reasons an agent reads in a refusal's ``reason`` when control could not, or would not, connect."""
    catalogue = SUPERVISOR / "protocol" / "upstream_reasons.py"
    offenders = spelled_out({str(r) for r in UpstreamReason}, catalogue, r"reason", set(), "REASON")
    assert offenders == [], "use supervisor.protocol.upstream_reasons.UpstreamReason:\n" + "\n".join(offenders)


def test_every_code_has_its_status() -> None:
    assert set(STATUS) == set(ErrorCode)
    for code in ErrorCode:
        assert code.status in (400, 403, 404, 407, 413, 500, 502, 503, 504), code
        assert re.fullmatch(r"[a-z]+(_[a-z0-9]+)+", code.value), code


def test_docs_list_exactly_the_codes_with_their_status() -> None:
    """docs/policy.md "Refusal codes" is the catalogue, row for row."""
    text = (REPO / "docs" / "policy.md").read_text()
    section = text.split("### Refusal codes", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `([a-z0-9_]+)` \| (\d{3}) \|", section, re.M)
    assert len(rows) == len(set(rows))
    assert {code: int(status) for code, status in rows} == {str(c): c.status for c in ErrorCode}


def _emitted_by() -> dict[str, set[str]]:
    """Which daemon's package names each event (``EventName.X`` in supervisor/boundary or supervisor/control)."""
    found: dict[str, set[str]] = {}
    for path, tree in _modules():
        side = path.relative_to(SUPERVISOR).parts[0]
        if side not in ("boundary", "control"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "EventName":
                found.setdefault(str(EventName[node.attr]), set()).add(side)
    return found


def test_docs_list_exactly_the_event_names_and_who_writes_them() -> None:
    """docs/design.md "Event names" is the catalogue, row for row, each with the daemon that writes it."""
    text = (REPO / "docs" / "design.md").read_text()
    section = text.split("### Event names", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `([a-z.-]+)` \| (boundary|control|both) \|", section, re.M)
    assert len(rows) == len(set(rows))
    assert {name for name, _ in rows} == {str(e) for e in EventName}
    emitted = _emitted_by()
    for name, side in rows:
        sides = emitted.get(name, set())
        assert sides == ({"boundary", "control"} if side == "both" else {side}), f"{name}: written by {sides}"


def test_no_outcome_reason_is_spelled_outside_its_catalogue() -> None:
    """The reasons both daemons give for a connection, tunnel or request that was not relayed."""
    catalogue = SUPERVISOR / "protocol" / "outcome_reasons.py"
    offenders = spelled_out({str(r) for r in OutcomeReason}, catalogue, r"reason|closed_by", set(), "REASON")
    assert offenders == [], "use supervisor.protocol.outcome_reasons.OutcomeReason:\n" + "\n".join(offenders)
