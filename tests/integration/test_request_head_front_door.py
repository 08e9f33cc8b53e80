"""One front door: the boundary's proxy listener, control's proxy-pod listener and the inspected path all read
request heads with the one ``HeadReader`` (supervisor/protocol/request_head.py), so a framing shape is refused
the same way on all three. Played from the agent's side: the ambiguous head is refused and nothing reaches
control's decision, the egress pipeline or the origin."""

from __future__ import annotations

import io
import json
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

from supervisor.boundary.egress import EgressCapture, EgressLinks
from supervisor.control.proxy_listener import ProxyListenConfig, ProxyListener
from supervisor.jsonlog import JsonLog
from supervisor.link.h2link import Link, LinkStream
from supervisor.protocol.egress import EgressReply, encode_reply_headers
from supervisor.protocol.identity import ConnectionIdentity
from supervisor.protocol.request_head import HeadProblem, HeadReader
from tests.integration import test_l7_inspect
from tests.integration.test_l7_inspect import Env, agent_socket, raw_exchange

env = test_l7_inspect.env  # the inspected path's harness (a fixture)

TOKEN = "front-door-token"
AUTH = b"Proxy-Authorization: Basic c2FuZGJveDpmcm9udC1kb29yLXRva2Vu\r\n"  # sandbox:front-door-token
IDENTITY = ConnectionIdentity(binary_path="/usr/bin/curl", binary_sha256=None, ancestors=(), cmdline_paths=(),
                              pid=7, start_time=1, uid=1000, owners=1, resolved_in_us=5)  # fmt: skip

# (the framing after the request line, the problem the reader names); the same bytes on every path
SHAPES = {
    "content-length-5-and-05": (
        b"HTTP/1.1\r\nHost: plain.test\r\nContent-Length: 5\r\nContent-Length: 05\r\n\r\nhello",
        HeadProblem.CONTENT_LENGTH_CONFLICT,
    ),
    "chunked-on-http10": (
        b"HTTP/1.0\r\nHost: plain.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        HeadProblem.CHUNKED_ON_HTTP10,
    ),
}


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every head event the shared reader produced or refused, in order."""
    seen: list[str] = []
    original = HeadReader.next_event

    def spy(self: HeadReader) -> Any:
        try:
            event = original(self)
        except Exception as exc:
            seen.append(f"refused:{getattr(exc, 'problem', exc)}")
            raise
        seen.append(type(event).__name__)
        return event

    monkeypatch.setattr(HeadReader, "next_event", spy)
    return seen


async def _on_socket(handler: Callable[[trio.SocketStream], Awaitable[None]], data: bytes) -> bytes:
    """Send ``data`` from a real client socket, run ``handler`` on the accepted side, return what came back."""
    listener = socket.create_server(("127.0.0.1", 0))
    with listener:
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
    with client:
        client.sendall(data)
        accepted.setblocking(False)
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(accepted))
        with trio.fail_after(30):
            await handler(stream)
        await trio.aclose_forcefully(stream)
        client.settimeout(10)
        return await trio.to_thread.run_sync(client.recv, 4096)


async def _boundary_listener(data: bytes) -> tuple[bytes, int]:
    """The boundary's 127.0.0.1:3128 handler with a live egress link; how many streams control was asked for."""
    asked: list[str] = []

    async def control(stream: LinkStream) -> None:
        asked.append("stream")
        await stream.send_headers(encode_reply_headers(EgressReply(200)))
        await stream.send_eof()

    class Resolver:
        def resolve(self, local: object, remote: object) -> ConnectionIdentity:
            return IDENTITY

    left, right = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        client_link = Link(left, client=True, name="link")
        await nursery.start(client_link.run)
        nursery.start_soon(Link(right, client=False, handler=control, name="control").run)
        pool = EgressLinks()
        pool.add(client_link)
        capture = EgressCapture(fds={}, links=pool, resolver=Resolver(), log=JsonLog("boundary", stream=io.StringIO()),  # type: ignore[arg-type]
                                accepting=lambda: True)  # fmt: skip
        answer = await _on_socket(capture._proxy, data)
        nursery.cancel_scope.cancel()
    return answer, len(asked)


async def _control_listener(data: bytes) -> tuple[bytes, int, list[dict[str, Any]]]:
    """Control's proxy-pod listener; how many connections reached the egress pipeline, and its events."""
    served: list[object] = []

    class Egress:
        async def serve(self, stream: object, request: object) -> None:
            served.append(request)

    log = io.StringIO()
    listener = ProxyListener(ProxyListenConfig("127.0.0.1", 0, TOKEN), Egress(), JsonLog("control", stream=log))  # type: ignore[arg-type]
    answer = await _on_socket(listener._connection, data)
    return answer, len(served), [json.loads(line) for line in log.getvalue().splitlines()]


@pytest.mark.parametrize("shape", sorted(SHAPES))
async def test_both_proxy_listeners_refuse_through_the_shared_reader(shape: str, reads: list[str]) -> None:
    framing, problem = SHAPES[shape]
    request = b"POST http://plain.test/upload " + framing.replace(b"\r\n\r\n", b"\r\n" + AUTH + b"\r\n", 1)

    answer, asked = await _boundary_listener(request)
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    assert asked == 0  # control was never asked: nothing left the boundary
    assert reads == [f"refused:{problem}"]

    reads.clear()
    answer, served, events = await _control_listener(request)
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    assert served == 0
    assert [(e["event"], e["reason"]) for e in events] == [("proxy.refused", "malformed-head")]
    assert reads == [f"refused:{problem}"]


async def test_the_same_heads_with_one_spelling_pass_both_listeners(reads: list[str]) -> None:
    """The control case: what differs above is only the framing rule, not the harness."""
    request = b"POST http://plain.test/upload HTTP/1.1\r\nHost: plain.test\r\nContent-Length: 5\r\n" + AUTH
    request += b"Content-Length: 5\r\n\r\nhello"
    answer, asked = await _boundary_listener(request)
    assert asked == 1 and not answer.startswith(b"HTTP/1.1 400 ")
    _, served, _ = await _control_listener(request)
    assert served == 1
    assert reads == ["RequestHead", "RequestHead"]


@pytest.mark.parametrize("shape", sorted(SHAPES))
async def test_the_inspected_path_refuses_through_the_shared_reader(env: Env, shape: str, reads: list[str]) -> None:
    framing, problem = SHAPES[shape]
    attack = b"POST /upload " + framing
    reply, stats = await env.run(lambda port: raw_exchange(agent_socket(port, None), attack), host="plain.test",
                                 port=80)  # fmt: skip
    assert reply == b"" and env.plain_origin.requests == []  # closed without a response; the origin saw nothing
    assert stats.closed_by == "malformed-request"
    assert env.events()[0]["reason"] == str(problem)
    assert f"refused:{problem}" in reads
