"""The DNS stub's local decisions, from the agent's side: only allowed names leave, and only canonically."""

from __future__ import annotations

import socket
import struct

import dns.edns
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.boundary.capture.dns_stub import (
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
from supervisor.boundary.capture.pktinfo import IP_PKTINFO, destination_from_ancdata, source_ancdata

ALLOWED = {"api.github.com", "example.com", "_https._tcp.example.com"}


def allow(name: str) -> bool:
    return name in ALLOWED


def query(name: str, rdtype: str = "A", **kw: object) -> dns.message.Message:
    return dns.message.make_query(name, rdtype, **kw)  # type: ignore[arg-type]


def rcode_of(wire: bytes | None) -> dns.rcode.Rcode:
    assert wire is not None
    return dns.message.from_wire(wire).rcode()


CASES = [
    # (name, qtype, expected action, reason)
    ("api.github.com.", "A", StubAction.FORWARD, "allowed"),
    ("API.GitHub.COM.", "AAAA", StubAction.FORWARD, "allowed"),
    ("example.com.", "HTTPS", StubAction.FORWARD, "allowed"),
    ("_https._tcp.example.com.", "SRV", StubAction.FORWARD, "allowed"),
    ("secret-data.attacker.example.", "A", StubAction.REPLY, "not-allowed"),
    ("c2VjcmV0.example.com.", "A", StubAction.REPLY, "not-allowed"),  # a subdomain is another name
    ("example.com.", "TXT", StubAction.REPLY, "qtype"),
    ("example.com.", "ANY", StubAction.REPLY, "qtype"),
    ("example.com.", "NULL", StubAction.REPLY, "qtype"),
]


@pytest.mark.parametrize(("name", "qtype", "action", "reason"), CASES)
def test_decide(name: str, qtype: str, action: StubAction, reason: str) -> None:
    q = query(name, qtype)
    decision = decide(q.to_wire(), allow)
    assert (decision.action, decision.reason) == (action, reason)
    if action is StubAction.FORWARD:
        assert decision.reply is None and decision.forward is not None
        assert decision.qname == name.lower().rstrip(".")
        forwarded = dns.message.from_wire(decision.forward)
        assert forwarded.id == q.id
        assert forwarded.question[0].name.to_text() == name.lower()
    else:
        assert decision.forward is None
        assert rcode_of(decision.reply) == dns.rcode.REFUSED
        assert dns.message.from_wire(decision.reply or b"").id == q.id


def test_forwarded_query_is_rebuilt_without_smuggled_sections() -> None:
    """Data hidden in EDNS options or the additional section never reaches control."""
    q = query("example.com.", "A", use_edns=0, options=[dns.edns.GenericOption(65001, b"SECRET-PAYLOAD")])
    q.additional.append(dns.rrset.from_text("leak.example.", 60, "IN", "TXT", '"SECRET-TXT"'))
    decision = decide(q.to_wire(), allow)
    assert decision.action is StubAction.FORWARD and decision.forward is not None
    assert b"SECRET" not in decision.forward
    forwarded = dns.message.from_wire(decision.forward)
    assert len(forwarded.options) == 0 and len(forwarded.additional) == 0
    assert forwarded.flags & dns.flags.RD


def test_name_with_binary_labels_is_refused_before_the_predicate() -> None:
    seen: list[str] = []

    def spy(name: str) -> bool:
        seen.append(name)
        return True

    q = dns.message.make_query(dns.name.Name([b"a\x00b", b"example", b"com", b""]), "A")
    decision = decide(q.to_wire(), spy)
    assert decision.reason == "name-syntax" and rcode_of(decision.reply) == dns.rcode.REFUSED
    q = dns.message.make_query("a b.example.com.", "A")  # escaped space in a label
    assert decide(q.to_wire(), spy).reason == "name-syntax"
    assert seen == []


def test_non_in_class_refused() -> None:
    q = dns.message.make_query("example.com.", "A", rdclass=dns.rdataclass.CH)
    decision = decide(q.to_wire(), allow)
    assert (decision.action, decision.reason) == (StubAction.REPLY, "qclass")


def test_other_opcodes_not_implemented() -> None:
    q = query("example.com.")
    q.set_opcode(dns.opcode.UPDATE)
    decision = decide(q.to_wire(), allow)
    assert decision.reason == "opcode" and decision.reply is not None
    assert decision.reply[3] & 0x0F == dns.rcode.NOTIMP
    assert decision.reply[:2] == q.to_wire()[:2]


def test_responses_sent_to_the_stub_are_dropped() -> None:
    response = dns.message.make_response(query("example.com."))
    assert decide(response.to_wire(), allow).action is StubAction.DROP


def test_two_questions_formerr() -> None:
    wire = bytearray(query("example.com.").to_wire())
    question = bytes(wire[12:])
    wire[4:6] = struct.pack("!H", 2)
    decision = decide(bytes(wire) + question, allow)
    assert rcode_of(decision.reply) == dns.rcode.FORMERR


def test_garbage_gets_formerr_or_nothing() -> None:
    garbage = struct.pack("!HHHHHH", 0xBEEF, 0x0100, 1, 0, 0, 0) + b"\xff\xff"
    decision = decide(garbage, allow)
    assert decision.action is StubAction.REPLY and decision.reply is not None
    assert struct.unpack("!H", decision.reply[:2])[0] == 0xBEEF
    assert decision.reply[3] & 0x0F == dns.rcode.FORMERR
    assert decide(b"\x01\x02", allow).action is StubAction.DROP
    assert formerr(struct.pack("!HHHHHH", 1, 0x8000, 0, 0, 0, 0)) is None  # a response: never answered


def test_servfail() -> None:
    q = query("example.com.")
    assert rcode_of(servfail(q)) == dns.rcode.SERVFAIL
    assert rcode_of(servfail(q.to_wire())) == dns.rcode.SERVFAIL
    assert servfail(b"junk") is None


def test_matches_query() -> None:
    q = query("example.com.")
    good = dns.message.make_response(q)
    assert matches_query(q.to_wire(), good.to_wire())
    other = dns.message.make_response(query("example.org."))
    other.id = q.id
    assert not matches_query(q.to_wire(), other.to_wire())
    wrong_id = dns.message.make_response(q)
    wrong_id.id = (q.id + 1) % 65536
    assert not matches_query(q.to_wire(), wrong_id.to_wire())
    assert not matches_query(q.to_wire(), q.to_wire())  # not a response
    assert not matches_query(q.to_wire(), b"junk")


def big_response(q: dns.message.Message, count: int) -> bytes:
    response = dns.message.make_response(q)
    rrset = dns.rrset.from_text_list("example.com.", 60, "IN", "A", [f"198.51.100.{i}" for i in range(1, count + 1)])
    response.answer.append(rrset)
    return response.to_wire()


def test_fit_udp_truncates_to_the_clients_payload() -> None:
    plain = query("example.com.", use_edns=False)
    wire = big_response(plain, 60)
    assert len(wire) > 512
    fitted = dns.message.from_wire(fit_udp(wire, plain.to_wire()))
    assert fitted.flags & dns.flags.TC and not fitted.answer
    edns = query("example.com.", use_edns=0, payload=4096)
    wire = big_response(edns, 60)
    assert fit_udp(wire, edns.to_wire()) == wire
    small = big_response(plain, 2)
    assert fit_udp(small, plain.to_wire()) == small


def test_tcp_framing_round_trip_across_splits() -> None:
    messages = [query(f"n{i}.example.com.").to_wire() for i in range(5)]
    stream = b"".join(encode_tcp(m) for m in messages)
    for step in (1, 2, 3, 7, len(stream)):
        framer = TcpFramer()
        got: list[bytes] = []
        for i in range(0, len(stream), step):
            got += framer.feed(stream[i : i + step])
        assert got == messages and framer.pending == 0
    framer = TcpFramer()
    assert framer.feed(stream[:5]) == [] and framer.pending == 5


def test_tcp_framing_errors() -> None:
    with pytest.raises(DnsFramingError):
        TcpFramer().feed(b"\x00\x00")
    with pytest.raises(DnsFramingError):
        encode_tcp(b"")
    with pytest.raises(DnsFramingError):
        encode_tcp(b"x" * 65536)


def test_pktinfo_round_trip() -> None:
    (level, kind, data) = source_ancdata("198.51.100.7")[0]
    assert (level, kind) == (socket.IPPROTO_IP, IP_PKTINFO) and len(data) == 12
    received = struct.pack("=i4s4s", 1, b"\0" * 4, socket.inet_aton("198.51.100.7"))
    assert destination_from_ancdata([(socket.IPPROTO_IP, IP_PKTINFO, received)]) == "198.51.100.7"
    (level, kind, data) = source_ancdata("2001:db8::1")[0]
    assert (level, kind, len(data)) == (socket.IPPROTO_IPV6, socket.IPV6_PKTINFO, 20)
    assert destination_from_ancdata([(level, kind, data)]) == "2001:db8::1"
    assert destination_from_ancdata([]) is None


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_any_bytes_decide_without_raising(data: bytes) -> None:
    decision = decide(data, lambda _name: True)
    assert decision.action in set(StubAction)
    if decision.action is StubAction.FORWARD:
        assert decision.forward is not None
        assert dns.message.from_wire(decision.forward).question[0].rdtype in (
            dns.rdatatype.A,
            dns.rdatatype.AAAA,
            dns.rdatatype.CNAME,
            dns.rdatatype.HTTPS,
            dns.rdatatype.SVCB,
            dns.rdatatype.SRV,
        )


def test_the_launchers_capture_setup_does_not_import_dnspython() -> None:
    """The launcher imports capture setup in the agent's namespaces; a fresh interpreter shows what that pulls in
    (dnspython there broke the launcher under an interpreter that has only the launcher's own dependencies)."""
    import subprocess
    import sys

    probe = (
        "import sys, supervisor.boundary.process.launcher; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'dns'))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout
