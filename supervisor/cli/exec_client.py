"""The CLI end of an exec channel: local terminal ⇄ channel frames (docs/design.md "Streams are for payload").

Rules:

1. fd 1 carries only the remote stdout, fd 2 only the remote stderr (and, at the very end, our own one-line
   messages about failures); both are written unbuffered, frame by frame.
2. With ``tty`` and a local terminal on stdin, the initial size is sent first and a ``RESIZE`` follows every
   SIGWINCH; with ``interactive`` too, the terminal is put in raw mode for the session and restored on every
   way out (normal exit, error, cancellation, SIGTERM/SIGHUP/SIGINT).
3. With ``interactive``, local stdin is forwarded as ``STDIN`` frames and its EOF as ``STDIN_EOF``; without it
   ``STDIN_EOF`` is sent at once (a remote process never waits for input nobody will type).
4. The return value is the code the CLI exits with: the remote code, ``128 + N`` for signal N, 126/127 for a
   launch failure (not executable / not found), 125 when openshell-sandbox itself failed.

Local stdin is read in a worker thread with blocking reads, so its file description is never switched to
non-blocking (a terminal shares it with the user's shell).
"""

from __future__ import annotations

import errno
import os
import select
import signal
import sys
import termios
import tty as _tty
from contextlib import contextmanager
from typing import Any, Final

import trio

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
    Stderr,
    Stdin,
    StdinEof,
    Stdout,
    encode_frame,
)
from supervisor.protocol.errors import OpError
from supervisor.protocol.exit_codes import ExitCode, for_launch_errno, for_signal
from supervisor.protocol.exit_result import ExitResult

__all__ = ["render_error", "render_exit", "run_exec_client"]

_CHUNK: Final = 64 * 1024


def render_exit(result: ExitResult) -> int:
    """Exit code for a §2.5 wait result."""
    return result.exit_code


def render_error(error: OpError) -> int:
    """Exit code for an ERROR frame: 127/126 when the launch failed for want of a program, else 125."""
    if error.stage is not None and error.errno is not None:
        return for_launch_errno(error.errno)
    return ExitCode.SELF_FAILED


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            # the file description was made non-blocking by someone else: wait until it drains
            select.select([], [fd], [])


def _message(text: str) -> None:
    try:
        _write(2, f"openshell-sandbox: {text}\r\n".encode())
    except OSError:
        pass


@contextmanager
def _raw_terminal(fd: int, enabled: bool) -> Any:
    if not enabled:
        yield
        return
    saved = termios.tcgetattr(fd)
    try:
        _tty.setraw(fd, termios.TCSANOW)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _terminal_size(fd: int) -> tuple[int, int] | None:
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return None
    if size.columns < 1 or size.lines < 1:
        return None
    return min(size.columns, 0xFFFF), min(size.lines, 0xFFFF)


class _Sender:
    def __init__(self, stream: trio.abc.HalfCloseableStream) -> None:
        self._stream = stream
        self._lock = trio.Lock()
        self._closed = False

    async def send(self, event: Event) -> None:
        """Send a frame; once the remote side stopped reading, drop it (the EXIT frame may already be on its way
        to us: keep reading rather than report a broken stream)."""
        if self._closed:
            return
        async with self._lock:
            try:
                await self._stream.send_all(encode_frame(event))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._closed = True


async def _pump_stdin(sender: _Sender, fd: int) -> None:
    while True:
        try:
            data = await trio.to_thread.run_sync(os.read, fd, _CHUNK, abandon_on_cancel=True)
        except OSError as exc:
            if exc.errno != errno.EIO:
                _message(f"reading stdin: {exc.strerror}")
            data = b""
        if not data:
            await sender.send(StdinEof())
            return
        await sender.send(Stdin(data))


async def _pump_resize(sender: _Sender, fd: int) -> None:
    with trio.open_signal_receiver(signal.SIGWINCH) as signals:
        async for _ in signals:
            if (size := _terminal_size(fd)) is not None:
                await sender.send(Resize(*size))


async def _watch_termination(cancel: trio.CancelScope, box: list[int]) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP, signal.SIGINT) as signals:
        async for signum in signals:
            box.append(for_signal(signum))
            cancel.cancel()
            return


async def _read_frames(stream: trio.abc.ReceiveStream) -> int:
    decoder = ChannelDecoder(Direction.TO_CLIENT)
    while True:
        event = decoder.next_frame()
        if event is NEED_DATA:
            decoder.receive_data(await stream.receive_some(_CHUNK))
            continue
        if event is CLOSED:
            _message("the exec stream closed before the process exit was reported")
            return ExitCode.SELF_FAILED
        match event:
            case Stdout(data):
                _write(1, data)
            case Stderr(data):
                _write(2, data)
            case Lagged(skipped):
                _message(f"{skipped} bytes of output were dropped while no client was attached")
            case Exit(result):
                return render_exit(result)
            case Error(error):
                reason = error.reason or str(error.kind)
                stage = f" (stage {error.stage})" if error.stage else ""
                _message(f"exec failed: {reason}{stage}")
                return render_error(error)


async def run_exec_client(stream: trio.abc.HalfCloseableStream, *, tty: bool, interactive: bool) -> int:
    """Drive one exec channel until the remote process ends; returns the exit code to use."""
    stdin_fd = 0
    local_tty = tty and os.isatty(stdin_fd)
    # Raw mode only when our keystrokes go to the remote terminal; otherwise Ctrl-C must still stop us.
    raw = local_tty and interactive
    sender = _Sender(stream)
    killed: list[int] = []
    code: int = ExitCode.SELF_FAILED
    with _raw_terminal(stdin_fd, raw):
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_watch_termination, nursery.cancel_scope, killed)
                if local_tty and (size := _terminal_size(stdin_fd)) is not None:
                    await sender.send(Resize(*size))
                if local_tty:
                    nursery.start_soon(_pump_resize, sender, stdin_fd)
                if interactive:
                    nursery.start_soon(_pump_stdin, sender, stdin_fd)
                else:
                    await sender.send(StdinEof())
                code = await _read_frames(stream)
                nursery.cancel_scope.cancel()
        except* ChannelProtocolError as group:
            _message(f"bad frame from the sandbox: {group.exceptions[0]}")
            code = ExitCode.SELF_FAILED
        except* (trio.BrokenResourceError, trio.ClosedResourceError) as group:
            _message(f"exec stream broke: {group.exceptions[0]}")
            code = ExitCode.SELF_FAILED
        except* BrokenPipeError:
            code = for_signal(signal.SIGPIPE)  # our own stdout went away, as a shell pipeline reports it
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                try:
                    await stream.aclose()
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass
    if killed:
        return killed[0]
    sys.stdout.flush()
    return code
