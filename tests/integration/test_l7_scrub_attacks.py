"""A bound origin that echoes the injected secret anywhere in its response never hands it to the agent, from the
agent's side, through the real inspected path (``inspect`` with the harness of ``test_l7_inspect``): the reason
phrase, a header name, a ``103 Early Hints`` head, trailers, ``Range`` slices that each hold a piece of it, and a
compressed body. The agent reads raw bytes (or ``http.client``) and the test asserts what it received never holds
the secret, and what reached the origin.
"""

from __future__ import annotations

import gzip
import io
import json
import ssl
from collections.abc import Callable

import h11
import pytest
import trio
import trustme

from supervisor.control.credentials import Credentials
from supervisor.control.policy import PolicyStore, compile_policy, load_policy_text
from tests.integration.test_l7_inspect import (
    _CA,
    PLACEHOLDER,
    POLICY,
    SECRET,
    Env,
    Origin,
    Seen,
    agent_socket,
    raw_exchange,
    tls_calls,
)


class EchoOrigin(Origin):
    """Echoes the key it was last given (``X-Api-Key``) where a scrubber that only read header values and bodies
    would miss it; ``/doc`` is a stored representation holding it, served whole, in ``Range`` slices, or gzipped
    when the client accepts that (as a compliant origin does)."""

    stored = b""

    def representation(self) -> bytes:
        return b"token=" + self.stored + b";"

    async def _answer(self, stream: trio.abc.Stream, conn: h11.Connection, seen: Seen) -> None:
        self.stored = seen.headers.get("x-api-key", "").encode() or self.stored
        key = self.stored

        async def send(*events: h11.Response | h11.InformationalResponse | h11.Data | h11.EndOfMessage) -> None:
            await stream.send_all(b"".join(conn.send(e) or b"" for e in events))

        def whole(status: int, body: bytes, headers: list[tuple[bytes, bytes]], reason: bytes = b"") -> list[
                h11.Response | h11.Data | h11.EndOfMessage]:  # fmt: skip
            length = [(b"content-length", str(len(body)).encode())]
            return [h11.Response(status_code=status, headers=headers + length, reason=reason), h11.Data(data=body),
                    h11.EndOfMessage()]  # fmt: skip

        path = seen.target
        if path == "/reason":
            await send(*whole(200, b"ok", [], reason=b"OK " + key))
        elif path in ("/name", "/name-lower"):
            await send(*whole(200, b"ok", [(b"X-" + (key.lower() if path == "/name-lower" else key), b"1")]))
        elif path == "/hints":
            await send(h11.InformationalResponse(status_code=103, headers=[(b"link", b"</" + key + b">")],
                                                 reason=b"Early Hints " + key),
                       *whole(200, b"ok", []))  # fmt: skip
        elif path == "/hints-name":
            await send(h11.InformationalResponse(status_code=103, headers=[(b"X-" + key, b"1")]),
                       *whole(200, b"ok", []))  # fmt: skip
        elif path == "/trailers":
            await send(h11.Response(status_code=200, headers=[(b"transfer-encoding", b"chunked"),
                                                              (b"trailer", b"x-echo")]),
                       h11.Data(data=b"ok"), h11.EndOfMessage(headers=[(b"x-echo", key)]))  # fmt: skip
        elif path == "/doc":
            body = self.representation()
            wanted = seen.headers.get("range", "")
            if wanted.startswith("bytes="):
                first, last = (int(n) for n in wanted[6:].split("-"))
                piece = body[first : last + 1]
                await send(*whole(206, piece, [(b"content-range", f"bytes {first}-{last}/{len(body)}".encode())]))
            elif "gzip" in seen.headers.get("accept-encoding", ""):
                await send(*whole(200, gzip.compress(body), [(b"content-encoding", b"gzip")]))
            else:
                await send(*whole(200, body, []))
        elif path.startswith("/malformed/"):  # bytes h11 refuses, quoting them in its message
            shape = path.split("/")[2]
            await stream.send_all({
                "header-line": b"HTTP/1.1 200 OK\r\nX-Echo " + key + b"\r\nContent-Length: 2\r\n\r\nok",
                "status-line": b"HTTP/1.1 2OO " + key + b"\r\nContent-Length: 2\r\n\r\nok",
                "chunk-header": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nZZ " + key + b"\r\n",
            }[shape])  # fmt: skip
            raise trio.ClosedResourceError  # raw bytes in place of h11's answer: Origin.handle closes the connection
        elif path == "/always-206":
            body = self.representation()
            await send(*whole(206, body[:10], [(b"content-range", f"bytes 0-9/{len(body)}".encode())]))
        elif path == "/always-gzip":
            await send(*whole(200, gzip.compress(self.representation()), [(b"content-encoding", b"gzip")]))
        else:
            await super()._answer(stream, conn, seen)


@pytest.fixture
async def env(nursery: trio.Nursery) -> Env:
    authority = trustme.CA()
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    authority.issue_cert("api.test").configure_cert(server_ctx)
    tls_origin, plain_origin = EchoOrigin(server_ctx), Origin(None)
    await tls_origin.start(nursery)
    await plain_origin.start(nursery)
    store = PolicyStore(compile_policy(load_policy_text(POLICY, "test.yaml")), source="test.yaml")
    credentials = Credentials.from_mapping({"GITHUB_TOKEN": {"secret": SECRET, "hosts": ["api.test"]}})
    return Env(tls_origin, plain_origin, _CA, authority, store, credentials, io.StringIO())


def raw_get(env: Env, path: str, extra: str = "") -> Callable[[int], bytes]:
    """The agent's raw request carrying the placeholder; what it reads back, byte for byte, until the close."""
    request = (f"GET {path} HTTP/1.1\r\nHost: api.test\r\nX-Api-Key: {PLACEHOLDER}\r\n{extra}"
               "Connection: close\r\n\r\n").encode()  # fmt: skip
    return lambda port: raw_exchange(agent_socket(port, env.ca.cert_pem), request)


def assert_secret_never_read(received: bytes) -> None:
    """Not the secret, nor any piece of it at least half as long (a slice to splice with another)."""
    assert SECRET.encode() not in received
    half = len(SECRET) // 2
    assert not any(SECRET[i : i + half].encode() in received for i in range(len(SECRET) - half + 1))


def assert_refused(reply: bytes, env: Env, why: str) -> None:
    """A clean 502 from control (nothing of the origin's answer), and an event saying why."""
    assert reply.startswith(b"HTTP/1.1 502 "), reply[:200]
    assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"] == "upstream_protocol_error"
    event = env.events()[-1]
    assert (event["status"], event["decision"], event["reason"]) == (502, "error", why)


async def test_the_reason_phrase_carries_the_placeholder(env: Env) -> None:
    reply, _ = await env.run(raw_get(env, "/reason"))
    assert reply.startswith(f"HTTP/1.1 200 OK {PLACEHOLDER}\r\n".encode()), reply[:200]
    assert_secret_never_read(reply)
    assert env.tls_origin.requests[0].headers["x-api-key"] == SECRET  # the origin did get (and echo) it
    assert env.events()[-1]["secrets_scrubbed"] == 1


async def test_a_secret_in_a_header_name_refuses_the_response_and_is_not_retried(env: Env) -> None:
    """The placeholder is no valid header-name token: the response is refused, not forwarded with the secret;
    on a kept-alive upstream connection the request is not sent a second time."""
    calls = [("GET", "/plain", {}, None), ("GET", "/name", {"X-Api-Key": PLACEHOLDER}, None)]
    replies, _ = await env.run(tls_calls(env, calls))
    assert [r.status for r in replies] == [200, 502]
    assert replies[1].json()["error"] == "upstream_protocol_error"
    for reply in replies:
        assert_secret_never_read(reply.body + json.dumps(reply.headers).encode())
    assert [s.target for s in env.tls_origin.requests] == ["/plain", "/name"]
    event = env.events()[-1]
    assert (event["status"], event["reason"]) == (502, "secret-in-header-name")


async def test_a_secret_in_a_header_name_in_any_case_is_refused_too(env: Env) -> None:
    reply, _ = await env.run(raw_get(env, "/name-lower"))
    assert_refused(reply, env, "secret-in-header-name")
    assert_secret_never_read(reply.lower())


async def test_an_early_hints_head_carries_the_placeholder(env: Env) -> None:
    reply, _ = await env.run(raw_get(env, "/hints"))
    assert reply.startswith(f"HTTP/1.1 103 Early Hints {PLACEHOLDER}\r\n".encode()), reply[:200]
    assert f"link: </{PLACEHOLDER}>".encode() in reply
    assert b"HTTP/1.1 200 " in reply
    assert_secret_never_read(reply)


async def test_an_early_hints_header_name_with_the_secret_refuses_the_response(env: Env) -> None:
    reply, _ = await env.run(raw_get(env, "/hints-name"))
    assert_refused(reply, env, "secret-in-header-name")
    assert_secret_never_read(reply)


async def test_trailers_are_dropped(env: Env) -> None:
    reply, _ = await env.run(raw_get(env, "/trailers"))
    assert reply.startswith(b"HTTP/1.1 200 ") and reply.endswith(b"\r\n0\r\n\r\n"), reply[-200:]
    assert b"x-echo:" not in reply.lower()  # ``Trailer: x-echo`` (its announcement) passes; the field does not
    assert_secret_never_read(reply)


async def test_range_slices_of_a_stored_echo_cannot_be_spliced(env: Env) -> None:
    """The first request makes the origin store the secret; later ones, without any placeholder, ask for slices
    each shorter than the secret. The origin never sees ``Range``/``If-Range`` and answers whole, scrubbed."""
    doc = f"token={SECRET};"
    cut = doc.index(SECRET) + len(SECRET) // 2
    calls = [("GET", "/store", {"X-Api-Key": PLACEHOLDER}, None),
             ("GET", "/doc", {"Range": f"bytes=0-{cut - 1}"}, None),
             ("GET", "/doc", {"Range": f"bytes={cut}-{len(doc) - 1}", "If-Range": '"v1"'}, None)]  # fmt: skip
    replies, _ = await env.run(tls_calls(env, calls))
    assert [r.status for r in replies] == [200, 200, 200]
    assert [r.body for r in replies[1:]] == [f"token={PLACEHOLDER};".encode()] * 2
    assert_secret_never_read(b"".join(r.body for r in replies))
    for seen in env.tls_origin.requests:
        assert "range" not in seen.headers and "if-range" not in seen.headers


async def test_a_206_that_arrives_anyway_is_refused(env: Env) -> None:
    reply, _ = await env.run(raw_get(env, "/always-206"))
    assert_refused(reply, env, "response-not-scrubbable")
    assert b"token=" not in reply  # no byte of the slice
    assert_secret_never_read(reply)


async def test_the_agent_cannot_ask_a_bound_host_for_a_compressed_echo(env: Env) -> None:
    calls = [("GET", "/doc", {"X-Api-Key": PLACEHOLDER, "Accept-Encoding": "gzip"}, None)]
    replies, _ = await env.run(tls_calls(env, calls))
    assert replies[0].status == 200 and "content-encoding" not in replies[0].headers
    assert replies[0].body == f"token={PLACEHOLDER};".encode()
    assert env.tls_origin.requests[0].headers["accept-encoding"] == "identity"


async def test_a_compressed_body_that_arrives_anyway_is_refused(env: Env) -> None:
    reply, _ = await env.run(raw_get(env, "/always-gzip"))
    assert_refused(reply, env, "response-not-scrubbable")
    assert_secret_never_read(reply)
    assert b"\x1f\x8b" not in reply  # no gzip member reached the agent


@pytest.mark.parametrize("shape", ["header-line", "status-line", "chunk-header"])
async def test_a_malformed_echo_is_refused_without_quoting_it(env: Env, shape: str) -> None:
    """h11's message for bytes it refuses quotes them: it must not carry the echoed secret to the agent (the 502's
    detail) nor into the events (``env.run`` asserts the log never holds the secret)."""
    reply, _ = await env.run(raw_get(env, f"/malformed/{shape}"))
    assert_secret_never_read(reply)
    if shape != "chunk-header":  # there the head went through before the chunk's size line failed
        assert reply.startswith(b"HTTP/1.1 502 "), reply[:200]
