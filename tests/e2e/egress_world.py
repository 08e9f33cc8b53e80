"""Shared e2e fixture for mediated egress: a test host (netns) serving files on two ports, the test's own DNS
server, and a policy allowing ``api.test`` on both ports (the second for curl alone). ``world.dev(script)`` runs
the script as the agent in dev mode and returns the result and the egress/DNS events.
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

    def dev(
        self, script: str, *, timeout: float = 90, options: tuple[str, ...] = ()
    ) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
        result = subprocess.run(
            [*CLI, "dev", "--log-format=json", f"--policy={self.policy}",
             f"--dns-server={self.dns.address[0]}:{self.dns.address[1]}", *options, "--", "sh", "-c", script],
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


def allowed_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("event") == "egress" and e.get("decision") == "allow"]


def denied_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("event") == "egress" and e.get("decision") == "deny"]
