"""The SNI of a ClientHello read before the handshake (``l7.client_hello``), from real ClientHellos."""

from __future__ import annotations

import ssl

import pytest

from supervisor.control.l7.client_hello import ClientHelloError, Pending, server_name


def client_hello(sni: str | None) -> bytes:
    ctx = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname=sni) if sni else ssl.SSLContext(
        ssl.PROTOCOL_TLS_CLIENT).wrap_bio(incoming, outgoing)  # fmt: skip
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


def test_the_name_asked_for() -> None:
    assert server_name(client_hello("api.test")) == "api.test"


def test_no_sni() -> None:
    assert server_name(client_hello(None)) is None


def test_every_split_is_pending_until_whole() -> None:
    hello = client_hello("api.test")
    for cut in range(len(hello)):
        assert isinstance(server_name(hello[:cut]), Pending)


def test_fragmented_over_two_records() -> None:
    hello = client_hello("split.test")
    body = hello[5:]
    head = hello[:3]
    half = len(body) // 2
    two = (head + half.to_bytes(2, "big") + body[:half] + head + (len(body) - half).to_bytes(2, "big")
           + body[half:])  # fmt: skip
    assert server_name(two) == "split.test"


@pytest.mark.parametrize(
    "data", [b"\x16\x03\x01\x00\x04\x02\x00\x00\x00", b"\x16\x03\x05\x00\x00", b"\x16\x03\x01\x00\x01\x01\x17\x03\x03"]
)
def test_garbage_is_refused(data: bytes) -> None:
    with pytest.raises(ClientHelloError):
        server_name(data)
