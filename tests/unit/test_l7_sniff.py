"""First-bytes classification inside a tunnel (§3.7)."""

from __future__ import annotations

import pytest

from supervisor.control.l7.sniff import H2_PREFACE, TunnelProtocol, sniff

CASES = [
    (b"\x16\x03\x01\x02\x00", TunnelProtocol.TLS),
    (b"\x16\x03\x03", TunnelProtocol.TLS),
    (b"\x16\x03\x05", TunnelProtocol.UNKNOWN),
    (b"\x16\x02", TunnelProtocol.UNKNOWN),
    (b"\x16", None),
    (b"\x16\x03", None),
    (b"GET / HTTP/1.1\r\n", TunnelProtocol.HTTP1),
    (b"OPTIONS * HTTP/1.1", TunnelProtocol.HTTP1),
    (b"DELETE ", TunnelProtocol.HTTP1),
    (b"P", None),
    (b"PO", None),
    (b"PRI * HTTP/2.0", None),
    (H2_PREFACE, TunnelProtocol.H2C),
    (b"PROPFIND / HTTP/1.1", TunnelProtocol.UNKNOWN),
    (b"get / HTTP/1.1", TunnelProtocol.UNKNOWN),
    (b"SSH-2.0-OpenSSH", TunnelProtocol.UNKNOWN),
    (b"", None),
]


@pytest.mark.parametrize(("prefix", "expected"), CASES)
def test_sniff(prefix: bytes, expected: TunnelProtocol | None) -> None:
    assert sniff(prefix) is expected


@pytest.mark.parametrize("prefix", [b"P", b"\x16\x03", b"PRI * HTTP/2", b""])
def test_ambiguous_prefixes_become_unknown_when_no_more_bytes_come(prefix: bytes) -> None:
    assert sniff(prefix, final=True) is TunnelProtocol.UNKNOWN
