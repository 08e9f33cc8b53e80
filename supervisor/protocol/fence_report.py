"""The fence as the boundary confirmed it: what ``/v1/confirm`` answers and status reports
(docs/reference/boundary.md §1.2).

How it was confirmed decides which fields the object has (``probe``):

* ``captured`` (netns): read back and probed from inside the agent's namespace; ``fingerprint`` and ``links``
  are the read-back's (``links`` a JSON document of the namespace's interfaces, passed on whole).
* ``canary`` (proxy-env with a canary, protocol/fence_canary.py): ``canary`` is the target and ``probe_error``
  how the boundary's connect failed; ``canary_self_check`` is added by the first repeated probe's report.
* ``acknowledged-unprobed``: the operator said so in both places; nothing was verified.

The request of ``/v1/confirm`` is :class:`ConfirmRequest`: control's canary report in proxy-env, nothing in netns.
A report the boundary cannot read is not refused as a request: it is the fence not observed, said by confirm.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeGuard

from supervisor.protocol.attach import CaptureMode
from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.fence_canary import CanaryReport
from supervisor.protocol.json_value import JsonValue
from supervisor.protocol.lifecycle import State, reported_state

__all__ = ["CAPTURED", "PROBED_BY_CANARY", "UNPROBED", "ConfirmReply", "ConfirmRequest", "FenceReport"]

CAPTURED = "captured"
PROBED_BY_CANARY = "canary"
UNPROBED = "acknowledged-unprobed"


def _invalid(reason: str, field: str) -> OpError:
    return OpError(ErrorKind.INVALID, f"the confirm reply's fence: {reason}", field=f"fence.{field}")


def _optional_str(raw: Mapping[str, object], key: str) -> str | None:
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        raise _invalid(f"{key} must be a string or null", key)
    return value


@dataclass(frozen=True)
class FenceReport:
    mode: CaptureMode
    privilege_model: str | None  # None only from a peer that left it out
    probe: str  # CAPTURED, PROBED_BY_CANARY or UNPROBED
    fingerprint: str | None = None
    links: JsonValue = None  # CAPTURED only
    canary: str | None = None  # PROBED_BY_CANARY only
    probe_error: str | None = None  # PROBED_BY_CANARY only
    canary_self_check: str | None = None

    def with_self_check(self, self_check: str) -> FenceReport:
        return dataclasses.replace(self, canary_self_check=self_check)

    def to_wire(self) -> dict[str, JsonValue]:
        wire: dict[str, JsonValue] = {"mode": str(self.mode)}
        if self.privilege_model is not None:
            wire["privilege_model"] = self.privilege_model
        wire["fingerprint"] = self.fingerprint
        if self.probe == CAPTURED:
            wire["links"] = self.links
        wire["probe"] = self.probe
        if self.probe == PROBED_BY_CANARY:
            wire.update(canary=self.canary, probe_error=self.probe_error)
        if self.canary_self_check is not None:
            wire["canary_self_check"] = self.canary_self_check
        return wire

    @classmethod
    def from_wire(cls, obj: object) -> FenceReport:
        if not isinstance(obj, Mapping):
            raise OpError(ErrorKind.INVALID, "the confirm reply's fence must be an object", field="fence")
        try:
            mode = CaptureMode(str(obj.get("mode")))
        except ValueError:
            raise _invalid(f"unknown mode {obj.get('mode')!r}", "mode") from None
        probe = obj.get("probe", "")  # "": a peer that did not say how (an older build)
        if not isinstance(probe, str):
            raise _invalid("probe must be a string", "probe")
        links = obj.get("links")
        return cls(
            mode=mode, privilege_model=_optional_str(obj, "privilege_model"), probe=probe,
            fingerprint=_optional_str(obj, "fingerprint"), links=links if _is_json(links) else None,
            canary=_optional_str(obj, "canary"), probe_error=_optional_str(obj, "probe_error"),
            canary_self_check=_optional_str(obj, "canary_self_check"),
        )  # fmt: skip


def _is_json(value: object) -> TypeGuard[JsonValue]:
    """A decoded JSON value (what ``json.loads`` makes: nothing else can be in a reply)."""
    if isinstance(value, list):
        return all(_is_json(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and _is_json(item) for key, item in value.items())
    return value is None or isinstance(value, str | int | float | bool)


@dataclass(frozen=True)
class ConfirmRequest:
    """``/v1/confirm``: control's canary report (proxy-env with a canary), else nothing. ``canary_problem`` is
    why a report that was sent could not be read."""

    canary: CanaryReport | None = None
    canary_problem: str | None = None

    def to_wire(self) -> dict[str, JsonValue]:
        return {} if self.canary is None else {"canary": self.canary.to_wire()}

    @classmethod
    def from_wire(cls, obj: object) -> ConfirmRequest:
        raw = obj.get("canary") if isinstance(obj, dict) else None
        if raw is None:
            return cls()
        try:
            return cls(CanaryReport.from_wire(raw))
        except OpError as exc:
            return cls(canary_problem=exc.reason)


@dataclass(frozen=True)
class ConfirmReply:
    """``/v1/confirm``'s answer: Ready, and the fence as confirmed."""

    state: State
    fence: FenceReport

    def to_wire(self) -> dict[str, JsonValue]:
        return {"state": str(self.state), "fence": self.fence.to_wire()}

    @classmethod
    def from_wire(cls, obj: object) -> ConfirmReply:
        if not isinstance(obj, dict):
            raise OpError(ErrorKind.INVALID, "the confirm reply must be a JSON object")
        return cls(reported_state(obj.get("state")), FenceReport.from_wire(obj.get("fence")))
