"""What the listener calls: :func:`inspect` serves one admitted connection to its end.

It opens the connection (``opening``), serves its requests one by one (``request``) while the policy generation
still allows it, turns the failures the phases raise into how it closed, and closes both streams.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable, Mapping

import trio

from supervisor.control.credentials import Credentials
from supervisor.control.l7.ca import InterceptionCA
from supervisor.control.l7.record import CloseReason, InspectStats
from supervisor.control.l7.session.opening import (
    check_server_name,
    refuse_tunnel,
    relay_raw,
    sniff_protocol,
    terminate_tls,
)
from supervisor.control.l7.session.request import one_request
from supervisor.control.l7.session.state import STREAM_ERRORS, AgentFailed, Limits, Session, UpstreamFailed
from supervisor.control.l7.sniff import TunnelProtocol
from supervisor.control.l7.streams import PrefixedStream, abort_all
from supervisor.control.l7.upstream_tls import check_upstream_context
from supervisor.control.policy import Decision, PolicySnapshot
from supervisor.jsonlog import JsonLog
from supervisor.protocol.json_value import JsonValue
from supervisor.protocol.outcome_reasons import OutcomeReason


async def inspect(
    agent: trio.abc.HalfCloseableStream,
    *,
    host: str,
    port: int,
    tls: bool | None,
    snapshot: PolicySnapshot,
    l4: Decision,
    connect_upstream: Callable[[], Awaitable[trio.abc.HalfCloseableStream]],
    ca: InterceptionCA,
    credentials: Credentials,
    upstream_ssl: ssl.SSLContext,
    log: JsonLog,
    event_fields: Mapping[str, JsonValue] | None = None,
    is_current: Callable[[int], bool] | None = None,
    limits: Limits | None = None,
    raw_fallback: bool = False,
    early_upstream: trio.abc.HalfCloseableStream | None = None,
    current: Callable[[str, int], tuple[PolicySnapshot, Decision]] | None = None,
    choose_name: Callable[[str], Decision | None] | None = None,
) -> InspectStats:
    """Serve one admitted connection whose endpoint asks for inspection; returns when it is over.

    ``agent`` is the agent's side (after the CONNECT's 200, or the http-forward request's origin-form bytes);
    ``host``/``port`` the authority it was admitted for; ``tls`` True/False when known, None to decide from
    the first bytes. ``snapshot``/``l4`` are the policy generation and L4 decision that admitted it;
    ``is_current(generation)`` (e.g. ``PolicyStore.is_current``) closes the connection before the next
    request once the policy changed. ``connect_upstream`` returns a connected TCP stream to the vetted
    address, or raises ``UpstreamError`` (its own deadline run out included: the caller sets it); it is called
    lazily, for the first admitted request, and again only if the upstream closed a kept-alive connection.
    Both streams are owned here and closed (or reset, after a failure) on return.

    Endpoints without L7 rules pass ``raw_fallback``: bytes that are neither TLS nor HTTP are relayed raw to
    ``early_upstream`` (dialled already, and also watched: an origin that speaks first makes the connection
    raw). ``current(host, port)`` returns the newest snapshot and this connection's L4 decision under it: a
    new generation that still allows the connection keeps it (instead of closing before the next request).
    ``choose_name(sni)`` — for a transparent capture to an address — returns the L4 decision for a name the
    ClientHello asks for (or ``None`` to refuse it); without it an SNI must name ``host``.
    """
    check_upstream_context(upstream_ssl)
    session = Session(
        agent, host=host, port=port, snapshot=snapshot, l4=l4, connect_upstream=connect_upstream, ca=ca,
        credentials=credentials, upstream_ssl=upstream_ssl, log=log, event_fields=event_fields or {},
        is_current=is_current, limits=limits or Limits(), raw_fallback=raw_fallback, early_upstream=early_upstream,
        current=current, choose_name=choose_name,
    )  # fmt: skip
    return await _run(session, tls)


async def _run(s: Session, tls: bool | None) -> InspectStats:
    try:
        await _serve(s, tls)
    except AgentFailed as exc:
        s.end(CloseReason.AGENT, str(exc), clean=False)
    except UpstreamFailed as exc:
        s.end(CloseReason.UPSTREAM_FAILED, str(exc), clean=False)
    except trio.Cancelled:
        s.end(CloseReason.POLICY if s.stale() else CloseReason.ERROR, "cancelled", clean=False)
        raise
    except Exception as exc:  # a bug here must cost one connection, and its text may hold request bytes
        s.tunnel_event(OutcomeReason.INTERNAL_ERROR, reason=type(exc).__name__)
        s.end(CloseReason.ERROR, type(exc).__name__, clean=False)
    finally:
        await _close(s)
    return s.stats


async def _serve(s: Session, tls: bool | None) -> None:
    """What is spoken decides the rest: a raw relay, a refusal, or requests (after TLS toward the agent)."""
    proto: TunnelProtocol | None
    if tls is None:
        proto = await sniff_protocol(s)
        if proto is None:
            return
    else:
        proto = TunnelProtocol.TLS if tls else TunnelProtocol.HTTP1
    s.stats.protocol = str(proto)
    if proto is TunnelProtocol.UNKNOWN and s.raw_fallback:
        await relay_raw(s)
        return
    if proto in (TunnelProtocol.H2C, TunnelProtocol.UNKNOWN):
        await refuse_tunnel(s, proto)
        return
    if proto is TunnelProtocol.TLS:
        if not await check_server_name(s):
            return
        if s.buffer:
            s.agent = PrefixedStream(s.raw, bytes(s.buffer))
            s.buffer.clear()
        if not await terminate_tls(s):
            return
    while True:
        if s.stale() and not _adopt_current_policy(s):
            s.tunnel_event("closed", reason=OutcomeReason.POLICY_REVISION,
                           detail="the new policy no longer allows this connection")  # fmt: skip
            s.end(CloseReason.POLICY)
            return
        if not await one_request(s):
            return


def _adopt_current_policy(s: Session) -> bool:
    """A new policy generation: re-decide this connection; keep it (under the new generation) if allowed."""
    if s.current is None:
        return False
    snapshot, l4 = s.current(s.name, s.port)
    if not l4.allowed or l4.tls_skip:
        return False
    s.snapshot, s.l4 = snapshot, l4
    return True


async def _close(s: Session) -> None:
    """Both streams closed politely after a clean end, reset after a failure."""
    if s.handed_off:  # the raw relay closed (or aborted) both streams itself
        return
    with trio.CancelScope(shield=True):
        if s.early_upstream is not None:  # dialled for a raw relay that never happened
            await trio.aclose_forcefully(s.early_upstream)
        if not s.clean:
            await abort_all(s.agent)
            await abort_all(s.upstream)
            return
        for stream in (s.agent, s.upstream):
            if stream is None:
                continue
            with trio.move_on_after(1.0):
                try:
                    await stream.aclose()
                except STREAM_ERRORS:
                    pass
            await trio.aclose_forcefully(stream)
