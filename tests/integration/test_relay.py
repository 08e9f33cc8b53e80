"""relay(): half-close, failure and reset propagation, idle timeout, backpressure, and many parallel transfers.

In-memory pairs for the semantics (virtual time), real loopback TCP for what only sockets show (a reset
reaching the client, not a clean end)."""

from __future__ import annotations

import gc
import hashlib
import random
import resource
import socket
import struct
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
import trio
import trio.lowlevel
import trio.testing

from supervisor.link.relay import Flow, RelayEnd, RelayStats, relay


class Counting(trio.abc.HalfCloseableStream):
    """A stream wrapper that counts what the relay has taken from it."""

    def __init__(self, inner: trio.abc.HalfCloseableStream) -> None:
        self.inner = inner
        self.received = 0

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self.inner.receive_some(max_bytes)
        self.received += len(data)
        return data

    async def aclose(self) -> None:
        await self.inner.aclose()


async def read_all(stream: trio.abc.ReceiveStream) -> bytes:
    out = bytearray()
    while data := await stream.receive_some(65536):
        out += data
    return bytes(out)


@asynccontextmanager
async def relayed(
    make_pair: Callable[[], tuple[trio.abc.HalfCloseableStream, trio.abc.HalfCloseableStream]] = (
        trio.testing.memory_stream_pair
    ),
    *,
    idle_timeout: float = 60.0,
) -> AsyncIterator[tuple[trio.abc.HalfCloseableStream, trio.abc.HalfCloseableStream, list[RelayStats]]]:
    """client <-> [a relay b] <-> server, with the relay running in the background."""
    client, a = trio.testing.memory_stream_pair()
    b, server = make_pair()
    result: list[RelayStats] = []

    async def run() -> None:
        result.append(await relay(a, b, idle_timeout=idle_timeout))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        yield client, server, result


# --- semantics on in-memory streams -----------------------------------------------------------------------------


@pytest.mark.parametrize("first", ["client", "server"])
async def test_half_close_propagates_each_way(first: str) -> None:
    async with relayed() as (client, server, result):
        if first == "client":
            await client.send_all(b"request")
            await client.send_eof()
            assert await read_all(server) == b"request"  # EOF reached the server...
            await server.send_all(b"response after EOF")  # ...which can still answer
            await server.send_eof()
            assert await read_all(client) == b"response after EOF"
        else:
            await server.send_all(b"banner")
            await server.send_eof()
            assert await read_all(client) == b"banner"
            await client.send_all(b"late request")
            await client.send_eof()
            assert await read_all(server) == b"late request"
    (stats,) = result
    assert stats.error is None
    assert stats.closed_by == (RelayEnd.A if first == "client" else RelayEnd.B)
    sizes = (len(b"request"), len(b"response after EOF")) if first == "client" else (12, 6)
    assert (stats.bytes_a_to_b, stats.bytes_b_to_a) == sizes


async def test_server_failure_closes_both_and_is_blamed_on_b() -> None:
    async with relayed() as (client, server, result):
        await client.send_all(b"x")
        assert await server.receive_some() == b"x"
        await server.aclose()  # the upstream goes away without EOF on its read side
        await client.send_all(b"more")
        assert await read_all(client) == b""  # the relay closed the client too
    (stats,) = result
    assert stats.closed_by == RelayEnd.B and stats.error is not None and stats.error.startswith("b:")


async def test_client_failure_is_blamed_on_a() -> None:
    async with relayed() as (client, server, result):
        await client.aclose()
        # the client's read side is gone; EOF from it is a clean a-side end, the server's reply has nowhere to go
        assert await read_all(server) == b""
        await server.send_all(b"reply")
        with pytest.raises(trio.BrokenResourceError):
            for _ in range(10):
                await server.send_all(b"reply")
                await trio.lowlevel.checkpoint()
    (stats,) = result
    assert stats.closed_by == RelayEnd.A and stats.error is not None and stats.error.startswith("a:")


# --- the options the other pumps of the project became (one relay) ------------------------------------------


async def test_eof_of_a_side_without_half_close_ends_the_relay_and_close_false_leaves_the_streams() -> None:
    """Streams with no half-close (TLS after a 101): the first EOF ends both directions; ``close=False``."""
    client, a = trio.testing.memory_stream_pair()
    b, server = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.send_all, b"from upstream")
        stats = None

        async def run() -> None:
            nonlocal stats
            stats = await relay(a, b, idle_timeout=60, half_close=(), close=False)

        nursery.start_soon(run)
        assert await client.receive_some() == b"from upstream"
        await client.send_eof()
    assert stats is not None and stats.closed_by == RelayEnd.A and stats.error is None
    await b.send_all(b"still open")  # not closed by the relay: the caller owns the streams
    assert await server.receive_some() == b"still open"


async def test_filter_shapes_what_is_sent_and_counted_and_can_stop() -> None:
    seen: list[bytes] = []

    def no_x(data: bytes) -> tuple[bytes, Flow]:
        seen.append(data)
        return data.replace(b"x", b""), Flow.STOP if b"!" in data else Flow.MORE

    client, a = trio.testing.memory_stream_pair()
    b, server = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        result: list[RelayStats] = []

        async def run() -> None:
            result.append(await relay(a, b, idle_timeout=60, filter_a=no_x))

        nursery.start_soon(run)
        await client.send_all(b"axbx")
        assert await server.receive_some() == b"ab"
        await client.send_all(b"c!")
        assert await read_all(server) == b"c!"  # what the filter passed goes out, then the relay ends
    (stats,) = result
    assert (stats.closed_by, stats.error, stats.bytes_a_to_b) == (RelayEnd.FILTER, None, 4)
    assert seen == [b"axbx", b"c!"]


async def test_filter_eof_half_closes_and_the_other_sides_eof_ends() -> None:
    """The boundary's plain-HTTP forward: exactly the body goes up, then EOF; the response's EOF ends it."""
    budget = [5]

    def body_of_five(data: bytes) -> tuple[bytes, Flow]:
        passed = data[: budget[0]]
        budget[0] -= len(passed)
        return passed, Flow.EOF if budget[0] == 0 else Flow.MORE

    client, a = trio.testing.memory_stream_pair()
    b, server = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        result: list[RelayStats] = []

        async def run() -> None:
            result.append(await relay(a, b, idle_timeout=60, half_close={RelayEnd.A}, filter_a=body_of_five))

        nursery.start_soon(run)
        await client.send_all(b"123")
        await client.send_all(b"45 and a pipelined request")  # the agent does not end its side
        assert await read_all(server) == b"12345"  # the body, then EOF
        await server.send_all(b"response")
        await server.send_eof()
        assert await read_all(client) == b"response"
    (stats,) = result
    assert stats.closed_by == RelayEnd.A and stats.error is None  # the body's end came first
    assert (stats.bytes_a_to_b, stats.bytes_b_to_a) == (5, len(b"response"))


async def test_half_close_needs_a_half_closeable_other_end() -> None:
    a = trio.testing.MemorySendStream()
    with pytest.raises(TypeError):
        await relay(trio.testing.memory_stream_pair()[0], a, idle_timeout=1)  # type: ignore[arg-type]


async def test_idle_timeout_in_virtual_time(autojump_clock: trio.testing.MockClock) -> None:
    start = trio.current_time()
    async with relayed(idle_timeout=30.0) as (client, _server, result):
        assert await read_all(client) == b""
    (stats,) = result
    assert stats.closed_by == RelayEnd.IDLE and stats.error is None
    assert trio.current_time() - start == pytest.approx(30.0)
    assert stats.duration_s == pytest.approx(30.0)


async def test_activity_in_either_direction_postpones_idle(autojump_clock: trio.testing.MockClock) -> None:
    start = trio.current_time()
    async with relayed(idle_timeout=10.0) as (client, server, result):
        for i in range(6):  # 6 x 8 s of activity: 48 s, well past one idle period
            await trio.sleep(8)
            if i % 2:
                await client.send_all(b"ping")
                assert await server.receive_some() == b"ping"
            else:
                await server.send_all(b"pong")
                assert await client.receive_some() == b"pong"
        assert not result
        assert await read_all(client) == b""
    (stats,) = result
    assert stats.closed_by == RelayEnd.IDLE
    assert trio.current_time() - start == pytest.approx(58.0)


async def test_frequent_activity_moves_the_idle_deadline_in_steps(autojump_clock: trio.testing.MockClock) -> None:
    """Chunks every 0.25 s for 10 s, then quiet: the deadline moved in steps of 1 s (1 % of 100 s, at most 1 s),
    so the relay ends between 99 and 100 s after the last chunk — never later than a full idle period."""
    start = trio.current_time()
    async with relayed(idle_timeout=100.0) as (client, server, result):
        for _ in range(40):
            await trio.sleep(0.25)
            await client.send_all(b"x")
            assert await server.receive_some() == b"x"
        last = trio.current_time()
        assert await read_all(client) == b""
    (stats,) = result
    assert stats.closed_by == RelayEnd.IDLE
    assert last - start == pytest.approx(10.0)
    assert 99.0 <= trio.current_time() - last <= 100.0


async def test_backpressure_holds_at_most_one_chunk() -> None:
    client, a_inner = trio.testing.memory_stream_pair()
    a = Counting(a_inner)
    b, server = trio.testing.lockstep_stream_pair()  # send_all blocks until the server reads
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: relay(a, b, idle_timeout=60, chunk=1000))
        await client.send_all(b"z" * 100_000)
        await trio.testing.wait_all_tasks_blocked()
        assert a.received <= 1000  # the relay stopped reading the client while the server does not read
        got = bytearray()
        while len(got) < 100_000:
            got += await server.receive_some(5000)
        assert bytes(got) == b"z" * 100_000
        nursery.cancel_scope.cancel()


async def test_an_idle_relay_keeps_none_of_what_it_relayed() -> None:
    """After a 200 KB chunk each way the relay sits idle holding nothing of them (it used to keep each
    direction's last chunk, up to 256 KiB, for as long as the connection stayed open)."""
    client, a = trio.testing.memory_stream_pair()
    b, server = trio.testing.memory_stream_pair()
    size = 200_000
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: relay(a, b, idle_timeout=60))
        gc.collect()
        tracemalloc.start()
        try:
            await client.send_all(b"u" * size)
            await server.send_all(b"d" * size)
            got_up, got_down = 0, 0
            while got_up < size:
                got_up += len(await server.receive_some(size))
            while got_down < size:
                got_down += len(await client.receive_some(size))
            await trio.testing.wait_all_tasks_blocked()
            gc.collect()
            held = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        assert held < size // 4, held
        nursery.cancel_scope.cancel()


async def test_a_relay_holds_one_task_of_its_own() -> None:
    """b → a runs in the caller's task: an idle connection holds one relay in each daemon, and a task is ~2 KB
    of its memory (docs/performance.md "Where each target stands")."""
    client, a = trio.testing.memory_stream_pair()
    b, server = trio.testing.memory_stream_pair()
    caller: list[trio.lowlevel.Task] = []

    async def run() -> None:
        caller.append(trio.lowlevel.current_task())
        await relay(a, b, idle_timeout=60)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await trio.testing.wait_all_tasks_blocked()
        (relay_nursery,) = caller[0].child_nurseries
        assert len(relay_nursery.child_tasks) == 1
        await client.send_all(b"up")
        assert await server.receive_some(10) == b"up"
        await server.send_all(b"down")  # the caller's own pump
        assert await client.receive_some(10) == b"down"
        nursery.cancel_scope.cancel()


async def test_outside_cancellation_closes_both() -> None:
    client, a = trio.testing.memory_stream_pair()
    b, server = trio.testing.memory_stream_pair()
    returned = False
    async with trio.open_nursery() as nursery:

        async def run() -> None:
            nonlocal returned
            await relay(a, b, idle_timeout=60)
            returned = True

        nursery.start_soon(run)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert not returned
    assert await read_all(client) == b""
    assert await read_all(server) == b""


async def test_relay_between_pairs_is_a_half_closeable_stream() -> None:
    """trio's own conformance check, run on client <-> relay <-> server as one virtual stream."""
    async with trio.open_nursery() as nursery:

        async def maker() -> tuple[trio.abc.HalfCloseableStream, trio.abc.HalfCloseableStream]:
            client, a = trio.testing.memory_stream_pair()
            b, server = trio.testing.memory_stream_pair()
            nursery.start_soon(lambda: relay(a, b, idle_timeout=60))
            return client, server

        await trio.testing.check_half_closeable_stream(maker, None)
        nursery.cancel_scope.cancel()


# --- real sockets ---------------------------------------------------------------------------------------------


@asynccontextmanager
async def tcp_pairs() -> AsyncIterator[Callable[[], Awaitable[tuple[trio.SocketStream, trio.SocketStream]]]]:
    """Yields a function making a connected (client, server) loopback TCP pair; safe to call concurrently."""
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    waiting: dict[tuple[str, int], trio.MemorySendChannel[trio.SocketStream]] = {}
    early: dict[tuple[str, int], trio.SocketStream] = {}

    async def acceptor() -> None:
        while True:
            server = await listener.accept()
            peer = server.socket.getpeername()
            if peer in waiting:
                waiting.pop(peer).send_nowait(server)
            else:
                early[peer] = server

    async def pair() -> tuple[trio.SocketStream, trio.SocketStream]:
        client = await trio.open_tcp_stream("127.0.0.1", port)
        me = client.socket.getsockname()
        if me in early:
            return client, early.pop(me)
        send, receive = trio.open_memory_channel[trio.SocketStream](1)
        waiting[me] = send
        return client, await receive.receive()

    async with listener, trio.open_nursery() as nursery:
        nursery.start_soon(acceptor)
        try:
            yield pair
        finally:
            nursery.cancel_scope.cancel()  # nothing awaits after this: a Cancelled here would eat the test's error


def reset_on_close(stream: trio.SocketStream) -> None:
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


async def test_sockets_half_close_both_ways() -> None:
    async with tcp_pairs() as pair:
        client, a = await pair()
        b, server = await pair()
        async with trio.open_nursery() as nursery:
            result: list[RelayStats] = []
            nursery.start_soon(lambda: _collect(result, relay(a, b, idle_timeout=60)))
            await client.send_all(b"GET / HTTP/1.0\r\n\r\n")
            await client.send_eof()
            assert await read_all(server) == b"GET / HTTP/1.0\r\n\r\n"
            await server.send_all(b"HTTP/1.0 200 OK\r\n\r\nbody")
            await server.send_eof()
            assert await read_all(client) == b"HTTP/1.0 200 OK\r\n\r\nbody"
        (stats,) = result
        assert stats.error is None and stats.closed_by == RelayEnd.A
        assert (stats.bytes_a_to_b, stats.bytes_b_to_a) == (18, 23)
        await client.aclose()
        await server.aclose()


async def _collect(out: list[RelayStats], coro: Awaitable[RelayStats]) -> None:
    out.append(await coro)


@pytest.mark.parametrize("who_resets", ["upstream", "client"])
async def test_reset_mid_transfer_reaches_the_other_side_as_a_reset(who_resets: str) -> None:
    async with tcp_pairs() as pair:
        client, a = await pair()
        b, server = await pair()
        result: list[RelayStats] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: _collect(result, relay(a, b, idle_timeout=60)))
            resetter, victim = (server, client) if who_resets == "upstream" else (client, server)
            await resetter.send_all(b"partial" * 1000)
            got = bytearray()
            while len(got) < 7000:
                got += await victim.receive_some(65536)
            reset_on_close(resetter)
            await resetter.aclose()
            # the victim must see a broken connection, never a clean EOF that passes for a complete transfer
            with pytest.raises(trio.BrokenResourceError):
                while await victim.receive_some(65536):
                    pass
        (stats,) = result
        assert stats.error is not None
        assert stats.closed_by == (RelayEnd.B if who_resets == "upstream" else RelayEnd.A)
        await victim.aclose()


async def test_a_thousand_parallel_transfers_arrive_intact() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4500:
        pytest.skip(f"needs 4,500 file descriptors, hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 4500) if hard == resource.RLIM_INFINITY else hard, hard))
    rng = random.Random(1234)
    sizes = [
        rng.choice([0, 1, rng.randrange(2, 4096), rng.randrange(4096, 65536), rng.randrange(65536, 300_000)])
        for _ in range(1000)
    ]
    ok: list[int] = []

    async def echo(stream: trio.SocketStream) -> None:
        async with stream:
            while data := await stream.receive_some(65536):
                await stream.send_all(data)
            await stream.send_eof()

    async with tcp_pairs() as pair, trio.open_nursery() as nursery:

        async def transfer(i: int) -> None:
            client, a = await pair()
            b, server = await pair()
            nursery.start_soon(echo, server)
            nursery.start_soon(lambda: relay(a, b, idle_timeout=60))
            payload = random.Random(i).randbytes(sizes[i])
            async with client:

                async def send() -> None:
                    await client.send_all(payload)
                    await client.send_eof()

                async with trio.open_nursery() as inner:
                    inner.start_soon(send)
                    back = await read_all(client)
            assert hashlib.sha256(back).digest() == hashlib.sha256(payload).digest(), i
            ok.append(i)

        with trio.fail_after(120):
            async with trio.open_nursery() as transfers:
                for i in range(1000):
                    transfers.start_soon(transfer, i)
    assert sorted(ok) == list(range(1000))


async def test_a_socket_is_received_from_with_a_buffer_the_size_of_what_is_queued() -> None:
    """``recv(n)`` allocates n bytes first: a small message is received with a buffer its size, a bulk transfer's
    backlog in the relay's whole chunks, and the next small message with a small buffer again."""
    sizes: list[int] = []
    async with tcp_pairs() as pair:
        client, a = await pair()
        b, server = await pair()
        recv = a.socket.recv

        async def spy(size: int, *args: int) -> bytes:
            sizes.append(size)
            return await recv(size, *args)

        a.socket.recv = spy  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: relay(a, b, idle_timeout=60))
            await client.send_all(b"x" * 1024)
            assert await server.receive_some(65536) == b"x" * 1024
            assert sizes and max(sizes) <= 4096, sizes
            bulk = 8 * 1024 * 1024

            async def drain() -> None:
                got = 0
                while got < bulk:
                    got += len(await server.receive_some(1 << 20))

            async with trio.open_nursery() as transfer:
                transfer.start_soon(drain)
                await client.send_all(b"y" * bulk)
            assert max(sizes) == 256 * 1024, "a bulk transfer's backlog is received in whole chunks"
            sizes.clear()
            await client.send_all(b"z" * 100)
            assert await server.receive_some(65536) == b"z" * 100
            await client.send_all(b"z" * 100)
            assert await server.receive_some(65536) == b"z" * 100
            assert sizes[-1] <= 4096, sizes[-3:]
            nursery.cancel_scope.cancel()
        await client.aclose()
        await server.aclose()
