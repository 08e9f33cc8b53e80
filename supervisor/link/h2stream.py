"""One HTTP/2 stream of a link as a trio half-closeable byte stream, plus its headers.

The connection (``supervisor.link.h2link.Link``) owns the h2 state machine, its reader and its writer, and hands
each stream its events; a stream asks its connection only what ``StreamOwner`` lists. Its job is the stream's
side of the theory of operation in ``h2link``:

* **Flow control is per stream and end to end.** Received DATA is acknowledged to the peer only when the
  application has consumed it (:meth:`LinkStream.receive_some`), so a slow consumer stalls its own stream and
  nothing else. Senders wait for window on their own stream (and the connection) before handing h2 data.
* ``END_STREAM`` is half-close (:meth:`LinkStream.send_eof`); ``RST_STREAM`` is abort (:meth:`LinkStream.aclose`
  before both sides ended, or :meth:`LinkStream.reset`). A reset or a lost link makes every pending operation on
  the stream raise :class:`trio.BrokenResourceError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import h2.errors
import h2.exceptions
import trio
import trio.lowlevel

from supervisor.link.h2_hooks import H2Connection

Headers = list[tuple[str, str]]

COALESCE_BELOW, COALESCE_UPTO = 16 * 1024, 256 * 1024  # received payloads gathered: smaller ones, up to this
# consumed bytes handed back to the peer at once while more are buffered (< h2link.STREAM_WINDOW)
ACK_BATCH = 1024 * 1024
FINISH_GRACE_S = 5.0


class StreamOwner(Protocol):
    """What a stream asks of its connection: h2's state, the writer's wake-up, the send window, its closing."""

    _h2: H2Connection
    _closed: bool
    close_reason: str | None

    def _kick(self, *, now: bool = False) -> None: ...

    def _window(self, stream_id: int) -> int: ...

    def _max_outbound_frame(self) -> int: ...

    async def _wait_window(self) -> None: ...

    def _forget(self, stream_id: int) -> None: ...

    async def flush(self) -> None: ...


def error_name(code: int) -> str:
    """An HTTP/2 error code's name (``CANCEL``), or its number when it has none."""
    try:
        return h2.errors.ErrorCodes(code).name
    except ValueError:
        return str(code)


class LinkClosed(trio.BrokenResourceError):
    """The link went away (peer closed, transport error or local shutdown)."""


class LinkStream(trio.abc.HalfCloseableStream):
    """One HTTP/2 stream as a trio half-closeable byte stream, plus its headers.

    One exists per connection and exec in each daemon for as long as it lasts, so it keeps no ``__dict__`` and
    makes its events only when a task waits on them (an idle server-side stream waits on one, not two).
    """

    __slots__ = (
        "_buffered",
        "_chunks",
        "_closed_locally",
        "_link",
        "_local_ended",
        "_offset",
        "_readable",
        "_receiving",
        "_remote_ended",
        "_reset_code",
        "_responded",
        "_response_waiter",
        "_unacked",
        "headers",
        "stream_id",
    )

    closes_at_once = True  # aclose never waits (relay.close_now)

    def __init__(self, link: StreamOwner, stream_id: int, headers: Headers | None = None) -> None:
        self._link = link
        self.stream_id = stream_id
        #: request headers on the server side; response headers on the client side once received.
        self.headers: Headers = headers or []
        self._responded = False  # the response headers arrived, or the stream broke: response() returns
        self._response_waiter: trio.Event | None = None
        # received DATA payloads not yet read, in order: a large one as the bytes object h2 made (returned as it
        # is when it fits a read: no copy), small ones gathered into a bytearray (a peer sending one-byte frames
        # must not cost an object per byte of the window); ``_offset`` bytes of the first were read already.
        # None while nothing is buffered: an idle stream keeps no empty list.
        self._chunks: list[bytes | bytearray] | None = None
        self._offset = 0
        self._buffered = 0
        self._unacked = 0
        # the task of a receive waiting for data, parked by hand rather than on a trio.Event: an idle
        # connection's stream waits for as long as it stays idle, and an Event, its task set and its wait's
        # frames cost ~1 KB per waiting stream
        self._readable: trio.lowlevel.Task | None = None
        self._remote_ended = False
        self._local_ended = False
        self._reset_code: int | None = None
        self._receiving = False
        self._closed_locally = False

    # -- headers ----------------------------------------------------------------------------------------------
    def header(self, name: str, default: str | None = None) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return default

    @property
    def remote_ended(self) -> bool:
        """The peer ended its side of the stream (END_STREAM arrived)."""
        return self._remote_ended

    @property
    def status(self) -> int:
        value = self.header(":status")
        return int(value) if value is not None and value.isdigit() else 0

    async def response(self) -> Headers:
        """Client side: wait for the response headers."""
        if self._responded:
            await trio.lowlevel.checkpoint()
        else:
            if self._response_waiter is None:
                self._response_waiter = trio.Event()
            await self._response_waiter.wait()
        if not self.headers:
            raise LinkClosed(self._broken_reason())
        return self.headers

    async def send_headers(
        self, headers: Sequence[tuple[str, str]], *, end_stream: bool = False, now: bool = False
    ) -> None:
        """Server side: send the response headers (``:status`` first). ``now``: nothing else follows at once (a
        channel's accept): written from here on a quiet link (h2link's theory of operation)."""
        self._check_sendable()
        self._link._h2.send_headers(self.stream_id, list(headers), end_stream=end_stream)
        if end_stream:
            self._local_ended = True
        self._link._kick(now=now or end_stream)

    # -- trio.abc.HalfCloseableStream -------------------------------------------------------------------------
    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._send(data, end=False)

    async def send_final(self, data: bytes | bytearray | memoryview) -> None:
        """``send_all(data)`` then ``send_eof()``, with END_STREAM on the last DATA frame: one frame fewer, and a
        small body leaves in the same write as what was queued with it."""
        await self._send(data, end=True, now=True)

    async def _send(self, data: bytes | bytearray | memoryview, *, end: bool, now: bool = False) -> None:
        if self._closed_locally:
            raise trio.ClosedResourceError("this stream was closed")
        view = memoryview(data)
        if not view and end:
            self._check_sendable()
            self._link._h2.end_stream(self.stream_id)
            self._local_ended = True
            self._link._kick(now=now)
        while view:
            self._check_sendable()
            window = self._link._window(self.stream_id)
            if window <= 0:
                self._link._kick()  # what is queued (a request's headers) goes while we wait
                await self._link._wait_window()
                continue
            size = min(window, self._link._max_outbound_frame())
            chunk = view[:size]
            # h2 keeps the payload object until the writer sends it: bytes are immutable and go as they are
            # (no copy when they fit one frame); a caller's bytearray or memoryview is copied, it may be reused.
            payload = data if size >= len(view) and type(data) is bytes and len(view) == len(data) else bytes(chunk)
            last = end and len(chunk) == len(view)
            try:
                self._link._h2.send_data(self.stream_id, payload, end_stream=last)
            except h2.exceptions.FlowControlError:
                await self._link._wait_window()
                continue
            except h2.exceptions.StreamClosedError as exc:
                raise LinkClosed("stream closed") from exc
            if last:
                self._local_ended = True
            view = view[len(chunk) :]
            self._link._kick(now=now and not view)
        await trio.lowlevel.checkpoint()

    async def wait_send_all_might_not_block(self) -> None:
        if self._closed_locally:
            raise trio.ClosedResourceError("this stream was closed")
        while self._link._window(self.stream_id) <= 0:
            self._check_sendable()
            await self._link._wait_window()
        await trio.lowlevel.checkpoint()

    async def send_eof(self) -> None:
        if self._closed_locally:
            raise trio.ClosedResourceError("this stream was closed")
        if self._local_ended:
            await trio.lowlevel.checkpoint()
            return
        self._check_sendable()
        self._link._h2.end_stream(self.stream_id)
        self._local_ended = True
        self._link._kick(now=True)
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if max_bytes is not None:
            if not isinstance(max_bytes, int):
                raise TypeError("max_bytes must be an integer or None")
            if max_bytes < 1:
                raise ValueError("max_bytes must be >= 1")
        if self._closed_locally:
            raise trio.ClosedResourceError("this stream was closed")
        if self._receiving:
            raise trio.BusyResourceError("another task is already receiving on this stream")
        self._receiving = True
        try:  # one coroutine frame, not two: an idle stream's receive waits here for as long as it is idle
            while not self._buffered:
                if self._closed_locally:
                    raise trio.ClosedResourceError("this stream was closed")
                if self._remote_ended:  # END_STREAM arrived before any reset: a clean end of data
                    await trio.lowlevel.checkpoint()
                    return b""
                if self._reset_code is not None or self._link._closed:
                    raise LinkClosed(self._broken_reason())
                self._readable = trio.lowlevel.current_task()
                await trio.lowlevel.wait_task_rescheduled(self._abort_wait)
            data = self._take(self._buffered if max_bytes is None else min(max_bytes, self._buffered))
            # Window goes back in batches while data is still buffered here (a consumer slower than the link
            # keeps the peer's window exhausted, and h2 then sends a WINDOW_UPDATE per acknowledgement), and in
            # full once everything was read: the peer never waits on bytes we have consumed but not acknowledged.
            # (h2 itself emits a WINDOW_UPDATE only once half a window was handed back, or for an exhausted one.)
            consumed = self._unacked - self._buffered
            if consumed >= ACK_BATCH or not self._buffered:
                self._acknowledge(consumed)
            await trio.lowlevel.checkpoint()
            return data
        finally:
            self._receiving = False

    async def read_all(self, limit: int) -> bytes:
        """Read until END_STREAM; refuse bodies larger than ``limit``."""
        chunks = bytearray()
        while True:
            data = await self.receive_some()
            if not data:
                return bytes(chunks)
            chunks += data
            if len(chunks) > limit:
                await self.reset()
                raise LinkClosed(f"body larger than {limit} bytes")

    async def aclose(self) -> None:
        """Graceful close: END_STREAM if we had not sent it; if the peer is still sending, RST_STREAM(NO_ERROR)
        tells it we will not read any more (like closing a TCP socket with unread data). Use :meth:`reset` to
        abort instead."""
        if not self._closed_locally and self._reset_code is None and not self._link._closed:
            try:
                if not self._local_ended:
                    self._link._h2.end_stream(self.stream_id)
                    self._local_ended = True
                    self._link._kick()
            except h2.exceptions.StreamClosedError:
                pass
            if not self._remote_ended:
                self._reset(h2.errors.ErrorCodes.NO_ERROR)
        self._closed_locally = True
        self._wake()
        self._link._forget(self.stream_id)
        await trio.lowlevel.checkpoint()

    async def flush(self) -> None:
        """Wait until what this stream (and the link) queued so far has been handed to the transport."""
        await self._link.flush()

    async def finish(self, grace: float = FINISH_GRACE_S) -> None:
        """A server handler is done: END_STREAM, then give the peer ``grace`` seconds to end its side (what it
        still sends is read and dropped) before closing. Closing at once would reset a stream whose peer is
        still relaying our last bytes onwards, and a relay that sees the reset may drop them (an exec's EXIT
        frame was lost that way)."""
        if not self._closed_locally and self._reset_code is None and not self._link._closed:
            with trio.move_on_after(grace):
                try:
                    await self.send_eof()
                    while await self.receive_some():
                        pass
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
        await self.aclose()

    async def reset(self, code: int = h2.errors.ErrorCodes.CANCEL) -> None:
        """Abort the stream (RST_STREAM)."""
        self._closed_locally = True
        if self._reset_code is None:
            self._reset(code)
        self._link._forget(self.stream_id)
        await trio.lowlevel.checkpoint()

    # -- internals ---------------------------------------------------------------------------------------------
    def _reset(self, code: int) -> None:
        self._reset_code = code
        if not self._link._closed:
            try:
                self._link._h2.reset_stream(self.stream_id, error_code=code)
                self._link._kick()
            except h2.exceptions.StreamClosedError:
                pass
        self._wake()

    def _acknowledge(self, size: int) -> None:
        size = min(size, self._unacked)
        if size <= 0 or self._link._closed:
            return
        self._unacked -= size
        try:
            self._link._h2.acknowledge_received_data(size, self.stream_id)
        except (h2.exceptions.StreamClosedError, KeyError):
            return
        self._link._kick()

    def _check_sendable(self) -> None:
        if self._reset_code is not None or self._link._closed:
            raise LinkClosed(self._broken_reason())
        if self._local_ended:
            raise trio.ClosedResourceError("send side already closed (END_STREAM sent)")

    def _broken_reason(self) -> str:
        if self._reset_code is not None:
            return f"stream reset ({error_name(self._reset_code)})"
        return f"link closed ({self._link.close_reason or 'unknown'})"

    def _wake(self) -> None:
        self._signal_readable()
        self._signal_response()

    def _signal_readable(self) -> None:
        task = self._readable
        if task is not None:
            self._readable = None  # woken once: a second signal before it runs must not reschedule it again
            trio.lowlevel.reschedule(task)

    def _abort_wait(self, _raise_cancel: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
        """A waiting receive was cancelled: it no longer waits (trio raises the cancellation in it)."""
        self._readable = None
        return trio.lowlevel.Abort.SUCCEEDED

    def _signal_response(self) -> None:
        self._responded = True
        waiter = self._response_waiter
        if waiter is not None:
            self._response_waiter = None  # its waiters hold it; the stream need not, for the rest of its life
            waiter.set()

    def _take(self, size: int) -> bytes:
        """Up to ``size`` buffered bytes (at least one; the caller made sure some are buffered)."""
        chunks = self._chunks
        assert chunks is not None  # something is buffered
        first = chunks[0]
        if self._offset == 0 and len(first) <= size:  # whole payloads: as they are, joined only if several fit
            count, total = 1, len(first)
            while count < len(chunks) and total + len(chunks[count]) <= size:
                total += len(chunks[count])
                count += 1
            taken = chunks[:count]
            del chunks[:count]
            if not chunks:
                self._chunks = None
            self._buffered -= total
            if count == 1:
                return first if type(first) is bytes else bytes(first)
            return b"".join(taken)
        end = min(self._offset + size, len(first))
        with memoryview(first) as view:
            data = bytes(view[self._offset : end])
        if end == len(first):
            del chunks[0]
            if not chunks:
                self._chunks = None
            self._offset = 0
        else:
            self._offset = end
        self._buffered -= len(data)
        return data

    def _on_data(self, data: bytes, flow_controlled_length: int) -> None:
        if data:
            chunks = self._chunks
            if chunks is None:
                chunks = self._chunks = []
            if len(data) >= COALESCE_BELOW:
                chunks.append(data)
            elif chunks and type(chunks[-1]) is bytearray and len(chunks[-1]) < COALESCE_UPTO:
                chunks[-1] += data
            else:
                chunks.append(bytearray(data))
            self._buffered += len(data)
        self._unacked += len(data)
        padding = flow_controlled_length - len(data)
        if padding > 0:
            self._link._h2.acknowledge_received_data(padding, self.stream_id)
        self._signal_readable()

    def _on_end(self) -> None:
        self._remote_ended = True
        self._wake()

    def _on_reset(self, code: int) -> None:
        self._reset_code = code
        self._wake()
