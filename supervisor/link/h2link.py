"""HTTP/2 over one trio byte stream, turned into trio streams (one per HTTP/2 stream).

Size (over ~500 lines on purpose): one connection's reader, writer, flow control and stream objects share h2's state
machine and change together.

Both daemons speak it: control is the HTTP/2 client on ``openshell-ops/1`` links and the boundary is the client
on ``openshell-egress/1`` links. The h2 state machine is sans-I/O; this module owns the I/O around it and turns
h2 events into a small vocabulary once, so that everything above speaks only :class:`LinkStream`. What it
needs from h2 below its public API lives in :mod:`supervisor.link.h2_hooks`.

Theory of operation
-------------------
* One **reader** task feeds bytes from the transport into ``H2Connection.receive_data`` and dispatches events to
  the stream they belong to. One **writer** task is the only caller of ``transport.send_all``: whoever changes
  the h2 state (headers, data, window updates, resets) calls :meth:`Link._kick`, and the writer sends whatever
  h2 has buffered. trio forbids concurrent ``send_all`` on one stream; a single writer makes that structural.
* **A message on a quiet link leaves from its sender.** A request's headers and first bytes, a channel's accept,
  a stream's last bytes or END_STREAM (``now``): when the writer is idle and not yet woken, and the transport can
  write without waiting (``try_send``, TLS on the socket), the sender writes them itself, at once, and wakes the
  writer with nothing to write, which ends the quiet: what else is queued in the same scheduling round is
  gathered. Otherwise, and for everything else, the writer gathers: it wakes, lets one scheduling round pass so
  the tasks woken with it queue what they still have, and writes all of it at once. Waking the writer for a
  message that is already complete cost its sender a round of every other runnable task (an exec's accept waited
  ~0.4 ms for the process table's and the output pump's new tasks) — like TCP's autocorking: only a busy link
  gathers, and a link carrying many streams at once is busy.
* **Flow control is per stream and end to end.** Received DATA is acknowledged to the peer only when the
  application has consumed it (:meth:`LinkStream.receive_some`), so a slow consumer stalls its own stream and
  nothing else. Senders wait for window on their own stream (and the connection) before handing h2 data.
* Windows and frames are large (the TLS leg is the throughput ceiling; fewer, bigger frames cost less CPU).
* ``END_STREAM`` is half-close (:meth:`LinkStream.send_eof`); ``RST_STREAM`` is abort (:meth:`LinkStream.aclose`
  before both sides ended, or :meth:`LinkStream.reset`). A reset or a lost link makes every pending operation on
  the stream raise :class:`trio.BrokenResourceError`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import trio
import trio.lowlevel

from supervisor.link.h2_hooks import H2Connection

Headers = list[tuple[str, str]]
StreamHandler = Callable[["LinkStream"], Awaitable[None]]

# Settings both sides advertise. The receive window is what a stream may have in flight unacknowledged.
STREAM_WINDOW = 4 * 1024 * 1024
CONNECTION_WINDOW = 64 * 1024 * 1024
MAX_FRAME = 256 * 1024
MAX_CONCURRENT_STREAMS = 32768  # per link; control keeps 2, so ~65k captured connections at once
READ_SIZE = 256 * 1024
COALESCE_BELOW, COALESCE_UPTO = 16 * 1024, 256 * 1024  # received payloads gathered: smaller ones, up to this
RECORD = 16 * 1024  # the largest TLS record's payload: what the writer packs small frames into
ACK_BATCH = 1024 * 1024  # consumed bytes handed back to the peer at once while more are buffered (< STREAM_WINDOW)
FINISH_GRACE_S = 5.0


def _pack(chunks: list[bytes]) -> list[bytes | memoryview]:
    """What the writer has to send, as pieces for a TLS stream's ``send_many`` (a record ends where a piece ends):
    small chunks are joined, and a large payload's head fills the record of what precedes it (its 9-byte frame
    header, at least), so no record is smaller than it must be and a large payload is never copied."""
    pieces: list[bytes | memoryview] = []
    pending: list[bytes] = []
    size = 0
    for chunk in chunks:
        if size + len(chunk) <= RECORD:
            pending.append(chunk)
            size += len(chunk)
        elif len(chunk) < RECORD:
            pieces.append(b"".join(pending))
            pending, size = [chunk], len(chunk)
        else:
            view = memoryview(chunk)
            head = RECORD - size
            pieces.append(b"".join([*pending, view[:head]]))
            pieces.append(view[head:])
            pending, size = [], 0
    if pending:
        pieces.append(b"".join(pending))
    return pieces


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

    def __init__(self, link: Link, stream_id: int, headers: Headers | None = None) -> None:
        self._link = link
        self.stream_id = stream_id
        #: request headers on the server side; response headers on the client side once received.
        self.headers: Headers = headers or []
        self._responded = False  # the response headers arrived, or the stream broke: response() returns
        self._response_waiter: trio.Event | None = None
        # received DATA payloads not yet read, in order: a large one as the bytes object h2 made (returned as it
        # is when it fits a read: no copy), small ones gathered into a bytearray (a peer sending one-byte frames
        # must not cost an object per byte of the window); ``_offset`` bytes of the first were read already
        self._chunks: list[bytes | bytearray] = []
        self._offset = 0
        self._buffered = 0
        self._unacked = 0
        self._readable: trio.Event | None = None  # while a receive waits
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
        channel's accept): written from here on a quiet link (theory of operation)."""
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
                self._readable = trio.Event()
                await self._readable.wait()
                self._readable = None
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
            return f"stream reset ({_error_name(self._reset_code)})"
        return f"link closed ({self._link.close_reason or 'unknown'})"

    def _wake(self) -> None:
        self._signal_readable()
        self._signal_response()

    def _signal_readable(self) -> None:
        if self._readable is not None:
            self._readable.set()

    def _signal_response(self) -> None:
        self._responded = True
        if self._response_waiter is not None:
            self._response_waiter.set()

    def _take(self, size: int) -> bytes:
        """Up to ``size`` buffered bytes (at least one; the caller made sure some are buffered)."""
        chunks = self._chunks
        first = chunks[0]
        if self._offset == 0 and len(first) <= size:  # whole payloads: as they are, joined only if several fit
            count, total = 1, len(first)
            while count < len(chunks) and total + len(chunks[count]) <= size:
                total += len(chunks[count])
                count += 1
            taken = chunks[:count]
            del chunks[:count]
            self._buffered -= total
            if count == 1:
                return first if type(first) is bytes else bytes(first)
            return b"".join(taken)
        end = min(self._offset + size, len(first))
        with memoryview(first) as view:
            data = bytes(view[self._offset : end])
        if end == len(first):
            del chunks[0]
            self._offset = 0
        else:
            self._offset = end
        self._buffered -= len(data)
        return data

    def _on_data(self, data: bytes, flow_controlled_length: int) -> None:
        if data:
            chunks = self._chunks
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


def _str_headers(headers: Any) -> Headers:
    """h2 decodes headers as str with ``header_encoding`` set; normalise the type for mypy and for safety."""
    out: Headers = []
    for name, value in headers:
        out.append((_text(name), _text(value)))
    return out


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _error_name(code: int) -> str:
    try:
        return h2.errors.ErrorCodes(code).name
    except ValueError:
        return str(code)


# -- refusing a peer after a completed handshake ------------------------------------------------------------
#
# With TLS 1.3 the client's handshake completes before the server has checked the client's certificate, and
# either side's claim check runs after the handshake: the refused side sees only a closed connection. So the
# refusing side speaks just enough HTTP/2 to say why: its connection preface and a GOAWAY whose debug data is
# ``refused field=<field>``. The field is a name from a fixed vocabulary (a claim name, ``role``,
# ``certificate``, ``tls``, ``alpn``, ``state``), never a value: the peer is not trusted with our claims.

REFUSAL_CODE = h2.errors.ErrorCodes.INADEQUATE_SECURITY
REFUSAL_PREFIX = "refused field="
REFUSAL_GRACE_S = 1.0
_FIELD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz_")
_DEBUG_LIMIT = 200


def refusal_debug_data(field: str | None) -> bytes:
    """The GOAWAY debug data naming ``field``; anything that is not a plain field name becomes ``certificate``."""
    name = field if field and len(field) <= 40 and set(field) <= _FIELD_CHARS else "certificate"
    return (REFUSAL_PREFIX + name).encode("ascii")


def _cause(exc: BaseException) -> str:
    """What broke a transport: trio wraps the SSL error (a TLS alert names the peer's reason) as the cause."""
    cause = exc.__cause__ or exc
    return f"{type(cause).__name__}: {cause}" if str(cause) else repr(cause)


def _debug_text(data: bytes | None) -> str:
    """A peer's GOAWAY debug data for a log line: printable ASCII only, bounded."""
    if not data:
        return ""
    text = data[:_DEBUG_LIMIT].decode("ascii", "replace")
    return "".join(c if c.isprintable() and c.isascii() else "?" for c in text)


def _refused_field(debug: str) -> str | None:
    if not debug.startswith(REFUSAL_PREFIX):
        return None
    name = debug[len(REFUSAL_PREFIX) :]
    return name if name and set(name) <= _FIELD_CHARS else None


async def send_refusal(
    transport: trio.abc.Stream, *, client: bool, field: str | None, grace: float = REFUSAL_GRACE_S
) -> None:
    """Tell the peer why it is refused (a preface and a GOAWAY naming ``field``), then close ``transport``.

    ``client`` is our HTTP/2 role on this link kind. What the peer sends meanwhile is read and dropped for up to
    ``grace`` seconds until it closes: closing with its bytes unread would reset the connection, and a reset
    can overtake the GOAWAY.
    """
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=client))
    conn.initiate_connection()
    conn.close_connection(error_code=REFUSAL_CODE, additional_data=refusal_debug_data(field))
    with trio.move_on_after(grace):
        try:
            await transport.send_all(conn.data_to_send())
            while await transport.receive_some(READ_SIZE):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
    await trio.aclose_forcefully(transport)


class Link:
    """An HTTP/2 connection (client or server side) over a trio byte stream.

    ``run()`` drives it until the link closes; server-side request streams are handed to ``handler`` in tasks
    of the link's own nursery, so a handler never outlives its link.
    """

    def __init__(
        self,
        transport: trio.abc.Stream,
        *,
        client: bool,
        handler: StreamHandler | None = None,
        name: str = "link",
    ) -> None:
        self.transport = transport
        self.client = client
        self.name = name
        self._handler = handler
        # Outbound headers are normalised (lower-case names, surrounding whitespace and connection headers gone)
        # but not validated: what validation adds (pseudo-header order, :path, :authority against host, te) is
        # fixed in the protocol layer's builders, and it was a third of building a header block. The peer still
        # validates what it receives.
        config = h2.config.H2Configuration(client_side=client, header_encoding="utf-8", validate_outbound_headers=False)
        self._h2 = H2Connection(config=config)
        self._streams: dict[int, LinkStream] = {}
        self._kicked = trio.Event()
        # :meth:`flush` bookkeeping: every kick is numbered; the writer records the last number whose frames it
        # has handed to the transport.
        self._kicks = 0
        self._flushed_kicks = 0
        self._flushed = trio.Event()
        self._window_event = trio.Event()
        self._closed = False
        self._closed_event = trio.Event()
        self.close_reason: str | None = None
        #: the field the peer named when it refused us with a GOAWAY (:func:`send_refusal`), if it did
        self.refused_field: str | None = None
        self._nursery: trio.Nursery | None = None
        self._started = trio.Event()
        self.streams_opened = 0
        #: transport writes so far (each what the writer had when it woke, in one ``send_all``/``send_many``, or
        #: a message its sender wrote through)
        self.writes = 0
        self._try_send: Callable[[bytes], bool] | None = getattr(transport, "try_send", None)
        self._writing = False  # the writer has taken frames from h2 and is handing them to the transport
        self._owed = False  # try_send left a record unfinished: the writer finishes it even with nothing queued

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def active_streams(self) -> int:
        return len(self._streams)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # Our settings are in force locally from the start (the peer cannot exceed the defaults before it has
        # read them anyway). h2 only refreshes its frame-size limit per receive_data call, so set it here too:
        # an ACK and a large frame arriving in one read would otherwise trip the old limit.
        self._h2.local_settings = h2.settings.Settings(
            client=self.client,
            initial_values={
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                h2.settings.SettingCodes.MAX_FRAME_SIZE: MAX_FRAME,
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_CONCURRENT_STREAMS,
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
            },
        )
        self._h2.max_inbound_frame_size = MAX_FRAME
        self._h2.initiate_connection()
        self._h2.increment_flow_control_window(CONNECTION_WINDOW - 65535)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._writer)
                self._kick()
                self._started.set()
                task_status.started()
                try:
                    await self._reader()
                finally:
                    self._mark_closed(self.close_reason or "reader ended")
                    nursery.cancel_scope.cancel()
        finally:
            self._mark_closed(self.close_reason or "link ended")
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                try:
                    await self.transport.aclose()
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass

    async def wait_closed(self) -> None:
        await self._closed_event.wait()

    async def open_stream(
        self, headers: Sequence[tuple[str, str]], *, end_stream: bool = False, body: bytes = b""
    ) -> LinkStream:
        """Client side: start a request; the returned stream carries the request body and the response.
        ``body``: the request body's first bytes (all of it with ``end_stream``), queued with the headers so that
        both leave in one write."""
        await self._started.wait()
        if self._closed:
            raise LinkClosed(f"link closed ({self.close_reason})")
        try:
            stream_id = self._h2.get_next_available_stream_id()
            self._h2.send_headers(stream_id, list(headers), end_stream=end_stream and not body)
        except h2.exceptions.ProtocolError as exc:  # the connection is closing (GOAWAY) or out of stream ids
            raise LinkClosed(f"cannot open a stream: {exc}") from exc
        stream = LinkStream(self, stream_id)
        self._streams[stream_id] = stream
        if end_stream and not body:
            stream._local_ended = True
        self.streams_opened += 1
        if not body:
            self._kick(now=True)
            await trio.lowlevel.checkpoint()
            return stream
        try:
            await stream._send(body, end=end_stream, now=True)  # with the headers, in one write
        except BaseException:
            with trio.CancelScope(shield=True):
                await stream.reset()
            raise
        return stream

    async def flush(self) -> None:
        """Wait until every frame queued before this call has been handed to the transport (``send_all``
        returned), or the link is closed: what a caller waits on before ending the link right after a reply."""
        target = self._kicks
        while self._flushed_kicks < target and not self._closed:
            await self._flushed.wait()

    async def aclose(self, reason: str = "closed locally") -> None:
        if not self._closed:
            try:
                self._h2.close_connection()
                self._kick()
                await trio.lowlevel.checkpoint()
            except h2.exceptions.ProtocolError:
                pass
        self._mark_closed(reason)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        await trio.lowlevel.checkpoint()

    # -- internals ---------------------------------------------------------------------------------------------
    def _kick(self, *, now: bool = False) -> None:
        """Wake the writer if h2 has queued anything (a kick that finds nothing would cost the writer a wake-up,
        and its coalescing round would be spent before the frames it is meant to gather were queued). ``now``: a
        whole message was queued; on a quiet link it is written from here (theory of operation)."""
        if not self._h2.has_output:
            return
        self._kicks += 1
        if now and self._try_send is not None and not self._writing and not self._kicked.is_set():
            self._write_through()
        # Also after a write-through: the writer's wake-up (with nothing to write) ends the quiet, so that the other
        # messages of this scheduling round are gathered into one write instead of each writing through.
        self._kicked.set()

    def _write_through(self) -> None:
        """Write what h2 holds from the caller, unless it is too large for that (the writer packs it)."""
        assert self._try_send is not None
        if self._owed or self._closed or self._h2.output_size > RECORD:
            return
        data = b"".join(self._h2.chunks_to_send())
        try:
            whole = self._try_send(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._mark_closed(f"send failed: {_cause(exc)}")
            return
        self.writes += 1
        if not whole:  # the socket is full: the writer finishes the record once it can
            self._owed = True
            return
        self._flushed_kicks = self._kicks
        self._flushed.set()
        self._flushed = trio.Event()

    def _window(self, stream_id: int) -> int:
        try:
            return int(self._h2.local_flow_control_window(stream_id))
        except (h2.exceptions.StreamClosedError, h2.exceptions.NoSuchStreamError, KeyError):
            return 0

    def _max_outbound_frame(self) -> int:
        return int(self._h2.max_outbound_frame_size)

    async def _wait_window(self) -> None:
        if self._closed:
            raise LinkClosed(f"link closed ({self.close_reason})")
        await self._window_event.wait()

    def _window_changed(self) -> None:
        self._window_event.set()
        self._window_event = trio.Event()

    def _forget(self, stream_id: int) -> None:
        self._streams.pop(stream_id, None)

    def _mark_closed(self, reason: str) -> None:
        if self._closed:
            return
        self._closed = True
        self._closed_event.set()
        self.close_reason = reason
        for stream in list(self._streams.values()):
            stream._wake()
        self._window_changed()
        self._flushed.set()

    async def _writer(self) -> None:
        send_many: Callable[[list[bytes | memoryview]], Awaitable[None]] | None
        send_many = getattr(self.transport, "send_many", None)
        while True:
            await self._kicked.wait()
            # one scheduling round for the tasks woken with us to queue what they still have (a reply's headers,
            # body and END_STREAM are three calls with a checkpoint in between): one write for all of it
            await trio.lowlevel.cancel_shielded_checkpoint()
            self._kicked = trio.Event()
            upto = self._kicks
            chunks = self._h2.chunks_to_send()
            self._writing = True
            try:
                if send_many is not None and len(chunks) > 1:
                    await send_many(_pack(chunks))
                    self.writes += 1
                elif chunks:
                    await self.transport.send_all(chunks[0] if len(chunks) == 1 else b"".join(chunks))
                    self.writes += 1
                elif self._owed:
                    await self.transport.send_all(b"")  # finishes the record try_send left
                self._owed = False
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self._mark_closed(f"send failed: {_cause(exc)}")
                return
            finally:
                self._writing = False
            self._flushed_kicks = upto
            self._flushed.set()
            self._flushed = trio.Event()

    async def _reader(self) -> None:
        while True:
            try:
                data = await self.transport.receive_some(READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self.close_reason = f"receive failed: {_cause(exc)}"
                return
            if not data:
                self.close_reason = "peer closed the connection"
                return
            try:
                events = self._h2.receive_data(data)
            except h2.exceptions.ProtocolError as exc:
                self.close_reason = f"HTTP/2 protocol error: {exc}"
                self._kick()
                await trio.lowlevel.checkpoint()
                return
            for event in events:
                if self._dispatch(event):
                    return
            self._kick()

    def _dispatch(self, event: Any) -> bool:
        """Route one h2 event; return True when the connection is over."""
        if isinstance(event, h2.events.RequestReceived):
            stream = LinkStream(self, event.stream_id, _str_headers(event.headers))
            self._streams[event.stream_id] = stream
            if event.stream_ended is not None:
                stream._on_end()
            if self._handler is None or self._nursery is None:
                stream._reset(h2.errors.ErrorCodes.REFUSED_STREAM)
            else:
                self._nursery.start_soon(self._run_handler, stream)
        elif isinstance(event, h2.events.ResponseReceived):
            stream_or_none = self._streams.get(event.stream_id)
            if stream_or_none is not None:
                stream_or_none.headers = _str_headers(event.headers)
                stream_or_none._signal_response()
                if event.stream_ended is not None:
                    stream_or_none._on_end()
        elif isinstance(event, h2.events.DataReceived):
            target = self._streams.get(event.stream_id)
            if target is None:
                self._h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            else:
                target._on_data(event.data, event.flow_controlled_length)
            if event.stream_ended is not None and target is not None:
                target._on_end()
        elif isinstance(event, h2.events.StreamEnded):
            target = self._streams.get(event.stream_id)
            if target is not None:
                target._on_end()
        elif isinstance(event, h2.events.StreamReset):
            target = self._streams.get(event.stream_id)
            if target is not None:
                target._on_reset(event.error_code)
            self._window_changed()
        elif isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
            self._window_changed()
        elif isinstance(event, h2.events.ConnectionTerminated):
            debug = _debug_text(event.additional_data)
            self.refused_field = _refused_field(debug)
            detail = f": {debug}" if debug else ""
            self.close_reason = f"peer sent GOAWAY ({_error_name(int(event.error_code or 0))}{detail})"
            return True
        return False

    async def _run_handler(self, stream: LinkStream) -> None:
        assert self._handler is not None
        try:
            await self._handler(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            if stream.stream_id in self._streams:
                await stream.finish()
