"""DNS wire handling on both sides: the boundary's stub (``boundary.capture.dns_stub``), which forwards the agent's
bytes to control and answers SERVFAIL when control cannot, and control's answers (``control.dns_answers``).

Oracles beyond "no crash":

* the stub's SERVFAIL is ``None`` (unreadable bytes, or a response sent to the stub) or a response carrying the
  query's id;
* control reads any message (``read_query``) and answers every query it reads (``plan_answer``, ``reply``)
  without raising;
* TCP framing round-trips.
"""

from __future__ import annotations

import struct

import dns.exception
import dns.flags
import dns.message

from supervisor.boundary.capture.dns_stub import MAX_MESSAGE, DnsFramingError, TcpFramer, encode_tcp, servfail
from supervisor.control.dns_answers import plan_answer, read_query, reply

_ALLOWED = frozenset({"example.com", "api.github.com", "_https._tcp.example.com", "a"})


def _may_resolve(name: str) -> bool:
    return name in _ALLOWED or name.endswith(".example.com")


def _stub(wire: bytes) -> None:
    answer = servfail(wire)
    if answer is None:
        return
    assert answer[:2] == wire[:2] and answer[2] & 0x80, "a SERVFAIL is a response with the query's id"
    assert not wire[2] & 0x80, "a response sent to the stub is never answered"


def _control(wire: bytes) -> None:
    query = read_query(wire)
    if query is None:  # a header-only FORMERR
        return
    plan = plan_answer(query, eligible=_may_resolve, ipv6_egress=bool(wire[-1] & 1))
    response = reply(query, plan.rcode)
    assert response.flags & dns.flags.QR
    response.to_wire()


def _framing(wire: bytes) -> None:
    messages = [m for m in (wire[: len(wire) // 2], wire[len(wire) // 2 :]) if m]
    framer = TcpFramer()
    stream = b"".join(encode_tcp(m) for m in messages)
    got = framer.feed(stream[:3]) + framer.feed(stream[3:])
    assert got == messages
    assert framer.feed(encode_tcp(b"x" * 12)) == [b"x" * 12], "nothing was left over"
    try:
        TcpFramer().feed(wire)
    except DnsFramingError:
        pass


def one_input(data: bytes) -> None:
    if not data or len(data) > MAX_MESSAGE:
        return
    _stub(data)
    _control(data)
    _framing(data)
    try:
        dns.message.from_wire(data)
    except (dns.exception.DNSException, ValueError, IndexError, struct.error):
        pass
