"""One inspected connection: terminate TLS if asked, then judge and forward HTTP/1.1 requests one by one.

Size (over ~500 lines on purpose): one connection's state machine — TLS, sniffing, each request, the upstream,
upgrades — whose methods share that connection's state (streams, idle clock, policy generation); the pure pieces are
already beside it (record, answers, rewrite, websocket, sniff; request heads: protocol/request_head).

Theory of operation
-------------------
``inspect`` serves the agent's side of one connection that control has already admitted at L4, on any
endpoint but ``tls: skip``. It owns both streams from then on.

1. **What is spoken** (§3.7). The caller says TLS or plaintext, or leaves it to the first bytes (``sniff``,
   waiting up to the head timeout while they are ambiguous). h2c prior knowledge is refused with ``403
   unsupported_l7_protocol``; bytes that are neither TLS nor HTTP too, except on endpoints without L7 rules
   (``raw_fallback``), where they — and connections whose origin speaks first — are relayed raw.
2. **TLS toward the agent**: the whole ClientHello is read first; its SNI must name the tunnel's host (or, for
   a transparent capture, a name issued for its address: ``choose_name``). It is terminated with a leaf for
   that host from the sandbox CA; TLS toward the upstream is opened for the first admitted request, and
   always verified (``upstream_tls``).
3. **Each request** (§3.12), on a kept-alive connection, in order: raw head validation (``protocol/request_head``: the
   smuggling shapes h11 tolerates) → h11 parse → authority binding (``authority``) → protocol checks (CONNECT,
   h2c and non-websocket upgrades refused) → canonical target, placeholders redacted → ``decide_l7`` (allow,
   audit, deny) → credential rewrite (``rewrite``, only now, scoped to this endpoint) → upstream write. A
   refusal answers with the catalogue's JSON body and closes the connection; a parse error closes it without
   a response. One JSON event per request, never with a secret or a query string in it.
4. **Bodies stream** through both h11 state machines with one bounded chunk in flight per direction; the
   request body and the response are pumped concurrently (an upstream may answer before the upload ends,
   ``100 Continue`` passes through). Responses from a host a credential is bound to carry its placeholder
   where the secret was echoed — reason phrase, header names and values, ``1xx`` heads, body (``scrub``);
   requests there go without ``Range``/``If-Range`` and ask for identity encoding, and a ``206``, a compressed
   body or a secret in a header name is answered ``502`` instead. A ``101`` to a websocket upgrade (allowed on
   endpoints without L7 rules and on ``protocol: websocket`` ones) turns the rest of the connection into a raw
   relay. The connection is idle only when no byte moved either way for the idle timeout (``idle``).
5. **Between requests** the policy generation is checked: a revision re-decides the connection
   (``current``) and closes it only if the new generation denies it (§3.15); an upstream connection that
   cannot be reused is dropped and a new one dialled for the next request (a reused one that fails before
   any response byte is retried once for a bodiless request).
"""

from __future__ import annotations

import functools
import hashlib
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, NoReturn, cast

import h11
import trio

from supervisor.control.credentials import Credentials
from supervisor.control.l7 import answers
from supervisor.control.l7.authority import AuthorityError, AuthoritySource, request_authority, same_authority
from supervisor.control.l7.body import BodyRequest, refused
from supervisor.control.l7.body_decide import evaluate
from supervisor.control.l7.ca import InterceptionCA, LeafError
from supervisor.control.l7.client_hello import ClientHelloError, Pending, server_name
from supervisor.control.l7.graphql import decide_ws_message
from supervisor.control.l7.idle import IdleClock
from supervisor.control.l7.memory_tls import MemoryTLSStream
from supervisor.control.l7.record import CloseReason, InspectStats, RequestRecord, display_path
from supervisor.control.l7.rewrite import CredentialRefusal, redact_path, redact_query, rewrite_request
from supervisor.control.l7.scrub import Scrubber, bound_request_headers, unscrubbable, valid_name
from supervisor.control.l7.signing import Payload, Plan, SigningConfig, SigningRefusal, plan, signed_headers
from supervisor.control.l7.sniff import TunnelProtocol, sniff
from supervisor.control.l7.streams import Outbox, PrefixedStream, abort_all
from supervisor.control.l7.upstream_tls import check_upstream_context
from supervisor.control.l7.websocket import (
    ClientFrameFilter,
    CloseCode,
    FilterStop,
    MessageFilter,
    client_close_frame,
    server_close_frame,
    websocket_upgrade,
    without_extensions,
)
from supervisor.control.policy import (
    BodyRoute,
    Decision,
    DenyReason,
    PolicySnapshot,
    Protocol,
    TargetError,
    Verdict,
    canonicalize_target,
)
from supervisor.control.policy.hosts import normalize_request_host
from supervisor.control.upstream import UpstreamError, UpstreamReason
from supervisor.jsonlog import JsonLog
from supervisor.link.relay import Flow, RelayEnd, relay
from supervisor.protocol.event_names import EventName
from supervisor.protocol.outcome_reasons import OutcomeReason
from supervisor.protocol.request_head import MAX_HEAD_BYTES, HeadError, HeadReader, RequestHead
from supervisor.protocol.responses import ErrorCode, ErrorResponse

__all__ = ["Limits", "inspect"]

_STREAM_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
_RESERVED_EVENT_KEYS = frozenset({"event", "time", "component"})
_MAX_DRAIN = 1 << 20


@dataclass(frozen=True)
class Limits:
    idle_timeout: float = 300.0  # no progress either way: keep-alive idle, a slow upstream, a stalled reader
    head_timeout: float = 30.0  # from a head's first byte to its end (slowloris)
    handshake_timeout: float = 10.0  # each TLS handshake
    drain_timeout: float = 0.5  # reading what the agent still sends after a refusal, so it sees the answer
    chunk: int = 65536  # one read; at most one chunk per direction is held here
    max_upstream_head: int = 64 * 1024


class _AgentFailed(Exception):
    pass


class _UpstreamFailed(Exception):
    """The upstream side failed; ``timed_out`` when nothing moved for the idle timeout (answered 504, not 502)."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class _ResponseRefused(_UpstreamFailed):
    """The upstream's response cannot reach the agent without handing it a secret (``scrub``): answered 502 with
    ``reason`` in the event, never retried (the upstream did answer)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def _authority_text(host: str, port: int, tls: bool) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port == (443 if tls else 80) else f"{shown}:{port}"


def _endpoint_signing(snapshot: PolicySnapshot, decision: Decision) -> SigningConfig | None:
    """The admitting endpoint's ``credential_signing``, else that of another endpoint of this host:port that has one
    (the ambiguity check makes overlapping signing endpoints agree)."""
    policy = snapshot.policy
    if policy is None:
        return None
    candidates = sorted(policy.endpoints_for(decision.host, decision.port), key=lambda c: c.label != decision.endpoint)
    for cep in candidates:
        ep = cep.endpoint
        if ep.credential_signing is not None and ep.signing_service is not None:
            return SigningConfig(ep.credential_signing, ep.signing_service, ep.signing_region)
    return None


def _endpoint_protocol(snapshot: PolicySnapshot, decision: Decision) -> Protocol | None:
    if snapshot.policy is None or decision.endpoint is None:
        return None
    for cep in snapshot.policy.endpoints_for(decision.host, decision.port):
        if cep.label == decision.endpoint:
            return cep.endpoint.protocol
    return None


class _Session:
    def __init__(
        self,
        agent: trio.abc.HalfCloseableStream,
        *,
        host: str,
        port: int,
        snapshot: PolicySnapshot,
        l4: Decision,
        connect_upstream: Callable[[], Awaitable[trio.abc.HalfCloseableStream]],
        ca: InterceptionCA,
        credentials: Credentials,
        upstream_ssl: ssl.SSLContext,
        log: JsonLog,
        event_fields: Mapping[str, Any],
        is_current: Callable[[int], bool] | None,
        limits: Limits,
        raw_fallback: bool = False,
        early_upstream: trio.abc.HalfCloseableStream | None = None,
        current: Callable[[str, int], tuple[PolicySnapshot, Decision]] | None = None,
        choose_name: Callable[[str], Decision | None] | None = None,
    ) -> None:
        self.raw = agent
        self.agent: trio.abc.Stream = agent
        self.name = normalize_request_host(host) or host.lower()
        self.port = port
        self.snapshot = snapshot
        self.l4 = l4
        self.connect_upstream = connect_upstream
        self.ca = ca
        self.creds = credentials
        self.upstream_ssl = upstream_ssl
        self.log = log
        self.fields = {k: v for k, v in event_fields.items() if k not in _RESERVED_EVENT_KEYS}
        self.is_current = is_current
        self.limits = limits
        self.tls = False
        self.buffer = bytearray()
        self.upstream: trio.abc.Stream | None = None
        self.up: h11.Connection | None = None
        self.stats = InspectStats()
        self.clean = True
        self.failure: _AgentFailed | _UpstreamFailed | None = None
        self._scope = trio.CancelScope()
        self._ws_filter: ClientFrameFilter | MessageFilter | None = None
        self._ws_text_decision: Decision | None = None
        self.raw_fallback = raw_fallback
        self.early_upstream = early_upstream
        self.origin_first: bytes | None = None
        self.current = current
        self.choose_name = choose_name
        self._handed_off = False
        self.idle = IdleClock(limits.idle_timeout)

    # --- the connection --------------------------------------------------------------------------------------
    async def run(self, tls: bool | None) -> InspectStats:
        try:
            await self._serve(tls)
        except _AgentFailed as exc:
            self._end(CloseReason.AGENT, str(exc), clean=False)
        except _UpstreamFailed as exc:
            self._end(CloseReason.UPSTREAM_FAILED, str(exc), clean=False)
        except trio.Cancelled:
            self._end(CloseReason.POLICY if self._stale() else CloseReason.ERROR, "cancelled", clean=False)
            raise
        except Exception as exc:  # a bug here must cost one connection, and its text may hold request bytes
            self._tunnel_event(OutcomeReason.INTERNAL_ERROR, reason=type(exc).__name__)
            self._end(CloseReason.ERROR, type(exc).__name__, clean=False)
        finally:
            await self._close()
        return self.stats

    def _end(self, why: CloseReason, error: str | None = None, *, clean: bool = True) -> None:
        if not self.stats.closed_by:
            self.stats.closed_by = str(why)
            self.stats.error = error
        self.clean = self.clean and clean

    def _stale(self) -> bool:
        return self.is_current is not None and not self.is_current(self.snapshot.generation)

    async def _serve(self, tls: bool | None) -> None:
        proto: TunnelProtocol | None
        if tls is None:
            proto = await self._sniff()
            if proto is None:
                return
        else:
            proto = TunnelProtocol.TLS if tls else TunnelProtocol.HTTP1
        self.stats.protocol = str(proto)
        if proto is TunnelProtocol.UNKNOWN and self.raw_fallback:
            await self._relay_raw()
            return
        if proto in (TunnelProtocol.H2C, TunnelProtocol.UNKNOWN):
            await self._refuse_tunnel(proto)
            return
        if proto is TunnelProtocol.TLS:
            if not await self._check_server_name():
                return
            if self.buffer:
                self.agent = PrefixedStream(self.raw, bytes(self.buffer))
                self.buffer.clear()
            if not await self._terminate_tls():
                return
        while True:
            if self._stale() and not self._adopt_current_policy():
                self._tunnel_event("closed", reason=OutcomeReason.POLICY_REVISION,
                                   detail="the new policy no longer allows this connection")  # fmt: skip
                self._end(CloseReason.POLICY)
                return
            if not await self._one_request():
                return

    async def _first_bytes(self) -> bytes | None:
        """The agent's first bytes (``b""`` at EOF, ``None`` when idle); with an early upstream, an origin that
        speaks first (a server-first protocol: SMTP, MySQL, SSH) is noted in ``self.origin_first``."""
        if self.early_upstream is None:
            return await self._agent_recv(None)
        upstream = self.early_upstream
        got: dict[str, bytes] = {}

        failed: list[_AgentFailed | _UpstreamFailed] = []

        async def from_agent(scope: trio.CancelScope) -> None:
            try:
                data = await self._agent_recv(None)
            except _AgentFailed as exc:
                failed.append(exc)
                data = None
            if data is not None:
                got["agent"] = data
            scope.cancel()

        async def from_upstream(scope: trio.CancelScope) -> None:
            try:
                got["upstream"] = bytes(await upstream.receive_some(self.limits.chunk))
            except _STREAM_ERRORS as exc:
                failed.append(_UpstreamFailed(f"upstream: {type(exc).__name__}"))
            scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(from_agent, nursery.cancel_scope)
            nursery.start_soon(from_upstream, nursery.cancel_scope)
        if failed:
            raise failed[0]
        if "upstream" in got:
            self.origin_first = got["upstream"]
            return got.get("agent", b"")
        return got.get("agent")

    async def _sniff(self) -> TunnelProtocol | None:
        first = await self._first_bytes()
        if self.origin_first is not None:  # only with raw_fallback: an early upstream is given for no other
            if self.origin_first[:5].upper() == b"HTTP/":
                # an HTTP server answering nothing (a 408 after its own timeout) is no server-first protocol:
                # pass its answer on and close, never turn the tunnel raw
                await self._send_quietly(self.origin_first)
                self._tunnel_event("closed", reason=OutcomeReason.ORIGIN_ANSWERED_FIRST)
                self._end(CloseReason.UPSTREAM)
                return None
            self.buffer += first or b""
            return TunnelProtocol.UNKNOWN
        if first is None or not first:
            self._end(CloseReason.IDLE if first is None else CloseReason.AGENT)
            return None
        self.buffer += first
        deadline = trio.current_time() + self.limits.head_timeout
        while True:
            proto = sniff(bytes(self.buffer))
            if proto is not None:
                return proto
            more = await self._agent_recv(deadline - trio.current_time())
            if more is None:  # still ambiguous at the head timeout: neither relayed nor parsed
                self._tunnel_event(
                    "closed",
                    reason=OutcomeReason.SNIFF_TIMEOUT,
                    detail="the first bytes were neither TLS nor HTTP nor anything else in time",
                )
                self._end(CloseReason.MALFORMED, OutcomeReason.SNIFF_TIMEOUT, clean=False)
                return None
            if not more:
                return sniff(bytes(self.buffer), final=True)
            self.buffer += more

    async def _check_server_name(self) -> bool:
        """Read the whole ClientHello; its SNI must name this tunnel's host (no fronting by SNI), or pick the
        name for a transparent capture to an address (``choose_name``)."""
        deadline = trio.current_time() + self.limits.head_timeout
        while True:
            try:
                sni = server_name(bytes(self.buffer))
            except ClientHelloError as exc:
                self._tunnel_event("refused", reason=OutcomeReason.INVALID_CLIENT_HELLO, detail=str(exc))
                self._end(CloseReason.AGENT_TLS, str(exc), clean=False)
                return False
            if not isinstance(sni, Pending):
                break
            more = await self._agent_recv(deadline - trio.current_time())
            if not more:
                self._tunnel_event(
                    "closed",
                    reason=OutcomeReason.CLIENT_HELLO_INCOMPLETE,
                    detail="the TLS ClientHello did not arrive whole in time",
                )
                self._end(CloseReason.AGENT_TLS, OutcomeReason.CLIENT_HELLO_INCOMPLETE, clean=False)
                return False
            self.buffer += more
        if sni is None:
            return True
        wanted = normalize_request_host(sni)
        if wanted == self.name:
            return True
        if self.choose_name is not None and wanted is not None:
            chosen = self.choose_name(wanted)
            if chosen is not None:
                self.name, self.l4 = wanted, chosen
                return True
        self.stats.denied += 1
        self._tunnel_event("refused", reason=str(ErrorCode.REQUEST_AUTHORITY_MISMATCH),
                           finding="openshell.tls.server_name_mismatch", server_name=sni[:255],
                           detail=f"TLS server name {sni[:255]!r} does not match the authorized tunnel endpoint "
                                  f"{self.name}:{self.port}")  # fmt: skip
        self._end(CloseReason.DENIED, "server-name-mismatch", clean=False)
        return False

    def _adopt_current_policy(self) -> bool:
        """A new policy generation: re-decide this connection; keep it (under the new generation) if allowed."""
        if self.current is None:
            return False
        snapshot, l4 = self.current(self.name, self.port)
        if not l4.allowed or l4.tls_skip:
            return False
        self.snapshot, self.l4 = snapshot, l4
        return True

    async def _relay_raw(self) -> None:
        """Bytes that are neither TLS nor HTTP on an endpoint without L7 rules: relayed untouched."""
        upstream: trio.abc.HalfCloseableStream
        if self.early_upstream is not None:
            upstream, self.early_upstream = self.early_upstream, None
        else:
            try:  # connect_upstream is bounded by whoever supplies it (control/egress.py sets the dial's deadline)
                upstream = await self.connect_upstream()
            except (UpstreamError, OSError) as exc:
                self._tunnel_event(OutcomeReason.UPSTREAM_FAILED, reason=type(exc).__name__)
                self._end(CloseReason.UPSTREAM_FAILED, type(exc).__name__, clean=False)
                return
        agent = PrefixedStream(self.raw, bytes(self.buffer))
        self.buffer.clear()
        if self.origin_first:
            try:
                await agent.send_all(self.origin_first)
            except _STREAM_ERRORS as exc:
                await abort_all(upstream)
                raise _AgentFailed(f"agent: {type(exc).__name__}") from None
            self.stats.bytes_down += len(self.origin_first)
        self._handed_off = True
        relayed = await relay(agent, upstream, idle_timeout=self.limits.idle_timeout, chunk=self.limits.chunk)
        self.stats.bytes_up += relayed.bytes_a_to_b
        self.stats.bytes_down += relayed.bytes_b_to_a
        why = {"a": CloseReason.AGENT, "b": CloseReason.UPSTREAM, "idle-timeout": CloseReason.IDLE}
        self._end(why.get(relayed.closed_by, CloseReason.ERROR), relayed.error, clean=relayed.error is None)

    async def _refuse_tunnel(self, proto: TunnelProtocol) -> None:
        if proto is TunnelProtocol.H2C:
            detail = "HTTP/2 prior-knowledge (h2c) is not supported for L7-inspected endpoints"
        else:
            detail = "Unsupported tunnel protocol for L7-inspected endpoint"
        self._tunnel_event("refused", reason=str(ErrorCode.UNSUPPORTED_L7_PROTOCOL), detail=detail)
        self.stats.denied += 1
        await self._send_quietly(ErrorResponse(403, ErrorCode.UNSUPPORTED_L7_PROTOCOL, detail).render())
        self._end(CloseReason.UNSUPPORTED)

    async def _terminate_tls(self) -> bool:
        try:
            ctx = self.ca.leaf_context(self.name)
        except LeafError as exc:
            self._tunnel_event("agent-tls-failed", reason=OutcomeReason.NO_LEAF, detail=str(exc))
            self._end(CloseReason.AGENT_TLS, str(exc), clean=False)
            return False
        stream = MemoryTLSStream(self.agent, ctx, server_side=True)  # the agent side is a link stream
        try:
            with trio.fail_after(self.limits.handshake_timeout):
                await stream.do_handshake()
        except (trio.TooSlowError, *_STREAM_ERRORS) as exc:
            cause = exc.__cause__ or exc
            detail = f"TLS handshake with the agent failed: {type(cause).__name__}: {cause}"
            if "unknown ca" in str(cause).lower() or "certificate unknown" in str(cause).lower():
                detail += " (the agent does not trust the sandbox CA: check SSL_CERT_FILE and friends)"
            self._tunnel_event("agent-tls-failed", reason=OutcomeReason.AGENT_TLS_HANDSHAKE_FAILED, detail=detail[:500])
            self._end(CloseReason.AGENT_TLS, detail[:500], clean=False)
            self.agent = stream
            return False
        self.agent = stream
        self.tls = True
        return True

    async def _close(self) -> None:
        if self._handed_off:  # the raw relay closed (or aborted) both streams itself
            return
        with trio.CancelScope(shield=True):
            if self.early_upstream is not None:  # dialled for a raw relay that never happened
                await trio.aclose_forcefully(self.early_upstream)
            if not self.clean:
                await abort_all(self.agent)
                await abort_all(self.upstream)
                return
            for stream in (self.agent, self.upstream):
                if stream is None:
                    continue
                with trio.move_on_after(1.0):
                    try:
                        await stream.aclose()
                    except _STREAM_ERRORS:
                        pass
                await trio.aclose_forcefully(stream)

    # --- I/O with deadlines ------------------------------------------------------------------------------------
    async def _agent_recv(self, seconds: float | None) -> bytes | None:
        """Bytes, ``b""`` at EOF, ``None`` when ``seconds`` passed first (``None``: the idle rule, no byte
        moved either way for the idle timeout)."""
        data: bytes | None = None
        with self.idle.guard() if seconds is None else trio.move_on_after(max(seconds, 0)):
            try:
                data = bytes(await self.agent.receive_some(self.limits.chunk))
            except _STREAM_ERRORS as exc:
                raise _AgentFailed(f"agent: {type(exc).__name__}: {exc}".rstrip(": ")) from None
        if data:
            self.idle.touch()
        return data

    async def _agent_send(self, data: bytes) -> None:
        if not data:
            return
        with self.idle.guard() as scope:
            try:
                await self.agent.send_all(data)
            except _STREAM_ERRORS as exc:
                raise _AgentFailed(f"agent: {type(exc).__name__}: {exc}".rstrip(": ")) from None
        if scope.cancelled_caught:
            raise _AgentFailed("agent: not reading (idle timeout)")
        self.idle.touch()

    async def _send_quietly(self, data: bytes) -> None:
        try:
            await self._agent_send(data)
        except _AgentFailed:
            self.clean = False

    async def _up_recv(self) -> bytes:
        assert self.upstream is not None
        with self.idle.guard():
            try:
                data = bytes(await self.upstream.receive_some(self.limits.chunk))
            except _STREAM_ERRORS as exc:  # a receive holds no request bytes: the cause (a reset) may be named
                cause = exc.__cause__ or exc
                raise _UpstreamFailed(f"upstream: {type(cause).__name__}: {cause}"[:200].rstrip(": ")) from None
            self.idle.touch()
            return data
        raise _UpstreamFailed("upstream: idle timeout", timed_out=True)

    async def _up_send(self, data: bytes | None) -> None:
        assert self.upstream is not None
        if not data:
            return
        with self.idle.guard() as scope:
            try:
                await self.upstream.send_all(data)
            except _STREAM_ERRORS as exc:
                # the bytes may hold a secret: report the exception type only, never its text
                raise _UpstreamFailed(f"upstream: {type(exc).__name__}") from None
        if scope.cancelled_caught:
            raise _UpstreamFailed("upstream: not reading (idle timeout)", timed_out=True)
        self.idle.touch()

    # --- events ------------------------------------------------------------------------------------------------
    def _tunnel_event(self, what: str, **fields: Any) -> None:
        self.log.emit(EventName.HTTP_TUNNEL, **{**self.fields, "destination": f"{self.name}:{self.port}", "stage": what,
                                        **fields})  # fmt: skip

    def _request_event(self, rec: RequestRecord) -> None:
        self.stats.count(rec)
        self.log.emit(EventName.HTTP, **{**self.fields, "destination": f"{self.name}:{self.port}", "tls": self.tls,
                                 "policy_generation": self.snapshot.generation,
                                 **rec.event_fields(trio.current_time())})  # fmt: skip

    # --- one request -------------------------------------------------------------------------------------------
    async def _read_head(self, rec: RequestRecord) -> RequestHead | None:
        """The next head, checked (:class:`HeadError` otherwise), or ``None`` when the connection ends cleanly (EOF
        or idle) before one starts. What follows the head is left in ``self.buffer``."""
        reader = HeadReader(MAX_HEAD_BYTES)
        reader.receive_data(self.buffer)
        self.buffer.clear()
        deadline: float | None = None
        while True:
            head = reader.next_event()
            if isinstance(head, RequestHead):
                self.buffer += reader.trailing_data()
                return head
            if reader.buffered and deadline is None:
                deadline = trio.current_time() + self.limits.head_timeout
            data = await self._agent_recv(None if deadline is None else deadline - trio.current_time())
            if data is None:
                if deadline is None:
                    self._end(CloseReason.IDLE)
                    return None
                self._malformed(rec, OutcomeReason.HEAD_TIMEOUT, "request head not complete in time")
            if not data:
                if reader.buffered:
                    self._malformed(rec, OutcomeReason.TRUNCATED_HEAD, "connection closed inside a request head")
                self._end(CloseReason.AGENT)
                return None
            reader.receive_data(data)

    def _malformed(self, rec: RequestRecord, reason: str, detail: str) -> NoReturn:
        rec.reason = reason
        rec.detail = f"HTTP request rejected before policy evaluation: {detail}"
        self._request_event(rec)
        self._end(CloseReason.MALFORMED, reason, clean=False)
        raise _Done

    async def _one_request(self) -> bool:
        rec = RequestRecord(started=trio.current_time())
        try:
            return await self._request(rec)
        except _Done:
            return False

    async def _request(self, rec: RequestRecord) -> bool:
        try:
            head = await self._read_head(rec)
        except HeadError as exc:
            self._malformed(rec, str(exc.problem), exc.detail)
        if head is None:
            return False
        rec.started = trio.current_time()
        rec.method = head.method.upper()
        rec.has_body = head.chunked or bool(head.content_length)
        rec.expects_continue = "100-continue" in head.tokens("expect")
        rec.head_method = rec.method == "HEAD"
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES + 1)
        conn.receive_data(head.raw + bytes(self.buffer))
        self.buffer.clear()
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            self._malformed(rec, OutcomeReason.INVALID_REQUEST, str(exc)[:200])
        if not isinstance(event, h11.Request):
            self._malformed(rec, OutcomeReason.INVALID_REQUEST, "not a request")

        # authority binding (§3.9)
        try:
            authority = request_authority(head.target, head.host, tls=self.tls)
        except AuthorityError as exc:
            self._malformed(rec, OutcomeReason.INVALID_AUTHORITY, str(exc))
        if not same_authority(authority, self.name, self.port):
            rec.extra["request_authority"] = f"{authority.host}:{authority.port}"
            rec.extra["finding"] = "openshell.http.request_authority_mismatch"
            mismatch = answers.authority_mismatch(authority.host, authority.port, self.name, self.port)
            return await self._refuse(conn, rec, mismatch, reason=OutcomeReason.REQUEST_AUTHORITY_MISMATCH)

        # protocols we do not carry (§3.10.1)
        upgrade = head.tokens("upgrade") if "upgrade" in head.tokens("connection") else set()
        if rec.method == "CONNECT" or "h2c" in head.tokens("upgrade") or (upgrade and upgrade != {"websocket"}):
            what = "CONNECT inside a tunnel" if rec.method == "CONNECT" else f"Upgrade: {', '.join(sorted(upgrade))}"
            return await self._refuse(
                conn, rec, answers.unsupported(what), reason=OutcomeReason.UNSUPPORTED_L7_PROTOCOL
            )
        rec.upgrade = "websocket" if upgrade else None

        # canonical target; policy and logs see placeholders redacted (§3.8.3, §3.13)
        try:
            canon = canonicalize_target(head.target, allow_encoded_slash=True)
        except TargetError:
            canon = None
        if canon is not None:
            redacted_query = redact_query(self.creds, canon.query)
            policy_target = redact_path(self.creds, canon.path) + ("" if redacted_query is None else "?"
                                                                    + redacted_query)  # fmt: skip
        else:
            policy_target = head.target
        decision = self.snapshot.decide_l7(self.l4, rec.method, policy_target)
        if decision.reason is DenyReason.L7_BODY_PENDING:  # JSON-RPC, MCP, GraphQL: the body decides
            decision = await self._decide_body(conn, rec, head, policy_target, decision)
        rec.rule, rec.endpoint, rec.l7_rule = decision.rule, decision.endpoint, decision.l7_rule
        rec.path = display_path(decision.path) if decision.path is not None else (
            display_path(redact_path(self.creds, canon.path)) if canon is not None else None)  # fmt: skip
        if canon is None or decision.reason in (DenyReason.PATH_NOT_CANONICAL, DenyReason.ENCODED_SLASH):
            # not a rule to ask for: the target itself is refused, in enforce and audit alike (§3.8.3, §3.17)
            why = "encoded-slash" if decision.reason is DenyReason.ENCODED_SLASH else "path-not-canonical"
            detail = "request-target must be canonical" + (f": {display_path(decision.detail)}" if decision.detail
                                                             and decision.reason is not None else "")  # fmt: skip
            return await self._refuse(conn, rec, ErrorResponse(400, ErrorCode.INVALID_REQUEST_TARGET, detail),
                                      reason=why)  # fmt: skip
        if decision.allowed and _endpoint_protocol(self.snapshot, decision) is Protocol.WEBSOCKET \
                and not websocket_upgrade(head):  # fmt: skip
            decision = replace(
                decision,
                verdict=Verdict.DENY,
                audit=False,
                reason=DenyReason.L7_DENIED,
                detail="websocket endpoint requires a valid WebSocket upgrade request",
            )
        if not decision.allowed:
            return await self._refuse(conn, rec, self._l7_denied(decision, rec),
                                      reason=str(decision.reason) if decision.reason else "l7-denied",
                                      detail=display_path(decision.detail))  # fmt: skip
        if rec.upgrade == "websocket" and decision.l7 and \
                _endpoint_protocol(self.snapshot, decision) is not Protocol.WEBSOCKET:  # fmt: skip
            # after a 101 nothing more is judged: on an endpoint with L7 rules that would switch them off, so the
            # upgrade needs an endpoint that says protocol: websocket (docs/design.md "Upgrades")
            where = f" (endpoint {decision.endpoint})" if decision.endpoint else ""
            refusal = ErrorResponse(
                403,
                ErrorCode.UNSUPPORTED_L7_PROTOCOL,
                f"Upgrade: websocket is not allowed on {self.name}:{self.port}{where}: its L7 "
                "rules would no longer apply; an endpoint with protocol: websocket allows it",
            )
            return await self._refuse(conn, rec, refusal, reason=OutcomeReason.WEBSOCKET_UPGRADE_NOT_ALLOWED)
        rec.decision = "audit" if decision.audit else "allow"
        if rec.upgrade == "websocket" and _endpoint_protocol(self.snapshot, decision) is Protocol.WEBSOCKET:
            # payloads are never matched (§3.10.5): one answer holds for every text message of this connection
            text = self.snapshot.decide_l7(self.l4, "WEBSOCKET_TEXT", policy_target)
            self._ws_text_decision = text
            self._ws_filter = None if text.allowed else ClientFrameFilter()
            graphql_route = self.snapshot.graphql_ws_route(self.l4, policy_target)
            if graphql_route is not None:  # GraphQL over WebSocket: its rules judge every whole message
                self._ws_text_decision = None
                self._ws_filter = MessageFilter(functools.partial(self._judge_ws_message, graphql_route, rec))
        if decision.audit:
            rec.reason = str(decision.reason) if decision.reason else None
            rec.detail = display_path(decision.detail)
        assert canon is not None

        # credential_signing: the agent's signature is dropped here and the final request signed below (signing)
        sign_plan: Plan | None = None
        if (signing := _endpoint_signing(self.snapshot, decision)) is not None:
            try:
                sign_plan = plan(signing, self.creds, host=self.name, port=self.port,
                                 path=redact_path(self.creds, canon.path), query=canon.query, headers=head.headers,
                                 has_body=rec.has_body, content_length=None if head.chunked else head.content_length
                                 )  # fmt: skip
            except SigningRefusal as exc:
                if exc.code is ErrorCode.CREDENTIAL_ENDPOINT_MISMATCH:
                    rec.extra["finding"] = "openshell.http.credential_endpoint_mismatch"
                return await self._refuse(conn, rec, ErrorResponse(exc.code.status, exc.code, exc.detail),
                                          reason=str(exc.code), detail=exc.detail)  # fmt: skip

        # credentials: resolved only now, for this endpoint only
        try:
            rewritten = rewrite_request(
                self.creds, host=self.name, port=self.port, path=canon.path, query=canon.query,
                headers=head.headers if sign_plan is None else sign_plan.headers,
                credentials_enabled=authority.source is not AuthoritySource.NONE,
            )  # fmt: skip
        except CredentialRefusal as exc:
            rec.decision = "deny"
            if exc.code is ErrorCode.CREDENTIAL_ENDPOINT_MISMATCH:
                rec.extra["finding"] = "openshell.http.credential_endpoint_mismatch"
            return await self._refuse(conn, rec, ErrorResponse(exc.status, exc.code, exc.detail),
                                      reason=str(exc.code), detail=exc.logged_detail)  # fmt: skip
        rec.credentials = rewritten.used
        headers = [(n.encode("ascii"), v.encode("utf-8")) for n, v in rewritten.headers]
        if isinstance(self._ws_filter, MessageFilter):  # no compression: every message must be read as sent
            headers = without_extensions(headers)
        if self.creds.secrets_at(self.name, self.port):  # every request there, not only those that carried one
            headers = bound_request_headers(headers)
        if head.host is None:
            headers.append((b"Host", _authority_text(self.name, self.port, self.tls).encode("ascii")))
        if sign_plan is not None:
            headers = await self._sign(conn, rec, sign_plan, rewritten.target, headers)
        if rec.body is not None:  # read whole already, and its 100 Continue answered by us
            headers = [(n, v) for n, v in headers if n.lower() != b"expect"]
        request = h11.Request(method=rec.method.encode("ascii"), target=rewritten.target.encode("ascii"),
                              headers=headers)  # fmt: skip
        return await self._forward(conn, rec, request)

    async def _sign(self, conn: h11.Connection, rec: RequestRecord, p: Plan, target: str,
                    headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:  # fmt: skip
        """Sign the final request (``signing``): a body signed by its hash is read whole first (answering ``Expect:
        100-continue`` here, so the client sends it) and forwarded from ``rec.body``; one read whole already to decide
        it (``_decide_body``) is hashed as it is."""
        payload_hash = hashlib.sha256(b"").hexdigest() if p.payload is Payload.HASHED else p.payload.value
        if p.payload is Payload.HASHED and rec.has_body:
            if rec.body is None:
                rec.body, rec.request_done = await self._read_body_to_sign(conn, rec), True
            payload_hash = hashlib.sha256(rec.body).hexdigest()
        if rec.body is not None:  # its 100 Continue was answered here: the origin is not asked again
            headers = [(n, v) for n, v in headers if n.lower() != b"expect"]
        text = [(n.decode("utf-8"), v.decode("utf-8")) for n, v in headers]
        out = signed_headers(p, method=rec.method, target=target, headers=text, payload_hash=payload_hash)
        rec.credentials = (*rec.credentials, p.credential.name)
        rec.extra["signed"] = p.payload.value
        return [(n.encode("utf-8"), v.encode("utf-8")) for n, v in out]

    async def _read_body_to_sign(self, conn: h11.Connection, rec: RequestRecord) -> bytes:
        """The whole request body, at most its ``Content-Length`` (which ``plan`` bounded)."""
        if rec.expects_continue:
            await self._agent_send(conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
        body = bytearray()
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise _AgentFailed(f"agent: malformed request body: {exc}") from None
            if event is h11.NEED_DATA:
                data = await self._agent_recv(None)
                if not data:
                    raise _AgentFailed("agent: request body ended or stalled before it was signed")
                conn.receive_data(data)
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return bytes(body)
            else:
                raise _AgentFailed(f"agent: connection ended inside the request ({type(event).__name__})")

    async def _decide_body(self, conn: h11.Connection, rec: RequestRecord, head: RequestHead, target: str,
                           pending: Decision) -> Decision:  # fmt: skip
        """The agent's own protocols (``body``): read the whole body, up to the endpoint's limit, and decide it. What
        was read is what is forwarded (``rec.body``), so the server executes exactly what was judged."""
        route = self.snapshot.body_route(self.l4, rec.method, target)
        if route is None:
            return pending
        if rec.expects_continue and conn.they_are_waiting_for_100_continue:
            await self._agent_send(conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
        body = bytearray()
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                self._malformed(rec, OutcomeReason.INVALID_BODY, str(exc)[:200])
            if event is h11.NEED_DATA:
                data = await self._agent_recv(None)
                if not data:
                    raise _AgentFailed("agent: request body ended or stalled")
                conn.receive_data(data)
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > route.limit:
                    return refused(route, f"request body is over the endpoint's limit of {route.limit} bytes",
                                   reason=DenyReason.BODY_TOO_LARGE)  # fmt: skip
            elif isinstance(event, h11.EndOfMessage):
                break
            else:
                raise _AgentFailed(f"agent: connection ended inside the request ({type(event).__name__})")
        rec.body, rec.request_done = bytes(body), True
        content_type = head.values("content-type")
        media = content_type[0].split(";", 1)[0].strip().lower() if len(content_type) == 1 else None
        encoded = any(v.strip().lower() not in ("", "identity") for v in head.values("content-encoding"))
        decision = evaluate(route, BodyRequest(rec.method, route.query, media, encoded, rec.body))
        if decision.operation is not None:
            rec.extra["operation"] = decision.operation
        return decision

    def _l7_denied(self, decision: Decision, rec: RequestRecord) -> ErrorResponse:
        binary = self.fields.get("binary")
        return answers.policy_denied(decision, method=rec.method, path=rec.path or "/", host=self.name,
                                     port=self.port, detail=display_path(decision.detail) or "",
                                     binary=binary if isinstance(binary, str) else None)  # fmt: skip

    async def _refuse(self, conn: h11.Connection, rec: RequestRecord, response: ErrorResponse, *, reason: str,
                      detail: str | None = None) -> bool:  # fmt: skip
        rec.decision = "deny"
        rec.reason = reason
        rec.detail = detail or response.detail
        rec.status = response.status
        await self._write_response(conn, rec, response)
        self._request_event(rec)
        if rec.has_body and not rec.expects_continue:
            await self._drain()
        self._end(CloseReason.DENIED)
        return False

    async def _write_response(self, conn: h11.Connection | None, rec: RequestRecord, response: ErrorResponse) -> None:
        if conn is None or conn.our_state is not h11.SEND_RESPONSE:
            await self._send_quietly(response.render())
            return
        data = conn.send(h11.Response(status_code=response.status, headers=response.header_list(),
                                      reason=response.reason_phrase.encode()))  # fmt: skip
        if not rec.head_method:
            data = (data or b"") + (conn.send(h11.Data(data=response.body())) or b"")
        data = (data or b"") + (conn.send(h11.EndOfMessage()) or b"")
        await self._send_quietly(data)

    async def _drain(self) -> None:
        """Read (and drop) what the agent is still sending, briefly, so closing does not reset our answer away."""
        seen = 0
        with trio.move_on_after(self.limits.drain_timeout):
            while seen < _MAX_DRAIN:
                try:
                    data = await self.agent.receive_some(self.limits.chunk)
                except _STREAM_ERRORS:
                    return
                if not data:
                    return
                seen += len(data)

    # --- upstream ------------------------------------------------------------------------------------------------
    async def _open_upstream(self, conn: h11.Connection, rec: RequestRecord) -> bool:
        try:
            if self.early_upstream is not None:  # dialled before the agent's first byte (raw_fallback)
                tcp, self.early_upstream = self.early_upstream, None
            else:  # bounded by whoever supplies connect_upstream (control/egress.py sets the dial's deadline)
                tcp = await self.connect_upstream()
        except UpstreamError as exc:  # a timeout is one too: connect-timeout, 504
            return await self._upstream_refusal(conn, rec, answers.dial_failure(exc), str(exc.reason))
        except OSError as exc:
            return await self._upstream_refusal(conn, rec, ErrorResponse(
                502, ErrorCode.UPSTREAM_UNREACHABLE, f"connect to {self.name}:{self.port} failed: {exc}"[:500]),
                str(UpstreamReason.CONNECT_FAILED))  # fmt: skip
        stream: trio.abc.Stream = tcp
        if self.tls:
            # memory BIOs here too: one recv per chunk, where OpenSSL on the socket reads each record twice (memory_tls)
            tls_stream = MemoryTLSStream(tcp, self.upstream_ssl, server_side=False, server_hostname=self.name)
            try:
                with trio.fail_after(self.limits.handshake_timeout):
                    await tls_stream.do_handshake()
                alpn = tls_stream.selected_alpn_protocol()
                if alpn not in (None, "http/1.1"):
                    raise _UpstreamFailed(f"upstream chose ALPN {alpn!r}")
            except (trio.TooSlowError, _UpstreamFailed, *_STREAM_ERRORS) as exc:
                await abort_all(tls_stream)
                cause = exc.__cause__ or exc
                if isinstance(cause, ssl.SSLCertVerificationError):
                    detail = (f"the certificate of {self.name}:{self.port} failed verification: "
                              f"{cause.verify_message or cause.reason}")  # fmt: skip
                else:
                    detail = f"TLS handshake with {self.name}:{self.port} failed: {type(cause).__name__}: {cause}"
                return await self._upstream_refusal(conn, rec, ErrorResponse(
                    502, ErrorCode.UPSTREAM_TLS_FAILED, detail[:500]), OutcomeReason.UPSTREAM_TLS_FAILED)  # fmt: skip
            stream = tls_stream
        self.upstream = stream
        self.up = h11.Connection(h11.CLIENT, max_incomplete_event_size=self.limits.max_upstream_head)
        return True

    async def _upstream_refusal(self, conn: h11.Connection, rec: RequestRecord, response: ErrorResponse,
                                reason: str) -> bool:  # fmt: skip
        rec.error = reason
        await self._write_response(conn, rec, response)
        rec.status = response.status
        rec.reason = reason
        rec.detail = response.detail
        if response.code is ErrorCode.SSRF_DENIED:
            rec.decision = "deny"
        else:
            rec.decision = "error"
        self._request_event(rec)
        if rec.has_body and not rec.expects_continue:
            await self._drain()
        self._end(CloseReason.UPSTREAM_FAILED, reason)
        return False

    async def _drop_upstream(self) -> None:
        stream, self.upstream, self.up = self.upstream, None, None
        if stream is not None:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)

    # --- forwarding ----------------------------------------------------------------------------------------------
    async def _forward(self, conn: h11.Connection, rec: RequestRecord, request: h11.Request) -> bool:
        for attempt in (0, 1):
            fresh = self.upstream is None
            if fresh and not await self._open_upstream(conn, rec):
                return False
            outcome = await self._exchange(conn, rec, request)
            failure, self.failure = self.failure, None
            if failure is None:
                break
            retry = (isinstance(failure, _UpstreamFailed) and not isinstance(failure, _ResponseRefused) and not fresh
                     and attempt == 0 and not rec.has_body and not rec.response_started)  # fmt: skip
            await self._drop_upstream()
            if retry:
                continue
            rec.error = str(failure)
            if isinstance(failure, _UpstreamFailed) and not rec.response_started:
                late = failure.timed_out
                refused = isinstance(failure, _ResponseRefused)
                what = "did not answer in time" if late else "answered what cannot be passed on" if refused else (
                    "failed to answer")  # fmt: skip
                answer = ErrorResponse(504 if late else 502,
                                       ErrorCode.UPSTREAM_TIMEOUT if late else ErrorCode.UPSTREAM_PROTOCOL_ERROR,
                                       f"{self.name}:{self.port} {what}: {failure}")  # fmt: skip
                reason = failure.reason if isinstance(failure, _ResponseRefused) else (
                    OutcomeReason.UPSTREAM_TIMEOUT if late else OutcomeReason.UPSTREAM_FAILED)  # fmt: skip
                return await self._upstream_refusal(conn, rec, answer, reason)
            self._request_event(rec)
            self._end(CloseReason.AGENT if isinstance(failure, _AgentFailed) else CloseReason.UPSTREAM_FAILED,
                      str(failure), clean=False)  # fmt: skip
            return False

        if outcome == "switched":
            self._request_event(rec)
            await self._relay_switched(conn, rec)
            return False
        self._request_event(rec)
        up = self.up
        assert up is not None
        if up.our_state is h11.DONE and up.their_state is h11.DONE:
            up.start_next_cycle()
        else:
            await self._drop_upstream()
        if not rec.request_done or conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
            self._end(CloseReason.AGENT if conn.their_state is h11.MUST_CLOSE else CloseReason.UPSTREAM)
            return False
        self.buffer = bytearray(conn.trailing_data[0])
        return True

    async def _exchange(self, conn: h11.Connection, rec: RequestRecord, request: h11.Request) -> str | None:
        outcome: str | None = None
        if not rec.has_body:
            # nothing to upload: the request is complete before the answer starts, so no second task is needed
            with trio.CancelScope() as self._scope:
                await self._guarded(self._pump_request, conn, rec, request)
                if self.failure is None:
                    outcome = await self._guarded(self._pump_response, conn, rec)
            return outcome
        async with trio.open_nursery() as nursery:
            self._scope = nursery.cancel_scope
            nursery.start_soon(self._guarded, self._pump_request, conn, rec, request)
            outcome = await self._guarded(self._pump_response, conn, rec)
            if not rec.request_done:
                nursery.cancel_scope.cancel()  # the answer is complete; the rest of the upload is not wanted
        return outcome

    async def _guarded(self, fn: Callable[..., Awaitable[str | None]], *args: Any) -> str | None:
        try:
            return await fn(*args)
        except (_AgentFailed, _UpstreamFailed) as exc:
            if self.failure is None:
                self.failure = exc
            self._scope.cancel()
            return None

    # Both pumps coalesce: what h11 yields without needing more input is written in one ``send_all`` (a head
    # and the body bytes that arrived with it cost one TLS record and one syscall, not three), flushed before
    # waiting for input and whenever a chunk's worth is pending, so buffering stays bounded.

    async def _pump_request(self, conn: h11.Connection, rec: RequestRecord, request: h11.Request) -> str | None:
        up = self.up
        assert up is not None
        out = Outbox()
        out.add(up.send_with_data_passthrough(request))
        if rec.request_done:  # a retry of a bodiless request, or a body read whole to decide it (``rec.body``)
            if rec.body:
                out.add(up.send_with_data_passthrough(h11.Data(data=rec.body)))
                rec.bytes_up += len(rec.body)
            out.add(up.send_with_data_passthrough(h11.EndOfMessage()))
            await self._up_send(out.take())
            return None
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise _AgentFailed(f"agent: malformed request body: {exc}") from None
            if event is h11.NEED_DATA:
                if out.size:
                    await self._up_send(out.take())
                data = await self._agent_recv(None)
                if data is None:
                    raise _AgentFailed("agent: request body stalled (idle timeout)")
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Data):
                out.add(up.send_with_data_passthrough(h11.Data(data=event.data)))
                rec.bytes_up += len(event.data)
                if out.size >= self.limits.chunk:
                    await self._up_send(out.take())
                continue
            if isinstance(event, h11.EndOfMessage):
                rec.request_done = True
                out.add(up.send_with_data_passthrough(h11.EndOfMessage()))  # request trailers are not forwarded
                await self._up_send(out.take())
                return None
            raise _AgentFailed(f"agent: connection ended inside the request ({type(event).__name__})")

    def _scrubber(self) -> Scrubber:
        """For each response from a host where a credential is bound: the secret becomes its placeholder."""
        return Scrubber(self.creds.secrets_at(self.name, self.port))

    def _response_head(self, scrub: Scrubber, event: h11.Response | h11.InformationalResponse,
                       rec: RequestRecord) -> dict[str, Any]:  # fmt: skip
        """The event's fields for the agent, scrubbed: reason phrase, header names and values. A response whose
        secret cannot be replaced (in a header name, where a placeholder is no valid token; a 206 slice; a
        compressed body) raises ``_ResponseRefused`` rather than reach the agent."""
        headers = []
        for raw_name, value in event.headers.raw_items():
            name = scrub.name(raw_name)
            if name != raw_name and not valid_name(name):  # h11 validated the name as it arrived
                raise _ResponseRefused("a response header name held a credential's secret", "secret-in-header-name")
            headers.append((name, scrub.header(value)))
        has_body = not rec.head_method and event.status_code >= 200 and event.status_code not in (204, 304)
        if scrub and event.status_code >= 200:
            why = unscrubbable(event.status_code, headers, has_body=has_body)
            if why is not None:
                raise _ResponseRefused(f"{why}, from a host a credential is bound to", "response-not-scrubbable")
        if scrub and has_body:  # a placeholder is not as long as its secret: h11 frames the scrubbed body itself
            headers = [(n, v) for n, v in headers if n.lower() not in (b"content-length", b"transfer-encoding")]
        return {"status_code": event.status_code, "headers": headers, "reason": scrub.reason(event.reason)}

    async def _pump_response(self, conn: h11.Connection, rec: RequestRecord) -> str | None:
        up = self.up
        assert up is not None
        out = Outbox()
        scrub = self._scrubber()
        while True:
            try:
                event = up.next_event()
            except h11.RemoteProtocolError as exc:
                # the parser's message quotes the bytes it refused (escaped, so past the scrubber): from a host a
                # credential is bound to they may be an echoed secret, and this text reaches the agent and events
                said = " (the parser's message is withheld: it may quote an echoed secret)" if scrub else f": {exc}"
                raise _UpstreamFailed(f"upstream: malformed response{said}"[:300]) from None
            if event is h11.NEED_DATA:
                if out.size:
                    await self._agent_send(out.take())
                up.receive_data(await self._up_recv())
                continue
            if isinstance(event, h11.InformationalResponse):
                out.add(conn.send_with_data_passthrough(h11.InformationalResponse(
                    **self._response_head(scrub, event, rec))))  # fmt: skip
                if event.status_code == 101:
                    if rec.upgrade != "websocket" or not rec.request_done:
                        raise _UpstreamFailed("upstream: unexpected 101 Switching Protocols")
                    rec.status = 101
                    rec.response_started = True
                    if scrub.replaced:
                        rec.extra["secrets_scrubbed"] = scrub.replaced
                    await self._agent_send(out.take())
                    return "switched"
                continue
            if isinstance(event, h11.Response):
                head = self._response_head(scrub, event, rec)  # before anything of the answer is counted as sent
                rec.status = event.status_code
                rec.response_started = True
                out.add(conn.send_with_data_passthrough(h11.Response(**head)))
                continue
            if isinstance(event, h11.Data):
                rec.bytes_down += len(event.data)
                data = scrub.feed(event.data)  # h11's own bytearray: not copied again here
                if data:  # h11 passes the exact object through (a view too), typed as bytes
                    out.add(conn.send_with_data_passthrough(h11.Data(data=cast(bytes, data))))
                if out.size >= self.limits.chunk:
                    await self._agent_send(out.take())
                continue
            if isinstance(event, h11.EndOfMessage):
                tail = scrub.flush()
                if tail:
                    out.add(conn.send_with_data_passthrough(h11.Data(data=tail)))
                if scrub.replaced:
                    rec.extra["secrets_scrubbed"] = scrub.replaced
                out.add(conn.send_with_data_passthrough(h11.EndOfMessage()))
                await self._agent_send(out.take())
                return "done"
            raise _UpstreamFailed(f"upstream: connection ended inside the response ({type(event).__name__})")

    async def _relay_switched(self, conn: h11.Connection, rec: RequestRecord) -> None:
        """After ``101``: raw bytes both ways (``upgrade``); on a websocket endpoint whose ``WEBSOCKET_TEXT`` is
        denied, the agent's first text message closes both sides with 1008 (``websocket``)."""
        self.stats.upgraded = True
        up = self.up
        assert up is not None and self.upstream is not None
        frames = self._ws_filter
        first_bytes = conn.trailing_data[0]
        await self._up_send(frames.feed(first_bytes) if frames is not None else first_bytes)
        await self._agent_send(up.trailing_data[0])
        if frames is None or frames.stopped is None:

            def through_frames(data: bytes) -> tuple[bytes, Flow]:
                assert frames is not None
                passed = frames.feed(data)
                return passed, Flow.MORE if frames.stopped is None else Flow.STOP

            # TLS on both sides has no half-close: the first side to end ends both; the caller closes them
            relayed = await relay(
                self.agent, self.upstream, idle_timeout=self.limits.idle_timeout, chunk=self.limits.chunk,
                half_close=(), filter_a=through_frames if frames is not None else None, close=False,
            )  # fmt: skip
            self.stats.bytes_up += relayed.bytes_a_to_b
            self.stats.bytes_down += relayed.bytes_b_to_a
            self.clean = self.clean and relayed.error is None
        if frames is not None and frames.stopped is not None:
            await self._close_websocket(rec, frames.stopped)
            return
        why = (CloseReason.IDLE if relayed.closed_by == RelayEnd.IDLE else CloseReason.AGENT
               if relayed.closed_by == RelayEnd.A else CloseReason.UPSTREAM)  # fmt: skip
        self._end(why, relayed.error, clean=self.clean)

    def _judge_ws_message(self, route: BodyRoute, rec: RequestRecord, message: bytes) -> bool:
        """GraphQL over WebSocket: one whole client message; each subscribe/start decided is an ``http`` event (a
        denied one is logged by ``_close_websocket``)."""
        decision = decide_ws_message(route, message)
        if decision is None:
            return True
        self._ws_text_decision = decision
        if not decision.allowed:
            return False
        event = RequestRecord(started=trio.current_time(), method="WEBSOCKET_TEXT", path=rec.path,
                              decision="audit" if decision.audit else "allow", rule=decision.rule,
                              endpoint=decision.endpoint, l7_rule=decision.l7_rule,
                              reason=str(decision.reason) if decision.audit and decision.reason else None,
                              detail=decision.detail if decision.audit else None)  # fmt: skip
        if decision.operation is not None:
            event.extra["operation"] = decision.operation
        self._request_event(event)
        return True

    async def _close_websocket(self, rec: RequestRecord, stop: FilterStop) -> None:
        denied = stop in (FilterStop.TEXT_DENIED, FilterStop.MESSAGE_DENIED)
        code = CloseCode.POLICY_VIOLATION if denied else (
            CloseCode.MESSAGE_TOO_BIG if stop is FilterStop.MESSAGE_TOO_BIG else CloseCode.PROTOCOL_ERROR)  # fmt: skip
        reason = {FilterStop.TEXT_DENIED: "text messages are not permitted by policy",
                  FilterStop.MESSAGE_DENIED: "message not permitted by policy",
                  FilterStop.MESSAGE_TOO_BIG: "message too big"}.get(stop, "protocol error")  # fmt: skip
        text = self._ws_text_decision
        event = RequestRecord(started=trio.current_time(), method="WEBSOCKET_TEXT", path=rec.path, decision="deny",
                        rule=text.rule if text else rec.rule, endpoint=text.endpoint if text else rec.endpoint,
                        reason=str(stop), status=int(code),
                        detail=display_path(text.detail) if denied and text else reason)  # fmt: skip
        if denied and text is not None and text.operation is not None:
            event.extra["operation"] = text.operation
        self._request_event(event)
        with trio.move_on_after(1.0):
            try:
                await self.agent.send_all(server_close_frame(code, reason))
                assert self.upstream is not None
                await self.upstream.send_all(client_close_frame(code, reason))
            except _STREAM_ERRORS:
                self.clean = False
        self._end(CloseReason.DENIED if denied else CloseReason.MALFORMED, str(stop), clean=self.clean)


class _Done(Exception):
    """The request ended the connection (already logged)."""


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
    event_fields: Mapping[str, Any] | None = None,
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
    session = _Session(
        agent, host=host, port=port, snapshot=snapshot, l4=l4, connect_upstream=connect_upstream, ca=ca,
        credentials=credentials, upstream_ssl=upstream_ssl, log=log, event_fields=event_fields or {},
        is_current=is_current, limits=limits or Limits(), raw_fallback=raw_fallback, early_upstream=early_upstream,
        current=current, choose_name=choose_name,
    )  # fmt: skip
    return await session.run(tls)
