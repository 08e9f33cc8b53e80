"""The frames on the socket pair between the primary and one worker: a 4-byte big-endian length, then one JSON
object. Sans-I/O: :func:`encode` makes a frame, :class:`FrameDecoder` turns received bytes back into messages."""

from __future__ import annotations

import enum
import json
import struct

from supervisor.protocol.json_value import JsonValue

# A policy of 10,000 rules is ~4 MB of JSON; anything past this is a bug on our own side, not a peer's message.
MAX_FRAME = 64 * 1024 * 1024
_LENGTH = struct.Struct(">I")

Message = dict[str, JsonValue]


class Kind(enum.StrEnum):
    """A message's ``type``: what it asks or tells."""

    REPLY = "reply"  # to a request, with its ``id``
    # primary -> worker
    POLICY = "policy"  # a snapshot to put in force (request; the reply acknowledges it)
    START_EGRESS = "start-egress"  # the boundary attached: dial the egress links
    # worker -> primary: requests
    PIN = "pin"  # the pin for a path, recorded if new
    ISSUED = "issued"  # the names an address was issued for
    DNS_QUERY = "dns-query"  # one DNS query to answer
    # worker -> primary: notifications
    EVENT = "event"  # one event to record and write
    STATS = "stats"  # live connections, counters, links, generation
    LINKS = "links"  # egress links up (+) or down (-)
    LINK_FAILED = "link-failed"  # one failed egress link attempt, for the primary to log


class FrameError(ValueError):
    """A frame that cannot be ours: too long, not JSON, or not an object with a ``type``."""


def encode(message: Message) -> bytes:
    body = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()
    if len(body) > MAX_FRAME:
        raise FrameError(f"message of {len(body)} bytes is over the {MAX_FRAME}-byte frame limit")
    return _LENGTH.pack(len(body)) + body


class FrameDecoder:
    """Bytes in, whole messages out; a partial frame waits for the rest."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Message]:
        self._buffer += data
        out: list[Message] = []
        while len(self._buffer) >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(self._buffer)
            if length > MAX_FRAME:
                raise FrameError(f"frame of {length} bytes is over the {MAX_FRAME}-byte limit")
            end = _LENGTH.size + length
            if len(self._buffer) < end:
                break
            body = bytes(self._buffer[_LENGTH.size : end])
            del self._buffer[:end]
            try:
                message = json.loads(body)
            except ValueError as exc:
                raise FrameError(f"frame is not JSON: {exc}") from None
            if not isinstance(message, dict) or not isinstance(message.get("type"), str):
                raise FrameError("frame is not an object with a string 'type'")
            out.append(message)
        return out

    @property
    def pending(self) -> int:
        """Bytes of a frame not yet complete."""
        return len(self._buffer)
