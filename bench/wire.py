"""The harness's own tiny wire formats, shared by the clients and the upstream (pure, no sockets).

Rules:
1. Every contender sees the same bytes: an HTTP/1.1 CONNECT to an address literal, then the payload.
2. The bulk header is fixed-size so the upstream never has to parse a stream: one direction byte
   (``U`` = client sends, ``D`` = client receives) and the byte count, big-endian.
3. After an upload the sink answers :data:`UPLOAD_ACK`, so the client's clock stops only when every
   byte has crossed the proxy, not when it left the client's socket buffer.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

BULK_HEADER = struct.Struct("!cQ")
UPLOAD_ACK = b"OK"
ECHO_SIZE = 1024
CONNECT_HEADER_LIMIT = 16 * 1024


class Direction(enum.Enum):
    UP = "up"
    DOWN = "down"


_DIRECTION_BYTE = {Direction.UP: b"U", Direction.DOWN: b"D"}
_BYTE_DIRECTION = {v: k for k, v in _DIRECTION_BYTE.items()}


class WireError(Exception):
    """The peer (a proxy or the upstream) sent something this harness cannot accept."""


def encode_bulk_header(direction: Direction, size: int) -> bytes:
    return BULK_HEADER.pack(_DIRECTION_BYTE[direction], size)


def decode_bulk_header(data: bytes) -> tuple[Direction, int]:
    if len(data) != BULK_HEADER.size:
        raise WireError(f"bulk header must be {BULK_HEADER.size} bytes, got {len(data)}")
    tag, size = BULK_HEADER.unpack(data)
    try:
        return _BYTE_DIRECTION[tag], size
    except KeyError:
        raise WireError(f"unknown bulk direction {tag!r}") from None


def connect_request(host: str, port: int) -> bytes:
    """The CONNECT request every proxy contender receives (RFC 9110 §9.3.6)."""
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode("ascii")


@dataclass(frozen=True)
class ConnectReply:
    status: int
    reason: str
    leftover: bytes  # tunnel bytes that arrived in the same read as the header


def parse_connect_reply(buffer: bytes) -> ConnectReply | None:
    """Parse a proxy's answer to CONNECT; None while the header is incomplete."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        if len(buffer) > CONNECT_HEADER_LIMIT:
            raise WireError("CONNECT reply header too large")
        return None
    status_line = buffer[: buffer.find(b"\r\n")].decode("latin-1")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise WireError(f"malformed CONNECT status line {status_line!r}")
    reason = parts[2] if len(parts) == 3 else ""
    return ConnectReply(int(parts[1]), reason, buffer[end + 4 :])
