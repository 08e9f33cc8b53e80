"""The bench's upstream host: a network namespace of its own, reached over a veth pair on TEST-NET addresses.

Why: the sandbox's control refuses loopback upstreams by design (docs/design.md "Always-blocked stays blocked"), so
the one upstream every contender reaches has to sit at an address that is not loopback — and the bench may
send packets to such an address only inside a namespace it created itself. This module creates exactly that
and nothing more:

* a namespace ``osbb-<pid>-<slot>`` with loopback up and one end of a veth pair (``eth0``) holding ``.2`` of
  a /29 out of 198.51.100.0/24 or 203.0.113.0/24 (TEST-NET-2/3, never routed on the internet);
* the other end (``osbb<slot>``) in the harness's namespace holding ``.1``: the only route to ``.2``;
* no forwarding in the host namespace, no default route there: the host can answer us and nobody else.

Slots are chosen under the same lock file and from the same pool as the tests' hosts
(``tests/netns_hosts.py``), skipping every network already in use, so a bench and a test suite running at
once never collide. ``close`` removes the veth (both ends) and the namespace; a host left behind by a
harness that was killed is removed the next time one is created.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

POOLS = (ipaddress.IPv4Network("198.51.100.0/24"), ipaddress.IPv4Network("203.0.113.0/24"))
SLOTS = [net for pool in POOLS for net in pool.subnets(new_prefix=29)]
LOCK_PATH = "/run/lock/openshell-sandbox-test-hosts.lock"  # shared with tests/netns_hosts.py
NAME_PATTERN = re.compile(r"^osbb-(\d+)-(\d+)$")
MTU = 65535  # like loopback's: the veth hop should cost as little as the loopback hop it replaces


def unavailable_reason() -> str | None:
    """Why no upstream host can be made here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root to create a network namespace for the upstream"
    if shutil.which("ip") is None:
        return "needs iproute2 (`ip`) to create a network namespace for the upstream"
    if not os.path.exists("/proc/self/ns/net"):
        return "this kernel has no network namespaces"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale() -> None:
    for line in _ip("netns", "list").stdout.splitlines():
        match = NAME_PATTERN.match(line.split()[0]) if line.strip() else None
        if match and not _alive(int(match.group(1))):
            _ip("link", "del", f"osbb{match.group(2)}", check=False)
            _ip("netns", "del", match.group(0), check=False)


def _networks_in_use() -> list[ipaddress.IPv4Network]:
    used: list[ipaddress.IPv4Network] = []
    for line in _ip("-o", "-4", "addr", "show").stdout.splitlines():
        if found := re.search(r"inet (\S+)", line):
            used.append(ipaddress.IPv4Interface(found.group(1)).network)
    for line in _ip("-4", "route", "show", "table", "all").stdout.splitlines():
        words = line.split()
        if not words:
            continue
        dest = words[1] if words[0] in ("blackhole", "local", "broadcast", "unreachable", "prohibit") else words[0]
        if dest != "default":
            with contextlib.suppress(ValueError, IndexError):
                used.append(ipaddress.IPv4Network(dest, strict=False))
    return used


@dataclass
class UpstreamHost:
    name: str  # the namespace
    veth: str  # our end of the pair
    gateway: str  # our end's address
    address: str  # the host's address: what every contender dials
    procs: list[subprocess.Popen[Any]] = field(default_factory=list)

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside the host's namespace; it is ended by ``close`` if still running."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.name, *argv], **kwargs)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs.clear()
        _ip("link", "del", self.veth, check=False)
        _ip("netns", "del", self.name, check=False)


def _create(slot: int) -> UpstreamHost:
    base = int(SLOTS[slot].network_address)
    gateway, address = (str(ipaddress.IPv4Address(base + i)) for i in (1, 2))
    host = UpstreamHost(f"osbb-{os.getpid()}-{slot}", f"osbb{slot}", gateway, address)
    ns = host.name
    try:
        _ip("netns", "add", ns)
        _ip("link", "add", host.veth, "mtu", str(MTU), "type", "veth", "peer", "name", "eth0", "mtu", str(MTU),
            "netns", ns)  # fmt: skip
        _ip("addr", "add", f"{gateway}/30", "dev", host.veth)
        _ip("link", "set", host.veth, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "addr", "add", f"{address}/30", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=0"], check=True,
                       capture_output=True, timeout=30)  # fmt: skip
    except BaseException:
        host.close()
        raise
    return host


def open_upstream_host() -> UpstreamHost:
    """A fresh host in a free TEST-NET /29; the caller must ``close`` it. Raises RuntimeError if none is free."""
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    os.makedirs(os.path.dirname(LOCK_PATH), exist_ok=True)
    with open(LOCK_PATH, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            _remove_stale()
            used = _networks_in_use()
            free = [i for i, net in enumerate(SLOTS) if not any(net.overlaps(u) for u in used)]
            if not free:
                raise RuntimeError("no free TEST-NET /29 left for the upstream host")
            return _create(free[0])
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
