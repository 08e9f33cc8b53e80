"""The server name a TLS ClientHello asks for, read from the agent's first bytes before any handshake.

Pure. ``server_name(data)`` answers from the bytes buffered so far:

* :class:`Pending` — the ClientHello is not complete yet (read more, within the head timeout);
* a name (``str``) — the SNI ``host_name`` entry, ASCII, as sent;
* ``None`` — a complete ClientHello without SNI.

Handshake messages may be fragmented over several records; they are reassembled. Anything that is not a
well-formed ClientHello in handshake records raises :class:`ClientHelloError`: the caller closes the tunnel
(the TLS stack would refuse it too, and nothing of it may reach an origin).
"""

from __future__ import annotations

__all__ = ["MAX_CLIENT_HELLO", "ClientHelloError", "Pending", "server_name"]

MAX_CLIENT_HELLO = 65536
_HANDSHAKE = 0x16
_CLIENT_HELLO = 0x01
_EXT_SERVER_NAME = 0x0000


class ClientHelloError(ValueError):
    pass


class Pending:
    """More bytes are needed."""


PENDING = Pending()


def _handshake_bytes(data: bytes) -> tuple[bytes, bool]:
    """The handshake payload of the complete records in ``data`` and whether the last record is partial."""
    out = bytearray()
    i = 0
    while i < len(data):
        if data[i] != _HANDSHAKE:
            raise ClientHelloError(f"record type {data[i]:#04x} before the ClientHello ended")
        if len(data) - i < 5:
            return bytes(out), True
        length = int.from_bytes(data[i + 3 : i + 5], "big")
        if length == 0 or length > 16384 + 2048:
            raise ClientHelloError(f"TLS record length {length}")
        if len(data) - i - 5 < length:
            return bytes(out), True
        out += data[i + 5 : i + 5 + length]
        i += 5 + length
    return bytes(out), False


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.i = data, 0

    def take(self, n: int) -> bytes:
        if self.i + n > len(self.data):
            raise ClientHelloError("ClientHello field runs past its end")
        out = self.data[self.i : self.i + n]
        self.i += n
        return out

    def number(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def vector(self, length_bytes: int) -> bytes:
        return self.take(self.number(length_bytes))


def server_name(data: bytes) -> str | Pending | None:
    if len(data) > MAX_CLIENT_HELLO + 5 * 8:
        raise ClientHelloError("ClientHello larger than 64 KiB")
    payload, partial = _handshake_bytes(data)
    if len(payload) < 4:
        if partial or not payload:
            return PENDING
        raise ClientHelloError("truncated handshake header")
    if payload[0] != _CLIENT_HELLO:
        raise ClientHelloError(f"first handshake message is type {payload[0]}, not ClientHello")
    length = int.from_bytes(payload[1:4], "big")
    if length > MAX_CLIENT_HELLO:
        raise ClientHelloError("ClientHello larger than 64 KiB")
    if len(payload) - 4 < length:
        return PENDING
    body = _Reader(payload[4 : 4 + length])
    body.take(2 + 32)  # legacy_version, random
    body.vector(1)  # legacy_session_id
    body.vector(2)  # cipher_suites
    body.vector(1)  # legacy_compression_methods
    if body.i == len(body.data):
        return None  # no extensions at all
    extensions = _Reader(body.vector(2))
    found: str | None = None
    while extensions.i < len(extensions.data):
        kind = extensions.number(2)
        value = extensions.vector(2)
        if kind != _EXT_SERVER_NAME:
            continue
        if found is not None:
            raise ClientHelloError("two server_name extensions")
        names = _Reader(_Reader(value).vector(2))
        while names.i < len(names.data):
            name_type = names.number(1)
            name = names.vector(2)
            if name_type != 0:
                continue
            if found is not None:
                raise ClientHelloError("two host names in server_name")
            try:
                found = name.decode("ascii")
            except UnicodeDecodeError:
                raise ClientHelloError("server_name is not ASCII") from None
            if not found or not found.isprintable():
                raise ClientHelloError("server_name is empty or not printable")
    return found
