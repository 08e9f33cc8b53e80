"""The agent's DNS stub, sans-I/O: the boundary's few DNS bytes of its own, and DNS-over-TCP framing.

The boundary decides nothing about DNS: every query the agent sends to the stub (UDP or TCP, port 53 in the
agent's namespace) is forwarded, as the agent's bytes, on an egress link to control, which answers it
(``supervisor/control/dns_answers.py``: names no policy endpoint could allow are ``REFUSED`` there and never
resolved; docs/design.md "DNS and transparent capture"). What the boundary does itself (``boundary/egress.py``):

1. No link to control, a link that fails or an empty answer: ``SERVFAIL`` (:func:`servfail`), or nothing when
   the query's bytes are not a readable DNS message.
2. Over TCP, the RFC 1035 §4.2.2 length prefix is removed from each query (:class:`TcpFramer`) and put back on
   each answer (:func:`encode_tcp`); a broken framing closes the connection.
3. Over UDP, the answer leaves from the address the agent queried (any-IP capture makes every address local):
   :mod:`.pktinfo` reads it from ``IP_PKTINFO``/``IPV6_PKTINFO`` and builds the control message that sources
   the reply from it.
"""

from __future__ import annotations

import struct

import dns.exception
import dns.flags
import dns.message
import dns.rcode

MAX_MESSAGE = 65535


class DnsFramingError(ValueError):
    """A DNS-over-TCP stream broke its length-prefix framing; close the connection."""


def servfail(query: bytes) -> bytes | None:
    """SERVFAIL for a query (no link to control, control failed); ``None`` when the bytes are unreadable or a
    response (make_response would raise on one: a response sent to the stub is dropped)."""
    try:
        message = dns.message.from_wire(query)
    except (dns.exception.DNSException, ValueError, IndexError, struct.error):
        return None
    if message.flags & dns.flags.QR:
        return None
    response = dns.message.make_response(message)
    response.set_rcode(dns.rcode.SERVFAIL)
    response.flags |= dns.flags.RA if message.flags & dns.flags.RD else 0
    return response.to_wire()


def encode_tcp(message: bytes) -> bytes:
    if not 0 < len(message) <= MAX_MESSAGE:
        raise DnsFramingError("a DNS message is 1..65535 bytes")
    return struct.pack("!H", len(message)) + message


class TcpFramer:
    """Splits a DNS-over-TCP byte stream into messages."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        messages: list[bytes] = []
        while len(self._buffer) >= 2:
            (length,) = struct.unpack("!H", self._buffer[:2])
            if length == 0:
                raise DnsFramingError("zero-length DNS message")
            if len(self._buffer) < 2 + length:
                break
            messages.append(bytes(self._buffer[2 : 2 + length]))
            del self._buffer[: 2 + length]
        return messages
