"""Capture setup inside the agent's network namespace — called in-process by the launcher (zygote).

Rules:

1. These functions run in the single-threaded launcher that already lives in the agent's fresh network
   namespace; they never enter or leave a namespace themselves. pyroute2 is used synchronously.
2. The fence is "only ``lo``": no link, no route and no rule may lead anywhere else. :func:`inspect` reads it
   all back, names every deviation and fingerprints the whole dump, so ``confirm`` and the periodic re-check
   compare one hash.
3. Capture is any-IP routing (docs/reference/boundary.md §5.4 B): ``local 0.0.0.0/0`` and ``local ::/0`` in table
   ``local`` make every destination an address of this namespace, so nothing is ever routed anywhere. A
   wildcard listener on port P accepts a connection to *any* address on P and the accepted socket's local
   address is the original destination; a port without a listener is refused by the kernel — a functional
   limit, never a leak. (The nftables redirect of §5.4 A is not implemented: nothing selected it, and the
   boundary reads the destination from the accepted socket's local address, which a redirect rewrites.)
4. Listeners are returned as raw fds: bound, ``listen()`` done, non-blocking, never ``SO_REUSEPORT``. On any
   failure everything created so far is closed before the error propagates.
5. :func:`probe` sends packets only to TEST-NET addresses and only after checking that the namespace has no
   link but ``lo``: a probe can land on a local listener or be refused, never leave.
"""

from __future__ import annotations

import errno
import hashlib
import ipaddress
import json
import os
import select
import shutil
import socket
import subprocess
from collections.abc import Iterable
from typing import TYPE_CHECKING

from supervisor.boundary.capture import _procnet
from supervisor.boundary.capture._sockdiag import NETLINK_SOCK_DIAG
from supervisor.boundary.capture.fence_dump import Address, Link, Route, Rule, has_local_route
from supervisor.boundary.capture.fence_dump import problems as fence_problems
from supervisor.boundary.capture.pktinfo import enable_pktinfo
from supervisor.boundary.capture.readback import FenceReadback
from supervisor.protocol.json_value import JsonValue

if TYPE_CHECKING:
    from pyroute2 import IPRoute

BACKLOG = 1024
DNS_PORT = 53
IP_TRANSPARENT = 19  # <linux/in.h>
IPV6_TRANSPARENT = 75  # <linux/in6.h>

RT_TABLE_LOCAL = 255  # <linux/rtnetlink.h>
_TEST_NETS = tuple(
    ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")
)


class CaptureSetupError(RuntimeError):
    """The capture could not be put in place; the namespace must not be used for the agent."""


# --- prepare -----------------------------------------------------------------------------------------------


def prepare(
    *,
    capture_ports: list[int],
    proxy_port: int = 3128,
) -> tuple[dict[str, int], dict[str, JsonValue]]:
    """Configure ``lo``, install the capture and bind the listeners; returns (name → fd, JSON report).

    Listener names: ``tcp4:<port>``/``tcp6:<port>`` (capture), ``proxy``, ``dns-udp4``/``dns-udp6``,
    ``dns-tcp4``/``dns-tcp6``; DNS listens on port 53 of every address.
    """
    ports = _check_ports(capture_ports, proxy_port)
    report: dict[str, JsonValue] = {"mode": "anyip", "capture_ports": list(ports), "proxy_port": proxy_port}
    from pyroute2 import IPRoute  # imported here: ~0.2 s, and only the launcher needs it

    with IPRoute() as ipr:
        lo = _loopback_up(ipr)
        _add_address(ipr, lo, "127.0.0.1", 8)
        ipv6 = _add_address(ipr, lo, "::1", 128)
        report["ipv6"] = ipv6
        routes_installed: list[JsonValue] = [*_install_anyip(ipr, lo, ipv6=ipv6)]
        report["routes_installed"] = routes_installed
    fds: dict[str, int] = {}
    try:
        for port in ports:
            fds[f"tcp4:{port}"] = _tcp_listener(socket.AF_INET, "0.0.0.0", port)
            if ipv6:
                fds[f"tcp6:{port}"] = _tcp_listener(socket.AF_INET6, "::", port)
        fds["proxy"] = _tcp_listener(socket.AF_INET, "127.0.0.1", proxy_port)
        fds["dns-udp4"] = _udp_listener(socket.AF_INET, "0.0.0.0", DNS_PORT)
        fds["dns-tcp4"] = _tcp_listener(socket.AF_INET, "0.0.0.0", DNS_PORT)
        if ipv6:
            fds["dns-udp6"] = _udp_listener(socket.AF_INET6, "::", DNS_PORT)
            fds["dns-tcp6"] = _tcp_listener(socket.AF_INET6, "::", DNS_PORT)
    except OSError as exc:
        close_all(fds)
        raise CaptureSetupError(f"binding capture listeners failed: {exc}") from exc
    listeners: dict[str, JsonValue] = {name: _describe_fd(fd) for name, fd in sorted(fds.items())}
    report["listeners"] = listeners
    try:  # the identity resolver's fast path (one kernel lookup instead of reading the TCP tables)
        fds["sock_diag"] = open_sock_diag()
    except OSError as exc:
        report["sock_diag"] = f"unavailable: {exc}"
    fence = FenceReadback.from_wire(inspect(expect_anyip=True))
    report.update(fingerprint=fence.fingerprint, ok=fence.ok, problems=list(fence.problems))
    if not fence.ok:
        close_all(fds)
        raise CaptureSetupError(f"fence check failed after setup: {list(fence.problems)}")
    return fds, report


def close_all(fds: dict[str, int]) -> None:
    for fd in fds.values():
        try:
            os.close(fd)
        except OSError:
            pass


def _check_ports(capture_ports: Iterable[int], proxy_port: int) -> list[int]:
    ports = sorted(set(capture_ports))
    if not ports:
        raise ValueError("at least one capture port is required")
    for port in [*ports, proxy_port]:
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError(f"invalid port {port!r}")
    reserved = {proxy_port, DNS_PORT}
    clash = reserved & set(ports)
    if clash:
        raise ValueError(f"capture ports {sorted(clash)} collide with the proxy or DNS listener")
    return ports


def _loopback_up(ipr: IPRoute) -> int:
    found = ipr.link_lookup(ifname="lo")
    if not found:
        raise CaptureSetupError("no loopback device in this namespace")
    index = int(found[0])
    ipr.link("set", index=index, state="up")
    return index


def _add_address(ipr: IPRoute, index: int, address: str, prefixlen: int) -> bool:
    """Add an address to ``lo``; ``False`` when the family is unavailable (IPv6 disabled)."""
    from pyroute2.netlink.exceptions import NetlinkError

    try:
        ipr.addr("add", index=index, address=address, prefixlen=prefixlen)
    except NetlinkError as exc:
        if exc.code == errno.EEXIST:
            return True
        if ":" in address and exc.code in (errno.EACCES, errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT, errno.EPERM):
            return False
        raise CaptureSetupError(f"adding {address}/{prefixlen} to lo failed: {exc}") from exc
    return True


def _install_anyip(ipr: IPRoute, lo: int, *, ipv6: bool) -> list[str]:
    from pyroute2.netlink.exceptions import NetlinkError

    installed: list[str] = []
    wanted = [(socket.AF_INET, "0.0.0.0/0")] + ([(socket.AF_INET6, "::/0")] if ipv6 else [])
    for family, dst in wanted:
        try:
            ipr.route(
                "add",
                family=family,
                dst=dst,
                type="local",
                table=RT_TABLE_LOCAL,
                oif=lo,
                scope=254 if family == socket.AF_INET else 0,
            )
        except NetlinkError as exc:
            if exc.code != errno.EEXIST:
                raise CaptureSetupError(f"installing local {dst} failed: {exc}") from exc
        installed.append(f"local {dst} dev lo table local")
    return installed


def _tcp_listener(family: int, host: str, port: int) -> int:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock.detach()


def _udp_listener(family: int, host: str, port: int) -> int:
    """A DNS stub socket. With any-IP the queried address is local by route but not assigned to a device, and
    the kernel sources a reply from such an address only for a transparent socket (FLOWI_FLAG_ANYSRC); hence
    IP_TRANSPARENT/IPV6_TRANSPARENT, which this namespace's owner may set."""
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.setsockopt(socket.IPPROTO_IPV6, IPV6_TRANSPARENT, 1)
        else:
            sock.setsockopt(socket.IPPROTO_IP, IP_TRANSPARENT, 1)
        enable_pktinfo(sock)
        sock.bind((host, port))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock.detach()


def _describe_fd(fd: int) -> str:
    sock = socket.socket(fileno=fd)
    try:
        host, port = sock.getsockname()[:2]
        kind = "udp" if sock.type == socket.SOCK_DGRAM else "tcp"
    finally:
        sock.detach()
    return f"{kind} [{host}]:{port}" if ":" in host else f"{kind} {host}:{port}"


def open_sock_diag() -> int:
    """A ``NETLINK_SOCK_DIAG`` socket of this namespace, for the boundary's identity resolver (passed out
    with SCM_RIGHTS like the listeners; it keeps answering for the namespace it was opened in)."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
    return sock.detach()


# --- inspect -----------------------------------------------------------------------------------------------


def inspect(*, expect_anyip: bool = False) -> dict[str, JsonValue]:
    """Read the fence back: links, addresses, routes (all tables), rules, and the nft ruleset if ``nft`` exists.

    ``ok`` is true only when the namespace holds nothing but an up ``lo``, no route leaves it, no rule was
    added, and (``expect_anyip``) both any-IP local routes are present.
    """
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        links = [Link.read(link) for link in ipr.get_links()]
        names = {entry.index: entry.name for entry in links}
        addresses = [Address.read(addr, names) for addr in ipr.get_addr()]
        routes = [Route.read(route, names) for route in ipr.route("dump", family=socket.AF_UNSPEC)]
        rules = [Rule.read(rule) for rule in ipr.get_rules(family=socket.AF_UNSPEC)]
    dump: dict[str, JsonValue] = {
        "links": [entry.to_wire() for entry in sorted(links, key=lambda e: e.name)],
        "addresses": sorted((entry.to_wire() for entry in addresses), key=json.dumps),
        "routes": sorted((entry.to_wire() for entry in routes), key=json.dumps),
        "rules": sorted((entry.to_wire() for entry in rules), key=json.dumps),
        "nft": _nft_ruleset(),
    }
    problems = fence_problems(links, addresses, routes, rules, expect_anyip=expect_anyip)
    canonical = json.dumps(dump, sort_keys=True, separators=(",", ":"))
    anyip: dict[str, JsonValue] = {
        "ipv4": has_local_route(routes, "0.0.0.0/0"),
        "ipv6": has_local_route(routes, "::/0"),
    }
    return {
        **dump,
        "anyip": anyip,
        "fingerprint": hashlib.sha256(canonical.encode()).hexdigest(),
        "ok": not problems,
        "problems": list(problems),
    }


def _nft_ruleset() -> str | None:
    nft = shutil.which("nft")
    if nft is None:
        return None
    # Stateless (-s): counters and quotas change with traffic, not with the fence. Not being able to run nft
    # (no fork under the pids limit, a timeout) is a failed read, never a different
    # fence: raised, so the fence watch retries instead of seeing a changed fingerprint.
    try:
        done = subprocess.run([nft, "-s", "list", "ruleset"], capture_output=True, text=True, timeout=10, check=False)
    except subprocess.TimeoutExpired as exc:
        raise OSError(errno.ETIMEDOUT, f"nft list ruleset: {exc}") from None
    return done.stdout if done.returncode == 0 else f"error: {done.stderr.strip()[:200]}"


# --- probe -------------------------------------------------------------------------------------------------


def probe(
    *,
    address: str = "192.0.2.1",
    port: int = 9,
    expect_listener_port: int | None = None,
    listeners: dict[str, int] | None = None,
    timeout: float = 1.0,
    proc_net: str = "/proc/self/net",
) -> dict[str, JsonValue]:
    """Connect from inside the namespace to a TEST-NET address and report where it landed. ``proc_net``: a
    ``/proc/<pid>/net`` of a process in this network namespace (the caller's own if its procfs shows it).

    ``captured`` means the connection was accepted by a listener of this namespace (its server end appears in
    this namespace's TCP table); ``local`` is that server end's address — with any-IP it equals the dialled
    address. With ``expect_listener_port`` the probe is ``ok`` only if it landed on that port; without, a
    refusal (no listener on ``port``) is ``ok`` too. A UDP datagram to ``port`` must be refused locally.
    Pass ``listeners`` (from :func:`prepare`) to accept and drop the probe's own connection before the fds are
    handed over, so that it never reaches whoever accepts agent connections; never pass them while the agent
    runs (an agent connection queued on the same listener could be taken). Probing a port without a listener
    needs no draining.
    """
    ip = ipaddress.ip_address(address)
    if not any(ip in net for net in _TEST_NETS):
        raise ValueError(f"probe targets must be TEST-NET addresses, not {address}")
    result: dict[str, JsonValue] = {
        "target": f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}",
        "captured": False,
        "refused": False,
        "local": None,
        "error": None,
    }
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        foreign = [str(link.get("ifname")) for link in ipr.get_links() if link.get("ifname") != "lo"]
    if foreign:
        result.update(ok=False, error=f"not probing: the namespace has links besides lo: {foreign}")
        return result
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    client = socket.socket(family, socket.SOCK_STREAM)
    try:
        client.settimeout(timeout)
        code = client.connect_ex((str(ip), port))
        if code == 0:
            mine = _procnet.normalise(client.getsockname())
            server = _server_end(mine, proc_net)
            result["captured"] = server is not None
            if server is not None:
                result["local"] = f"[{server[0]}]:{server[1]}" if ":" in server[0] else f"{server[0]}:{server[1]}"
                if listeners:
                    result["accepted_by"] = _drain(listeners, server, mine, timeout)
            landed_port = server[1] if server is not None else None
            ok = server is not None and expect_listener_port in (None, landed_port)
        else:
            refused = code == errno.ECONNREFUSED
            result["error"] = errno.errorcode.get(code, str(code))
            result["refused"] = refused
            ok = refused and expect_listener_port is None
        result["ok"] = ok
    finally:
        client.close()
    udp_refused, result["udp"] = _probe_udp(family, str(ip), port if port != DNS_PORT else 9, timeout)
    result["ok"] = ok and udp_refused
    return result


def _server_end(client_end: tuple[str, int], proc_net: str) -> tuple[str, int] | None:
    for row in _procnet.read_tables(proc_net):
        if row.remote == client_end and row.state in (_procnet.ESTABLISHED, _procnet.SYN_RECV):
            return row.local
    return None


def _drain(listeners: dict[str, int], server: tuple[str, int], client: tuple[str, int], timeout: float) -> str | None:
    """Accept the probe's connection on our own listener fd and close it; returns the listener's name."""
    for name, fd in listeners.items():
        sock = socket.socket(fileno=fd)
        try:
            if sock.type != socket.SOCK_STREAM:
                continue
            bound = sock.getsockname()[1]
            if bound != server[1]:
                continue
            ready, _, _ = select.select([sock], [], [], timeout)
            while ready:
                try:
                    conn, peer = sock.accept()
                except BlockingIOError:
                    break
                with conn:
                    if _procnet.normalise(peer) == client:
                        return name
                ready, _, _ = select.select([sock], [], [], 0)
        finally:
            sock.detach()
    return None


def _probe_udp(family: int, address: str, port: int, timeout: float) -> tuple[bool, dict[str, JsonValue]]:
    """Whether a datagram to ``port`` was refused, and the report of it."""
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect((address, port))
            sock.send(b"openshell-probe")
            sock.recv(64)
        except ConnectionRefusedError:
            return True, {"port": port, "refused": True, "error": "ECONNREFUSED"}
        except OSError as exc:
            return False, {"port": port, "refused": False, "error": errno.errorcode.get(exc.errno or 0, str(exc))}
        return False, {"port": port, "refused": False, "error": "answered"}
    finally:
        sock.close()
