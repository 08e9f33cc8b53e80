"""Establishing claim-bound mTLS links: the boundary's accept side and control's dial side.

Every connection gets a deadline for the whole handshake (a peer that sends nothing must not hold a slot), then
``verify_peer`` checks TLS 1.3, ALPN, the CA and every claim. A refusal is an exception naming the peer and the
failing field; the caller logs it and keeps serving. When the handshake itself completed, the refused peer is
told the field too (an HTTP/2 GOAWAY, never a value): with TLS 1.3 it would otherwise only see a closed link.

The link's TLS runs on the socket (:class:`supervisor.link.socket_tls.SocketTLSStream`): OpenSSL reads and writes
the descriptor itself, and a failed handshake's alert is on the wire before the failure reaches us.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass

import trio

from supervisor.link.refusal import send_refusal
from supervisor.link.socket_tls import SocketTLSStream
from supervisor.protocol.certs import Bundle
from supervisor.protocol.claims import Claims
from supervisor.protocol.tls import ALPN_EGRESS, ALPN_OPS, PeerRejected, verify_peer

HANDSHAKE_TIMEOUT = 10.0
# A peer that vanishes without a FIN (its pod deleted, its node lost; found with real pods, tests/k8s) is
# noticed after about 30 s of silence, and data it never acknowledges fails the link after 30 s: neither side
# keeps a dead link (control would stay ready for a boundary that is gone).
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT = 15, 5, 3
USER_TIMEOUT_MS = 30_000


def set_keepalive(stream: trio.SocketStream) -> None:
    """TCP keepalive and a user timeout on a link's socket; a socket that is not TCP is left as it is."""
    options = (
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
        (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_S),
        (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL_S),
        (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_COUNT),
        (socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, USER_TIMEOUT_MS),
    )
    try:
        if stream.socket.type != socket.SOCK_STREAM or stream.socket.family not in (socket.AF_INET, socket.AF_INET6):
            return
        for level, name, value in options:
            stream.socket.setsockopt(level, name, value)
    except OSError:
        pass


@dataclass
class Refused(Exception):
    """A connection that did not become a link."""

    peer: str
    field: str | None
    reason: str

    def __str__(self) -> str:
        where = f" field={self.field}" if self.field else ""
        return f"peer {self.peer} refused:{where} {self.reason}"


def peer_name(stream: trio.SocketStream) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]
    except OSError:
        return "?"
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


async def _handshake(
    stream: trio.SocketStream,
    ctx: ssl.SSLContext,
    bundle: Bundle,
    *,
    server: bool,
    alpn: str | None,
    handshake_s: float,
) -> tuple[SocketTLSStream, Claims, str]:
    peer = peer_name(stream)
    tls = SocketTLSStream(stream, ctx, server_side=server)
    try:
        with trio.fail_after(handshake_s):
            await tls.do_handshake()
        claims = verify_peer(tls, bundle, expected_alpn=alpn)
    except trio.TooSlowError:
        await trio.aclose_forcefully(tls)
        raise Refused(peer, "tls", f"no TLS handshake within {handshake_s:g}s") from None
    except PeerRejected as exc:
        await refuse(tls, server=server, field=exc.field)
        raise Refused(peer, exc.field, str(exc)) from None
    except (trio.BrokenResourceError, ssl.SSLError, OSError) as exc:
        await trio.aclose_forcefully(tls)  # OpenSSL's alert, if it wrote one, is already on the wire
        cause = exc.__cause__ or exc
        raise Refused(peer, "tls", f"handshake failed: {cause}") from None
    return tls, claims, tls.selected_alpn_protocol() or ""


async def _send_alert(tls: trio.SSLStream[trio.SocketStream]) -> None:
    """Send the TLS alert OpenSSL wrote when it failed the handshake (unknown CA, certificate expired, …).

    trio raises as soon as the handshake fails and leaves the alert in its outgoing buffer, so the peer would see
    a bare close; with TLS 1.3 a client's handshake has already completed by then and the alert is the only
    account of why it was refused that it can get.
    """
    outgoing = getattr(tls, "_outgoing", None)  # trio's MemoryBIO; absent in another trio: then say nothing
    if not isinstance(outgoing, ssl.MemoryBIO):
        return
    data = outgoing.read()
    if not data:
        return
    with trio.move_on_after(1):
        try:
            await tls.transport_stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass


async def refuse(tls: SocketTLSStream, *, server: bool, field: str | None) -> None:
    """Close a link we refuse after its handshake completed, telling the peer which field failed when it speaks one
    of our link protocols (an HTTP/2 GOAWAY, ``refusal.send_refusal``); otherwise just close it."""
    try:
        alpn = tls.selected_alpn_protocol()
    except (ssl.SSLError, OSError, ValueError):
        alpn = None
    if alpn not in (ALPN_OPS, ALPN_EGRESS):
        await trio.aclose_forcefully(tls)
        return
    # HTTP/2 roles do not follow TCP's: control is the client on ops links, the boundary on egress links.
    h2_client = (alpn == ALPN_EGRESS) if server else (alpn == ALPN_OPS)
    await send_refusal(tls, client=h2_client, field=field)


async def accept_link(
    stream: trio.SocketStream, ctx: ssl.SSLContext, bundle: Bundle, *, handshake_s: float = HANDSHAKE_TIMEOUT
) -> tuple[SocketTLSStream, Claims, str]:
    """Server side (the boundary): handshake, verify, return (stream, peer claims, ALPN)."""
    set_keepalive(stream)
    return await _handshake(stream, ctx, bundle, server=True, alpn=None, handshake_s=handshake_s)


async def dial_link(
    host: str, port: int, ctx: ssl.SSLContext, bundle: Bundle, alpn: str, *, handshake_s: float = HANDSHAKE_TIMEOUT
) -> tuple[SocketTLSStream, Claims]:
    """Client side (control): connect, handshake, verify the boundary's claims and the ALPN."""
    try:
        with trio.fail_after(handshake_s):
            tcp = await trio.open_tcp_stream(host, port)
    except (OSError, trio.TooSlowError) as exc:
        raise Refused(f"{host}:{port}", None, f"connect failed: {exc or 'timeout'}") from None
    set_keepalive(tcp)
    tls, claims, _ = await _handshake(tcp, ctx, bundle, server=False, alpn=alpn, handshake_s=handshake_s)
    return tls, claims


async def send_handshake_alert(tls: trio.SSLStream[trio.SocketStream]) -> None:
    """The alert OpenSSL wrote when a handshake failed, sent before closing (also control's TCP operator API)."""
    await _send_alert(tls)


async def send_close_notify(tls: trio.SSLStream[trio.SocketStream]) -> bool:
    """Half-close a TLS 1.3 stream: send close_notify and keep reading (TLS 1.3 allows it, RFC 8446 §6.1; trio has
    no public call for it, so this drives its SSL object as ``aclose`` does, without waiting for the peer's
    close_notify). False, having sent nothing, where trio's internals differ: the caller then closes instead."""
    retry = getattr(tls, "_retry", None)
    ssl_object = getattr(tls, "_ssl_object", None)
    if retry is None or not isinstance(ssl_object, ssl.SSLObject):
        await trio.lowlevel.checkpoint()
        return False
    await retry(ssl_object.unwrap, ignore_want_read=True)
    return True


async def receive_after_close_notify(tls: trio.SSLStream[trio.SocketStream], max_bytes: int | None) -> bytes:
    """``receive_some`` for a stream that may have sent its own close_notify: the peer's close_notify is then an
    end of data, where trio (seeing OpenSSL's "zero return" with both shutdowns done) reports a broken stream."""
    try:
        return bytes(await tls.receive_some(max_bytes))
    except trio.BrokenResourceError as exc:
        if isinstance(exc.__cause__, ssl.SSLZeroReturnError):
            return b""
        raise
