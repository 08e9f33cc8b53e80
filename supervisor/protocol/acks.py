"""The link's small messages: a request with no arguments, and the acknowledgements control sends the boundary
(docs/reference/boundary.md §1.2, §1.6).

A request with no arguments has always been read without looking at its body, so :class:`NoArguments` accepts
any object (a newer peer may say more). A reply control never read (``policy-ack``'s, ``exit-ack``'s) is read
leniently for the same reason: a missing field is ``None``, only a wrong type is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.json_value import JsonValue

__all__ = ["ExitAck", "NoArguments", "PolicyAck", "PolicyAcknowledged"]


@dataclass(frozen=True)
class NoArguments:
    """The request of ``status``, ``start``, ``fence-probe`` and ``agent/exit-ack``: the empty object."""

    def to_wire(self) -> dict[str, JsonValue]:
        return {}

    @classmethod
    def from_wire(cls, obj: object) -> NoArguments:
        return cls()


def _generation(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise OpError(ErrorKind.INVALID, "policy_generation must be a non-negative integer", "policy_generation")
    return value


@dataclass(frozen=True)
class PolicyAck:
    """``/v1/policy-ack``: the policy generation in force in control, which the boundary reports in status."""

    policy_generation: int

    def to_wire(self) -> dict[str, JsonValue]:
        return {"policy_generation": self.policy_generation}

    @classmethod
    def from_wire(cls, obj: object) -> PolicyAck:
        return cls(_generation(obj.get("policy_generation") if isinstance(obj, dict) else None))


@dataclass(frozen=True)
class PolicyAcknowledged:
    """``/v1/policy-ack``'s reply: the generation the boundary now reports."""

    policy_generation: int | None

    def to_wire(self) -> dict[str, JsonValue]:
        return {"policy_generation": self.policy_generation}

    @classmethod
    def from_wire(cls, obj: object) -> PolicyAcknowledged:
        if not isinstance(obj, dict):
            raise OpError(ErrorKind.INVALID, "the policy-ack reply must be a JSON object")
        value = obj.get("policy_generation")
        return cls(None if value is None else _generation(value))


@dataclass(frozen=True)
class ExitAck:
    """``/v1/agent/exit-ack``'s reply: the boundary may now exit with the agent's code."""

    acknowledged: bool = True

    def to_wire(self) -> dict[str, JsonValue]:
        return {"acknowledged": self.acknowledged}

    @classmethod
    def from_wire(cls, obj: object) -> ExitAck:
        value = obj.get("acknowledged", True) if isinstance(obj, dict) else None
        if not isinstance(value, bool):
            raise OpError(ErrorKind.INVALID, "exit-ack reply: must be true or false", "acknowledged")
        return cls(value)
