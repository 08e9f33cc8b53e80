"""``inspect`` end to end on loopback, from the attacker's side: a real TLS client (stdlib ``ssl`` +
``http.client``, or raw bytes) in a thread plays the agent and trusts only the sandbox CA; a real HTTPS origin
(trustme certificate, h11) records every request it receives, so "the secret never left" and "nothing reached
the other host" are asserted where it matters: at the upstream.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import io
import json
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11
import pytest
import trio
import trustme

from supervisor.control.credentials import Credentials
from supervisor.control.l7 import InspectStats, InterceptionCA, Limits, inspect, upstream_context
from supervisor.control.policy import BinaryIdentity, Decision, L4Request, PolicyStore, compile_policy, load_policy_text
from supervisor.control.upstream import UpstreamError, UpstreamReason
from supervisor.jsonlog import JsonLog

SECRET = "ghp_REAL-secret-0123456789abcdef"
OTHER_SECRET = "other-REAL-secret-9876543210"
UNBOUND_SECRET = "unbound-REAL-secret-5555"
PLACEHOLDER = "openshell:resolve:env:GITHUB_TOKEN"
OTHER_PLACEHOLDER = "openshell:resolve:env:OTHER_TOKEN"
CURL = "/usr/bin/curl"

POLICY = """
version: 1
network_policies:
  api:
    endpoints:
      - host: api.test
        port: 443
        protocol: rest
        enforcement: enforce
        rules:
          - allow: {method: GET, path: "/**"}
          - allow: {method: POST, path: "/upload"}
      - host: other.test
        port: 443
        protocol: rest
        enforcement: enforce
        access: full
      - host: audit.test
        port: 443
        protocol: rest
        access: read-only
      - host: ws.test
        port: 443
        protocol: websocket
        enforcement: enforce
        access: read-only
      - host: chat.test
        port: 443
        protocol: websocket
        enforcement: enforce
        access: read-write
      - host: gqlws.test
        port: 443
        protocol: websocket
        enforcement: enforce
        rules:
          - allow: {method: GET, path: "/upgrade"}
          - allow: {operation_type: subscription}
          - allow: {operation_type: query}
        deny_rules:
          - {operation_type: "*", fields: [secret]}
      - host: open.test
        port: 443
      - host: plain.test
        port: 80
        protocol: rest
        enforcement: enforce
        access: read-write
    binaries: [{path: /usr/bin/curl}]
"""


# --- the origin -----------------------------------------------------------------------------------------------


@dataclass
class Seen:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Origin:
    """An HTTP(S) server on 127.0.0.1 that answers with what it saw and keeps connections alive."""

    ctx: ssl.SSLContext | None
    requests: list[Seen] = field(default_factory=list)
    upgraded: bytearray = field(default_factory=bytearray)  # every byte received after a 101
    connections: int = 0
    port: int = 0

    async def start(self, nursery: trio.Nursery) -> None:
        listeners = await nursery.start(trio.serve_tcp, self.handle, 0)
        self.port = listeners[0].socket.getsockname()[1]

    async def handle(self, tcp: trio.SocketStream) -> None:
        self.connections += 1
        stream: trio.abc.Stream = tcp
        if self.ctx is not None:
            stream = trio.SSLStream(tcp, self.ctx, server_side=True, https_compatible=True)
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request, body = await self._read(stream, conn)
                if request is None:
                    return
                seen = Seen(request.method.decode(), request.target.decode(),
                            {k.decode().lower(): v.decode() for k, v in request.headers}, body)  # fmt: skip
                self.requests.append(seen)
                if seen.target.startswith("/upgrade"):
                    await self._upgrade(stream, conn)
                    return
                await self._answer(stream, conn, seen)
                if conn.our_state is h11.MUST_CLOSE or seen.target == "/drop":  # /drop: close without notice
                    return
                conn.start_next_cycle()
        except (h11.RemoteProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            await trio.aclose_forcefully(stream)

    async def _read(self, stream: trio.abc.Stream, conn: h11.Connection) -> tuple[h11.Request | None, bytes]:
        request: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(65536))
                continue
            if isinstance(event, h11.Request):
                request = event
                if any(k == b"expect" for k, _ in event.headers):
                    await stream.send_all(conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return request, bytes(body)
            else:
                return None, b""

    async def _answer(self, stream: trio.abc.Stream, conn: h11.Connection, seen: Seen) -> None:
        if seen.target == "/split/":  # echo the key in a header and twice in a body, cut mid-secret
            key = seen.headers.get("x-api-key", "").encode()
            body = b"key=" + key + b";again=" + key
            half = len(b"key=") + len(key) // 2
            await stream.send_all(conn.send(h11.Response(status_code=200, headers=[
                ("x-echo", key), ("transfer-encoding", "chunked")])) or b"")  # fmt: skip
            for piece in (body[:half], body[half:]):
                await stream.send_all(conn.send(h11.Data(data=piece)) or b"")
                await trio.sleep(0.05)  # two reads at the proxy, not one
            await stream.send_all(conn.send(h11.EndOfMessage()) or b"")
            return
        if seen.target.startswith("/big/"):
            size = int(seen.target.split("/")[2])
            await stream.send_all(
                conn.send(
                    h11.Response(
                        status_code=200,
                        headers=[("content-length", str(size)), ("content-type", "application/octet-stream")],
                    )
                )
                or b""
            )
            chunk = b"x" * 65536
            left = size
            while left:
                piece = chunk[: min(left, len(chunk))]
                await stream.send_all(conn.send(h11.Data(data=piece)) or b"")
                left -= len(piece)
            await stream.send_all(conn.send(h11.EndOfMessage()) or b"")
            return
        payload = json.dumps({"method": seen.method, "target": seen.target, "headers": seen.headers,
                              "body_sha256": hashlib.sha256(seen.body).hexdigest(),
                              "body_len": len(seen.body)}).encode()  # fmt: skip
        await stream.send_all(
            conn.send(
                h11.Response(
                    status_code=200,
                    headers=[("content-type", "application/json"), ("content-length", str(len(payload)))],
                )
            )
            or b""
        )
        await stream.send_all(conn.send(h11.Data(data=payload)) or b"")
        await stream.send_all(conn.send(h11.EndOfMessage()) or b"")

    async def _upgrade(self, stream: trio.abc.Stream, conn: h11.Connection) -> None:
        await stream.send_all(conn.send(h11.InformationalResponse(status_code=101, headers=[
            ("connection", "upgrade"), ("upgrade", "websocket"),
            ("sec-websocket-accept", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")])) or b"")  # fmt: skip
        pending = conn.trailing_data[0]
        if pending:
            self.upgraded += pending
            await stream.send_all(b"echo:" + pending)
        while True:
            data = await stream.receive_some(65536)
            if not data:
                return
            self.upgraded += data
            await stream.send_all(b"echo:" + data)


# --- the agent (runs in a thread) ---------------------------------------------------------------------------------


def agent_socket(port: int, ca_pem: str | None, server_hostname: str = "api.test") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    if ca_pem is None:
        return sock
    ctx = ssl.create_default_context(cadata=ca_pem)  # trusts the sandbox CA only
    ctx.set_alpn_protocols(["h2", "http/1.1"])  # control must push it to http/1.1
    return ctx.wrap_socket(sock, server_hostname=server_hostname)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def http_requests(sock: socket.socket, host: str, calls: list[tuple[str, str, dict[str, str], bytes | None]]
                  ) -> list[Reply]:  # fmt: skip
    conn = http.client.HTTPSConnection(host, 443) if isinstance(sock, ssl.SSLSocket) else (
        http.client.HTTPConnection(host, 80))  # fmt: skip
    conn.sock = sock
    out = []
    for method, path, headers, body in calls:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        out.append(Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()))
        if response.getheader("connection", "").lower() == "close":
            break
    conn.close()
    return out


def raw_exchange(sock: socket.socket, data: bytes, wait: float = 3.0) -> bytes:
    """Send ``data``; return everything received until the server closes (or ``wait`` passes quietly)."""
    sock.sendall(data)
    sock.settimeout(wait)
    out = bytearray()
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            out += chunk
    except (TimeoutError, ConnectionResetError, ssl.SSLError):
        pass
    sock.close()
    return bytes(out)


# --- harness ----------------------------------------------------------------------------------------------------


@dataclass
class Env:
    tls_origin: Origin
    plain_origin: Origin
    ca: InterceptionCA
    trustme_ca: trustme.CA
    store: PolicyStore
    credentials: Credentials
    log: io.StringIO

    def events(self, name: str = "http") -> list[dict[str, Any]]:
        return [e for e in map(json.loads, self.log.getvalue().splitlines()) if e["event"] == name]

    def upstream_ssl(self) -> ssl.SSLContext:
        return upstream_context(extra_ca_pem=self.trustme_ca.cert_pem.bytes().decode(), system_trust=False)

    def l4(self, host: str, port: int = 443) -> Decision:
        decision = self.store.snapshot().decide_l4(L4Request(host, port, BinaryIdentity(CURL, None)))
        assert decision.allowed
        return decision

    async def run(
        self,
        client: Callable[[int], Any],
        *,
        host: str = "api.test",
        port: int = 443,
        tls: bool | None = None,
        upstream_ssl: ssl.SSLContext | None = None,
        connect: Callable[[], Awaitable[trio.abc.HalfCloseableStream]] | None = None,
        is_current: Callable[[int], bool] | None = None,
        idle_timeout: float = 10,
    ) -> tuple[Any, InspectStats]:
        origin = self.tls_origin if port == 443 else self.plain_origin

        async def dial() -> trio.abc.HalfCloseableStream:
            return await trio.open_tcp_stream("127.0.0.1", origin.port)

        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        agent_port = listeners[0].socket.getsockname()[1]
        result: dict[str, Any] = {}

        async def run_client() -> None:
            result["value"] = await trio.to_thread.run_sync(client, agent_port)

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run_client)
                stream = await listeners[0].accept()
                await listeners[0].aclose()
                stats = await inspect(
                    stream, host=host, port=port, tls=tls, snapshot=self.store.snapshot(), l4=self.l4(host, port),
                    connect_upstream=connect or dial, ca=self.ca, credentials=self.credentials,
                    upstream_ssl=upstream_ssl or self.upstream_ssl(),
                    log=JsonLog("control", stream=self.log), event_fields={"conn_id": "c1", "binary": CURL},
                    is_current=is_current, limits=Limits(idle_timeout=idle_timeout, drain_timeout=0.2),
                )  # fmt: skip
        assert SECRET not in self.log.getvalue() and OTHER_SECRET not in self.log.getvalue()
        return result["value"], stats


@pytest.fixture
async def env(nursery: trio.Nursery) -> Env:
    authority = trustme.CA()
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    names = ("api.test", "other.test", "audit.test", "ws.test", "chat.test", "open.test", "gqlws.test")
    authority.issue_cert(*names).configure_cert(server_ctx)
    tls_origin, plain_origin = Origin(server_ctx), Origin(None)
    await tls_origin.start(nursery)
    await plain_origin.start(nursery)
    store = PolicyStore(compile_policy(load_policy_text(POLICY, "test.yaml")), source="test.yaml")
    credentials = Credentials.from_mapping({
        "GITHUB_TOKEN": {"secret": SECRET, "hosts": ["api.test", "plain.test:80"]},
        "OTHER_TOKEN": {"secret": OTHER_SECRET, "hosts": ["other.test:443/only/**"]},
        "UNBOUND": {"secret": UNBOUND_SECRET},
    })  # fmt: skip
    return Env(tls_origin, plain_origin, _CA, authority, store, credentials, io.StringIO())


_CA = InterceptionCA.generate("l7-tests")


def tls_calls(env: Env, calls: list[tuple[str, str, dict[str, str], bytes | None]], host: str = "api.test"
              ) -> Callable[[int], list[Reply]]:  # fmt: skip
    return lambda port: http_requests(agent_socket(port, env.ca.cert_pem, host), host, calls)


# --- L7 rules ---------------------------------------------------------------------------------------------------


async def test_get_allowed_and_post_denied_on_the_same_host(env: Env) -> None:
    calls = [("GET", "/repos/x?page=2", {}, None), ("POST", "/repos/x", {"Content-Type": "text/plain"}, b"hi")]
    replies, stats = await env.run(tls_calls(env, calls))
    assert [r.status for r in replies] == [200, 403]
    assert replies[0].json()["target"] == "/repos/x?page=2"
    denied = replies[1]
    assert denied.headers["content-type"] == "application/json"
    assert denied.headers["x-openshell-policy"] == "api"
    assert denied.headers["connection"] == "close"
    body = denied.json()
    assert body["error"] == "policy_denied" and body["method"] == "POST" and body["path"] == "/repos/x"
    assert body["detail"] == "POST /repos/x not permitted by policy" and body["layer"] == "l7"
    assert [s.method for s in env.tls_origin.requests] == ["GET"]  # the POST never reached the origin
    events = env.events()
    assert [(e["method"], e["decision"], e["status"]) for e in events] == [("GET", "allow", 200),
                                                                           ("POST", "deny", 403)]  # fmt: skip
    assert events[0]["path"] == "/repos/x" and "page" not in json.dumps(events)  # query strings are never logged
    assert stats.allowed == 1 and stats.denied == 1 and stats.closed_by == "denied" and stats.protocol == "tls"


async def test_keep_alive_requests_share_one_upstream_connection(env: Env) -> None:
    calls = [("GET", f"/item/{i}", {}, None) for i in range(5)] + [("POST", "/upload", {}, b"x" * 100)]
    replies, stats = await env.run(tls_calls(env, calls))
    assert [r.status for r in replies] == [200] * 6
    assert env.tls_origin.connections == 1 and len(env.tls_origin.requests) == 6
    assert stats.requests == 6 and stats.closed_by == "agent"


async def test_audit_mode_forwards_and_says_so(env: Env) -> None:
    replies, stats = await env.run(tls_calls(env, [("DELETE", "/thing", {}, None)], "audit.test"), host="audit.test")
    assert replies[0].status == 200 and env.tls_origin.requests[0].method == "DELETE"
    event = env.events()[0]
    assert event["decision"] == "audit" and event["reason"] == "l7-no-allow-rule" and stats.audited == 1


async def test_non_canonical_paths_are_judged_canonical_and_sent_canonical(env: Env) -> None:
    calls = [("GET", "/public/..;/secret/./x", {}, None), ("GET", "/a/%2e%2e/b", {}, None)]
    replies, _ = await env.run(tls_calls(env, calls))
    assert [r.json()["target"] for r in replies] == ["/secret/x", "/b"]


async def test_path_climbing_above_the_root_is_refused_as_an_invalid_target(env: Env) -> None:
    """Not a rule to ask for (§3.17): 400 invalid_request_target, never a 403 naming a rule."""
    replies, _ = await env.run(tls_calls(env, [("GET", "/a/../../etc", {}, None)]))
    assert replies[0].status == 400 and replies[0].json()["error"] == "invalid_request_target"
    assert "rule_missing" not in replies[0].json()
    assert env.tls_origin.requests == []
    assert env.events()[-1]["reason"] == "path-not-canonical"


async def test_an_encoded_slash_where_the_endpoint_does_not_allow_it_is_an_invalid_target(env: Env) -> None:
    replies, _ = await env.run(tls_calls(env, [("GET", "/a%2Fb", {}, None)]))
    assert replies[0].status == 400 and replies[0].json()["error"] == "invalid_request_target"
    assert env.tls_origin.requests == []
    assert env.events()[-1]["reason"] in ("encoded-slash", "path-not-canonical")


async def test_streamed_upload_and_download(env: Env) -> None:
    body = bytes(range(256)) * 8192  # 2 MiB
    calls = [("POST", "/upload", {"Content-Type": "application/octet-stream"}, body),
             ("GET", f"/big/{3 * 1024 * 1024}", {}, None)]  # fmt: skip
    replies, stats = await env.run(tls_calls(env, calls))
    assert replies[0].json()["body_sha256"] == hashlib.sha256(body).hexdigest()
    assert len(replies[1].body) == 3 * 1024 * 1024
    assert stats.bytes_up == len(body) and stats.bytes_down >= 3 * 1024 * 1024


async def test_expect_100_continue_passes_through(env: Env) -> None:
    def client(port: int) -> bytes:
        sock = agent_socket(port, env.ca.cert_pem)
        sock.sendall(b"POST /upload HTTP/1.1\r\nHost: api.test\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        interim = sock.recv(4096)
        return interim + raw_exchange(sock, b"hello")

    reply, _ = await env.run(client)
    assert reply.startswith(b"HTTP/1.1 100 ") and b"HTTP/1.1 200 " in reply
    assert env.tls_origin.requests[0].body == b"hello"


# --- credentials -------------------------------------------------------------------------------------------------


async def test_placeholders_become_the_secret_at_the_bound_upstream_only(env: Env) -> None:
    basic = base64.b64encode(f"x-access-token:{PLACEHOLDER}".encode()).decode()
    calls = [
        ("GET", "/user", {"Authorization": f"Bearer {PLACEHOLDER}"}, None),
        ("GET", "/basic", {"Authorization": f"Basic {basic}"}, None),
        ("GET", f"/q?token={PLACEHOLDER}&x=1", {}, None),
        ("GET", f"/bot{PLACEHOLDER}/send", {"X-Api-Key": PLACEHOLDER}, None),
    ]
    replies, _ = await env.run(tls_calls(env, calls))
    assert [r.status for r in replies] == [200] * 4
    seen = env.tls_origin.requests
    assert seen[0].headers["authorization"] == f"Bearer {SECRET}"
    assert base64.b64decode(seen[1].headers["authorization"].split()[1]).decode() == f"x-access-token:{SECRET}"
    assert seen[2].target == f"/q?token={SECRET}&x=1"
    assert seen[3].target == f"/bot{SECRET}/send" and seen[3].headers["x-api-key"] == SECRET
    events = env.events()
    assert [e["injected"] for e in events] == [1] * 4 and "GITHUB_TOKEN" not in str(events)
    assert events[3]["path"] == "/bot[CREDENTIAL]/send"  # policy and logs see the redacted path
    assert PLACEHOLDER not in env.log.getvalue()


async def test_an_echoing_origin_sends_the_agent_its_placeholder_never_the_secret(env: Env) -> None:
    """The origin echoes what it received (the secret) in its JSON body, and — on ``/split/`` — in a header and
    in a body whose two chunks cut the secret in half: the agent reads the placeholder everywhere."""
    calls = [("GET", "/user", {"Authorization": f"Bearer {PLACEHOLDER}"}, None),
             ("GET", "/split/", {"X-Api-Key": PLACEHOLDER}, None)]  # fmt: skip
    replies, _ = await env.run(tls_calls(env, calls))
    assert [r.status for r in replies] == [200, 200]
    assert env.tls_origin.requests[0].headers["authorization"] == f"Bearer {SECRET}"  # the origin got the secret
    assert replies[0].json()["headers"]["authorization"] == f"Bearer {PLACEHOLDER}"
    assert replies[1].headers["x-echo"] == PLACEHOLDER
    assert replies[1].body == f"key={PLACEHOLDER};again={PLACEHOLDER}".encode()
    for reply in replies:
        assert SECRET.encode() not in reply.body and SECRET not in json.dumps(reply.headers)
    assert env.events()[-1]["secrets_scrubbed"] == 3


async def test_placeholder_toward_an_unbound_host_is_refused_and_never_sent(env: Env) -> None:
    calls = [("GET", "/user", {"Authorization": f"Bearer {PLACEHOLDER}"}, None)]
    replies, _ = await env.run(tls_calls(env, calls, "other.test"), host="other.test")
    assert replies[0].status == 403
    assert replies[0].json()["error"] == "credential_endpoint_mismatch"
    assert "GITHUB_TOKEN" in replies[0].json()["detail"]
    assert env.tls_origin.requests == [] and env.tls_origin.connections == 0  # not even dialled
    assert env.events()[0]["finding"] == "openshell.http.credential_endpoint_mismatch"


async def test_binding_path_scopes_a_credential(env: Env) -> None:
    calls = [("GET", "/only/here", {"X-Key": OTHER_PLACEHOLDER}, None),
             ("GET", "/elsewhere", {"X-Key": OTHER_PLACEHOLDER}, None)]  # fmt: skip
    replies, _ = await env.run(tls_calls(env, calls, "other.test"), host="other.test")
    assert [r.status for r in replies] == [200, 403]
    assert [s.headers["x-key"] for s in env.tls_origin.requests] == [OTHER_SECRET]


async def test_unbound_credential_and_unknown_placeholders_never_resolve(env: Env) -> None:
    unknown = [("GET", "/", {"Authorization": "Bearer openshell:resolve:env:NOPE"}, None)]
    replies, _ = await env.run(tls_calls(env, unknown))
    assert replies[0].status == 500 and replies[0].json()["error"] == "credential_unavailable"
    unbound = [("GET", "/", {"Authorization": "Bearer openshell:resolve:env:UNBOUND"}, None)]
    replies, _ = await env.run(tls_calls(env, unbound))
    assert replies[0].status == 403 and replies[0].json()["error"] == "credential_endpoint_mismatch"
    assert "bound to no endpoint" in replies[0].json()["detail"], replies[0].json()  # not "to other endpoints"
    mangled = [("GET", "/", {"Authorization": "Bearer OPENSHELL:RESOLVE:ENV:GITHUB_TOKEN"}, None)]
    replies, _ = await env.run(tls_calls(env, mangled))
    assert replies[0].status == 500
    assert env.tls_origin.requests == [] and UNBOUND_SECRET not in env.log.getvalue()


# --- authority binding (domain fronting) --------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", [
    b"GET /user HTTP/1.1\r\nHost: other.test\r\n",
    b"GET https://other.test/user HTTP/1.1\r\nHost: other.test\r\n",
    b"GET /user HTTP/1.1\r\nHost: api.test:8443\r\n",
    b"GET http://api.test/user HTTP/1.1\r\nHost: api.test:80\r\n",  # http:// inside TLS means port 80
])  # fmt: skip
async def test_authority_mismatch_inside_the_tunnel_is_refused_and_no_credential_leaves(
    env: Env, spelling: bytes
) -> None:
    request = spelling + f"Authorization: Bearer {PLACEHOLDER}\r\n\r\n".encode()
    reply, stats = await env.run(lambda port: raw_exchange(agent_socket(port, env.ca.cert_pem), request))
    assert reply.startswith(b"HTTP/1.1 403 ")
    assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"] == "request_authority_mismatch"
    assert env.tls_origin.requests == [] and env.tls_origin.connections == 0
    assert stats.closed_by == "denied"


async def test_authority_spellings_that_still_match(env: Env) -> None:
    request = b"GET /a HTTP/1.1\r\nHost: API.Test.:443\r\n\r\n"
    reply, _ = await env.run(lambda port: raw_exchange(agent_socket(port, env.ca.cert_pem), request, wait=1))
    assert reply.startswith(b"HTTP/1.1 200 ")


async def test_http10_without_host_gets_no_credentials(env: Env) -> None:
    ok = b"GET /plain HTTP/1.0\r\n\r\n"
    reply, _ = await env.run(lambda port: raw_exchange(agent_socket(port, env.ca.cert_pem), ok))
    assert reply.startswith(b"HTTP/1.1 200 ") and env.tls_origin.requests[0].headers["host"] == "api.test"
    marked = f"GET /x HTTP/1.0\r\nAuthorization: Bearer {PLACEHOLDER}\r\n\r\n".encode()
    reply, _ = await env.run(lambda port: raw_exchange(agent_socket(port, env.ca.cert_pem), marked))
    assert reply.startswith(b"HTTP/1.1 403 ") and len(env.tls_origin.requests) == 1


# --- smuggling -----------------------------------------------------------------------------------------------------

SMUGGLING = {
    "cl-and-te": b"POST /upload HTTP/1.1\r\nHost: plain.test\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"0\r\n\r\nGET /admin HTTP/1.1\r\nHost: plain.test\r\n\r\n",
    "te-cl-order": b"POST /upload HTTP/1.1\r\nHost: plain.test\r\nTransfer-Encoding: chunked\r\n"
    b"Content-Length: 3\r\n\r\n0\r\n\r\n",
    "conflicting-cl": b"POST /upload HTTP/1.1\r\nHost: plain.test\r\nContent-Length: 0\r\nContent-Length: 30\r\n\r\n",
    "te-not-chunked": b"POST /upload HTTP/1.1\r\nHost: plain.test\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    "te-obfuscated": b"POST /upload HTTP/1.1\r\nHost: plain.test\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
    "te-on-http10": b"POST /upload HTTP/1.0\r\nHost: plain.test\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "obs-fold": b"GET / HTTP/1.1\r\nHost: plain.test\r\nX-A: 1\r\n Transfer-Encoding: chunked\r\n\r\n",
    "bare-lf": b"GET / HTTP/1.1\nHost: plain.test\n\n",
    "bare-cr": b"GET / HTTP/1.1\r\nHost: plain.test\rX: y\r\n\r\n",
    "double-host": b"GET / HTTP/1.1\r\nHost: plain.test\r\nHost: api.test\r\n\r\n",
    "no-host": b"GET / HTTP/1.1\r\n\r\n",
    "connection-nominates-cl": b"GET / HTTP/1.1\r\nHost: plain.test\r\nConnection: content-length\r\n\r\n",
    "bad-chunk-size": b"POST /upload HTTP/1.1\r\nHost: plain.test\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    "http2-version": b"GET / HTTP/2.0\r\nHost: plain.test\r\n\r\n",
    "nul-in-value": b"GET / HTTP/1.1\r\nHost: plain.test\r\nX: a\x00b\r\n\r\n",
    "non-ascii-target": b"GET /\x89 HTTP/1.1\r\nHost: plain.test\r\n\r\n",
}


@pytest.mark.parametrize("name", sorted(SMUGGLING))
async def test_smuggling_shapes_close_without_response_and_reach_nothing(env: Env, name: str) -> None:
    reply, stats = await env.run(
        lambda port: raw_exchange(agent_socket(port, None), SMUGGLING[name]), host="plain.test", port=80
    )  # plaintext keeps the attack bytes exact
    assert reply == b"" and env.plain_origin.requests == []
    if name == "bad-chunk-size":  # the head is fine; the body framing breaks after the head went upstream
        assert stats.closed_by == "agent" and env.events()[0]["error"].startswith("agent: malformed request body")
        return
    assert stats.closed_by == "malformed-request"
    event = env.events()[0]
    assert event["decision"] == "deny" and event["detail"].startswith("HTTP request rejected before policy")


async def test_smuggling_over_tls_too(env: Env) -> None:
    attack = SMUGGLING["cl-and-te"].replace(b"plain.test", b"api.test")
    reply, stats = await env.run(lambda port: raw_exchange(agent_socket(port, env.ca.cert_pem), attack))
    assert reply == b"" and env.tls_origin.requests == [] and stats.closed_by == "malformed-request"


async def test_pipelined_requests_are_each_judged(env: Env) -> None:
    pipelined = (b"GET /one HTTP/1.1\r\nHost: api.test\r\n\r\n"
                 b"DELETE /two HTTP/1.1\r\nHost: api.test\r\n\r\n")  # fmt: skip
    reply, _ = await env.run(lambda port: raw_exchange(agent_socket(port, env.ca.cert_pem), pipelined))
    assert reply.startswith(b"HTTP/1.1 200 ") and b"HTTP/1.1 403 " in reply
    assert [s.target for s in env.tls_origin.requests] == ["/one"]


# --- protocols -----------------------------------------------------------------------------------------------------


async def test_h2c_prior_knowledge_is_refused(env: Env) -> None:
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    reply, stats = await env.run(lambda port: raw_exchange(agent_socket(port, None), preface))
    assert b"403" in reply and b"unsupported_l7_protocol" in reply and stats.protocol == "h2c"


async def test_unknown_bytes_are_refused(env: Env) -> None:
    reply, stats = await env.run(lambda port: raw_exchange(agent_socket(port, None), b"SSH-2.0-OpenSSH_9.6\r\n"))
    assert b"unsupported_l7_protocol" in reply and stats.protocol == "unknown"


async def test_h2c_upgrade_is_refused(env: Env) -> None:
    request = (b"GET / HTTP/1.1\r\nHost: api.test\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
               b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n")  # fmt: skip
    reply, _ = await env.run(lambda port: raw_exchange(agent_socket(port, env.ca.cert_pem), request))
    assert reply.startswith(b"HTTP/1.1 403 ") and b"unsupported_l7_protocol" in reply
    assert env.tls_origin.requests == []


def ws_upgrade(host: str) -> bytes:
    return (
        f"GET /upgrade HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()


def ws_frame(opcode: int, payload: bytes) -> bytes:
    key = b"\x01\x02\x03\x04"
    return bytes([0x80 | opcode, 0x80 | len(payload)]) + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def ws_client(env: Env, host: str, frames: list[bytes]) -> Callable[[int], tuple[bytes, bytes]]:
    """Upgrade, then send each frame and wait for the origin's echo (or the connection's end)."""

    def client(port: int) -> tuple[bytes, bytes]:
        sock = agent_socket(port, env.ca.cert_pem, host)
        sock.sendall(ws_upgrade(host))
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(4096)
        head, _, after = head.partition(b"\r\n\r\n")
        received = bytearray(after)
        for data in frames:
            sock.sendall(data)
            while not received.endswith(b"echo:" + data):
                chunk = sock.recv(4096)
                if not chunk:
                    sock.close()
                    return head, bytes(received)
                received += chunk
        sock.close()
        return head, bytes(received)

    return client


async def test_websocket_upgrade_then_relay_when_text_is_allowed(env: Env) -> None:
    frames = [ws_frame(0x1, b"hello"), ws_frame(0x2, b"\x00\x01")]
    (head, _), stats = await env.run(ws_client(env, "chat.test", frames), host="chat.test")
    assert head.startswith(b"HTTP/1.1 101 ") and stats.upgraded
    assert bytes(env.tls_origin.upgraded) == b"".join(frames) and stats.bytes_up == len(b"".join(frames))


async def test_websocket_text_denied_closes_with_1008_and_never_reaches_the_origin(env: Env) -> None:
    binary, text = ws_frame(0x2, b"\x00\x01"), ws_frame(0x1, b"rm -rf /")
    (head, received), stats = await env.run(ws_client(env, "ws.test", [binary, text]), host="ws.test")
    assert head.startswith(b"HTTP/1.1 101 ")
    assert received.endswith(b"\x88" + bytes([2 + len(b"text messages are not permitted by policy")]) +
                             b"\x03\xf0text messages are not permitted by policy")  # fmt: skip
    assert bytes(env.tls_origin.upgraded).startswith(binary) and text not in env.tls_origin.upgraded
    assert stats.closed_by == "denied"
    event = env.events()[-1]
    assert (event["method"], event["decision"], event["status"]) == ("WEBSOCKET_TEXT", "deny", 1008)


def ws_burst(env: Env, host: str, data: bytes) -> Callable[[int], tuple[bytes, bytes]]:
    """Upgrade offering permessage-deflate, send ``data`` at once, read until its whole echo or the end."""

    def client(port: int) -> tuple[bytes, bytes]:
        sock = agent_socket(port, env.ca.cert_pem, host)
        sock.sendall(ws_upgrade(host).replace(b"\r\n\r\n", b"\r\nSec-WebSocket-Extensions: permessage-deflate\r\n\r\n"))
        received = b""
        while b"\r\n\r\n" not in received:
            received += sock.recv(4096)
        head, _, rest = received.partition(b"\r\n\r\n")
        body = bytearray(rest)
        sock.sendall(data)
        while b"echo:" + data not in body.replace(b"echo:", b"", body.count(b"echo:") - 1) and (
            chunk := sock.recv(4096)
        ):
            body += chunk
        sock.close()
        return head, bytes(body)

    return client


def upgraded_before_close(origin: Origin) -> bytes:
    """What the origin received after the 101, less the close frame control sends it when it ends both sides."""
    data = bytes(origin.upgraded)
    for start in range(len(data) - 1):  # control's masked close frame ends the stream: 0x88, length, mask, payload
        if data[start] == 0x88 and data[start + 1] & 0x80 and start + 6 + (data[start + 1] & 0x7F) == len(data):
            return data[:start]
    return data


def graphql_ws(kind: str, query: str, op_id: str = "1") -> bytes:
    return json.dumps({"type": kind, "id": op_id, "payload": {"query": query}}).encode()


def ws_fragments(opcode: int, payload: bytes, cut: int) -> bytes:
    key = b"\x05\x06\x07\x08"

    def one(first: int, part: bytes, offset: int = 0) -> bytes:
        return bytes([first, 0x80 | len(part)]) + key + bytes(b ^ key[i % 4] for i, b in enumerate(part))

    return one(opcode, payload[:cut]) + one(0x80, payload[cut:])


async def test_graphql_over_websocket_judges_every_subscribe(env: Env) -> None:
    """Allowed messages pass as sent (the deflate offer stripped); a subscribe selecting a denied field, sent in two
    fragments, closes both sides with 1008 before any of it reaches the origin."""
    init = ws_frame(0x1, json.dumps({"type": "connection_init"}).encode())
    allowed = ws_frame(0x1, graphql_ws("subscribe", "subscription { ticks }"))
    (head, received), stats = await env.run(ws_burst(env, "gqlws.test", init + allowed), host="gqlws.test")
    assert head.startswith(b"HTTP/1.1 101 ") and bytes(env.tls_origin.upgraded) == init + allowed
    assert "sec-websocket-extensions" not in env.tls_origin.requests[-1].headers
    event = env.events()[-1]
    assert (event["method"], event["decision"], event["operation"]) == ("WEBSOCKET_TEXT", "allow",
                                                                       "subscription (anonymous)")  # fmt: skip

    env.tls_origin.upgraded.clear()
    hidden = ws_fragments(0x1, graphql_ws("subscribe", "subscription S { ticks harmless: secret }"), cut=40)
    (head, received), stats = await env.run(ws_burst(env, "gqlws.test", init + hidden), host="gqlws.test")
    assert received.endswith(b"\x03\xf0message not permitted by policy"), received
    assert upgraded_before_close(env.tls_origin) == init and stats.closed_by == "denied"
    event = env.events()[-1]
    assert (event["decision"], event["status"], event["operation"]) == ("deny", 1008, "subscription S")


@pytest.mark.parametrize("name", ["mutation", "legacy start", "unknown type", "not json", "compressed", "binary"])
async def test_graphql_over_websocket_refusals_reach_nothing(env: Env, name: str) -> None:
    message = {
        "mutation": ws_frame(0x1, graphql_ws("subscribe", "mutation { drop }")),
        "legacy start": ws_frame(0x1, graphql_ws("start", "mutation { drop }")),
        "unknown type": ws_frame(0x1, graphql_ws("execute", "query { ticks }")),
        "not json": ws_frame(0x1, b"{subscribe"),
        "compressed": bytes([0xC1]) + ws_frame(0x1, graphql_ws("subscribe", "query { ticks }"))[1:],  # RSV1 set
        "binary": ws_frame(0x2, graphql_ws("subscribe", "mutation { drop }")),
    }[name]
    (head, received), stats = await env.run(ws_burst(env, "gqlws.test", message), host="gqlws.test")
    assert head.startswith(b"HTTP/1.1 101 ") and upgraded_before_close(env.tls_origin) == b""
    code = b"\x03\xea" if name == "compressed" else b"\x03\xf0"
    assert code in received and stats.closed_by in ("denied", "malformed-request"), received


async def test_websocket_upgrade_on_a_rest_endpoint_is_refused_and_nothing_goes_upstream(env: Env) -> None:
    """A GET rule must not become a raw channel: after a 101 nothing would be judged (docs/design.md)."""
    (head, received), stats = await env.run(ws_client(env, "api.test", [ws_frame(0x1, b"DELETE everything")]))
    assert head.startswith(b"HTTP/1.1 403 ") and b"unsupported_l7_protocol" in received, (head, received)
    assert env.tls_origin.requests == [] and not env.tls_origin.upgraded and not stats.upgraded
    assert env.events()[-1]["reason"] == "websocket-upgrade-not-allowed"


async def test_wss_to_a_plain_endpoint_is_bound_then_relayed(env: Env) -> None:
    """An endpoint without L7 rules: the handshake is authority-bound like any request, then raw after 101."""
    frames = [ws_frame(0x1, b"hello"), ws_frame(0x2, b"\x00\x01")]
    (head, _), stats = await env.run(ws_client(env, "open.test", frames), host="open.test")
    assert head.startswith(b"HTTP/1.1 101 ") and stats.upgraded
    assert bytes(env.tls_origin.upgraded) == b"".join(frames)
    fronted, _ = await env.run(lambda port: raw_exchange(agent_socket(port, env.ca.cert_pem, "open.test"),
                                                         ws_upgrade("other.test")), host="open.test")  # fmt: skip
    assert fronted.startswith(b"HTTP/1.1 403 ") and b"request_authority_mismatch" in fronted, fronted
    assert [r.headers["host"] for r in env.tls_origin.requests] == ["open.test"]


async def test_websocket_endpoint_requires_an_upgrade(env: Env) -> None:
    replies, _ = await env.run(tls_calls(env, [("GET", "/plain", {}, None)], "ws.test"), host="ws.test")
    assert replies[0].status == 403 and "WebSocket upgrade" in replies[0].json()["detail"]


async def test_plaintext_http_with_sniffing(env: Env) -> None:
    calls = [("GET", "/x", {"Authorization": f"Bearer {PLACEHOLDER}"}, None), ("PUT", "/y", {}, b"1")]
    replies, stats = await env.run(lambda port: http_requests(agent_socket(port, None), "plain.test", calls),
                                   host="plain.test", port=80)  # fmt: skip
    assert [r.status for r in replies] == [200, 200] and stats.protocol == "http/1.1"
    assert env.plain_origin.requests[0].headers["authorization"] == f"Bearer {SECRET}"


# --- upstream failures ---------------------------------------------------------------------------------------------


async def test_upstream_certificate_failure_is_a_502_never_a_downgrade(env: Env) -> None:
    untrusting = upstream_context(extra_ca_pem=trustme.CA().cert_pem.bytes().decode(), system_trust=False)
    calls = [("GET", "/user", {"Authorization": f"Bearer {PLACEHOLDER}"}, None)]
    replies, stats = await env.run(tls_calls(env, calls), upstream_ssl=untrusting)
    assert replies[0].status == 502
    body = replies[0].json()
    assert body["error"] == "upstream_tls_failed" and "verif" in body["detail"]
    assert env.tls_origin.requests == []  # the TLS handshake failed before any request byte
    assert stats.closed_by == "upstream-failed"


async def test_upstream_name_mismatch_is_a_502(env: Env) -> None:
    # the origin's certificate names api.test, other.test...; a tunnel to 127.0.0.1 must not accept it
    untrusted_name = Credentials.empty()
    env.credentials = untrusted_name
    store = PolicyStore(compile_policy(load_policy_text(
        "version: 1\nnetwork_policies:\n  ip:\n    endpoints: [{host: 127.0.0.1, port: 443, protocol: rest, "
        "access: full}]\n    binaries: [{path: /usr/bin/curl}]\n", "ip.yaml")), source="ip.yaml")  # fmt: skip
    env.store = store
    replies, _ = await env.run(
        lambda port: http_requests(
            agent_socket(port, env.ca.cert_pem, "127.0.0.1"), "127.0.0.1", [("GET", "/", {}, None)]
        ),
        host="127.0.0.1",
    )
    assert replies[0].status == 502 and replies[0].json()["error"] == "upstream_tls_failed"


async def test_ssrf_refusal_from_the_dialler_is_a_403(env: Env) -> None:
    async def refuse() -> trio.abc.HalfCloseableStream:
        raise UpstreamError(UpstreamReason.INTERNAL_ADDRESS, "api.test resolves to 10.0.0.1 (private)")

    replies, _ = await env.run(tls_calls(env, [("GET", "/", {}, None)]), connect=refuse)
    assert replies[0].status == 403 and replies[0].json()["error"] == "ssrf_denied"


async def test_agent_that_does_not_trust_the_ca_fails_the_handshake(env: Env) -> None:
    def client(port: int) -> str:
        try:
            agent_socket(port, trustme.CA().cert_pem.bytes().decode())
        except ssl.SSLCertVerificationError as exc:
            return exc.verify_message
        return "connected"

    message, stats = await env.run(client)
    assert message != "connected" and stats.closed_by == "agent-tls-failed"
    assert env.events("http.tunnel")[0]["stage"] == "agent-tls-failed"


async def test_policy_revision_closes_before_the_next_request(env: Env) -> None:
    seen = []

    def is_current(generation: int) -> bool:
        seen.append(generation)
        return len(seen) < 2

    calls = [("GET", "/one", {}, None), ("GET", "/two", {}, None)]

    def client(port: int) -> list[int]:
        try:
            return [r.status for r in http_requests(agent_socket(port, env.ca.cert_pem), "api.test", calls)]
        except (http.client.RemoteDisconnected, ConnectionError):
            return [-1]

    statuses, stats = await env.run(client, is_current=is_current)
    assert [s.target for s in env.tls_origin.requests] == ["/one"] and stats.closed_by == "policy-revision"
    assert statuses in ([200], [-1], [200, -1])


async def test_a_kept_alive_upstream_that_went_away_is_redialled_for_a_bodiless_request(env: Env) -> None:
    calls = [("GET", "/drop", {}, None), ("GET", "/next", {}, None)]
    replies, stats = await env.run(tls_calls(env, calls))
    assert [r.status for r in replies] == [200, 200] and env.tls_origin.connections == 2
    assert [s.target for s in env.tls_origin.requests] == ["/drop", "/next"] and stats.requests == 2


async def test_idle_agent_is_closed(env: Env) -> None:
    def client(port: int) -> bytes:
        sock = agent_socket(port, env.ca.cert_pem)
        return raw_exchange(sock, b"", wait=5)

    reply, stats = await env.run(client, idle_timeout=0.3)
    assert reply == b"" and stats.closed_by == "idle-timeout" and stats.requests == 0


# --- the catalogue, as the agent reads it (§3.17) -------------------------------------------------------------------

DOCS_POLICY = Path(__file__).resolve().parents[2] / "docs" / "policy.md"


async def _refusal_bodies(env: Env) -> dict[str, bytes]:
    """Every refusal an agent can read inside a tunnel, produced for real (each body as it crossed the wire)."""
    bodies: dict[str, bytes] = {}
    bearer = {"Authorization": f"Bearer {OTHER_PLACEHOLDER}"}
    cases: list[tuple[str, list[tuple[str, str, dict[str, str], bytes | None]]]] = [
        ("l7 deny", [("POST", "/write", {}, b"x")]),
        ("authority mismatch", [("GET", "/", {"Host": "other.test"}, None)]),
        ("non-canonical target", [("GET", "/a/../../etc", {}, None)]),
        ("credential bound elsewhere", [("GET", "/", bearer, None)]),
        ("credential bound nowhere", [("GET", "/", {"Authorization": "Bearer openshell:resolve:env:UNBOUND"}, None)]),
        ("unknown placeholder", [("GET", "/", {"Authorization": "Bearer openshell:resolve:env:NOPE"}, None)]),
        ("websocket upgrade without a rule", [("GET", "/upgrade", {"Connection": "Upgrade", "Upgrade": "websocket",
                                                                 "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                                                                 "Sec-WebSocket-Version": "13"}, None)]),
    ]  # fmt: skip
    for name, calls in cases:
        replies, _ = await env.run(tls_calls(env, calls))
        bodies[name] = replies[0].body
    reply, _ = await env.run(lambda port: raw_exchange(agent_socket(port, None), b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
    bodies["h2c"] = reply.split(b"\r\n\r\n", 1)[1]

    async def refuse() -> trio.abc.HalfCloseableStream:
        raise UpstreamError(UpstreamReason.INTERNAL_ADDRESS, "api.test resolves to 10.0.0.1 (private)")

    replies, _ = await env.run(tls_calls(env, [("GET", "/", {}, None)]), connect=refuse)
    bodies["ssrf"] = replies[0].body
    return bodies


async def test_every_refusal_body_is_shown_in_docs_policy_md(env: Env) -> None:
    """docs/policy.md shows each refusal body exactly as control writes it: the docs cannot drift."""
    docs = DOCS_POLICY.read_text()
    missing = {name: body.decode().strip() for name, body in (await _refusal_bodies(env)).items()
               if body.decode().strip() not in docs}  # fmt: skip
    assert not missing, "not in docs/policy.md:\n" + "\n".join(f"{k}: {v}" for k, v in missing.items())
    assert env.tls_origin.requests == [], "no refusal reached the origin"
