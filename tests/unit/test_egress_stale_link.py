"""A dead egress link is skipped, not a refusal: the connection goes to the next live link.

Found by the real pods of tests/k8s: when control's pod is deleted, its connections never get a FIN
(the pod's network namespace is gone), so the boundary still holds them; the agent's first request after the
new control resumed picked one and got 503 ``link-failed``. Here one link's control "vanishes" on first use (the
transport closes without an answer) and another answers; the hand-off must end at the live one.
"""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
import trio.testing

from supervisor.boundary.egress import HANDOFF_ATTEMPTS, EgressCapture, EgressLinks
from supervisor.jsonlog import JsonLog
from supervisor.link.h2link import Link, LinkStream
from supervisor.protocol.egress import CaptureKind, EgressReply, encode_reply_headers
from supervisor.protocol.identity import ConnectionIdentity

IDENTITY = ConnectionIdentity(binary_path="/usr/bin/curl", binary_sha256=None, ancestors=(), cmdline_paths=(),
                              pid=7, start_time=1, uid=1000, owners=1, resolved_in_us=5)  # fmt: skip


class OrderedLinks(EgressLinks):
    """Picks live links in the order they were added (the pool's own order is a set's)."""

    def __init__(self) -> None:
        super().__init__()
        self.order: list[Link] = []

    def add(self, link: Link) -> None:
        self.order.append(link)
        super().add(link)

    async def pick(self) -> Link | None:
        return next((link for link in self.order if not link.closed), None)


@asynccontextmanager
async def links(dead: int, live: int) -> AsyncIterator[tuple[OrderedLinks, list[str]]]:
    pool, answered = OrderedLinks(), []
    async with trio.open_nursery() as nursery:
        for index in range(dead + live):
            left, right = trio.testing.memory_stream_pair()

            def handler_for(right: trio.abc.Stream, alive: bool, name: str):  # type: ignore[no-untyped-def]
                async def handler(stream: LinkStream) -> None:
                    if not alive:  # control is gone: the connection breaks, no answer
                        await right.aclose()
                        return
                    answered.append(name)
                    await stream.send_headers(encode_reply_headers(EgressReply(200)))
                    await stream.send_eof()

                return handler

            name = f"link-{index}"
            client = Link(left, client=True, name=name)
            server = Link(right, client=False, handler=handler_for(right, index >= dead, name), name=f"control-{index}")
            await nursery.start(client.run)
            nursery.start_soon(server.run)
            pool.add(client)
        yield pool, answered
        nursery.cancel_scope.cancel()


def capture(pool: EgressLinks, out: io.StringIO) -> EgressCapture:
    return EgressCapture(fds={}, links=pool, resolver=None, log=JsonLog("boundary", stream=out),  # type: ignore[arg-type]
                         accepting=lambda: True)  # fmt: skip


async def test_a_connection_skips_links_whose_control_vanished() -> None:
    async with links(dead=2, live=1) as (pool, answered):
        out = io.StringIO()
        stream, reply = await capture(pool, out)._hand_off("secure.test", 443, CaptureKind.CONNECT, IDENTITY, 40000)
        assert reply.allowed and stream is not None, reply
        assert answered == ["link-2"]
        assert [link.closed for link in pool.order] == [True, True, False]
        assert "egress.refused" not in out.getvalue()


async def test_only_dead_links_is_still_a_refusal_naming_the_link() -> None:
    async with links(dead=HANDOFF_ATTEMPTS, live=1) as (pool, answered):
        out = io.StringIO()
        stream, reply = await capture(pool, out)._hand_off("secure.test", 443, CaptureKind.CONNECT, IDENTITY, 40000)
        assert stream is None and reply.status == 503 and reply.reason == "link-failed"
        assert answered == []  # bounded: the live link behind four dead ones is not reached
        events = [json.loads(line) for line in out.getvalue().splitlines()]
        assert [e["reason"] for e in events if e["event"] == "egress.refused"] == ["link-failed"]
