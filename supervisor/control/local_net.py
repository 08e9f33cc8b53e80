"""What control knows of its own network namespace: its own addresses (never dialled) and whether it has IPv6 egress.

Rules this file enforces:

1. **Never dial yourself.** Every address of every interface in control's namespace, plus each
   ``--self-address`` (render passes the Service address, which no interface holds), is *control-local*:
   upstream vetting refuses it as ``ssrf_denied``/``control-local`` whatever the policy says
   (``upstream.vet_addresses``). Loopback and link-local are refused anyway (always blocked); this covers the
   pod's own routable addresses, which a policy naming a host exactly or an ``allowed_ips`` range could
   otherwise reach — control's API, its metrics, anything bound to the pod IP.
2. **IPv6 egress** is a unicast route in any table but ``local`` whose prefix covers global unicast space
   (``2000::/3``; a default route does). Without one an AAAA answer would hand the agent addresses control
   cannot reach, so the DNS side answers AAAA with no records (``dns_answers``). ``--ipv6-egress on|off``
   overrides the reading (tests; a pod whose v6 path is known).
3. Both are read with pyroute2 at start, before any link is dialled, then again whenever the kernel reports an
   address or route change (a netlink multicast subscription, used only as a wake-up) and at least every 5 s.
   A failed read keeps what was known and is logged; ``--self-address`` entries are always in force.
4. ``control.netstate`` is logged when what control decides by changes: an address of its own (link-local ones
   aside: every interface brought up gets one, and control never dials link-local anyway) or whether it has
   IPv6 egress (under ``--ipv6-egress=auto``). A host's interfaces coming and going (a container runtime's veths,
   a test's namespaces) change neither, and log nothing.
"""

from __future__ import annotations

import enum
import ipaddress
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from ipaddress import IPv6Network

import trio

from supervisor.control.addresses import IPAddress, classify
from supervisor.jsonlog import JsonLog
from supervisor.protocol.event_names import EventName

__all__ = ["REREAD_S", "Ipv6Egress", "LocalNetwork", "NetState", "covers_global_v6", "read_netstate"]

REREAD_S = 5.0
_GLOBAL_V6 = IPv6Network("2000::/3")
_RTN_UNICAST = 1
_RT_TABLE_LOCAL = 255
# rtnetlink multicast groups (<linux/rtnetlink.h>): address and route changes, both families
_GROUPS = 0x10 | 0x40 | 0x100 | 0x400  # RTMGRP_IPV4_IFADDR | _IPV4_ROUTE | _IPV6_IFADDR | _IPV6_ROUTE


class Ipv6Egress(enum.StrEnum):
    ON = "on"
    OFF = "off"
    AUTO = "auto"


@dataclass(frozen=True)
class Route:
    dst: str | None  # None: the default route
    dst_len: int
    type: int
    table: int


@dataclass(frozen=True)
class NetState:
    addresses: frozenset[IPAddress]
    ipv6_route: bool


def covers_global_v6(routes: Iterable[Route]) -> bool:
    """Rule 2: some unicast IPv6 route outside the local table covers ``2000::/3``."""
    for route in routes:
        if route.type != _RTN_UNICAST or route.table == _RT_TABLE_LOCAL or route.dst_len > _GLOBAL_V6.prefixlen:
            continue
        try:
            net = IPv6Network(f"{route.dst or '::'}/{route.dst_len}", strict=False)
        except ValueError:
            continue
        if _GLOBAL_V6.subnet_of(net):
            return True
    return False


def _canonical(addr: IPAddress) -> IPAddress:
    return classify(addr).address  # IPv4 hidden in IPv6 is that IPv4; a scope id is dropped


def read_netstate() -> NetState:
    """One pyroute2 reading of the namespace we run in (a few ms)."""
    from pyroute2 import IPRoute  # imported here: ~0.2 s, and only control needs it

    addresses: set[IPAddress] = set()
    routes: list[Route] = []
    with IPRoute() as ipr:
        for msg in ipr.get_addr():
            text = msg.get("address")
            if text:
                addresses.add(_canonical(ipaddress.ip_address(str(text).split("%")[0])))
        for msg in ipr.get_routes(family=socket.AF_INET6):
            table = msg.get("table")
            routes.append(Route(msg.get("dst"), int(msg["dst_len"]), int(msg["type"]), int(table or msg["table"])))
    return NetState(frozenset(addresses), covers_global_v6(routes))


class LocalNetwork:
    """Control's own addresses and IPv6 egress, kept current by :meth:`watch`."""

    def __init__(
        self,
        self_addresses: Iterable[IPAddress] = (),
        *,
        ipv6_egress: Ipv6Egress = Ipv6Egress.AUTO,
        reader: Callable[[], NetState] = read_netstate,
        log: JsonLog | None = None,
    ) -> None:
        self.self_addresses = frozenset(_canonical(a) for a in self_addresses)
        self.mode = ipv6_egress
        self._reader = reader
        self._log = log
        self._state = NetState(frozenset(), False)

    @property
    def addresses(self) -> frozenset[IPAddress]:
        return self._state.addresses | self.self_addresses

    def is_local(self, addr: IPAddress) -> bool:
        """Whether ``addr`` (in any spelling: IPv4-mapped counts as its IPv4) is one of control's own."""
        addresses = self.addresses
        return addr in addresses or _canonical(addr) in addresses

    @property
    def ipv6_egress(self) -> bool:
        if self.mode is Ipv6Egress.AUTO:
            return self._state.ipv6_route
        return self.mode is Ipv6Egress.ON

    def _said(self, state: NetState) -> tuple[frozenset[IPAddress], bool]:
        """What ``control.netstate`` reports (rule 4): the addresses that matter, and IPv6 egress as decided."""
        ipv6 = state.ipv6_route if self.mode is Ipv6Egress.AUTO else self.mode is Ipv6Egress.ON
        return frozenset(a for a in state.addresses if not a.is_link_local), ipv6

    def refresh(self) -> None:
        try:
            state = self._reader()
        except Exception as exc:  # netlink refused or pyroute2 failed: keep what we knew (rule 3)
            if self._log is not None:
                self._log.emit(EventName.CONTROL_NETSTATE_FAILED, reason=f"{type(exc).__name__}: {exc}")
            return
        if self._said(state) != self._said(self._state) and self._log is not None:  # rule 4
            self._log.emit(
                EventName.CONTROL_NETSTATE, addresses=sorted(str(a) for a in state.addresses),
                ipv6_egress=self.ipv6_egress if self.mode is not Ipv6Egress.AUTO else state.ipv6_route,
                ipv6_mode=str(self.mode),
            )  # fmt: skip
        self._state = state

    async def watch(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read now (before ``started``), then on every netlink address/route change and every 5 s."""
        await trio.to_thread.run_sync(self.refresh)
        task_status.started()
        sock = _subscribe()
        try:
            while True:
                with trio.move_on_after(REREAD_S):
                    if sock is None:
                        await trio.sleep_forever()
                    await trio.lowlevel.wait_readable(sock)
                    await trio.sleep(0.05)  # one re-read for a burst of changes
                    _drain(sock)
                await trio.to_thread.run_sync(self.refresh)
        finally:
            if sock is not None:
                sock.close()


def _subscribe() -> socket.socket | None:
    """A netlink socket that becomes readable on address and route changes; None where netlink refuses (the
    5 s re-read still runs)."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    except OSError:
        return None
    try:
        sock.bind((0, _GROUPS))
        sock.setblocking(False)
    except OSError:
        sock.close()
        return None
    return sock


def _drain(sock: socket.socket) -> None:
    while True:
        try:
            sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # ENOBUFS after an overflow: we re-read everything anyway
            return
