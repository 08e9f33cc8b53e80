"""Interfaces say what they mean: no untyped JSON objects cross a function's boundary.

The bar: no public function or method of any module of the daemons' packages (control, boundary, protocol, link)
or of the package's top-level modules takes or returns a ``dict[str, Any]`` — nor the same thing in disguise: a
bare ``dict``/``Mapping``, a ``Mapping[str, Any]``, a ``dict[str, object]``, or any of those inside a union, list,
tuple or callable. What crosses is a frozen dataclass with ``to_wire()``/``from_wire()`` at the JSON edge; only
that edge (listed in ``_WIRE_EDGE``, each with its reason) may speak raw JSON objects.

The CLI (supervisor/cli) and the manifest renderer (supervisor/k8s) are out of scope: their JSON is the operator
API's client and the rendered manifests, documents by nature.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import importlib
import inspect
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.tracked import tracked

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "supervisor"

# The daemons' packages, every module of them in scope; and the package's own top-level modules.
_PACKAGES = ("supervisor.control", "supervisor.boundary", "supervisor.protocol", "supervisor.link")
_OUT_OF_SCOPE = ("supervisor.cli", "supervisor.k8s")

# The JSON codec at the wire edge: qualified name → why it may take or return a raw JSON object. Every class's
# ``to_wire``/``from_wire`` is the edge by name and needs no entry.
_WIRE_EDGE: dict[str, str] = {
    # link/rpc.py is the JSON codec of the link's operations: it turns request and reply objects into bytes on an
    # HTTP/2 stream and back. What the objects mean is decided at each end, by the typed parsers and writers in
    # protocol/ (attach.parse_attach / AttachRequest.to_wire, process_ops.parse_*, ExitResult.to_wire, ...).
    "supervisor.link.rpc.call": "the unary client codec: JSON object in, JSON object (or OpError) out",
    "supervisor.link.rpc.open_channel": "the channel client codec: the request object and the accept reply",
    "supervisor.link.rpc.Router.unary_raw": "registers a handler of JSON objects, for tests of the transport itself",
    "supervisor.link.rpc.Router.channel_raw": "as unary_raw, for channel operations",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _all_modules() -> dict[str, Path]:
    return {_module_name(path): path for path in tracked("supervisor")}


def modules_in_scope() -> list[str]:
    """Every module of the daemons' packages and every top-level module (``supervisor.jsonlog``, …)."""
    scope = []
    for name in _all_modules():
        top_level = name.count(".") == 1 and name != "supervisor.__main__"
        if (name.startswith(_PACKAGES) or top_level) and not name.startswith(_OUT_OF_SCOPE):
            scope.append(name)
    return sorted(scope)


def _is_any_like(tp: object) -> bool:
    return tp is Any or tp is object


def _untyped_json(tp: object) -> bool:
    """True for ``dict[str, Any]`` and its disguises, anywhere inside ``tp``."""
    if tp in (dict, typing.Dict, collections.abc.Mapping, collections.abc.MutableMapping, typing.Mapping):  # noqa: UP006
        return True
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    mapping = origin in (dict, collections.abc.Mapping, collections.abc.MutableMapping)
    if mapping and len(args) == 2 and _is_any_like(args[1]):
        return True
    if origin is typing.Annotated:
        return _untyped_json(args[0])
    if origin is typing.Literal:
        return False
    if origin is collections.abc.Callable and args and isinstance(args[0], list):
        return any(_untyped_json(arg) for arg in [*args[0], args[1]])
    return any(_untyped_json(arg) for arg in args if arg is not Ellipsis)


def _public_callables(module: ModuleType) -> Iterator[tuple[str, Callable[..., object]]]:
    seen: set[int] = set()
    for qualname, func in _candidates(module):
        if id(func) not in seen:
            seen.add(id(func))
            yield qualname, func


def _candidates(module: ModuleType) -> Iterator[tuple[str, Callable[..., object]]]:
    for name, value in vars(module).items():
        if name.startswith("_") or getattr(value, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(value):
            yield f"{module.__name__}.{name}", value
        elif inspect.isclass(value):
            for attr, member in vars(value).items():
                if attr.startswith("_") and attr != "__init__":
                    continue
                if isinstance(member, staticmethod | classmethod):
                    member = member.__func__
                elif isinstance(member, property):
                    member = member.fget
                if inspect.isfunction(member):
                    yield f"{module.__name__}.{name}.{attr}", member
            if dataclasses.is_dataclass(value):  # the generated __init__ takes the fields
                yield f"{module.__name__}.{name}.__init__", value.__init__


def _violations(qualname: str, func: Callable[..., object]) -> list[str]:
    try:
        hints = typing.get_type_hints(func, include_extras=True)
    except NameError as exc:  # a hint that names something imported only for type checking
        return [f"{qualname}: annotations cannot be resolved ({exc})"]
    return [
        f"{qualname}: {'returns' if name == 'return' else f'parameter {name!r} is'} {hint!r}"
        for name, hint in hints.items()
        if _untyped_json(hint)
    ]


def test_scope_is_every_module_of_the_daemons() -> None:
    scope = modules_in_scope()
    assert "supervisor.protocol.egress" in scope
    assert "supervisor.link.rpc" in scope
    assert "supervisor.jsonlog" in scope
    assert "supervisor.boundary.forkimage.zygote" in scope  # a module no other package imports
    assert "supervisor.control.l7.session.request" in scope
    assert not any(name.startswith(("supervisor.cli", "supervisor.k8s")) for name in scope)


def test_detector_sees_disguises() -> None:
    assert _untyped_json(dict[str, Any])
    assert _untyped_json(dict)
    assert _untyped_json(collections.abc.Mapping[str, object])
    assert _untyped_json(list[dict[str, Any]] | None)
    assert _untyped_json(Callable[[dict[str, Any]], None])
    assert not _untyped_json(dict[str, str])
    assert not _untyped_json(collections.abc.Mapping[str, int])
    assert not _untyped_json(Any)


def _module_violations(module_name: str) -> list[str]:
    module = importlib.import_module(module_name)
    found: list[str] = []
    for qualname, func in _public_callables(module):
        if qualname in _WIRE_EDGE or qualname.rsplit(".", 1)[-1] in ("from_wire", "to_wire"):
            continue
        found.extend(_violations(qualname, func))
    return found


@pytest.mark.parametrize("module_name", modules_in_scope())
def test_no_untyped_json_crosses_a_function(module_name: str) -> None:
    found = _module_violations(module_name)
    assert not found, (
        "untyped JSON objects cross a function's boundary (type them: a frozen dataclass with to_wire/from_wire):\n"
        + "\n".join(found)
    )


def test_wire_edge_entries_are_needed() -> None:
    """An allow-list entry for something that no longer exists, or that no longer speaks raw JSON objects, is dead
    weight: remove it."""
    modules = _all_modules()
    for qualname in _WIRE_EDGE:
        parts = qualname.split(".")
        cut = max(i for i in range(1, len(parts)) if ".".join(parts[:i]) in modules)
        obj: object = importlib.import_module(".".join(parts[:cut]))
        for attr in parts[cut:]:
            assert hasattr(obj, attr), qualname
            obj = getattr(obj, attr)
        assert callable(obj) and _violations(qualname, obj), f"{qualname} is typed now: remove its entry"
