"""Reading YAML as nodes, so every value keeps the line it came from.

PyYAML's ``compose`` gives the node tree with marks; values are constructed one scalar at a time by the safe
constructor. Rules: mapping keys must be strings and unique (PyYAML would silently keep the last duplicate),
merge keys (``<<``) are refused, and nothing here ever executes tags (safe loader only).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

import yaml

from .errors import PolicyError, PolicyWarning

_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

MAX_POLICY_BYTES = 16 * 1024 * 1024


def line_of(node: yaml.Node | None) -> int | None:
    return None if node is None else node.start_mark.line + 1


def type_name(node: yaml.Node, value: Any = None) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(
        type(value), type(value).__name__
    )


class Reader:
    """Collects errors and warnings while a schema walks the node tree."""

    def __init__(self, text: str, source: str | None) -> None:
        self.text = text
        self.source = source
        self.errors: list[PolicyError] = []
        self.warnings: list[PolicyWarning] = []
        self._loader = _Loader("")

    def compose(self) -> yaml.Node | None:
        if len(self.text) > MAX_POLICY_BYTES:
            self.error("", None, f"policy is larger than {MAX_POLICY_BYTES} bytes")
            return None
        try:
            loader = _Loader(self.text)
            try:
                node = loader.get_single_node()
            finally:
                loader.dispose()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            problem = exc.problem or exc.context or "syntax error"
            self.errors.append(
                PolicyError(
                    "", f"YAML syntax error: {problem}", None, None if mark is None else mark.line + 1, self.source
                )
            )
            return None
        except yaml.YAMLError as exc:
            self.error("", None, f"YAML error: {exc}")
            return None
        return node

    def error(self, path: str, node: yaml.Node | None, message: str, expected: str | None = None) -> None:
        self.errors.append(PolicyError(path, message, expected, line_of(node), self.source))

    def warn(self, path: str, node: yaml.Node | None, message: str) -> None:
        self.warnings.append(PolicyWarning(path, message, line_of(node), self.source))

    # --- typed access ---------------------------------------------------------------------------------

    def value(self, node: yaml.Node) -> Any:
        """Construct a scalar (never a collection)."""
        try:
            return self._loader.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            return exc

    def mapping(self, node: yaml.Node, path: str) -> dict[str, tuple[yaml.Node, yaml.Node]] | None:
        if not isinstance(node, yaml.MappingNode):
            self.error(
                path, node, f"expected a mapping, got {type_name(node, self._scalar_or_none(node))}", "a mapping"
            )
            return None
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                self.error(path, key_node, "YAML merge keys ('<<') are not supported in policies")
                continue
            key = self.value(key_node) if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, str):
                self.error(path, key_node, f"mapping keys must be strings, got {key!r}")
                continue
            if key in out:
                self.error(_join(path, key), key_node, f"duplicate key {key!r}")
                continue
            out[key] = (key_node, value_node)
        return out

    def check_keys(
        self,
        items: dict[str, tuple[yaml.Node, yaml.Node]],
        path: str,
        allowed: Iterable[str],
        unsupported: dict[str, str] | None = None,
    ) -> None:
        allowed = tuple(allowed)
        for key, (key_node, _) in items.items():
            if unsupported and key in unsupported:
                self.error(_join(path, key), key_node, f"{unsupported[key]} is not supported yet")
            elif key not in allowed:
                hint = difflib.get_close_matches(key, allowed, n=1)
                message = f"unknown key {key!r}" + (f"; did you mean {hint[0]!r}?" if hint else "")
                self.error(_join(path, key), key_node, message, "one of " + ", ".join(allowed))

    def sequence(self, node: yaml.Node, path: str) -> list[yaml.Node] | None:
        if not isinstance(node, yaml.SequenceNode):
            self.error(path, node, f"expected a list, got {type_name(node, self._scalar_or_none(node))}", "a list")
            return None
        return list(node.value)

    def string(self, node: yaml.Node, path: str, *, allow_empty: bool = True) -> str | None:
        value = self._scalar_or_none(node)
        if not isinstance(node, yaml.ScalarNode) or not isinstance(value, str):
            self.error(path, node, f"expected a string, got {type_name(node, value)}", "a string")
            return None
        if not allow_empty and value == "":
            self.error(path, node, "must not be empty", "a non-empty string")
            return None
        return value

    def boolean(self, node: yaml.Node, path: str) -> bool | None:
        value = self._scalar_or_none(node)
        if not isinstance(node, yaml.ScalarNode) or not isinstance(value, bool):
            self.error(path, node, f"expected a boolean, got {type_name(node, value)}", "true or false")
            return None
        return value

    def integer(self, node: yaml.Node, path: str) -> int | None:
        value = self._scalar_or_none(node)
        if not isinstance(node, yaml.ScalarNode) or isinstance(value, bool) or not isinstance(value, int):
            self.error(path, node, f"expected an integer, got {type_name(node, value)}", "an integer")
            return None
        return value

    def _scalar_or_none(self, node: yaml.Node) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            return None
        value = self.value(node)
        return None if isinstance(value, Exception) else value


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
