"""The answers that refuse a request: written as h11 allows at that point, logged, and the connection ended.

What the agent still sends is drained briefly first, so that closing does not reset the answer away.
"""

from __future__ import annotations

from typing import NoReturn

import h11
import trio

from supervisor.control.l7.record import CloseReason, RequestRecord
from supervisor.control.l7.session.state import STREAM_ERRORS, Done, Session
from supervisor.protocol.responses import ErrorCode, ErrorResponse

_MAX_DRAIN = 1 << 20


async def refuse(s: Session, conn: h11.Connection, rec: RequestRecord, response: ErrorResponse, *, reason: str,
                 detail: str | None = None) -> NoReturn:  # fmt: skip
    """A request the policy or its checks refuse: answered, logged, the connection ended (``Done``)."""
    rec.decision = "deny"
    rec.reason = reason
    rec.detail = detail or response.detail
    rec.status = response.status
    await _write_response(s, conn, rec, response)
    s.request_event(rec)
    if rec.has_body and not rec.expects_continue:
        await _drain(s)
    s.end(CloseReason.DENIED)
    raise Done


async def upstream_refusal(s: Session, conn: h11.Connection, rec: RequestRecord, response: ErrorResponse,
                           reason: str) -> bool:  # fmt: skip
    """A request the upstream could not serve (unreachable, TLS, no usable answer): answered as an error,
    logged, the connection ended; ``False`` for the caller to return."""
    rec.error = reason
    await _write_response(s, conn, rec, response)
    rec.status = response.status
    rec.reason = reason
    rec.detail = response.detail
    if response.code is ErrorCode.SSRF_DENIED:
        rec.decision = "deny"
    else:
        rec.decision = "error"
    s.request_event(rec)
    if rec.has_body and not rec.expects_continue:
        await _drain(s)
    s.end(CloseReason.UPSTREAM_FAILED, reason)
    return False


async def _write_response(s: Session, conn: h11.Connection | None, rec: RequestRecord, response: ErrorResponse) -> None:
    if conn is None or conn.our_state is not h11.SEND_RESPONSE:
        await s.send_quietly(response.render())
        return
    data = conn.send(h11.Response(status_code=response.status, headers=response.header_list(),
                                  reason=response.reason_phrase.encode()))  # fmt: skip
    if not rec.head_method:
        data = (data or b"") + (conn.send(h11.Data(data=response.body())) or b"")
    data = (data or b"") + (conn.send(h11.EndOfMessage()) or b"")
    await s.send_quietly(data)


async def _drain(s: Session) -> None:
    """Read (and drop) what the agent is still sending, briefly, so closing does not reset our answer away."""
    seen = 0
    with trio.move_on_after(s.limits.drain_timeout):
        while seen < _MAX_DRAIN:
            try:
                data = await s.agent.receive_some(s.limits.chunk)
            except STREAM_ERRORS:
                return
            if not data:
                return
            seen += len(data)
