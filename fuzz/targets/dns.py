"""DNS wire handling on both sides: the boundary's stub (``boundary.capture.dns_stub``) for the agent's queries
and control's answers (``control.dns_answers``) for what the stub forwards.

Oracles beyond "no crash":

* the stub decides every query (drop, reply or forward) without raising; a reply it builds is a response
  carrying the query's id (and its question, where the query was readable);
* what it forwards is its canonical query, a fixed point: deciding it again forwards the same bytes;
* control reads any message (``read_query``) and answers every query it reads (``plan_answer``, ``reply``)
  without raising;
* ``fit_udp`` and ``matches_query`` take any pair of messages; TCP framing round-trips.
"""

from __future__ import annotations

import struct

import dns.exception
import dns.flags
import dns.message

from supervisor.boundary.capture.dns_stub import (
    MAX_MESSAGE,
    DnsFramingError,
    StubAction,
    TcpFramer,
    decide,
    encode_tcp,
    fit_udp,
    formerr,
    matches_query,
    servfail,
)
from supervisor.control.dns_answers import plan_answer, read_query, reply

_ALLOWED = frozenset({"example.com", "api.github.com", "_https._tcp.example.com", "a"})


def _may_resolve(name: str) -> bool:
    return name in _ALLOWED or name.endswith(".example.com")


def _stub(wire: bytes) -> None:
    decision = decide(wire, _may_resolve)
    if decision.action is StubAction.DROP:
        assert decision.reply is None and decision.forward is None
        return
    if decision.action is StubAction.REPLY:
        assert decision.reply is not None
        assert decision.reply[:2] == wire[:2] and decision.reply[2] & 0x80, decision
        if len(decision.reply) > 12:  # not a header-only answer: it echoes the question
            assert matches_query(wire, decision.reply), decision
        return
    assert decision.action is StubAction.FORWARD and decision.forward is not None
    assert decision.forward[:2] == wire[:2]
    again = decide(decision.forward, _may_resolve)
    assert again.action is StubAction.FORWARD and again.forward == decision.forward, again


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
    assert got == messages and framer.pending == 0
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
    half = len(data) // 2
    fit_udp(data[:half], data[half:])
    matches_query(data[:half], data[half:])
    servfail(data)
    formerr(data)
    try:
        dns.message.from_wire(data)
    except (dns.exception.DNSException, ValueError, IndexError, struct.error):
        pass
