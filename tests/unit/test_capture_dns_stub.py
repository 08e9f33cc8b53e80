"""The DNS stub's own bytes: SERVFAIL without control, DNS over TCP framing, replies from the queried address."""

from __future__ import annotations

import socket
import struct

import dns.message
import dns.rcode
import pytest

from supervisor.boundary.capture.dns_stub import DnsFramingError, TcpFramer, encode_tcp, servfail
from supervisor.boundary.capture.pktinfo import IP_PKTINFO, destination_from_ancdata, source_ancdata


def query(name: str, rdtype: str = "A") -> dns.message.Message:
    return dns.message.make_query(name, rdtype)


def rcode_of(wire: bytes | None) -> dns.rcode.Rcode:
    assert wire is not None
    return dns.message.from_wire(wire).rcode()


def test_servfail() -> None:
    q = query("example.com.")
    answer = servfail(q.to_wire())
    assert rcode_of(answer) == dns.rcode.SERVFAIL
    assert dns.message.from_wire(answer or b"").id == q.id
    assert servfail(b"junk") is None


def test_tcp_framing_round_trip_across_splits() -> None:
    messages = [query(f"n{i}.example.com.").to_wire() for i in range(5)]
    stream = b"".join(encode_tcp(m) for m in messages)
    for step in (1, 2, 3, 7, len(stream)):
        framer = TcpFramer()
        got: list[bytes] = []
        for i in range(0, len(stream), step):
            got += framer.feed(stream[i : i + step])
        assert got == messages
    assert TcpFramer().feed(stream[:5]) == []


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
