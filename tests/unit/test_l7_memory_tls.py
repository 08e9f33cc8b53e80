"""TLS on memory BIOs (control/l7/memory_tls.py): as the agent-facing server against trio's own client, over
in-memory transports."""

from __future__ import annotations

import ssl

import pytest
import trio
import trio.testing

from supervisor.control.l7.ca import InterceptionCA
from supervisor.control.l7.memory_tls import MemoryTLSStream

CA = InterceptionCA.generate("unit-agent-tls")
HOST = "api.example.test"


def client_context(ca_pem: str = CA.cert_pem) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=ca_pem)


async def connected(
    transport: tuple[trio.abc.Stream, trio.abc.Stream] | None = None, *, ca: InterceptionCA = CA
) -> tuple[trio.SSLStream[trio.abc.Stream], MemoryTLSStream]:
    left, right = transport or trio.testing.memory_stream_pair()
    client = trio.SSLStream(left, client_context(), server_hostname=HOST)
    server = MemoryTLSStream(right, ca.leaf_context(HOST), server_side=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.do_handshake)
        nursery.start_soon(server.do_handshake)
    return client, server


async def test_generic_two_way_stream_contract() -> None:
    async def pair() -> tuple[trio.abc.Stream, trio.abc.Stream]:
        return await connected()

    # over a lockstep transport the handshake's last flight (TLS 1.3 session tickets) would wait for a client that
    # is done reading: this CA's leaf sends none
    quiet = InterceptionCA.from_pem(CA.cert_pem, CA.private_key_pem())
    quiet.leaf_context(HOST).num_tickets = 0

    async def clogged() -> tuple[trio.abc.Stream, trio.abc.Stream]:
        client, server = await connected(trio.testing.lockstep_stream_pair(), ca=quiet)
        return client, server

    await trio.testing.check_two_way_stream(pair, clogged)


async def test_one_receive_takes_every_record_already_there() -> None:
    client, server = await connected()
    payload = bytes(range(256)) * 512  # 128 KiB: eight full TLS records
    await client.send_all(payload)
    first = await server.receive_some(65536)
    assert len(first) > 16384, "one record per receive would cap this at 16 KiB"
    got = bytearray(first)
    while len(got) < len(payload):
        got += await server.receive_some(65536)
    assert bytes(got) == payload
    await server.send_all(payload)
    back = bytearray()
    while len(back) < len(payload):
        back += await client.receive_some(65536)
    assert bytes(back) == payload


async def test_untrusted_agent_fails_the_handshake_with_the_ssl_error_as_cause() -> None:
    left, right = trio.testing.memory_stream_pair()
    stranger = InterceptionCA.generate("someone-else")
    client = trio.SSLStream(left, client_context(stranger.cert_pem), server_hostname=HOST)
    server = MemoryTLSStream(right, CA.leaf_context(HOST), server_side=True)
    failures: dict[str, BaseException] = {}

    async def run(name: str, stream: trio.SSLStream[trio.abc.Stream] | MemoryTLSStream) -> None:
        try:
            await stream.do_handshake()
        except trio.BrokenResourceError as exc:
            failures[name] = exc
            await trio.aclose_forcefully(stream.transport_stream)  # as a client's socket closes after it failed

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, "client", client)
        nursery.start_soon(run, "server", server)
    assert isinstance(failures["client"].__cause__, ssl.SSLCertVerificationError)
    assert isinstance(failures["server"].__cause__, ssl.SSLError)
    with pytest.raises(trio.BrokenResourceError):
        await server.receive_some(10)


async def test_transport_end_without_close_notify_is_the_end_of_data() -> None:
    client, server = await connected()
    await client.send_all(b"last words")
    await client.transport_stream.aclose()  # a cut, no close_notify (HTTPS clients do this)
    assert await server.receive_some(100) == b"last words"
    assert await server.receive_some(100) == b""


async def test_close_notify_then_closed() -> None:
    client, server = await connected()
    await server.aclose()
    assert await client.receive_some(10) == b""
    with pytest.raises(trio.ClosedResourceError):
        await server.send_all(b"x")
    with pytest.raises(trio.ClosedResourceError):
        await server.receive_some(10)


async def test_handshake_cut_midway_is_broken() -> None:
    left, right = trio.testing.memory_stream_pair()
    server = MemoryTLSStream(right, CA.leaf_context(HOST), server_side=True)
    await left.send_all(b"\x16\x03\x01\x00\x05hello")  # a truncated ClientHello record, then the end
    await left.aclose()
    with pytest.raises(trio.BrokenResourceError):
        await server.do_handshake()


async def test_as_the_upstream_client_it_verifies_and_carries_bytes() -> None:
    left, right = trio.testing.memory_stream_pair()
    client = MemoryTLSStream(left, client_context(), server_side=False, server_hostname=HOST)
    server = trio.SSLStream(right, CA.leaf_context(HOST), server_side=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.do_handshake)
        nursery.start_soon(server.do_handshake)
    assert client.selected_alpn_protocol() is None and client.version() in ("TLSv1.2", "TLSv1.3")
    await client.send_all(b"GET / HTTP/1.1\r\n\r\n")
    assert await server.receive_some(100) == b"GET / HTTP/1.1\r\n\r\n"
    await server.send_all(b"HTTP/1.1 200 OK\r\n\r\n")
    assert await client.receive_some(100) == b"HTTP/1.1 200 OK\r\n\r\n"


async def test_as_the_upstream_client_a_wrong_name_fails_verification() -> None:
    left, right = trio.testing.memory_stream_pair()
    client = MemoryTLSStream(left, client_context(), server_side=False, server_hostname="other.example.test")
    server = trio.SSLStream(right, CA.leaf_context(HOST), server_side=True)
    failures: list[BaseException] = []

    async def serve() -> None:
        try:
            await server.do_handshake()
        except trio.BrokenResourceError as exc:
            failures.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        with pytest.raises(trio.BrokenResourceError) as caught:
            await client.do_handshake()
        await trio.aclose_forcefully(client)
    assert isinstance(caught.value.__cause__, ssl.SSLCertVerificationError)
    assert failures, "the upstream saw the handshake fail too (the client's alert or its close)"
