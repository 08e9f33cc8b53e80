"""The boundary's status: what ``/v1/status`` and ``/v1/resume`` answer (docs/reference/boundary.md §1.2, §1.6).

Control keeps the last one (its readiness and its own status read it) and shows it whole in its status. A field a
peer left out reads as ``None`` (an older build may say less); a field of the wrong type is refused, naming it.
The processes and the limits are the boundary's own descriptions, passed on whole as JSON documents.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.exit_result import ExitResult, ExitResultError
from supervisor.protocol.fence_report import FenceReport
from supervisor.protocol.json_value import JsonValue, is_json_object
from supervisor.protocol.lifecycle import State, reported_state

__all__ = ["AgentStatus", "ResumeRequest", "StatusReply"]

T = TypeVar("T")


def _invalid(reason: str, field: str) -> OpError:
    return OpError(ErrorKind.INVALID, f"the status reply's {field} {reason}", field=field)


def _optional(raw: Mapping[str, object], key: str, kind: type[T]) -> T | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _invalid(f"must be {kind.__name__} or null", key)
    return value


@dataclass(frozen=True)
class ResumeRequest:
    """``/v1/resume``: the interception CA control holds now. The boundary answers its status whatever the body
    says (control compares the CA the agent trusts itself), so nothing here is refused."""

    interception_ca_sha256: str | None = None

    def to_wire(self) -> dict[str, JsonValue]:
        return {"interception_ca_sha256": self.interception_ca_sha256}

    @classmethod
    def from_wire(cls, obj: object) -> ResumeRequest:
        value = obj.get("interception_ca_sha256") if isinstance(obj, dict) else None
        return cls(value if isinstance(value, str) else None)


@dataclass(frozen=True)
class AgentStatus:
    handle: str
    result: ExitResult | None = None  # once the agent has ended

    def to_wire(self) -> dict[str, JsonValue]:
        return {"handle": self.handle, "result": None if self.result is None else self.result.to_wire()}

    @classmethod
    def from_wire(cls, obj: object) -> AgentStatus:
        if not isinstance(obj, Mapping) or not isinstance(obj.get("handle"), str):
            raise _invalid("must be an object with a handle", "agent")
        raw = obj.get("result")
        try:
            result = None if raw is None else ExitResult.from_wire(raw)
        except ExitResultError as exc:
            raise _invalid(f"result: {exc}", "agent") from None
        return cls(obj["handle"], result)


@dataclass(frozen=True)
class StatusReply:
    state: State
    boundary_instance: str | None = None
    privilege_model: str | None = None
    capture_mode: str | None = None
    fence: FenceReport | None = None
    enforcement_lost: str | None = None  # why, once the watched fence changed
    policy_generation: int | None = None
    agent: AgentStatus | None = None
    processes: tuple[dict[str, JsonValue], ...] = ()
    links: int | None = None
    limits: dict[str, JsonValue] | None = None
    interception_ca_sha256: str | None = None  # the CA the agent was given to trust

    def to_wire(self) -> dict[str, JsonValue]:
        return {
            "state": str(self.state),
            "boundary_instance": self.boundary_instance,
            "privilege_model": self.privilege_model,
            "capture_mode": self.capture_mode,
            "fence": None if self.fence is None else self.fence.to_wire(),
            "enforcement_lost": self.enforcement_lost,
            "policy_generation": self.policy_generation,
            "agent": None if self.agent is None else self.agent.to_wire(),
            "processes": list(self.processes),
            "links": self.links,
            "limits": self.limits,
            "interception_ca_sha256": self.interception_ca_sha256,
        }

    @classmethod
    def from_wire(cls, obj: object) -> StatusReply:
        if not isinstance(obj, dict):
            raise OpError(ErrorKind.INVALID, "the status reply must be a JSON object")
        processes = obj.get("processes") or []
        if not isinstance(processes, list) or not all(is_json_object(p) for p in processes):
            raise _invalid("must be a list of objects", "processes")
        limits = obj.get("limits")
        if limits is not None and not is_json_object(limits):
            raise _invalid("must be an object or null", "limits")
        fence, agent = obj.get("fence"), obj.get("agent")
        return cls(
            state=reported_state(obj.get("state")),
            boundary_instance=_optional(obj, "boundary_instance", str),
            privilege_model=_optional(obj, "privilege_model", str),
            capture_mode=_optional(obj, "capture_mode", str),
            fence=None if fence is None else FenceReport.from_wire(fence),
            enforcement_lost=_optional(obj, "enforcement_lost", str),
            policy_generation=_optional(obj, "policy_generation", int),
            agent=None if agent is None else AgentStatus.from_wire(agent),
            processes=tuple(processes),
            links=_optional(obj, "links", int),
            limits=limits,
            interception_ca_sha256=_optional(obj, "interception_ca_sha256", str),
        )
