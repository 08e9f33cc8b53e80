"""Policy validation and the dial classify ``allowed_ips`` with one function (control/addresses.py
``blocked_in_network``): an entry ``policy check`` accepts is never refused on every connection, and an entry it
refuses names an address the dial would refuse. Tested with the entries an attacker-minded policy author would
try: every IPv6 spelling of loopback, link-local and unspecified space."""

from __future__ import annotations

import ipaddress
from ipaddress import IPv4Address, IPv4Network, IPv6Address

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.control.addresses import AddressClass, IPAddress, IPNetwork, blocked_in_network, classify
from supervisor.control.policy import PolicyInvalid
from supervisor.control.upstream import UpstreamError, UpstreamReason, check_allowed_ips, vet_addresses

from .policy_helpers import load, rule

WHERE = "network_policies.r.endpoints[0].allowed_ips[0]"


def validation_error(entry: str) -> str | None:
    """The message ``policy check`` gives for ``allowed_ips: [entry]``, or None when it accepts the entry."""
    try:
        load({"r": rule({"host": "a.example.com", "port": 443, "allowed_ips": [entry]})})
    except PolicyInvalid as exc:
        assert len(exc.errors) == 1, exc.errors
        assert exc.errors[0].path == WHERE  # the field and the entry are named
        return str(exc.errors[0])
    return None


def dial_refusal(addr: IPAddress, allowed: list[IPNetwork]) -> UpstreamReason | None:
    try:
        vet_addresses("a.example.com", [addr], allowed_ips=allowed, host_named_exactly=True)
    except UpstreamError as exc:
        return exc.reason
    return None


@pytest.mark.parametrize(
    ("entry", "shown"),
    [
        ("64:ff9b::7f00:0/104", "nat64"),  # the example: NAT64 of 127.0.0.0/8
        ("64:ff9b::a9fe:0/112", "nat64"),  # NAT64 of 169.254.0.0/16
        ("64:ff9b::/96", "nat64"),
        ("2002:7f00::/24", "6to4"),
        ("2002::/16", "6to4"),
        ("2001:0:0:0:0:0:80ff:fffe/128", "teredo"),  # client 127.0.0.1, stored inverted
        ("2001::ffff:0:0/96", "teredo"),  # every Teredo client under one server, 0.0.0.0/8's inverse included
        ("::ffff:0:7f00:1/128", "translated"),
        ("::7f00:1/128", "compatible"),
        ("::ffff:127.0.0.1/128", "mapped"),
        ("::ffff:169.254.0.0/112", "mapped"),
        ("0.0.0.0/8", "unspecified"),
        ("0.1.2.3", "unspecified"),
        ("127.0.0.1", "loopback"),
        ("169.254.169.254/32", "metadata"),
        ("100.100.100.200", "metadata"),  # the entry is nothing but a metadata address
        ("::ffff:100.100.100.200/128", "metadata"),
        ("fd00:ec2::254/128", "metadata"),
        ("fe80::/64", "link-local"),
        ("::/0", "unspecified"),
        ("0.0.0.0/0", "unspecified"),
    ],
)
def test_policy_check_refuses_what_the_dial_refuses(entry: str, shown: str) -> None:
    message = validation_error(entry)
    assert message is not None, f"policy check accepted {entry}"
    assert entry in message and shown in message
    with pytest.raises(UpstreamError) as info:
        check_allowed_ips([entry])
    assert info.value.reason is UpstreamReason.INVALID_ALLOWED_IPS


@pytest.mark.parametrize(
    "entry",
    ["10.0.0.0/8", "100.64.0.0/10", "fd00::/8", "64:ff9b::a00:0/104", "2002:a00::/24", "2001:db8::/32", "8.8.8.8"],
)
def test_usable_internal_ranges_stay_valid(entry: str) -> None:
    assert validation_error(entry) is None
    assert check_allowed_ips([entry])


# --- the property: one answer for both ----------------------------------------------------------------------

_BLOCKED_V4 = [IPv4Network(n) for n in ("0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "100.100.100.200/32")]
_LOW32 = 0xFFFFFFFF

v4_ints = st.one_of(
    st.integers(0, _LOW32),
    st.builds(
        lambda net, off: int(net.network_address) + off % net.num_addresses,
        st.sampled_from(_BLOCKED_V4),
        st.integers(0, _LOW32),
    ),
)


def _embed(kind: str, v4: int, rest: int) -> IPv6Address:
    if kind == "mapped":
        return IPv6Address((0xFFFF << 32) | v4)
    if kind == "translated":
        return IPv6Address((0xFFFF << 48) | v4)
    if kind == "compatible":
        return IPv6Address(v4)
    if kind == "nat64":
        return IPv6Address((0x0064FF9B << 96) | v4)
    if kind == "6to4":
        return IPv6Address((0x2002 << 112) | (v4 << 80) | (rest & ((1 << 80) - 1)))
    # Teredo: 2001:0000:server:flags:port:~client
    return IPv6Address((0x20010000 << 96) | ((rest & ((1 << 64) - 1)) << 32) | (~v4 & _LOW32))


addresses: st.SearchStrategy[IPAddress] = st.one_of(
    st.builds(IPv4Address, v4_ints),
    st.builds(IPv6Address, st.integers(0, 2**128 - 1)),
    st.builds(
        _embed,
        st.sampled_from(["mapped", "translated", "compatible", "nat64", "6to4", "teredo"]),
        v4_ints,
        st.integers(0, 2**80 - 1),
    ),
    st.builds(lambda n: IPv6Address((0xFE80 << 112) | n), st.integers(0, 2**112 - 1)),
    st.sampled_from([IPv6Address("::"), IPv6Address("::1"), IPv6Address("fd00:ec2::254")]),
)


@st.composite
def networks_around(draw: st.DrawFn) -> tuple[IPAddress, IPNetwork]:
    """An address and a network holding it: most prefixes long, so the embedded IPv4 bits are partly fixed."""
    addr = draw(addresses)
    width = 32 if isinstance(addr, IPv4Address) else 128
    prefix = draw(st.one_of(st.integers(0, width), st.integers(max(0, width - 40), width)))
    return addr, ipaddress.ip_network((addr, prefix), strict=False)


@settings(max_examples=400, deadline=None)
@given(networks_around())
def test_validation_accepts_only_what_the_dial_does_not_refuse(case: tuple[IPAddress, IPNetwork]) -> None:
    addr, net = case
    message = validation_error(str(net))
    c = classify(addr)
    if message is None:
        # Accepted: the dial takes the entry, and refuses no address in it for its class — except a metadata
        # address inside a usable range (100.64.0.0/10 holds Alibaba's), which it refuses alone.
        assert check_allowed_ips([net]) == [net]
        refusal = dial_refusal(addr, [net])
        assert refusal is None or (refusal is UpstreamReason.ALWAYS_BLOCKED and c.cls is AddressClass.METADATA)
        assert not (c.always_blocked and c.cls is not AddressClass.METADATA)
        assert net.num_addresses > 1 or not c.always_blocked
    else:
        # Refused: the dial would refuse the entry too, and the address the message names is one it refuses.
        with pytest.raises(UpstreamError):
            check_allowed_ips([net])
        blocked = blocked_in_network(net)
        assert blocked is not None and blocked.address in net
        assert str(blocked.address) in message
        assert blocked.classification.always_blocked
        assert dial_refusal(blocked.address, []) is UpstreamReason.ALWAYS_BLOCKED


@given(addresses)
def test_an_address_the_dial_always_refuses_is_no_valid_entry(addr: IPAddress) -> None:
    if classify(addr).always_blocked:
        assert blocked_in_network(ipaddress.ip_network(addr)) is not None
        assert dial_refusal(addr, []) is UpstreamReason.ALWAYS_BLOCKED
