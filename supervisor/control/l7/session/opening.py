"""The opening of a connection (§3.7): what is spoken, the ClientHello's server name, TLS toward the agent.

Bytes that are neither TLS nor HTTP, and a connection whose origin speaks first, are relayed raw on an endpoint
without L7 rules (``relay_raw``); h2c and, elsewhere, unknown bytes are refused (``refuse_tunnel``).
"""

from __future__ import annotations

import trio

from supervisor.control.l7.ca import LeafError
from supervisor.control.l7.client_hello import ClientHelloError, Pending, server_name
from supervisor.control.l7.memory_tls import MemoryTLSStream
from supervisor.control.l7.record import CloseReason
from supervisor.control.l7.session.state import STREAM_ERRORS, AgentFailed, Session, UpstreamFailed
from supervisor.control.l7.sniff import TunnelProtocol, sniff
from supervisor.control.l7.streams import PrefixedStream, abort_all
from supervisor.control.policy.hosts import normalize_request_host
from supervisor.control.upstream import UpstreamError
from supervisor.link.relay import relay
from supervisor.protocol.outcome_reasons import OutcomeReason
from supervisor.protocol.responses import ErrorCode, ErrorResponse


async def sniff_protocol(s: Session) -> TunnelProtocol | None:
    """What the first bytes speak, waiting up to the head timeout while they are ambiguous; ``None`` when the
    connection ended (already recorded) before that was known."""
    first = await _first_bytes(s)
    if s.origin_first is not None:  # only with raw_fallback: an early upstream is given for no other
        if s.origin_first[:5].upper() == b"HTTP/":
            # an HTTP server answering nothing (a 408 after its own timeout) is no server-first protocol:
            # pass its answer on and close, never turn the tunnel raw
            await s.send_quietly(s.origin_first)
            s.tunnel_event("closed", reason=OutcomeReason.ORIGIN_ANSWERED_FIRST)
            s.end(CloseReason.UPSTREAM)
            return None
        s.buffer += first or b""
        return TunnelProtocol.UNKNOWN
    if first is None or not first:
        s.end(CloseReason.IDLE if first is None else CloseReason.AGENT)
        return None
    s.buffer += first
    deadline = trio.current_time() + s.limits.head_timeout
    while True:
        proto = sniff(bytes(s.buffer))
        if proto is not None:
            return proto
        more = await s.agent_recv(deadline - trio.current_time())
        if more is None:  # still ambiguous at the head timeout: neither relayed nor parsed
            s.tunnel_event(
                "closed",
                reason=OutcomeReason.SNIFF_TIMEOUT,
                detail="the first bytes were neither TLS nor HTTP nor anything else in time",
            )
            s.end(CloseReason.MALFORMED, OutcomeReason.SNIFF_TIMEOUT, clean=False)
            return None
        if not more:
            return sniff(bytes(s.buffer), final=True)
        s.buffer += more


async def _first_bytes(s: Session) -> bytes | None:
    """The agent's first bytes (``b""`` at EOF, ``None`` when idle); with an early upstream, an origin that
    speaks first (a server-first protocol: SMTP, MySQL, SSH) is noted in ``s.origin_first``."""
    if s.early_upstream is None:
        return await s.agent_recv(None)
    upstream = s.early_upstream
    got: dict[str, bytes] = {}

    failed: list[AgentFailed | UpstreamFailed] = []

    async def from_agent(scope: trio.CancelScope) -> None:
        try:
            data = await s.agent_recv(None)
        except AgentFailed as exc:
            failed.append(exc)
            data = None
        if data is not None:
            got["agent"] = data
        scope.cancel()

    async def from_upstream(scope: trio.CancelScope) -> None:
        try:
            got["upstream"] = bytes(await upstream.receive_some(s.limits.chunk))
        except STREAM_ERRORS as exc:
            failed.append(UpstreamFailed(f"upstream: {type(exc).__name__}"))
        scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(from_agent, nursery.cancel_scope)
        nursery.start_soon(from_upstream, nursery.cancel_scope)
    if failed:
        raise failed[0]
    if "upstream" in got:
        s.origin_first = got["upstream"]
        return got.get("agent", b"")
    return got.get("agent")


async def check_server_name(s: Session) -> bool:
    """Read the whole ClientHello; its SNI must name this tunnel's host (no fronting by SNI), or pick the
    name for a transparent capture to an address (``choose_name``)."""
    deadline = trio.current_time() + s.limits.head_timeout
    while True:
        try:
            sni = server_name(bytes(s.buffer))
        except ClientHelloError as exc:
            s.tunnel_event("refused", reason=OutcomeReason.INVALID_CLIENT_HELLO, detail=str(exc))
            s.end(CloseReason.AGENT_TLS, str(exc), clean=False)
            return False
        if not isinstance(sni, Pending):
            break
        more = await s.agent_recv(deadline - trio.current_time())
        if not more:
            s.tunnel_event(
                "closed",
                reason=OutcomeReason.CLIENT_HELLO_INCOMPLETE,
                detail="the TLS ClientHello did not arrive whole in time",
            )
            s.end(CloseReason.AGENT_TLS, OutcomeReason.CLIENT_HELLO_INCOMPLETE, clean=False)
            return False
        s.buffer += more
    if sni is None:
        return True
    wanted = normalize_request_host(sni)
    if wanted == s.name:
        return True
    if s.choose_name is not None and wanted is not None:
        chosen = s.choose_name(wanted)
        if chosen is not None:
            s.name, s.l4 = wanted, chosen
            return True
    s.stats.denied += 1
    s.tunnel_event("refused", reason=str(ErrorCode.REQUEST_AUTHORITY_MISMATCH),
                   finding="openshell.tls.server_name_mismatch", server_name=sni[:255],
                   detail=f"TLS server name {sni[:255]!r} does not match the authorized tunnel endpoint "
                          f"{s.name}:{s.port}")  # fmt: skip
    s.end(CloseReason.DENIED, "server-name-mismatch", clean=False)
    return False


async def terminate_tls(s: Session) -> bool:
    """TLS toward the agent, with a leaf for the tunnel's name from the sandbox CA; ``False`` when it failed."""
    try:
        ctx = s.ca.leaf_context(s.name)
    except LeafError as exc:
        s.tunnel_event("agent-tls-failed", reason=OutcomeReason.NO_LEAF, detail=str(exc))
        s.end(CloseReason.AGENT_TLS, str(exc), clean=False)
        return False
    stream = MemoryTLSStream(s.agent, ctx, server_side=True)  # the agent side is a link stream
    try:
        with trio.fail_after(s.limits.handshake_timeout):
            await stream.do_handshake()
    except (trio.TooSlowError, *STREAM_ERRORS) as exc:
        cause = exc.__cause__ or exc
        detail = f"TLS handshake with the agent failed: {type(cause).__name__}: {cause}"
        if "unknown ca" in str(cause).lower() or "certificate unknown" in str(cause).lower():
            detail += " (the agent does not trust the sandbox CA: check SSL_CERT_FILE and friends)"
        s.tunnel_event("agent-tls-failed", reason=OutcomeReason.AGENT_TLS_HANDSHAKE_FAILED, detail=detail[:500])
        s.end(CloseReason.AGENT_TLS, detail[:500], clean=False)
        s.agent = stream
        return False
    s.agent = stream
    s.tls = True
    return True


async def refuse_tunnel(s: Session, proto: TunnelProtocol) -> None:
    """h2c prior knowledge, or bytes that are neither TLS nor HTTP where they cannot be relayed raw: 403."""
    if proto is TunnelProtocol.H2C:
        detail = "HTTP/2 prior-knowledge (h2c) is not supported for L7-inspected endpoints"
    else:
        detail = "Unsupported tunnel protocol for L7-inspected endpoint"
    s.tunnel_event("refused", reason=str(ErrorCode.UNSUPPORTED_L7_PROTOCOL), detail=detail)
    s.stats.denied += 1
    await s.send_quietly(ErrorResponse(403, ErrorCode.UNSUPPORTED_L7_PROTOCOL, detail).render())
    s.end(CloseReason.UNSUPPORTED)


async def relay_raw(s: Session) -> None:
    """Bytes that are neither TLS nor HTTP on an endpoint without L7 rules: relayed untouched."""
    upstream: trio.abc.HalfCloseableStream
    if s.early_upstream is not None:
        upstream, s.early_upstream = s.early_upstream, None
    else:
        try:  # connect_upstream is bounded by whoever supplies it (control/egress.py sets the dial's deadline)
            upstream = await s.connect_upstream()
        except (UpstreamError, OSError) as exc:
            s.tunnel_event(OutcomeReason.UPSTREAM_FAILED, reason=type(exc).__name__)
            s.end(CloseReason.UPSTREAM_FAILED, type(exc).__name__, clean=False)
            return
    agent = PrefixedStream(s.raw, bytes(s.buffer))
    s.buffer.clear()
    if s.origin_first:
        try:
            await agent.send_all(s.origin_first)
        except STREAM_ERRORS as exc:
            await abort_all(upstream)
            raise AgentFailed(f"agent: {type(exc).__name__}") from None
        s.stats.bytes_down += len(s.origin_first)
    s.handed_off = True
    relayed = await relay(agent, upstream, idle_timeout=s.limits.idle_timeout, chunk=s.limits.chunk)
    s.stats.bytes_up += relayed.bytes_a_to_b
    s.stats.bytes_down += relayed.bytes_b_to_a
    why = {"a": CloseReason.AGENT, "b": CloseReason.UPSTREAM, "idle-timeout": CloseReason.IDLE}
    s.end(why.get(relayed.closed_by, CloseReason.ERROR), relayed.error, clean=relayed.error is None)
