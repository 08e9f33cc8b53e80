"""Inspection survives a control restart with the same CA Secret, and fails closed (and is reported) with another.

The daemons run from ``k8s render``'s Secret material as in tests/integration/test_rendered_control_restart.py;
the origin is an HTTPS server on a test host in a network namespace, with a certificate from a CA the agent does
not trust. A ``curl`` exec'd in the workload therefore succeeds only through control's inspection: the agent
trusts the interception CA alone (its CA bundle is the system store plus that CA). After a restart with the same
CA Secret the request still verifies; after a restart with another CA it fails verification in the agent and
nothing reaches the origin.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from tests.integration.test_rendered_control_restart import Sandbox, _events, _running, _wait
from tests.netns_hosts import DnsServer, open_test_host, require_netns

CLI = [sys.executable, "-m", "supervisor.cli"]
RECORDER = Path(__file__).parent.parent / "https_recorder.py"
PORT = 8443
POLICY = """\
version: 1
network_policies:
  api:
    name: the inspected origin
    endpoints:
      - host: secure.test
        port: {port}
        allowed_ips: ["{address}/32"]
    binaries:
      - path: /usr/bin/curl
"""


@pytest.fixture
def world() -> Iterator[tuple[Sandbox, Path]]:
    require_netns()
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    root = Path(tempfile.mkdtemp(prefix="osb-rir-", dir="/tmp"))
    try:
        ca = trustme.CA()
        leaf = ca.issue_cert("secure.test")
        cert, key, ca_file = root / "cert.pem", root / "key.pem", root / "origin-ca.pem"
        leaf.private_key_and_cert_chain_pem.write_to_path(str(key))
        for blob in leaf.cert_chain_pems:
            blob.write_to_path(str(cert), append=True)
        ca.cert_pem.write_to_path(str(ca_file))
        log = root / "requests.jsonl"
        with open_test_host() as host:
            host.popen([sys.executable, str(RECORDER), host.address, str(PORT), str(cert), str(key), str(log)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
            with DnsServer({"secure.test": [host.address]}) as dns:
                box_root = root / "box"
                box_root.mkdir()
                box = Sandbox(
                    box_root, POLICY.format(port=PORT, address=host.address),
                    (f"--dns-server={dns.address[0]}:{dns.address[1]}", f"--upstream-ca={ca_file}"),
                )  # fmt: skip
                try:
                    yield box, log
                finally:
                    box.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _curl(box: Sandbox, path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "exec", f"--api={box.root / 'api.sock'}", "--", "curl", "-sS", "-f", "--max-time", "20",
         f"https://secure.test:{PORT}{path}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _paths(log: Path) -> list[str]:
    return [json.loads(line)["path"] for line in log.read_text().splitlines()] if log.exists() else []


def test_a_restarted_control_still_inspects_with_the_same_ca_and_another_ca_fails_closed(
    world: tuple[Sandbox, Path],
) -> None:
    box, log = world
    box.start_boundary()
    first, _ = box.start_control(box.root / "ca")
    _wait("attach and start", lambda: _running(box))
    _wait("ready", lambda: box.readyz().returncode == 0)
    result = _curl(box, "/before")
    assert result.returncode == 0 and json.loads(result.stdout)["path"] == "/before", result.stderr

    box.stop(first)
    second, clog = box.start_control(box.root / "ca")
    _wait("resume", lambda: any(e["event"] == "lifecycle.resumed" for e in _events(clog)))
    _wait("ready after resume", lambda: box.readyz().returncode == 0)
    result = _curl(box, "/after-restart")
    assert result.returncode == 0 and json.loads(result.stdout)["path"] == "/after-restart", result.stderr

    box.stop(second)
    _, clog = box.start_control(box.root / "another-ca")
    _wait("the mismatch", lambda: any(e["event"] == "interception.ca-mismatch" for e in _events(clog)))
    result = _curl(box, "/other-ca")
    assert result.returncode != 0  # curl (60): the agent does not trust the new CA
    assert "certificate" in result.stderr.lower(), result.stderr
    assert _paths(log) == ["/before", "/after-restart"], "nothing may reach the origin without verification"
