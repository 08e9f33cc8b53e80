"""Never dial yourself: control's own addresses are refused as ``control-local`` whatever the policy
says, and control's reading of its namespace (addresses, IPv6 egress) — pure parts, with a fake reader."""

from __future__ import annotations

import ipaddress
import os
from ipaddress import ip_address, ip_network

import pytest
import trio
import trio.testing

from supervisor.control.addresses import IPAddress
from supervisor.control.local_net import Ipv6Egress, LocalNetwork, NetState, Route, covers_global_v6
from supervisor.control.upstream import UpstreamError, UpstreamReason, vet_addresses

OWN = ip_address("198.51.100.1")


def _local(*extra: str, state: NetState | None = None) -> LocalNetwork:
    net = LocalNetwork([ip_address(a) for a in extra], reader=lambda: state or NetState(frozenset({OWN}), False))
    net.refresh()
    return net


@pytest.mark.parametrize(
    ("kwargs", "addresses"),
    [
        ({"host_named_exactly": True}, ["198.51.100.1"]),  # a name the policy names exactly
        ({"allowed_ips": [ip_network("198.51.100.0/24")]}, ["198.51.100.1"]),  # an allowed_ips range covering it
        ({}, ["198.51.100.1"]),  # an IP literal (vetted as the literal itself)
        ({"host_named_exactly": True}, ["::ffff:198.51.100.1"]),  # the same address, IPv4-mapped
        ({"host_named_exactly": True}, ["203.0.113.9"]),  # --self-address (e.g. the Service IP)
    ],
)
def test_own_address_is_refused_whatever_the_policy(kwargs: dict[str, object], addresses: list[str]) -> None:
    net = _local("203.0.113.9")
    host = addresses[0] if not kwargs else "self.test"
    with pytest.raises(UpstreamError) as info:
        vet_addresses(host, [ip_address(a) for a in addresses], is_local=net.is_local, **kwargs)  # type: ignore[arg-type]
    assert info.value.reason is UpstreamReason.CONTROL_LOCAL
    assert info.value.status == 403 and info.value.reason.ssrf  # rendered as ssrf_denied


def test_mixed_answer_refuses_the_connection_and_filters_for_dns() -> None:
    net = _local()
    answer: list[IPAddress] = [ip_address("198.51.100.2"), OWN]
    with pytest.raises(UpstreamError) as info:
        vet_addresses("api.test", answer, host_named_exactly=True, is_local=net.is_local)
    assert info.value.reason is UpstreamReason.CONTROL_LOCAL
    kept = vet_addresses("api.test", answer, host_named_exactly=True, is_local=net.is_local, strict=False)
    assert kept == [ip_address("198.51.100.2")]


def test_other_addresses_pass_and_loopback_stays_always_blocked() -> None:
    net = _local()
    assert vet_addresses("api.test", [ip_address("198.51.100.2")], host_named_exactly=True, is_local=net.is_local)
    with pytest.raises(UpstreamError) as info:
        vet_addresses("loop.test", [ip_address("127.0.0.1")], host_named_exactly=True, is_local=net.is_local)
    assert info.value.reason is UpstreamReason.ALWAYS_BLOCKED


R = Route  # (dst, dst_len, type, table)
ROUTE_CASES = [
    ([R(None, 0, 1, 254)], True),  # default route
    ([R("2000::", 3, 1, 254)], True),
    ([R("2000::", 3, 1, 100)], True),  # policy-routing table
    ([R("2001:db8::", 32, 1, 254), R("fe80::", 64, 1, 254)], False),  # only specific routes
    ([R(None, 0, 7, 254)], False),  # unreachable default
    ([R(None, 0, 6, 254)], False),  # prohibit
    ([R("::1", 128, 2, 255), R(None, 0, 1, 255)], False),  # local table only
    ([R("3000::", 4, 1, 254)], False),  # does not cover all of 2000::/3
    ([], False),
]


@pytest.mark.parametrize(("routes", "covered"), ROUTE_CASES)
def test_ipv6_egress_needs_a_covering_unicast_route(routes: list[Route], covered: bool) -> None:
    assert covers_global_v6(routes) is covered


@pytest.mark.parametrize(
    ("mode", "route", "egress"),
    [(Ipv6Egress.AUTO, True, True), (Ipv6Egress.AUTO, False, False), (Ipv6Egress.ON, False, True),
     (Ipv6Egress.OFF, True, False)],
)  # fmt: skip
def test_ipv6_modes(mode: Ipv6Egress, route: bool, egress: bool) -> None:
    net = LocalNetwork(ipv6_egress=mode, reader=lambda: NetState(frozenset(), route))
    net.refresh()
    assert net.ipv6_egress is egress


def test_a_failed_reading_keeps_what_was_known() -> None:
    states: list[NetState | Exception] = [NetState(frozenset({OWN}), True), OSError("netlink refused")]

    def reader() -> NetState:
        item = states.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    net = LocalNetwork([ip_address("203.0.113.9")], reader=reader)
    net.refresh()
    net.refresh()
    assert net.is_local(OWN) and net.is_local(ip_address("203.0.113.9")) and net.ipv6_egress


async def test_rereads_at_least_every_five_seconds(autojump_clock: trio.testing.MockClock) -> None:
    readings: list[int] = []
    addresses = [frozenset({OWN}), frozenset({ip_address("198.51.100.9")})]

    def reader() -> NetState:  # runs in a worker thread
        readings.append(len(readings))
        return NetState(addresses[min(len(readings) - 1, 1)], False)

    net = LocalNetwork(reader=reader)
    async with trio.open_nursery() as nursery:
        await nursery.start(net.watch)
        assert net.is_local(OWN)  # read before started: no dial can come first
        with trio.fail_after(10_000):  # virtual seconds; the readings run in a worker thread in real time
            while len(readings) < 3:  # noqa: ASYNC110 - the reader runs in a thread, nothing to wait on
                await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert not net.is_local(OWN) and net.is_local(ip_address("198.51.100.9"))  # the latest reading counts


def test_reads_this_namespace() -> None:
    """The real reader: at least loopback, and every address `ip` would show is one of ours."""
    from supervisor.control.local_net import read_netstate

    try:
        state = read_netstate()
    except OSError as exc:  # pragma: no cover - netlink unavailable
        pytest.skip(f"netlink unavailable: {exc}")
    assert ipaddress.ip_address("127.0.0.1") in state.addresses
    with open("/proc/net/if_inet6") if os.path.exists("/proc/net/if_inet6") else open(os.devnull) as f:
        has_v6 = bool(f.read().strip())
    assert has_v6 == any(a.version == 6 for a in state.addresses)


def test_the_boundary_renders_every_destination_refusal_as_ssrf_denied() -> None:
    """The boundary cannot import control: its list of SSRF reasons must be control's 403 reasons exactly."""
    from supervisor.protocol.egress import SSRF_REASONS, EgressReply

    assert {str(r) for r in UpstreamReason if r.ssrf} == SSRF_REASONS
    assert EgressReply(403, reason="control-local").ssrf
    assert not EgressReply(403, reason="no-matching-policy").ssrf


def test_netstate_is_logged_only_when_controls_own_addresses_or_ipv6_egress_change() -> None:
    import io
    import json

    from supervisor.jsonlog import JsonLog

    base = {OWN, ip_address("fe80::1")}
    readings = [
        NetState(frozenset(base), False),
        NetState(frozenset(base | {ip_address("fe80::abcd:1")}), False),  # a veth came up: link-local only
        NetState(frozenset(base), False),  # and went
        NetState(frozenset(base | {ip_address("198.51.100.7")}), False),  # an address of control's own
        NetState(frozenset(base | {ip_address("198.51.100.7")}), True),  # IPv6 egress now
    ]
    out = io.StringIO()
    net = LocalNetwork(reader=lambda: readings.pop(0), log=JsonLog("control", stream=out))
    for _ in range(5):
        net.refresh()
    said = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(e["addresses"], e["ipv6_egress"]) for e in said] == [
        ([str(OWN), "fe80::1"], False),
        ([str(OWN), "198.51.100.7", "fe80::1"], False),
        ([str(OWN), "198.51.100.7", "fe80::1"], True),
    ]
    fixed = LocalNetwork(ipv6_egress=Ipv6Egress.OFF, reader=lambda: NetState(frozenset({OWN}), readings2.pop(0)),
                         log=JsonLog("control", stream=(out2 := io.StringIO())))  # fmt: skip
    readings2 = [False, True]
    fixed.refresh()
    fixed.refresh()  # a v6 route appeared, but --ipv6-egress=off decides: nothing changed
    assert len(out2.getvalue().splitlines()) == 1
