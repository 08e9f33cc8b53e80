"""The fence as read back from rtnetlink (setup.py rule 2): each link, address, route and rule a typed entry,
and what is wrong with the whole (``problems``).

Each entry's ``to_wire`` is the JSON object ``setup.inspect`` reports and fingerprints, key for key: the
fingerprint is a hash of those objects, so their keys, order and values are the fence's identity.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from supervisor.protocol.json_value import JsonValue

__all__ = ["Address", "Link", "Route", "Rule", "problems"]

# route types (<linux/rtnetlink.h>)
_ROUTE_TYPES = {
    1: "unicast",
    2: "local",
    3: "broadcast",
    4: "anycast",
    5: "multicast",
    6: "blackhole",
    7: "unreachable",
    8: "prohibit",
    9: "throw",
    10: "nat",
}
# routes on lo that deliver locally or drop; a unicast route (even via lo) is not something we install
_HARMLESS_ROUTE_NAMES = {"local", "broadcast", "multicast", "blackhole", "unreachable", "prohibit"}
# the rules every fresh namespace has: (family, priority, table)
_DEFAULT_RULES = {
    (socket.AF_INET, 0, 255),
    (socket.AF_INET, 32766, 254),
    (socket.AF_INET, 32767, 253),
    (socket.AF_INET6, 0, 255),
    (socket.AF_INET6, 32766, 254),
    (128, 32767, 253),
    (129, 32767, 254),  # RTNL_FAMILY_IPMR / IP6MR: multicast routing defaults
}


def _optional_str(value: object) -> str | None:
    return None if value is None else str(value)


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True, slots=True)
class Link:
    index: int
    name: str
    kind: str | None
    up: bool

    @classmethod
    def read(cls, link: Any) -> Link:
        """From a pyroute2 link message (untyped: pyroute2 has no annotations)."""
        kind = link.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND")
        return cls(int(link["index"]), str(link.get("ifname")), _optional_str(kind), bool(link["flags"] & 1))

    def to_wire(self) -> dict[str, JsonValue]:
        return asdict(self)  # the fields, in their order: the fence's fingerprint hashes this JSON


@dataclass(frozen=True, slots=True)
class Address:
    family: int
    address: str
    link: str

    @classmethod
    def read(cls, addr: Any, names: Mapping[int, str]) -> Address:
        return cls(
            int(addr["family"]),
            f"{addr.get('address')}/{addr['prefixlen']}",
            names.get(int(addr["index"]), str(addr["index"])),
        )

    def to_wire(self) -> dict[str, JsonValue]:
        return asdict(self)  # the fields, in their order: the fence's fingerprint hashes this JSON


@dataclass(frozen=True, slots=True)
class Route:
    family: int
    table: int
    type: str
    dst: str
    oif: str | None
    gateway: str | None
    multipath: bool
    scope: int
    proto: int
    priority: int | None

    @classmethod
    def read(cls, route: Any, names: Mapping[int, str]) -> Route:
        family = int(route["family"])
        dst = route.get("dst") or ("0.0.0.0" if family == socket.AF_INET else "::")
        oif = route.get("oif")
        return cls(
            family=family,
            table=int(route.get("table") or route["table"]),
            type=_ROUTE_TYPES.get(int(route["type"]), str(route["type"])),
            dst=f"{dst}/{route['dst_len']}",
            oif=names.get(int(oif), str(oif)) if oif is not None else None,
            gateway=_optional_str(route.get("gateway")),
            multipath=route.get("multipath") is not None,
            scope=int(route["scope"]),
            proto=int(route["proto"]),
            priority=_optional_int(route.get("priority")),
        )

    def to_wire(self) -> dict[str, JsonValue]:
        return asdict(self)  # the fields, in their order: the fence's fingerprint hashes this JSON


@dataclass(frozen=True, slots=True)
class Rule:
    family: int
    priority: int
    table: int
    action: int
    src: str | None
    dst: str | None
    iif: str | None
    oif: str | None
    fwmark: int | None

    @classmethod
    def read(cls, rule: Any) -> Rule:
        return cls(
            family=int(rule["family"]),
            priority=int(rule.get("priority") or 0),
            table=int(rule.get("table") or rule["table"]),
            action=int(rule["action"]),
            src=f"{rule.get('src')}/{rule['src_len']}" if rule.get("src") else None,
            dst=f"{rule.get('dst')}/{rule['dst_len']}" if rule.get("dst") else None,
            iif=_optional_str(rule.get("iifname")),
            oif=_optional_str(rule.get("oifname")),
            fwmark=_optional_int(rule.get("fwmark")),
        )

    def to_wire(self) -> dict[str, JsonValue]:
        return asdict(self)  # the fields, in their order: the fence's fingerprint hashes this JSON

    def is_default(self) -> bool:
        """One of the rules every fresh namespace has, and nothing added to it."""
        added = (self.src, self.dst, self.iif, self.oif, self.fwmark)
        return (self.family, self.priority, self.table) in _DEFAULT_RULES and all(v is None for v in added)


def problems(
    links: Sequence[Link], addresses: Sequence[Address], routes: Sequence[Route], rules: Sequence[Rule], *,
    expect_anyip: bool,
) -> list[str]:  # fmt: skip
    """Every way the fence is not "only ``lo``" (setup.py rule 2); with ``expect_anyip``, a missing any-IP route."""
    found: list[str] = []
    for link in links:
        if link.name != "lo":
            found.append(f"unexpected link {link.name} ({link.kind or 'unknown kind'})")
        elif not link.up:
            found.append("lo is down")
    for route in routes:
        where = f"{route.type} {route.dst} table {route.table}"
        if route.gateway is not None or route.multipath:
            found.append(f"route with a gateway: {where}")
        elif route.oif not in (None, "lo"):
            found.append(f"route via {route.oif}: {where}")
        elif route.type not in _HARMLESS_ROUTE_NAMES:
            found.append(f"unexpected route: {where}")
    for rule in rules:
        if not rule.is_default():
            found.append(f"unexpected rule: {rule.to_wire()}")
    if expect_anyip:
        has_ipv6 = any(a.family == socket.AF_INET6 for a in addresses)
        for dst in ("0.0.0.0/0", "::/0") if has_ipv6 else ("0.0.0.0/0",):
            if not has_local_route(routes, dst):
                found.append(f"any-IP route local {dst} is missing")
    return found


def has_local_route(routes: Sequence[Route], dst: str) -> bool:
    return any(r.type == "local" and r.dst == dst for r in routes)
