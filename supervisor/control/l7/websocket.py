"""Client-to-server WebSocket frames after an admitted upgrade, on ``protocol: websocket`` endpoints, sans-I/O.

Spec §3.10.5 evaluates every complete client text message as ``WEBSOCKET_TEXT <upgrade path>``. The payload is
never matched, so for one connection every text message gets the same answer: control asks the policy once,
at the upgrade. When the answer is allow (or audit) the connection is relayed raw. When it is deny, the
client's frames pass through :class:`ClientFrameFilter`, which streams them unchanged (no buffering: it only
reads frame headers) and stops at the first frame of a text message: control then closes both sides with
code 1008 (policy violation). Binary and control frames pass; an unmasked client frame, a reserved opcode or
a fragmented or oversized control frame is a protocol error (1002) (RFC 6455 §5.1-§5.5). Compression
(permessage-deflate) changes payloads only, never opcodes, so it does not blind the filter.
"""

from __future__ import annotations

import enum
import os
import struct

from supervisor.protocol.request_head import RequestHead

__all__ = [
    "ClientFrameFilter",
    "CloseCode",
    "FilterStop",
    "client_close_frame",
    "server_close_frame",
    "websocket_upgrade",
]

_TEXT, _BINARY, _CONTINUATION = 0x1, 0x2, 0x0
_CONTROL = frozenset({0x8, 0x9, 0xA})


class CloseCode(enum.IntEnum):
    POLICY_VIOLATION = 1008
    PROTOCOL_ERROR = 1002
    SERVICE_RESTART = 1012


class FilterStop(enum.StrEnum):
    TEXT_DENIED = "websocket-text-denied"
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
