"""One end of the socket pair between the primary and a worker, over trio: requests that wait for their reply,
notifications that do not, and a loop that hands the peer's messages to a handler.

A message the handler answers is a request (it carries an ``id``); the reply carries the same ``id`` and type
``reply``. The peer is our own process, so a frame we cannot read ends the channel rather than being skipped."""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable

import trio

from supervisor.control.workers.wire import FrameDecoder, Kind, Message, encode
from supervisor.protocol.json_value import JsonValue

Handler = Callable[[dict[str, JsonValue]], Awaitable[dict[str, JsonValue] | None]]  # Message, spelled out
QUEUE = 10_000  # notifications waiting to be written; past it they are dropped (counted) rather than block a task


class ChannelClosed(Exception):
    """The peer process went away (its end of the pair closed)."""


class Channel:
    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
        self._decoder = FrameDecoder()
        self._next_id = 0
        self._waiting: dict[int, trio.MemorySendChannel[Message]] = {}
        self._send_lock = trio.Lock()
        self._outbox, self._outbox_rx = trio.open_memory_channel[bytes](QUEUE)
        self.dropped = 0
        self.closed = False

    async def request(self, message: Message) -> Message:
        """Send ``message`` and wait for the peer's reply to it."""
        if self.closed:
            raise ChannelClosed("the channel is closed")
        self._next_id += 1
        ident = self._next_id
        send, receive = trio.open_memory_channel[Message](1)
        self._waiting[ident] = send
        try:
            await self._write(encode({**message, "id": ident}))
            try:
                return await receive.receive()
            except trio.EndOfChannel:
                raise ChannelClosed("the peer went away before it answered") from None
        finally:
            self._waiting.pop(ident, None)

    def notify(self, message: Message) -> None:
        """Queue ``message`` for the peer without waiting (events, stats); a full queue drops it."""
        if self.closed:
            return
        try:
            self._outbox.send_nowait(encode(message))
        except trio.WouldBlock:
            self.dropped += 1

    async def _write(self, frame: bytes) -> None:
        async with self._send_lock:
            try:
                await self._stream.send_all(frame)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise ChannelClosed(str(exc)) from None

    async def run(self, handler: Handler) -> None:
        """Read until the peer goes away (returns then); each request is answered in its own task."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._drain_outbox)
                await self._read(handler, nursery)
                nursery.cancel_scope.cancel()
        finally:
            self.closed = True
            for send in self._waiting.values():
                send.close()

    async def _drain_outbox(self) -> None:
        async for frame in self._outbox_rx:
            await self._write(frame)

    async def _read(self, handler: Handler, nursery: trio.Nursery) -> None:
        while True:
            try:
                data = await self._stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                return
            for message in self._decoder.feed(data):
                if message["type"] == Kind.REPLY:
                    ident = message.get("id")
                    waiting = self._waiting.get(ident) if isinstance(ident, int) else None
                    if waiting is not None:
                        waiting.send_nowait(message)
                elif "id" in message:
                    nursery.start_soon(self._answer, handler, message)
                else:
                    await handler(message)

    async def _answer(self, handler: Handler, message: Message) -> None:
        reply = await handler(message) or {}
        try:
            await self._write(encode({**reply, "type": Kind.REPLY, "id": message["id"]}))
        except ChannelClosed:
            pass
