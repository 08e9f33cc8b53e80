"""The result of a workload process: what ``wait`` and ``terminate`` answer and an ``EXIT`` frame carries
(docs/reference/boundary.md §2.5).

The boundary's process table builds one when a process ends (``boundary/process/table.py`` ``render_result``);
it never changes afterwards. It crosses to control (the ``/v1/wait`` reply, the agent's exit in status) and to
the CLI (the exec channel's ``EXIT`` frame), which turns it into its own exit code.

Rules this module enforces:

1. The JSON object is the contract between peers: :meth:`ExitResult.to_wire` writes the same object the
   boundary always wrote; :meth:`ExitResult.from_wire` checks each field it knows, naming the one at fault, and
   ignores fields it does not know (a newer boundary may say more).
2. ``rendered`` is the exit code a shell would report (the code, 128+N for signal N, 124 for a timeout); a peer
   that omitted it still gets one from :attr:`ExitResult.exit_code`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from supervisor.protocol.exit_codes import ExitCode, for_signal
from supervisor.protocol.json_value import JsonValue

__all__ = ["EndReason", "ExitResult", "ExitResultError"]

T = TypeVar("T")


class EndReason(enum.StrEnum):
    """``reason`` of a wait result (spec §2.5)."""

    EXITED = "exited"
    TERMINATED = "terminated"
    TIMEOUT = "timeout"
    AGENT_EXIT = "agent-exit"
    ENFORCEMENT_LOST = "enforcement-lost"  # the fence changed: every workload process was killed
    OOM_KILLED = "oom-killed"  # SIGKILLed by the kernel: the workload's memory cgroup hit its limit


class ExitResultError(ValueError):
    """An exit result object that does not follow §2.5; the message names the field."""


@dataclass(frozen=True, slots=True)
class ExitResult:
    handle: str | None
    code: int | None  # the exit status when the process exited, else None
    signal: str | None  # the name without SIG of the signal that ended it, else None
    signal_number: int | None
    rendered: int | None  # see rule 2
    core_dumped: bool
    reason: EndReason
    ended_at: str | None  # RFC 3339
    exited: bool = True

    @property
    def exit_code(self) -> int:
        """The code a client exits with for this result (rule 2)."""
        if self.rendered is not None and 0 <= self.rendered <= 255:
            return self.rendered
        if self.code is not None:
            return self.code & 0xFF
        if self.signal_number is not None and 0 < self.signal_number < 128:
            return for_signal(self.signal_number)
        return ExitCode.SELF_FAILED

    def to_wire(self) -> dict[str, JsonValue]:
        return {
            "handle": self.handle,
            "exited": self.exited,
            "code": self.code,
            "signal": self.signal,
            "signal_number": self.signal_number,
            "rendered": self.rendered,
            "core_dumped": self.core_dumped,
            "reason": str(self.reason),
            "ended_at": self.ended_at,
        }

    @classmethod
    def from_wire(cls, obj: object) -> ExitResult:
        if not isinstance(obj, Mapping):
            raise ExitResultError("an exit result must be a JSON object")
        reason = obj.get("reason", str(EndReason.EXITED))
        try:
            end_reason = EndReason(reason)
        except ValueError:
            raise ExitResultError(f"exit result field reason: unknown value {reason!r}") from None
        return cls(
            handle=_optional(obj, "handle", str),
            code=_optional(obj, "code", int),
            signal=_optional(obj, "signal", str),
            signal_number=_optional(obj, "signal_number", int),
            rendered=_optional(obj, "rendered", int),
            core_dumped=_optional(obj, "core_dumped", bool) or False,
            reason=end_reason,
            ended_at=_optional(obj, "ended_at", str),
            exited=_optional(obj, "exited", bool) is not False,
        )


def _optional(obj: Mapping[str, object], name: str, kind: type[T]) -> T | None:
    value = obj.get(name)
    if value is None:
        return None
    # bool is an int in Python; an integer field must not accept true/false
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ExitResultError(f"exit result field {name} must be {kind.__name__} or null, not {value!r:.40}")
    return value
