"""Test hosts in network namespaces, and a DNS server answering from a dict: the one netns helper of the tests
and the bench (bench/harness.py takes its upstream host from here).

The tests' "internet" (docs/design.md "Testing"): every upstream a test dials lives in a network namespace the test
created itself, on TEST-NET addresses, and every name is answered by a DNS server the test runs. Nothing here
sends a packet anywhere else.

Test host (root only; ``require_netns()`` skips otherwise)::

    with open_test_host() as host:           # or the ``netns_host`` fixture
        sock = host.listen(8080)             # a listening socket created inside the host's namespace
        host.popen(["python3", "-m", "http.server", "--bind", host.address, "8000"])
        host.address                         # e.g. 198.51.100.2, reachable from the test's namespace
        host.extra_address                   # a second address of the same host (on its loopback)
        host.blackhole                       # routed into the host, silently dropped there: connect times out

Each host gets its own /29 out of 198.51.100.0/24 or 203.0.113.0/24 (``.1`` the test side of a veth pair,
``.2`` the host side, ``.5`` the blackhole, ``.6`` the extra address), chosen under a lock so that concurrent
test processes (and a bench beside them) never collide. Tear-down always runs: processes killed, veth and
namespace deleted. Hosts left behind by a killed process are removed the next time one is created.

The bench's upstream (``open_upstream_host()``; ``unavailable_reason()`` says why none can be made) is the same
host without a default route inside it — it can answer the harness and nobody else — and with loopback's MTU,
so that the veth hop costs as little as the loopback hop it replaces; it raises instead of skipping.

DNS server (no root needed)::

    with DnsServer({"api.test": ["198.51.100.2"]}, sequences={"rebind.test": rebinding("198.51.100.2")}) as dns:
        dns.address                          # ("127.0.0.1", port), UDP and TCP
        dns.count("rebind.test")             # how many queries that name got

``records`` answer every query the same; ``sequences`` answer the n-th query of a name and type with the
n-th list (the last one repeats) - the classic rebinding shape, public first and 127.0.0.1 next.
``rcodes`` force ``NXDOMAIN``/``SERVFAIL``/``REFUSED`` or ``DROP`` (no answer at all) per name; ``cnames``
alias one name to another; ``truncate_udp`` makes every UDP answer truncated so clients must retry over TCP.
Unknown names are NXDOMAIN.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import ipaddress
import os
import re
import select
import shutil
import socket
import struct
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdatatype
import dns.rrset
import pytest

__all__ = [
    "DnsServer", "NetnsHost", "NoFreeSlot", "netns_host_fixture", "open_test_host", "open_upstream_host",
    "rebinding", "require_netns", "unavailable_reason",
]  # fmt: skip

_POOLS = (ipaddress.IPv4Network("198.51.100.0/24"), ipaddress.IPv4Network("203.0.113.0/24"))
_SLOTS = [net for pool in _POOLS for net in pool.subnets(new_prefix=29)]
_LOCK_PATH = "/run/lock/openshell-sandbox-test-hosts.lock"
# osbt: ours; osbb: what bench/netns.py (merged into this module) named its hosts, still removed when stale
_NS_PATTERN = re.compile(r"^(osb[tb])-(\d+)-(\d+)$")
_CLONE_NEWNET = 0x40000000
LOOPBACK_MTU = 65535


class NoFreeSlot(RuntimeError):
    """Every TEST-NET /29 is in use."""


def unavailable_reason() -> str | None:
    """Why no host can be made here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "needs iproute2 (`ip`)"
    if not os.path.exists("/proc/self/ns/net"):
        return "no network namespace support"
    return None


def require_netns() -> None:
    """Skip the calling test, with the reason, unless network namespaces can be made here."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale() -> None:
    for line in _ip("netns", "list").stdout.splitlines():
        m = _NS_PATTERN.match(line.split()[0]) if line.strip() else None
        if m and not _pid_alive(int(m.group(2))):
            _ip("link", "del", f"{m.group(1)}{m.group(3)}", check=False)
            _ip("netns", "del", m.group(0), check=False)


def _used_networks() -> list[ipaddress.IPv4Network]:
    used = []
    for line in _ip("-o", "-4", "addr", "show").stdout.splitlines():
        m = re.search(r"inet (\S+)", line)
        if m:
            used.append(ipaddress.IPv4Interface(m.group(1)).network)
    for line in _ip("-4", "route", "show", "table", "all").stdout.splitlines():
        dest = line.split()[0] if line.split() else ""
        if dest in ("blackhole", "local", "broadcast", "unreachable", "prohibit"):
            dest = line.split()[1]
        with contextlib.suppress(ValueError):
            if dest != "default":
                used.append(ipaddress.IPv4Network(dest, strict=False))
    return used


_libc = ctypes.CDLL(None, use_errno=True)
_Socket = socket.socket  # NetnsHost.socket shadows the module name inside the class


def _in_netns(name: str, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on a fresh thread that entered namespace ``name`` (setns is per thread for CLONE_NEWNET)."""
    result: list[Any] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            fd = os.open(f"/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns({name}): {os.strerror(err)}")
            finally:
                os.close(fd)
            result.append(fn())
        except BaseException as exc:  # handed to the caller's thread
            error.append(exc)

    t = threading.Thread(target=target, name=f"setns-{name}")
    t.start()
    t.join()
    if error:
        raise error[0]
    return result[0]


@dataclass
class NetnsHost:
    name: str  # network namespace name
    veth: str  # root-side interface
    gateway: str  # the test side of the link
    address: str  # the host side: dial this
    extra_address: str  # a second address owned by the host
    blackhole: str  # routed into the host and dropped there
    _procs: list[subprocess.Popen[Any]] = field(default_factory=list)

    def socket(self, family: int = socket.AF_INET, type: int = socket.SOCK_STREAM) -> _Socket:
        """A socket that lives in the host's namespace (usable from this process, e.g. with trio)."""
        sock: _Socket = _in_netns(self.name, lambda: socket.socket(family, type))
        return sock

    def listen(self, port: int = 0, address: str = "0.0.0.0", backlog: int = 1024) -> _Socket:
        """A listening TCP socket inside the host; ``getsockname()[1]`` tells the port when 0 was asked."""
        sock = self.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(backlog)
        return sock

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside the host (``ip netns exec``); killed at tear-down."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.name, *argv], **kwargs)
        self._procs.append(proc)
        return proc

    def run(self, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        kwargs.setdefault("timeout", 30)
        return subprocess.run(["ip", "netns", "exec", self.name, *argv], **kwargs)

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        _ip("link", "del", self.veth, check=False)
        _ip("route", "del", f"{self.blackhole}/32", check=False)
        _ip("route", "del", f"{self.extra_address}/32", check=False)
        _ip("netns", "del", self.name, check=False)


def _create(slot: int, *, default_route: bool = True, mtu: int | None = None) -> NetnsHost:
    net = _SLOTS[slot]
    base = int(net.network_address)
    a = [str(ipaddress.IPv4Address(base + i)) for i in range(8)]
    host = NetnsHost(
        name=f"osbt-{os.getpid()}-{slot}",
        veth=f"osbt{slot}",
        gateway=a[1],
        address=a[2],
        extra_address=a[6],
        blackhole=a[5],
    )
    ns = host.name
    try:
        _ip("netns", "add", ns)
        sized = ("mtu", str(mtu)) if mtu is not None else ()
        _ip("link", "add", host.veth, *sized, "type", "veth", "peer", "name", "eth0", *sized, "netns", ns)
        _ip("addr", "add", f"{host.gateway}/30", "dev", host.veth)
        _ip("link", "set", host.veth, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "addr", "add", f"{host.address}/30", "dev", "eth0")
        _ip("-n", ns, "addr", "add", f"{host.extra_address}/32", "dev", "lo")
        _ip("-n", ns, "link", "set", "eth0", "up")
        if default_route:
            _ip("-n", ns, "route", "add", "default", "via", host.gateway)
        # No forwarding in the host: a packet for an address it does not own is dropped without an ICMP error.
        host.run(["sysctl", "-qw", "net.ipv4.ip_forward=0"], check=True)
        _ip("-n", ns, "route", "add", "blackhole", f"{host.blackhole}/32")
        _ip("route", "add", f"{host.blackhole}/32", "via", host.address, "dev", host.veth)
        _ip("route", "add", f"{host.extra_address}/32", "via", host.address, "dev", host.veth)
    except BaseException:
        host.close()
        raise
    return host


def open_host(*, default_route: bool = True, mtu: int | None = None) -> NetnsHost:
    """A fresh host in a free TEST-NET /29; the caller must ``close`` it. Raises ``RuntimeError`` with the reason
    when none can be made here, ``NoFreeSlot`` when every /29 is in use."""
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    os.makedirs(os.path.dirname(_LOCK_PATH), exist_ok=True)
    with open(_LOCK_PATH, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            _remove_stale()
            used = _used_networks()
            free = [i for i, net in enumerate(_SLOTS) if not any(net.overlaps(u) for u in used)]
            if not free:
                raise NoFreeSlot("no free TEST-NET /29 left for a host")
            return _create(free[0], default_route=default_route, mtu=mtu)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def open_upstream_host() -> NetnsHost:
    """The bench's upstream host (see the module doc); the caller must ``close`` it."""
    return open_host(default_route=False, mtu=LOOPBACK_MTU)


@contextlib.contextmanager
def open_test_host() -> Iterator[NetnsHost]:
    """A fresh test host; skips the test unless root with iproute2."""
    require_netns()
    try:
        host = open_host()
    except NoFreeSlot as exc:
        pytest.skip(str(exc))
    try:
        yield host
    finally:
        host.close()


@pytest.fixture(name="netns_host")
def netns_host_fixture() -> Iterator[NetnsHost]:
    """Fixture form of ``open_test_host``; import it into a test module to use it."""
    with open_test_host() as host:
        yield host


# --- DNS ------------------------------------------------------------------------------------------------------


def rebinding(first: str, then: str = "127.0.0.1") -> list[list[str]]:
    """A ``sequences`` entry: the first query gets ``first``, every later one ``then``."""
    return [[first], [then]]


def _norm(name: str) -> str:
    return name.lower().rstrip(".")


class DnsServer:
    """A tiny authoritative-looking DNS server on UDP and TCP, answering from dicts (see the module doc)."""

    def __init__(
        self,
        records: Mapping[str, Sequence[str]] | None = None,
        *,
        sequences: Mapping[str, Sequence[Sequence[str]]] | None = None,
        rcodes: Mapping[str, str] | None = None,
        cnames: Mapping[str, str] | None = None,
        truncate_udp: bool = False,
        ttl: int = 0,
        bind: str = "127.0.0.1",
        sock_factory: Callable[[int], socket.socket] | None = None,
    ) -> None:
        self.records = {_norm(k): list(v) for k, v in (records or {}).items()}
        self.sequences = {_norm(k): [list(x) for x in v] for k, v in (sequences or {}).items()}
        self.rcodes = {_norm(k): v.upper() for k, v in (rcodes or {}).items()}
        self.cnames = {_norm(k): _norm(v) for k, v in (cnames or {}).items()}
        self.truncate_udp = truncate_udp
        self.ttl = ttl
        self.queries: list[tuple[str, str, str]] = []  # (transport, name, type)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        make = sock_factory or (lambda kind: socket.socket(socket.AF_INET, kind))
        for _attempt in range(50):  # one port for both transports; an ephemeral port may be taken for the other
            self._tcp = make(socket.SOCK_STREAM)
            self._tcp.bind((bind, 0))
            port = self._tcp.getsockname()[1]
            self._udp = make(socket.SOCK_DGRAM)
            try:
                self._udp.bind((bind, port))
                break
            except OSError:
                self._tcp.close()
                self._udp.close()
        else:
            raise OSError("no port free for both UDP and TCP")
        self._tcp.listen(64)
        self.address: tuple[str, int] = (bind, port)
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="test-dns")

    def __enter__(self) -> DnsServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        self._wake_w.send(b"x")
        if self._thread.is_alive():
            self._thread.join(5)
        for s in (self._udp, self._tcp, self._wake_r, self._wake_w):
            s.close()

    def count(self, name: str, rdtype: str | None = None) -> int:
        with self._lock:
            return sum(1 for _, n, t in self.queries if n == _norm(name) and rdtype in (None, t))

    # -- answering --------------------------------------------------------------------------------------------

    def answer(self, wire: bytes, transport: str) -> bytes | None:
        try:
            query = dns.message.from_wire(wire)
        except Exception:
            return None
        if len(query.question) != 1:
            reply = dns.message.make_response(query)
            reply.set_rcode(dns.rcode.FORMERR)
            return reply.to_wire()
        q = query.question[0]
        name, rdtype = _norm(q.name.to_text()), dns.rdatatype.to_text(q.rdtype)
        with self._lock:
            nth = sum(1 for _, n, t in self.queries if n == name and t == rdtype)
            self.queries.append((transport, name, rdtype))
        reply = dns.message.make_response(query)
        reply.flags |= dns.flags.AA
        if transport == "udp" and self.truncate_udp:
            reply.flags |= dns.flags.TC
            return reply.to_wire()
        target = name
        while target in self.cnames:
            alias = self.cnames[target]
            reply.answer.append(dns.rrset.from_text(target + ".", self.ttl, "IN", "CNAME", alias + "."))
            target = alias
        forced = self.rcodes.get(target)
        if forced == "DROP":
            return None
        if forced is not None:
            reply.set_rcode(dns.rcode.from_text(forced))
            return reply.to_wire()
        if target in self.sequences:
            steps = self.sequences[target]
            addresses = steps[min(nth, len(steps) - 1)]
        elif target in self.records:
            addresses = self.records[target]
        else:
            reply.set_rcode(dns.rcode.NXDOMAIN)
            return reply.to_wire()
        family = {"A": 4, "AAAA": 6}.get(rdtype)
        chosen = [a for a in addresses if ipaddress.ip_address(a).version == family]
        if chosen:
            reply.answer.append(dns.rrset.from_text(target + ".", self.ttl, "IN", rdtype, *chosen))
        return reply.to_wire()

    def _serve(self) -> None:
        self._udp.setblocking(False)
        self._tcp.setblocking(False)
        while not self._stop.is_set():
            readable, _, _ = select.select([self._udp, self._tcp, self._wake_r], [], [])
            if self._udp in readable:
                with contextlib.suppress(OSError):
                    wire, peer = self._udp.recvfrom(65535)
                    out = self.answer(wire, "udp")
                    if out is not None:
                        self._udp.sendto(out, peer)
            if self._tcp in readable:
                with contextlib.suppress(OSError):
                    conn, _ = self._tcp.accept()
                    self._serve_tcp(conn)

    def _serve_tcp(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.setblocking(True)
            conn.settimeout(2)
            while not self._stop.is_set():
                head = _recv_exact(conn, 2)
                if head is None:
                    break
                body = _recv_exact(conn, struct.unpack("!H", head)[0])
                if body is None:
                    break
                out = self.answer(body, "tcp")
                if out is None:
                    break
                conn.sendall(struct.pack("!H", len(out)) + out)


def _recv_exact(conn: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)
