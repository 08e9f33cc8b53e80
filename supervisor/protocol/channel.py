"""Channel framing for one exec stream, end to end between the CLI and the boundary (docs/reference/boundary.md §2.3).

Rules this module enforces:

1. A frame is ``type (1 byte) | length (4 bytes, big-endian) | payload``. The payload is at most
   ``MAX_PAYLOAD`` (1 MiB); a larger length is a protocol error as soon as the header is seen, before any
   payload is buffered.
2. Each type has a fixed payload shape, checked on decode: data frames carry any bytes, ``STDIN_EOF`` is empty,
   ``RESIZE`` is two u16 (cols, rows) both ≥ 1, ``SIGNAL`` is a short UTF-8 name, ``EXIT`` and ``ERROR`` are
   a JSON object, ``LAGGED`` is one u64. Anything else raises :class:`ChannelProtocolError` — never another
   exception, whatever the bytes.
3. A decoder may be told which direction it reads (``TO_BOUNDARY`` or ``TO_CLIENT``): a frame type that only
   the other side may send is a protocol error, so a client cannot forge an ``EXIT`` and a boundary cannot
   inject ``STDIN``.

Theory of operation (h11 style): the owner feeds bytes with :meth:`ChannelDecoder.receive_data` (``b""`` means
the peer closed) and pulls events with :meth:`ChannelDecoder.next_frame` until it returns ``NEED_DATA`` (feed
more) or ``CLOSED`` (clean end of stream). :func:`encode_frame` turns an event back into bytes. No I/O here.
"""

from __future__ import annotations

import enum
import json
import struct
from dataclasses import dataclass, field
from typing import Final

from supervisor.protocol.errors import OpError
from supervisor.protocol.exit_result import ExitResult, ExitResultError
from supervisor.protocol.json_value import JsonValue

__all__ = [
    "CLOSED",
    "MAX_PAYLOAD",
    "NEED_DATA",
    "ChannelDecoder",
    "ChannelProtocolError",
    "Direction",
    "Error",
    "Event",
    "Exit",
    "FrameType",
    "Lagged",
    "Resize",
    "Signal",
    "Stderr",
    "Stdin",
    "StdinEof",
    "Stdout",
    "encode_frame",
]

MAX_PAYLOAD: Final = 1 << 20
MAX_SIGNAL_NAME: Final = 32
_HEADER = struct.Struct(">BI")
_RESIZE = struct.Struct(">HH")
_U64 = struct.Struct(">Q")


class FrameType(enum.IntEnum):
    STDIN = 1
    STDIN_EOF = 2
    RESIZE = 3
    SIGNAL = 4
    STDOUT = 10
    STDERR = 11
    EXIT = 12
    ERROR = 13
    LAGGED = 14


class Direction(enum.Enum):
    TO_BOUNDARY = "to-boundary"  # frames the client sends
    TO_CLIENT = "to-client"  # frames the boundary sends


_ALLOWED: Final = {
    Direction.TO_BOUNDARY: frozenset({FrameType.STDIN, FrameType.STDIN_EOF, FrameType.RESIZE, FrameType.SIGNAL}),
    Direction.TO_CLIENT: frozenset(
        {FrameType.STDOUT, FrameType.STDERR, FrameType.EXIT, FrameType.ERROR, FrameType.LAGGED}
    ),
}


class ChannelProtocolError(Exception):
    """The peer sent bytes that are not a valid channel frame; the stream must be dropped."""


class _Sentinel:
    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


NEED_DATA: Final = _Sentinel("NEED_DATA")
CLOSED: Final = _Sentinel("CLOSED")


# -- events ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stdin:
    data: bytes


@dataclass(frozen=True)
class StdinEof:
    pass


@dataclass(frozen=True)
class Resize:
    cols: int
    rows: int


@dataclass(frozen=True)
class Signal:
    name: str


@dataclass(frozen=True)
class Stdout:
    data: bytes


@dataclass(frozen=True)
class Stderr:
    data: bytes


@dataclass(frozen=True)
class Exit:
    """The wait result of spec §2.5 (a JSON object on the wire)."""

    result: ExitResult


@dataclass(frozen=True)
class Error:
    """Why the operation failed (an OpError body ``{"kind", "reason", ...}`` on the wire), sent instead of
    ``Exit``."""

    error: OpError = field(hash=False)  # an exception, so not hashable


@dataclass(frozen=True)
class Lagged:
    """Bytes of output dropped while no stream was attached (spec §2.8)."""

    skipped: int


Event = Stdin | StdinEof | Resize | Signal | Stdout | Stderr | Exit | Error | Lagged


# -- encoding -------------------------------------------------------------------------------------------------


def _frame(kind: FrameType, payload: bytes) -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
    return _HEADER.pack(kind, len(payload)) + payload


def _json_bytes(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def encode_frame(event: Event) -> bytes:
    """Serialise one event. Raises ``ValueError`` for an event that could not be decoded back."""
    match event:
        case Stdin(data):
            return _frame(FrameType.STDIN, bytes(data))
        case StdinEof():
            return _frame(FrameType.STDIN_EOF, b"")
        case Resize(cols, rows):
            if not (1 <= cols <= 0xFFFF and 1 <= rows <= 0xFFFF):
                raise ValueError(f"terminal size out of range: {cols}x{rows}")
            return _frame(FrameType.RESIZE, _RESIZE.pack(cols, rows))
        case Signal(name):
            raw = name.encode()
            _check_signal_name(raw)
            return _frame(FrameType.SIGNAL, raw)
        case Stdout(data):
            return _frame(FrameType.STDOUT, bytes(data))
        case Stderr(data):
            return _frame(FrameType.STDERR, bytes(data))
        case Exit(result):
            return _frame(FrameType.EXIT, _json_bytes(result.to_wire()))
        case Error(error):
            return _frame(FrameType.ERROR, _json_bytes(error.to_json()))
        case Lagged(skipped):
            if not 0 <= skipped < 1 << 64:
                raise ValueError(f"lagged count out of range: {skipped}")
            return _frame(FrameType.LAGGED, _U64.pack(skipped))
    raise TypeError(f"not a channel event: {event!r}")


# -- decoding -------------------------------------------------------------------------------------------------


def _check_signal_name(raw: bytes) -> None:
    if not 1 <= len(raw) <= MAX_SIGNAL_NAME or not raw.isascii() or not raw.isalnum():
        raise ValueError("signal name must be 1..32 ASCII letters or digits")


def _json_object(payload: bytes) -> dict[str, JsonValue]:
    try:
        obj = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ChannelProtocolError(f"frame payload is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ChannelProtocolError("frame payload must be a JSON object")
    return obj


def _decode_stdin(p: bytes) -> Event:
    return Stdin(p)


def _decode_stdin_eof(p: bytes) -> Event:
    if p:
        raise ChannelProtocolError("STDIN_EOF carries no payload")
    return StdinEof()


def _decode_resize(p: bytes) -> Event:
    if len(p) != _RESIZE.size:
        raise ChannelProtocolError("RESIZE payload must be 4 bytes")
    cols, rows = _RESIZE.unpack(p)
    if cols == 0 or rows == 0:
        raise ChannelProtocolError("RESIZE with a zero dimension")
    return Resize(cols, rows)


def _decode_signal(p: bytes) -> Event:
    try:
        _check_signal_name(p)
    except ValueError as exc:
        raise ChannelProtocolError(str(exc)) from None
    return Signal(p.decode("ascii"))


def _decode_stdout(p: bytes) -> Event:
    return Stdout(p)


def _decode_stderr(p: bytes) -> Event:
    return Stderr(p)


def _decode_exit(p: bytes) -> Event:
    try:
        return Exit(ExitResult.from_wire(_json_object(p)))
    except ExitResultError as exc:
        raise ChannelProtocolError(f"EXIT: {exc}") from None


def _decode_error(p: bytes) -> Event:
    return Error(OpError.from_json(_json_object(p)))


def _decode_lagged(p: bytes) -> Event:
    if len(p) != _U64.size:
        raise ChannelProtocolError("LAGGED payload must be 8 bytes")
    return Lagged(_U64.unpack(p)[0])


_DECODERS: Final = {
    FrameType.STDIN: _decode_stdin,
    FrameType.STDIN_EOF: _decode_stdin_eof,
    FrameType.RESIZE: _decode_resize,
    FrameType.SIGNAL: _decode_signal,
    FrameType.STDOUT: _decode_stdout,
    FrameType.STDERR: _decode_stderr,
    FrameType.EXIT: _decode_exit,
    FrameType.ERROR: _decode_error,
    FrameType.LAGGED: _decode_lagged,
}


class ChannelDecoder:
    """Incremental frame decoder. Once it has raised, it keeps raising: the stream is not recoverable."""

    def __init__(self, direction: Direction | None = None) -> None:
        self._allowed = _ALLOWED[direction] if direction is not None else frozenset(FrameType)
        self._buf = bytearray()
        self._eof = False
        self._error: ChannelProtocolError | None = None

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Feed bytes from the peer; ``b""`` marks the end of the stream."""
        if self._eof and data:
            raise RuntimeError("receive_data after end of stream")
        if not data:
            self._eof = True
        else:
            self._buf += data

    def next_frame(self) -> Event | _Sentinel:
        if self._error is not None:
            raise self._error
        try:
            return self._next()
        except ChannelProtocolError as exc:
            self._error = exc
            raise

    def _next(self) -> Event | _Sentinel:
        buf = self._buf
        if len(buf) < _HEADER.size:
            return self._need_more()
        code, length = _HEADER.unpack_from(buf)
        try:
            kind = FrameType(code)
        except ValueError:
            raise ChannelProtocolError(f"unknown frame type {code}") from None
        if kind not in self._allowed:
            raise ChannelProtocolError(f"frame type {kind.name} not allowed in this direction")
        if length > MAX_PAYLOAD:
            raise ChannelProtocolError(f"frame payload of {length} bytes exceeds {MAX_PAYLOAD}")
        end = _HEADER.size + length
        if len(buf) < end:
            return self._need_more()
        payload = bytes(buf[_HEADER.size : end])
        del buf[:end]
        return _DECODERS[kind](payload)

    def _need_more(self) -> _Sentinel:
        if not self._eof:
            return NEED_DATA
        if self._buf:
            raise ChannelProtocolError(f"stream ended inside a frame ({len(self._buf)} bytes pending)")
        return CLOSED
