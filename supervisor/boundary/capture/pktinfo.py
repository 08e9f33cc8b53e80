"""The address a UDP datagram was sent to, and replies sourced from it (``IP_PKTINFO``/``IPV6_PKTINFO``).

Any-IP capture makes every address local, so the DNS stub must answer from the address the agent queried. Kept
apart from :mod:`.dns_stub` so the launcher's capture setup can enable it without importing dnspython.
"""

from __future__ import annotations

import ipaddress
import socket
import struct

IP_PKTINFO = 8  # <linux/in.h>; Python 3.11 does not export it


def destination_from_ancdata(ancdata: list[tuple[int, int, bytes]]) -> str | None:
    """The destination address of a received datagram, from ``recvmsg`` ancillary data."""
    for level, kind, data in ancdata:
        if level == socket.IPPROTO_IP and kind == IP_PKTINFO and len(data) >= 12:
            return str(ipaddress.IPv4Address(data[8:12]))  # struct in_pktinfo: ifindex, spec_dst, addr
        if level == socket.IPPROTO_IPV6 and kind == socket.IPV6_PKTINFO and len(data) >= 20:
            return str(ipaddress.IPv6Address(data[:16]))  # struct in6_pktinfo: addr, ifindex
    return None


def source_ancdata(address: str) -> list[tuple[int, int, bytes]]:
    """Ancillary data for ``sendmsg`` that sources a reply from ``address`` (the address the agent queried)."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv4Address):
        return [(socket.IPPROTO_IP, IP_PKTINFO, struct.pack("=i4s4s", 0, ip.packed, b"\0" * 4))]
    return [(socket.IPPROTO_IPV6, socket.IPV6_PKTINFO, ip.packed + struct.pack("=I", 0))]


def enable_pktinfo(sock: socket.socket) -> None:
    """Ask the kernel for the destination address of each datagram (used by the capture setup)."""
    if sock.family == socket.AF_INET:
        sock.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
    else:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVPKTINFO, 1)
