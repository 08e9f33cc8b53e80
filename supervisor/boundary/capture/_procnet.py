"""``/proc/<pid>/net/tcp{,6}`` rows (the table of the network namespace ``pid`` lives in).

Addresses are hex, each 32-bit word in host (little-endian) order. IPv4-mapped IPv6 addresses are normalised
to IPv4 so that a dual-stack socket and an IPv4 socket compare equal (docs/reference/boundary.md §4.1 step 1).
"""

from __future__ import annotations

import ipaddress
import sys
from dataclasses import dataclass

ESTABLISHED = 0x01
SYN_RECV = 0x03
FIN_WAIT1 = 0x04
FIN_WAIT2 = 0x05
LISTEN = 0x0A
# states of the agent's end that still belong to an open socket: it may have half-closed (shutdown SHUT_WR)
# before the boundary resolved it. A socket that was close()d has no owner left (inode 0), so it never passes.
OPEN_CLIENT_STATES = frozenset({ESTABLISHED, FIN_WAIT1, FIN_WAIT2})

Endpoint = tuple[str, int]


@dataclass(frozen=True)
class TcpRow:
    local: Endpoint
    remote: Endpoint
    state: int
    uid: int
    inode: int


def normalise_ip(text: str) -> str:
    """Canonical text of an address: IPv4-mapped IPv6 → IPv4, zone dropped, IPv6 compressed."""
    ip = ipaddress.ip_address(text.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def normalise(endpoint: tuple[str, int] | tuple[str, int, int, int] | tuple[object, ...]) -> Endpoint:
    """``getsockname()``/``getpeername()`` of either family → (canonical address, port)."""
    if len(endpoint) < 2 or not isinstance(endpoint[0], str) or not isinstance(endpoint[1], int):
        raise ValueError(f"not an IP endpoint: {endpoint!r}")
    host, port = endpoint[0], endpoint[1]
    if not isinstance(host, str) or not isinstance(port, int):
        raise ValueError(f"not an IP endpoint: {endpoint!r}")
    return normalise_ip(host), port


def _decode_address(field: str) -> Endpoint:
    hex_ip, hex_port = field.split(":")
    raw = bytes.fromhex(hex_ip)
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address
    ip = ipaddress.IPv4Address(raw) if len(raw) == 4 else ipaddress.IPv6Address(raw)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), int(hex_port, 16)


def parse_table(text: str) -> list[TcpRow]:
    rows: list[TcpRow] = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        rows.append(
            TcpRow(
                local=_decode_address(fields[1]),
                remote=_decode_address(fields[2]),
                state=int(fields[3], 16),
                uid=int(fields[7]),
                inode=int(fields[9]),
            )
        )
    return rows


def _encode_address(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> str:
    raw = ip.packed
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return f"{raw.hex().upper()}:{port:04X}"


def _encodings(endpoint: Endpoint) -> dict[str, str]:
    """table name → how ``endpoint`` is spelled there (an IPv4 end appears mapped in ``tcp6``)."""
    ip = ipaddress.ip_address(endpoint[0])
    if isinstance(ip, ipaddress.IPv4Address):
        mapped = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + ip.packed)
        return {"tcp": _encode_address(ip, endpoint[1]), "tcp6": _encode_address(mapped, endpoint[1])}
    return {"tcp6": _encode_address(ip, endpoint[1])}


def find_rows(proc_dir: str, local: Endpoint, remote: Endpoint) -> list[TcpRow]:
    """The rows whose local and remote addresses are exactly these, without parsing the whole tables (a
    substring search per table: the cost that matters once thousands of connections are open)."""
    local_hex, remote_hex = _encodings(local), _encodings(remote)
    rows: list[TcpRow] = []
    for name in ("tcp", "tcp6"):
        if name not in local_hex or name not in remote_hex:
            continue
        try:
            with open(f"{proc_dir}/{name}", encoding="ascii") as handle:
                text = handle.read()
        except FileNotFoundError:
            if name == "tcp6":
                continue
            raise
        needle = f" {local_hex[name]} {remote_hex[name]} "
        start = text.find(needle)
        while start >= 0:
            line_start = text.rfind("\n", 0, start) + 1
            line_end = text.find("\n", start)
            rows += parse_table("header\n" + text[line_start : line_end if line_end >= 0 else len(text)])
            start = text.find(needle, start + 1)
    return rows


def read_tables(proc_dir: str) -> list[TcpRow]:
    """Both tables under ``proc_dir`` (``/proc/<pid>/net`` or ``/proc/self/net``); IPv6 may be absent."""
    rows: list[TcpRow] = []
    for name in ("tcp", "tcp6"):
        try:
            with open(f"{proc_dir}/{name}", encoding="ascii") as handle:
                text = handle.read()
        except FileNotFoundError:
            if name == "tcp6":
                continue
            raise
        rows += parse_table(text)
    return rows
