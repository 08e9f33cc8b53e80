"""One idle rule on the inspected paths, in virtual time (``autojump_clock``): a connection is idle only when
no byte moved in either direction for the idle timeout (``supervisor/control/l7/idle.py``).

Both streams are in-memory pairs, so the test controls every byte and the clock jumps over the waits:

* an upgraded stream whose server keeps talking while the client is silent stays up;
* an inspected upload making steady progress while the origin has not answered gets its answer, not a 504;
* where nothing moves either way, the connection ends after exactly the idle timeout.
"""

from __future__ import annotations

import io

import h11
import pytest
import trio
import trio.testing

from supervisor.control.credentials import Credentials
from supervisor.control.l7 import InspectStats, InterceptionCA, Limits, inspect, upstream_context
from supervisor.control.l7.idle import IdleClock
from supervisor.control.policy import BinaryIdentity, L4Request, PolicyStore, compile_policy, load_policy_text
from supervisor.jsonlog import JsonLog
from supervisor.link.relay import RelayEnd, relay

IDLE = 10.0
POLICY = """
version: 1
network_policies:
  api:
    endpoints:
      - host: api.test
        port: 80
        protocol: rest
        enforcement: enforce
        rules: [{allow: {method: POST, path: "/upload"}}]
    binaries: [{path: /usr/bin/curl}]
"""


async def test_idle_clock_guards_end_at_the_deadline_and_touch_moves_them(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = IdleClock(IDLE)
    start = trio.current_time()
    with clock.guard() as scope:
        await trio.sleep(IDLE * 3)
    assert scope.cancelled_caught and trio.current_time() - start == pytest.approx(IDLE)

    async def toucher() -> None:
        for _ in range(5):
            await trio.sleep(IDLE * 0.8)
            clock.touch()

    clock.touch()
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(toucher)
        with clock.guard() as scope:
            await trio.sleep_forever()
    assert scope.cancelled_caught
    assert trio.current_time() - start == pytest.approx(IDLE * 0.8 * 5 + IDLE)


async def test_an_upgraded_stream_with_a_silent_client_is_not_idle(autojump_clock: trio.testing.MockClock) -> None:
    agent_side, agent = trio.testing.memory_stream_pair()
    upstream_side, upstream = trio.testing.memory_stream_pair()
    received = bytearray()
    start = trio.current_time()

    async def server() -> None:
        for _ in range(10):  # 10 x 0.8 idle: the server talks, the client never does
            await trio.sleep(IDLE * 0.8)
            await upstream.send_all(b"tick")

    async def client() -> None:
        while data := await agent.receive_some(1024):
            received.extend(data)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(server)
        nursery.start_soon(client)
        # as the inspected path relays an upgraded connection (TLS: no half-close)
        end = await relay(agent_side, upstream_side, idle_timeout=IDLE, chunk=1024, half_close=(), close=False)
        await agent_side.aclose()
        nursery.cancel_scope.cancel()
    assert bytes(received) == b"tick" * 10
    assert end.closed_by == RelayEnd.IDLE  # only once the server stopped too: one idle period after its last byte
    # (the relay moves its deadline in steps of 1 % of the timeout: it may end up to that much early)
    assert trio.current_time() - start == pytest.approx(IDLE * 0.8 * 10 + IDLE, abs=IDLE / 100)


async def _serve_slow_upload(upstream: trio.abc.Stream, seen: list[int]) -> None:
    """An origin that reads the whole body (it arrives slowly), then answers 200."""
    conn = h11.Connection(h11.SERVER)
    size = 0
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await upstream.receive_some(65536))
        elif isinstance(event, h11.Data):
            size += len(event.data)
        elif isinstance(event, h11.EndOfMessage):
            break
    seen.append(size)
    await upstream.send_all(conn.send(h11.Response(status_code=200, headers=[("content-length", "2")])) or b"")
    await upstream.send_all((conn.send(h11.Data(data=b"ok")) or b"") + (conn.send(h11.EndOfMessage()) or b""))


async def _inspect(agent_side: trio.abc.HalfCloseableStream, upstream_side: trio.abc.HalfCloseableStream
                   ) -> InspectStats:  # fmt: skip
    store = PolicyStore(compile_policy(load_policy_text(POLICY, "idle.yaml")), source="idle.yaml")
    snapshot = store.snapshot()
    l4 = snapshot.decide_l4(L4Request("api.test", 80, BinaryIdentity("/usr/bin/curl", None)))

    async def dial() -> trio.abc.HalfCloseableStream:
        return upstream_side

    return await inspect(agent_side, host="api.test", port=80, tls=False, snapshot=snapshot, l4=l4,
                         connect_upstream=dial, ca=_CA, credentials=Credentials.from_mapping({}),
                         upstream_ssl=upstream_context(system_trust=False),
                         log=JsonLog("control", stream=io.StringIO()), limits=Limits(idle_timeout=IDLE))  # fmt: skip


_CA = InterceptionCA.generate("idle-tests")


async def test_an_upload_making_steady_progress_gets_its_answer_not_a_504(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent_side, agent = trio.testing.memory_stream_pair()
    upstream_side, upstream = trio.testing.memory_stream_pair()
    seen: list[int] = []
    answer = bytearray()
    pieces, piece = 12, b"x" * 1000

    async def client() -> None:
        await agent.send_all(b"POST /upload HTTP/1.1\r\nHost: api.test\r\nContent-Length: %d\r\n\r\n"
                             % (pieces * len(piece)))  # fmt: skip
        for _ in range(pieces):  # 12 x 0.7 idle: the whole upload takes 8.4 idle periods
            await trio.sleep(IDLE * 0.7)
            await agent.send_all(piece)
        while data := await agent.receive_some(65536):
            answer.extend(data)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(client)
        nursery.start_soon(_serve_slow_upload, upstream, seen)
        stats = await _inspect(agent_side, upstream_side)
    assert bytes(answer).startswith(b"HTTP/1.1 200 "), bytes(answer)
    assert seen == [pieces * len(piece)] and stats.allowed == 1


async def test_nothing_moving_either_way_ends_after_exactly_the_idle_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent_side, agent = trio.testing.memory_stream_pair()
    upstream_side, _upstream = trio.testing.memory_stream_pair()
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(agent.send_all, b"POST /upload HTTP/1.1\r\nHost: api.test\r\nContent-Length: 10\r\n\r\n")
        stats = await _inspect(agent_side, upstream_side)  # the body never comes, the origin never answers
    assert "timeout" in (stats.error or ""), stats  # the agent's body or the origin's answer: both idle
    # after exactly IDLE the connection is judged idle; a 504 then drains the agent for drain_timeout at most
    assert IDLE <= trio.current_time() - start <= IDLE + Limits().drain_timeout
