"""Error kinds shared by every operation between control and boundary (docs/reference/boundary.md §1.3).

An error never advances the lifecycle and never authorises anything. On the wire an error is the JSON body
``{"kind": K, "reason": "...", "field"?: "...", "stage"?: "...", "errno"?: N, "result"?: {...}}`` with the HTTP
status of its kind; ``result`` is the exit result of a process that had already ended (``terminate`` on it).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from supervisor.protocol.exit_result import ExitResult, ExitResultError
from supervisor.protocol.json_value import JsonValue


class ErrorKind(enum.StrEnum):
    INVALID = "invalid"  # the request itself is wrong; retrying unchanged cannot succeed
    DENIED = "denied"  # authenticated and well formed, but not permitted
    UNAVAILABLE = "unavailable"  # transient; a retry may succeed
    FAILED = "failed"  # a fault in the boundary or host
    TERMINATED = "terminated"  # the boundary or the target process is no longer active

    @property
    def http_status(self) -> int:
        return _STATUS[self]

    @classmethod
    def from_http_status(cls, status: int) -> ErrorKind:
        for kind, code in _STATUS.items():
            if code == status:
                return kind
        return cls.FAILED


_STATUS = {
    ErrorKind.INVALID: 400,
    ErrorKind.DENIED: 403,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.FAILED: 500,
    ErrorKind.TERMINATED: 410,
}


@dataclass
class OpError(Exception):
    """An operation refused with a kind; raised by handlers, rendered by the transport."""

    kind: ErrorKind
    reason: str
    field: str | None = None
    stage: str | None = None
    errno: int | None = None
    result: ExitResult | None = None  # what ended the process the operation named

    def __str__(self) -> str:
        where = f" ({self.field})" if self.field else ""
        return f"{self.kind}: {self.reason}{where}"

    def to_json(self) -> dict[str, JsonValue]:
        body: dict[str, JsonValue] = {"kind": str(self.kind), "reason": self.reason}
        for key in ("field", "stage", "errno"):
            value = getattr(self, key)
            if value is not None:
                body[key] = value
        if self.result is not None:
            body["result"] = self.result.to_wire()
        return body

    @classmethod
    def from_json(cls, body: object, *, status: int = 500) -> OpError:
        if not isinstance(body, dict):
            return cls(ErrorKind.from_http_status(status), f"malformed error body: {body!r:.200}")
        try:
            kind = ErrorKind(str(body.get("kind")))
        except ValueError:
            kind = ErrorKind.from_http_status(status)
        errno = body.get("errno")
        return cls(
            kind,
            str(body.get("reason", "")),
            field=body.get("field") if isinstance(body.get("field"), str) else None,
            stage=body.get("stage") if isinstance(body.get("stage"), str) else None,
            errno=errno if isinstance(errno, int) else None,
            result=_result(body.get("result")),
        )


def _result(raw: object) -> ExitResult | None:
    """An error body's exit result, if it carries a well-formed one (a malformed one is dropped, never fatal)."""
    if raw is None:
        return None
    try:
        return ExitResult.from_wire(raw)
    except ExitResultError:
        return None
