"""The client-visible error responses of the egress path (docs/spec/policy.md §3.17), sans-I/O.

Rules:

1. Every refusal an agent can read is a JSON object with a stable machine code ``error`` (an
   :class:`ErrorCode`, whose value is exactly the string on the wire and in events) and a human ``detail``
   sentence saying what was refused and, where it helps, what to ask for. An agent (often an LLM) reads these.
2. Every such response carries ``Content-Type: application/json``, an exact ``Content-Length`` and
   ``Connection: close``: after a refusal the connection is not reused (§3.7 "any deny closes the tunnel").
3. Nothing here may carry a secret: callers pass names of credentials, never values.

The catalogue is shared: control renders it inside intercepted tunnels (``supervisor.control.l7``), and the
boundary's proxy listener may render the same codes for proxy-aware clients.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

__all__ = ["REASON_PHRASES", "ErrorCode", "ErrorResponse", "L7Denial"]

REASON_PHRASES = {
    400: "Bad Request",
    403: "Forbidden",
    421: "Misdirected Request",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


class ErrorCode(enum.StrEnum):
    """The ``error`` field; the spec's catalogue plus the few upstream failures L7 adds."""

    POLICY_DENIED = "policy_denied"  # 403: L4 or L7 policy refused the request
    SSRF_DENIED = "ssrf_denied"  # 403: the destination resolves to an address policy refuses
    REQUEST_AUTHORITY_MISMATCH = "request_authority_mismatch"  # 403: Host/absolute URI ≠ the tunnel's host:port
    UNSUPPORTED_L7_PROTOCOL = "unsupported_l7_protocol"  # 403: h2c, unknown bytes, non-websocket upgrade
    CREDENTIAL_ENDPOINT_MISMATCH = "credential_endpoint_mismatch"  # 403: a placeholder toward an unbound endpoint
    CREDENTIAL_UNAVAILABLE = "credential_unavailable"  # 500: unknown placeholder, or no secret configured
    UNINSPECTED_CREDENTIALS = "uninspected_credentials"  # 403
    TLS_TERMINATION_UNAVAILABLE = "tls_termination_unavailable"  # 503
    INVALID_CONNECT_TARGET = "invalid_connect_target"  # 400
    INVALID_REQUEST_TARGET = "invalid_request_target"  # 400
    INVALID_CREDENTIAL_PLACEHOLDER = "invalid_credential_placeholder"  # 400
    UNSUPPORTED_PROXY_SCHEME = "unsupported_proxy_scheme"  # 400
    UPSTREAM_UNREACHABLE = "upstream_unreachable"  # 502: resolution or connection failed
    UPSTREAM_TLS_FAILED = "upstream_tls_failed"  # 502: the upstream certificate did not verify (never downgraded)
    UPSTREAM_PROTOCOL_ERROR = "upstream_protocol_error"  # 502: the upstream answered with malformed HTTP
    UPSTREAM_TIMEOUT = "upstream_timeout"  # 504


@dataclass(frozen=True, slots=True)
class L7Denial:
    """What the tunnel L7 deny says beside ``error`` and ``detail`` (docs/spec/policy.md §3.10.4): what was refused,
    by which policy, and what to ask for."""

    policy: str | None  # the network policy that matched the endpoint
    reason: str | None
    method: str
    path: str
    host: str
    port: int
    binary: str | None = None
    next_steps: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "policy": self.policy,
            "rule": f"{self.method} {self.path}",
            "reason": self.reason,
            "layer": "l7",
            "protocol": "rest",
            "method": self.method,
            "path": self.path,
            "host": self.host,
            "port": self.port,
        }
        if self.binary:
            body["binary"] = self.binary
        body["rule_missing"] = {"type": "rest_allow", "layer": "l7", "method": self.method, "path": self.path,
                                "host": self.host, "port": self.port}  # fmt: skip
        body["next_steps"] = list(self.next_steps)
        return body


@dataclass(frozen=True)
class ErrorResponse:
    """One refusal: ``status``, ``{"error": code, "detail": detail, **denial}`` and extra ``headers``."""

    status: int
    code: ErrorCode
    detail: str
    denial: L7Denial | None = None
    headers: tuple[tuple[str, str], ...] = ()

    def body(self) -> bytes:
        payload: dict[str, Any] = {"error": str(self.code), "detail": self.detail}
        if self.denial is not None:
            payload.update(self.denial.to_wire())
        return json.dumps(payload, separators=(",", ":"), ensure_ascii=True).encode() + b"\n"

    def header_list(self) -> list[tuple[bytes, bytes]]:
        """Headers for an h11 ``Response`` (framing included, so the caller adds nothing)."""
        out = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(self.body())).encode()),
            (b"connection", b"close"),
            (b"cache-control", b"no-store"),
        ]
        out += [(name.lower().encode("ascii"), value.encode("ascii")) for name, value in self.headers]
        return out

    @property
    def reason_phrase(self) -> str:
        return REASON_PHRASES.get(self.status, "Error")

    def render(self) -> bytes:
        """The whole HTTP/1.1 response, for writers that do not drive h11."""
        lines = [f"HTTP/1.1 {self.status} {self.reason_phrase}".encode()]
        lines += [name + b": " + value for name, value in self.header_list()]
        return b"\r\n".join(lines) + b"\r\n\r\n" + self.body()
