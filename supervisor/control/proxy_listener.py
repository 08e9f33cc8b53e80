"""Control's own proxy listener: the proxy-pod topology (docs/design.md "The proxy-pod topology").

The workload runs no supervisor; its proxy variables point at this listener. Each connection is read as one
proxy head (``supervisor.protocol.proxy_head``, the boundary's parser), checked, and handed to the same
:meth:`EgressService.serve` that serves the boundary's egress streams — decision, SSRF guard, resolution, TLS
termination, L7 and events are not repeated here. :class:`ProxyClientStream` makes the client look like an
egress stream: control's reply headers become the client's answer (``render_reply``), an absolute-form
request's origin-form head and exactly one body are what control reads.

This listener faces untrusted bytes directly, so before any policy work:

1. at most ``max_connections`` connections at once and ``per_client`` per source address (over: ``503``);
2. ``--proxy-clients`` CIDRs, when given, are the only sources served (else: closed with ``403``);
3. the head must arrive within :data:`HEAD_READ_DEADLINE_S` (else ``408``), at most ``MAX_HEAD_BYTES``, read and
   checked by the reader the boundary's listener and the inspected path share (``supervisor/link/head_read.py``);
4. exactly one ``Proxy-Authorization: Basic sandbox:<token>`` matching this sandbox's proxy token (else
   ``407``, logged as ``proxy.refused``).

Identity is endpoint-only (``relaxed``): there is no process to identify behind a pod's address.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import secrets
import socket
import struct
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import trio

from supervisor.control.egress import EgressService
from supervisor.jsonlog import JsonLog
from supervisor.link.head_read import read_proxy_head
from supervisor.protocol.egress import CaptureKind, EgressRequest, decode_reply_headers
from supervisor.protocol.event_names import EventName
from supervisor.protocol.json_value import JsonValue
from supervisor.protocol.outcome_reasons import OutcomeReason
from supervisor.protocol.proxy_head import (
    HEAD_READ_DEADLINE_S,
    MAX_HEAD_BYTES,
    ForwardBody,
    ProxyReject,
    ProxyTarget,
    Refusal,
    proxy_token_matches,
    render_proxy_auth_required,
    render_reply,
    render_response,
)
from supervisor.protocol.request_head import HeadReader
from supervisor.protocol.responses import ErrorCode

BACKLOG = 512
DEFAULT_MAX_CONNECTIONS = 1024
DEFAULT_PER_CLIENT = DEFAULT_MAX_CONNECTIONS  # one paired workload is the only client by design

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class ProxyListenConfig:
    host: str
    port: int
    token: str
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    per_client: int = DEFAULT_PER_CLIENT
    clients: tuple[Network, ...] = ()  # empty: any source (the NetworkPolicy is the fence)
    head_timeout: float = HEAD_READ_DEADLINE_S


def _reset(stream: trio.SocketStream) -> None:
    try:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass


class ProxyClientStream(trio.abc.HalfCloseableStream):
    """One proxy client behind the egress-stream interface :meth:`EgressService.serve` uses."""

    def __init__(self, client: trio.SocketStream, target: ProxyTarget) -> None:
        self.client = client
        self.target = target
        self.answered = False
        self.allowed = False
        self._pending = target.leftover
        self._body: ForwardBody | None = None
        if target.kind is CaptureKind.HTTP_FORWARD:
            assert target.request_head is not None
            self._body = target.body()
            self._pending = target.request_head + self._body.feed(target.leftover)

    async def send_headers(
        self, headers: Sequence[tuple[str, str]], *, end_stream: bool = False, now: bool = False
    ) -> None:
        """The egress pipeline's reply, rendered for the proxy client (``now``: it is always written at once)."""
        reply = decode_reply_headers(headers)
        self.answered = True
        self.allowed = reply.allowed
        payload = render_reply(self.target, reply)
        if payload:
            await self.client.send_all(payload)
        if not reply.allowed:
            await self.send_eof()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.client.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.client.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        try:
            await self.client.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._pending:
            size = len(self._pending) if max_bytes is None else max_bytes
            data, self._pending = self._pending[:size], self._pending[size:]
            return data
        if self._body is None:
            return await self.client.receive_some(max_bytes)
        while not self._body.done:  # absolute-form: exactly one request body, then EOF
            data = await self.client.receive_some(max_bytes)
            if not data:
                return b""
            out = self._body.feed(data)
            if out:
                return out
        return b""

    async def reset(self) -> None:
        _reset(self.client)
        await trio.aclose_forcefully(self.client)

    async def aclose(self) -> None:
        await self.client.aclose()


class ProxyListener:
    def __init__(
        self, cfg: ProxyListenConfig, egress: EgressService, log: JsonLog, *, sockets: list[socket.socket] | None = None
    ) -> None:
        self.cfg = cfg
        # bound already (SO_REUSEPORT, one set per control process: control/workers/spawn.py); None: bind here
        self.sockets = sockets
        self.egress = egress
        self.log = log
        self.active = 0
        self.per_client: Counter[str] = Counter()
        self.counters = {"accepted": 0, "refused": 0, "unauthenticated": 0, "over_limit": 0}
        self.bound: tuple[str, int] | None = None

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # "*": every address of the pod, IPv4 and IPv6 (what `k8s render --topology proxy-pod` passes)
        host = None if self.cfg.host == "*" else self.cfg.host
        if self.sockets is not None:
            listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(s)) for s in self.sockets]
        else:
            listeners = await trio.open_tcp_listeners(self.cfg.port, host=host, backlog=BACKLOG)
        sockname = listeners[0].socket.getsockname()
        self.bound = (sockname[0], sockname[1])
        self.log.emit(EventName.PROXY_LISTENING, address=f"{self.bound[0]}:{self.bound[1]}",
                      max_connections=self.cfg.max_connections, per_client=self.cfg.per_client,
                      clients=[str(n) for n in self.cfg.clients] or None, identity="relaxed")  # fmt: skip
        task_status.started()
        await trio.serve_listeners(self._connection, listeners)

    def status(self) -> dict[str, JsonValue]:
        return {"listen": f"{self.bound[0]}:{self.bound[1]}" if self.bound else None, "active": self.active,
                **self.counters}  # fmt: skip

    def _refuse(self, peer: str, reason: str, **fields: JsonValue) -> None:
        self.counters["refused"] += 1
        self.log.emit(EventName.PROXY_REFUSED, client=peer, reason=reason, **fields)

    async def _connection(self, client: trio.SocketStream) -> None:
        peer_addr = client.socket.getpeername()
        peer, src_port = str(peer_addr[0]), int(peer_addr[1])
        try:
            if self.cfg.clients and not any(ipaddress.ip_address(peer) in net for net in self.cfg.clients):
                self._refuse(peer, "client-not-allowed")
                await self._answer(client, render_response(403, Refusal(ErrorCode.CLIENT_NOT_ALLOWED)))
                return
            if self.active >= self.cfg.max_connections or self.per_client[peer] >= self.cfg.per_client:
                self.counters["over_limit"] += 1
                scope = "total" if self.active >= self.cfg.max_connections else "per-client"
                self._refuse(peer, "too-many-connections", limit=scope)
                body = Refusal(ErrorCode.TOO_MANY_CONNECTIONS, f"{scope} connection limit reached")
                await self._answer(client, render_response(503, body))
                return
            self.active += 1
            self.per_client[peer] += 1
            try:
                await self._serve_one(client, peer, src_port)
            finally:
                self.active -= 1
                self.per_client[peer] -= 1
                if self.per_client[peer] <= 0:
                    del self.per_client[peer]
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except Exception as exc:  # one connection's failure is that connection's alone
            self.log.emit(EventName.PROXY_ERROR, client=peer, error=repr(exc)[:500])
            _reset(client)
        finally:
            await trio.aclose_forcefully(client)

    async def _serve_one(self, client: trio.SocketStream, peer: str, src_port: int) -> None:
        self.counters["accepted"] += 1
        reader = HeadReader(MAX_HEAD_BYTES)
        parsed = await read_proxy_head(client, reader, self.cfg.head_timeout)
        if parsed is None:
            self._refuse(peer, OutcomeReason.HEAD_TIMEOUT if reader.received else "no-request")
            await self._answer(client, render_response(408 if reader.received else 400))
            return
        if isinstance(parsed, ProxyReject):
            self._refuse(peer, "malformed-head", status=parsed.status)
            await self._answer(client, parsed.render())
            return
        target = parsed
        if not proxy_token_matches(target, self.cfg.token):
            self.counters["unauthenticated"] += 1
            why = "missing" if not target.proxy_authorization else "wrong"
            self._refuse(peer, f"proxy-token-{why}", destination=target.describe())
            await self._answer(client, render_proxy_auth_required())
            return
        conn_id = secrets.token_hex(8)
        request = EgressRequest(host=target.host, port=target.port, capture=target.kind, identity=None,
                                conn_id=conn_id, src_port=src_port)  # fmt: skip
        stream = ProxyClientStream(client, target)
        await self.egress.serve(stream, request)  # type: ignore[arg-type]
        if stream.allowed:
            await stream.send_eof()

    async def _answer(self, client: trio.SocketStream, payload: bytes) -> None:
        try:
            await client.send_all(payload)
            await client.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


def parse_clients(texts: Sequence[str]) -> tuple[Network, ...]:
    """``--proxy-clients`` CIDRs; a host address alone is its /32 or /128."""
    return tuple(ipaddress.ip_network(text, strict=False) for text in texts)


def per_process(cfg: ProxyListenConfig, processes: int) -> ProxyListenConfig:
    """Each process's share of the connection caps, rounded up: every process counts only its own connections,
    so the caps are divided (a process may refuse before the sum reaches the cap, never after)."""
    return dataclasses.replace(cfg, max_connections=-(-cfg.max_connections // processes),
                               per_client=-(-cfg.per_client // processes))  # fmt: skip


def bind_shared(cfg: ProxyListenConfig, processes: int) -> list[list[socket.socket]]:
    """One set of listening sockets per control process, all on ``cfg``'s address with SO_REUSEPORT, so the
    kernel spreads new connections across the processes. Port 0: the first socket's port for every other one."""
    host = None if cfg.host == "*" else cfg.host
    infos = socket.getaddrinfo(host, cfg.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    families: dict[int, tuple[int, tuple[object, ...]]] = {}
    for info in infos:  # one address per family, as trio.open_tcp_listeners binds
        families.setdefault(int(info[0]), (info[2], tuple(info[4])))
    port = cfg.port
    sets: list[list[socket.socket]] = [[] for _ in range(processes)]
    try:
        for family, (proto, address) in families.items():
            for sockets in sets:
                sock = socket.socket(family, socket.SOCK_STREAM, proto)
                sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind((address[0], port, *address[2:]))
                sock.listen(BACKLOG)
                port = sock.getsockname()[1]
    except OSError:
        for sockets in sets:
            for sock in sockets:
                sock.close()
        raise
    return sets
