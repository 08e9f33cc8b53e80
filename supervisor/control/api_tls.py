"""Control's operator API on TCP with mutual TLS, for operators outside the pod (docs/design.md "Remote operators").

The Unix socket stays the local default; this listener exists only when control is started with
``--api-listen ADDR:PORT``. It serves exactly the same HTTP/1.1 API (``ApiServer.handle``) inside TLS 1.3, to a
client that presents an ``operator`` certificate of this sandbox:

1. The TLS context is the links' (``protocol/tls.py``: TLS 1.3 only, client certificate required, the sandbox's
   CA the only anchor, no session tickets) with ALPN ``http/1.1``; control presents its own certificate.
2. After the handshake ``verify_peer`` checks, with the role asked for explicitly, the issuer, the dates and
   every claim: a boundary or control certificate (role), an operator certificate of another sandbox (claims, or
   the CA during the handshake), an expired one (dates) and no certificate at all are refused.
3. The API runs code in the workload, so a failed handshake is rate limited per source address
   (``HandshakeLimiter``): after ``FAILURE_LIMIT`` failures within ``FAILURE_WINDOW_S`` that address is
   disconnected before any TLS until its failures age out, and at most ``MAX_HANDSHAKES`` handshakes run at
   once. Every refusal is logged (``api.refused``: peer, field, reason), a newly blocked address once
   (``api.rate-limited``).
4. Every accepted connection and every request on it is logged with the certificate's identity
   (``api.operator``: its SPIFFE URI, SHA-256 fingerprint, serial and end of validity) before it acts.

A channel's end of data from the workload is a TLS close_notify (``_TlsChannelEnd``, TLS 1.3 half-close), so
that a forwarded connection half-closes as a plain TCP one would.
"""

from __future__ import annotations

import collections
import ssl
from collections.abc import Callable
from typing import Any

import trio
from cryptography import x509

from supervisor.control.api import ApiServer
from supervisor.jsonlog import JsonLog
from supervisor.link.tls_link import (
    peer_name,
    receive_after_close_notify,
    send_close_notify,
    send_handshake_alert,
)
from supervisor.protocol.certs import Bundle
from supervisor.protocol.claims import Role, spiffe_uri
from supervisor.protocol.event_names import EventName
from supervisor.protocol.fingerprint import certificate_fingerprint
from supervisor.protocol.tls import ALPN_API, PeerRejected, server_context, verify_peer

__all__ = ["HandshakeLimiter", "TlsApiListener", "operator_identity"]

HANDSHAKE_TIMEOUT_S = 10.0
FAILURE_LIMIT = 5
FAILURE_WINDOW_S = 60.0
MAX_HANDSHAKES = 32
MAX_SOURCES = 4096  # sources whose failures are kept apart; past it, the others' count together (never forgotten)
_OVERFLOW = "*"


class HandshakeLimiter:
    """Failed handshakes per source address in a sliding window; pure (the clock is passed in). A source's
    failures are dropped only once its window is over: with :data:`MAX_SOURCES` sources failing within one window,
    a further source's failures count in one shared window, which blocks every source not tracked on its own."""

    def __init__(self, limit: int = FAILURE_LIMIT, window_s: float = FAILURE_WINDOW_S) -> None:
        self.limit = limit
        self.window_s = window_s
        self._failures: dict[str, collections.deque[float]] = {}

    def _recent(self, address: str, now: float) -> collections.deque[float]:
        times = self._failures.get(address)
        if times is None:
            return collections.deque()
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._failures[address]
        return times

    def blocked(self, address: str, now: float) -> bool:
        if len(self._recent(address, now)) >= self.limit:
            return True
        return address not in self._failures and len(self._recent(_OVERFLOW, now)) >= self.limit

    def failed(self, address: str, now: float) -> bool:
        """Record a failure; True when this one blocks the address (the transition, logged once)."""
        times = self._recent(address, now)
        if address not in self._failures and len(self._failures) >= MAX_SOURCES:
            for other in list(self._failures):  # a spray of sources: drop only windows that are over
                self._recent(other, now)
            if len(self._failures) >= MAX_SOURCES:
                address, times = _OVERFLOW, self._recent(_OVERFLOW, now)
        times.append(now)
        self._failures[address] = times
        return len(times) == self.limit


def operator_identity(der: bytes) -> dict[str, str]:
    """What every operator log line names: the certificate, not just the (shared) claims."""
    cert = x509.load_der_x509_certificate(der)
    identity = {
        "sha256": certificate_fingerprint(cert),
        "serial": format(cert.serial_number, "x"),
        "not_after": f"{cert.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}",
    }
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = sans.get_values_for_type(x509.UniformResourceIdentifier)
    except (x509.ExtensionNotFound, ValueError):
        uris = []
    if uris:
        identity["uri"] = uris[0]
    return identity


class _TlsChannelEnd(trio.abc.HalfCloseableStream):
    """The TLS stream as the relay's half-closeable end: ``send_eof`` is a close_notify (or a close where it cannot
    be sent alone)."""

    def __init__(self, tls: trio.SSLStream[trio.SocketStream]) -> None:
        self.tls = tls

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return await receive_after_close_notify(self.tls, max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.tls.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.tls.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        if not await send_close_notify(self.tls):
            await self.tls.aclose()

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.tls)


class TlsApiListener:
    def __init__(
        self,
        api: ApiServer,
        host: str,
        port: int,
        bundle: Bundle,
        *,
        log: JsonLog,
        limiter: HandshakeLimiter | None = None,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.api = api
        self.host = host
        self.port = port
        self.bundle = bundle
        self.log = log
        self.limiter = limiter or HandshakeLimiter()
        self.clock = clock
        self.ctx = server_context(bundle, (ALPN_API,))
        self._handshakes = trio.Semaphore(MAX_HANDSHAKES)

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        # "*": every address of the pod, IPv4 and IPv6 (what `k8s render --api-listen` passes).
        listeners = await trio.open_tcp_listeners(self.port, host=None if self.host == "*" else self.host)
        bound = listeners[0].socket.getsockname()
        self.log.emit(EventName.API_LISTENING, address=f"{self.host}:{bound[1]}", tls=True, role=str(Role.OPERATOR),
                      uri=spiffe_uri(self.bundle.claims, Role.OPERATOR))  # fmt: skip
        task_status.started(bound[1])
        await trio.serve_listeners(self._connection, listeners)

    def _refused(self, address: str, peer: str, field: str | None, reason: str) -> None:
        self.log.emit(EventName.API_REFUSED, peer=peer, field=field, reason=reason)
        if self.limiter.failed(address, self.clock()):
            self.log.emit(EventName.API_RATE_LIMITED, peer=peer, address=address, failures=self.limiter.limit,
                          window_s=self.limiter.window_s)  # fmt: skip

    async def _connection(self, stream: trio.SocketStream) -> None:
        peer = peer_name(stream)
        try:
            address = str(stream.socket.getpeername()[0])
        except OSError:
            address = "?"
        if self.limiter.blocked(address, self.clock()):
            await trio.aclose_forcefully(stream)  # no TLS for a source that keeps failing
            return
        try:
            self._handshakes.acquire_nowait()
        except trio.WouldBlock:
            self.log.emit(
                EventName.API_REFUSED, peer=peer, field="tls", reason=f"{MAX_HANDSHAKES} handshakes already running"
            )
            await trio.aclose_forcefully(stream)
            return
        tls = trio.SSLStream(stream, self.ctx, server_side=True, https_compatible=True)
        try:
            identity = await self._handshake(tls, address, peer)
        finally:
            self._handshakes.release()
        if identity is None:
            return
        self.log.emit(EventName.API_OPERATOR, action="connected", peer=peer, operator=identity)
        await self.api.handle(_TlsChannelEnd(tls), operator=identity, peer=peer)

    async def _handshake(self, tls: trio.SSLStream[trio.SocketStream], address: str, peer: str) -> Any:
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT_S):
                await tls.do_handshake()
            verify_peer(tls, self.bundle, expected_alpn=ALPN_API, expected_role=Role.OPERATOR)
            der = tls.getpeercert(True)
            assert der is not None  # verify_peer refused a connection without one
            return operator_identity(der)
        except trio.TooSlowError:
            self._refused(address, peer, "tls", f"no TLS handshake within {HANDSHAKE_TIMEOUT_S:g}s")
        except PeerRejected as exc:
            self._refused(address, peer, exc.field, str(exc))
        except (trio.BrokenResourceError, ssl.SSLError, OSError) as exc:
            await send_handshake_alert(tls)  # "certificate expired", "unknown ca", "certificate required"
            cause = exc.__cause__ or exc
            self._refused(address, peer, "tls", f"handshake failed: {cause}")
        await trio.aclose_forcefully(tls)
        return None
