"""What the boundary reads of the capture calls' answers (setup.py's ``inspect`` and ``probe``), typed.

The launcher runs those calls in the agent's network namespace and sends their JSON documents back whole; the
confirm step and the fence watch (fence.py, fence_watch.py) read a few fields of them. ``from_wire`` reads
those fields as the boundary always read them: a missing field is its default, never an error, so a read-back
that failed (``failed``) and one that says nothing both count as "not in force".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from supervisor.protocol.json_value import JsonValue

__all__ = ["FenceReadback", "NetnsProbe"]


def _optional_str(data: Mapping[str, JsonValue], name: str) -> str | None:
    value = data.get(name)
    return value if isinstance(value, str) else None


@dataclass(frozen=True, slots=True)
class FenceReadback:
    """The fence read back (``setup.inspect``): its fingerprint, whether it is in force and what is wrong with
    it, and its links as read (logged whole). ``trigger``: what made the fence watch read it again."""

    fingerprint: str | None = None
    ok: bool = False
    problems: tuple[str, ...] = ()
    links: JsonValue = None
    trigger: str | None = None

    @classmethod
    def failed(cls, reason: str) -> FenceReadback:
        """A read-back that could not be made: not in force, for ``reason``."""
        return cls(problems=(reason,))

    @classmethod
    def from_wire(cls, data: Mapping[str, JsonValue]) -> FenceReadback:
        problems = data.get("problems") or []
        return cls(
            fingerprint=_optional_str(data, "fingerprint"),
            ok=bool(data.get("ok", False)),
            problems=tuple(str(p) for p in problems) if isinstance(problems, list) else (str(problems),),
            links=data.get("links"),
        )

    def triggered_by(self, trigger: str) -> FenceReadback:
        return replace(self, trigger=trigger)


@dataclass(frozen=True, slots=True)
class NetnsProbe:
    """A probe from inside the namespace (``setup.probe``): whether it passed, whether a listener of the
    namespace took it, and the error it met."""

    ok: bool = False
    captured: bool = False
    error: str | None = None

    @classmethod
    def from_wire(cls, data: Mapping[str, JsonValue]) -> NetnsProbe:
        return cls(
            ok=bool(data.get("ok", False)),
            captured=bool(data.get("captured", False)),
            error=_optional_str(data, "error"),
        )
