"""What a rejected policy says: every violation, each with the YAML path of its field and, from disk, its line.

Rule: validation never stops at the first problem. Every check appends to one list and the candidate is refused
as a whole (`PolicyInvalid`) when that list is non-empty, so an operator fixes a file in one pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.protocol.json_value import JsonValue


@dataclass(frozen=True)
class PolicyError:
    """One violation. ``path`` is the YAML path of the field, e.g. ``network_policies.gh.endpoints[1].ports[0]``."""

    path: str
    message: str
    expected: str | None = None
    line: int | None = None
    source: str | None = None

    def __str__(self) -> str:
        where = self.source or "<string>"
        if self.line is not None:
            where = f"{where}:{self.line}"
        text = f"{where}: {self.path or '(top level)'}: {self.message}"
        if self.expected:
            text += f" (expected {self.expected})"
        return text

    def to_json(self) -> dict[str, JsonValue]:
        body: dict[str, JsonValue] = {"path": self.path, "message": self.message}
        for key in ("expected", "line", "source"):
            value = getattr(self, key)
            if value is not None:
                body[key] = value
        return body


@dataclass(frozen=True)
class PolicyWarning:
    """Accepted, but probably not what the author meant (e.g. an L7 endpoint left in audit mode)."""

    path: str
    message: str
    line: int | None = None
    source: str | None = None

    def __str__(self) -> str:
        where = self.source or "<string>"
        if self.line is not None:
            where = f"{where}:{self.line}"
        return f"{where}: {self.path or '(top level)'}: warning: {self.message}"

    def to_json(self) -> dict[str, JsonValue]:
        body: dict[str, JsonValue] = {"path": self.path, "message": self.message}
        if self.line is not None:
            body["line"] = self.line
        if self.source is not None:
            body["source"] = self.source
        return body


class PolicyInvalid(Exception):
    """A candidate policy was refused; ``errors`` lists every violation found."""

    def __init__(self, errors: list[PolicyError]) -> None:
        self.errors = list(errors)
        super().__init__(self._summary())

    def _summary(self) -> str:
        if not self.errors:
            return "invalid policy"
        lines = [f"invalid policy ({len(self.errors)} error{'s' if len(self.errors) != 1 else ''}):"]
        lines.extend(f"  {err}" for err in self.errors)
        return "\n".join(lines)

    def to_json(self) -> list[dict[str, JsonValue]]:
        return [err.to_json() for err in self.errors]
