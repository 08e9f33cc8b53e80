"""The openshell contender: its policy, its refusing DNS, its upstream host, and the full path for real.

The last test starts the sandbox in dev mode with the bench's driver as its agent, moves bytes both ways
through boundary → mTLS → control → the upstream host, and checks that stop() leaves nothing behind. It
needs root (network namespaces, model R) and skips, saying so, without it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import dns.message
import dns.rcode
import pytest

from bench.contenders import BenchContext, ContenderUnavailable
from bench.harness import Upstream
from bench.openshell import PROXY, OpenShell, OpenShellProxyPod, RefusingDns, render_policy
from bench.procstat import start_time
from bench.remote import SYSTEM_PYTHON, client_copy
from bench.setup_peers import PEERS_VENV
from bench.wire import Direction
from supervisor.control.policy import BinaryIdentity, L4Request, compile_policy, decide_l4, load_policy_text
from tests.netns_hosts import NetnsHost, open_upstream_host, unavailable_reason

ADDRESS = "198.51.100.2"
PYTHON = "/usr/bin/python3.11"


@pytest.mark.parametrize(
    ("host", "port", "binary", "allowed"),
    [
        (ADDRESS, 9000, PYTHON, True),
        (ADDRESS, 9001, PYTHON, True),
        (ADDRESS, 9002, PYTHON, False),  # another port of the same host
        ("198.51.100.3", 9000, PYTHON, False),  # another address
        ("upstream.test", 9000, PYTHON, False),  # a name
        (ADDRESS, 9000, "/usr/bin/curl", False),  # another binary
        (ADDRESS, 9000, "/usr/bin/python3", False),  # the symlink: the boundary reports what exe points to
    ],
)
def test_policy_allows_the_driver_to_the_upstream_and_nothing_else(
    host: str, port: int, binary: str, allowed: bool
) -> None:
    policy = compile_policy(load_policy_text(render_policy(ADDRESS, [9001, 9000, 9001], PYTHON)))
    decision = decide_l4(policy, L4Request(host, port, BinaryIdentity(binary, None)))
    assert decision.allowed is allowed
    if allowed:
        assert decision.allowed_ips == (f"{ADDRESS}/32",)
        assert decision.tls_skip and not decision.l7  # the raw path the setup/bulk rows name, never terminated


def test_refusing_dns_refuses_and_counts() -> None:
    server = RefusingDns()
    try:
        query = dns.message.make_query("upstream.test", "A")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(5)
            sock.sendto(query.to_wire(), server.address)
            reply = dns.message.from_wire(sock.recv(65535))
        assert reply.id == query.id and reply.rcode() == dns.rcode.REFUSED and not reply.answer
        assert str(reply.question[0].name) == "upstream.test."
        assert server.queries == 1
    finally:
        server.close()


def test_without_an_upstream_host_it_is_skipped_with_the_reason(tmp_path: Path) -> None:
    ctx = BenchContext(tmp_path, PEERS_VENV, 4096, upstream_host_reason="needs root to create a network namespace")
    with pytest.raises(ContenderUnavailable, match="needs root"):
        OpenShell(ctx).start()


@pytest.fixture(scope="module")
def host() -> Iterator[NetnsHost]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    made = open_upstream_host()
    yield made
    made.close()


def test_upstream_host_is_routed_through_our_veth_only(host: NetnsHost) -> None:
    route = subprocess.run(["ip", "route", "get", host.address], capture_output=True, text=True, check=True).stdout
    assert f"dev {host.veth}" in route
    inside = subprocess.run(["ip", "-n", host.name, "route", "show"], capture_output=True, text=True, check=True)
    assert "default" not in inside.stdout  # the host can answer us and nobody else


def test_closed_host_leaves_no_namespace_or_link() -> None:
    if unavailable_reason():
        pytest.skip(str(unavailable_reason()))
    made = open_upstream_host()
    made.close()
    assert made.name not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    # the slot (and so the interface name) may already serve another process's new host: only ours must be gone
    link = subprocess.run(["ip", "-o", "link", "show", made.veth], capture_output=True, text=True)
    assert link.returncode != 0 or f"link-netns {made.name}" not in link.stdout, link.stdout


def test_full_path_moves_bytes_and_stop_leaves_nothing(host: NetnsHost, tmp_path: Path) -> None:
    if os.geteuid() != 0 or not SYSTEM_PYTHON.exists():
        pytest.skip("dev mode runs the agent under another uid here only as root, with /usr/bin/python3")
    upstream = Upstream(host)
    copy = client_copy()
    contender = OpenShell(BenchContext(tmp_path, PEERS_VENV, 4096, copy, upstream.bulk, upstream.echo, upstream.idle))
    try:
        assert contender.start() == PROXY
        driver = contender.client()
        assert driver is not None and driver.facts["uid"] != 0
        size = 3 * 1024 * 1024 + 1
        for direction in Direction:
            assert driver.bulk(PROXY, upstream.bulk, direction, size, timeout=30).size == size
        assert len(driver.setup_sequential(PROXY, upstream.echo, 5, timeout=10, budget=30).latencies) == 5
        hold = driver.open_idle(PROXY, upstream.idle, 5, 5, timeout=10, budget=30)
        assert (hold.opened, hold.errors) == (5, 0)
        hold.close()
        groups = contender.pid_groups()
        assert len(groups["control"]) == 1 and len(groups["boundary"]) == 1
        for pid in contender.pids():  # the daemons only: never the agent (the driver) nor what it runs
            assert Path(f"/proc/{pid}").stat().st_uid == 0
            assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] != str(SYSTEM_PYTHON).encode()
        seen = {pid: start_time(pid) for pid in contender.pids()}
    finally:
        contender.stop()
        upstream.stop()
        shutil.rmtree(copy)
    assert all(start_time(pid) != when for pid, when in seen.items()), "a sandbox process outlived stop()"
    events = [json.loads(line) for line in (tmp_path / "openshell" / "dev.log").read_text().splitlines()
              if line.startswith("{")]  # fmt: skip
    egress = [e for e in events if e.get("event") == "egress"]
    assert egress and all(e["decision"] == "allow" for e in egress)
    assert {e["destination"].rsplit(":", 1)[0] for e in egress} == {host.address}
    assert contender.dns_queries == 0
    contender.stop()  # a second stop is harmless


def test_proxy_pod_full_path_authenticates_moves_bytes_and_stop_leaves_nothing(host: NetnsHost, tmp_path: Path) -> None:
    """The proxy-pod row: the driver is the agent in its own namespace, dials control's listener with the token
    its proxy variables carry; there is no boundary. A CONNECT without the token is refused (407)."""
    if os.geteuid() != 0 or not SYSTEM_PYTHON.exists() or not shutil.which("nft"):
        pytest.skip("dev --topology proxy-pod needs root, nft and /usr/bin/python3")
    upstream = Upstream(host)
    copy = client_copy()
    contender = OpenShellProxyPod(
        BenchContext(tmp_path, PEERS_VENV, 4096, copy, upstream.bulk, upstream.echo, upstream.idle)
    )
    try:
        proxy = contender.start()
        assert proxy is not None and proxy != PROXY and proxy[0].startswith("169.254.")
        driver = contender.client()
        assert driver is not None and driver.facts["uid"] != 0 and driver.facts["proxy_authorization"] is True
        size = 1024 * 1024 + 1
        for direction in Direction:
            assert driver.bulk(proxy, upstream.bulk, direction, size, timeout=30).size == size
        assert len(driver.setup_sequential(proxy, upstream.echo, 5, timeout=10, budget=30).latencies) == 5
        # A client without the token (this test's own process, whose environment names no proxy) is refused.
        from bench.clients import TunnelRefused, open_tunnel

        with pytest.raises(TunnelRefused, match="407"):
            open_tunnel(proxy, upstream.echo, timeout=10).close()
        groups = contender.pid_groups()
        assert len(groups["control"]) == 1 and groups["boundary"] == [] and groups["launcher"] == []
        seen = {pid: start_time(pid) for pid in contender.pids()}
    finally:
        contender.stop()
        upstream.stop()
        shutil.rmtree(copy)
    assert all(start_time(pid) != when for pid, when in seen.items()), "a sandbox process outlived stop()"
    events = [json.loads(line) for line in (tmp_path / "openshell-proxy-pod" / "dev.log").read_text().splitlines()
              if line.startswith("{")]  # fmt: skip
    egress = [e for e in events if e.get("event") == "egress"]
    assert egress and all(e["decision"] == "allow" for e in egress)
    refused = [e for e in events if e.get("event") == "proxy.refused"]
    assert len(refused) == 1 and "token" in refused[0]["reason"], refused  # only the test's own, tokenless one
    (listening,) = [e for e in events if e.get("event") == "proxy.listening"]
    # the cap is above the full bench's largest idle scenario (10,000 held), so that row measures memory
    assert listening["max_connections"] == listening["per_client"] > 10_000, listening
    assert contender.dns_queries == 0
