"""Control's upstream side: resolve a name with our own resolver, vet every address, dial exactly those.

Size (over ~500 lines on purpose): resolve, vet and dial are one path whose rules (below) hold only together.

Rules this file enforces (docs/reference/policy.md §3.5, §3.14; docs/design.md "Always-blocked stays blocked"):

1. **One resolution per connection, and the address dialled is an address vetted.** ``dial`` resolves once,
   vets the answer, and connects only to the vetted addresses, checking the connected peer. Nothing resolves
   the name again, so an answer that changes between "check" and "use" (DNS rebinding) changes nothing.
2. **Our resolver only.** Queries go to the configured servers (``--dns-server``), else to the nameservers of
   control's own ``/etc/resolv.conf``; never to the workload's resolver or hosts file (spec D8), never with
   search domains (a short name is queried as the absolute name it spells). Transport is trio-native UDP with
   TCP fallback on truncation, messages built and parsed by dnspython.
3. **Numeric host spellings** are refused (``addresses.parse_host_literal``); canonical literals skip DNS and
   are vetted like any answer.
4. **Vetting**, in the spec's precedence, on the *class* of each address (``addresses.classify``; IPv4 hidden
   in IPv6 counts as that IPv4):

   =====================  ==================================================================================
   ``allowed_ips`` given  every address must lie inside one of them and not be always-blocked (a strict
                          allowlist: public addresses outside it are refused too); entries reaching into
                          always-blocked space are invalid; control-plane ports refused
   host is an IP literal  the literal itself; refused only if always-blocked; control-plane ports refused
   host named exactly     internal addresses allowed, always-blocked refused, control-plane ports refused
   otherwise              every address must be public
   =====================  ==================================================================================

   Before any of that, an address of control itself (``local_net``: its interfaces and ``--self-address``) is
   refused as ``control-local``, whatever the policy names: never dial yourself.

   By default the check is all-or-nothing, as the spec asks for connections: one refused address refuses
   the connection, since an answer mixing a public and an internal address is itself the attack shape.
   ``strict=False`` filters instead (for policy DNS, §3.5.1). Always-blocked addresses are refused whatever
   the policy says.
5. **Errors carry a machine-readable reason** (``UpstreamReason``; the strings used in events) and the HTTP
   status a proxy answers with: 400 for a host we refuse to parse, 403 for SSRF refusals, 502 for resolution
   and connection failures, 504 for timeouts.
6. **One deadline per dial, set by the caller.** ``dial``/``connect_within`` take the absolute deadline of the
   whole attempt (resolve and connect; ``connect_timeout`` from now unless the caller says otherwise) and put
   it on one cancel scope; nothing inside adds a timeout of its own except DNS's ``resolve_timeout``, each
   address's connect takes an equal share of the time left, and the error says which budget ran out and at
   which step (``resolve-timeout`` for DNS's own budget, ``connect-timeout`` for the dial's).
"""

from __future__ import annotations

import ipaddress
import re
import socket
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdatatype
import trio

from supervisor.control.addresses import (
    IPAddress,
    Refused,
    blocked_in_network,
    classify,
    parse_host_literal,
)
from supervisor.protocol.upstream_reasons import UpstreamReason

__all__ = [
    "CONTROL_PLANE_PORTS",
    "UpstreamConfig",
    "UpstreamError",
    "UpstreamReason",
    "check_allowed_ips",
    "connect_to",
    "dial",
    "parse_dns_server",
    "resolve",
    "system_dns_servers",
    "vet_addresses",
]

CONTROL_PLANE_PORTS = frozenset({2379, 2380, 6443, 10250, 10255})  # etcd, kube-apiserver, kubelet
UDP_RETRY_INTERVAL = 1.0  # resend an unanswered UDP query this often, within the attempt's budget
EDNS_PAYLOAD = 1232  # the DNS flag-day size: large enough for most answers, small enough not to fragment

IPNetwork = IPv4Network | IPv6Network


class UpstreamError(Exception):
    def __init__(self, reason: UpstreamReason, detail: str, *, address: IPAddress | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.status = reason.status
        self.detail = detail
        self.address = address  # the address refused or that failed, when there is one


@dataclass
class UpstreamConfig:
    dns_servers: list[tuple[str, int]] = field(default_factory=list)  # empty: control's /etc/resolv.conf
    connect_timeout: float = 10.0
    resolve_timeout: float = 5.0
    idle_timeout: float = 300.0
    # control's own addresses (``local_net.LocalNetwork.is_local``): never dialled, whatever the policy says
    is_local: Callable[[IPAddress], bool] = field(default=lambda _addr: False)
    # whether control can reach IPv6 destinations (``local_net.LocalNetwork.ipv6_egress``)
    ipv6_egress: Callable[[], bool] = field(default=lambda: True)


def parse_dns_server(text: str) -> tuple[str, int]:
    """``ADDR[:PORT]`` as given to ``--dns-server``: ``10.0.0.2``, ``10.0.0.2:5353``, ``::1``, ``[::1]:53``."""
    host, port = text, 53
    if text.startswith("["):
        end = text.find("]")
        host, rest = text[1:end], text[end + 1 :]
        if end < 0 or (rest and not rest.startswith(":")):
            raise ValueError(f"invalid DNS server {text!r}")
        port = int(rest[1:]) if rest else 53
    elif text.count(":") == 1:
        host, _, p = text.partition(":")
        port = int(p)
    addr = ipaddress.ip_address(host)  # a name here would need a resolver to find the resolver
    if not 0 < port < 65536:
        raise ValueError(f"invalid DNS server port in {text!r}")
    return str(addr), port


def system_dns_servers(path: str = "/etc/resolv.conf") -> list[tuple[str, int]]:
    """The ``nameserver`` lines of control's own resolv.conf (zone ids dropped)."""
    servers: list[tuple[str, int]] = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return servers
    for line in lines:
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver":
            try:
                servers.append((str(ipaddress.ip_address(words[1].split("%")[0])), 53))
            except ValueError:
                continue
    return servers


# --- resolution ------------------------------------------------------------------------------------------------

_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")


def _dns_name(host: str) -> dns.name.Name:
    """The absolute DNS name for ``host``: one trailing dot dropped, lower-cased, IDNA for non-ASCII."""
    text = host[:-1] if host.endswith(".") else host
    if not text.isascii():
        try:
            text = text.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise UpstreamError(UpstreamReason.INVALID_HOST, f"{host!r} is not a valid DNS name") from exc
    text = text.lower()
    labels = text.split(".")
    if len(text) > 253 or not all(_LABEL.match(label) for label in labels):
        raise UpstreamError(UpstreamReason.INVALID_HOST, f"{host!r} is not a valid DNS name")
    return dns.name.from_text(text)


@dataclass
class _Lookup:
    addresses: list[IPAddress] = field(default_factory=list)
    nxdomain: bool = False
    failure: str | None = None  # set when no server gave a usable answer
    timed_out: bool = False


async def _receive_exact(stream: trio.SocketStream, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = await stream.receive_some(n - len(buf))
        if not chunk:
            raise OSError("DNS server closed the TCP connection")
        buf += chunk
    return bytes(buf)


def _family(server: tuple[str, int]) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in server[0] else socket.AF_INET


async def _query_tcp(query: dns.message.Message, server: tuple[str, int]) -> dns.message.Message:
    sock = trio.socket.socket(_family(server), socket.SOCK_STREAM)
    try:
        await sock.connect(server)
    except BaseException:
        sock.close()
        raise
    async with trio.SocketStream(sock) as stream:
        wire = query.to_wire()
        await stream.send_all(struct.pack("!H", len(wire)) + wire)
        (size,) = struct.unpack("!H", await _receive_exact(stream, 2))
        reply = dns.message.from_wire(await _receive_exact(stream, size))
    if not query.is_response(reply):
        raise OSError("TCP answer does not match the query")
    return reply


async def _query_udp(query: dns.message.Message, server: tuple[str, int]) -> dns.message.Message:
    wire = query.to_wire()
    with trio.socket.socket(_family(server), socket.SOCK_DGRAM) as sock:
        await sock.connect(server)  # the kernel drops datagrams from any other source
        while True:
            await sock.send(wire)
            with trio.move_on_after(UDP_RETRY_INTERVAL):
                while True:
                    data = await sock.recv(65535)
                    try:
                        reply = dns.message.from_wire(data)
                    except dns.exception.DNSException:
                        continue  # garbage is not an answer; keep waiting for one
                    if query.is_response(reply):
                        return reply


async def _ask(name: dns.name.Name, rdtype: dns.rdatatype.RdataType, server: tuple[str, int]) -> dns.message.Message:
    query = dns.message.make_query(name, rdtype, use_edns=0, payload=EDNS_PAYLOAD)
    reply = await _query_udp(query, server)
    if reply.flags & dns.flags.TC:
        reply = await _query_tcp(query, server)
    return reply


def _share_of_time_left(attempts_left: int) -> float | None:
    """An equal share of the time to the caller's deadline, or None when this is the last attempt or no deadline
    is set (the caller's own scope then bounds it)."""
    deadline = trio.current_effective_deadline()
    if attempts_left <= 1 or deadline == float("inf"):
        return None
    return max(0.0, (deadline - trio.current_time()) / attempts_left)


async def _lookup(
    name: dns.name.Name, rdtype: dns.rdatatype.RdataType, servers: Sequence[tuple[str, int]], out: _Lookup
) -> None:
    """Ask each server in turn until one answers NOERROR or NXDOMAIN; fills ``out`` as it goes, so that what was
    learnt survives the caller's deadline."""
    problems: list[str] = []
    out.failure = "no DNS server answered"
    for i, server in enumerate(servers):
        where = f"{server[0]}:{server[1]}"
        share = _share_of_time_left(len(servers) - i)
        try:
            with trio.move_on_after(share if share is not None else float("inf")) as scope:
                reply = await _ask(name, rdtype, server)
        except (OSError, dns.exception.DNSException) as exc:
            problems.append(f"{where}: {exc}")
            out.failure = "; ".join(problems)
            continue
        if scope.cancelled_caught:
            problems.append(f"{where} timed out")
            out.failure = "; ".join(problems)
            continue
        rcode = reply.rcode()
        if rcode == dns.rcode.NXDOMAIN:
            out.nxdomain, out.failure = True, None
            return
        if rcode != dns.rcode.NOERROR or not isinstance(reply, dns.message.QueryMessage):
            problems.append(f"{where} answered {dns.rcode.to_text(rcode)}")
            out.failure = "; ".join(problems)
            continue
        try:
            chain = reply.resolve_chaining()
        except dns.exception.DNSException as exc:
            problems.append(f"{where}: {exc}")
            out.failure = "; ".join(problems)
            continue
        if chain.answer is not None:
            out.addresses = [ipaddress.ip_address(rdata.to_text()) for rdata in chain.answer]
        out.failure = None
        return


async def resolve(host: str, cfg: UpstreamConfig) -> list[IPAddress]:
    """A and AAAA for ``host`` (IPv4 first, answer order kept), or the literal itself. Raises UpstreamError."""
    literal = parse_host_literal(host)
    if isinstance(literal, Refused):
        seen = f" (a client would dial {literal.would_dial})" if literal.would_dial else ""
        raise UpstreamError(UpstreamReason.INVALID_HOST, f"{host!r} refused: {literal.reason}{seen}")
    if literal is not None:
        return [literal]
    name = _dns_name(host)
    servers = cfg.dns_servers or system_dns_servers()
    if not servers:
        raise UpstreamError(UpstreamReason.RESOLVE_FAILED, f"no DNS server configured to resolve {host}")
    v4, v6 = _Lookup(), _Lookup()

    async def one(rdtype: dns.rdatatype.RdataType, out: _Lookup) -> None:
        with trio.move_on_after(cfg.resolve_timeout) as scope:
            await _lookup(name, rdtype, servers, out)
        out.timed_out = scope.cancelled_caught

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, dns.rdatatype.A, v4)
        nursery.start_soon(one, dns.rdatatype.AAAA, v6)
    addresses = list(dict.fromkeys([*v4.addresses, *v6.addresses]))
    if addresses:
        return addresses
    if v4.nxdomain or v6.nxdomain:
        raise UpstreamError(UpstreamReason.NXDOMAIN, f"{host} does not exist (NXDOMAIN)")
    failed = [r for r in (v4, v6) if r.failure is not None]
    if not failed:
        raise UpstreamError(UpstreamReason.NO_ADDRESSES, f"{host} has no A or AAAA records")
    reason = UpstreamReason.RESOLVE_TIMEOUT if all(r.timed_out for r in failed) else UpstreamReason.RESOLVE_FAILED
    detail = "; ".join(dict.fromkeys(r.failure or "" for r in failed))
    if reason is UpstreamReason.RESOLVE_TIMEOUT:
        detail = f"no answer within {cfg.resolve_timeout:g}s ({detail})"
    raise UpstreamError(reason, f"resolving {host} failed: {detail}")


# --- vetting ---------------------------------------------------------------------------------------------------


def check_allowed_ips(entries: Iterable[str | IPNetwork]) -> list[IPNetwork]:
    """Parse ``allowed_ips`` (CIDR or bare address); refuse entries that reach into always-blocked space."""
    nets: list[IPNetwork] = []
    for entry in entries:
        try:
            net = entry if isinstance(entry, IPv4Network | IPv6Network) else ipaddress.ip_network(entry, strict=False)
        except ValueError as exc:
            raise UpstreamError(UpstreamReason.INVALID_ALLOWED_IPS, f"allowed_ips entry {entry!r}: {exc}") from exc
        if (blocked := blocked_in_network(net)) is not None:  # the same answer as policy validation's
            raise UpstreamError(
                UpstreamReason.INVALID_ALLOWED_IPS,
                f"allowed_ips entry {net} covers always-blocked {blocked.describe()}",
            )
        nets.append(net)
    return nets


def _inside(addr: IPAddress, canonical: IPAddress, nets: Sequence[IPNetwork]) -> bool:
    """Inside some allowed network, as dialled or as the IPv4 it carries."""
    for net in nets:
        for a in (addr, canonical):
            if isinstance(net, IPv4Network) and isinstance(a, IPv4Address) and a in net:
                return True
            if isinstance(net, IPv6Network) and isinstance(a, IPv6Address) and a in net:
                return True
    return False


def vet_addresses(
    host: str,
    addrs: Sequence[IPAddress],
    *,
    allowed_ips: Iterable[str | IPNetwork] = (),
    host_named_exactly: bool = False,
    port: int | None = None,
    strict: bool = True,
    is_local: Callable[[IPAddress], bool] | None = None,
) -> list[IPAddress]:
    """The addresses of ``host`` that may be dialled (rule 4). Raises UpstreamError when the connection is refused.
    ``is_local`` says which addresses are control's own: refused before anything the policy says."""
    nets = check_allowed_ips(allowed_ips)
    literal = isinstance(parse_host_literal(host), IPv4Address | IPv6Address)
    if (nets or literal or host_named_exactly) and port in CONTROL_PLANE_PORTS:
        raise UpstreamError(UpstreamReason.CONTROL_PLANE_PORT, f"port {port} is a blocked control-plane port")
    survivors: list[IPAddress] = []
    refusals: list[UpstreamError] = []
    for addr in addrs:
        c = classify(addr)
        if c.always_blocked:
            refusals.append(
                UpstreamError(
                    UpstreamReason.ALWAYS_BLOCKED,
                    f"{host} resolves to {c.cls} address {addr}, always refused",
                    address=addr,
                )
            )
        elif is_local is not None and (is_local(addr) or is_local(c.address)):
            refusals.append(
                UpstreamError(
                    UpstreamReason.CONTROL_LOCAL,
                    f"{addr} is an address of control itself: never dialled"
                    if literal
                    else f"{host} resolves to {addr}, an address of control itself: never dialled",
                    address=addr,
                )
            )
        elif nets and not _inside(addr, c.address, nets):
            refusals.append(
                UpstreamError(
                    UpstreamReason.NOT_IN_ALLOWED_IPS, f"{host} resolves to {addr}, outside allowed_ips", address=addr
                )
            )
        elif not (nets or literal or host_named_exactly) and c.internal:
            refusals.append(
                UpstreamError(
                    UpstreamReason.INTERNAL_ADDRESS,
                    f"{host} resolves to internal address {addr} ({c.cls}), connection rejected",
                    address=addr,
                )
            )
        else:
            survivors.append(addr)
    if refusals and (strict or not survivors):
        blocked = [r for r in refusals if r.reason in (UpstreamReason.ALWAYS_BLOCKED, UpstreamReason.CONTROL_LOCAL)]
        raise (blocked or refusals)[0]
    if not survivors:
        raise UpstreamError(UpstreamReason.NO_ADDRESSES, f"{host} has no addresses")
    return survivors


# --- connecting ------------------------------------------------------------------------------------------------


def _dial_form(addr: IPAddress) -> IPAddress:
    """IPv4-mapped IPv6 is dialled as the IPv4 it is (same packets, no dependency on dual-stack sockets)."""
    if isinstance(addr, IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


async def connect_to(addresses: Sequence[IPAddress], port: int) -> tuple[trio.SocketStream, IPAddress]:
    """Connect to the first of ``addresses`` that answers, in order.

    The caller's cancel scope bounds it (see :func:`connect_within`): the time left until the effective deadline
    is shared equally between the addresses still to try. Only these addresses are ever dialled, and the
    connected peer is checked.
    """
    if not 0 < port < 65536:
        raise UpstreamError(UpstreamReason.INVALID_PORT, f"port {port} out of range")
    last: UpstreamError | None = None
    for i, addr in enumerate(addresses):
        share = _share_of_time_left(len(addresses) - i)
        target = _dial_form(addr)
        family = socket.AF_INET if isinstance(target, IPv4Address) else socket.AF_INET6
        sock = trio.socket.socket(family, socket.SOCK_STREAM)
        try:
            with trio.move_on_after(share if share is not None else float("inf")) as scope:
                await sock.connect((str(target), port))
            if scope.cancelled_caught:
                raise UpstreamError(
                    UpstreamReason.CONNECT_TIMEOUT, f"connect to {target}:{port} timed out", address=addr
                )
            peer = ipaddress.ip_address(sock.getpeername()[0])
            if _dial_form(peer) != target:
                raise UpstreamError(UpstreamReason.CONNECT_FAILED, f"connected to {peer}, not {target}", address=addr)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except UpstreamError as exc:
            sock.close()
            last = exc
            continue
        except ConnectionRefusedError:
            sock.close()
            last = UpstreamError(
                UpstreamReason.CONNECT_REFUSED, f"{target}:{port} refused the connection", address=addr
            )
            continue
        except OSError as exc:
            sock.close()
            last = UpstreamError(UpstreamReason.CONNECT_FAILED, f"connect to {target}:{port}: {exc}", address=addr)
            continue
        except BaseException:
            sock.close()
            raise
        return trio.SocketStream(sock), addr
    raise last or UpstreamError(UpstreamReason.NO_ADDRESSES, "no address to connect to")


def _out_of_time(host: str, port: int, budget: float, step: str, address: IPAddress | None) -> UpstreamError:
    return UpstreamError(
        UpstreamReason.CONNECT_TIMEOUT,
        f"no connection to {host}:{port} within the dial's {budget:.3g}s budget (connect_timeout): it ran out {step}",
        address=address,
    )


async def connect_within(
    host: str, addresses: Sequence[IPAddress], port: int, *, deadline: float
) -> tuple[trio.SocketStream, IPAddress]:
    """:func:`connect_to` under the caller's ``deadline`` (trio time); running out of it is ``connect-timeout``
    naming the addresses tried (``host`` is what the connection is for, for the message)."""
    budget = max(0.0, deadline - trio.current_time())
    with trio.CancelScope(deadline=deadline):
        return await connect_to(addresses, port)
    step = f"connecting to {', '.join(map(str, addresses))}"
    raise _out_of_time(host, port, budget, step, addresses[-1] if addresses else None)


async def dial(
    host: str,
    port: int,
    cfg: UpstreamConfig,
    *,
    deadline: float | None = None,
    allowed_ips: Iterable[str | IPNetwork] = (),
    host_named_exactly: bool = False,
) -> tuple[trio.SocketStream, IPAddress]:
    """Resolve once, vet, connect to a vetted address. Returns the stream and the address it is connected to.

    ``deadline`` (trio time; ``cfg.connect_timeout`` from now by default) bounds the whole dial, resolution
    included (rule 6)."""
    if not 0 < port < 65536:
        raise UpstreamError(UpstreamReason.INVALID_PORT, f"port {port} out of range")
    nets = check_allowed_ips(allowed_ips)  # an invalid policy entry refuses before any DNS traffic
    if deadline is None:
        deadline = trio.current_time() + cfg.connect_timeout
    budget = max(0.0, deadline - trio.current_time())
    step, vetted = f"resolving {host}", []
    with trio.CancelScope(deadline=deadline):
        addresses = await resolve(host, cfg)
        vetted = vet_addresses(
            host, addresses, allowed_ips=nets, host_named_exactly=host_named_exactly, port=port, is_local=cfg.is_local
        )
        if not cfg.ipv6_egress():  # no route for IPv6: try the IPv4 addresses only, when there are any
            vetted = [a for a in vetted if _dial_form(a).version == 4] or vetted
        step = f"connecting to {', '.join(map(str, vetted))}"
        return await connect_to(vetted, port)
    raise _out_of_time(host, port, budget, step, vetted[-1] if vetted else None)
