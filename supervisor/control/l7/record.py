"""What an inspected connection reports: the per-request record behind each ``http`` event, and the totals.

Rules: an event carries the redacted, query-free path (placeholders shown as ``[CREDENTIAL]``), how many
credentials were injected (never their names or values, §4.1), the decision (``allow``, ``audit``, ``deny`` or
``error``) with its rule and reason, the status answered and the body bytes moved each way.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from supervisor.control.l7.rewrite import REDACTED
from supervisor.protocol.json_value import JsonValue

__all__ = ["CloseReason", "InspectStats", "RequestRecord", "display_path"]

_REDACTED_WIRE = "%5BCREDENTIAL%5D"  # REDACTED as the path canonicaliser spells it


def display_path(path: str | None) -> str | None:
    return None if path is None else path.replace(_REDACTED_WIRE, REDACTED)


class CloseReason(enum.StrEnum):
    """Why an inspected connection ended; the value is the ``closed_by`` string in stats and events."""

    AGENT = "agent"
    UPSTREAM = "upstream"
    DENIED = "denied"
    MALFORMED = "malformed-request"
    UNSUPPORTED = "unsupported-protocol"
    AGENT_TLS = "agent-tls-failed"
    UPSTREAM_FAILED = "upstream-failed"
    IDLE = "idle-timeout"
    POLICY = "policy-revision"
    ERROR = "error"


@dataclass
class InspectStats:
    protocol: str = ""  # a TunnelProtocol value
    requests: int = 0
    allowed: int = 0
    audited: int = 0
    denied: int = 0
    bytes_up: int = 0  # body bytes agent → upstream (and raw bytes after an upgrade)
    bytes_down: int = 0  # body bytes upstream → agent
    upgraded: bool = False
    closed_by: str = ""  # a CloseReason value
    error: str | None = None

    def count(self, record: RequestRecord) -> None:
        self.requests += 1
        if record.decision == "allow":
            self.allowed += 1
        elif record.decision == "audit":
            self.audited += 1
        elif record.decision == "deny":
            self.denied += 1
        self.bytes_up += record.bytes_up
        self.bytes_down += record.bytes_down


@dataclass
class RequestRecord:
    """One request, as its event will tell it, plus the exchange state the forwarding needs."""

    started: float
    method: str = ""
    path: str | None = None  # redacted, query-free
    decision: str = "deny"
    rule: str | None = None
    endpoint: str | None = None
    l7_rule: str | None = None
    reason: str | None = None
    detail: str | None = None
    status: int | None = None
    bytes_up: int = 0
    bytes_down: int = 0
    credentials: tuple[str, ...] = ()
    upgrade: str | None = None
    error: str | None = None
    extra: dict[str, JsonValue] = field(default_factory=dict)
    # exchange state (not logged)
    request_done: bool = False
    response_started: bool = False
    has_body: bool = False
    expects_continue: bool = False  # the agent waits for 100 Continue before sending its body
    head_method: bool = False
    body: bytes | None = None  # a JSON-RPC, MCP or GraphQL body, read whole to decide it: forwarded as read

    def event_fields(self, now: float) -> dict[str, JsonValue]:
        return {
            "method": self.method or None,
            "path": self.path,
            "decision": self.decision,
            "rule": self.rule,
            "endpoint": self.endpoint,
            "l7_rule": self.l7_rule,
            "reason": self.reason,
            "detail": self.detail,
            "status": self.status,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "injected": len(self.credentials) or None,  # how many, never which (§4.1: no credential names)
            "upgrade": self.upgrade,
            "error": self.error,
            "duration_ms": round((now - self.started) * 1000, 3),
            **self.extra,
        }
