"""The HTTP/2 link over in-memory transports: streams, half-close, reset, flow control, loss of the link."""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import h2.events
import pytest
import trio
import trio.lowlevel
import trio.testing

from supervisor.link.h2link import Link, LinkClosed, LinkStream


async def echo(stream: LinkStream) -> None:
    await stream.send_headers([(":status", "200")])
    while data := await stream.receive_some(65536):
        await stream.send_all(data)
    await stream.send_eof()


@asynccontextmanager
async def link_pair(handler=echo) -> AsyncIterator[tuple[Link, Link]]:  # type: ignore[no-untyped-def]
    left, right = trio.testing.memory_stream_pair()
    client = Link(left, client=True, name="client")
    server = Link(right, client=False, handler=handler, name="server")
    async with trio.open_nursery() as nursery:
        await nursery.start(client.run)
        await nursery.start(server.run)
        yield client, server
        nursery.cancel_scope.cancel()


REQ = [(":method", "POST"), (":path", "/echo"), (":scheme", "https"), (":authority", "boundary")]


async def test_echo_roundtrip_and_half_close() -> None:
    async with link_pair() as (client, _server):
        stream = await client.open_stream(REQ)
        headers = await stream.response()
        assert dict(headers)[":status"] == "200"
        await stream.send_all(b"hello")
        assert await stream.receive_some() == b"hello"
        await stream.send_eof()
        assert await stream.receive_some() == b""


async def test_many_concurrent_streams_keep_their_bytes() -> None:
    async with link_pair() as (client, _server):
        results: dict[int, bool] = {}

        async def one(i: int) -> None:
            payload = os.urandom(1000 + i * 997)
            stream = await client.open_stream(REQ)
            got = bytearray()

            async def reader() -> None:
                while data := await stream.receive_some():
                    got.extend(data)

            async with trio.open_nursery() as n:
                n.start_soon(reader)
                await stream.send_all(payload)
                await stream.send_eof()
            results[i] = hashlib.sha256(got).digest() == hashlib.sha256(payload).digest()

        async with trio.open_nursery() as n:
            for i in range(50):
                n.start_soon(one, i)
        assert len(results) == 50 and all(results.values())


async def test_large_transfer_beyond_windows() -> None:
    """More than the stream and connection windows: only works if acknowledgements flow back."""
    size = 20 * 1024 * 1024
    async with link_pair() as (client, _server):
        stream = await client.open_stream(REQ)
        payload = os.urandom(1024 * 1024)
        received = 0

        async def reader() -> None:
            nonlocal received
            while data := await stream.receive_some():
                received += len(data)

        async with trio.open_nursery() as n:
            n.start_soon(reader)
            for _ in range(size // len(payload)):
                await stream.send_all(payload)
            await stream.send_eof()
        assert received == size


async def test_slow_stream_does_not_stall_another() -> None:
    """Per-stream flow control: a stream whose reader never reads must not block a second stream."""
    async with link_pair() as (client, _server):
        stuck = await client.open_stream(REQ)
        await stuck.response()
        with trio.move_on_after(2) as scope:
            # the echo handler can only echo once the client reads; fill the stuck stream's windows
            await stuck.send_all(os.urandom(12 * 1024 * 1024))
        assert scope.cancelled_caught, "sending should block once the stuck stream's windows are full"
        other = await client.open_stream(REQ)
        await other.response()
        with trio.fail_after(5):
            await other.send_all(b"still flowing")
            assert await other.receive_some() == b"still flowing"


async def test_reset_reaches_peer() -> None:
    seen = trio.Event()
    outcome: list[str] = []

    async def handler(stream: LinkStream) -> None:
        await stream.send_headers([(":status", "200")])
        try:
            while await stream.receive_some():
                pass
            outcome.append("eof")
        except trio.BrokenResourceError as exc:
            outcome.append(f"broken: {exc}")
        seen.set()

    async with link_pair(handler) as (client, _server):
        stream = await client.open_stream(REQ)
        await stream.response()
        await stream.send_all(b"x")
        await stream.reset()
        with trio.fail_after(5):
            await seen.wait()
    assert outcome and outcome[0].startswith("broken: stream reset")


async def test_link_loss_breaks_pending_streams() -> None:
    async def hang(stream: LinkStream) -> None:
        await stream.send_headers([(":status", "200")])
        await trio.sleep_forever()

    async with link_pair(hang) as (client, server):
        stream = await client.open_stream(REQ)
        await stream.response()
        await server.aclose("test drops the link")
        with trio.fail_after(5), pytest.raises(LinkClosed):
            await stream.receive_some()
        with pytest.raises(LinkClosed):
            await client.open_stream(REQ)


async def test_link_stream_is_a_half_closeable_stream() -> None:
    """trio's own conformance check for half-closeable streams, run on a pair of link streams."""
    from trio.testing import check_half_closeable_stream

    async def make_pair() -> tuple[LinkStream, LinkStream]:
        left, right = trio.testing.memory_stream_pair()
        accepted: list[LinkStream] = []
        ready = trio.Event()

        async def handler(stream: LinkStream) -> None:
            await stream.send_headers([(":status", "200")])
            accepted.append(stream)
            ready.set()
            await trio.sleep_forever()

        client = Link(left, client=True)
        server = Link(right, client=False, handler=handler)
        nursery.start_soon(client.run)
        nursery.start_soon(server.run)
        stream = await client.open_stream(REQ)
        await stream.response()
        await ready.wait()
        return stream, accepted[0]

    async with trio.open_nursery() as nursery:
        await check_half_closeable_stream(make_pair, None)
        nursery.cancel_scope.cancel()


async def test_reads_smaller_than_a_frame_and_spanning_frames_keep_order() -> None:
    """Received DATA payloads are handed out as they are, split or joined to fit a read (h2link's ``_take``)."""
    big = os.urandom(300 * 1024)  # larger than one DATA frame: h2link splits it
    small = [os.urandom(n) for n in (1, 7, 100, 5000)]
    got: list[bytes] = []

    async def sink(stream: LinkStream) -> None:
        await stream.send_headers([(":status", "200")])
        for size in (3, 10, 70_000, 1):
            got.append(await stream.receive_some(size))
        while data := await stream.receive_some(4096):
            assert len(data) <= 4096
            got.append(data)
        await stream.send_eof()

    async with link_pair(sink) as (client, _server):
        stream = await client.open_stream(REQ)
        await stream.response()
        await stream.send_all(big)
        for chunk in small:
            await stream.send_all(chunk)
        await stream.send_eof()
        with trio.fail_after(10):
            assert await stream.receive_some() == b""
    assert [len(g) for g in got[:4]] == [3, 10, 70_000, 1]
    assert b"".join(got) == big + b"".join(small)


async def test_a_sent_bytearray_may_be_reused_at_once() -> None:
    """send_all returns before the writer has sent the frame: a caller's mutable buffer is copied, bytes are not."""
    async with link_pair() as (client, _server):
        stream = await client.open_stream(REQ)
        await stream.response()
        buffer = bytearray(b"a" * 100_000)
        await stream.send_all(buffer)
        buffer[:] = b"b" * 100_000  # reused before the writer ran
        await stream.send_all(b"c" * 100_000)
        await stream.send_eof()
        got = bytearray()
        while data := await stream.receive_some():
            got += data
        assert got == b"a" * 100_000 + b"c" * 100_000


async def test_a_slow_reader_hands_window_back_in_batches_and_never_stalls() -> None:
    """A consumer slower than the link keeps the sender's window exhausted; the window goes back in batches while
    data is buffered (not one WINDOW_UPDATE per small read), and in full when the reader has caught up."""
    size = 12 * 1024 * 1024 + 1  # not a multiple of any batch: the last bytes must be acknowledged too
    got = 0

    async def slow(stream: LinkStream) -> None:
        nonlocal got
        await stream.send_headers([(":status", "200")])
        while data := await stream.receive_some(16 * 1024):
            got += len(data)
            await trio.lowlevel.checkpoint()
        await stream.send_eof()

    async with link_pair(slow) as (client, _server):
        updates = 0
        dispatch = client._dispatch

        def counting(event: object) -> bool:
            nonlocal updates
            updates += isinstance(event, h2.events.WindowUpdated)
            return dispatch(event)

        client._dispatch = counting  # type: ignore[method-assign]
        stream = await client.open_stream(REQ)
        await stream.response()
        with trio.fail_after(30):
            await stream.send_all(b"x" * size)
            await stream.send_eof()
            assert await stream.receive_some() == b""
    assert got == size
    assert updates <= 30, updates  # 11 here; one per read before (80 here)


async def test_one_byte_frames_are_gathered_not_kept_one_object_each() -> None:
    """A peer that sends a window's worth of one-byte DATA frames to a reader that is not reading must not cost an
    object (~40 bytes) per byte: small payloads are gathered as they arrive, and come out intact and in order."""
    count = 20_000
    release = trio.Event()
    got = bytearray()
    streams: list[LinkStream] = []

    async def late_reader(stream: LinkStream) -> None:
        streams.append(stream)
        await stream.send_headers([(":status", "200")])
        await release.wait()
        while data := await stream.receive_some(7):
            got.extend(data)
        await stream.send_eof()

    async with link_pair(late_reader) as (client, _server):
        stream = await client.open_stream(REQ)
        await stream.response()
        payload = bytes(i % 251 for i in range(count))
        for i in range(count):
            await stream.send_all(payload[i : i + 1])  # one DATA frame each
        await stream.send_eof()
        with trio.fail_after(10):
            while not streams or streams[0]._buffered < count:  # everything arrived, nothing read yet
                await trio.lowlevel.checkpoint()
        assert len(streams[0]._chunks) <= 2
        release.set()
        with trio.fail_after(10):
            assert await stream.receive_some() == b""
    assert bytes(got) == payload
