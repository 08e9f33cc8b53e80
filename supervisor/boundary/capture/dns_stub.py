"""The agent's DNS stub, sans-I/O: what may be forwarded to control, the local answers, TCP framing.

Rules (docs/design.md "DNS and transparent capture"; docs/reference/boundary.md §5.4):

1. Only names that some policy endpoint could allow are forwarded; every other query is answered ``REFUSED``
   here and never leaves the boundary, so DNS cannot carry data out. The boundary gets that knowledge as a
   predicate over the normalised name (lower case, no trailing dot).
2. What is forwarded is a canonical query rebuilt here — same id, one question, RD, EDNS payload size only —
   never the agent's bytes, so nothing rides along in extra sections or EDNS options.
3. Malformed queries get ``FORMERR`` when their id is readable, otherwise nothing; responses sent to the stub
   are dropped. No link to control → ``SERVFAIL`` (the caller's choice, built with :func:`servfail`).
4. Over UDP the stub answers from the address the agent queried (any-IP capture makes every address local):
   :mod:`.pktinfo` reads it from ``IP_PKTINFO``/``IPV6_PKTINFO`` and builds the control message that sources
   the reply from it.
"""

from __future__ import annotations

import enum
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass

import dns.edns
import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype

MAX_MESSAGE = 65535
UDP_MIN_PAYLOAD = 512
STUB_EDNS_PAYLOAD = 1232  # the DNS flag day 2020 size; what the canonical forwarded query advertises

DEFAULT_QTYPES = frozenset(
    {
        dns.rdatatype.A,
        dns.rdatatype.AAAA,
        dns.rdatatype.CNAME,
        dns.rdatatype.HTTPS,
        dns.rdatatype.SVCB,
        dns.rdatatype.SRV,
    }
)
# letters, digits, hyphen, and underscore (service labels such as _http._tcp)
_LABEL_RE = re.compile(rb"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")


class StubAction(enum.StrEnum):
    FORWARD = "forward"  # send ``StubDecision.forward`` to control
    REPLY = "reply"  # answer the agent with ``StubDecision.reply``
    DROP = "drop"  # say nothing


class DnsFramingError(ValueError):
    """A DNS-over-TCP stream broke its length-prefix framing; close the connection."""


@dataclass(frozen=True)
class StubDecision:
    action: StubAction
    reason: str  # for events: "allowed", "not-allowed", "qtype", "malformed", ...
    qname: str | None = None
    qtype: str | None = None
    forward: bytes | None = None
    reply: bytes | None = None


def normalise_name(name: dns.name.Name) -> str | None:
    """``Example.COM.`` → ``example.com``; ``None`` for names with anything but LDH/underscore labels."""
    labels = [label.lower() for label in name.labels if label]
    if not labels:
        return None
    if not all(_LABEL_RE.fullmatch(label) for label in labels):
        return None
    return b".".join(labels).decode("ascii")


def decide(
    wire: bytes,
    may_resolve: Callable[[str], bool],
    *,
    qtypes: frozenset[dns.rdatatype.RdataType] = DEFAULT_QTYPES,
) -> StubDecision:
    """The whole local decision for one query from the agent."""
    if not 12 <= len(wire) <= MAX_MESSAGE:
        return StubDecision(StubAction.DROP, "malformed")
    if wire[2] & 0x80:  # QR: a response was sent to the stub
        return StubDecision(StubAction.DROP, "not-a-query")
    if dns.opcode.from_flags(struct.unpack("!H", wire[2:4])[0]) != dns.opcode.QUERY:
        return StubDecision(StubAction.REPLY, "opcode", reply=_header_reply(wire, dns.rcode.NOTIMP))
    try:
        query = dns.message.from_wire(wire)
    except (dns.exception.DNSException, ValueError, IndexError, struct.error):
        return StubDecision(StubAction.REPLY, "malformed", reply=_header_reply(wire, dns.rcode.FORMERR))
    if len(query.question) != 1 or query.answer or query.authority:
        return StubDecision(StubAction.REPLY, "malformed", reply=_reply(query, dns.rcode.FORMERR))
    question = query.question[0]
    qtype_text = dns.rdatatype.to_text(question.rdtype)
    qname = normalise_name(question.name)
    if question.rdclass != dns.rdataclass.IN:
        return StubDecision(StubAction.REPLY, "qclass", qname, qtype_text, reply=refused(query))
    if qname is None:
        return StubDecision(StubAction.REPLY, "name-syntax", None, qtype_text, reply=refused(query))
    if question.rdtype not in qtypes:
        return StubDecision(StubAction.REPLY, "qtype", qname, qtype_text, reply=refused(query))
    if not may_resolve(qname):
        return StubDecision(StubAction.REPLY, "not-allowed", qname, qtype_text, reply=refused(query))
    return StubDecision(
        StubAction.FORWARD, "allowed", qname, qtype_text, forward=canonical_query(query.id, qname, question.rdtype)
    )


def canonical_query(query_id: int, qname: str, rdtype: dns.rdatatype.RdataType) -> bytes:
    message = dns.message.make_query(qname + ".", rdtype, use_edns=0, payload=STUB_EDNS_PAYLOAD)
    message.id = query_id
    message.flags = dns.flags.RD
    return message.to_wire()


def refused(query: dns.message.Message) -> bytes:
    return _reply(query, dns.rcode.REFUSED)


def servfail(query: dns.message.Message | bytes) -> bytes | None:
    """SERVFAIL for a query (no link to control, control failed); ``None`` when the bytes are unreadable or a
    response (rule 3: responses sent to the stub are dropped)."""
    if isinstance(query, bytes):
        try:
            query = dns.message.from_wire(query)
        except (dns.exception.DNSException, ValueError, IndexError, struct.error):
            return None
    if query.flags & dns.flags.QR:
        return None
    return _reply(query, dns.rcode.SERVFAIL)


def formerr(wire: bytes) -> bytes | None:
    """A header-only FORMERR echoing the id, when at least a header arrived and it is not a response."""
    if len(wire) < 12 or wire[2] & 0x80:
        return None
    return _header_reply(wire, dns.rcode.FORMERR)


def _header_reply(wire: bytes, rcode: dns.rcode.Rcode) -> bytes:
    query_id, flags = struct.unpack("!HH", wire[:4])
    reply_flags = 0x8000 | (flags & 0x7900) | int(rcode)  # QR + opcode + RD echoed
    return struct.pack("!HHHHHH", query_id, reply_flags, 0, 0, 0, 0)


def _reply(query: dns.message.Message, rcode: dns.rcode.Rcode) -> bytes:
    response = dns.message.make_response(query)
    response.set_rcode(rcode)
    response.flags |= dns.flags.RA if query.flags & dns.flags.RD else 0
    return response.to_wire()


def matches_query(query_wire: bytes, response_wire: bytes) -> bool:
    """Control's answer belongs to this query: a response with the same id and question."""
    try:
        query = dns.message.from_wire(query_wire)
        response = dns.message.from_wire(response_wire)
    except (dns.exception.DNSException, ValueError, IndexError, struct.error):
        return False
    return bool(response.flags & dns.flags.QR) and response.id == query.id and response.question == query.question


def fit_udp(response_wire: bytes, query_wire: bytes) -> bytes:
    """Truncate a response that is larger than the agent's UDP payload size (TC set, answers dropped), so the
    agent retries over TCP as RFC 1035 §4.2.1 prescribes."""
    try:
        query = dns.message.from_wire(query_wire)
    except (dns.exception.DNSException, ValueError, IndexError, struct.error):
        return response_wire
    limit = max(UDP_MIN_PAYLOAD, query.payload) if query.edns >= 0 else UDP_MIN_PAYLOAD
    if len(response_wire) <= limit:
        return response_wire
    header = struct.unpack("!HH", response_wire[:4])
    truncated = dns.message.make_response(query)
    truncated.flags = header[1] | dns.flags.TC
    return truncated.to_wire()


# --- TCP framing (RFC 1035 §4.2.2) -----------------------------------------------------------------------


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

    @property
    def pending(self) -> int:
        """Bytes of an incomplete message (a connection closing with pending > 0 was cut mid-message)."""
        return len(self._buffer)
