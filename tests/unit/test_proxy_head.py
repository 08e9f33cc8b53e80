"""The proxy listener's head parser and response catalogue, from the client's side."""

from __future__ import annotations

import base64
import json

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.protocol.egress import CaptureKind, EgressReply
from supervisor.protocol.proxy_head import (
    CONNECT_ESTABLISHED,
    HEAD_READ_DEADLINE_S,
    MAX_HEAD_BYTES,
    ForwardBody,
    ProxyReject,
    ProxyTarget,
    Refusal,
    parse_head,
    proxy_environment,
    proxy_token_matches,
    proxy_url,
    render_denied,
    render_proxy_auth_required,
    render_reply,
    render_response,
    render_unavailable,
)
from supervisor.protocol.responses import ErrorCode


def parse_response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Read a rendered response back with h11, as a client would."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(raw)
    conn.receive_data(b"")
    response = conn.next_event()
    assert isinstance(response, h11.Response)
    body = b""
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Data):
            body += event.data
        else:
            break
    headers = {k.decode(): v.decode() for k, v in response.headers}
    return response.status_code, headers, body


CONNECT_OK = [
    (b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", ("example.com", 443)),
    (b"CONNECT Example.COM:443 HTTP/1.1\r\nHost: x\r\n\r\n", ("example.com", 443)),
    (b"CONNECT [2001:db8::1]:8443 HTTP/1.1\r\nHost: [2001:db8::1]:8443\r\n\r\n", ("2001:db8::1", 8443)),
    (b"CONNECT 198.51.100.7:22 HTTP/1.0\r\n\r\n", ("198.51.100.7", 22)),
    (
        b"CONNECT a.b:1 HTTP/1.1\r\nHost: a.b:1\r\nUser-Agent: curl/8\r\nProxy-Connection: Keep-Alive\r\n\r\n",
        ("a.b", 1),
    ),
]


@pytest.mark.parametrize(("head", "expected"), CONNECT_OK)
def test_connect_targets(head: bytes, expected: tuple[str, int]) -> None:
    result = parse_head(head + b"\x16\x03\x01early")
    assert isinstance(result, ProxyTarget)
    assert (result.host, result.port, result.kind) == (*expected, CaptureKind.CONNECT)
    assert result.request_head is None
    assert result.leftover == b"\x16\x03\x01early"  # early tunnel bytes are kept, not lost


CONNECT_BAD = [
    b"CONNECT example.com HTTP/1.1\r\nHost: x\r\n\r\n",  # no port
    b"CONNECT example.com:0 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"CONNECT example.com:99999 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"CONNECT 2001:db8::1:443 HTTP/1.1\r\nHost: x\r\n\r\n",  # unbracketed IPv6
    b"CONNECT [2001:db8::1] HTTP/1.1\r\nHost: x\r\n\r\n",
    b"CONNECT user:pw@example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"CONNECT example.com:80:x HTTP/1.1\r\nHost: x\r\n\r\n",
    b"CONNECT " + b"a" * 256 + b":443 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"CONNECT http://example.com:443/ HTTP/1.1\r\nHost: x\r\n\r\n",
    b"CONNECT example.com:443 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
]


@pytest.mark.parametrize("head", CONNECT_BAD)
def test_connect_bad_authority_is_400_invalid_connect_target(head: bytes) -> None:
    result = parse_head(head)
    assert isinstance(result, ProxyReject)
    assert (result.status, result.error_code) == (400, "invalid_connect_target")
    status, headers, body = parse_response(result.render())
    assert status == 400
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    assert json.loads(body)["error"] == "invalid_connect_target"


MALFORMED = [
    b"CONNECT example.com:443 HTTP/1.1\nHost: x\n\n\r\n\r\n",  # bare LF
    b"CONNECT example.com:443 HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\n\r\n",  # obs-fold
    b"CONNECT example.com:443 HTTP/1.1\r\nHost : x\r\n\r\n",  # space before colon
    b"CONNECT example.com:443 HTTP/1.1\r\nHost: x\r\nX: a\x01b\r\n\r\n",  # control byte
    b"CONNECT example.com:443 HTTP/1.1\r\nHost: x\r\nX: \xff\r\n\r\n",  # not UTF-8
    b"CONNECT  example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n",  # double space
    b"CONNECT example.com:443 HTTP/2.0\r\nHost: x\r\n\r\n",
    b"CONNECT example.com:443 HTTP/1.1\r\n\r\n",  # HTTP/1.1 without Host
    b"GET http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"GET http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    b"GET http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
    b"GET http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
    b"GET http://a/ HTTP/1.1\r\nHost: a\r\nConnection: close, host\r\n\r\n",
    b"GET http://a/ HTTP/1.1\r\nHost: a\r\nConnection: content-length\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",  # origin-form to a proxy
    b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET http:///path HTTP/1.1\r\nHost: a\r\n\r\n",  # empty host
    b"GET http://a.b/ HTTP/1.1\r\nHost: a.b\r\nHost: internal\r\n\r\n",  # two Host headers
]


@pytest.mark.parametrize("head", MALFORMED)
def test_malformed_head_is_plain_400(head: bytes) -> None:
    result = parse_head(head)
    assert isinstance(result, ProxyReject)
    assert result.status == 400
    assert result.error_code is None
    status, headers, body = parse_response(result.render())
    assert (status, body, headers["content-length"]) == (400, b"", "0")


def test_incomplete_head_asks_for_more() -> None:
    assert parse_head(b"") is None
    assert parse_head(b"CONNECT example.com:443 HTTP/1.1\r\nHost: ex") is None
    assert parse_head(b"CONNECT example.com:443 HTTP/1.1\r") is None


def test_garbage_is_refused_without_waiting_for_the_deadline() -> None:
    tls_client_hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"
    for partial in (tls_client_hello, b"GET / HTTP/1.1\nHost", b"GET /\x00", b"\r\n"):
        result = parse_head(partial)
        assert isinstance(result, ProxyReject) and result.status == 400, partial
    assert HEAD_READ_DEADLINE_S > 0


def test_head_size_limit_is_431() -> None:
    header = b"X-Filler: " + b"a" * 200 + b"\r\n"
    huge = b"CONNECT example.com:443 HTTP/1.1\r\nHost: x\r\n" + header * 50
    assert len(huge) > MAX_HEAD_BYTES
    for data in (huge, huge + b"\r\n"):  # never-ending and complete-but-too-large
        result = parse_head(data)
        assert isinstance(result, ProxyReject) and result.status == 431
        status, _, body = parse_response(result.render())
        assert (status, body) == (431, b"")
    # one byte under the limit still parses
    base = b"CONNECT example.com:443 HTTP/1.1\r\nHost: x\r\nX: "
    fitting = base + b"a" * (MAX_HEAD_BYTES - len(base) - 4) + b"\r\n\r\n"
    assert len(fitting) == MAX_HEAD_BYTES
    assert isinstance(parse_head(fitting), ProxyTarget)


FORWARD_OK = [
    (
        b"GET http://example.com/a/b?q=1 HTTP/1.1\r\nHost: example.com\r\n\r\n",
        ("example.com", 80, "/a/b?q=1", "GET example.com:80/a/b"),
    ),
    (b"GET http://Example.com:8080 HTTP/1.1\r\nHost: e\r\n\r\n", ("example.com", 8080, "/", None)),
    (b"GET http://example.com?x=1 HTTP/1.1\r\nHost: e\r\n\r\n", ("example.com", 80, "/?x=1", None)),
    (
        b"POST http://[2001:db8::5]:81/p HTTP/1.1\r\nHost: e\r\nContent-Length: 0\r\n\r\n",
        ("2001:db8::5", 81, "/p", "POST [2001:db8::5]:81/p"),
    ),
    (b"HEAD HTTP://a.b/ HTTP/1.0\r\n\r\n", ("a.b", 80, "/", None)),
]


@pytest.mark.parametrize(("head", "expected"), FORWARD_OK)
def test_forward_targets(head: bytes, expected: tuple[str, int, str, str | None]) -> None:
    result = parse_head(head)
    assert isinstance(result, ProxyTarget)
    assert result.kind is CaptureKind.HTTP_FORWARD
    assert (result.host, result.port, result.path) == expected[:3]
    if expected[3] is not None:
        assert result.describe() == expected[3]
    assert result.request_head is not None


def test_forward_rewrites_to_origin_form_and_drops_hop_headers() -> None:
    head = (
        b"GET http://Example.com:8080/x?y=1 HTTP/1.1\r\n"
        b"Host: evil.example\r\n"
        b"Proxy-Authorization: Basic c2VjcmV0\r\n"
        b"Proxy-Connection: keep-alive\r\n"
        b"Connection: keep-alive, X-Secret-Hop\r\n"
        b"X-Secret-Hop: 1\r\n"
        b"Upgrade: h2c\r\n"
        b"User-Agent: curl/8.5\r\n"
        b"Accept: */*\r\n\r\n"
    )
    result = parse_head(head)
    assert isinstance(result, ProxyTarget) and result.request_head is not None
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(result.request_head)
    request = conn.next_event()
    assert isinstance(request, h11.Request)
    assert request.target == b"/x?y=1"
    headers = [(k.decode(), v.decode()) for k, v in request.headers]
    names = [k for k, _ in headers]
    assert [v for k, v in headers if k == "host"] == ["example.com:8080"]
    for dropped in ("proxy-authorization", "proxy-connection", "x-secret-hop", "upgrade"):
        assert dropped not in names
    assert ("connection", "close") in headers
    assert ("via", "1.1 openshell-sandbox") in headers
    assert ("user-agent", "curl/8.5") in headers
    assert b"User-Agent: curl/8.5" in result.request_head  # original case kept


def test_forward_keeps_an_existing_via_and_omits_port_80() -> None:
    result = parse_head(b"GET http://a.b/ HTTP/1.1\r\nHost: a.b\r\nVia: 1.1 corp\r\n\r\n")
    assert isinstance(result, ProxyTarget) and result.request_head is not None
    assert b"\r\nHost: a.b\r\n" in result.request_head
    assert result.request_head.count(b"Via:") == 1


def test_forward_websocket_upgrade_survives() -> None:
    head = b"GET http://a.b/ws HTTP/1.1\r\nHost: a.b\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
    result = parse_head(head)
    assert isinstance(result, ProxyTarget) and result.request_head is not None
    assert b"Connection: Upgrade\r\nUpgrade: websocket\r\n" in result.request_head
    assert b"Connection: close" not in result.request_head


FORWARD_REJECT = [
    (b"GET https://a.b/ HTTP/1.1\r\nHost: a\r\n\r\n", None, "Use CONNECT for HTTPS URLs"),
    (b"GET ftp://a.b/ HTTP/1.1\r\nHost: a\r\n\r\n", "unsupported_proxy_scheme", None),
    (b"GET http://a.b/#frag HTTP/1.1\r\nHost: a\r\n\r\n", "invalid_request_target", None),
    (b"GET http://u:p@a.b/ HTTP/1.1\r\nHost: a\r\n\r\n", "invalid_request_target", None),
    (b"GET http://2001:db8::1/ HTTP/1.1\r\nHost: a\r\n\r\n", "invalid_request_target", None),
    (b"GET http://a.b:0/ HTTP/1.1\r\nHost: a\r\n\r\n", "invalid_request_target", None),
]


@pytest.mark.parametrize(("head", "code", "text"), FORWARD_REJECT)
def test_forward_rejects(head: bytes, code: str | None, text: str | None) -> None:
    result = parse_head(head)
    assert isinstance(result, ProxyReject) and result.status == 400
    assert result.error_code == code
    _, _, body = parse_response(result.render())
    if text is not None:
        assert body.decode() == text
    else:
        assert json.loads(body)["error"] == code


def test_forward_body_passes_one_request_and_drops_the_pipelined_next() -> None:
    head = b"POST http://a.b/up HTTP/1.1\r\nHost: a.b\r\nContent-Length: 5\r\n\r\n"
    smuggled = b"GET http://internal/ HTTP/1.1\r\nHost: internal\r\n\r\n"
    result = parse_head(head + b"hel")
    assert isinstance(result, ProxyTarget)
    body = result.body()
    assert body.feed(result.leftover) == b"hel"
    assert not body.done
    assert body.feed(b"lo" + smuggled) == b"lo"
    assert body.done
    assert body.feed(b"more") == b""


def test_forward_chunked_body_is_reframed_identically() -> None:
    head = b"POST http://a.b/ HTTP/1.1\r\nHost: a.b\r\nTransfer-Encoding: chunked\r\n\r\n"
    result = parse_head(head)
    assert isinstance(result, ProxyTarget) and result.chunked
    body = result.body()
    out = body.feed(b"3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\nTrailer: x\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n")
    assert body.done
    server = h11.Connection(h11.SERVER)
    assert result.request_head is not None
    server.receive_data(result.request_head + out)
    assert isinstance(server.next_event(), h11.Request)
    data = b""
    while not isinstance(event := server.next_event(), h11.EndOfMessage):
        assert isinstance(event, h11.Data)
        data += event.data
    assert data == b"abcde"
    assert server.next_event() is h11.NEED_DATA
    assert server.trailing_data == (b"", False)  # nothing after the first request was passed on


def test_forward_body_without_body_is_done_at_once() -> None:
    assert ForwardBody(chunked=False, content_length=0).done
    with pytest.raises(ValueError):
        ForwardBody(chunked=True, content_length=0).feed(b"zz\r\n")


def test_denied_body_shape() -> None:
    target = ProxyTarget("example.com", 443, CaptureKind.CONNECT, None)
    status, headers, body = parse_response(render_denied(target, reason="no matching rule", rule="r1"))
    assert status == 403
    assert headers["content-type"] == "application/json"
    assert int(headers["content-length"]) == len(body)
    assert json.loads(body) == {
        "error": "policy_denied",
        "detail": "CONNECT example.com:443 not permitted by policy",
        "host": "example.com",
        "port": 443,
        "reason": "no matching rule",
        "rule": "r1",
    }
    _, _, body = parse_response(render_denied(target, reason="r"))
    assert "rule" not in json.loads(body)


def test_forward_denied_detail_has_no_query() -> None:
    result = parse_head(b"GET http://a.b/p?token=secret HTTP/1.1\r\nHost: a\r\n\r\n")
    assert isinstance(result, ProxyTarget)
    _, _, body = parse_response(render_denied(result, reason="x"))
    assert json.loads(body)["detail"] == "GET a.b:80/p not permitted by policy"
    assert b"secret" not in body


REPLIES = [
    (EgressReply(403, reason="binary not allowed", rule="gh"), 403, "policy_denied"),
    (EgressReply(502, reason="upstream-refused"), 502, "upstream_unreachable"),
    (EgressReply(503, reason="dns-failure"), 503, "egress_unavailable"),
    (EgressReply(504, reason="connect-timeout"), 504, "upstream_timeout"),
    (EgressReply(400, reason="bad"), 400, "invalid_request"),
    (EgressReply(500, reason="bug"), 500, "internal_error"),
]


@pytest.mark.parametrize(("reply", "status", "code"), REPLIES)
def test_render_reply(reply: EgressReply, status: int, code: str) -> None:
    target = ProxyTarget("2001:db8::1", 443, CaptureKind.CONNECT, None)
    got_status, _, body = parse_response(render_reply(target, reply))
    assert (got_status, json.loads(body)["error"]) == (status, code)
    if status in (403, 502, 503, 504):
        assert json.loads(body)["reason"] == reply.reason


def test_render_reply_allow() -> None:
    connect = ProxyTarget("a.b", 443, CaptureKind.CONNECT, None)
    forward = ProxyTarget("a.b", 80, CaptureKind.HTTP_FORWARD, b"GET / HTTP/1.1\r\n\r\n", method="GET", path="/")
    assert render_reply(connect, EgressReply(200)) == CONNECT_ESTABLISHED
    assert render_reply(forward, EgressReply(200)) == b""
    assert CONNECT_ESTABLISHED == b"HTTP/1.1 200 Connection Established\r\n\r\n"
    status, _, body = parse_response(render_unavailable(connect))
    assert status == 503 and json.loads(body)["reason"] == "no egress link"


def test_proxy_environment() -> None:
    env = proxy_environment()
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        assert env[name] == "http://127.0.0.1:3128"
    assert env["NO_PROXY"] == env["no_proxy"] == "127.0.0.1,localhost,::1"


@settings(max_examples=300)
@given(st.binary(max_size=400))
def test_any_bytes_parse_or_reject(data: bytes) -> None:
    """Fuzz: any input yields a target, a rejection, or a request for more bytes — never an exception."""
    result = parse_head(data)
    assert result is None or isinstance(result, ProxyTarget | ProxyReject)
    if isinstance(result, ProxyReject):
        assert result.render().startswith(b"HTTP/1.1 4")


@settings(max_examples=200)
@given(st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=60))
def test_any_connect_target_parses_or_rejects(target: str) -> None:
    result = parse_head(f"CONNECT {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert result is not None
    if isinstance(result, ProxyTarget):
        assert 1 <= result.port <= 65535
        assert "@" not in result.host


# --- the proxy token (control's proxy-pod listener) -----------------------------------------------------------

TOKEN = "t0ken-abcdefghijklmnop"


def _with_auth(*values: bytes) -> ProxyTarget:
    head = b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n"
    head += b"".join(b"Proxy-Authorization: " + v + b"\r\n" for v in values)
    parsed = parse_head(head + b"\r\n")
    assert isinstance(parsed, ProxyTarget)
    return parsed


def _basic(text: str) -> bytes:
    return b"Basic " + base64.b64encode(text.encode())


def test_proxy_token_matches_only_exactly_one_right_credential() -> None:
    assert proxy_token_matches(_with_auth(_basic(f"sandbox:{TOKEN}")), TOKEN)
    assert proxy_token_matches(_with_auth(b"basic  " + base64.b64encode(f"sandbox:{TOKEN}".encode())), TOKEN)
    assert not proxy_token_matches(_with_auth(), TOKEN)
    assert not proxy_token_matches(_with_auth(_basic(f"sandbox:{TOKEN}x")), TOKEN)
    assert not proxy_token_matches(_with_auth(_basic(f"other:{TOKEN}")), TOKEN)
    assert not proxy_token_matches(_with_auth(_basic("sandbox:another-sandbox-token")), TOKEN)
    assert not proxy_token_matches(_with_auth(b"Bearer " + TOKEN.encode()), TOKEN)
    assert not proxy_token_matches(_with_auth(b"Basic !!notbase64"), TOKEN)
    # two credentials (one right, one wrong): ambiguous, refused
    assert not proxy_token_matches(_with_auth(_basic(f"sandbox:{TOKEN}"), _basic("sandbox:x")), TOKEN)


def test_proxy_authorization_is_never_forwarded() -> None:
    head = (
        b"GET http://h.example/ HTTP/1.1\r\nHost: h.example\r\nProxy-Authorization: "
        + _basic(f"sandbox:{TOKEN}")
        + b"\r\n\r\n"
    )
    parsed = parse_head(head)
    assert isinstance(parsed, ProxyTarget) and parsed.request_head is not None
    assert b"proxy-authorization" not in parsed.request_head.lower()
    assert proxy_token_matches(parsed, TOKEN)


def test_407_carries_the_challenge() -> None:
    status, headers, body = parse_response(render_proxy_auth_required())
    assert status == 407
    assert headers["proxy-authenticate"] == 'Basic realm="openshell-sandbox"'
    assert json.loads(body)["error"] == "proxy_auth_required"


def test_proxy_url() -> None:
    assert proxy_url("10.0.0.1", 3128, TOKEN) == f"http://sandbox:{TOKEN}@10.0.0.1:3128"
    assert proxy_url("::1", 3128) == "http://[::1]:3128"


def test_a_refusal_body_leaves_out_absent_fields_and_sorts_its_keys() -> None:
    full = Refusal(ErrorCode.POLICY_DENIED, "no", host="example.com", port=443, reason="r", rule="x")
    assert full.to_wire() == {"error": "policy_denied", "detail": "no", "host": "example.com", "port": 443,
                              "reason": "r", "rule": "x"}  # fmt: skip
    response = render_response(403, Refusal(ErrorCode.SSRF_DENIED, host="10.0.0.1"))
    assert response.endswith(b'\r\n\r\n{"error":"ssrf_denied","host":"10.0.0.1"}')
