"""The messages of the launcher's wire (wire.py), typed: each a frozen dataclass with ``to_wire``/``from_wire``.

Rules:

1. ``to_wire`` writes the JSON object the launcher always wrote; ``from_wire`` checks each field it reads and
   refuses a malformed message with a ``MessageError`` that names the message and the field (zygote.py rule 5:
   nothing received is trusted beyond its shape).
2. What a message carries beside its JSON (fds, as ``SCM_RIGHTS``) stays with the caller; the layouts that
   index those fds (``stdio``, ``notify``) are fields here, checked against the fds by spawn_fds.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from supervisor.protocol.json_value import JsonValue
from supervisor.protocol.privilege_model import PrivilegeModel

T = TypeVar("T")


class MessageError(ValueError):
    """A launcher message that does not have its shape; the text names the message and the field."""


def _get(data: Mapping[str, Any], what: str, name: str, kind: type[T] | tuple[type, ...]) -> T:
    """``data[name]``, which must be of ``kind`` (an int is never a bool here)."""
    if not isinstance(data, Mapping):
        raise MessageError(f"{what}: not an object")
    if name not in data:
        raise MessageError(f"{what}: field {name!r} is missing")
    value = data[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise MessageError(f"{what}: field {name!r} must be {names}, not {type(value).__name__}")
    return value  # type: ignore[return-value]


def _opt(data: Mapping[str, Any], what: str, name: str, kind: type[T]) -> T | None:
    """``data[name]`` of ``kind`` when present and not null, else ``None``."""
    return None if data.get(name) is None else _get(data, what, name, kind)


def _ints(data: Mapping[str, Any], what: str, name: str) -> tuple[int, ...]:
    values = _get(data, what, name, list)
    if not all(type(v) is int for v in values):
        raise MessageError(f"{what}: field {name!r} must be a list of int")
    return tuple(values)


def _strs(data: Mapping[str, Any], what: str, name: str) -> tuple[str, ...]:
    values = [] if data.get(name) is None else _get(data, what, name, list)
    if not all(isinstance(v, str) for v in values):
        raise MessageError(f"{what}: field {name!r} must be a list of str")
    return tuple(values)


# --- requests (the boundary's, to the zygote and on to the init or a spare) ---------------------------------


@dataclass(frozen=True)
class SpawnRequest:
    """``spawn``: the child's spec (``child.SpawnSpec.to_wire()``), its stdio layout over the fds sent with it
    (stdin, stdout, stderr, status; status alone with a terminal), the connect-notify socket's index, and
    whether it gets a PID namespace of its own. A leased spare's command is the same without ``id``/``sid``."""

    spec: dict[str, JsonValue]  # child.SpawnSpec.to_wire()
    stdio: tuple[int, ...]
    id: int | None = None
    sid: int | None = None
    notify: int | None = None
    own_pidns: bool = False

    def to_wire(self) -> dict[str, Any]:
        if self.id is None:  # a spare's command
            return {"spec": dict(self.spec), "stdio": list(self.stdio)}
        return {
            "op": "spawn",
            "id": self.id,
            "sid": self.sid,
            "spec": dict(self.spec),
            "stdio": list(self.stdio),
            "notify": self.notify,
            "own_pidns": self.own_pidns,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> SpawnRequest:
        what = "spawn request"
        spare = isinstance(data, Mapping) and "id" not in data
        return cls(
            spec=_get(data, what, "spec", dict),
            stdio=_ints(data, what, "stdio"),
            id=None if spare else _get(data, what, "id", int),
            sid=None if spare else _get(data, what, "sid", int),
            notify=_opt(data, what, "notify", int),
            own_pidns=bool(_opt(data, what, "own_pidns", bool)),
        )


@dataclass(frozen=True)
class Ping:
    """``ping``: is the zygote alive (answered with its pid)."""

    id: int

    def to_wire(self) -> dict[str, Any]:
        return {"op": "ping", "id": self.id}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Ping:
        return cls(id=_get(data, "ping", "id", int))


@dataclass(frozen=True)
class Prepare:
    """``prepare``: make the workload's namespaces and the capture's listeners, once."""

    id: int
    plan: NamespacePlan

    def to_wire(self) -> dict[str, Any]:
        return {"op": "prepare", "id": self.id, "plan": self.plan.to_wire()}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Prepare:
        plan = _get(data, "prepare", "plan", dict)
        try:
            return cls(id=_get(data, "prepare", "id", int), plan=NamespacePlan.from_wire(plan))
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, MessageError):
                raise
            raise MessageError(f"prepare: field 'plan': {exc!r}") from None


@dataclass(frozen=True)
class CaptureCall:
    """``capture_call``: one of ``capture.calls.CAPTURE_CALLS`` run in the agent's network namespace."""

    id: int
    fn: str
    args: dict[str, JsonValue] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {"op": "capture_call", "id": self.id, "fn": self.fn, "args": dict(self.args)}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> CaptureCall:
        what = "capture call"
        return cls(
            id=_get(data, what, "id", int), fn=_get(data, what, "fn", str), args=_opt(data, what, "args", dict) or {}
        )


@dataclass(frozen=True)
class SocketRequest:
    """``socket``: a socket made in the agent's network namespace, sent back beside a ``Done``."""

    id: int
    family: int
    type: int
    proto: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {"op": "socket", "id": self.id, "family": self.family, "type": self.type, "proto": self.proto}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> SocketRequest:
        what = "socket request"
        return cls(
            id=_get(data, what, "id", int),
            family=_get(data, what, "family", int),
            type=_get(data, what, "type", int),
            proto=_opt(data, what, "proto", int) or 0,
        )


@dataclass(frozen=True)
class KillAll:
    """``kill_all``: SIGKILL every workload process and reap it before answering."""

    id: int

    def to_wire(self) -> dict[str, Any]:
        return {"op": "kill_all", "id": self.id}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> KillAll:
        return cls(id=_get(data, "kill_all", "id", int))


Request = Ping | Prepare | CaptureCall | SocketRequest | KillAll | SpawnRequest
_REQUESTS: dict[str, Any] = {
    "ping": Ping,
    "prepare": Prepare,
    "capture_call": CaptureCall,
    "socket": SocketRequest,
    "kill_all": KillAll,
    "spawn": SpawnRequest,
}


def request_from_wire(data: Mapping[str, JsonValue]) -> Request:
    """The request ``data`` is, by its ``op``; a ``MessageError`` for an unknown op or a malformed request. A
    spawn request must carry its ``id`` here (only a spare's command, read by the spare, has none)."""
    if not isinstance(data, Mapping):
        raise MessageError("request: not an object")
    op = data.get("op")
    kind = _REQUESTS.get(op) if isinstance(op, str) else None
    if kind is None:
        raise MessageError(f"unknown op {op!r}")
    if kind is SpawnRequest and "id" not in data:
        raise MessageError("spawn request: field 'id' is missing")
    request: Request = kind.from_wire(data)
    return request


# --- replies (to a request's ``id``) ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ErrorReply:
    """A request failed: its errno (0 when none) and text, and for a spawn the stage that failed."""

    id: Any
    errno: int
    error: str
    stage: str | None = None

    @classmethod
    def of(cls, rid: Any, exc: BaseException, stage: str | None = None) -> ErrorReply:
        err = exc.errno if isinstance(exc, OSError) and exc.errno else 0
        text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
        return cls(rid, err, text, stage)

    def to_wire(self) -> dict[str, Any]:
        out = {"id": self.id, "ok": False, "errno": self.errno, "error": self.error}
        return out if self.stage is None else {**out, "stage": self.stage}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> ErrorReply:
        what = "error reply"
        if not isinstance(data, Mapping):
            raise MessageError(f"{what}: not an object")
        return cls(
            id=data.get("id"),
            errno=_opt(data, what, "errno", int) or 0,
            error=str(data.get("error", "failed")),
            stage=None if data.get("stage") is None else str(data["stage"]),
        )


@dataclass(frozen=True)
class SpawnReply:
    """A child was forked: its host pid, its pid where it was forked (the workload's namespace), whether it is
    the init of a namespace of its own (``exec_init``), and whether a PTY master comes with its pidfd."""

    id: int
    pid: int
    ns_pid: int
    nested: bool = False
    pty: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "ok": True,
            "pid": self.pid,
            "ns_pid": self.ns_pid,
            "nested": self.nested,
            "pty": self.pty,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> SpawnReply:
        what = "spawn reply"
        return cls(
            id=_get(data, what, "id", int),
            pid=_get(data, what, "pid", int),
            ns_pid=_get(data, what, "ns_pid", int),
            nested=bool(_opt(data, what, "nested", bool)),
            pty=bool(_opt(data, what, "pty", bool)),
        )


@dataclass(frozen=True)
class PrepareReply:
    """The namespaces are made: the names of the fds that come with it (the capture's listeners), the capture's
    report, and the host pid of the workload's init when there is one."""

    id: Any
    fd_names: tuple[str, ...] = ()
    report: dict[str, JsonValue] = field(default_factory=dict)
    init_pid: int | None = None

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "ok": True,
            "fd_names": list(self.fd_names),
            "report": dict(self.report),
            "init_pid": self.init_pid,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> PrepareReply:
        what = "prepare reply"
        return cls(
            id=_get(data, what, "id", int),
            fd_names=_strs(data, what, "fd_names"),
            report=_opt(data, what, "report", dict) or {},
            init_pid=_opt(data, what, "init_pid", int),
        )


@dataclass(frozen=True)
class PingReply:
    """The zygote lives: its pid."""

    id: Any
    pid: int

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "ok": True, "pid": self.pid}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> PingReply:
        return cls(id=_get(data, "ping reply", "id", int), pid=_get(data, "ping reply", "pid", int))


@dataclass(frozen=True)
class Done:
    """A request that answers nothing but success (``socket``, whose fd comes beside it, and ``kill_all``)."""

    id: Any

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "ok": True}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Done:
        return cls(id=_get(data, "reply", "id", int))


@dataclass(frozen=True)
class CaptureReply:
    """A capture call's result (what the ``capture.setup`` function returned, JSON)."""

    id: int
    result: Any

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "ok": True, "result": self.result}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> CaptureReply:
        if not isinstance(data, Mapping) or "result" not in data:
            raise MessageError("capture reply: field 'result' is missing")
        return cls(id=_get(data, "capture reply", "id", int), result=data["result"])


@dataclass(frozen=True)
class Ready:
    """The init's or a spare exec-init's first word: ready (a spare's notes), or not, with the errno and the
    text (the init's ``error``; a spare's failed ``stage`` and its ``detail``)."""

    ready: bool
    notes: tuple[str, ...] = ()
    errno: int | None = None
    error: str | None = None
    stage: str | None = None
    detail: str | None = None

    def to_wire(self) -> dict[str, Any]:
        if self.ready:
            return {"ready": True, "notes": list(self.notes)}
        out: dict[str, Any] = {"ready": False, "errno": self.errno}
        for name in ("error", "stage", "detail"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Ready:
        what = "ready message"
        return cls(
            ready=_get(data, what, "ready", bool),
            notes=_strs(data, what, "notes"),
            errno=_opt(data, what, "errno", int),
            error=_opt(data, what, "error", str),
            stage=_opt(data, what, "stage", str),
            detail=_opt(data, what, "detail", str),
        )


# --- unsolicited messages (the zygote's, the init's and a spare's, to the boundary) --------------------------


@dataclass(frozen=True)
class Exit:
    """A launched process ended: its spawn's ``sid`` and raw wait status (zygote.py rule 2)."""

    sid: int
    status: int

    def to_wire(self) -> dict[str, Any]:
        return {"exit": self.sid, "status": self.status}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Exit:
        return cls(sid=_get(data, "exit", "exit", int), status=_get(data, "exit", "status", int))


@dataclass(frozen=True)
class Unowned:
    """Orphans the workload's init reaped that nobody launched: how many, and the first pids."""

    count: int
    pids: tuple[int, ...]

    def to_wire(self) -> dict[str, Any]:
        return {"unowned": self.count, "pids": list(self.pids)}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Unowned:
        what = "unowned report"
        return cls(count=_get(data, what, "unowned", int), pids=_ints(data, what, "pids") if "pids" in data else ())


@dataclass(frozen=True)
class SpareLease:
    """The init leases a spare exec-init to the boundary (zygote.py "Spares"): its host and namespace pids, the
    confinement it applied to itself (``child.Confinement``) and its notes. Its fds travel beside it."""

    host_pid: int
    ns_pid: int
    confinement: dict[str, JsonValue]  # child.Confinement.to_wire()
    notes: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return {
            "spare": self.host_pid,
            "ns_pid": self.ns_pid,
            "confinement": dict(self.confinement),
            "notes": list(self.notes),
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> SpareLease:
        what = "spare lease"
        return cls(
            host_pid=_get(data, what, "spare", int),
            ns_pid=_get(data, what, "ns_pid", int),
            confinement=_get(data, what, "confinement", dict),
            notes=_strs(data, what, "notes"),
        )


@dataclass(frozen=True)
class SpareBack:
    """A spare exec-init leases itself again after its exec, on its report socket, with a new command socket."""

    notes: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return {"spare": True, "notes": list(self.notes)}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> SpareBack:
        if _get(data, "spare's return", "spare", bool) is not True:
            raise MessageError("spare's return: field 'spare' must be true")
        return cls(notes=_strs(data, "spare's return", "notes"))


@dataclass(frozen=True)
class NamespacePlan:
    model: PrivilegeModel
    netns: bool = True
    pidns: bool = True
    mountns: bool = True
    hide_paths: tuple[str, ...] = ()
    capture: dict[str, JsonValue] | None = None  # capture.calls.prepare's argument: the ports to capture
    root: dict[str, JsonValue] | None = None  # rootfs.RootPlan.to_wire(): the agent's own root (needs mountns)
    agent_ids: tuple[int, int] | None = None  # model U under euid 0: the ids the user namespace maps the agent to

    def to_wire(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "netns": self.netns,
            "pidns": self.pidns,
            "mountns": self.mountns,
            "hide_paths": list(self.hide_paths),
            "capture": self.capture,
            "root": self.root,
            "agent_ids": list(self.agent_ids) if self.agent_ids is not None else None,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> NamespacePlan:
        return cls(
            model=PrivilegeModel(data["model"]),
            netns=bool(data["netns"]),
            pidns=bool(data["pidns"]),
            mountns=bool(data["mountns"]),
            hide_paths=tuple(data["hide_paths"]),
            capture=data["capture"],
            root=data.get("root"),
            agent_ids=_id_pair(data["agent_ids"]) if data.get("agent_ids") else None,
        )

    def effective(self) -> NamespacePlan:
        """Model P creates no namespace whatever the flags say."""
        if self.model == PrivilegeModel.P:
            return NamespacePlan(PrivilegeModel.P, False, False, False, self.hide_paths, self.capture, None)
        return self


def _id_pair(value: Any) -> tuple[int, int]:
    """``[uid, gid]``; anything else is a ``ValueError`` (the request is answered with an error)."""
    if not isinstance(value, list) or len(value) != 2 or not all(type(i) is int for i in value):
        raise ValueError("agent_ids must be [uid, gid]")
    return value[0], value[1]
