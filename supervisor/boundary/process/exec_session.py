"""Moving one process's stdio over an exec channel stream (docs/reference/boundary.md §2.3, §2.8).

Rules:

1. The process's output fds are read by the process table's own tasks (:class:`ExecOutput`), not by the
   stream: a stream may break and be replaced while the process runs on.
2. While a stream is attached, or none has attached yet, output is never dropped: a reader stops reading its
   fd once ``HIGH_WATER`` bytes wait for the stream, so a slow client blocks the child's writes (backpressure).
3. Only after a stream broke (control loss) does an output become *lossy*: it keeps the newest 1 MiB and
   counts what it dropped; the next stream gets a ``LAGGED`` frame first.
4. After the process exits, each reader waits at most ``DRAIN_S`` (2 s) for its fd to reach EOF (a background
   grandchild may hold a pipe or the PTY open); then it takes whatever the kernel already buffered, without
   waiting, and stops. The process's own last bytes are always in that buffer, so they are never lost.
5. ``EXIT`` is sent only after every output reached EOF or was cut off by rule 4, then the stream is closed.
6. A PTY is one fd: its output is sent as ``STDOUT`` only; stdin, ``STDIN_EOF`` (as ``^D``) and resize go to
   the same master.
"""

from __future__ import annotations

import errno
import fcntl
import math
import os
import struct
import termios
from typing import TYPE_CHECKING, Any, Final, Protocol

import trio

from supervisor.link.h2link import LinkStream
from supervisor.protocol.channel import (
    CLOSED,
    NEED_DATA,
    ChannelDecoder,
    ChannelProtocolError,
    Direction,
    Error,
    Event,
    Exit,
    Lagged,
    Resize,
    Signal,
    Stderr,
    Stdin,
    StdinEof,
    Stdout,
    encode_frame,
)
from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.event_names import EventName
from supervisor.protocol.exit_result import ExitResult
from supervisor.protocol.process_ops import signal_number

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["CHUNK", "DRAIN_S", "RING", "ExecOutput", "OutputStream", "OwnedFd", "pump_exec", "write_all"]

CHUNK: Final = 64 * 1024
HIGH_WATER: Final = 64 * 1024
RING: Final = 1 << 20
DRAIN_S: Final = 2.0
_CTRL_D: Final = b"\x04"


class OwnedFd:
    """An fd whose number is never used after close (trio waiters are woken, not left on a reused number)."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    @property
    def closed(self) -> bool:
        return self._fd is None

    def fileno(self) -> int:
        if self._fd is None:
            raise trio.ClosedResourceError("fd already closed")
        return self._fd

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            trio.lowlevel.notify_closing(fd)
            os.close(fd)


async def write_all(fd: OwnedFd, data: bytes) -> None:
    """Write to a non-blocking fd, waiting for room; raises BrokenPipeError when the reader is gone."""
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd.fileno(), view)
        except BlockingIOError:
            await trio.lowlevel.wait_writable(fd.fileno())
            continue
        view = view[n:]
        await trio.lowlevel.checkpoint()


def set_winsize(fd: OwnedFd, cols: int, rows: int) -> None:
    fcntl.ioctl(fd.fileno(), termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class OutputStream:
    """One output fd of a process and the bytes read from it that no stream has taken yet."""

    def __init__(self, fd: OwnedFd, frame: type[Stdout] | type[Stderr], *, owns_fd: bool = True) -> None:
        self.fd = fd
        self.frame = frame
        self._owns_fd = owns_fd
        self._buf = bytearray()
        self.skipped = 0
        self.lossy = False
        self.eof = False
        self._deadline = math.inf
        self._scope: trio.CancelScope | None = None
        self._changed = trio.Event()
        self.on_chunk: Callable[[bytes], None] | None = None

    # -- shared with the consumer ----------------------------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def set_lossy(self, lossy: bool) -> None:
        self.lossy = lossy
        self._notify()

    def process_exited(self) -> None:
        """Start the drain bound of rule 4."""
        self._deadline = trio.current_time() + DRAIN_S
        if self._scope is not None:
            self._scope.deadline = self._deadline

    async def take(self) -> bytes | None:
        """Up to CHUNK pending bytes, waiting for some; ``None`` once the fd is done and the buffer empty."""
        while not self._buf:
            if self.eof:
                return None
            await self._changed.wait()
        data = bytes(self._buf[:CHUNK])
        del self._buf[:CHUNK]
        self._notify()
        return data

    def take_lagged(self) -> int:
        skipped, self.skipped = self.skipped, 0
        return skipped

    # -- the reader task --------------------------------------------------------------------------------------

    def _append(self, data: bytes) -> None:
        if self.on_chunk is not None:
            self.on_chunk(data)
        self._buf += data
        if self.lossy and len(self._buf) > RING:
            drop = len(self._buf) - RING
            del self._buf[:drop]
            self.skipped += drop
        self._notify()

    def _read(self, limit: int = CHUNK) -> bytes | None:
        """One non-blocking read: data, ``b""`` at EOF, ``None`` if nothing is there yet."""
        try:
            return os.read(self.fd.fileno(), limit)
        except BlockingIOError:
            return None
        except OSError as exc:
            if exc.errno == errno.EIO:  # PTY master after the last slave closed: the terminal's EOF
                return b""
            raise

    def _sweep(self) -> None:
        """Take what the kernel holds right now, without waiting (rule 4); a writer that keeps going is cut."""
        try:
            avail = struct.unpack("i", fcntl.ioctl(self.fd.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
        except OSError:
            avail = CHUNK
        while avail > 0:
            data = self._read(min(avail, CHUNK))
            if not data:
                return
            avail -= len(data)
            self._append(data)

    async def run(self) -> None:
        try:
            os.set_blocking(self.fd.fileno(), False)
            while True:
                while not self.lossy and len(self._buf) >= HIGH_WATER:
                    await self._changed.wait()
                data = self._read()
                if data is None:
                    with trio.CancelScope(deadline=self._deadline) as scope:
                        self._scope = scope
                        await trio.lowlevel.wait_readable(self.fd.fileno())
                    self._scope = None
                    if scope.cancelled_caught:
                        self._sweep()
                        return
                    continue
                if not data:
                    return
                self._append(data)
                await trio.lowlevel.checkpoint()
        except (OSError, trio.ClosedResourceError):
            return
        finally:
            self.eof = True
            if self._owns_fd:
                self.fd.close()
            self._notify()


class ExecOutput:
    """The output side of one process: stdout and stderr pipes, or one PTY master."""

    def __init__(self, streams: list[OutputStream]) -> None:
        self.streams = streams
        self.attached = False

    @property
    def done(self) -> bool:
        return all(s.eof for s in self.streams)

    def set_lossy(self, lossy: bool) -> None:
        for s in self.streams:
            s.set_lossy(lossy)

    def process_exited(self) -> None:
        for s in self.streams:
            s.process_exited()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            for s in self.streams:
                nursery.start_soon(s.run)


# -- the pump -------------------------------------------------------------------------------------------------


class _Sender:
    """One frame at a time on the stream (stdout, stderr and EXIT come from different tasks)."""

    def __init__(self, stream: trio.abc.HalfCloseableStream) -> None:
        self._stream = stream
        self._lock = trio.Lock()

    async def _acquire(self) -> None:
        # Uncontended (the usual case) without the schedule point ``Lock.acquire`` makes: a frame that is ready
        # is not sent a scheduling round late (the send itself is a schedule point).
        try:
            self._lock.acquire_nowait()
        except trio.WouldBlock:
            await self._lock.acquire()

    async def send(self, event: Event) -> None:
        await self._acquire()
        try:
            await self._stream.send_all(encode_frame(event))
        finally:
            self._lock.release()

    async def send_last(self, event: Event) -> None:
        """The stream's last frame and its half-close together: on the link, END_STREAM rides on that frame's
        DATA (one record for both, where a ``send_eof`` after the nursery's teardown was a record of its own)."""
        await self._acquire()
        try:
            data = encode_frame(event)
            if isinstance(self._stream, LinkStream):
                await self._stream.send_final(data)
            else:
                await self._stream.send_all(data)
                await self._stream.send_eof()
        finally:
            self._lock.release()


async def _forward_output(out: OutputStream, sender: _Sender) -> None:
    if skipped := out.take_lagged():
        await sender.send(Lagged(skipped))
    while (data := await out.take()) is not None:
        await sender.send(out.frame(data))


class ExecTarget(Protocol):
    """The process a stream is attached to, as this module uses it (``table.ProcessEntry`` is the one
    implementation; declared here so that this module does not import the table that imports it)."""

    @property
    def pty(self) -> OwnedFd | None: ...
    @property
    def stdin_fd(self) -> OwnedFd | None: ...
    @property
    def output(self) -> ExecOutput | None: ...
    @property
    def result(self) -> object: ...  # None while the process runs
    async def wait_result(self) -> ExitResult: ...
    def close_stdin(self) -> None: ...
    def resize(self, cols: int, rows: int) -> None: ...
    def send_signal(self, sig: int) -> None: ...
    def log_event(self, event: EventName, **fields: Any) -> None: ...


async def _apply_input(entry: ExecTarget, event: Event) -> None:
    match event:
        case Stdin(data):
            if data and (fd := entry.stdin_fd) is not None and not fd.closed:
                try:
                    await write_all(fd, data)
                except (BrokenPipeError, trio.ClosedResourceError):
                    entry.close_stdin()
        case StdinEof():
            if entry.pty is not None:
                if not entry.pty.closed and entry.result is None:
                    await write_all(entry.pty, _CTRL_D)
            else:
                entry.close_stdin()
        case Resize(cols, rows):
            if entry.pty is None:  # spec §2.8: invalid, not ignored; the stream ends, the process keeps running
                raise ChannelProtocolError("resize on a handle without a terminal (no PTY)")
            if entry.result is None:
                entry.resize(cols, rows)
        case Signal(name):
            try:
                entry.send_signal(signal_number(name))
            except OpError:
                pass  # an unknown name or an exited process: the client learns the outcome from EXIT


async def _read_input(entry: ExecTarget, stream: trio.abc.ReceiveStream) -> None:
    decoder = ChannelDecoder(Direction.TO_BOUNDARY)
    while True:
        event = decoder.next_frame()
        if event is NEED_DATA:
            decoder.receive_data(await stream.receive_some(CHUNK))
            continue
        if event is CLOSED:
            # A clean half-close from the client is its stdin EOF (spec §2.3); a PTY is left alone.
            if entry.pty is None:
                entry.close_stdin()
            await trio.sleep_forever()
        if isinstance(event, Stdin | StdinEof | Resize | Signal):
            await _apply_input(entry, event)


async def pump_exec(entry: ExecTarget, stream: trio.abc.HalfCloseableStream) -> None:
    """Serve one attached stream for ``entry`` until ``EXIT`` is sent or the stream breaks.

    A broken stream detaches (the process keeps running, its output turns lossy) and is not an error; a
    second concurrent stream for the same process is refused with ``unavailable``.
    """
    output = entry.output
    if output is not None and output.attached:
        raise OpError(ErrorKind.UNAVAILABLE, "a stream is already attached to this process")
    if output is not None:
        output.attached = True
        output.set_lossy(False)
    sender = _Sender(stream)
    finished = False
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_read_input, entry, stream)
            async with trio.open_nursery() as outs:
                for out in output.streams if output is not None else ():
                    outs.start_soon(_forward_output, out, sender)
            result = await entry.wait_result()
            await sender.send_last(Exit(result))
            finished = True
            nursery.cancel_scope.cancel()
    except* ChannelProtocolError as group:
        reason = str(group.exceptions[0])
        entry.log_event(EventName.EXEC_STREAM_ERROR, reason=reason)
        with trio.move_on_after(1):
            try:
                await sender.send(Error(OpError(ErrorKind.INVALID, f"bad channel frame: {reason}")))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
    except* (trio.BrokenResourceError, trio.ClosedResourceError):
        entry.log_event(EventName.EXEC_STREAM_BROKEN)
    finally:
        if output is not None:
            output.attached = False
            if not finished:
                output.set_lossy(True)
        # Finished: half-closed with the EXIT frame, and no more. The owner of the stream closes it once the client
        # has ended its side (the link does, with a grace period); resetting it now could lose the EXIT frame
        # while control is still relaying it onwards.
        if not finished:
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                try:
                    await stream.aclose()
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
