"""Always-blocked stays blocked through the NAT64 local-use prefix (RFC 8215 ``64:ff9b:1::/48``).

A translator configured with a /96 out of the local-use prefix turns ``64:ff9b:1::a9fe:a9fe`` into a packet to
169.254.169.254 on its side, exactly as the well-known ``64:ff9b::a9fe:a9fe`` does. The well-known spelling was
always refused; the local-use one was merely ``private``, so a policy that names it (an exact host, or an
``allowed_ips`` entry in it) let the agent reach the translator's metadata service, loopback and link-local
space — which docs/design.md promises are refused even when a policy names them. The attacker's moves: ask for
that literal, or resolve an allowed name to it. Other local-use layouts (RFC 6052's /48, /56 and /64, with the
IPv4 split around the u-octet) cannot be told from ordinary addresses; they stay ``private`` (refused unless the
policy names them), a residual in docs/policy.md.
"""

from __future__ import annotations

from ipaddress import IPv6Address, IPv6Network

import pytest

from supervisor.control.addresses import AddressClass, blocked_in_network, classify
from supervisor.control.upstream import UpstreamError, UpstreamReason, check_allowed_ips, vet_addresses

BLOCKED = [
    ("64:ff9b:1::a9fe:a9fe", AddressClass.METADATA),
    ("64:ff9b:1::7f00:1", AddressClass.LOOPBACK),
    ("64:ff9b:1:abcd::a9fe:1", AddressClass.LINK_LOCAL),  # any /96 of the local-use /48
    ("64:ff9b:1::1", AddressClass.UNSPECIFIED),  # 0.0.0.1
]


@pytest.mark.parametrize(("literal", "cls"), BLOCKED)
def test_the_agent_cannot_reach_always_blocked_space_through_a_local_use_translator(
    literal: str, cls: AddressClass
) -> None:
    addr = IPv6Address(literal)
    c = classify(addr)
    assert c.always_blocked and c.cls is cls and c.embedded == "nat64-local", c
    for kwargs in ({"host_named_exactly": True}, {"allowed_ips": ["64:ff9b:1::c633:6400/120"]}, {}):
        with pytest.raises(UpstreamError) as info:  # a literal the policy names, or a name resolving to it
            vet_addresses(literal if kwargs.get("host_named_exactly") else "api.example.com", [addr], **kwargs)
        assert info.value.reason is UpstreamReason.ALWAYS_BLOCKED, info.value


@pytest.mark.parametrize("entry", ["64:ff9b:1::/96", "64:ff9b:1::a9fe:a900/120", "64:ff9b:1::/48", "64:ff9b::/32"])
def test_an_allowed_ips_entry_covering_them_is_refused(entry: str) -> None:
    found = blocked_in_network(IPv6Network(entry))
    assert found is not None and classify(found.address).always_blocked, found
    with pytest.raises(UpstreamError) as info:
        check_allowed_ips([entry])
    assert info.value.reason is UpstreamReason.INVALID_ALLOWED_IPS


def test_ordinary_local_use_addresses_stay_what_they_were() -> None:
    """Nothing is loosened: a local-use address whose /96 reading is not always-blocked is still private."""
    for literal in ("64:ff9b:1::c633:6402", "64:ff9b:1::808:808", "64:ff9b:1:abcd::a00:1"):
        c = classify(literal)
        assert c.cls is AddressClass.PRIVATE and c.internal and not c.always_blocked and c.embedded is None, c
    assert check_allowed_ips(["64:ff9b:1::c633:6400/120"])  # a usable range of a local translator stays valid
