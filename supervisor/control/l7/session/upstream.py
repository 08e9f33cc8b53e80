"""The upstream side of each admitted request: its connection, and the exchange of the request and its answer.

The connection is dialled (and TLS toward it verified) for the first admitted request and reused while both
h11 state machines allow; one that cannot be reused is dropped, and a reused one that fails before any response
byte is retried once for a bodiless request. The request body and the response are pumped concurrently: an
upstream may answer before the upload ends.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import h11
import trio

from supervisor.control.l7 import answers
from supervisor.control.l7.memory_tls import MemoryTLSStream
from supervisor.control.l7.record import CloseReason, RequestRecord
from supervisor.control.l7.session.refusal import upstream_refusal
from supervisor.control.l7.session.response import pump_response
from supervisor.control.l7.session.state import STREAM_ERRORS, AgentFailed, ResponseRefused, Session, UpstreamFailed
from supervisor.control.l7.session.upgrade import relay_switched
from supervisor.control.l7.streams import Outbox, abort_all
from supervisor.control.upstream import UpstreamError, UpstreamReason
from supervisor.protocol.outcome_reasons import OutcomeReason
from supervisor.protocol.responses import ErrorCode, ErrorResponse


async def forward(s: Session, conn: h11.Connection, rec: RequestRecord, request: h11.Request) -> bool:
    """Send the admitted request upstream and its answer to the agent; ``True`` when the connection goes on to
    the next request."""
    for attempt in (0, 1):
        fresh = s.upstream is None
        if fresh and not await _open_upstream(s, conn, rec):
            return False
        outcome = await _exchange(s, conn, rec, request)
        failure, s.failure = s.failure, None
        if failure is None:
            break
        retry = (isinstance(failure, UpstreamFailed) and not isinstance(failure, ResponseRefused) and not fresh
                 and attempt == 0 and not rec.has_body and not rec.response_started)  # fmt: skip
        await _drop_upstream(s)
        if retry:
            continue
        rec.error = str(failure)
        if isinstance(failure, UpstreamFailed) and not rec.response_started:
            late = failure.timed_out
            refused = isinstance(failure, ResponseRefused)
            what = "did not answer in time" if late else "answered what cannot be passed on" if refused else (
                "failed to answer")  # fmt: skip
            answer = ErrorResponse(504 if late else 502,
                                   ErrorCode.UPSTREAM_TIMEOUT if late else ErrorCode.UPSTREAM_PROTOCOL_ERROR,
                                   f"{s.name}:{s.port} {what}: {failure}")  # fmt: skip
            reason = failure.reason if isinstance(failure, ResponseRefused) else (
                OutcomeReason.UPSTREAM_TIMEOUT if late else OutcomeReason.UPSTREAM_FAILED)  # fmt: skip
            return await upstream_refusal(s, conn, rec, answer, reason)
        s.request_event(rec)
        s.end(CloseReason.AGENT if isinstance(failure, AgentFailed) else CloseReason.UPSTREAM_FAILED,
              str(failure), clean=False)  # fmt: skip
        return False

    if outcome == "switched":
        s.request_event(rec)
        await relay_switched(s, conn, rec)
        return False
    s.request_event(rec)
    up = s.up
    assert up is not None
    if up.our_state is h11.DONE and up.their_state is h11.DONE:
        up.start_next_cycle()
    else:
        await _drop_upstream(s)
    if not rec.request_done or conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
        s.end(CloseReason.AGENT if conn.their_state is h11.MUST_CLOSE else CloseReason.UPSTREAM)
        return False
    s.buffer = bytearray(conn.trailing_data[0])
    return True


async def _open_upstream(s: Session, conn: h11.Connection, rec: RequestRecord) -> bool:
    try:
        if s.early_upstream is not None:  # dialled before the agent's first byte (raw_fallback)
            tcp, s.early_upstream = s.early_upstream, None
        else:  # bounded by whoever supplies connect_upstream (control/egress.py sets the dial's deadline)
            tcp = await s.connect_upstream()
    except UpstreamError as exc:  # a timeout is one too: connect-timeout, 504
        return await upstream_refusal(s, conn, rec, answers.dial_failure(exc), str(exc.reason))
    except OSError as exc:
        return await upstream_refusal(s, conn, rec, ErrorResponse(
            502, ErrorCode.UPSTREAM_UNREACHABLE, f"connect to {s.name}:{s.port} failed: {exc}"[:500]),
            str(UpstreamReason.CONNECT_FAILED))  # fmt: skip
    stream: trio.abc.Stream = tcp
    if s.tls:
        # memory BIOs here too: one recv per chunk, where OpenSSL on the socket reads each record twice (memory_tls)
        tls_stream = MemoryTLSStream(tcp, s.upstream_ssl, server_side=False, server_hostname=s.name)
        try:
            with trio.fail_after(s.limits.handshake_timeout):
                await tls_stream.do_handshake()
            alpn = tls_stream.selected_alpn_protocol()
            if alpn not in (None, "http/1.1"):
                raise UpstreamFailed(f"upstream chose ALPN {alpn!r}")
        except (trio.TooSlowError, UpstreamFailed, *STREAM_ERRORS) as exc:
            await abort_all(tls_stream)
            cause = exc.__cause__ or exc
            if isinstance(cause, ssl.SSLCertVerificationError):
                detail = (f"the certificate of {s.name}:{s.port} failed verification: "
                          f"{cause.verify_message or cause.reason}")  # fmt: skip
            else:
                detail = f"TLS handshake with {s.name}:{s.port} failed: {type(cause).__name__}: {cause}"
            return await upstream_refusal(s, conn, rec, ErrorResponse(
                502, ErrorCode.UPSTREAM_TLS_FAILED, detail[:500]), OutcomeReason.UPSTREAM_TLS_FAILED)  # fmt: skip
        stream = tls_stream
    s.upstream = stream
    s.up = h11.Connection(h11.CLIENT, max_incomplete_event_size=s.limits.max_upstream_head)
    return True


async def _drop_upstream(s: Session) -> None:
    stream, s.upstream, s.up = s.upstream, None, None
    if stream is not None:
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(stream)


async def _exchange(s: Session, conn: h11.Connection, rec: RequestRecord, request: h11.Request) -> str | None:
    outcome: str | None = None
    if not rec.has_body:
        # nothing to upload: the request is complete before the answer starts, so no second task is needed
        with trio.CancelScope() as s.scope:
            await _guarded(s, _pump_request, s, conn, rec, request)
            if s.failure is None:
                outcome = await _guarded(s, pump_response, s, conn, rec)
        return outcome
    async with trio.open_nursery() as nursery:
        s.scope = nursery.cancel_scope
        nursery.start_soon(_guarded, s, _pump_request, s, conn, rec, request)
        outcome = await _guarded(s, pump_response, s, conn, rec)
        if not rec.request_done:
            nursery.cancel_scope.cancel()  # the answer is complete; the rest of the upload is not wanted
    return outcome


async def _guarded(s: Session, fn: Callable[..., Awaitable[str | None]], *args: Any) -> str | None:
    try:
        return await fn(*args)
    except (AgentFailed, UpstreamFailed) as exc:
        if s.failure is None:
            s.failure = exc
        s.scope.cancel()
        return None


# Both pumps coalesce: what h11 yields without needing more input is written in one ``send_all`` (a head
# and the body bytes that arrived with it cost one TLS record and one syscall, not three), flushed before
# waiting for input and whenever a chunk's worth is pending, so buffering stays bounded.


async def _pump_request(s: Session, conn: h11.Connection, rec: RequestRecord, request: h11.Request) -> str | None:
    up = s.up
    assert up is not None
    out = Outbox()
    out.add(up.send_with_data_passthrough(request))
    if rec.request_done:  # a retry of a bodiless request, or a body read whole to decide it (``rec.body``)
        if rec.body:
            out.add(up.send_with_data_passthrough(h11.Data(data=rec.body)))
            rec.bytes_up += len(rec.body)
        out.add(up.send_with_data_passthrough(h11.EndOfMessage()))
        await s.up_send(out.take())
        return None
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise AgentFailed(f"agent: malformed request body: {exc}") from None
        if event is h11.NEED_DATA:
            if out.size:
                await s.up_send(out.take())
            data = await s.agent_recv(None)
            if data is None:
                raise AgentFailed("agent: request body stalled (idle timeout)")
            conn.receive_data(data)
            continue
        if isinstance(event, h11.Data):
            out.add(up.send_with_data_passthrough(h11.Data(data=event.data)))
            rec.bytes_up += len(event.data)
            if out.size >= s.limits.chunk:
                await s.up_send(out.take())
            continue
        if isinstance(event, h11.EndOfMessage):
            rec.request_done = True
            out.add(up.send_with_data_passthrough(h11.EndOfMessage()))  # request trailers are not forwarded
            await s.up_send(out.take())
            return None
        raise AgentFailed(f"agent: connection ended inside the request ({type(event).__name__})")
