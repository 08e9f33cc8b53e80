"""The client-visible error responses of the egress path (docs/reference/policy.md §3.17), sans-I/O.

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

from supervisor.protocol.json_value import JsonValue

__all__ = ["REASON_PHRASES", "STATUS", "ErrorCode", "ErrorResponse", "L7Denial"]

REASON_PHRASES = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    407: "Proxy Authentication Required",
    408: "Request Timeout",
    413: "Content Too Large",
    421: "Misdirected Request",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


class ErrorCode(enum.StrEnum):
    """The ``error`` field of every refusal an agent reads, in a tunnel or from a proxy listener (the boundary's
    and control's proxy-pod one): the spec's catalogue plus the few failures we add. The one catalogue of
    agent-visible codes: docs/policy.md "Refusal codes" lists exactly these, and no module spells one itself
    (tests/unit/test_catalogues.py)."""

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
    UPSTREAM_PROTOCOL_ERROR = "upstream_protocol_error"  # 502: malformed HTTP, or unscrubbable from a bound host
    UPSTREAM_TIMEOUT = "upstream_timeout"  # 504
    # the proxy listeners' own
    INVALID_REQUEST = "invalid_request"  # 400: control found the request malformed
    PROXY_AUTH_REQUIRED = "proxy_auth_required"  # 407: no valid proxy token (control's proxy-pod listener)
    CLIENT_NOT_ALLOWED = "client_not_allowed"  # 403: a client outside --proxy-clients
    TOO_MANY_CONNECTIONS = "too_many_connections"  # 503: a connection limit of control's proxy listener
    EGRESS_UNAVAILABLE = "egress_unavailable"  # 503: no egress link to control: refused, never a direct path
    INTERNAL_ERROR = "internal_error"  # 500
    # inference.local's own (docs/policy.md "Inference routing")
    INFERENCE_PATH_DENIED = "inference_path_denied"  # 404: not one of the inference request shapes
    INFERENCE_MODEL_DENIED = "inference_model_denied"  # 403: no route serves the model to this caller
    REQUEST_TOO_LARGE = "request_too_large"  # 413: an inference request over its bound

    @property
    def status(self) -> int:
        """The HTTP status this code is answered with."""
        return STATUS[self]


STATUS: dict[ErrorCode, int] = {
    ErrorCode.POLICY_DENIED: 403,
    ErrorCode.SSRF_DENIED: 403,
    ErrorCode.REQUEST_AUTHORITY_MISMATCH: 403,
    ErrorCode.UNSUPPORTED_L7_PROTOCOL: 403,
    ErrorCode.CREDENTIAL_ENDPOINT_MISMATCH: 403,
    ErrorCode.CREDENTIAL_UNAVAILABLE: 500,
    ErrorCode.UNINSPECTED_CREDENTIALS: 403,
    ErrorCode.TLS_TERMINATION_UNAVAILABLE: 503,
    ErrorCode.INVALID_CONNECT_TARGET: 400,
    ErrorCode.INVALID_REQUEST_TARGET: 400,
    ErrorCode.INVALID_CREDENTIAL_PLACEHOLDER: 400,
    ErrorCode.UNSUPPORTED_PROXY_SCHEME: 400,
    ErrorCode.UPSTREAM_UNREACHABLE: 502,
    ErrorCode.UPSTREAM_TLS_FAILED: 502,
    ErrorCode.UPSTREAM_PROTOCOL_ERROR: 502,
    ErrorCode.UPSTREAM_TIMEOUT: 504,
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.PROXY_AUTH_REQUIRED: 407,
    ErrorCode.CLIENT_NOT_ALLOWED: 403,
    ErrorCode.TOO_MANY_CONNECTIONS: 503,
    ErrorCode.EGRESS_UNAVAILABLE: 503,
    ErrorCode.INTERNAL_ERROR: 500,
    ErrorCode.INFERENCE_PATH_DENIED: 404,
    ErrorCode.INFERENCE_MODEL_DENIED: 403,
    ErrorCode.REQUEST_TOO_LARGE: 413,
}


@dataclass(frozen=True, slots=True)
class L7Denial:
    """What the tunnel L7 deny says beside ``error`` and ``detail`` (docs/reference/policy.md §3.10.4): what was
    refused, by which policy, and what to ask for."""

    policy: str | None  # the network policy that matched the endpoint
    reason: str | None
    method: str
    path: str
    host: str
    port: int
    binary: str | None = None
    next_steps: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, JsonValue]:
        body: dict[str, JsonValue] = {
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
        payload: dict[str, JsonValue] = {"error": str(self.code), "detail": self.detail}
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
