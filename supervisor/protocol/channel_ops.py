"""The requests and accept replies of the link's channel operations: ``exec`` (its request is
process_ops.ExecRequest), ``attach-stream`` and ``forward`` (docs/reference/boundary.md §2.3, §3).

A forward's target is checked here as far as it can be without the boundary: the literal, loopback only. Which
ports are the boundary's own only the boundary knows; it refuses those after reading the request
(process_ops.refuse_reserved_port), which is the last check either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.json_value import JsonValue
from supervisor.protocol.process_ops import ForwardTarget, is_forward_probe, parse_forward_request

__all__ = ["AttachStreamRequest", "ExecAccepted", "ForwardAccepted", "ForwardRequest"]


def _reply_object(obj: object, op: str) -> Mapping[str, object]:
    if not isinstance(obj, Mapping):
        raise OpError(ErrorKind.INVALID, f"the {op} reply must be a JSON object")
    return obj


@dataclass(frozen=True)
class AttachStreamRequest:
    """``/v1/attach-stream``: re-attach to a process's output by its handle."""

    handle: str

    def to_wire(self) -> dict[str, JsonValue]:
        return {"handle": self.handle}

    @classmethod
    def from_wire(cls, obj: object) -> AttachStreamRequest:
        handle = obj.get("handle") if isinstance(obj, dict) else None
        if not isinstance(obj, dict) or not isinstance(handle, str) or set(obj) - {"handle"}:
            raise OpError(ErrorKind.INVALID, "body must be {handle}", field="handle")
        return cls(handle)


@dataclass(frozen=True)
class ExecAccepted:
    """How ``exec`` and ``attach-stream`` accept: the process and whether it has a terminal."""

    handle: str
    tty: bool

    def to_wire(self) -> dict[str, JsonValue]:
        return {"handle": self.handle, "tty": self.tty}

    @classmethod
    def from_wire(cls, obj: object) -> ExecAccepted:
        raw = _reply_object(obj, "exec")
        handle, tty = raw.get("handle"), raw.get("tty", False)
        if not isinstance(handle, str):
            raise OpError(ErrorKind.INVALID, "the exec reply's handle must be a string", field="handle")
        if not isinstance(tty, bool):
            raise OpError(ErrorKind.INVALID, "the exec reply's tty must be true or false", field="tty")
        return cls(handle, tty)


@dataclass(frozen=True)
class ForwardRequest:
    """``/v1/forward``: ``{host, port, probe?}``; a probe asks only whether the target would be accepted, and the
    target (a user's server) sees nothing of it."""

    target: ForwardTarget
    probe: bool = False

    def to_wire(self) -> dict[str, JsonValue]:
        wire: dict[str, JsonValue] = {"host": self.target.host, "port": self.target.port}
        if self.probe:
            wire["probe"] = True
        return wire

    @classmethod
    def from_wire(cls, obj: object) -> ForwardRequest:
        return cls(parse_forward_request(obj), is_forward_probe(obj))


@dataclass(frozen=True)
class ForwardAccepted:
    """How ``forward`` accepts: the target dialled (or, for a probe, that would be)."""

    host: str
    port: int
    probe: bool = False

    def to_wire(self) -> dict[str, JsonValue]:
        wire: dict[str, JsonValue] = {"host": self.host, "port": self.port}
        if self.probe:
            wire["probe"] = True
        return wire

    @classmethod
    def from_wire(cls, obj: object) -> ForwardAccepted:
        raw = _reply_object(obj, "forward")
        host, port, probe = raw.get("host"), raw.get("port"), raw.get("probe", False)
        if not isinstance(host, str):
            raise OpError(ErrorKind.INVALID, "the forward reply's host must be a string", field="host")
        if not isinstance(port, int) or isinstance(port, bool):
            raise OpError(ErrorKind.INVALID, "the forward reply's port must be an integer", field="port")
        if not isinstance(probe, bool):
            raise OpError(ErrorKind.INVALID, "the forward reply's probe must be true or false", field="probe")
        return cls(host, port, probe)
