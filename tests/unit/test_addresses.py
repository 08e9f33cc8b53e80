"""The SSRF classifier and host-literal parser, from the attacker's side: every spelling of an internal address
must come out internal (or refused), and nothing may raise."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from ipaddress import IPv4Address, IPv6Address

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.control.addresses import (
    AddressClass,
    Refused,
    RefusedReason,
    blocked_in_network,
    classify,
    inet_aton_lenient,
    overlaps_always_blocked,
    parse_host_literal,
)

C = AddressClass
R = RefusedReason

# (address, class, always_blocked)
CLASSIFY_CASES: list[tuple[str, AddressClass, bool]] = [
    ("8.8.8.8", C.PUBLIC, False),
    ("1.1.1.1", C.PUBLIC, False),
    ("127.0.0.1", C.LOOPBACK, True),
    ("127.255.255.254", C.LOOPBACK, True),
    ("0.0.0.0", C.UNSPECIFIED, True),
    ("0.1.2.3", C.UNSPECIFIED, True),
    ("10.0.0.5", C.PRIVATE, False),
    ("172.16.0.1", C.PRIVATE, False),
    ("172.31.255.255", C.PRIVATE, False),
    ("172.32.0.1", C.PUBLIC, False),
    ("192.168.1.1", C.PRIVATE, False),
    ("100.64.0.1", C.CGNAT, False),
    ("100.127.255.255", C.CGNAT, False),
    ("100.128.0.0", C.PUBLIC, False),
    ("169.254.1.1", C.LINK_LOCAL, True),
    ("169.254.169.254", C.METADATA, True),
    ("169.254.170.2", C.METADATA, True),
    ("100.100.100.200", C.METADATA, True),
    ("192.0.0.192", C.METADATA, True),
    ("224.0.0.1", C.MULTICAST, False),
    ("239.255.255.250", C.MULTICAST, False),
    ("240.0.0.1", C.RESERVED, False),
    ("255.255.255.255", C.RESERVED, False),
    ("192.0.0.8", C.RESERVED, False),
    ("192.88.99.1", C.RESERVED, False),
    ("192.0.2.1", C.DOCUMENTATION, False),
    ("198.51.100.7", C.DOCUMENTATION, False),
    ("203.0.113.9", C.DOCUMENTATION, False),
    ("198.18.0.1", C.BENCHMARKING, False),
    ("198.19.255.255", C.BENCHMARKING, False),
    ("::", C.UNSPECIFIED, True),
    ("::1", C.LOOPBACK, True),
    ("fe80::1", C.LINK_LOCAL, True),
    ("febf::1", C.LINK_LOCAL, True),
    ("fec0::1", C.RESERVED, False),
    ("fc00::1", C.ULA, False),
    ("fd12:3456::1", C.ULA, False),
    ("fd00:ec2::254", C.METADATA, True),
    ("ff02::1", C.MULTICAST, False),
    ("2001:db8::1", C.DOCUMENTATION, False),
    ("3fff::1", C.DOCUMENTATION, False),
    ("2001:2::1", C.BENCHMARKING, False),
    ("100::1", C.RESERVED, False),
    ("64:ff9b:1::c633:6402", C.PRIVATE, False),  # NAT64 local-use: private unless its /96 reading is blocked
    ("64:ff9b:1::1", C.UNSPECIFIED, True),  # ... as 0.0.0.1 is (tests/unit/test_nat64_local_blocked.py)
    ("4000::1", C.RESERVED, False),
    ("5f00::1", C.RESERVED, False),
    ("2606:4700:4700::1111", C.PUBLIC, False),
    # IPv4 inside IPv6: classified as the IPv4
    ("::ffff:127.0.0.1", C.LOOPBACK, True),
    ("::ffff:7f00:1", C.LOOPBACK, True),
    ("::ffff:10.1.2.3", C.PRIVATE, False),
    ("::ffff:169.254.169.254", C.METADATA, True),
    ("::ffff:8.8.8.8", C.PUBLIC, False),
    ("::ffff:0:127.0.0.1", C.LOOPBACK, True),
    ("::127.0.0.1", C.LOOPBACK, True),
    ("::10.0.0.1", C.PRIVATE, False),
    ("::0.0.0.2", C.UNSPECIFIED, True),
    ("64:ff9b::7f00:1", C.LOOPBACK, True),
    ("64:ff9b::a9fe:a9fe", C.METADATA, True),
    ("64:ff9b::808:808", C.PUBLIC, False),
    ("2002:7f00:1::", C.LOOPBACK, True),
    ("2002:a00:1::1", C.PRIVATE, False),
    ("2002:808:808::1", C.PUBLIC, False),
    ("2001:0:4136:e378:8000:63bf:80ff:fffe", C.LOOPBACK, True),  # teredo client ~0x80fffffe = 127.0.0.1
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", C.DOCUMENTATION, False),  # RFC 4380 example, client 192.0.2.45
]


@pytest.mark.parametrize(("text", "cls", "blocked"), CLASSIFY_CASES)
def test_classify_table(text: str, cls: AddressClass, blocked: bool) -> None:
    c = classify(text)
    assert c.cls is cls, c
    assert c.always_blocked is blocked
    assert c.internal is (cls is not C.PUBLIC)


def test_classify_reports_embedding_and_canonical_address() -> None:
    c = classify("::ffff:10.1.2.3")
    assert (c.address, c.embedded) == (IPv4Address("10.1.2.3"), "mapped")
    assert classify("64:ff9b::a00:1").embedded == "nat64"
    assert classify("2002:a00:1::").embedded == "6to4"
    assert classify("2001:0:4136:e378:8000:63bf:f5ff:fffe").embedded == "teredo"
    assert classify("2001:0:4136:e378:8000:63bf:f5ff:fffe").address == IPv4Address("10.0.0.1")
    assert classify("::1").embedded is None
    assert classify("::").embedded is None
    assert classify("2606:4700::1").address == IPv6Address("2606:4700::1")


def test_classify_drops_scope_id() -> None:
    c = classify(IPv6Address("fe80::1%eth0"))
    assert c.address == IPv6Address("fe80::1") and c.always_blocked


def test_classify_rejects_non_literal_string() -> None:
    for bad in ("example.com", "127.1", "2130706433", "fe80::1%eth0"):
        with pytest.raises(ValueError):
            classify(bad)


# (host, expected): an address string, None (a name), or a RefusedReason
LITERAL_CASES: list[tuple[str, str | RefusedReason | None]] = [
    ("93.184.216.34", "93.184.216.34"),
    ("0.0.0.0", "0.0.0.0"),
    ("255.255.255.255", "255.255.255.255"),
    ("::1", "::1"),
    ("[::1]", "::1"),
    ("[::FFFF:127.0.0.1]", "::ffff:7f00:1"),
    ("2001:DB8::1", "2001:db8::1"),
    ("example.com", None),
    ("example.com.", None),
    ("EXAMPLE.com", None),
    ("1.2.3.4.example.com", None),
    ("0x7f.example", None),
    ("127.0.0.1x", None),
    ("123abc", None),
    ("localhost", None),
    # every other numeric spelling is refused
    ("2130706433", RefusedReason.NON_CANONICAL_IPV4),
    ("0x7f000001", RefusedReason.NON_CANONICAL_IPV4),
    ("0x7f.1", RefusedReason.NON_CANONICAL_IPV4),
    ("0177.0.0.1", RefusedReason.NON_CANONICAL_IPV4),
    ("127.1", RefusedReason.NON_CANONICAL_IPV4),
    ("127.0.1", RefusedReason.NON_CANONICAL_IPV4),
    ("127.0.0.1.", RefusedReason.NON_CANONICAL_IPV4),
    ("127.000.000.001", RefusedReason.NON_CANONICAL_IPV4),
    ("0X7F.0.0.1", RefusedReason.NON_CANONICAL_IPV4),
    ("017700000001", RefusedReason.NON_CANONICAL_IPV4),
    ("0", RefusedReason.NON_CANONICAL_IPV4),
    ("\uff11\uff12\uff17\uff0e\uff10\uff0e\uff10\uff0e\uff11", RefusedReason.NON_CANONICAL_IPV4),  # fullwidth
    ("127\u30020\u30020\u30021", RefusedReason.NON_CANONICAL_IPV4),  # ideographic full stops
    ("1.2.3.256", RefusedReason.INVALID_IPV4),
    ("256.1.1.1", RefusedReason.INVALID_IPV4),
    ("08.1.1.1", RefusedReason.INVALID_IPV4),
    ("1.2.3.4.5", RefusedReason.INVALID_IPV4),
    ("example.123", RefusedReason.INVALID_IPV4),
    ("example.0x10", RefusedReason.INVALID_IPV4),
    ("4294967296", RefusedReason.INVALID_IPV4),
    ("fe80::1%eth0", RefusedReason.IPV6_ZONE_ID),
    ("[fe80::1%25eth0]", RefusedReason.IPV6_ZONE_ID),
    ("[1.2.3.4]", RefusedReason.BRACKETED_NON_IPV6),
    ("[::1", RefusedReason.BRACKETED_NON_IPV6),
    ("::1]", RefusedReason.BRACKETED_NON_IPV6),
    ("[example.com]", RefusedReason.BRACKETED_NON_IPV6),
    ("1:2:3", RefusedReason.INVALID_IPV6),
    ("::ffff:127.1", RefusedReason.INVALID_IPV6),
    ("example.com:443", RefusedReason.INVALID_IPV6),
    ("127.0.0.1 ", RefusedReason.CONTROL_OR_SPACE),
    (" 127.0.0.1", RefusedReason.CONTROL_OR_SPACE),
    ("127.0.0.1\x00.example.com", RefusedReason.CONTROL_OR_SPACE),
    ("a\tb", RefusedReason.CONTROL_OR_SPACE),
    ("", RefusedReason.EMPTY),
]


@pytest.mark.parametrize(("host", "expected"), LITERAL_CASES)
def test_parse_host_literal_table(host: str, expected: str | RefusedReason | None) -> None:
    got = parse_host_literal(host)
    if expected is None:
        assert got is None
    elif isinstance(expected, RefusedReason):
        assert isinstance(got, Refused), got
        assert got.reason is expected
    else:
        assert got == ipaddress.ip_address(expected)


@pytest.mark.parametrize(
    "host",
    ["2130706433", "0x7f000001", "0x7f.1", "0177.0.0.1", "127.1", "127.0.1", "017700000001", "0x7F.0X0.0.01"],
)
def test_refused_spellings_record_what_would_be_dialled(host: str) -> None:
    got = parse_host_literal(host)
    assert isinstance(got, Refused)
    assert got.would_dial == IPv4Address("127.0.0.1")
    assert classify(got.would_dial).always_blocked


@pytest.mark.parametrize(
    "host",
    [
        "2130706433",
        "0x7f.1",
        "0177.0.0.1",
        "127.1",
        "1.2.3",
        "0x1.0x2.3",
        "010.010.010.010",
        "0",
        "4294967295",
        "0x",
        "1.0x",
        "0xffffffff",
        "255.0xffffff",
        "1.2.3.4",
        "08",
        "1.2.3.256",
        "9.9.9.0x100",
        "1..2",
    ],
)
def test_inet_aton_lenient_agrees_with_glibc(host: str) -> None:
    try:
        expect: IPv4Address | None = IPv4Address(socket.inet_aton(host))
    except OSError:
        expect = None
    assert inet_aton_lenient(host) == expect


def test_every_canonical_v4_literal_round_trips() -> None:
    for text in ("1.2.3.4", "10.0.0.0", "199.255.0.9"):
        assert parse_host_literal(text) == IPv4Address(text)


# --- properties -----------------------------------------------------------------------------------------------

v4s = st.integers(0, 2**32 - 1).map(IPv4Address)


def _embeddings(v4: IPv4Address, teredo_server: int, teredo_flags: int) -> dict[str, IPv6Address]:
    n = int(v4)
    out = {
        "mapped": IPv6Address((0xFFFF << 32) | n),
        "translated": IPv6Address((0xFFFF << 48) | n),
        "nat64": IPv6Address((0x64FF9B << 96) | n),
        "6to4": IPv6Address((0x2002 << 112) | (n << 80) | 1),
        "teredo": IPv6Address((0x20010000 << 96) | (teredo_server << 64) | (teredo_flags << 48) | (~n & 0xFFFFFFFF)),
    }
    if n > 1:  # ::0.0.0.0 and ::0.0.0.1 are :: and ::1 themselves
        out["compatible"] = IPv6Address(n)
    return out


@given(v4s, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_ipv4_classifies_the_same_in_every_ipv6_embedding(v4: IPv4Address, server: int, flags: int) -> None:
    base = classify(v4)
    for kind, v6 in _embeddings(v4, server, flags).items():
        c = classify(v6)
        assert (c.cls, c.always_blocked, c.internal, c.address, c.embedded) == (
            base.cls,
            base.always_blocked,
            base.internal,
            v4,
            kind,
        ), (kind, v6)


@given(st.integers(0, 2**32 - 1))
def test_classify_total_v4(n: int) -> None:
    c = classify(IPv4Address(n))
    assert c.internal or c.cls is C.PUBLIC
    assert not c.always_blocked or c.internal


@given(st.integers(0, 2**128 - 1))
def test_classify_total_v6(n: int) -> None:
    c = classify(IPv6Address(n))
    assert isinstance(c.cls, AddressClass)
    assert not c.always_blocked or c.internal
    if c.cls is C.PUBLIC:
        # nothing public may hide an internal IPv4 or sit outside global unicast space
        assert c.embedded is None or not classify(c.address).internal
        assert isinstance(c.address, IPv4Address) or c.address in ipaddress.IPv6Network("2000::/3")


@given(st.integers(0, 2**32 - 1))
def test_python_private_or_reserved_v4_is_never_public_here(n: int) -> None:
    a = IPv4Address(n)
    if a.is_private or a.is_loopback or a.is_link_local or a.is_multicast or a.is_reserved or a.is_unspecified:
        assert classify(a).internal, a


@given(st.text(max_size=24))
def test_parse_host_literal_never_raises(text: str) -> None:
    got = parse_host_literal(text)
    assert got is None or isinstance(got, Refused | IPv4Address | IPv6Address)


@given(st.integers(0, 2**32 - 1), st.sampled_from(["d", "o", "x"]), st.integers(1, 4))
def test_every_lenient_spelling_is_refused_or_canonical(n: int, base: str, nparts: int) -> None:
    """Spell an address the way inet_aton reads it; we either see the canonical literal or refuse it, and the
    refusal names the same address."""
    b = n.to_bytes(4, "big")
    head = list(b[: nparts - 1])
    tail = int.from_bytes(b[nparts - 1 :], "big")
    fmts: dict[str, Callable[[int], str]] = {
        "d": str,
        "o": lambda v: "0" + format(v, "o"),
        "x": lambda v: "0x" + format(v, "x"),
    }
    fmt = fmts[base]
    text = ".".join([*(fmt(v) for v in head), fmt(tail)])
    got = parse_host_literal(text)
    if isinstance(got, IPv4Address):
        assert got == IPv4Address(n) and str(got) == text
    else:
        assert isinstance(got, Refused) and got.would_dial == IPv4Address(n)


@pytest.mark.parametrize(
    ("net", "overlaps"),
    [
        ("0.0.0.0/0", True),
        ("::/0", True),
        ("127.0.0.0/8", True),
        ("127.0.0.1/32", True),
        ("169.254.169.254/32", True),
        ("0.0.0.0/32", True),
        ("::1/128", True),
        ("fe80::/64", True),
        ("::ffff:127.0.0.1/128", True),
        ("::ffff:169.254.0.0/112", True),
        ("64:ff9b::/96", True),
        ("64:ff9b::7f00:1/128", True),
        ("2002::/16", True),
        ("2002:7f00::/24", True),
        ("10.0.0.0/8", False),
        ("100.64.0.0/10", False),
        ("192.168.0.0/16", False),
        ("8.8.8.8/32", False),
        ("fc00::/7", False),
        ("::ffff:10.0.0.0/104", False),
        ("64:ff9b::808:808/128", False),
        ("2002:808:808::/48", False),
        ("2606:4700::/32", False),
    ],
)
def test_overlaps_always_blocked(net: str, overlaps: bool) -> None:
    assert overlaps_always_blocked(ipaddress.ip_network(net)) is overlaps


@given(st.integers(0, 2**32 - 1), st.integers(0, 32))
def test_a_network_holding_an_always_blocked_v4_overlaps(n: int, prefix: int) -> None:
    net = ipaddress.IPv4Network((n, prefix), strict=False)
    holds_blocked = any(
        classify(a).cls in (C.LOOPBACK, C.LINK_LOCAL, C.UNSPECIFIED, C.METADATA)
        and not (classify(a).cls is C.METADATA and not a.is_link_local)
        for a in (net.network_address, net.broadcast_address)
    )
    if holds_blocked:
        assert overlaps_always_blocked(net)


# --- edges the mutation run asked for (docs/design.md "Testing") -------------------------------------------------

REFUSALS = [
    ("", R.EMPTY, None),
    ("a\x7fb", R.CONTROL_OR_SPACE, None),
    ("a b", R.CONTROL_OR_SPACE, None),
    ("[1.2.3.4]", R.BRACKETED_NON_IPV6, None),
    ("[fe80::1%eth0]", R.IPV6_ZONE_ID, None),
    ("fe80::1%eth0", R.IPV6_ZONE_ID, None),
    ("1:2:3", R.INVALID_IPV6, None),
    ("1.2.3.0XFF", R.NON_CANONICAL_IPV4, IPv4Address("1.2.3.255")),
    ("1.2.3.0xfF", R.NON_CANONICAL_IPV4, IPv4Address("1.2.3.255")),
    ("a.2.3.4", R.INVALID_IPV4, None),  # a name's label before a numeric last one: no canonical address
    ("\u0664.2.3.4", R.INVALID_IPV4, None),  # an Arabic-Indic digit is a digit, but not an ASCII one
]


@pytest.mark.parametrize(("host", "reason", "would"), REFUSALS)
def test_a_refusal_names_the_host_as_written(host: str, reason: R, would: IPv4Address | None) -> None:
    assert parse_host_literal(host) == Refused(host, reason, would)


@pytest.mark.parametrize("host", ["a!b", "1.b.", "a.0xX", "a.0xg1", "x.1a"])
def test_names_that_only_look_numeric_are_names(host: str) -> None:
    assert parse_host_literal(host) is None


@pytest.mark.parametrize(
    ("host", "address"),
    [("1.2.3.4.", "1.2.3.4"), ("0x7f.1", "127.0.0.1"), ("1.2.3.4.0", None), ("1.300.2", None), ("1_0", None),
     ("0x1_0", None), ("1.\u0664", None), ("1..2", None), ("0x", None)],
)  # fmt: skip
def test_lenient_reading_edges(host: str, address: str | None) -> None:
    assert inet_aton_lenient(host) == (IPv4Address(address) if address else None)


def test_classify_gives_the_address_it_judged() -> None:
    assert classify("1.2.3.4").address == IPv4Address("1.2.3.4")
    local = classify("64:ff9b:1::7f00:1")
    assert (local.address, local.embedded, local.always_blocked) == (IPv4Address("127.0.0.1"), "nat64-local", True)
    with pytest.raises(ValueError, match=r"^not a canonical IP literal: '01\.2\.3\.4'$"):
        classify("01.2.3.4")


@pytest.mark.parametrize(
    ("net", "address"),
    [("2001::/32", "2001::ffff:ffff"), ("2001::/64", "2001::ffff:ffff"), ("2002::/16", "2002::"),
     ("2002:a9fe::/32", "2002:a9fe::"), ("::ffff:0:0/96", "::ffff:0:0"), ("64:ff9b::/96", "64:ff9b::")],
)  # fmt: skip
def test_a_refused_network_names_its_first_always_blocked_address(net: str, address: str) -> None:
    """The lowest always-blocked IPv4 of the table in the embedding's spelling (0.0.0.0 inverted for Teredo)."""
    found = blocked_in_network(ipaddress.ip_network(net))
    assert found is not None and found.address == IPv6Address(address)
    assert found.address in ipaddress.ip_network(net) and found.classification.always_blocked
