"""SocketTLSStream: TLS on a non-blocking socket driven by trio (supervisor/link/socket_tls.py), on loopback."""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trustme

from supervisor.link.socket_tls import SocketTLSStream

CA = trustme.CA()
CERT = CA.issue_cert("localhost")


def _contexts(trusting: bool = True) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    CERT.configure_cert(server)
    client = ssl.create_default_context()
    if trusting:
        CA.configure_trust(client)
    for ctx in (server, client):
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    return server, client


async def _tcp_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        accepted: list[trio.SocketStream] = []

        async def accept() -> None:
            accepted.append(await listener.accept())

        nursery.start_soon(accept)
        client = await trio.open_tcp_stream("127.0.0.1", port)
    await listener.aclose()
    return accepted[0], client


@asynccontextmanager
async def _tls_pair() -> AsyncIterator[tuple[SocketTLSStream, SocketTLSStream]]:
    server_ctx, client_ctx = _contexts()
    server_tcp, client_tcp = await _tcp_pair()
    server = SocketTLSStream(server_tcp, server_ctx, server_side=True)
    client = SocketTLSStream(client_tcp, client_ctx, server_side=False, server_hostname="localhost")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.do_handshake)
        await client.do_handshake()
    try:
        yield server, client
    finally:
        await server.aclose()
        await client.aclose()


async def _read_exactly(stream: SocketTLSStream, size: int) -> tuple[bytes, int]:
    got = bytearray()
    largest = 0
    while len(got) < size:
        data = await stream.receive_some(1 << 20)
        assert data, "end of data before everything arrived"
        largest = max(largest, len(data))
        got += data
    return bytes(got), largest


async def test_both_directions_at_once_and_receives_span_records() -> None:
    up, down = os.urandom(3 << 20), os.urandom(3 << 20)
    async with _tls_pair() as (server, client):
        assert client.version() == "TLSv1.3" and server.getpeercert(True) is None
        results: dict[str, tuple[bytes, int]] = {}

        async def read(name: str, stream: SocketTLSStream, size: int) -> None:
            results[name] = await _read_exactly(stream, size)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.send_all, up)
            nursery.start_soon(server.send_all, memoryview(down))
            nursery.start_soon(read, "server", server, len(up))
            nursery.start_soon(read, "client", client, len(down))
    assert results["server"][0] == up and results["client"][0] == down
    # one receive drains every record already there (a TLS record carries at most 16 KiB)
    assert max(results["server"][1], results["client"][1]) > 16 * 1024


async def test_close_notify_is_end_of_data_and_a_bare_tcp_close_is_broken() -> None:
    async with _tls_pair() as (server, client):
        await client.send_all(b"last words")
        await client.aclose()
        assert await server.receive_some() == b"last words"
        assert await server.receive_some() == b""
    async with _tls_pair() as (server, client):
        await client.close_transport()  # no close_notify: a truncation, never a clean end
        with pytest.raises(trio.BrokenResourceError):
            while await server.receive_some():
                pass


async def test_closed_and_busy_streams_raise_what_trio_streams_raise() -> None:
    async with _tls_pair() as (server, client):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.receive_some)
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(trio.BusyResourceError):
                await server.receive_some()
            await client.send_all(b"x")
        await client.aclose()
        with pytest.raises(trio.ClosedResourceError):
            await client.send_all(b"after close")
        with pytest.raises(trio.ClosedResourceError):
            await client.receive_some()


async def test_a_waiting_receive_is_woken_by_aclose() -> None:
    woken: list[BaseException] = []

    async def receive(stream: SocketTLSStream) -> None:
        try:
            await stream.receive_some()
        except trio.ClosedResourceError as exc:
            woken.append(exc)

    async with _tls_pair() as (server, _client), trio.open_nursery() as nursery:
        nursery.start_soon(receive, server)
        await trio.testing.wait_all_tasks_blocked()
        await server.aclose()
    assert len(woken) == 1


async def test_a_failed_handshake_sends_the_alert_to_the_peer() -> None:
    server_ctx, untrusting = _contexts(trusting=False)
    server_tcp, client_tcp = await _tcp_pair()
    server = SocketTLSStream(server_tcp, server_ctx, server_side=True)
    client = SocketTLSStream(client_tcp, untrusting, server_side=False, server_hostname="localhost")
    failures: dict[str, BaseException] = {}

    async def handshake(name: str, stream: SocketTLSStream) -> None:
        try:
            with trio.fail_after(10):
                await stream.do_handshake()
                await stream.receive_some()  # a TLS 1.3 server learns of the client's verdict after its Finished
        except (ssl.SSLError, trio.BrokenResourceError) as exc:
            failures[name] = exc
        finally:
            await stream.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(handshake, "server", server)
        nursery.start_soon(handshake, "client", client)
    assert "CERTIFICATE_VERIFY_FAILED" in str(failures["client"])
    # the client's alert reached the server: it names the reason, not just a closed connection
    assert "unknown ca" in str(failures["server"].__cause__ or failures["server"]).lower()


async def test_reset_is_an_abort_the_peer_sees() -> None:
    async with _tls_pair() as (server, client):
        await client.reset()  # what relay.abort_stream calls: a TCP reset, no close_notify
        await trio.lowlevel.wait_readable(server.socket)
        with pytest.raises(ConnectionResetError):  # under TLS: the socket itself was reset
            socket.socket.recv(server.socket, 1)


async def test_send_many_arrives_as_the_pieces_joined() -> None:
    pieces: list[bytes | bytearray | memoryview] = [
        b"h" * 49,
        bytearray(b"small"),
        memoryview(os.urandom(700 * 1024))[3:],  # more than one SEND_CHUNK, a view of part of a buffer
        b"",
        b"tail",
    ]
    expected = b"".join(bytes(p) for p in pieces)
    async with _tls_pair() as (server, client), trio.open_nursery() as nursery:
        nursery.start_soon(client.send_many, pieces)
        got, _largest = await _read_exactly(server, len(expected))
    assert got == expected


async def test_a_received_chunk_is_not_changed_by_the_next_receive() -> None:
    """Receives decrypt into one buffer kept by the stream: what a receive returned must be a copy."""
    async with _tls_pair() as (server, client):
        await client.send_all(b"A" * 1000)
        first = await server.receive_some()
        await client.send_all(b"B" * 1000)
        second = await server.receive_some()
    assert first == b"A" * 1000 and second == b"B" * 1000


async def test_try_send_writes_now_and_a_full_socket_keeps_the_record_for_the_next_send() -> None:
    async with _tls_pair() as (server, client):
        assert client.try_send(b"at once")  # from synchronous code: no schedule point, no wait
        assert await server.receive_some() == b"at once"
        # the peer reads nothing until the socket fills mid-record
        client.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        sent: list[bytes] = []
        for _ in range(10_000):
            record = os.urandom(16 * 1024)
            sent.append(record)
            if not client.try_send(record):
                break
        else:
            raise AssertionError("the socket never filled")
        with pytest.raises(trio.BusyResourceError):  # the unfinished record must be handed over first
            client.try_send(b"jumping the queue")
        expected = b"".join(sent) + b"after"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.send_all, b"after")  # finishes the kept record, then its own bytes
            got, _largest = await _read_exactly(server, len(expected))
    assert got == expected  # nothing lost, doubled or reordered


async def test_try_send_on_a_closed_or_busy_stream_raises_what_a_send_raises() -> None:
    async with _tls_pair() as (server, client):
        client.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.send_all, os.urandom(4 << 20))  # waits: the peer reads nothing yet
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(trio.BusyResourceError):
                client.try_send(b"during another send")
            await _read_exactly(server, 4 << 20)
        await client.aclose()
        with pytest.raises(trio.ClosedResourceError):
            client.try_send(b"after close")
