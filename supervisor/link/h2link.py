"""HTTP/2 over one trio byte stream, turned into trio streams (one per HTTP/2 stream).

Both daemons speak it: control is the HTTP/2 client on ``openshell-ops/1`` links and the boundary is the client
on ``openshell-egress/1`` links. The h2 state machine is sans-I/O; this module owns the I/O around it and turns
h2 events into a small vocabulary once, so that everything above speaks only :class:`LinkStream`. What it
needs from h2 below its public API lives in :mod:`supervisor.link.h2_hooks`; one stream and its flow control in
:mod:`supervisor.link.h2stream`; refusing a peer with a GOAWAY that names why in :mod:`supervisor.link.refusal`.

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
* **Flow control is per stream and end to end** (``h2stream``): received DATA is acknowledged to the peer only
  when the application has consumed it, and senders wait for window on their own stream and the connection.
* Windows and frames are large (the TLS leg is the throughput ceiling; fewer, bigger frames cost less CPU).
* ``END_STREAM`` is half-close and ``RST_STREAM`` is abort (``h2stream``); a reset or a lost link makes every
  pending operation on the stream raise :class:`trio.BrokenResourceError`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import h2.config
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import trio
import trio.lowlevel

from supervisor.link.h2_hooks import H2Connection
from supervisor.link.h2stream import Headers, LinkClosed, LinkStream, error_name
from supervisor.link.refusal import debug_text, refused_field

# the stream's names are the link's API too (a link's streams are LinkStreams), so they are importable from here
__all__ = [
    "CONNECTION_WINDOW",
    "MAX_CONCURRENT_STREAMS",
    "MAX_FRAME",
    "READ_SIZE",
    "RECORD",
    "STREAM_WINDOW",
    "Headers",
    "Link",
    "LinkClosed",
    "LinkStream",
    "StreamHandler",
]

StreamHandler = Callable[[LinkStream], Awaitable[None]]

# Settings both sides advertise. The receive window is what a stream may have in flight unacknowledged.
STREAM_WINDOW = 4 * 1024 * 1024
CONNECTION_WINDOW = 64 * 1024 * 1024
MAX_FRAME = 256 * 1024
MAX_CONCURRENT_STREAMS = 32768  # per link; control keeps 2, so ~65k captured connections at once
READ_SIZE = 256 * 1024
RECORD = 16 * 1024  # the largest TLS record's payload: what the writer packs small frames into


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


def _str_headers(headers: Any) -> Headers:
    """h2 decodes headers as str with ``header_encoding`` set; normalise the type for mypy and for safety."""
    out: Headers = []
    for name, value in headers:
        out.append((_text(name), _text(value)))
    return out


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _cause(exc: BaseException) -> str:
    """What broke a transport: trio wraps the SSL error (a TLS alert names the peer's reason) as the cause."""
    cause = exc.__cause__ or exc
    return f"{type(cause).__name__}: {cause}" if str(cause) else repr(cause)


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
        #: the field the peer named when it refused us with a GOAWAY (``refusal.send_refusal``), if it did
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
            debug = debug_text(event.additional_data)
            self.refused_field = refused_field(debug)
            detail = f": {debug}" if debug else ""
            self.close_reason = f"peer sent GOAWAY ({error_name(int(event.error_code or 0))}{detail})"
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
