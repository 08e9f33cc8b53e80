"""The messages of the launcher's wire (wire.py), typed: each a frozen dataclass with ``to_wire``/``from_wire``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from supervisor.protocol.privilege_model import PrivilegeModel


@dataclass(frozen=True)
class NamespacePlan:
    model: PrivilegeModel
    netns: bool = True
    pidns: bool = True
    mountns: bool = True
    hide_paths: tuple[str, ...] = ()
    capture: dict[str, Any] | None = None
    root: dict[str, Any] | None = None  # rootfs.RootPlan.to_wire(): the agent's own root (needs mountns)
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
