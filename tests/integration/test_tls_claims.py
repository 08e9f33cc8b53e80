"""Claim-bound mTLS over real sockets on 127.0.0.1 (supervisor/protocol/tls.py), from the attacker's side.

Each case runs one boundary-side server and one control-side client through ``trio.SSLStream``. A side
"links" only if its handshake succeeds, ``verify_peer`` accepts the peer, and one byte goes each way. In
TLS 1.3 the client's handshake finishes before the server has checked the client certificate, so a server
that refuses a client shows up on the client only as a failed exchange; the assertions say which side must
refuse, with what, and that the other side never gets a working link.
"""

from __future__ import annotations

import datetime
import socket
import ssl
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from supervisor.protocol.certs import Bundle, issue_bundle, load_bundle, make_ca
from supervisor.protocol.claims import CLAIM_FIELDS, Claims, Role
from supervisor.protocol.tls import (
    ALPN_API,
    ALPN_EGRESS,
    ALPN_OPS,
    PeerRejected,
    client_context,
    server_context,
    verify_peer,
)
from tests.certs_fixtures import SAMPLE_CLAIMS, differing, issue_pair, leaf_bundle

DEADLINE = 10


@dataclass
class Side:
    claims: Claims | None = None  # what verify_peer returned
    linked: bool = False  # a byte went each way after verify_peer
    error: BaseException | None = None

    def cause(self) -> str:
        """The error with its causes: trio wraps ssl.SSLError in BrokenResourceError."""
        parts, exc = [], self.error
        while exc is not None:
            parts.append(f"{type(exc).__name__}: {exc}")
            exc = exc.__cause__ or exc.__context__
        return " <- ".join(parts)


async def _exchange(stream: trio.SSLStream[trio.SocketStream], side: Side, bundle: Bundle, alpn: str | None) -> None:
    await stream.do_handshake()
    side.claims = verify_peer(stream, bundle, expected_alpn=alpn)
    await stream.send_all(b"!")
    if await stream.receive_some(1) != b"!":
        raise ConnectionError("peer closed the link")
    side.linked = True


async def _run_side(stream: trio.SSLStream[trio.SocketStream], side: Side, bundle: Bundle, alpn: str | None) -> None:
    try:
        await _exchange(stream, side, bundle, alpn)
    except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError, PeerRejected) as exc:
        side.error = exc
    finally:
        await trio.aclose_forcefully(stream)


async def connect_pair(
    server: Bundle,
    client: Bundle,
    *,
    server_ctx: ssl.SSLContext | None = None,
    client_ctx: ssl.SSLContext | None = None,
    client_alpn: Sequence[str] = (ALPN_OPS,),
    server_expects: str | None = ALPN_OPS,
    client_expects: str | None = ALPN_OPS,
) -> tuple[Side, Side]:
    """Boundary-role ``server`` listens, control-role ``client`` dials; returns (server side, client side)."""
    sctx = server_ctx or server_context(server)
    cctx = client_ctx or client_context(client, client_alpn)
    s_side, c_side = Side(), Side()
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    async def serve() -> None:
        tcp = await listeners[0].accept()
        await _run_side(trio.SSLStream(tcp, sctx, server_side=True), s_side, server, server_expects)

    async def dial() -> None:
        tcp = await trio.open_tcp_stream("127.0.0.1", port)
        await _run_side(trio.SSLStream(tcp, cctx), c_side, client, client_expects)

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            nursery.start_soon(dial)
    await listeners[0].aclose()
    return s_side, c_side


def assert_rejected(side: Side, field: str) -> None:
    assert isinstance(side.error, PeerRejected), side.cause()
    assert side.error.field == field
    assert field in str(side.error)
    assert not side.linked


def assert_handshake_refused(side: Side, needle: str) -> None:
    assert isinstance(side.error, trio.BrokenResourceError), side.cause()
    assert side.claims is None and not side.linked
    assert needle in side.cause(), side.cause()


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Bundle, Bundle]:
    return issue_pair(tmp_path / "bundle")


# --- the good case ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpn", [ALPN_OPS, ALPN_EGRESS])
async def test_good_pair_links(pair: tuple[Bundle, Bundle], alpn: str) -> None:
    control, boundary = pair
    s, c = await connect_pair(boundary, control, client_alpn=[alpn], server_expects=alpn, client_expects=alpn)
    assert s.error is None and c.error is None, (s.cause(), c.cause())
    assert s.linked and c.linked
    assert s.claims == c.claims == SAMPLE_CLAIMS


def test_good_pair_with_blocking_stdlib_sockets(pair: tuple[Bundle, Bundle]) -> None:
    """verify_peer takes a plain ssl.SSLSocket too (what the benchmark and threaded callers use)."""
    control, boundary = pair
    listener = socket.create_server(("127.0.0.1", 0))
    result: dict[str, object] = {}

    def serve() -> None:
        conn, _ = listener.accept()
        with server_context(boundary).wrap_socket(conn, server_side=True) as tls:
            result["server"] = verify_peer(tls, boundary, expected_alpn=ALPN_EGRESS)
            tls.sendall(b"!")

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        raw = socket.create_connection(listener.getsockname(), timeout=DEADLINE)
        with client_context(control, [ALPN_EGRESS]).wrap_socket(raw) as tls:
            result["client"] = verify_peer(tls, control, expected_alpn=ALPN_EGRESS)
            assert tls.recv(1) == b"!"
    finally:
        thread.join(DEADLINE)
        listener.close()
    assert result == {"server": SAMPLE_CLAIMS, "client": SAMPLE_CLAIMS}


def test_contexts_are_tls13_only_and_require_certificates(pair: tuple[Bundle, Bundle]) -> None:
    control, boundary = pair
    for ctx in (server_context(boundary), client_context(control, [ALPN_OPS])):
        assert ctx.minimum_version == ctx.maximum_version == ssl.TLSVersion.TLSv1_3
        assert ctx.verify_mode == ssl.CERT_REQUIRED
        assert not ctx.check_hostname
        assert len(ctx.get_ca_certs()) == 1  # the sandbox CA only, never the system store


# --- wrong CA -----------------------------------------------------------------------------------------------


async def test_client_from_another_ca_refused_by_server(tmp_path: Path, pair: tuple[Bundle, Bundle]) -> None:
    _, boundary = pair
    # The attacker trusts the real CA (so it accepts the server) but holds a certificate from its own CA
    # with exactly the right claims and role.
    attacker = leaf_bundle(tmp_path / "att", make_ca(), Role.CONTROL)
    attacker = Bundle(
        Role.CONTROL, attacker.directory, boundary.ca_path, attacker.cert_path, attacker.key_path, SAMPLE_CLAIMS
    )
    s, c = await connect_pair(boundary, attacker)
    assert_handshake_refused(s, "certificate verify failed")
    assert not c.linked


async def test_server_from_another_ca_refused_by_client(tmp_path: Path, pair: tuple[Bundle, Bundle]) -> None:
    control, _ = pair
    attacker = leaf_bundle(tmp_path / "att", make_ca(), Role.BOUNDARY)
    attacker = Bundle(
        Role.BOUNDARY, attacker.directory, control.ca_path, attacker.cert_path, attacker.key_path, SAMPLE_CLAIMS
    )
    s, c = await connect_pair(attacker, control)
    assert_handshake_refused(c, "certificate verify failed")
    assert not s.linked


async def test_two_sandboxes_do_not_link(tmp_path: Path) -> None:
    control_a, _ = issue_pair(tmp_path / "a")
    _, boundary_b = issue_pair(tmp_path / "b")  # same claims, different CA
    s, c = await connect_pair(boundary_b, control_a)
    assert_handshake_refused(c, "certificate verify failed")
    assert not s.linked


# --- each claim, both directions ----------------------------------------------------------------------------


@pytest.mark.parametrize("field", CLAIM_FIELDS)
async def test_server_refuses_client_with_one_claim_differing(tmp_path: Path, field: str) -> None:
    ca = make_ca()
    boundary = leaf_bundle(tmp_path / "boundary", ca, Role.BOUNDARY)
    # Same CA, right role, one claim off; the client itself expects the real claims, so it accepts the server.
    control = leaf_bundle(
        tmp_path / "control", ca, Role.CONTROL, cert_claims=differing(SAMPLE_CLAIMS, field), expected=SAMPLE_CLAIMS
    )
    s, c = await connect_pair(boundary, control)
    assert_rejected(s, field)
    assert c.claims == SAMPLE_CLAIMS  # the client found nothing wrong with the server...
    assert not c.linked  # ...and still got no link


@pytest.mark.parametrize("field", CLAIM_FIELDS)
async def test_client_refuses_server_with_one_claim_differing(tmp_path: Path, field: str) -> None:
    ca = make_ca()
    boundary = leaf_bundle(
        tmp_path / "boundary", ca, Role.BOUNDARY, cert_claims=differing(SAMPLE_CLAIMS, field), expected=SAMPLE_CLAIMS
    )
    control = leaf_bundle(tmp_path / "control", ca, Role.CONTROL)
    s, c = await connect_pair(boundary, control)
    assert_rejected(c, field)
    assert s.claims == SAMPLE_CLAIMS
    assert not s.linked


async def test_first_differing_field_is_named(tmp_path: Path) -> None:
    ca = make_ca()
    boundary = leaf_bundle(tmp_path / "boundary", ca, Role.BOUNDARY)
    wrong = differing(differing(SAMPLE_CLAIMS, "policy_resource"), "network_policy")
    control = leaf_bundle(tmp_path / "control", ca, Role.CONTROL, cert_claims=wrong, expected=SAMPLE_CLAIMS)
    s, _ = await connect_pair(boundary, control)
    assert_rejected(s, "network_policy")


# --- role -----------------------------------------------------------------------------------------------------


async def test_boundary_cert_cannot_act_as_control(pair: tuple[Bundle, Bundle]) -> None:
    """A boundary key (e.g. stolen by the agent) dialled in as if it were control."""
    _, boundary = pair
    impostor = Bundle(
        Role.CONTROL, boundary.directory, boundary.ca_path, boundary.cert_path, boundary.key_path, boundary.claims
    )
    s, c = await connect_pair(boundary, impostor)
    assert_rejected(s, "role")
    assert not c.linked


async def test_control_cert_cannot_act_as_boundary(pair: tuple[Bundle, Bundle]) -> None:
    """Something listening with control's key where the boundary should be."""
    control, _ = pair
    impostor = Bundle(
        Role.BOUNDARY, control.directory, control.ca_path, control.cert_path, control.key_path, control.claims
    )
    s, c = await connect_pair(impostor, control)
    assert_rejected(c, "role")
    assert not s.linked


# --- validity dates -------------------------------------------------------------------------------------------

_REAL_NOW = datetime.datetime.now(datetime.UTC)
_PAST = _REAL_NOW - datetime.timedelta(days=40)  # + 30 days validity: expired 10 days ago
_FUTURE = _REAL_NOW + datetime.timedelta(days=2)  # not-before is 5 minutes before that


@pytest.mark.parametrize(("when", "needle"), [(_PAST, "expired"), (_FUTURE, "not yet valid")])
async def test_client_cert_outside_validity_refused(tmp_path: Path, when: datetime.datetime, needle: str) -> None:
    ca = make_ca(now=_REAL_NOW - datetime.timedelta(days=60), validity=datetime.timedelta(days=120))
    boundary = leaf_bundle(tmp_path / "boundary", ca, Role.BOUNDARY)
    control = leaf_bundle(tmp_path / "control", ca, Role.CONTROL, now=when)
    s, c = await connect_pair(boundary, control)
    assert_handshake_refused(s, needle)
    assert not c.linked


@pytest.mark.parametrize(("when", "needle"), [(_PAST, "expired"), (_FUTURE, "not yet valid")])
async def test_server_cert_outside_validity_refused(tmp_path: Path, when: datetime.datetime, needle: str) -> None:
    ca = make_ca(now=_REAL_NOW - datetime.timedelta(days=60), validity=datetime.timedelta(days=120))
    boundary = leaf_bundle(tmp_path / "boundary", ca, Role.BOUNDARY, now=when)
    control = leaf_bundle(tmp_path / "control", ca, Role.CONTROL)
    s, c = await connect_pair(boundary, control)
    assert_handshake_refused(c, needle)
    assert not s.linked


@pytest.mark.parametrize(("when", "needle"), [(_PAST, "expired"), (_FUTURE, "not yet valid")])
async def test_whole_bundle_outside_validity_refused(tmp_path: Path, when: datetime.datetime, needle: str) -> None:
    control, boundary = issue_pair(tmp_path / "bundle", now=when)  # load_bundle does not check dates
    s, c = await connect_pair(boundary, control)
    assert_handshake_refused(c, needle)
    assert not s.linked


# --- defence in depth: verify_peer re-checks what a misconfigured context would let through ------------------


async def test_verify_peer_catches_a_foreign_cert_when_the_context_does_not(
    tmp_path: Path, pair: tuple[Bundle, Bundle]
) -> None:
    control, _ = pair
    attacker = leaf_bundle(tmp_path / "att", make_ca(), Role.BOUNDARY)  # right claims and role, own CA
    sloppy = client_context(control, [ALPN_OPS])
    sloppy.verify_mode = ssl.CERT_NONE  # a mistake in some future caller
    s, c = await connect_pair(attacker, control, client_ctx=sloppy)
    assert_rejected(c, "certificate")
    assert "not issued by this sandbox's CA" in str(c.error)
    assert not s.linked


async def test_verify_peer_requires_a_client_certificate(pair: tuple[Bundle, Bundle]) -> None:
    control, boundary = pair
    sloppy = server_context(boundary)
    sloppy.verify_mode = ssl.CERT_NONE  # server then never asks for a client certificate
    s, c = await connect_pair(boundary, control, server_ctx=sloppy)
    assert_rejected(s, "certificate")
    assert not c.linked


# --- ALPN -----------------------------------------------------------------------------------------------------


async def test_no_alpn_offered_refused(pair: tuple[Bundle, Bundle]) -> None:
    control, boundary = pair
    s, c = await connect_pair(boundary, control, client_alpn=())
    assert_rejected(s, "alpn")
    assert_rejected(c, "alpn")


async def test_unknown_alpn_offered_refused(pair: tuple[Bundle, Bundle]) -> None:
    control, boundary = pair
    s, c = await connect_pair(boundary, control, client_alpn=["h2", "http/1.1"])
    assert_rejected(s, "alpn")
    assert_rejected(c, "alpn")


async def test_other_link_kind_refused_where_one_is_expected(pair: tuple[Bundle, Bundle]) -> None:
    control, boundary = pair
    s, c = await connect_pair(
        boundary, control, client_alpn=[ALPN_EGRESS], server_expects=ALPN_OPS, client_expects=None
    )
    assert_rejected(s, "alpn")
    assert "openshell-egress/1" in str(s.error)
    assert not c.linked


# --- protocol downgrade and non-TLS traffic -----------------------------------------------------------------


async def test_tls12_only_client_refused(pair: tuple[Bundle, Bundle]) -> None:
    control, boundary = pair
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.check_hostname = False
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    old.load_verify_locations(cafile=str(control.ca_path))
    old.load_cert_chain(str(control.cert_path), str(control.key_path))
    old.set_alpn_protocols([ALPN_OPS])
    s, c = await connect_pair(boundary, control, client_ctx=old)
    assert_handshake_refused(s, "unsupported protocol")
    assert_handshake_refused(c, "SSL")  # an alert or, as trio does not flush it, EOF


@pytest.mark.parametrize(
    "payload",
    [
        b"",  # plain TCP: connect and close
        b"GET / HTTP/1.1\r\nHost: boundary\r\n\r\n",
        b"CONNECT example.com:443 HTTP/1.1\r\n\r\n",
        bytes(range(256)) * 4,
        b"\x16\x03\x01\x00\x05\x01\x00\x00\x01\x00",  # a handshake record that says nothing
        b"\x16\x03\x01\xff\xff" + b"\x00" * 64,  # a record that promises more than it sends
    ],
    ids=["plain-tcp", "http-get", "http-connect", "garbage", "tiny-hello", "short-record"],
)
async def test_non_tls_traffic_fails_the_handshake_cleanly(pair: tuple[Bundle, Bundle], payload: bytes) -> None:
    _, boundary = pair
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    server = Side()
    reply = bytearray()

    async def serve() -> None:
        tcp = await listeners[0].accept()
        await _run_side(trio.SSLStream(tcp, server_context(boundary), server_side=True), server, boundary, ALPN_OPS)

    async def attack() -> None:
        tcp = await trio.open_tcp_stream("127.0.0.1", port)
        try:
            if payload:
                await tcp.send_all(payload)
            await tcp.send_eof()
            while chunk := await tcp.receive_some(65536):
                reply.extend(chunk)
        except trio.BrokenResourceError:
            pass  # reset by the server: also a clean refusal
        finally:
            await tcp.aclose()

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            nursery.start_soon(attack)
    await listeners[0].aclose()
    assert isinstance(server.error, trio.BrokenResourceError), server.cause()
    assert server.claims is None and not server.linked
    # Whatever came back is a TLS alert record at most; never an HTTP answer or application data.
    assert not reply or reply[0] == 0x15, bytes(reply[:40])


# --- the operator role: accepted by control's TCP API only, never on a link ----------------------------------


@pytest.mark.parametrize("alpn", [ALPN_OPS, ALPN_EGRESS])
async def test_operator_cert_refused_on_the_boundarys_link_port(tmp_path: Path, alpn: str) -> None:
    """A leaked operator certificate of this very sandbox dials the boundary as if it were control."""
    issue_bundle(tmp_path / "b", SAMPLE_CLAIMS, operator=True)
    boundary = load_bundle(tmp_path / "b" / "boundary", Role.BOUNDARY)
    operator = load_bundle(tmp_path / "b" / "operator", Role.OPERATOR)
    dialler = Bundle(Role.CONTROL, operator.directory, operator.ca_path, operator.cert_path, operator.key_path,
                     operator.claims)  # fmt: skip
    s, c = await connect_pair(boundary, dialler, client_alpn=[alpn], server_expects=alpn, client_expects=alpn)
    assert_rejected(s, "role")
    assert "expected 'control', got 'operator'" in str(s.error)
    assert not c.linked


async def test_operator_cert_refused_where_control_dials(tmp_path: Path) -> None:
    """Something listening with an operator key where the boundary should be: control refuses it."""
    issue_bundle(tmp_path / "b", SAMPLE_CLAIMS, operator=True)
    control = load_bundle(tmp_path / "b" / "control", Role.CONTROL)
    operator = load_bundle(tmp_path / "b" / "operator", Role.OPERATOR)
    listener = Bundle(Role.BOUNDARY, operator.directory, operator.ca_path, operator.cert_path, operator.key_path,
                      operator.claims)  # fmt: skip
    s, c = await connect_pair(listener, control)
    assert_rejected(c, "role")
    assert not s.linked


async def test_operator_cert_accepted_only_when_asked_for(tmp_path: Path) -> None:
    """control's API asks for the operator role explicitly; the default (a link's) would refuse it."""
    issue_bundle(tmp_path / "b", SAMPLE_CLAIMS, operator=True)
    control = load_bundle(tmp_path / "b" / "control", Role.CONTROL)
    operator = load_bundle(tmp_path / "b" / "operator", Role.OPERATOR)
    server_ctx = server_context(control, [ALPN_API])
    client_ctx = client_context(operator, [ALPN_API])
    seen: list[Claims] = []
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    async def serve() -> None:
        tls = trio.SSLStream(await listeners[0].accept(), server_ctx, server_side=True)
        await tls.do_handshake()
        with pytest.raises(PeerRejected, match="role"):
            verify_peer(tls, control, expected_alpn=ALPN_API)
        seen.append(verify_peer(tls, control, expected_alpn=ALPN_API, expected_role=Role.OPERATOR))
        await trio.aclose_forcefully(tls)

    async def dial() -> None:
        tls = trio.SSLStream(await trio.open_tcp_stream("127.0.0.1", port), client_ctx)
        await tls.do_handshake()
        seen.append(verify_peer(tls, operator, expected_alpn=ALPN_API, expected_role=Role.CONTROL))
        try:
            data = await tls.receive_some(1)
        except trio.BrokenResourceError:
            data = b""
        assert data == b""

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            nursery.start_soon(dial)
    await listeners[0].aclose()
    assert seen == [SAMPLE_CLAIMS, SAMPLE_CLAIMS]
