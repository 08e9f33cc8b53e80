"""One end of the socket pair between the primary and a worker, over trio: requests that wait for their reply,
notifications that do not, and a loop that hands the peer's messages to a handler.

A message the handler answers is a request (it carries an ``id``); the reply carries the same ``id`` and type
``reply``. The peer is our own process, so a frame we cannot read ends the channel rather than being skipped.

Notifications may come from any thread: a worker's events are its log's lines, and the log is written from worker
threads too (the local addresses' refresh runs in one). trio's channels belong to trio's thread — a receiver woken
from another thread is lost, and the run dies of it later — so a frame from another thread is queued by trio's.
"""

from __future__ import annotations

import socket
import threading
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
        self._unsent = 0  # frames queued and not yet written
        self._progress = trio.Event()  # set whenever a frame was written or the channel closed (flush waits on it)
        self._token: trio.lowlevel.TrioToken | None = None  # the run this channel serves, once known
        self._home = 0  # the ident of trio's thread in that run
        try:
            self.bind()
        except RuntimeError:  # made before trio.run (a forked worker's): its run calls bind()
            pass

    def bind(self) -> None:
        """Serve the current trio run: notifications from its other threads are queued through trio's."""
        self._token = trio.lowlevel.current_trio_token()
        self._home = threading.get_ident()

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
        """Queue ``message`` for the peer without waiting (events, stats); a full queue drops it. Safe from any
        thread."""
        if self.closed:
            return
        frame = encode(message)
        if self._token is None or threading.get_ident() == self._home:  # no run yet, or trio's own thread
            self._queue(frame)
            return
        try:
            self._token.run_sync_soon(self._queue, frame)
        except trio.RunFinishedError:
            self.dropped += 1

    def _queue(self, frame: bytes) -> None:
        # never raises: it may run as a trio callback, where an exception would end the whole run
        try:
            self._outbox.send_nowait(frame)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            self.dropped += 1
            return
        self._unsent += 1

    async def flush(self) -> None:
        """Wait until every notification queued so far is written, or the channel closed."""
        while self._unsent > 0 and not self.closed:
            self._progress = trio.Event()
            await self._progress.wait()

    async def _write(self, frame: bytes) -> None:
        async with self._send_lock:
            try:
                await self._stream.send_all(frame)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise ChannelClosed(str(exc)) from None

    async def run(self, handler: Handler) -> None:
        """Read until the peer goes away (returns then); each request is answered in its own task."""
        if self._token is None:
            self.bind()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._drain_outbox)
                await self._read(handler, nursery)
                nursery.cancel_scope.cancel()
        finally:
            self.closed = True
            self._progress.set()
            for send in self._waiting.values():
                send.close()

    async def _drain_outbox(self) -> None:
        async for frame in self._outbox_rx:
            try:
                await self._write(frame)
            except ChannelClosed:  # the peer went away: the reader sees its end and the run returns
                return
            self._unsent -= 1
            self._progress.set()

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
