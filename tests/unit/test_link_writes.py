"""How the link writes (supervisor/link/h2link.py): one transport write per wake-up of its writer, the
frames of one exchange gathered into it, small frames packed into one TLS record; flow control unchanged."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import hyperframe.frame
import trio
import trio.testing

from supervisor.link.h2link import RECORD, Link, LinkStream, _pack
from supervisor.link.rpc import Router, call, open_channel


class Recorder(trio.abc.Stream):
    """A transport that records each write the link makes (as the frames it carried) and passes it on."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.writes: list[list[str]] = []

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(_frames(bytes(data)))
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def _frames(data: bytes) -> list[str]:
    """``TYPE/E`` (END_STREAM) for each frame in a write; a write is whole frames, never a part of one."""
    names, at = [], 0
    if data.startswith(PREFACE):
        names, at = ["preface"], len(PREFACE)
    while at < len(data):
        frame, length = hyperframe.frame.Frame.parse_frame_header(memoryview(data)[at : at + 9])
        names.append(type(frame).__name__.removesuffix("Frame") + ("/E" if "END_STREAM" in frame.flags else ""))
        at += 9 + length
    assert at == len(data), "a write ended inside a frame"
    return names


async def _exec(body: dict[str, Any], stream: LinkStream, accept: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    await accept({"handle": "x_0123456789abcdef"})
    await stream.send_all(b"\x01output and the exit frame")


async def _status(body: dict[str, Any]) -> dict[str, Any]:
    return {"state": "running", **body}


@asynccontextmanager
async def _linked(client_wire: Any, server_wire: Any) -> AsyncIterator[tuple[Link, Link]]:
    """A client and a server link over the two wires (each records its writes), both running, the prefaces and
    SETTINGS acknowledgements behind them and the records cleared."""
    router = Router()
    router.unary_raw("/v1/status", _status)
    router.channel_raw("/v1/exec", _exec)
    client = Link(client_wire, client=True, name="client")
    server = Link(server_wire, client=False, handler=router.handle, name="server")
    async with trio.open_nursery() as nursery:
        await nursery.start(client.run)
        await nursery.start(server.run)
        await call(client, "/v1/status")
        await trio.testing.wait_all_tasks_blocked()
        client_wire.writes.clear()
        server_wire.writes.clear()
        yield client, server
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def recorded_pair() -> AsyncIterator[tuple[Link, Recorder, Link, Recorder]]:
    left, right = trio.testing.memory_stream_pair()
    client_wire, server_wire = Recorder(left), Recorder(right)
    async with _linked(client_wire, server_wire) as (client, server):
        yield client, client_wire, server, server_wire


async def test_a_unary_call_is_one_write_each_way() -> None:
    async with recorded_pair() as (client, client_wire, _server, server_wire):
        for _ in range(20):
            assert await call(client, "/v1/status", {"n": 1}) == {"state": "running", "n": 1}
        await trio.testing.wait_all_tasks_blocked()
    # the request's HEADERS and its body with END_STREAM, then the reply's: no empty END_STREAM frame, and
    # reading the reply hands no window back (far below half the window)
    assert client_wire.writes == [["Headers", "Data/E"]] * 20
    assert server_wire.writes == [["Headers", "Data/E"]] * 20


async def _exec_exchanges(client: Link, count: int) -> None:
    """``count`` exec channels one after the other: accept, the output, the end; each stream closed, all quiet."""
    for _ in range(count):
        stream, reply = await open_channel(client, "/v1/exec", {"argv": ["true"]})
        assert reply == {"handle": "x_0123456789abcdef"}
        assert await stream.receive_some() == b"\x01output and the exit frame"
        assert await stream.receive_some() == b""
        await stream.aclose()
        await trio.testing.wait_all_tasks_blocked()


async def test_a_channel_reply_and_its_end_leave_in_one_write() -> None:
    async with recorded_pair() as (client, client_wire, _server, server_wire):
        await _exec_exchanges(client, 20)
    # the accept (HEADERS), the output and the handler's end are three calls with checkpoints in between: the
    # writer's coalescing round gathers them
    assert server_wire.writes == [["Headers", "Data", "Data/E"]] * 20
    assert client_wire.writes == [["Headers", "Data"], ["Data/E"]] * 20


async def test_send_final_ends_the_stream_on_its_last_data_frame_past_the_frame_size() -> None:
    payload = os.urandom(600 * 1024)  # several DATA frames (at most 256 KiB each, 16 KiB before the peer's SETTINGS)
    got = bytearray()

    async def sink(stream: LinkStream) -> None:
        await stream.send_headers([(":status", "200")])
        while data := await stream.receive_some():
            got.extend(data)
        await stream.send_final(b"done")

    left, right = trio.testing.memory_stream_pair()
    client_wire = Recorder(left)
    client = Link(client_wire, client=True)
    server = Link(right, client=False, handler=sink)
    async with trio.open_nursery() as nursery:
        await nursery.start(client.run)
        await nursery.start(server.run)
        stream = await client.open_stream([(":method", "POST"), (":path", "/"), (":scheme", "https"),
                                           (":authority", "t")], body=payload, end_stream=True)  # fmt: skip
        assert await stream.read_all(1024) == b"done"
        nursery.cancel_scope.cancel()
    assert bytes(got) == payload
    frames = [name for write in client_wire.writes for name in write]
    assert frames.count("Data/E") == 1 and frames.count("Data") >= 2, frames
    assert frames.index("Data/E") == max(i for i, name in enumerate(frames) if name.startswith("Data"))


async def test_a_stream_that_ended_with_send_final_refuses_more_data() -> None:
    async with recorded_pair() as (client, _cw, _server, _sw):
        stream = await client.open_stream([(":method", "POST"), (":path", "/v1/status"), (":scheme", "https"),
                                           (":authority", "t")])  # fmt: skip
        await stream.send_final(b"{}")
        try:
            await stream.send_all(b"more")
        except trio.ClosedResourceError:
            pass
        else:
            raise AssertionError("send_all after send_final was accepted")
        assert await stream.read_all(1024)
        await stream.aclose()


def test_pack_joins_small_frames_and_fills_a_record_with_a_large_payloads_head() -> None:
    headers, small, header9 = b"h" * 40, b"s" * 100, b"9" * 9
    large = os.urandom(256 * 1024)
    pieces = _pack([headers, small, header9, large, b"t" * 30])
    assert b"".join(bytes(p) for p in pieces) == headers + small + header9 + large + b"t" * 30
    # the record of the small frames is topped up from the payload; the rest of the payload is not copied
    assert len(pieces[0]) == RECORD
    assert isinstance(pieces[1], memoryview) and pieces[1].obj is large
    assert bytes(pieces[2]) == b"t" * 30
    assert _pack([b"a" * 10, b"b" * 10]) == [b"a" * 10 + b"b" * 10]
    # small chunks that overflow a record start another one; none is larger than a record
    pieces = _pack([b"x" * 9000, b"y" * 9000, b"z" * 9000])
    assert [len(p) for p in pieces] == [9000, 9000, 9000]


class SyncWire(trio.abc.Stream):
    """One end of an in-memory transport that, like TLS on a socket, can also write from synchronous code
    (``try_send``); each write is recorded as ``(how, frames)``, ``how`` being ``through`` (the sender wrote it)
    or ``writer`` (the link's writer task did). ``full``: the next ``try_send`` finds the socket full."""

    def __init__(self, incoming: trio.testing.MemoryReceiveStream) -> None:
        self.incoming = incoming
        self.peer: SyncWire | None = None
        self.writes: list[tuple[str, list[str]]] = []
        self.full = False
        self._unfinished: bytes | None = None

    def _deliver(self, data: bytes, how: str) -> None:
        assert self.peer is not None
        if data:
            self.writes.append((how, _frames(data)))
            self.peer.incoming.put_data(data)

    def try_send(self, data: bytes) -> bool:
        assert self._unfinished is None, "a write before the unfinished one was finished"
        if self.full:
            self.full, self._unfinished = False, data
            return False
        self._deliver(data, "through")
        return True

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._unfinished is not None:
            self._deliver(self._unfinished, "finished")
            self._unfinished = None
        self._deliver(bytes(data), "writer")
        await trio.lowlevel.checkpoint()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.incoming.receive_some(max_bytes)

    async def aclose(self) -> None:
        self.incoming.put_eof()
        if self.peer is not None:
            self.peer.incoming.put_eof()
        await trio.lowlevel.checkpoint()


@asynccontextmanager
async def sync_pair() -> AsyncIterator[tuple[Link, SyncWire, Link, SyncWire]]:
    client_wire = SyncWire(trio.testing.MemoryReceiveStream())
    server_wire = SyncWire(trio.testing.MemoryReceiveStream())
    client_wire.peer, server_wire.peer = server_wire, client_wire
    async with _linked(client_wire, server_wire) as (client, server):
        yield client, client_wire, server, server_wire


async def test_a_whole_message_on_a_quiet_link_is_written_by_its_sender() -> None:
    async with sync_pair() as (client, client_wire, _server, server_wire):
        await _exec_exchanges(client, 5)
    # the request (headers and its first bytes) and the accept leave at once, each from its sender; the output
    # and the handler's end, two calls with a checkpoint in between, are gathered by the writer as before, and so
    # is the END_STREAM of aclose (not a message of its own)
    assert client_wire.writes == [("through", ["Headers", "Data"]), ("writer", ["Data/E"])] * 5
    assert server_wire.writes == [("through", ["Headers"]), ("writer", ["Data", "Data/E"])] * 5


async def test_a_busy_link_gathers_and_a_full_socket_finishes_the_record_first() -> None:
    async with sync_pair() as (client, client_wire, _server, server_wire):
        # twenty calls started in one scheduling round: the first goes through, the writer gathers the rest
        results: list[dict[str, Any]] = []

        async def one(n: int) -> None:
            results.append(await call(client, "/v1/status", {"n": n}))

        async with trio.open_nursery() as nursery:
            for n in range(20):
                nursery.start_soon(one, n)
        assert sorted(r["n"] for r in results) == list(range(20))
        requests = [frames for _how, frames in client_wire.writes if "Headers" in frames]
        assert client_wire.writes[0][0] == "through" and len(requests) < 20
        assert sum(frames.count("Headers") for frames in requests) == 20

        # a socket that fills mid-record: the writer finishes that record, with nothing else queued, and the
        # peer reads the exchange whole
        await trio.testing.wait_all_tasks_blocked()
        client_wire.writes.clear()
        server_wire.writes.clear()
        client_wire.full = True
        assert await call(client, "/v1/status", {"n": 99}) == {"state": "running", "n": 99}
        assert client_wire.writes == [("finished", ["Headers", "Data/E"])]
        # a unary reply's headers are not a whole message (its body follows): the writer gathers both, as before
        assert server_wire.writes == [("writer", ["Headers", "Data/E"])]
