"""The proxy listener's head deadline bounds the agent's slowness, not the boundary's.

Found under load (tests/e2e/test_egress_load.py on a busy 2-core machine): in a burst of connections the
boundary's task for one connection first looked at its socket after ``HEAD_READ_DEADLINE_S`` had passed — the
CONNECT head had long arrived — and the cancelled read answered ``400`` with nothing read. A deadline of 0 here
is that task: it looks only once the deadline has passed. The head that was already there must be served; a
client that sent nothing is still cut at the deadline.
"""

from __future__ import annotations

import io
import socket

import pytest
import trio
import trio.testing

import supervisor.boundary.egress as egress
from supervisor.boundary.egress import EgressCapture, EgressLinks
from supervisor.jsonlog import JsonLog
from supervisor.link.h2link import Link, LinkStream
from supervisor.protocol.egress import EgressReply, encode_reply_headers
from supervisor.protocol.identity import ConnectionIdentity

IDENTITY = ConnectionIdentity(binary_path="/usr/bin/curl", binary_sha256=None, ancestors=(), cmdline_paths=(),
                              pid=7, start_time=1, uid=1000, owners=1, resolved_in_us=5)  # fmt: skip


class _Resolver:
    def resolve(self, local: object, remote: object) -> ConnectionIdentity:
        return IDENTITY


async def _proxy_answer(head: bytes, nursery: trio.Nursery) -> bytes:
    """Send ``head`` on a loopback connection, then let the proxy handler look at it (deadline 0)."""
    left, right = trio.testing.memory_stream_pair()

    async def control(stream: LinkStream) -> None:
        await stream.send_headers(encode_reply_headers(EgressReply(200)))
        await stream.send_eof()

    client_link = Link(left, client=True, name="link")
    await nursery.start(client_link.run)
    nursery.start_soon(Link(right, client=False, handler=control, name="control").run)
    pool = EgressLinks()
    pool.add(client_link)
    capture = EgressCapture(fds={}, links=pool, resolver=_Resolver(), log=JsonLog("boundary", stream=io.StringIO()),  # type: ignore[arg-type]
                            accepting=lambda: True)  # fmt: skip

    listener = socket.create_server(("127.0.0.1", 0))
    with listener:
        agent = socket.create_connection(listener.getsockname())
        server_side, _ = listener.accept()
    with agent:
        agent.sendall(head)
        server_side.setblocking(False)
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(server_side))
        async with trio.open_nursery() as handler:
            handler.start_soon(capture._proxy, stream)
            agent.settimeout(30)
            answer = await trio.to_thread.run_sync(agent.recv, 4096)
            handler.cancel_scope.cancel()
        await trio.aclose_forcefully(stream)
    return answer


async def test_a_head_that_arrived_before_a_late_look_is_served(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(egress, "HEAD_READ_DEADLINE_S", 0)
    async with trio.open_nursery() as nursery:
        answer = await _proxy_answer(b"CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\n\r\n", nursery)
        nursery.cancel_scope.cancel()
    assert answer.startswith(b"HTTP/1.1 200"), answer


async def test_nothing_sent_is_still_cut_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(egress, "HEAD_READ_DEADLINE_S", 0)
    async with trio.open_nursery() as nursery:
        assert (await _proxy_answer(b"", nursery)).startswith(b"HTTP/1.1 400")
        partial = await _proxy_answer(b"CONNECT api.test:443 HTTP/1.1\r\n", nursery)
        nursery.cancel_scope.cancel()
    assert partial.startswith(b"HTTP/1.1 408"), partial
