"""Model P's fence observed through a canary (docs/reference/boundary.md §1.2 and §5, proxy-env).

In ``proxy-env`` the only fence is the pod's NetworkPolicy. It is *observed*, not only acknowledged, like this:

1. Control listens on a canary address (its own flag ``--fence-canary``; it reaches the boundary in the attach
   descriptor, never from anything the workload controls). The address is a literal IP and a port: no name is
   resolved, and no probe ever goes anywhere else (docs/design.md "Settled details": no probe leaves the
   machine unless the deployment configured the target).
2. ``/v1/fence-probe``: the boundary connects to the canary from the pod's network namespace. A connect that
   succeeds is a path out: ``failed`` (before Ready the boundary exits; after, enforcement is lost).
3. Control, around that probe, answers on its canary from its own side (the self-check: the canary is really
   listening, so a failed connect means something) and counts every other connection that arrived while the
   probe ran. It hands that :class:`CanaryReport` to ``confirm`` (or, every 30 s after, ``/v1/fence-observed``).
4. The fence counts as observed only if the probe's connect failed **and** the report says the self-check
   answered and nothing else was seen. Anything else refuses ``confirm``; after Ready a seen connection is
   enforcement lost.

Without a canary, proxy-env is refused unless the acknowledgement also says "no probe" (both the boundary's own
configuration and the descriptor); the fence is then reported as ``acknowledged-unprobed``.

On the link: ``/v1/fence-probe`` answers a :class:`ProbeResult`; ``/v1/fence-observed`` takes a
:class:`FenceObserved` and answers a :class:`FenceObservedReply`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, TypeVar

from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.json_value import JsonValue

__all__ = [
    "PROBE_TIMEOUT_S",
    "REPEAT_S",
    "SELF_CHECK_OK",
    "CanaryReport",
    "FenceObserved",
    "FenceObservedReply",
    "ProbeResult",
    "format_canary",
    "parse_canary",
]

PROBE_TIMEOUT_S: Final = 2.0  # spec §1.2: "connect refused/timeout ≤ 2 s"
REPEAT_S: Final = 30.0
SELF_CHECK_OK: Final = "ok"
T = TypeVar("T")


def parse_canary(text: str) -> tuple[str, int]:
    """``ADDR:PORT`` or ``[V6ADDR]:PORT`` → (address, port); a literal IP only. Raises ``ValueError`` naming
    what is wrong."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{text!r} is not ADDR:PORT")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{host!r} is not a literal IP address (a canary is never a name)") from None
    if address.is_unspecified or address.is_multicast:
        raise ValueError(f"{address} cannot be connected to")
    if address.is_loopback or (
        isinstance(address, ipaddress.IPv6Address) and (address.ipv4_mapped or address).is_loopback
    ):
        # From the pod that is the pod's own loopback (the agent's to listen on, or nothing's): it observes no fence.
        raise ValueError(
            f"{address} is a loopback address: the canary must be one the pod reaches only through its fence"
        )
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"port {port_text!r} is not 1..65535")
    return str(address), int(port_text)


def format_canary(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


@dataclass(frozen=True)
class CanaryReport:
    """What control saw on its canary while the boundary's probe ``probe`` ran."""

    probe: int  # the probe id the boundary's /v1/fence-probe answered
    seen: int  # connections that were not control's own self-check
    self_check: str  # SELF_CHECK_OK, or why control could not reach its own canary
    peers: tuple[str, ...] = ()  # the first few sources seen (diagnostic)

    @property
    def observed(self) -> bool:
        return self.seen == 0 and self.self_check == SELF_CHECK_OK

    def to_wire(self) -> dict[str, JsonValue]:
        return {"probe": self.probe, "seen": self.seen, "self_check": self.self_check, "peers": list(self.peers)}

    @classmethod
    def from_wire(cls, body: object, name: str = "canary") -> CanaryReport:
        """Strict: exactly these keys with these types, else ``invalid`` naming the field."""
        if not isinstance(body, dict):
            raise OpError(ErrorKind.INVALID, f"{name} must be an object", field=name)
        unknown = set(body) - {"probe", "seen", "self_check", "peers"}
        if unknown:
            raise OpError(
                ErrorKind.INVALID, f"unknown field {sorted(unknown)[0]!r}", field=f"{name}.{sorted(unknown)[0]}"
            )
        for key, kind in (("probe", int), ("seen", int), ("self_check", str)):
            value = body.get(key)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise OpError(ErrorKind.INVALID, f"{key} is missing or has the wrong type", field=f"{name}.{key}")
        if body["seen"] < 0:
            raise OpError(ErrorKind.INVALID, "seen must be >= 0", field=f"{name}.seen")
        peers = body.get("peers", [])
        if not isinstance(peers, list) or not all(isinstance(p, str) for p in peers):
            raise OpError(ErrorKind.INVALID, "peers must be a list of strings", field=f"{name}.peers")
        return cls(probe=body["probe"], seen=body["seen"], self_check=body["self_check"], peers=tuple(peers[:8]))


def _field(obj: Mapping[str, object], op: str, key: str, kind: type[T], default: T | None = None) -> T:
    value = obj.get(key, default)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise OpError(ErrorKind.INVALID, f"the {op} reply's {key} is missing or has the wrong type", field=key)
    return value


def _reply_object(obj: object, op: str) -> Mapping[str, object]:
    if not isinstance(obj, Mapping):
        raise OpError(ErrorKind.INVALID, f"the {op} reply must be a JSON object")
    return obj


@dataclass(frozen=True)
class ProbeResult:
    """``/v1/fence-probe``'s answer: the boundary's connect to the canary (boundary/capture/canary.py)."""

    probe: int
    target: str
    connected: bool
    error: str  # why the connect failed ("" when it connected)
    conclusive: bool = True  # False: the connect failed for a local reason, not at a fence

    def to_wire(self) -> dict[str, JsonValue]:
        return {"probe": self.probe, "target": self.target, "connected": self.connected, "error": self.error,
                "conclusive": self.conclusive}  # fmt: skip

    @classmethod
    def from_wire(cls, obj: object) -> ProbeResult:
        raw = _reply_object(obj, "fence-probe")
        return cls(
            probe=_field(raw, "fence-probe", "probe", int),
            target=_field(raw, "fence-probe", "target", str, ""),
            connected=_field(raw, "fence-probe", "connected", bool, False),
            error=_field(raw, "fence-probe", "error", str, ""),
            conclusive=_field(raw, "fence-probe", "conclusive", bool, True),
        )


@dataclass(frozen=True)
class FenceObserved:
    """``/v1/fence-observed``: control's report of a repeated probe (rule 3)."""

    canary: CanaryReport

    def to_wire(self) -> dict[str, JsonValue]:
        return {"canary": self.canary.to_wire()}

    @classmethod
    def from_wire(cls, obj: object) -> FenceObserved:
        return cls(CanaryReport.from_wire(obj.get("canary") if isinstance(obj, dict) else None))


@dataclass(frozen=True)
class FenceObservedReply:
    probe: int
    observed: bool

    def to_wire(self) -> dict[str, JsonValue]:
        return {"probe": self.probe, "observed": self.observed}

    @classmethod
    def from_wire(cls, obj: object) -> FenceObservedReply:
        raw = _reply_object(obj, "fence-observed")
        return cls(_field(raw, "fence-observed", "probe", int), _field(raw, "fence-observed", "observed", bool))
