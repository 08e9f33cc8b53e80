"""Mediated egress end to end in dev mode: real clients as the agent, a real upstream on a test host in a
network namespace, names answered by the test's own DNS server. Allowed and denied by policy, events asserted.
Nothing leaves the machine: the only upstream is the test host, the only resolver the test's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.netns_hosts import DnsServer, NetnsHost, open_test_host, require_netns

CLI = [sys.executable, "-m", "supervisor.cli"]
FILESERVER = Path(__file__).parent.parent / "http_fileserver.py"
PORT = 8000
OTHER_PORT = 8001


@dataclass
class World:
    host: NetnsHost
    dns: DnsServer
    policy: Path
    payload_sha256: str
    runtime: str

    def dev(self, script: str, *, timeout: float = 90) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
        result = subprocess.run(
            [*CLI, "dev", f"--policy={self.policy}", f"--dns-server={self.dns.address[0]}:{self.dns.address[1]}",
             "--", "sh", "-c", script],
            capture_output=True, text=True, timeout=timeout, env={**os.environ, "XDG_RUNTIME_DIR": self.runtime},
        )  # fmt: skip
        events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
        return result, [e for e in events if e.get("event") in ("egress", "egress.refused", "dns")]


POLICY = """\
version: 1
network_policies:
  test-api:
    name: the test API, for curl, python and git
    endpoints:
      - host: api.test
        port: {port}
        allowed_ips: ["{address}/32"]
    binaries:
      - path: /usr/bin/curl
      - path: /usr/bin/python3*
      - path: /usr/lib/git-core/git-remote-http
  curl-only:
    name: the second port, for curl alone
    endpoints:
      - host: api.test
        port: {other_port}
        allowed_ips: ["{address}/32"]
    binaries:
      - path: /usr/bin/curl
"""


def _serve_root(root: Path) -> str:
    (root / "hello.txt").write_text("hello from the test host\n")
    payload = os.urandom(3 * 1024 * 1024 + 17)
    (root / "blob.bin").write_bytes(payload)
    work = root / "work"
    work.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", str(work)], check=True)
    (work / "README").write_text("cloned through the sandbox\n")
    subprocess.run([*git, "-C", str(work), "add", "README"], check=True)
    subprocess.run([*git, "-C", str(work), "commit", "-qm", "first"], check=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(root / "repo.git")], check=True)
    subprocess.run(["git", "-C", str(root / "repo.git"), "update-server-info"], check=True)  # dumb HTTP
    subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
    return hashlib.sha256(payload).hexdigest()


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    require_netns()
    if os.geteuid() != 0:
        pytest.skip("dev mode runs the boundary in model R here (root)")
    for tool in ("curl", "git"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is needed as a real client")
    root = Path(tempfile.mkdtemp(prefix="osb-www-"))
    runtime = tempfile.mkdtemp(prefix="osr-", dir="/tmp")
    try:
        digest = _serve_root(root)
        with open_test_host() as host:
            servers = [
                host.popen([sys.executable, str(FILESERVER), host.address, str(port), str(root)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for port in (PORT, OTHER_PORT)
            ]  # fmt: skip
            with DnsServer({"api.test": [host.address], "other.test": [host.address]}) as dns:
                policy = root.parent / f"{root.name}-policy.yaml"
                policy.write_text(POLICY.format(port=PORT, other_port=OTHER_PORT, address=host.address))
                _wait_http(host.address, PORT)
                yield World(host, dns, policy, digest, runtime)
            for server in servers:
                server.kill()
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)
        Path(f"{root}-policy.yaml").unlink(missing_ok=True)


def _wait_http(address: str, port: int) -> None:
    import socket
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection((address, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("test HTTP server did not come up")


def _allowed(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("event") == "egress" and e.get("decision") == "allow"]


def _denied(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("event") == "egress" and e.get("decision") == "deny"]


def test_curl_through_the_proxy_plain_and_connect(world: World) -> None:
    url = f"http://api.test:{PORT}"
    result, events = world.dev(f"curl -sS -f {url}/hello.txt && curl -sS -f -p {url}/blob.bin | sha256sum")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "hello from the test host"
    assert lines[1].split()[0] == world.payload_sha256
    allowed = _allowed(events)
    kinds = sorted(e["capture"] for e in allowed)
    assert kinds == ["connect", "http-forward"]
    for event in allowed:
        assert event["binary"] == "/usr/bin/curl"
        assert event["rule"] == "test-api"
        assert event["resolved"] == world.host.address
        assert event["bytes_in"] > 0 and event["duration_ms"] > 0
    assert max(e["bytes_in"] for e in allowed) >= 3 * 1024 * 1024


def test_transparent_capture_resolves_through_control(world: World) -> None:
    """A client that ignores the proxy env: DNS goes to the stub, the connection is captured transparently."""
    result, events = world.dev(f"curl -sS -f --noproxy '*' http://api.test:{PORT}/hello.txt")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == "hello from the test host\n"
    allowed = _allowed(events)
    assert [e["capture"] for e in allowed] == ["transparent"]
    assert allowed[0]["name"] == "api.test" and allowed[0]["destination"].startswith(world.host.address)
    assert any(e.get("event") == "dns" and e.get("decision") == "answered" for e in events)


def test_python_urllib_and_git_clone(world: World) -> None:
    script = (
        'python3 -c "import urllib.request; print(urllib.request.urlopen('
        f"'http://api.test:{PORT}/hello.txt', timeout=10).read().decode().strip())\" && "
        f"cd /tmp && git clone -q http://api.test:{PORT}/repo.git clone-$$ && cat clone-$$/README && rm -rf clone-$$"
    )
    result, events = world.dev(script)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["hello from the test host", "cloned through the sandbox"]
    binaries = {e["binary"] for e in _allowed(events)}
    assert "/usr/lib/git-core/git-remote-http" in binaries
    assert any(b.startswith("/usr/bin/python3") for b in binaries)


def test_denials_from_the_agents_side(world: World) -> None:
    script = "; ".join([
        f"curl -s -o /dev/null -w '%{{http_code}}\\n' http://other.test:{PORT}/hello.txt",  # host not in policy
        f"curl -s -o /dev/null -w '%{{http_code}}\\n' -p http://other.test:{PORT}/hello.txt",  # CONNECT
        f"curl -s -m 5 --noproxy '*' http://{world.host.address}:{PORT}/hello.txt; echo direct=$?",  # IP literal
        f"python3 -c \"import urllib.request; urllib.request.urlopen('http://api.test:{OTHER_PORT}/hello.txt')\" "
        "2>&1 | grep -o 'HTTP Error 403' ",  # binary not allowed on that endpoint
        f"curl -s -m 5 --noproxy '*' http://{world.host.address}:22/; echo port22=$?",  # a port nobody allows
    ])  # fmt: skip
    result, events = world.dev(script)
    lines = result.stdout.splitlines()
    assert lines[0] == "403", result.stderr[-3000:]
    assert lines[1] in ("403", "000")
    assert lines[2].startswith("direct=") and lines[2] != "direct=0"
    assert lines[3] == "HTTP Error 403"
    assert lines[4].startswith("port22=") and lines[4] != "port22=0"
    denied = _denied(events)
    reasons = {e["reason"] for e in denied}
    assert "no-matching-endpoint" in reasons or "binary-not-allowed" in reasons
    assert any(e["destination"] == f"{world.host.address}:{PORT}" for e in denied), "the IP literal was decided"
    assert any(e["binary"].startswith("/usr/bin/python3") and e["reason"] == "binary-not-allowed" for e in denied)
    assert _allowed(events) == []


def test_dns_for_names_no_endpoint_allows_is_refused(world: World) -> None:
    before = world.dns.count("exfil.secret-data.example")
    script = (
        "python3 -c \"import socket\ntry:\n socket.getaddrinfo('exfil.secret-data.example', 80)\n"
        "except OSError as e:\n print('refused', e.errno)\""
    )
    result, events = world.dev(script)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("refused")
    assert world.dns.count("exfil.secret-data.example") == before, "the name must never reach a resolver"
    assert any(e.get("event") == "dns" and e.get("decision") == "refused" for e in events)
