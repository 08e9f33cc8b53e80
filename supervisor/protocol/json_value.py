"""A JSON value as a type: for the diagnostic documents a reply carries whole (the capture set-up's report in the
attach reply), which each end passes on or logs without reading a field of it."""

from __future__ import annotations

from typing import TypeAlias, TypeGuard

__all__ = ["JsonValue", "is_json_object"]

JsonValue: TypeAlias = "str | int | float | bool | list[JsonValue] | dict[str, JsonValue] | None"


def is_json_object(value: object) -> TypeGuard[dict[str, JsonValue]]:
    """A decoded JSON object (what ``json.loads`` made of one: its values are JSON values)."""
    return isinstance(value, dict) and all(isinstance(key, str) for key in value)
