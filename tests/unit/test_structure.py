"""The insides of supervisor/ keep a shape a reader can hold: short functions, modules of one job, typed data.

Three limits over the tracked Python files under supervisor/ (their AST, so comments and docstrings never count):

1. No function or method longer than ``FUNCTION_LIMIT`` lines (its ``def`` line to its last line), except those
   in ``_LONG_PENDING``, each with its reason.
2. No module longer than ``MODULE_LIMIT`` lines, except those in ``_LONG_MODULES``, each with its reason.
3. No spelling of ``dict[str, Any]`` (annotations, aliases, casts) outside the modules that are themselves a JSON
   edge (``_JSON_EDGE_MODULES``): what crosses a module is a frozen dataclass, and a JSON document a module writes
   is ``dict[str, JsonValue]`` (supervisor/protocol/json_value.py), whose values mypy checks.

The allow-lists only shrink: an entry that no longer exceeds its limit, or no longer exists, fails too, so that
whoever splits a function or module also takes it off the list.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

from tests.tracked import ROOT, tracked

FUNCTION_LIMIT = 80
MODULE_LIMIT = 600

# qualified name (module.Class.function) → why it may still be longer than FUNCTION_LIMIT
_LONG_PENDING: dict[str, str] = {}

# path → why the module may be longer than MODULE_LIMIT
_LONG_MODULES: dict[str, str] = {
    "supervisor/boundary/capture/identity.py": "the resolver's stages, budget and failure kinds are one decision "
    "path (socket, connect record, owners, executable and ancestors)",
    "supervisor/boundary/process/launcher.py": "the trio side's one handle on the launcher: the single reader that "
    "files every reply, exit status and lease, and the operations built on it",
    "supervisor/control/inference/router.py": "one session per connection to inference.local: its TLS, each "
    "request's route, the backend exchange and the streamed answer's idle cut share the session's state",
    "supervisor/k8s/objects.py": "one pure function per object of a sandbox's companion set, rendered together "
    "from one RenderSpec",
    "supervisor/protocol/certs.py": "minting and loading are the two halves of one bundle format",
    "supervisor/protocol/ocsf.py": "one table mapping every event to its OCSF class, and the one rendering of it",
}

# path → why the module speaks raw JSON objects: the edge where bytes become typed values and back
_JSON_EDGE_MODULES: dict[str, str] = {
    "supervisor/protocol/ocsf.py": "builds the OCSF JSON events, object by object",
    "supervisor/link/rpc.py": "the JSON codec of the link's operations (unary calls and channel requests)",
    "supervisor/cli/api_client.py": "the operator API's JSON client",
    "supervisor/control/l7/body.py": "the JSON-RPC, MCP and GraphQL request bodies the evaluators read",
    "supervisor/boundary/forkimage/messages.py": "the launcher's messages, each a frozen dataclass, to and from the "
    "JSON objects of its wire",
}

# --- the checkers --------------------------------------------------------------------------------------------


def function_lengths(source: str, module: str) -> dict[str, int]:
    """Every function and method of ``source`` → its length in lines, by qualified name (``module.Class.f``;
    a nested function is ``module.outer.inner``). A name defined twice (a property's setter) keeps the longer."""
    out: dict[str, int] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}.{child.name}"
                length = (child.end_lineno or child.lineno) - child.lineno + 1
                out[name] = max(out.get(name, 0), length)
                walk(child, name)
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}.{child.name}")
            else:
                walk(child, prefix)

    walk(ast.parse(source), module)
    return out


def module_lines(source: str) -> int:
    return len(source.splitlines())


def dict_any_count(source: str) -> int:
    """How many times ``source``'s code (not its comments or strings) spells ``dict[str, Any]``."""
    count = 0
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("dict", "Dict")
            and isinstance(node.slice, ast.Tuple)
            and [ast.unparse(e) for e in node.slice.elts] in (["str", "Any"], ["str", "typing.Any"])
        ):
            count += 1
    return count


def over(sizes: Mapping[str, int], limit: int) -> dict[str, int]:
    return {name: size for name, size in sizes.items() if size > limit}


def unlisted(sizes: Mapping[str, int], limit: int, allowed: Mapping[str, str]) -> list[str]:
    """Names over ``limit`` that ``allowed`` does not list."""
    return sorted(f"{name} ({size} lines)" for name, size in over(sizes, limit).items() if name not in allowed)


def stale(sizes: Mapping[str, int], limit: int, allowed: Mapping[str, str]) -> list[str]:
    """Entries of ``allowed`` that no longer exist or no longer exceed ``limit``."""
    return sorted(
        f"{name} ({'gone' if name not in sizes else f'{sizes[name]} lines'})"
        for name in allowed
        if sizes.get(name, 0) <= limit
    )


# --- the tree ------------------------------------------------------------------------------------------------


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> Iterator[tuple[Path, str]]:
    for path in tracked("supervisor"):
        yield path, path.read_text(encoding="utf-8")


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_no_function_over_the_limit() -> None:
    sizes: dict[str, int] = {}
    for path, source in _sources():
        sizes.update(function_lengths(source, _module_name(path)))
    found = unlisted(sizes, FUNCTION_LIMIT, _LONG_PENDING)
    assert not found, (
        f"functions over {FUNCTION_LIMIT} lines: split each along the decisions it makes (by step, by phase, by "
        "field family):\n  " + "\n  ".join(found)
    )
    gone = stale(sizes, FUNCTION_LIMIT, _LONG_PENDING)
    assert not gone, "no longer over the limit or gone: take them off _LONG_PENDING:\n  " + "\n  ".join(gone)


def test_no_module_over_the_limit() -> None:
    sizes = {_relative(path): module_lines(source) for path, source in _sources()}
    found = unlisted(sizes, MODULE_LIMIT, _LONG_MODULES)
    assert not found, (
        f"modules over {MODULE_LIMIT} lines: split them into modules of one job, or list one with its reason in "
        "_LONG_MODULES:\n  " + "\n  ".join(found)
    )
    gone = stale(sizes, MODULE_LIMIT, _LONG_MODULES)
    assert not gone, "no longer over the limit or gone: take them off _LONG_MODULES:\n  " + "\n  ".join(gone)


def test_no_dict_any_outside_the_json_edge() -> None:
    counts = {_relative(path): dict_any_count(source) for path, source in _sources()}
    missing = sorted(set(_JSON_EDGE_MODULES) - set(counts))
    assert not missing, "no such module: take it off _JSON_EDGE_MODULES: " + ", ".join(missing)
    found = sorted(f"{path} ({n})" for path, n in counts.items() if path not in _JSON_EDGE_MODULES and n)
    assert not found, (
        "dict[str, Any] outside the JSON edge: type what crosses (a frozen dataclass with to_wire/from_wire), or "
        "a document written out as dict[str, JsonValue]:\n  " + "\n  ".join(found)
    )
    unused = sorted(path for path in _JSON_EDGE_MODULES if not counts[path])
    assert not unused, "no dict[str, Any] left: take them off _JSON_EDGE_MODULES: " + ", ".join(unused)


# --- the checkers, each on a planted source ------------------------------------------------------------------


def _body(lines: int) -> str:
    """A function body of ``lines`` lines, indented for a method."""
    return "".join(f"        x{i} = {i}\n" for i in range(lines))


def test_a_planted_long_method_is_found_and_an_80_line_one_is_not() -> None:
    source = (
        "class C:\n"
        "    def long(self):\n" + _body(FUNCTION_LIMIT) + "    async def fits(self):\n" + _body(FUNCTION_LIMIT - 1)
    )
    sizes = function_lengths(source, "pkg.mod")
    assert sizes["pkg.mod.C.long"] == FUNCTION_LIMIT + 1
    assert sizes["pkg.mod.C.fits"] == FUNCTION_LIMIT
    assert unlisted(sizes, FUNCTION_LIMIT, {}) == [f"pkg.mod.C.long ({FUNCTION_LIMIT + 1} lines)"]
    assert unlisted(sizes, FUNCTION_LIMIT, {"pkg.mod.C.long": "being split"}) == []


def test_a_planted_nested_function_is_named_by_its_outer_one() -> None:
    source = "def outer():\n    def inner():\n" + _body(FUNCTION_LIMIT) + "    return inner\n"
    sizes = function_lengths(source, "m")
    assert set(over(sizes, FUNCTION_LIMIT)) == {"m.outer", "m.outer.inner"}


def test_an_allow_list_entry_that_fits_or_is_gone_is_stale() -> None:
    sizes = {"m.split": 40, "m.still_long": 120}
    allowed = {"m.split": "being split", "m.still_long": "being split", "m.renamed": "being split"}
    assert stale(sizes, FUNCTION_LIMIT, allowed) == ["m.renamed (gone)", "m.split (40 lines)"]


def test_a_planted_long_module_is_found() -> None:
    sizes = {"a.py": module_lines("x = 1\n" * (MODULE_LIMIT + 1)), "b.py": module_lines("x = 1\n" * MODULE_LIMIT)}
    assert unlisted(sizes, MODULE_LIMIT, {}) == [f"a.py ({MODULE_LIMIT + 1} lines)"]
    assert stale(sizes, MODULE_LIMIT, {"b.py": "was long"}) == [f"b.py ({MODULE_LIMIT} lines)"]


def test_planted_dict_any_spellings_are_counted_and_text_is_not() -> None:
    source = (
        '"""A docstring naming dict[str, Any] is not code."""\n'
        "import typing\n"
        "from typing import Any, cast\n"
        "Doc = dict[str, Any]  # an alias: dict[str, Any] in this comment is not counted\n"
        "def f(a: dict[str, Any], b: list[dict[str, Any]] | None) -> dict[str, typing.Any]:\n"
        "    c: dict[str, Any] = {}\n"
        "    d: dict[str, int] = {}\n"
        "    e: dict[int, Any] = {}\n"
        "    return cast(dict[str, Any], c)\n"
    )
    assert dict_any_count(source) == 6
