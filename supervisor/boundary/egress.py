"""The boundary's egress side: every connection the agent makes is captured here and handed to control.

Listeners live in the agent's network namespace (created by the launcher, passed to us as fds): transparent
capture listeners on every port the policy can allow (any-IP local routes make every destination address
local, so the accepted socket's local address *is* the original destination), the HTTP proxy listener on
127.0.0.1:3128 for proxy-aware clients, and the DNS stub. For each accepted connection, in order and before
a single byte of it is read:

1. the initiating binary is identified (/proc: socket inode → owning workload process → exe, sha256,
   ancestors); unresolvable ⇒ refused;
2. a CONNECT stream is opened on one of control's egress links (none up ⇒ refused at once: never a direct
   path — there is no other path);
3. control's answer is applied: allowed ⇒ bytes flow both ways with half-close; refused ⇒ the proxy listener
   answers 403/502/503 with a JSON body, a transparent connection is reset.

The boundary never resolves a name or dials anything outside the agent's namespace itself.
"""

from __future__ import annotations

import functools
import math
import secrets
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from supervisor.boundary.capture.dns_stub import TcpFramer, encode_tcp, servfail
from supervisor.boundary.capture.identity import Identity, IdentityResolver, IdentityStage, IdentityUnresolved
from supervisor.jsonlog import JsonLog
from supervisor.link.h2link import Link, LinkClosed, LinkStream
from supervisor.link.head_read import read_proxy_head
from supervisor.link.relay import Flow, RelayEnd, abort_stream, relay
from supervisor.protocol.egress import (
    CaptureKind,
    EgressHeaderError,
    EgressReply,
    decode_reply_headers,
    encode_connect_headers,
    encode_dns_request_headers,
)
from supervisor.protocol.event_names import EventName
from supervisor.protocol.outcome_reasons import OutcomeReason
from supervisor.protocol.proxy_head import (
    CONNECT_ESTABLISHED,
    HEAD_READ_DEADLINE_S,
    MAX_HEAD_BYTES,
    ForwardBody,
    ProxyReject,
    ProxyTarget,
    render_reply,
    render_response,
    render_unavailable,
)
from supervisor.protocol.request_head import HeadReader

LINK_WAIT_S = 0.25  # how long a connection may wait for an egress link before it is refused
REPLY_TIMEOUT_S = 30.0
HANDOFF_ATTEMPTS = 4  # links tried for one connection when a link turns out dead on use (a vanished control)
DNS_TIMEOUT_S = 5.0


class RecentPids:
    """The workload's pids, rescanned at most every ``ttl`` seconds (a full /proc scan per connection was the
    boundary's top cost). A connection whose owner is not among them gets one fresh scan before it is refused,
    so a process forked just before it connected is never refused for being new."""

    def __init__(self, scan: Callable[[], set[int]], ttl: float = 0.25) -> None:
        self._scan = scan
        self._ttl = ttl
        self._pids: set[int] = set()
        self._at = -math.inf
        self._lock = threading.Lock()

    def __call__(self) -> set[int]:
        with self._lock:
            now = time.monotonic()
            if now - self._at > self._ttl:
                self._pids, self._at = self._scan(), now
            return set(self._pids)

    def invalidate(self) -> None:
        with self._lock:
            self._at = -math.inf


# A refusal at these stages may come from a stale pid set: worth one fresh scan.
_RESCAN_STAGES = frozenset({IdentityStage.OWNERS, IdentityStage.FOREIGN_OWNER, IdentityStage.ANCESTORS})


class EgressLinks:
    """The pool of egress links control keeps open to us (we are their HTTP/2 client)."""

    def __init__(self) -> None:
        self._links: list[Link] = []
        self._next = 0  # where the next pick starts looking: ties go round the links, not always to the first
        self._changed = trio.Event()

    def add(self, link: Link) -> None:
        if link not in self._links:
            self._links.append(link)
        self._changed.set()
        self._changed = trio.Event()

    def discard(self, link: Link) -> None:
        if link in self._links:
            self._links.remove(link)

    def __len__(self) -> int:
        return sum(1 for link in self._links if not link.closed)

    async def wait_live(self) -> None:
        """Wait until at least one link is live (the caller sets the deadline)."""
        while not len(self):
            await self._changed.wait()

    def _least_busy(self) -> Link | None:
        """The live link with the fewest streams; among equals, the next after the last one picked (so that
        one connection after another spreads over every link, and over every worker process of control)."""
        links = self._links
        count = len(links)
        best: Link | None = None
        start = self._next % count if count else 0
        for offset in range(count):
            link = links[(start + offset) % count]
            if not link.closed and (best is None or link.active_streams < best.active_streams):
                best = link
                self._next = start + offset + 1
        return best

    async def pick(self) -> Link | None:
        """The least busy live link, waiting up to LINK_WAIT_S for one to appear. With a link up (every
        connection but the first after an attach) no cancel scope is made: the deadline is only for the wait."""
        best = self._least_busy()
        if best is not None:
            return best
        with trio.move_on_after(LINK_WAIT_S):
            while best is None:
                await self._changed.wait()
                best = self._least_busy()
        return best


def _reset(sock_stream: trio.SocketStream) -> None:
    """Close with RST (SO_LINGER 0): a refused transparent connection must not look like a clean close."""
    try:
        sock_stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass


def _addr(sock: Any, peer: bool) -> tuple[str, int]:
    address = sock.getpeername() if peer else sock.getsockname()
    return str(address[0]), int(address[1])


class EgressCapture:
    def __init__(
        self,
        *,
        fds: dict[str, int],
        links: EgressLinks,
        resolver: IdentityResolver,
        log: JsonLog,
        accepting: Callable[[], bool],
        recent_pids: RecentPids | None = None,
    ) -> None:
        self.fds = fds
        self.links = links
        self.resolver = resolver
        self.log = log
        self.accepting = accepting  # False once the lifecycle has ended
        self.recent_pids = recent_pids  # the resolver's pid source, when it is cached
        self.counters = {"accepted": 0, "refused": 0, "allowed": 0, "dns": 0}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            for name, fd in self.fds.items():
                sock = socket.socket(fileno=fd)
                sock.setblocking(False)
                tsock = trio.socket.from_stdlib_socket(sock)
                if name.startswith("tcp"):
                    nursery.start_soon(self._serve, tsock, self._transparent)
                elif name == "proxy":
                    nursery.start_soon(self._serve, tsock, self._proxy)
                elif name.startswith("dns-udp"):
                    nursery.start_soon(self._dns_udp, tsock)
                elif name.startswith("dns-tcp"):
                    nursery.start_soon(self._serve, tsock, self._dns_tcp)
            task_status.started()

    async def _serve(self, tsock: Any, handler: Callable[[trio.SocketStream], Awaitable[None]]) -> None:
        listener = trio.SocketListener(tsock)
        # one partial per listener, not a closure frame per connection (held for the connection's whole life)
        await trio.serve_listeners(functools.partial(self._guard, handler), [listener])

    async def _guard(self, work: Callable[..., Awaitable[None]], stream: trio.SocketStream | None = None) -> None:
        """One connection's failure is that connection's alone: log it, reset it, keep serving the rest.
        ``work`` is called with ``stream`` when there is one."""
        try:
            await (work() if stream is None else work(stream))
        except (trio.BrokenResourceError, trio.ClosedResourceError, LinkClosed):
            pass
        except Exception as exc:
            self.log.emit(EventName.EGRESS_ERROR, error=repr(exc)[:500])
            if stream is not None:
                _reset(stream)
        finally:
            if stream is not None:
                await trio.aclose_forcefully(stream)

    # -- identity + hand-off ----------------------------------------------------------------------------------
    async def _identify(
        self, stream: trio.SocketStream, addresses: tuple[tuple[str, int], tuple[str, int]] | None = None
    ) -> Identity | None:
        """``addresses`` (local, remote) when the caller has just read them; else they are read here."""
        local, remote = addresses or (_addr(stream.socket, False), _addr(stream.socket, True))
        # Resolved inline: it is ~0.2-3 ms of /proc and netlink reads, and handing it to a worker thread cost
        # more than that (thread hand-off and GIL contention were the top of the profile under load).
        await trio.lowlevel.checkpoint()
        try:
            try:
                identity = self.resolver.resolve(local, remote)
            except IdentityUnresolved as exc:
                if self.recent_pids is None or exc.stage not in _RESCAN_STAGES:
                    raise
                self.recent_pids.invalidate()
                identity = self.resolver.resolve(local, remote)
        except IdentityUnresolved as exc:
            self.counters["refused"] += 1
            self.log.emit(EventName.EGRESS_REFUSED, reason=f"identity-unresolved: {exc.stage}", detail=str(exc),
                          destination=f"{local[0]}:{local[1]}", src_port=remote[1])  # fmt: skip
            return None
        except OSError as exc:
            self.counters["refused"] += 1
            self.log.emit(EventName.EGRESS_REFUSED, reason="identity-unresolved: error", detail=str(exc))
            return None
        return identity

    async def _hand_off(
        self, host: str, port: int, kind: CaptureKind, identity: Identity, src_port: int
    ) -> tuple[LinkStream | None, EgressReply]:
        if not self.accepting():
            return None, EgressReply(503, reason=OutcomeReason.SANDBOX_ENDED)
        for attempt in range(1, HANDOFF_ATTEMPTS + 1):
            link = await self.links.pick()
            if link is None:
                self.counters["refused"] += 1
                self.log.emit(EventName.EGRESS_REFUSED, reason=OutcomeReason.NO_EGRESS_LINK,
                              destination=f"{host}:{port}", binary=identity.binary_path)  # fmt: skip
                return None, EgressReply(503, reason=OutcomeReason.NO_EGRESS_LINK, detail="control is not connected")
            conn_id = secrets.token_hex(8)
            headers = encode_connect_headers(
                host, port, capture=kind, identity=identity, conn_id=conn_id, src_port=src_port
            )
            try:
                stream = await link.open_stream(headers)
                # trio.fail_after's own scope without its generator context manager (one per connection)
                with trio.CancelScope(deadline=trio.current_time() + REPLY_TIMEOUT_S) as waiting:
                    await stream.response()
                if waiting.cancelled_caught:
                    raise trio.TooSlowError
                reply = decode_reply_headers(stream.headers)
            except LinkClosed as exc:
                # A link whose control vanished without closing it (its pod deleted: no FIN ever came) fails
                # only when used; nothing of the agent's was sent on it, so the next live link is asked.
                if attempt < HANDOFF_ATTEMPTS:
                    continue
                self.log.emit(
                    EventName.EGRESS_REFUSED,
                    reason=OutcomeReason.LINK_FAILED,
                    detail=str(exc),
                    destination=f"{host}:{port}",
                )
                return None, EgressReply(503, reason=OutcomeReason.LINK_FAILED)
            except (trio.TooSlowError, EgressHeaderError) as exc:
                self.log.emit(
                    EventName.EGRESS_REFUSED,
                    reason=OutcomeReason.LINK_FAILED,
                    detail=str(exc),
                    destination=f"{host}:{port}",
                )
                return None, EgressReply(503, reason=OutcomeReason.LINK_FAILED)
            break
        if not reply.allowed:
            await stream.aclose()
            return None, reply
        self.counters["allowed"] += 1
        return stream, reply

    # -- transparent capture ----------------------------------------------------------------------------------
    async def _transparent(self, agent: trio.SocketStream) -> None:
        self.counters["accepted"] += 1
        local, remote = _addr(agent.socket, False), _addr(agent.socket, True)
        identity = await self._identify(agent, (local, remote))
        if identity is None:
            _reset(agent)
            await agent.aclose()
            return
        upstream, _reply = await self._hand_off(local[0], local[1], CaptureKind.TRANSPARENT, identity, remote[1])
        if upstream is None:
            _reset(agent)
            await agent.aclose()
            return
        # Handed off: the identity (now control's) and the reply are not held for the tunnel's life.
        del identity, _reply
        await relay(agent, upstream, idle_timeout=math.inf)

    # -- the proxy listener -----------------------------------------------------------------------------------
    async def _proxy(self, agent: trio.SocketStream) -> None:
        self.counters["accepted"] += 1
        identity = await self._identify(agent)
        reader = HeadReader(MAX_HEAD_BYTES)
        parsed = await read_proxy_head(agent, reader, HEAD_READ_DEADLINE_S)
        if parsed is None:
            await self._answer(agent, render_response(408 if reader.received else 400))
            return
        if isinstance(parsed, ProxyReject):
            await self._answer(agent, parsed.render())
            return
        target = parsed
        if identity is None:
            await self._answer(agent, render_reply(target, EgressReply(403, reason=OutcomeReason.IDENTITY_UNRESOLVED)))
            return
        src_port = _addr(agent.socket, True)[1]
        upstream, reply = await self._hand_off(target.host, target.port, target.kind, identity, src_port)
        if upstream is None:
            body = render_unavailable(target) if reply.status == 503 else render_reply(target, reply)
            await self._answer(agent, body)
            return
        # Handed off: the head's bytes and the identity (now control's) are not held for the tunnel's life.
        identity = None
        del reader
        if target.kind is CaptureKind.CONNECT:
            leftover = target.leftover
            del target, parsed, reply  # the parsed head is not held for the tunnel's life either
            await agent.send_all(CONNECT_ESTABLISHED)
            if leftover:
                await upstream.send_all(leftover)
            del leftover
            await relay(agent, upstream, idle_timeout=math.inf)
        else:
            await self._forward_one_request(agent, upstream, target)

    async def _forward_one_request(self, agent: trio.SocketStream, upstream: LinkStream, target: ProxyTarget) -> None:
        """Absolute-form plain HTTP: one request (origin-form head + exactly its body), then the response, which
        ends with the upstream's EOF. The relay (link/relay.py) passes the agent's bytes through the body framing
        and ends with the upstream's EOF; a response cut short (upstream reset, control gone) aborts the agent's
        connection — a reset, never a FIN, or a close-delimited body would look complete."""
        assert target.request_head is not None
        body = ForwardBody(chunked=target.chunked, content_length=target.content_length)
        try:
            await upstream.send_all(target.request_head + body.feed(target.leftover))
            if body.done:
                await upstream.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            await abort_stream(agent)
            await upstream.aclose()
            return

        def exactly_the_body(data: bytes) -> tuple[bytes, Flow]:
            passed = body.feed(data)
            return passed, Flow.EOF if body.done else Flow.MORE

        # the agent's end (or its body's) half-closes the request; the upstream's EOF ends the exchange
        await relay(agent, upstream, idle_timeout=math.inf, half_close={RelayEnd.A}, filter_a=exactly_the_body)

    async def _answer(self, agent: trio.SocketStream, payload: bytes) -> None:
        self.counters["refused"] += 1
        try:
            await agent.send_all(payload)
            await agent.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        await agent.aclose()

    # -- DNS ----------------------------------------------------------------------------------------------------
    async def _resolve_via_control(self, query: bytes) -> bytes | None:
        link = await self.links.pick()
        if link is None:
            return servfail(query)
        try:
            headers = encode_dns_request_headers(len(query))
        except EgressHeaderError:
            return None  # not a DNS message at all: no answer
        try:
            with trio.fail_after(DNS_TIMEOUT_S):
                stream = await link.open_stream(headers)
                await stream.send_all(query)
                await stream.send_eof()
                await stream.response()
                answer = await stream.read_all(65535)
                await stream.aclose()
        except (LinkClosed, trio.TooSlowError):
            return servfail(query)
        return answer or servfail(query)

    async def _dns_udp(self, tsock: Any) -> None:
        from supervisor.boundary.capture.pktinfo import destination_from_ancdata, enable_pktinfo, source_ancdata

        enable_pktinfo(tsock)
        async with trio.open_nursery() as nursery:
            while True:
                data, ancdata, _flags, peer = await tsock.recvmsg(65535, 256)
                self.counters["dns"] += 1

                async def answer(data: bytes = data, ancdata: Any = ancdata, peer: Any = peer) -> None:
                    reply = await self._resolve_via_control(data)
                    if reply is None:
                        return
                    destination = destination_from_ancdata(ancdata)
                    extra = source_ancdata(destination) if destination else []
                    try:
                        await tsock.sendmsg([reply], extra, 0, peer)
                    except OSError:
                        pass

                nursery.start_soon(self._guard, answer)

    async def _dns_tcp(self, agent: trio.SocketStream) -> None:
        framer = TcpFramer()
        async with agent:
            try:
                while data := await agent.receive_some(65536):
                    for query in framer.feed(data):
                        self.counters["dns"] += 1
                        reply = await self._resolve_via_control(query)
                        if reply is not None:
                            await agent.send_all(encode_tcp(reply))
            except (trio.BrokenResourceError, ValueError):
                return
