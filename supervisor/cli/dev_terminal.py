"""Dev mode with a terminal: the agent's own PTY, shown and typed into here (docs/design.md "Terminals").

When dev's stdin is a terminal (or with ``-t``), the boundary gives the agent a terminal of its own
(``--agent-stdio=tty``, opened in the agent's namespace: supervisor/boundary/forkimage/terminal.py) and dev is its
one client, as ``exec -it`` is an exec's: it attaches to the agent's handle through control's API
(``/v1/attach-stream``), puts the local terminal in raw mode and moves bytes.

Rules:

1. Every key goes to the agent's programs (raw mode: Ctrl-C, Ctrl-Z, Ctrl-\\ are bytes for the agent's line
   discipline), but the escape sequence: the escape character (``~``, ``--escape`` to change it, ``none`` for
   none) at the start of a line, then ``.`` stops the sandbox, ``?`` prints the escapes, the escape character
   again sends it once; anything else sends both (ssh's rule).
2. The size follows the local terminal (the first at attach, then every SIGWINCH).
3. Dev's own lines (the ready line, refusals, restarts) go out only where the agent's output is at the start of
   a line and not in the alternate screen (a full-screen program's): held until then, never into a prompt.
   Everything dev prints on stderr passes through that gate while the terminal is ours (``GatedStderr``).
4. The attachment is re-made while the boundary runs (a restarted control, a broken stream): output is held by
   the boundary meanwhile (the newest 1 MiB once a stream broke, with a note of what was dropped).
5. The terminal is restored on every way out, and what was typed but not read is discarded then (a reply the
   agent's escape sequences asked the terminal for must never reach the caller's shell).
6. The session ends when the boundary has exited: its code is the agent's (docs/design.md "Streams are for
   payload"); dev's sandbox lifetime rules are ``cli/dev.py``'s.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import termios
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

import trio

from supervisor.cli.api_client import ApiError, open_channel, request_json
from supervisor.cli.exec_client import _raw_terminal, _Sender, _terminal_size, _write
from supervisor.protocol.channel import (
    CLOSED,
    NEED_DATA,
    ChannelDecoder,
    ChannelProtocolError,
    Direction,
    Error,
    Exit,
    Lagged,
    Resize,
    Stdin,
    StdinEof,
    Stdout,
)

CHUNK: Final = 64 * 1024
ATTACH_RETRY_S: Final = 0.1  # between attempts while control is not (yet, or again) serving the agent
READY_LINE_WAIT_S: Final = 2.0  # how long the first attach waits for the ready line to go out before the output
_ALT_ON: Final = (b"\x1b[?1049h", b"\x1b[?1047h", b"\x1b[?47h")
_ALT_OFF: Final = (b"\x1b[?1049l", b"\x1b[?1047l", b"\x1b[?47l")
HELP: Final = "escapes: {c}. stop the sandbox · {c}? this help · {c}{c} send {c} (at the start of a line)"


def parse_escape(text: str) -> int | None:
    """``--escape``'s value: one character (``^X`` for a control character), or ``none``."""
    if text == "none":
        return None
    if len(text) == 2 and text[0] == "^" and "@" <= text[1].upper() <= "_":
        return ord(text[1].upper()) - 64
    if len(text) == 1 and ord(text) < 128:
        return ord(text)
    raise ValueError(f"--escape: {text!r} is not one ASCII character, ^X or none")


@dataclass
class EscapeFilter:
    """Rule 1 on the bytes typed: ``feed`` returns what goes to the agent and the escapes seen (``stop``,
    ``help``); nothing after a ``stop`` is sent."""

    char: int | None
    at_line_start: bool = True
    _pending: bool = False

    def feed(self, data: bytes) -> tuple[bytes, list[str]]:
        out = bytearray()
        actions: list[str] = []
        for byte in data:
            if self._pending:
                self._pending = False
                if byte == ord("."):
                    actions.append("stop")
                    return bytes(out), actions
                if byte == ord("?"):
                    actions.append("help")
                    continue
                assert self.char is not None
                out += bytes([self.char]) if byte == self.char else bytes([self.char, byte])
                self.at_line_start = byte in (10, 13) and byte != self.char
                continue
            if self.at_line_start and self.char is not None and byte == self.char:
                self._pending = True
                continue
            out.append(byte)
            self.at_line_start = byte in (10, 13)
        return bytes(out), actions


@dataclass
class Gate:
    """Rule 3: the agent's output as it comes, dev's lines between its lines. Thread-safe: dev's lines come
    from the thread that watches the daemons."""

    write_out: Callable[[bytes], None] = field(default=lambda data: _write(1, data))
    write_err: Callable[[bytes], None] = field(default=lambda data: _write(2, data))
    at_line_start: bool = True
    alternate: bool = False
    held: list[str] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)  # the ready line went out
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def output(self, data: bytes) -> None:
        if not data:
            return
        with self._lock:
            on = max(data.rfind(seq) for seq in _ALT_ON)
            off = max(data.rfind(seq) for seq in _ALT_OFF)
            if on != off:
                self.alternate = on > off
            end = data.rfind(b"\n") + 1  # held lines go out right after the chunk's last complete line
            if self.held and 0 < end < len(data) and not self.alternate:
                self.write_out(data[:end])
                self.at_line_start = True
                self._flush()
                data = data[end:]
            self.write_out(data)
            self.at_line_start = data.endswith(b"\n")
            self._flush()

    def say(self, line: str) -> None:
        with self._lock:
            self.held.append(line)
            self._flush()

    def _flush(self) -> None:
        if not self.at_line_start or self.alternate:
            return
        for line in self.held:
            self.write_err(line.encode("utf-8", "replace") + b"\r\n")  # raw mode: no newline translation
            if " is ready · " in line:
                self.ready.set()
        self.held.clear()

    def drain(self) -> None:
        """The session is over: what is still held goes out, on a line of its own."""
        with self._lock:
            if self.held and not self.at_line_start:
                self.write_err(b"\r\n")
            self.at_line_start, self.alternate = True, False
            self._flush()


class GatedStderr:
    """``sys.stderr`` while the terminal is dev's: complete lines go through the gate (rule 3)."""

    def __init__(self, gate: Gate, inner: TextIO) -> None:
        self._gate = gate
        self._inner = inner
        self._partial = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            self._gate.say(line.rstrip("\r"))
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return self._inner.isatty()

    def fileno(self) -> int:
        return self._inner.fileno()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@dataclass
class TerminalSession:
    """One dev sandbox's terminal: ``run`` returns the code of ``watch`` (the daemons' watcher, run in a thread:
    the boundary's exit code), attaching to the agent meanwhile (rule 4)."""

    api: Path
    escape: int | None
    stop: Callable[[], None]  # stop the sandbox from here (the escape's ".")
    wait_for_ready_line: bool = True
    gate: Gate = field(default_factory=Gate)
    _ended: threading.Event = field(default_factory=threading.Event)

    def run(self, watch: Callable[[], int]) -> int:
        saved_stderr = sys.stderr
        sys.stderr = GatedStderr(self.gate, saved_stderr)
        try:
            local = os.isatty(0)
            with _raw_terminal(0, local):
                try:
                    return trio.run(self._main, watch)
                finally:
                    self.gate.drain()
                    if local:
                        with contextlib.suppress(termios.error):
                            termios.tcflush(0, termios.TCIFLUSH)  # rule 5
        finally:
            sys.stderr = saved_stderr

    async def _main(self, watch: Callable[[], int]) -> int:
        code: list[int] = []

        async def watcher(cancel: trio.CancelScope) -> None:
            try:
                code.append(await trio.to_thread.run_sync(watch))
            finally:
                self._ended.set()
                cancel.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watcher, nursery.cancel_scope)
            nursery.start_soon(self._attach_loop)
        return code[0]

    async def _attach_loop(self) -> None:
        first = True
        while not self._ended.is_set():
            handle = await self._agent_handle()
            if handle is None:
                await trio.sleep(ATTACH_RETRY_S)
                continue
            if first and self.wait_for_ready_line:
                await trio.to_thread.run_sync(self.gate.ready.wait, READY_LINE_WAIT_S, abandon_on_cancel=True)
            first = False
            try:
                stream, _reply = await open_channel(self.api, "/v1/attach-stream", {"handle": handle})
            except (ApiError, OSError):
                await trio.sleep(ATTACH_RETRY_S)
                continue
            async with stream:
                if await self._serve(stream):
                    await trio.sleep_forever()  # the agent exited: the watcher ends the session
            await trio.sleep(ATTACH_RETRY_S)

    async def _agent_handle(self) -> str | None:
        try:
            status, body = await request_json(self.api, "GET", "/v1/status")
        except (ApiError, OSError):
            return None
        agent = ((body.get("boundary") or {}).get("agent") or {}) if status == 200 else {}
        if agent.get("result") is not None:
            return None
        handle = agent.get("handle")
        return str(handle) if handle else None

    async def _serve(self, stream: trio.abc.HalfCloseableStream) -> bool:
        """Pump one attachment; True once the agent's exit came through it."""
        sender = _Sender(stream)
        exited = False
        try:
            async with trio.open_nursery() as nursery:
                if (size := _terminal_size(0)) is not None:
                    await sender.send(Resize(*size))
                nursery.start_soon(self._pump_resize, sender)
                nursery.start_soon(self._pump_stdin, sender)
                exited = await self._read_frames(stream)
                nursery.cancel_scope.cancel()
        except* ChannelProtocolError as group:
            self.gate.say(f"openshell-sandbox: bad frame from the sandbox: {group.exceptions[0]}")
        except* (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # control went away: attach again (rule 4)
        return exited

    async def _read_frames(self, stream: trio.abc.ReceiveStream) -> bool:
        decoder = ChannelDecoder(Direction.TO_CLIENT)
        while True:
            event = decoder.next_frame()
            if event is NEED_DATA:
                data = await stream.receive_some(CHUNK)
                if not data:
                    return False
                decoder.receive_data(data)
                continue
            if event is CLOSED:
                return False
            match event:
                case Stdout(data):
                    self.gate.output(data)
                case Lagged(skipped):
                    self.gate.say(f"openshell-sandbox: {skipped} bytes of the agent's output were dropped while "
                                  "the terminal was detached")  # fmt: skip
                case Exit():
                    return True
                case Error(error):
                    self.gate.say(f"openshell-sandbox: the agent's terminal failed: {error.reason or error.kind}")
                    return False

    async def _pump_resize(self, sender: _Sender) -> None:
        with trio.open_signal_receiver(signal.SIGWINCH) as signals:
            async for _ in signals:
                if (size := _terminal_size(0)) is not None:
                    await sender.send(Resize(*size))

    async def _pump_stdin(self, sender: _Sender) -> None:
        keys = EscapeFilter(self.escape)
        while True:
            try:
                data = await trio.to_thread.run_sync(os.read, 0, CHUNK, abandon_on_cancel=True)
            except OSError as exc:
                if exc.errno != errno.EIO:
                    self.gate.say(f"openshell-sandbox: reading the terminal: {exc.strerror}")
                return
            if not data:
                if not os.isatty(0):  # stdin was a file or pipe (-t): its end is a ^D on the agent's terminal
                    await sender.send(StdinEof())
                return
            out, actions = keys.feed(data)
            if out:
                await sender.send(Stdin(out))
            for action in actions:
                if action == "help":
                    char = chr(self.escape if self.escape is not None else 126)
                    self.gate.say("openshell-sandbox: " + HELP.format(c=char))
                elif action == "stop":
                    self.gate.say("openshell-sandbox: stopping the sandbox (escape)")
                    self.stop()
                    return


def agent_terminal_flags(terminal: bool) -> list[str]:
    """The boundary's flags for an agent with a terminal: its size now and the caller's ``TERM``."""
    if not terminal:
        return []
    size = _terminal_size(0) or (80, 24)
    term = os.environ.get("TERM") or "xterm-256color"
    return ["--agent-stdio=tty", f"--agent-tty-size={size[0]}x{size[1]}", f"--agent-term={term}"]


def wants_terminal(tty: bool | None) -> bool:
    """``-t`` (``--tty``) or ``-T`` (``--no-tty``) say; else a terminal on both stdin and stdout (a PTY merges the
    agent's stderr into its stdout, which a redirected stdout must not get)."""
    if tty is not None:
        return tty
    return os.isatty(0) and os.isatty(1)
