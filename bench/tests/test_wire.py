"""The harness's wire formats: CONNECT request/reply and the bulk header."""

from __future__ import annotations

import pytest

from bench.wire import (
    BULK_HEADER,
    ConnectReply,
    Direction,
    WireError,
    connect_request,
    decode_bulk_header,
    encode_bulk_header,
    parse_connect_reply,
    proxy_address,
    proxy_authorizations,
)


@pytest.mark.parametrize(
    ("host", "port", "expected"),
    [
        ("127.0.0.1", 8080, b"CONNECT 127.0.0.1:8080 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n"),
        ("::1", 443, b"CONNECT [::1]:443 HTTP/1.1\r\nHost: [::1]:443\r\n\r\n"),
        ("example.test", 1, b"CONNECT example.test:1 HTTP/1.1\r\nHost: example.test:1\r\n\r\n"),
    ],
)
def test_connect_request(host: str, port: int, expected: bytes) -> None:
    assert connect_request(host, port) == expected


def test_a_proxy_named_with_userinfo_gets_basic_credentials_and_the_others_nothing() -> None:
    """The proxy-pod sandbox's agent: ``http://sandbox:<token>@ADDR:PORT`` in its variables, as curl reads them."""
    from supervisor.protocol.proxy_head import ProxyTarget, parse_head, proxy_token_matches, proxy_url

    token = "tok-0123456789abcdef"
    environ = {"HTTPS_PROXY": proxy_url("169.254.20.1", 3128, token), "NO_PROXY": "localhost"}
    auth = proxy_authorizations(environ)
    assert list(auth) == [("169.254.20.1", 3128)] and proxy_address(environ) == ("169.254.20.1", 3128)
    request = connect_request("198.51.100.2", 9000, auth[("169.254.20.1", 3128)])
    target = parse_head(request)
    assert isinstance(target, ProxyTarget) and proxy_token_matches(target, token)
    assert not proxy_token_matches(target, token + "x")
    plain = {"HTTP_PROXY": "http://127.0.0.1:3128"}  # the boundary topology's agent: no userinfo, no header
    assert proxy_authorizations(plain) == {} and proxy_address(plain) == ("127.0.0.1", 3128)
    assert proxy_authorizations({}) == {} and proxy_address({}) is None
    assert b"Proxy-Authorization" not in connect_request("198.51.100.2", 9000, None)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", None),
        (b"HTTP/1.1 200 Connection established\r\n", None),
        (b"HTTP/1.1 200 Connection established\r\n\r\n", ConnectReply(200, "Connection established", b"")),
        (b"HTTP/1.0 200 OK\r\nVia: x\r\n\r\nabc", ConnectReply(200, "OK", b"abc")),
        (b"HTTP/1.1 403\r\n\r\n", ConnectReply(403, "", b"")),
    ],
)
def test_parse_connect_reply(data: bytes, expected: ConnectReply | None) -> None:
    assert parse_connect_reply(data) == expected


@pytest.mark.parametrize(
    "data",
    [b"SSH-2.0-x\r\n\r\n", b"HTTP/1.1 abc OK\r\n\r\n", b"HTTP/2 200\r\n\r\n", b"x" * (17 * 1024)],
)
def test_parse_connect_reply_rejects_garbage(data: bytes) -> None:
    with pytest.raises(WireError):
        parse_connect_reply(data)


@pytest.mark.parametrize("direction", list(Direction))
@pytest.mark.parametrize("size", [0, 1, 1 << 30, (1 << 64) - 1])
def test_bulk_header_round_trip(direction: Direction, size: int) -> None:
    encoded = encode_bulk_header(direction, size)
    assert len(encoded) == BULK_HEADER.size
    assert decode_bulk_header(encoded) == (direction, size)


@pytest.mark.parametrize("data", [b"", b"U" + bytes(7), b"X" + bytes(8), b"U" + bytes(9)])
def test_bulk_header_rejects(data: bytes) -> None:
    with pytest.raises(WireError):
        decode_bulk_header(data)
