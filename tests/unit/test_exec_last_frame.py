"""An exec stream's EXIT frame carries the stream's end (supervisor/boundary/process/exec_session.py ``send_last``):
on the link, END_STREAM rides on EXIT's DATA frame, where a separate half-close after the handler's teardown was a
frame and a TLS record of its own for every exec."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from supervisor.boundary.process.exec_session import _Sender
from supervisor.link.h2link import Link, LinkStream
from supervisor.link.rpc import RawAccept, Router, open_channel
from supervisor.protocol.channel import NEED_DATA, ChannelDecoder, Direction, Exit, Stdout
from supervisor.protocol.exit_result import EndReason, ExitResult
from tests.unit.test_link_writes import Recorder

RESULT = ExitResult("p_0123456789abcdef", 0, None, None, 0, False, EndReason.EXITED, "2026-12-01T00:00:00Z")


async def _exec(_body: dict[str, Any], stream: LinkStream, accept: RawAccept) -> None:
    await accept({"handle": RESULT.handle})
    sender = _Sender(stream)
    await sender.send(Stdout(b"out"))
    for _ in range(5):  # the output tasks' nursery ends first: several scheduling rounds
        await trio.lowlevel.checkpoint()
    await sender.send_last(Exit(RESULT))


async def test_the_exit_frame_ends_the_stream_in_the_same_data_frame() -> None:
    left, right = trio.testing.memory_stream_pair()
    server_wire = Recorder(right)
    router = Router()
    router.channel_raw("/v1/exec", _exec)
    client = Link(left, client=True)
    server = Link(server_wire, client=False, handler=router.handle)
    async with trio.open_nursery() as nursery:
        await nursery.start(client.run)
        await nursery.start(server.run)
        stream, _reply = await open_channel(client, "/v1/exec", {"argv": ["true"]})
        decoder = ChannelDecoder(Direction.TO_CLIENT)
        events = []
        while data := await stream.receive_some():
            decoder.receive_data(data)
            while (event := decoder.next_frame()) is not NEED_DATA:
                events.append(event)
        await stream.aclose()
        nursery.cancel_scope.cancel()
    assert events[0] == Stdout(b"out") and isinstance(events[-1], Exit) and events[-1].result == RESULT
    frames = [name for write in server_wire.writes for name in write]
    after_accept = frames[frames.index("Headers") + 1 :]
    assert after_accept[-1] == "Data/E", frames  # EXIT and the end: one frame
    assert after_accept.count("Data/E") == 1 and after_accept.count("Data") == 1, frames  # only the output before it
