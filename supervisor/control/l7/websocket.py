"""Client-to-server WebSocket frames after an admitted upgrade, on ``protocol: websocket`` endpoints, sans-I/O.

Spec §3.10.5 evaluates every complete client text message as ``WEBSOCKET_TEXT <upgrade path>``. The payload is
never matched, so for one connection every text message gets the same answer: control asks the policy once,
at the upgrade. When the answer is allow (or audit) the connection is relayed raw. When it is deny, the
client's frames pass through :class:`ClientFrameFilter`, which streams them unchanged (no buffering: it only
reads frame headers) and stops at the first frame of a text message: control then closes both sides with
code 1008 (policy violation). Binary and control frames pass; an unmasked client frame, a reserved opcode or
a fragmented or oversized control frame is a protocol error (1002) (RFC 6455 §5.1-§5.5). Compression
(permessage-deflate) changes payloads only, never opcodes, so it does not blind the filter.

On an endpoint with GraphQL policy the payload *is* judged: :class:`MessageFilter` holds each data message's frames
until the message is whole (fragments reassembled, unmasked, at most :data:`MAX_MESSAGE` bytes), asks its judge,
and forwards the frames as they came only when the answer is yes. Control frames pass at once (RFC 6455 §5.4 lets
them interleave with a fragmented message). The upgrade's ``Sec-WebSocket-Extensions`` offer is stripped
(:func:`without_extensions`), so no extension is negotiated and a frame with an RSV bit set is a protocol error: a
compressed message cannot pass unread.
"""

from __future__ import annotations

import enum
import os
import struct
from collections.abc import Callable

from supervisor.protocol.request_head import RequestHead

__all__ = [
    "MAX_MESSAGE",
    "ClientFrameFilter",
    "CloseCode",
    "FilterStop",
    "MessageFilter",
    "client_close_frame",
    "server_close_frame",
    "websocket_upgrade",
    "without_extensions",
]

MAX_MESSAGE = 4 * 1024 * 1024  # §3.10.5: a larger message closes with 1009

_TEXT, _BINARY, _CONTINUATION = 0x1, 0x2, 0x0
_CONTROL = frozenset({0x8, 0x9, 0xA})


class CloseCode(enum.IntEnum):
    POLICY_VIOLATION = 1008
    PROTOCOL_ERROR = 1002
    MESSAGE_TOO_BIG = 1009
    SERVICE_RESTART = 1012


class FilterStop(enum.StrEnum):
    TEXT_DENIED = "websocket-text-denied"
    MESSAGE_DENIED = "websocket-message-denied"
    MESSAGE_TOO_BIG = "websocket-message-too-big"
    PROTOCOL_ERROR = "websocket-protocol-error"


class ClientFrameFilter:
    def __init__(self) -> None:
        self._header = bytearray()
        self._payload_left = 0
        self._message: int | None = None  # opcode of the data message in progress (text/binary)
        self.stopped: FilterStop | None = None

    def feed(self, data: bytes | bytearray) -> bytes:
        """The part of ``data`` that may be forwarded; once :attr:`stopped` is set, nothing more ever is."""
        if self.stopped is not None:
            return b""
        out = bytearray()
        view = memoryview(data)
        while view:
            if self._payload_left:
                n = min(self._payload_left, len(view))
                out += view[:n]
                view = view[n:]
                self._payload_left -= n
                continue
            self._header.append(view[0])
            view = view[1:]
            size = self._header_size()
            if size is None or len(self._header) < size:
                continue
            if not self._admit():
                return bytes(out)
            out += self._header
            self._header.clear()
        return bytes(out)

    def _header_size(self) -> int | None:
        if len(self._header) < 2:
            return None
        short = self._header[1] & 0x7F
        extra = 2 if short == 126 else 8 if short == 127 else 0
        return 2 + extra + (4 if self._header[1] & 0x80 else 0)

    def _admit(self) -> bool:
        first, second = self._header[0], self._header[1]
        fin, opcode, masked, short = bool(first & 0x80), first & 0x0F, bool(second & 0x80), second & 0x7F
        if short == 126:
            length = struct.unpack("!H", self._header[2:4])[0]
        elif short == 127:
            length = struct.unpack("!Q", self._header[2:10])[0]
        else:
            length = short
        if not masked or opcode not in (_CONTINUATION, _TEXT, _BINARY, *_CONTROL):
            self.stopped = FilterStop.PROTOCOL_ERROR
            return False
        if opcode in _CONTROL:
            if not fin or length > 125:
                self.stopped = FilterStop.PROTOCOL_ERROR
                return False
        elif opcode == _CONTINUATION:
            if self._message is None:
                self.stopped = FilterStop.PROTOCOL_ERROR
                return False
        else:
            if self._message is not None:  # a new data message inside a fragmented one
                self.stopped = FilterStop.PROTOCOL_ERROR
                return False
            self._message = opcode
        if self._message == _TEXT and opcode not in _CONTROL:
            self.stopped = FilterStop.TEXT_DENIED
            return False
        if fin and opcode not in _CONTROL:
            self._message = None
        self._payload_left = length
        return True


class MessageFilter:
    """Client frames on an endpoint with GraphQL policy: each data message forwarded only once ``judge`` accepted
    its whole payload (text or binary alike: a server may read either as JSON). ``judge`` returns True to pass."""

    def __init__(self, judge: Callable[[bytes], bool]) -> None:
        self._judge = judge
        self._header = bytearray()
        self._frame = bytearray()  # the current frame's raw bytes (header + masked payload)
        self._payload_left = 0
        self._mask = b""
        self._masked_at = 0  # payload bytes of the current frame seen so far (mask phase)
        self._control = False
        self._fin = False
        self._in_message = False
        self._held = bytearray()  # raw frames of the message in progress
        self._message = bytearray()  # its unmasked payload
        self.stopped: FilterStop | None = None

    def feed(self, data: bytes | bytearray) -> bytes:
        """The bytes of ``data`` (and of earlier calls) that may be forwarded now; nothing once :attr:`stopped`."""
        if self.stopped is not None:
            return b""
        out = bytearray()
        view = memoryview(data)
        while view and self.stopped is None:
            if self._payload_left:
                n = min(self._payload_left, len(view))
                chunk = view[:n]
                view = view[n:]
                self._frame += chunk
                if not self._control:
                    self._message += _unmask(chunk, self._mask, self._masked_at)
                self._masked_at += n
                self._payload_left -= n
                if not self._payload_left:
                    self._frame_done(out)
                continue
            self._header.append(view[0])
            view = view[1:]
            size = _header_size(self._header)
            if size is None or len(self._header) < size:
                continue
            self._start_frame(out)
        return bytes(out)

    def _start_frame(self, out: bytearray) -> None:
        header = bytes(self._header)
        self._header.clear()
        first, second = header[0], header[1]
        fin, opcode, masked, short = bool(first & 0x80), first & 0x0F, bool(second & 0x80), second & 0x7F
        length = struct.unpack("!H", header[2:4])[0] if short == 126 else (
            struct.unpack("!Q", header[2:10])[0] if short == 127 else short)  # fmt: skip
        control = opcode in _CONTROL
        # a control frame is whole and short; a continuation comes only inside a message, a new one only outside
        misplaced = (not fin or length > 125) if control else (opcode == _CONTINUATION) != self._in_message
        bad = misplaced or not masked or bool(first & 0x70) or opcode not in (_CONTINUATION, _TEXT, _BINARY, *_CONTROL)
        if bad:  # no extension was negotiated (the offer is stripped), so an RSV bit is a protocol error too
            self.stopped = FilterStop.PROTOCOL_ERROR
            return
        if not control and len(self._message) + length > MAX_MESSAGE:
            self.stopped = FilterStop.MESSAGE_TOO_BIG
            return
        self._mask = header[-4:]
        self._masked_at = 0
        self._control, self._fin = control, fin
        self._frame = bytearray(header)
        self._payload_left = length
        if not control:
            self._in_message = True
        if not length:
            self._frame_done(out)

    def _frame_done(self, out: bytearray) -> None:
        if self._control:
            out += self._frame
            return
        self._held += self._frame
        if not self._fin:
            return
        if not self._judge(bytes(self._message)):
            self.stopped = FilterStop.MESSAGE_DENIED
            return
        out += self._held
        self._held.clear()
        self._message.clear()
        self._in_message = False


def _unmask(data: memoryview, mask: bytes, offset: int) -> bytes:
    """RFC 6455 §5.3: ``data`` XOR the mask, starting at ``offset`` bytes into the frame's payload."""
    n = len(data)
    turn = offset % 4
    key = ((mask[turn:] + mask[:turn]) * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")


def _header_size(header: bytearray) -> int | None:
    if len(header) < 2:
        return None
    short = header[1] & 0x7F
    return 2 + (2 if short == 126 else 8 if short == 127 else 0) + (4 if header[1] & 0x80 else 0)


def without_extensions(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The upgrade request's headers less every ``Sec-WebSocket-Extensions`` offer (permessage-deflate among them)."""
    return [(n, v) for n, v in headers if n.lower() != b"sec-websocket-extensions"]


def _close_payload(code: int, reason: str) -> bytes:
    return struct.pack("!H", code) + reason.encode("utf-8")[:123]


def server_close_frame(code: int, reason: str = "") -> bytes:
    """A close frame as a server sends it (unmasked), for the agent."""
    payload = _close_payload(code, reason)
    return bytes([0x88, len(payload)]) + payload


def client_close_frame(code: int, reason: str = "") -> bytes:
    """A close frame as a client sends it (masked, §5.3), for the upstream."""
    payload = _close_payload(code, reason)
    mask = os.urandom(4)
    return bytes([0x88, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def websocket_upgrade(head: RequestHead) -> bool:
    """RFC 6455 §4.1 client handshake shape: GET, Connection: upgrade, Upgrade: websocket, key, version 13."""
    return (
        head.method == "GET"
        and "upgrade" in head.tokens("connection")
        and head.tokens("upgrade") == {"websocket"}
        and len(head.values("sec-websocket-key")) == 1
        and head.values("sec-websocket-version") == ["13"]
    )
