"""Control's upstream side from the attacker's side: resolution through the test's own DNS server, every
internal answer refused before a connection is made, no rebinding window, timeouts, and dialling real test
hosts inside network namespaces this test creates. Never the machine's resolver, never an outside address."""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from ipaddress import IPv4Address, ip_address

import dns.message
import dns.rdatatype
import dns.rrset
import pytest
import trio

from supervisor.control.upstream import (
    UpstreamConfig,
    UpstreamError,
    UpstreamReason,
    check_allowed_ips,
    dial,
    parse_dns_server,
    resolve,
    system_dns_servers,
    vet_addresses,
)
from tests.netns_hosts import DnsServer, NetnsHost, netns_host_fixture, rebinding

R = UpstreamReason
_ = netns_host_fixture  # the ``netns_host`` fixture


def cfg_for(*servers: DnsServer, **kw: float) -> UpstreamConfig:
    return UpstreamConfig(dns_servers=[s.address for s in servers], **kw)


@contextmanager
def loopback_trap() -> Iterator[tuple[int, socket.socket]]:
    """A listener on 127.0.0.1: if anything connects to it, a refusal came too late."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        s.setblocking(False)
        yield s.getsockname()[1], s


def accepted_any(s: socket.socket) -> bool:
    try:
        conn, _ = s.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


# --- resolution ---------------------------------------------------------------------------------------------


async def test_resolve_a_and_aaaa_ipv4_first() -> None:
    with DnsServer({"api.test": ["2001:db8::5", "203.0.113.7", "203.0.113.3"]}) as dns:
        got = await resolve("API.test.", cfg_for(dns))
    assert set(got[:2]) == {ip_address("203.0.113.7"), ip_address("203.0.113.3")}
    assert got[2:] == [ip_address("2001:db8::5")]
    assert dns.count("api.test", "A") == 1 and dns.count("api.test", "AAAA") == 1


@pytest.mark.parametrize(
    ("rcode", "reason", "status"),
    [("NXDOMAIN", R.NXDOMAIN, 502), ("SERVFAIL", R.RESOLVE_FAILED, 502), ("REFUSED", R.RESOLVE_FAILED, 502)],
)
async def test_resolve_failures(rcode: str, reason: UpstreamReason, status: int) -> None:
    with DnsServer(rcodes={"bad.test": rcode}) as dns, pytest.raises(UpstreamError) as ei:
        await resolve("bad.test", cfg_for(dns))
    assert (ei.value.reason, ei.value.status) == (reason, status)


async def test_unknown_name_and_empty_answer() -> None:
    with DnsServer({"v6only.test": []}) as dns:
        with pytest.raises(UpstreamError) as ei:
            await resolve("nope.test", cfg_for(dns))
        assert ei.value.reason is R.NXDOMAIN
        with pytest.raises(UpstreamError) as ei:
            await resolve("v6only.test", cfg_for(dns))
        assert ei.value.reason is R.NO_ADDRESSES


async def test_resolve_timeout_when_the_server_never_answers() -> None:
    with DnsServer(rcodes={"slow.test": "DROP"}) as dns:
        t = time.monotonic()
        with pytest.raises(UpstreamError) as ei:
            await resolve("slow.test", cfg_for(dns, resolve_timeout=0.4))
        elapsed = time.monotonic() - t
    assert (ei.value.reason, ei.value.status) == (R.RESOLVE_TIMEOUT, 504)
    assert 0.35 < elapsed < 3


async def test_next_server_is_asked_when_the_first_fails() -> None:
    with DnsServer(rcodes={"api.test": "SERVFAIL"}) as first, DnsServer({"api.test": ["203.0.113.9"]}) as second:
        got = await resolve("api.test", cfg_for(first, second))
        assert got == [ip_address("203.0.113.9")]
        assert first.count("api.test") >= 1 and second.count("api.test") >= 1


async def test_silent_first_server_costs_only_its_share() -> None:
    with DnsServer(rcodes={"api.test": "DROP"}) as first, DnsServer({"api.test": ["203.0.113.9"]}) as second:
        t = time.monotonic()
        got = await resolve("api.test", cfg_for(first, second, resolve_timeout=1.0))
        assert got == [ip_address("203.0.113.9")]
        assert time.monotonic() - t < 0.9


async def test_closed_dns_port_fails_fast() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = time.monotonic()
    with pytest.raises(UpstreamError) as ei:
        await resolve("api.test", UpstreamConfig(dns_servers=[("127.0.0.1", port)], resolve_timeout=3))
    assert ei.value.reason is R.RESOLVE_FAILED
    assert time.monotonic() - t < 1.5


async def test_mismatched_and_garbage_udp_replies_are_ignored() -> None:
    """An off-path spoofer that races the real answer: wrong query id, wrong question, garbage bytes."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as srv:
        srv.bind(("127.0.0.1", 0))
        srv.settimeout(3)

        def respond() -> None:
            for _ in range(2):  # A and AAAA
                wire, peer = srv.recvfrom(4096)
                q = dns.message.from_wire(wire)
                srv.sendto(b"\x00garbage", peer)
                forged = dns.message.make_response(q)
                forged.id = (q.id + 1) % 65536
                forged.answer.append(dns.rrset.from_text(q.question[0].name, 0, "IN", "A", "127.0.0.1"))
                srv.sendto(forged.to_wire(), peer)
                other = dns.message.make_query("other.test", q.question[0].rdtype)
                other.id = q.id
                wrong_q = dns.message.make_response(other)
                srv.sendto(wrong_q.to_wire(), peer)
                real = dns.message.make_response(q)
                if q.question[0].rdtype == dns.rdatatype.A:
                    real.answer.append(dns.rrset.from_text(q.question[0].name, 0, "IN", "A", "203.0.113.1"))
                srv.sendto(real.to_wire(), peer)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, respond)
            got = await resolve("api.test", UpstreamConfig(dns_servers=[srv.getsockname()]))
    assert got == [ip_address("203.0.113.1")]


async def test_truncated_udp_answer_is_retried_over_tcp() -> None:
    with DnsServer({"big.test": ["203.0.113.1", "203.0.113.2"]}, truncate_udp=True) as dns:
        got = await resolve("big.test", cfg_for(dns))
        assert sorted(got) == [ip_address("203.0.113.1"), ip_address("203.0.113.2")]
        assert any(t == "tcp" for t, _, _ in dns.queries)


async def test_cname_chain_is_followed_within_the_answer() -> None:
    with DnsServer({"real.test": ["203.0.113.4"]}, cnames={"alias.test": "real.test"}) as dns:
        assert await resolve("alias.test", cfg_for(dns)) == [ip_address("203.0.113.4")]


@pytest.mark.parametrize("host", ["203.0.113.5", "[2001:db8::1]", "2001:db8::1", "127.0.0.1"])
async def test_literals_skip_dns(host: str) -> None:
    with DnsServer() as dns:
        got = await resolve(host, cfg_for(dns))
        assert got == [ip_address(host.strip("[]"))]
        assert dns.queries == []


@pytest.mark.parametrize(
    "host",
    [
        "2130706433",
        "0x7f.1",
        "0177.0.0.1",
        "127.1",
        "127.0.0.1.",
        "0x7f000001",
        "fe80::1%eth0",
        "a\\.b.test",
        "exa mple.test",
        "-bad.test",
        "a..b.test",
        "under_score..test",
        "x" * 64 + ".test",
        "a.test:443",
        "",
    ],
)
async def test_refused_hosts_never_reach_dns(host: str) -> None:
    with DnsServer({host: ["203.0.113.1"]} if host else {}) as dns:
        with pytest.raises(UpstreamError) as ei:
            await resolve(host, cfg_for(dns))
        assert (ei.value.reason, ei.value.status) == (R.INVALID_HOST, 400)
        assert dns.queries == []


async def test_idna_names_are_queried_in_ascii() -> None:
    with DnsServer({"xn--bcher-kva.test": ["203.0.113.8"]}) as dns:
        assert await resolve("b\u00fccher.test", cfg_for(dns)) == [ip_address("203.0.113.8")]


def test_parse_dns_server() -> None:
    assert parse_dns_server("10.0.0.2") == ("10.0.0.2", 53)
    assert parse_dns_server("127.0.0.1:5353") == ("127.0.0.1", 5353)
    assert parse_dns_server("::1") == ("::1", 53)
    assert parse_dns_server("[::1]:5300") == ("::1", 5300)
    for bad in ("dns.example", "10.0.0.2:0", "10.0.0.2:70000", "[::1", "[::1]x", "1.2.3.4:x"):
        with pytest.raises(ValueError):
            parse_dns_server(bad)


def test_system_dns_servers(tmp_path: pytest.TempPathFactory) -> None:
    path = tmp_path / "resolv.conf"  # type: ignore[operator]
    path.write_text("# c\nsearch cluster.local\nnameserver 10.96.0.10\nnameserver fe80::1%eth0\nnameserver junk\n")
    assert system_dns_servers(str(path)) == [("10.96.0.10", 53), ("fe80::1", 53)]
    assert system_dns_servers(str(path) + ".missing") == []


# --- vetting (pure) -------------------------------------------------------------------------------------------

A = ip_address

VET_CASES: list[tuple[str, list[str], dict[str, object], list[str] | UpstreamReason]] = [
    ("api.test", ["8.8.8.8"], {}, ["8.8.8.8"]),
    ("api.test", ["8.8.8.8", "2606:4700::1"], {}, ["8.8.8.8", "2606:4700::1"]),
    ("api.test", ["10.0.0.5"], {}, R.INTERNAL_ADDRESS),
    ("api.test", ["100.64.1.1"], {}, R.INTERNAL_ADDRESS),
    ("api.test", ["fd00::1"], {}, R.INTERNAL_ADDRESS),
    ("api.test", ["::ffff:10.0.0.5"], {}, R.INTERNAL_ADDRESS),
    ("api.test", ["64:ff9b::a00:5"], {}, R.INTERNAL_ADDRESS),
    ("api.test", ["2002:a00:5::1"], {}, R.INTERNAL_ADDRESS),
    ("api.test", ["224.0.0.1"], {}, R.INTERNAL_ADDRESS),
    ("api.test", ["240.0.0.1"], {}, R.INTERNAL_ADDRESS),
    ("api.test", ["127.0.0.1"], {}, R.ALWAYS_BLOCKED),
    ("api.test", ["0.0.0.0"], {}, R.ALWAYS_BLOCKED),
    ("api.test", ["::"], {}, R.ALWAYS_BLOCKED),
    ("api.test", ["::1"], {}, R.ALWAYS_BLOCKED),
    ("api.test", ["169.254.169.254"], {}, R.ALWAYS_BLOCKED),
    ("api.test", ["::ffff:169.254.169.254"], {}, R.ALWAYS_BLOCKED),
    ("api.test", ["::ffff:127.0.0.1"], {}, R.ALWAYS_BLOCKED),
    ("api.test", ["::127.0.0.1"], {}, R.ALWAYS_BLOCKED),
    ("api.test", ["64:ff9b::7f00:1"], {}, R.ALWAYS_BLOCKED),
    ("api.test", ["2002:7f00:1::1"], {}, R.ALWAYS_BLOCKED),
    ("api.test", ["2001:0:4136:e378:8000:63bf:80ff:fffe"], {}, R.ALWAYS_BLOCKED),
    ("api.test", ["fe80::1"], {}, R.ALWAYS_BLOCKED),
    # rebinding inside one answer: all or nothing
    ("api.test", ["8.8.8.8", "127.0.0.1"], {}, R.ALWAYS_BLOCKED),
    ("api.test", ["8.8.8.8", "10.0.0.1"], {}, R.INTERNAL_ADDRESS),
    ("api.test", ["8.8.8.8", "127.0.0.1"], {"strict": False}, ["8.8.8.8"]),
    ("api.test", ["127.0.0.1"], {"strict": False}, R.ALWAYS_BLOCKED),
    # named exactly: internal allowed, always-blocked still refused
    ("db.test", ["10.0.0.5"], {"host_named_exactly": True}, ["10.0.0.5"]),
    ("db.test", ["198.51.100.2"], {"host_named_exactly": True}, ["198.51.100.2"]),
    ("db.test", ["127.0.0.1"], {"host_named_exactly": True}, R.ALWAYS_BLOCKED),
    ("db.test", ["169.254.169.254"], {"host_named_exactly": True}, R.ALWAYS_BLOCKED),
    ("db.test", ["100.100.100.200"], {"host_named_exactly": True}, R.ALWAYS_BLOCKED),
    ("db.test", ["10.0.0.5"], {"host_named_exactly": True, "port": 6443}, R.CONTROL_PLANE_PORT),
    ("api.test", ["8.8.8.8"], {"port": 6443}, ["8.8.8.8"]),  # spec D10: not blocked in public-only mode
    # allowed_ips: a strict allowlist
    ("db.test", ["10.0.0.5"], {"allowed_ips": ["10.0.0.0/8"]}, ["10.0.0.5"]),
    ("db.test", ["::ffff:10.0.0.5"], {"allowed_ips": ["10.0.0.0/8"]}, ["::ffff:10.0.0.5"]),
    ("db.test", ["10.0.0.5"], {"allowed_ips": ["10.0.0.5"]}, ["10.0.0.5"]),
    ("db.test", ["10.0.0.6"], {"allowed_ips": ["10.0.0.5"]}, R.NOT_IN_ALLOWED_IPS),
    ("db.test", ["8.8.8.8"], {"allowed_ips": ["10.0.0.0/8"]}, R.NOT_IN_ALLOWED_IPS),
    ("db.test", ["10.0.0.5", "8.8.8.8"], {"allowed_ips": ["10.0.0.0/8"]}, R.NOT_IN_ALLOWED_IPS),
    ("db.test", ["10.0.0.5"], {"allowed_ips": ["10.0.0.0/8"], "port": 10250}, R.CONTROL_PLANE_PORT),
    ("db.test", ["10.0.0.5"], {"allowed_ips": ["0.0.0.0/0"]}, R.INVALID_ALLOWED_IPS),
    ("db.test", ["10.0.0.5"], {"allowed_ips": ["127.0.0.1"]}, R.INVALID_ALLOWED_IPS),
    ("db.test", ["10.0.0.5"], {"allowed_ips": ["::ffff:127.0.0.0/104"]}, R.INVALID_ALLOWED_IPS),
    ("db.test", ["10.0.0.5"], {"allowed_ips": ["not-an-ip"]}, R.INVALID_ALLOWED_IPS),
    # an IP literal host: implicitly allowed unless always-blocked
    ("10.0.0.5", ["10.0.0.5"], {}, ["10.0.0.5"]),
    ("127.0.0.1", ["127.0.0.1"], {}, R.ALWAYS_BLOCKED),
    ("::ffff:127.0.0.1", ["::ffff:127.0.0.1"], {}, R.ALWAYS_BLOCKED),
    ("10.0.0.5", ["10.0.0.5"], {"port": 2379}, R.CONTROL_PLANE_PORT),
]


@pytest.mark.parametrize(("host", "addrs", "kw", "expected"), VET_CASES)
def test_vet_addresses(
    host: str, addrs: list[str], kw: dict[str, object], expected: list[str] | UpstreamReason
) -> None:
    if isinstance(expected, UpstreamReason):
        with pytest.raises(UpstreamError) as ei:
            vet_addresses(host, [A(a) for a in addrs], **kw)  # type: ignore[arg-type]
        assert ei.value.reason is expected
        assert ei.value.status == 403
        assert ei.value.reason.ssrf
    else:
        assert vet_addresses(host, [A(a) for a in addrs], **kw) == [A(a) for a in expected]  # type: ignore[arg-type]


def test_check_allowed_ips_parses_bare_addresses_and_cidrs() -> None:
    nets = check_allowed_ips(["10.0.0.5", "192.168.0.0/16", "fd12::/48", "10.1.2.3/8"])
    assert [str(n) for n in nets] == ["10.0.0.5/32", "192.168.0.0/16", "fd12::/48", "10.0.0.0/8"]


# --- dial, refusals before any connection (loopback only) -------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "kw"),
    [
        (["127.0.0.1"], {}),
        (["127.0.0.1"], {"exact": True}),
        (["::ffff:127.0.0.1"], {"exact": True}),
        (["203.0.113.50", "127.0.0.1"], {"exact": True}),
        (["10.0.0.1"], {}),
        (["169.254.169.254"], {"exact": True}),
        (["0.0.0.0"], {"exact": True}),
    ],
)
async def test_dial_refuses_internal_answers_before_connecting(answer: list[str], kw: dict[str, bool]) -> None:
    with loopback_trap() as (port, trap), DnsServer({"evil.test": answer}) as dns:
        with pytest.raises(UpstreamError) as ei:
            await dial("evil.test", port, cfg_for(dns, connect_timeout=1), host_named_exactly=kw.get("exact", False))
        assert ei.value.reason in (R.ALWAYS_BLOCKED, R.INTERNAL_ADDRESS)
        await trio.sleep(0.05)
        assert not accepted_any(trap)


@pytest.mark.parametrize("spelling", ["2130706433", "0x7f.1", "0177.0.0.1", "127.1", "[::ffff:127.0.0.1]", "0.0.0.0"])
async def test_dial_refuses_numeric_spellings_of_loopback(spelling: str) -> None:
    with loopback_trap() as (port, trap), DnsServer() as dns:
        with pytest.raises(UpstreamError) as ei:
            await dial(spelling, port, cfg_for(dns, connect_timeout=1), host_named_exactly=True)
        assert ei.value.reason in (R.INVALID_HOST, R.ALWAYS_BLOCKED)
        assert dns.queries == []
        assert not accepted_any(trap)


async def test_invalid_allowed_ips_refuse_before_any_dns_query() -> None:
    with DnsServer({"db.test": ["10.0.0.5"]}) as dns:
        with pytest.raises(UpstreamError) as ei:
            await dial("db.test", 5432, cfg_for(dns), allowed_ips=["127.0.0.0/8"])
        assert ei.value.reason is R.INVALID_ALLOWED_IPS
        assert dns.queries == []


async def test_dial_rejects_bad_ports() -> None:
    with DnsServer({"a.test": ["203.0.113.1"]}) as dns:
        for port in (0, 65536, -1):
            with pytest.raises(UpstreamError) as ei:
                await dial("a.test", port, cfg_for(dns))
            assert ei.value.reason is R.INVALID_PORT


# --- dial, real test hosts in network namespaces ------------------------------------------------------------------


@asynccontextmanager
async def http_server(host: NetnsHost, port: int = 0) -> AsyncIterator[tuple[int, list[str]]]:
    """A minimal HTTP/1.0 server inside the test host; yields its port and the peers it served."""
    sock = host.listen(port, address="0.0.0.0")
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
    peers: list[str] = []

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            peers.append(stream.socket.getpeername()[0])
            head = b""
            while b"\r\n\r\n" not in head:
                data = await stream.receive_some(4096)
                if not data:
                    return
                head += data
            local = stream.socket.getsockname()[0]
            body = f"hello from {local}".encode()
            await stream.send_all(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handle, [listener])
        yield sock.getsockname()[1], peers
        nursery.cancel_scope.cancel()


async def http_get(stream: trio.SocketStream) -> bytes:
    async with stream:
        await stream.send_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
        out = b""
        while data := await stream.receive_some(4096):
            out += data
        return out


async def test_dial_named_test_host_and_talk_http(netns_host: NetnsHost) -> None:
    async with http_server(netns_host) as (port, peers):
        with DnsServer({"api.test": [netns_host.address]}) as dns:
            stream, addr = await dial("api.test", port, cfg_for(dns), host_named_exactly=True)
            assert addr == IPv4Address(netns_host.address)
            assert stream.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            reply = await http_get(stream)
    assert reply.startswith(b"HTTP/1.0 200 OK") and reply.endswith(f"hello from {netns_host.address}".encode())
    assert peers == [netns_host.gateway]


async def test_test_host_refused_unless_policy_names_it(netns_host: NetnsHost) -> None:
    """TEST-NET is internal: reachable only by exact host or allowed_ips."""
    async with http_server(netns_host) as (port, peers):
        with DnsServer({"api.test": [netns_host.address]}) as dns:
            with pytest.raises(UpstreamError) as ei:
                await dial("api.test", port, cfg_for(dns))
            assert ei.value.reason is R.INTERNAL_ADDRESS
            with pytest.raises(UpstreamError) as ei:
                await dial(
                    "api.test",
                    port,
                    cfg_for(dns),
                    allowed_ips=["203.0.113.0/24" if netns_host.address.startswith("198.") else "198.51.100.0/24"],
                )
            assert ei.value.reason is R.NOT_IN_ALLOWED_IPS
            stream, _ = await dial("api.test", port, cfg_for(dns), allowed_ips=[f"{netns_host.address}/32"])
            assert (await http_get(stream)).startswith(b"HTTP/1.0 200 OK")
        await trio.sleep(0.05)
    assert len(peers) == 1


async def test_rebinding_gets_no_window(netns_host: NetnsHost) -> None:
    """First answer: the test host; every later answer: 127.0.0.1. Each connection resolves once, dials what it
    vetted, and a second connection is refused on its own answer."""
    async with http_server(netns_host) as (port, peers):
        with loopback_trap() as (_, trap), DnsServer(sequences={"rebind.test": rebinding(netns_host.address)}) as dns:
            stream, addr = await dial("rebind.test", port, cfg_for(dns), host_named_exactly=True)
            assert addr == IPv4Address(netns_host.address)
            assert dns.count("rebind.test", "A") == 1
            assert (await http_get(stream)).startswith(b"HTTP/1.0 200 OK")
            with pytest.raises(UpstreamError) as ei:
                await dial("rebind.test", port, cfg_for(dns), host_named_exactly=True)
            assert ei.value.reason is R.ALWAYS_BLOCKED and ei.value.address == ip_address("127.0.0.1")
            assert dns.count("rebind.test", "A") == 2
            assert not accepted_any(trap)
    assert peers == [netns_host.gateway]


async def test_connect_timeout_to_a_blackholed_address(netns_host: NetnsHost) -> None:
    with DnsServer({"hole.test": [netns_host.blackhole]}) as dns:
        t = trio.current_time()
        with pytest.raises(UpstreamError) as ei:
            await dial("hole.test", 80, cfg_for(dns, connect_timeout=0.5), host_named_exactly=True)
        elapsed = trio.current_time() - t
    assert (ei.value.reason, ei.value.status) == (R.CONNECT_TIMEOUT, 504)
    assert 0.45 < elapsed < 2.0


async def test_connect_refused_by_the_test_host(netns_host: NetnsHost) -> None:
    with DnsServer({"closed.test": [netns_host.address]}) as dns, pytest.raises(UpstreamError) as ei:
        await dial("closed.test", 9, cfg_for(dns, connect_timeout=2), host_named_exactly=True)
    assert (ei.value.reason, ei.value.status) == (R.CONNECT_REFUSED, 502)


async def test_falls_through_to_the_next_vetted_address(netns_host: NetnsHost) -> None:
    async with http_server(netns_host) as (port, peers):
        answer = [netns_host.blackhole, netns_host.extra_address]
        with DnsServer({"multi.test": answer}) as dns:
            t = trio.current_time()
            stream, addr = await dial("multi.test", port, cfg_for(dns, connect_timeout=1.0), host_named_exactly=True)
            assert trio.current_time() - t < 0.9  # the blackhole got its share, not the whole budget
            assert addr == IPv4Address(netns_host.extra_address)
            assert (await http_get(stream)).endswith(f"hello from {netns_host.extra_address}".encode())
    assert len(peers) == 1


async def test_ip_literal_host_is_dialled_without_dns(netns_host: NetnsHost) -> None:
    async with http_server(netns_host) as (port, _peers):
        with DnsServer() as dns:
            stream, addr = await dial(netns_host.address, port, cfg_for(dns))
            assert addr == IPv4Address(netns_host.address) and dns.queries == []
            assert (await http_get(stream)).startswith(b"HTTP/1.0 200 OK")
