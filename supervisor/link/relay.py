"""Relay bytes between two half-closeable streams until both directions are done, one fails, or it idles.

Theory of operation. Two pumps run in one nursery, ``a → b`` in a task of its own and ``b → a`` in the
caller's. Each pump awaits ``send_all`` on its destination before it receives the next chunk from its source,
so a slow reader slows its writer and at most one chunk per direction is ever buffered here: backpressure by
construction.

* **Half-close.** A pump that reads EOF sends EOF on the other stream and ends; the opposite pump keeps
  going. The relay ends cleanly when both pumps have ended this way, and then closes both streams.
* **Failure.** A receive that fails is blamed on its source, a send (or send_eof) that fails on its
  destination. The first failure cancels both pumps and *aborts* both streams: a TCP socket is closed with
  ``SO_LINGER`` 0 (the peer sees a reset), a stream with an async ``reset()`` (our HTTP/2 link streams) is
  reset. An abort, never a FIN, is what tells a client that a transfer was cut short rather than complete.
* **Idle timeout.** One cancel scope wraps both pumps; its deadline moves forward whenever a chunk is
  received or delivered in either direction (by steps of at least 1 % of the timeout, at most 1 s: the relay
  may end that much before a full ``idle_timeout`` of quiet, never after). When it fires the relay is idle
  in both directions and both streams are aborted.
* **Outside cancellation** (e.g. a policy reload closing relays) aborts both streams and propagates.

The caller hands both streams over: they are closed when ``relay`` returns or raises (``close=False`` leaves
them to the caller, which then owns the closing too).

This is the only byte pump of the project (the raw tunnel, the inspected path's raw fallback and its upgraded
connections, the boundary's plain-HTTP forward, exec/forward channels). What its callers differ in is
options, never a loop of their own:

* ``half_close`` names the sides whose EOF is forwarded as a half-close (default: both). The EOF of a side not
  in it ends the relay cleanly — for streams with no half-close (TLS), or a one-request forward whose
  response ends with the upstream's EOF.
* ``filter_a`` sees every chunk ``a → b`` before it is sent (what is sent, and what is counted, is what it
  returns) and says whether to go on: :attr:`Flow.EOF` makes the source's end here (its EOF is sent on, as
  for a real EOF), :attr:`Flow.STOP` ends the relay (``closed_by`` ``filter``; the caller says why).
"""

from __future__ import annotations

import enum
import fcntl
import math
import socket
import struct
import termios
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import trio

__all__ = ["ChunkFilter", "Flow", "RelayEnd", "RelayStats", "abort_stream", "close_now", "relay"]

# What a broken peer looks like through trio's stream ABC.
_STREAM_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)

# A socket is received from with a buffer the size of what is queued on it (``FIONREAD``, up to ``chunk``):
# ``recv(n)`` allocates all n bytes before it shrinks the result, and above glibc's mmap threshold (128 KiB) a
# receive of a few bytes costs a map and an unmap (~25 us more per receive on loopback than one of 64 KiB), while a
# smaller fixed buffer would split a bulk transfer's backlog into more, smaller chunks on the link.
EMPTY_READ = 4096  # nothing queued yet readable: the receive that reports the EOF or the error


class RelayEnd(enum.StrEnum):
    """Who ended the relay; values are the strings used in events."""

    A = "a"  # a's EOF came first (clean) or a failed (see ``error``)
    B = "b"
    IDLE = "idle-timeout"
    CANCELLED = "cancelled"
    FILTER = "filter"  # ``filter_a`` said stop


class Flow(enum.Enum):
    """What a :data:`ChunkFilter` says after a chunk: how the flow goes on."""

    MORE = enum.auto()  # go on
    EOF = enum.auto()  # the source is done here: its EOF goes on, as for a real one
    STOP = enum.auto()  # end the relay now


ChunkFilter = Callable[[bytes], tuple[bytes, Flow]]


@dataclass(slots=True)
class RelayStats:
    bytes_a_to_b: int = 0
    bytes_b_to_a: int = 0
    duration_s: float = 0.0
    closed_by: str = ""  # a RelayEnd value
    error: str | None = None  # "<side>: <exception>" when a side failed; None for a clean end or idle


class _Relay:
    # one per relayed connection in each daemon for as long as it lasts: slots keep idle memory per connection low
    __slots__ = ("a", "b", "chunk", "filter_a", "half_close", "idle_timeout", "scope", "slack", "stats", "stopped")

    def __init__(
        self,
        a: trio.abc.Stream,
        b: trio.abc.Stream,
        idle: float,
        chunk: int,
        half_close: Collection[RelayEnd],
        filter_a: ChunkFilter | None,
    ) -> None:
        self.a, self.b = a, b
        self.idle_timeout = idle
        self.chunk = chunk
        self.half_close = half_close
        self.filter_a = filter_a
        self.stats = RelayStats()
        # The nursery's own cancel scope is both the idle timeout (its deadline) and the pumps' end (cancel()):
        # one scope per relay, not three (each ~0.6 KB held for as long as the connection lasts).
        self.scope = trio.CancelScope()  # replaced by the nursery's once it is open
        self.stopped = False  # cancel() was called: what the scope caught was not (only) the idle deadline
        # touch() moves the deadline only once it lags by more than this: twice per chunk, moving a trio
        # deadline (a heap update under a context manager) cost ~4 % of the boundary's CPU in a bulk transfer.
        self.slack = min(1.0, idle / 100)

    def touch(self) -> None:
        deadline = trio.current_time() + self.idle_timeout
        current = self.scope.deadline
        if deadline - current > self.slack or current == math.inf:  # inf: the first touch
            self.scope.deadline = deadline

    def ended(self, side: RelayEnd) -> None:
        if not self.stats.closed_by:
            self.stats.closed_by = side

    def stop(self, why: RelayEnd) -> None:
        """End the relay without a failure: an EOF that is not half-closed, or the filter's stop."""
        self.ended(why)
        self.cancel()

    def failed(self, side: RelayEnd, exc: BaseException) -> None:
        if self.stats.error is None:
            self.stats.closed_by = side
            self.stats.error = f"{side}: {type(exc).__name__}: {exc}".rstrip(": ")
        self.cancel()

    def cancel(self) -> None:
        self.stopped = True
        self.scope.cancel()

    def idled(self) -> bool:
        """The idle deadline ended the pumps (as it would have, had it passed when a stop or failure came)."""
        return self.scope.cancelled_caught and (not self.stopped or trio.current_time() >= self.scope.deadline)

    async def pump(self, src_side: RelayEnd, dst_side: RelayEnd) -> None:
        src, dst = (self.a, self.b) if src_side is RelayEnd.A else (self.b, self.a)
        sock = src.socket if type(src) is trio.SocketStream else None
        fd = sock.fileno() if sock is not None else -1
        while True:
            try:
                if sock is not None:
                    queued = _queued(fd)
                    if queued == 0:
                        # Wait here, not inside the receive: an idle connection's pump waits for as long as it is
                        # idle, and ``SocketStream.receive_some`` would hold its own frames, its error-translating
                        # context manager and the socket's non-blocking helper all that time (~1.3 KB a socket).
                        # A socket that cannot be waited on is left to the receive, which fails as it always did.
                        try:
                            await trio.lowlevel.wait_readable(sock)
                        except (OSError, ValueError):
                            pass
                        queued = _queued(fd)
                    size = min(queued, self.chunk) if queued > 0 else min(self.chunk, EMPTY_READ)
                    data = await src.receive_some(size)
                else:
                    data = await src.receive_some(self.chunk)
            except _STREAM_ERRORS as exc:
                self.failed(src_side, exc)
                return
            self.touch()
            flow = Flow.MORE if data else Flow.EOF
            if data and src_side is RelayEnd.A and self.filter_a is not None:
                data, flow = self.filter_a(bytes(data))
            try:
                if data:
                    await dst.send_all(data)
                    if src_side is RelayEnd.A:
                        self.stats.bytes_a_to_b += len(data)
                    else:
                        self.stats.bytes_b_to_a += len(data)
                if flow is Flow.STOP:
                    self.stop(RelayEnd.FILTER)
                    return
                if flow is Flow.EOF:
                    if src_side not in self.half_close:
                        self.stop(src_side)
                        return
                    self.ended(src_side)
                    assert isinstance(dst, trio.abc.HalfCloseableStream)  # relay() checked it
                    await dst.send_eof()
                    return
            except _STREAM_ERRORS as exc:
                self.failed(dst_side, exc)
                return
            # Not held while waiting for the next one: an idle connection would keep its last chunk (up to
            # ``chunk`` bytes per direction, in each daemon) for as long as it stays open.
            del data
            self.touch()


def _queued(fd: int) -> int:
    """How many bytes are queued on socket ``fd`` (``FIONREAD``); -1 when that cannot be asked (the receive then
    reports why)."""
    try:
        return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, _INT_ZERO))[0])
    except OSError:
        return -1


_INT_ZERO = struct.pack("i", 0)


_BOTH = frozenset({RelayEnd.A, RelayEnd.B})


async def relay(
    a: trio.abc.Stream,
    b: trio.abc.Stream,
    *,
    idle_timeout: float,
    chunk: int = 256 * 1024,  # one h2 DATA frame of the link (h2link.MAX_FRAME): a quarter of the per-chunk cost
    half_close: Collection[RelayEnd] = _BOTH,
    filter_a: ChunkFilter | None = None,
    close: bool = True,
) -> RelayStats:
    """Relay until done; returns the byte counts, the duration and who ended it. Closes both streams unless
    ``close`` is false. A side in ``half_close`` needs a half-closeable stream on the other end."""
    for side, other in ((RelayEnd.A, b), (RelayEnd.B, a)):
        if side in half_close and not isinstance(other, trio.abc.HalfCloseableStream):
            raise TypeError(f"half-closing {side}'s end needs a half-closeable stream, not {type(other).__name__}")
    r = _Relay(a, b, idle_timeout, chunk, half_close, filter_a)
    start = trio.current_time()
    clean = False
    try:
        async with trio.open_nursery() as nursery:
            r.scope = nursery.cancel_scope
            r.touch()
            nursery.start_soon(r.pump, RelayEnd.A, RelayEnd.B)
            # b → a in the caller's own task: one task fewer per relay (~2 KB each, and every connection
            # holds one relay in each daemon: docs/performance.md "Where each target stands", idle memory)
            await r.pump(RelayEnd.B, RelayEnd.A)
        idled = r.idled()
        if idled and r.stats.error is None:
            r.stats.closed_by = RelayEnd.IDLE
        clean = r.stats.error is None and not idled
    except BaseException:  # Cancelled, possibly grouped with its twin from the other pump
        r.stats.closed_by = RelayEnd.CANCELLED
        raise
    finally:
        r.stats.duration_s = trio.current_time() - start
        if not close:
            pass
        elif clean:
            await _close_both(a, b)
        else:
            await _abort_both(a, b)
    return r.stats


async def _close_both(a: trio.abc.AsyncResource, b: trio.abc.AsyncResource) -> None:
    for s in (a, b):
        await close_now(s)


async def close_now(stream: trio.abc.AsyncResource) -> None:
    """``trio.aclose_forcefully`` without its price where nothing could wait: a socket (its close only closes) or
    a stream that says so (``closes_at_once``) is closed under a shield. Forcing means cancelling the close and
    catching the ``Cancelled`` it raises, ~25 µs a stream here, and every connection closes two in each daemon."""
    if isinstance(stream, trio.SocketStream) or getattr(stream, "closes_at_once", False):
        with trio.CancelScope(shield=True):
            await stream.aclose()
    else:
        await trio.aclose_forcefully(stream)


async def _abort_both(a: trio.abc.AsyncResource, b: trio.abc.AsyncResource) -> None:
    with trio.CancelScope(shield=True):
        for s in (a, b):
            await abort_stream(s)


_LINGER_ZERO = struct.pack("ii", 1, 0)


async def abort_stream(stream: trio.abc.AsyncResource) -> None:
    """Close ``stream`` so that its peer sees an abort rather than an orderly end, where the stream allows it."""
    reset: Any = getattr(stream, "reset", None)
    if callable(reset):
        try:
            await reset()
        except _STREAM_ERRORS:
            pass
    else:
        inner: Any = stream
        while inner is not None and not isinstance(inner, trio.SocketStream):
            inner = getattr(inner, "transport_stream", None)
        if isinstance(inner, trio.SocketStream):
            try:
                inner.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)
            except OSError:
                pass
    await trio.aclose_forcefully(stream)
