"""The egress stream header schema: round trips, a table of malformed inputs, and an in-memory h2 exchange."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.protocol.egress import (
    ALPN_EGRESS,
    CaptureKind,
    EgressHeaderError,
    EgressReply,
    decode_connect_headers,
    decode_dns_request_headers,
    decode_reply_headers,
    encode_connect_headers,
    encode_dns_request_headers,
    encode_reply_headers,
    format_authority,
    parse_authority,
)
from supervisor.protocol.identity import ConnectionIdentity, IdentityError

# as an older boundary sent it: without the optional ``orphaned`` and ``loader_env``
IDENTITY_WIRE: dict[str, Any] = {
    "binary_path": "/usr/bin/curl",
    "binary_sha256": "ab" * 32,
    "ancestors": ["/usr/bin/bash", "/usr/local/bin/agent"],
    "cmdline_paths": ["/sandbox/tool.py"],
    "pid": 4242,
    "start_time": 123456789,
    "uid": 1000,
    "owners": 1,
    "resolved_in_us": 180,
}
IDENTITY = ConnectionIdentity.from_wire(IDENTITY_WIRE)


def good_headers(**overrides: str) -> list[tuple[str, str]]:
    headers = dict(
        encode_connect_headers("example.com", 443, capture="connect", identity=IDENTITY, conn_id="c-1", src_port=40000)
    )
    headers.update(overrides)
    return list(headers.items())


AUTHORITIES_OK = [
    ("example.com:443", None, ("example.com", 443)),
    ("EXAMPLE.com:80", None, ("example.com", 80)),
    ("[2001:db8::1]:443", None, ("2001:db8::1", 443)),
    ("[2001:DB8:0::1]:443", None, ("2001:db8::1", 443)),
    ("198.51.100.7:1", None, ("198.51.100.7", 1)),
    ("a.b:65535", None, ("a.b", 65535)),
    ("example.com", 80, ("example.com", 80)),
    ("[::1]", 80, ("::1", 80)),
    ("0x7f.1:80", None, ("0x7f.1", 80)),  # numeric spellings are control's business, not a syntax error
]

AUTHORITIES_BAD = [
    "",
    "example.com",  # no port
    "example.com:",
    "example.com:0",
    "example.com:65536",
    "example.com:080",
    "example.com:+80",
    "example.com:80:x",
    "2001:db8::1:443",  # unbracketed IPv6
    "[2001:db8::1]",  # no port
    "[2001:db8::1]443",
    "[2001:db8::1:443",
    "[fe80::1%25eth0]:80",
    "[not-v6]:80",
    "user@example.com:443",
    "user:pw@example.com:443",
    ":443",
    "exa mple.com:443",
    "exa%2fmple.com:443",
    "ex\u00e4mple.com:443",
    "a" * 256 + ":443",
    "example.com:44 3",
]


@pytest.mark.parametrize(("text", "default", "expected"), AUTHORITIES_OK)
def test_authority_accepted(text: str, default: int | None, expected: tuple[str, int]) -> None:
    assert parse_authority(text, default_port=default) == expected


@pytest.mark.parametrize("text", AUTHORITIES_BAD)
def test_authority_rejected(text: str) -> None:
    with pytest.raises(EgressHeaderError):
        parse_authority(text)


def test_format_authority_brackets_ipv6_and_validates() -> None:
    assert format_authority("2001:db8::1", 443) == "[2001:db8::1]:443"
    assert format_authority("Example.COM", 80) == "example.com:80"
    with pytest.raises(EgressHeaderError):
        format_authority("example.com", 0)
    with pytest.raises(EgressHeaderError):
        format_authority("bad host", 80)


@pytest.mark.parametrize("kind", list(CaptureKind))
def test_connect_round_trip(kind: CaptureKind) -> None:
    headers = encode_connect_headers(
        "2001:db8::1", 8443, capture=kind, identity=IDENTITY, conn_id="abc_DEF-9", src_port=51000
    )
    assert headers[0] == (":method", "CONNECT")
    assert (":authority", "[2001:db8::1]:8443") in headers
    assert not any(name in (":scheme", ":path") for name, _ in headers)
    request = decode_connect_headers(headers)
    assert (request.host, request.port, request.capture) == ("2001:db8::1", 8443, kind)
    assert request.identity == IDENTITY
    assert (request.conn_id, request.src_port) == ("abc_DEF-9", 51000)
    assert request.authority == "[2001:db8::1]:8443"


def test_decode_accepts_bytes_as_h2_delivers_them() -> None:
    raw = [(name.encode(), value.encode()) for name, value in good_headers()]
    assert decode_connect_headers(raw).host == "example.com"


def _bad_identity(**changes: Any) -> str:
    identity = {**IDENTITY_WIRE, **changes}
    identity = {k: v for k, v in identity.items() if v is not _DROP}
    return json.dumps(identity)


_DROP = object()

CONNECT_BAD: list[tuple[str, list[tuple[str, str]]]] = [
    ("method GET", good_headers(**{":method": "GET"})),
    ("bad authority", good_headers(**{":authority": "example.com"})),
    ("unbracketed v6", good_headers(**{":authority": "2001:db8::1:443"})),
    ("unknown capture", good_headers(**{"openshell-capture": "magic"})),
    ("capture case", good_headers(**{"openshell-capture": "CONNECT"})),
    ("identity not json", good_headers(**{"openshell-identity": "{nope"})),
    ("identity array", good_headers(**{"openshell-identity": "[]"})),
    ("identity unknown field", good_headers(**{"openshell-identity": _bad_identity(extra=1)})),
    ("identity missing field", good_headers(**{"openshell-identity": _bad_identity(pid=_DROP)})),
    ("identity bool pid", good_headers(**{"openshell-identity": _bad_identity(pid=True)})),
    ("identity negative", good_headers(**{"openshell-identity": _bad_identity(uid=-1)})),
    ("identity bad sha", good_headers(**{"openshell-identity": _bad_identity(binary_sha256="AB" * 32)})),
    ("identity short sha", good_headers(**{"openshell-identity": _bad_identity(binary_sha256="ab")})),
    ("identity relative", good_headers(**{"openshell-identity": _bad_identity(binary_path="curl")})),
    ("identity ancestors", good_headers(**{"openshell-identity": _bad_identity(ancestors=[1])})),
    ("identity no owner", good_headers(**{"openshell-identity": _bad_identity(owners=0)})),
    ("identity orphaned str", good_headers(**{"openshell-identity": _bad_identity(orphaned="yes")})),
    ("conn id empty", good_headers(**{"openshell-conn-id": ""})),
    ("conn id space", good_headers(**{"openshell-conn-id": "a b"})),
    ("conn id long", good_headers(**{"openshell-conn-id": "a" * 65})),
    ("src port zero", good_headers(**{"openshell-src-port": "0"})),
    ("src port big", good_headers(**{"openshell-src-port": "70000"})),
    ("src port text", good_headers(**{"openshell-src-port": "x1"})),
    ("duplicate header", [*good_headers(), ("openshell-capture", "connect")]),
    ("unknown header", [*good_headers(), ("openshell-extra", "1")]),
    ("path on connect", [*good_headers(), (":path", "/")]),
    ("upper-case name", [*good_headers(), ("Openshell-Rule", "x")]),
    ("missing identity", [h for h in good_headers() if h[0] != "openshell-identity"]),
    ("missing authority", [h for h in good_headers() if h[0] != ":authority"]),
    ("crlf in value", good_headers(**{"openshell-conn-id": "a\r\nb"})),
]


@pytest.mark.parametrize(("case", "headers"), CONNECT_BAD, ids=[c for c, _ in CONNECT_BAD])
def test_connect_rejected(case: str, headers: list[tuple[str, str]]) -> None:
    with pytest.raises(EgressHeaderError):
        decode_connect_headers(headers)


def test_non_ascii_bytes_rejected() -> None:
    raw = [(n.encode(), v.encode()) for n, v in good_headers()] + [(b"openshell-rule", b"\xff")]
    with pytest.raises(EgressHeaderError):
        decode_connect_headers(raw)


def test_encode_refuses_what_decode_would_refuse() -> None:
    with pytest.raises(EgressHeaderError):
        encode_connect_headers("h", 1, capture="bogus", identity=IDENTITY, conn_id="c", src_port=1)
    with pytest.raises(EgressHeaderError):
        encode_connect_headers("h", 1, capture="connect", identity={}, conn_id="c", src_port=1)  # type: ignore[arg-type]
    with pytest.raises(EgressHeaderError, match="binary_path must be absolute"):
        relative = dataclasses.replace(IDENTITY, binary_path="curl")
        encode_connect_headers("h", 1, capture="connect", identity=relative, conn_id="c", src_port=1)
    with pytest.raises(EgressHeaderError):
        encode_connect_headers("h", 1, capture="connect", identity=IDENTITY, conn_id="c", src_port=0)


def test_identity_may_be_orphaned_and_unhashed() -> None:
    identity = ConnectionIdentity.from_wire({**IDENTITY_WIRE, "binary_sha256": None, "orphaned": True})
    assert (identity.binary_sha256, identity.orphaned, identity.loader_env) == (None, True, ())


def test_identity_wire_json_is_unchanged() -> None:
    """The JSON is the contract with older and newer peers: every field, sorted, compact."""
    headers = dict(good_headers())
    assert json.loads(headers["openshell-identity"]) == {**IDENTITY_WIRE, "orphaned": False, "loader_env": []}
    assert headers["openshell-identity"] == json.dumps(
        {**IDENTITY_WIRE, "orphaned": False, "loader_env": []}, separators=(",", ":"), sort_keys=True
    )
    assert ConnectionIdentity.from_wire(IDENTITY.to_wire()) == IDENTITY


@pytest.mark.parametrize(
    ("changes", "field"),
    [({"pid": "1"}, "pid"), ({"uid": -1}, "uid"), ({"loader_env": [1]}, "loader_env"), ({"extra": 1}, "extra")],
)
def test_identity_errors_name_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(IdentityError, match=field):
        ConnectionIdentity.from_wire({**IDENTITY_WIRE, **changes})


REPLIES_OK = [
    EgressReply(200),
    EgressReply(403, reason="no matching rule", rule=None),
    EgressReply(403, reason="binary not allowed", rule="github", detail="CONNECT h:443 not permitted by policy"),
    EgressReply(502, reason="upstream-refused"),
    EgressReply(503, reason="dns-failure"),
    EgressReply(504, reason="connect-timeout"),
]


@pytest.mark.parametrize("reply", REPLIES_OK)
def test_reply_round_trip(reply: EgressReply) -> None:
    assert decode_reply_headers(encode_reply_headers(reply)) == reply
    assert reply.allowed == (reply.status == 200)


REPLIES_BAD = [
    [(":status", "403")],  # refusal without a reason
    [(":status", "302"), ("openshell-reason", "x")],
    [(":status", "abc")],
    [("openshell-reason", "x")],
    [(":status", "200"), (":status", "200")],
    [(":status", "403"), ("openshell-reason", "a\x01b")],
    [(":status", "403"), ("openshell-reason", "x" * 2000)],
    [(":status", "200"), ("set-cookie", "x")],
]


@pytest.mark.parametrize("headers", REPLIES_BAD)
def test_reply_rejected(headers: list[tuple[str, str]]) -> None:
    with pytest.raises(EgressHeaderError):
        decode_reply_headers(headers)


def test_dns_request_headers() -> None:
    headers = encode_dns_request_headers(40)
    assert decode_dns_request_headers(headers) == 40
    wrong_path = [(n, "/v1/other" if n == ":path" else v) for n, v in headers]
    with pytest.raises(EgressHeaderError):
        decode_dns_request_headers(wrong_path)
    with pytest.raises(EgressHeaderError):
        encode_dns_request_headers(5)
    too_long = [(n, "70000" if n == "content-length" else v) for n, v in headers]
    with pytest.raises(EgressHeaderError):
        decode_dns_request_headers(too_long)


def test_h2_carries_the_connect_head_unchanged() -> None:
    """Our header list is acceptable to h2 as a CONNECT request in both directions."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    client.initiate_connection()
    server.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    client.send_headers(
        1,
        encode_connect_headers(
            "198.51.100.7", 443, capture=CaptureKind.TRANSPARENT, identity=IDENTITY, conn_id="x", src_port=1234
        ),
    )
    events = server.receive_data(client.data_to_send())
    request = next(e for e in events if isinstance(e, h2.events.RequestReceived))
    decoded = decode_connect_headers(request.headers)
    assert (decoded.host, decoded.port, decoded.capture) == ("198.51.100.7", 443, CaptureKind.TRANSPARENT)
    server.send_headers(1, encode_reply_headers(EgressReply(403, reason="denied by default", rule="r1")))
    events = client.receive_data(server.data_to_send())
    response = next(e for e in events if isinstance(e, h2.events.ResponseReceived))
    assert decode_reply_headers(response.headers) == EgressReply(403, reason="denied by default", rule="r1")
    assert ALPN_EGRESS == "openshell-egress/1"


@given(st.text(max_size=80))
def test_authority_parser_only_raises_its_own_error(text: str) -> None:
    try:
        host, port = parse_authority(text)
    except EgressHeaderError:
        return
    assert 1 <= port <= 65535
    assert parse_authority(format_authority(host, port)) == (host, port)
