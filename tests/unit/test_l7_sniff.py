"""First-bytes classification inside a tunnel (§3.7, and docs/design.md "Sniffing the first bytes")."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.control.l7.sniff import H2_PREFACE, SNIFF_LIMIT, TunnelProtocol, sniff

CASES = [
    (b"\x16\x03\x01\x02\x00", TunnelProtocol.TLS),
    (b"\x16\x03\x03", TunnelProtocol.TLS),
    (b"\x16\x03\x05", TunnelProtocol.TLS),  # any version: the handshake refuses it, it is never relayed raw
    (b"\x16\x02", TunnelProtocol.TLS),
    (b"\x16", TunnelProtocol.TLS),
    (b"GET / HTTP/1.1\r\n", TunnelProtocol.HTTP1),
    (b"OPTIONS * HTTP/1.1", TunnelProtocol.HTTP1),
    (b"PROPFIND / HTTP/1.1", TunnelProtocol.HTTP1),  # any method
    (b"get  http://other.test/   http/1.0", TunnelProtocol.HTTP1),  # any case, runs of spaces
    (b"X\t/\tHTTP/", TunnelProtocol.HTTP1),
    (b"DELETE ", None),
    (b"P", None),
    (b"PO", None),
    (b"GET /a/b", None),
    (b"GET /a/b HT", None),
    (b"PRI * HTTP/2.0", None),
    (H2_PREFACE, TunnelProtocol.H2C),
    (b"PRI * HTTP/1.1\r\n", TunnelProtocol.HTTP1),
    (b"SSH-2.0-OpenSSH_9.6\r\n", TunnelProtocol.UNKNOWN),
    (b"GET /\r\n", TunnelProtocol.UNKNOWN),  # HTTP/0.9: no headers, no authority
    (b"get key\r\n", TunnelProtocol.UNKNOWN),  # memcached
    (b"GET / FTP/1.0", TunnelProtocol.UNKNOWN),
    (b" GET / HTTP/1.1", TunnelProtocol.UNKNOWN),
    (b"\x00\x00\x00\x08\x04\xd2\x16\x2f", TunnelProtocol.UNKNOWN),  # postgres SSLRequest
    (b"*1\r\n$4\r\nPING\r\n", TunnelProtocol.UNKNOWN),  # redis
    (b"", None),
]


@pytest.mark.parametrize(("prefix", "expected"), CASES)
def test_sniff(prefix: bytes, expected: TunnelProtocol | None) -> None:
    assert sniff(prefix) is expected


@pytest.mark.parametrize("prefix", [b"P", b"PRI * HT", b"", b"GET / HTT"])
def test_undecided_prefixes_become_unknown_when_no_more_bytes_come(prefix: bytes) -> None:
    assert sniff(prefix, final=True) is TunnelProtocol.UNKNOWN


def test_a_request_line_longer_than_the_limit_is_treated_as_http() -> None:
    assert sniff(b"GET /" + b"a" * SNIFF_LIMIT) is TunnelProtocol.HTTP1


@given(st.binary(max_size=64), st.integers(min_value=0, max_value=64))
def test_a_split_never_changes_the_answer(data: bytes, cut: int) -> None:
    """However the bytes arrive, the first decided answer is the answer for the whole prefix."""
    whole = sniff(data, final=True)
    for end in range(min(cut, len(data)) + 1):
        early = sniff(data[:end])
        if early is not None:
            assert early is whole or (early is TunnelProtocol.HTTP1 and whole is TunnelProtocol.HTTP1)
            break


@given(st.from_regex(rb"\A[A-Za-z!#$%&'*+.^_`|~0-9-]{1,12} [!-~]{1,40} HTTP/1\.[01]\r\n\Z"))
def test_every_request_line_is_http(line: bytes) -> None:
    if not line.startswith(H2_PREFACE[:14]):
        assert sniff(line) is TunnelProtocol.HTTP1
