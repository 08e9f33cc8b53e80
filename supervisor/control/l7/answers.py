"""The refusals inspection writes to the agent, built from decisions and failures (docs/reference/policy.md §3.17).

Pure: each function returns a :class:`~supervisor.protocol.responses.ErrorResponse`; nothing here holds a
secret (details come from decisions over redacted requests, and from upstream errors about addresses).
"""

from __future__ import annotations

from supervisor.control.policy import Decision
from supervisor.control.upstream import UpstreamError
from supervisor.protocol.responses import ErrorCode, ErrorResponse, L7Denial

__all__ = ["authority_mismatch", "dial_failure", "policy_denied", "unsupported"]


def policy_denied(decision: Decision, *, method: str, path: str, host: str, port: int, detail: str,
                  binary: str | None = None) -> ErrorResponse:  # fmt: skip
    """The tunnel L7 deny of §3.10.4: what was refused, by which policy, and what to ask for."""
    where = f" in policy '{decision.rule}'" if decision.rule else ""
    denial = L7Denial(
        policy=decision.rule,
        reason=str(decision.reason) if decision.reason else None,
        method=method,
        path=path,
        host=host,
        port=port,
        binary=binary,
        next_steps=(f"ask the sandbox operator to allow {method} {path} on {host}:{port}{where}",),
    )
    headers: tuple[tuple[str, str], ...] = ()
    if decision.rule and decision.rule.isascii() and decision.rule.isprintable():
        headers = (("X-OpenShell-Policy", decision.rule),)
    return ErrorResponse(403, ErrorCode.POLICY_DENIED, detail or "request denied by policy", denial, headers)


def authority_mismatch(request_host: str, request_port: int, host: str, port: int) -> ErrorResponse:
    return ErrorResponse(403, ErrorCode.REQUEST_AUTHORITY_MISMATCH,
                         f"HTTP request authority {request_host}:{request_port} does not match the authorized "
                         f"tunnel endpoint {host}:{port}")  # fmt: skip


def unsupported(what: str) -> ErrorResponse:
    return ErrorResponse(403, ErrorCode.UNSUPPORTED_L7_PROTOCOL, f"{what} is not supported for L7-inspected endpoints")


def dial_failure(exc: UpstreamError) -> ErrorResponse:
    """``connect_upstream`` refused (SSRF → 403) or failed (502/504)."""
    if exc.reason.ssrf:
        return ErrorResponse(403, ErrorCode.SSRF_DENIED, exc.detail[:500])
    if exc.status == 504:
        return ErrorResponse(504, ErrorCode.UPSTREAM_TIMEOUT, exc.detail[:500])
    return ErrorResponse(502, ErrorCode.UPSTREAM_UNREACHABLE, exc.detail[:500])
