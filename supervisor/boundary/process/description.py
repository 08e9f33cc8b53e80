"""A process as status and resume show it (docs/reference/boundary.md §1.2): its handle, what it runs and
whether it still does — never a pid (spec invariant 4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from supervisor.protocol.json_value import JsonValue

__all__ = ["Kind", "ProcessDescription"]

Kind = Literal["agent", "exec"]


@dataclass(frozen=True, slots=True)
class ProcessDescription:
    handle: str
    kind: Kind
    argv: tuple[str, ...]  # as it was asked for; status redacts credential placeholders (reports.py)
    tty: bool
    started_at: str
    running: bool
    stream_attached: bool

    def to_wire(self) -> dict[str, JsonValue]:
        return {
            "handle": self.handle,
            "kind": self.kind,
            "argv": list(self.argv),
            "tty": self.tty,
            "started_at": self.started_at,
            "state": "running" if self.running else "exited",
            "stream_attached": self.stream_attached,
        }
