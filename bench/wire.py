"""The harness's own tiny wire formats, shared by the clients and the upstream (pure, no sockets).

Rules:
1. Every contender sees the same bytes: an HTTP/1.1 CONNECT to an address literal, then the payload. The one
   exception is asked for by the client's environment: a proxy named with userinfo in the standard variables
   (the proxy-pod sandbox's ``http://sandbox:<token>@host:port``) also gets ``Proxy-Authorization: Basic``,
   as curl or pip would send it.
2. The bulk header is fixed-size so the upstream never has to parse a stream: one direction byte
   (``U`` = client sends, ``D`` = client receives) and the byte count, big-endian.
3. After an upload the sink answers :data:`UPLOAD_ACK`, so the client's clock stops only when every
   byte has crossed the proxy, not when it left the client's socket buffer.
"""

from __future__ import annotations

import base64
import enum
import struct
import urllib.parse
from collections.abc import Mapping
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


def connect_request(host: str, port: int, authorization: str | None = None) -> bytes:
    """The CONNECT request every proxy contender receives (RFC 9110 §9.3.6); ``authorization`` adds a
    ``Proxy-Authorization`` header (only for a proxy that asks for one: :func:`proxy_authorizations`)."""
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    extra = f"Proxy-Authorization: {authorization}\r\n" if authorization else ""
    return f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{extra}\r\n".encode("ascii")


PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def proxy_address(environ: Mapping[str, str]) -> tuple[str, int] | None:
    """The host and port of the first ``http://`` proxy in the standard variables (never its userinfo)."""
    for name in PROXY_VARIABLES:
        url = urllib.parse.urlsplit(environ.get(name, ""))
        if url.scheme == "http" and url.hostname and url.port:
            return url.hostname, url.port
    return None


def proxy_authorizations(environ: Mapping[str, str]) -> dict[tuple[str, int], str]:
    """``Proxy-Authorization`` values for the proxies the standard variables name with userinfo
    (``http://user:password@host:port``, which curl, requests and pip turn into ``Basic``); none for the others."""
    out: dict[tuple[str, int], str] = {}
    for name in PROXY_VARIABLES:
        url = urllib.parse.urlsplit(environ.get(name, ""))
        if url.scheme != "http" or not url.hostname or not url.port or url.username is None:
            continue
        credentials = f"{urllib.parse.unquote(url.username)}:{urllib.parse.unquote(url.password or '')}"
        out.setdefault((url.hostname, url.port), "Basic " + base64.b64encode(credentials.encode()).decode("ascii"))
    return out


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
