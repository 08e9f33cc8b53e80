"""Control in the proxy-pod topology: no boundary; real clients (curl, requests) on loopback use
control's own proxy listener with the sandbox's proxy token. The origins live on a test host in a network
namespace this module creates; names are answered by the test's DNS server.

From the client's (the untrusted workload's) side: an allowed host works through TLS termination, a denied one
is refused and never reached, a missing or wrong token is a 407 that reaches nothing and is logged, and a
client holding too many connections is capped.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme

from supervisor.protocol.certs import issue_bundle
from tests.certs_fixtures import SAMPLE_CLAIMS
from tests.netns_hosts import DnsServer, NetnsHost, open_test_host, require_netns

CLI = [sys.executable, "-m", "supervisor.cli"]
RECORDER = Path(__file__).parent.parent / "https_recorder.py"
TLS_PORT, PLAIN_PORT = 8443, 8080
TOKEN = "proxy-pod-test-token-0123456789"
PER_CLIENT = 4

POLICY = """\
version: 1
network_policies:
  api:
    endpoints:
      - {{host: api.test, port: {tls}, allowed_ips: ["{address}/32"]}}
      - {{host: api.test, port: {plain}, allowed_ips: ["{address}/32"]}}
    binaries:
      - path: /nonexistent/only-this-binary
"""


@dataclass
class Control:
    proc: subprocess.Popen[str]
    port: int
    ca: Path
    log: Path
    api: Path
    origin_logs: tuple[Path, Path]
    host: NetnsHost

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        events = [json.loads(line) for line in lines if line.startswith("{")]
        return [e for e in events if kind is None or e.get("event") == kind]

    def origin_requests(self, index: int = 0) -> list[dict[str, Any]]:
        path = self.origin_logs[index]
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def proxy(self, token: str | None = TOKEN) -> str:
        return f"http://sandbox:{token}@127.0.0.1:{self.port}" if token else f"http://127.0.0.1:{self.port}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(predicate: Any, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def control_args(tmp: Path, **extra: str) -> list[str]:
    args = {"--mode": "control", "--bootstrap": str(tmp / "bundle" / "control"), "--topology": "proxy-pod",
            "--proxy-listen": "127.0.0.1:0", "--proxy-token-file": str(tmp / "token"),
            "--binary-identity": "relaxed", "--api": str(tmp / "api.sock"), **extra}  # fmt: skip
    return [f"{k}={v}" for k, v in args.items() if v]


@pytest.fixture(scope="module")
def control() -> Iterator[Control]:
    require_netns()
    if shutil.which("curl") is None:
        pytest.skip("curl is needed as a real client")
    tmp = Path(tempfile.mkdtemp(prefix="osb-ppod-"))
    try:
        issue_bundle(tmp / "bundle", SAMPLE_CLAIMS)
        (tmp / "token").write_text(TOKEN + "\n")
        ca = trustme.CA()
        leaf = ca.issue_cert("api.test", "denied.test")
        cert, key, origin_ca = tmp / "cert.pem", tmp / "key.pem", tmp / "origin-ca.pem"
        leaf.private_key_and_cert_chain_pem.write_to_path(str(key))
        for blob in leaf.cert_chain_pems:
            blob.write_to_path(str(cert), append=True)
        ca.cert_pem.write_to_path(str(origin_ca))
        logs = (tmp / "tls.jsonl", tmp / "plain.jsonl")
        with open_test_host() as host:
            for port, c, k, log in ((TLS_PORT, str(cert), str(key), logs[0]), (PLAIN_PORT, "-", "-", logs[1])):
                host.popen([sys.executable, str(RECORDER), host.address, str(port), c, k, str(log)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
            with DnsServer({"api.test": [host.address], "denied.test": [host.address]}) as dns:
                policy = tmp / "policy.yaml"
                policy.write_text(POLICY.format(tls=TLS_PORT, plain=PLAIN_PORT, address=host.address))
                port = _free_port()
                log = tmp / "control.jsonl"
                argv = [*CLI, *control_args(tmp, **{"--proxy-listen": f"127.0.0.1:{port}"}),
                        "--acknowledge-networkpolicy-enforcement", f"--policy={policy}", "--no-policy-watch",
                        f"--dns-server={dns.address[0]}:{dns.address[1]}", f"--upstream-ca={origin_ca}",
                        f"--interception-ca={tmp / 'ica'}", f"--proxy-per-client={PER_CLIENT}",
                        "--log-stream=none", f"--log-file={log}"]  # fmt: skip
                proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                try:
                    ctl = Control(proc, port, tmp / "ica" / "interception-ca.pem", log, tmp / "api.sock", logs, host)

                    def listening() -> bool:
                        assert proc.poll() is None, proc.communicate()[1][-2000:]
                        return bool(ctl.events("proxy.listening"))

                    _wait(listening, "control's proxy listener")
                    for p in (TLS_PORT, PLAIN_PORT):
                        _wait(lambda p=p: _connectable(host.address, p), f"origin {p}")
                    yield ctl
                finally:
                    proc.terminate()
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _connectable(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=1).close()
        return True
    except OSError:
        return False


def curl(ctl: Control, url: str, *, token: str | None = TOKEN) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["curl", "-sS", "--max-time", "20", "--proxy", ctl.proxy(token), "--cacert", str(ctl.ca),
         "-o", "-", "-w", "\n%{http_code} %{http_connect}", url],
        capture_output=True, text=True, timeout=30, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )  # fmt: skip


def test_allowed_host_through_tls_termination(control: Control) -> None:
    before = len(control.origin_requests())
    result = curl(control, f"https://api.test:{TLS_PORT}/hello")
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith("200 200"), result.stdout
    assert len(control.origin_requests()) == before + 1
    assert control.origin_requests()[-1]["path"] == "/hello"

    def allowed() -> list[dict[str, Any]]:  # written when the connection closes
        return [e for e in control.events("egress") if e.get("decision") == "allow" and e.get("inspected")]

    _wait(lambda: bool(allowed()), "the allow event")
    assert allowed()[-1]["identity"] == "relaxed"  # binaries ignored: only the destination decided


def test_requests_client_and_plain_http_forward(control: Control) -> None:
    import requests

    proxies = {"http": control.proxy(), "https": control.proxy()}
    before = len(control.origin_requests(1))
    response = requests.get(f"http://api.test:{PLAIN_PORT}/plain", proxies=proxies, timeout=20)
    assert response.status_code == 200
    assert len(control.origin_requests(1)) == before + 1
    recorded = control.origin_requests(1)[-1]
    assert recorded["path"] == "/plain"
    response = requests.get(f"https://api.test:{TLS_PORT}/req", proxies=proxies, verify=str(control.ca), timeout=20)
    assert response.status_code == 200


def test_denied_host_is_refused_and_never_reached(control: Control) -> None:
    before = [len(control.origin_requests(i)) for i in (0, 1)]
    result = curl(control, f"https://denied.test:{TLS_PORT}/x")
    assert result.returncode != 0 and "403" in result.stdout + result.stderr
    result = curl(control, f"http://denied.test:{PLAIN_PORT}/x")
    assert result.stdout.rstrip().endswith("403 000"), result.stdout
    assert json.loads(result.stdout.rsplit("\n", 1)[0])["error"] == "policy_denied"
    # a port the policy does not name on an allowed host, and an internal address
    assert curl(control, f"http://api.test:{TLS_PORT + 1}/x").stdout.rstrip().endswith("403 000")
    assert curl(control, "http://127.0.0.1:22/x").stdout.rstrip().endswith("403 000")
    assert [len(control.origin_requests(i)) for i in (0, 1)] == before


@pytest.mark.parametrize("token", [None, "wrong-token-0123456789", "another-sandbox-token-xyz"])
def test_missing_or_wrong_token_is_407_and_logged(control: Control, token: str | None) -> None:
    before = [len(control.origin_requests(i)) for i in (0, 1)]
    refused = len(control.events("proxy.refused"))
    result = curl(control, f"http://api.test:{PLAIN_PORT}/x", token=token)
    assert result.stdout.rstrip().endswith("407 000"), result.stdout
    result = curl(control, f"https://api.test:{TLS_PORT}/x", token=token)
    assert result.returncode != 0 and "407" in result.stdout + result.stderr
    _wait(lambda: len(control.events("proxy.refused")) >= refused + 2, "the refusals logged")
    reasons = {e["reason"] for e in control.events("proxy.refused")[refused:]}
    assert reasons == {"proxy-token-missing" if token is None else "proxy-token-wrong"}
    assert [len(control.origin_requests(i)) for i in (0, 1)] == before


def test_token_for_the_listener_never_reaches_the_origin(control: Control) -> None:
    with socket.create_connection(("127.0.0.1", control.port), timeout=10) as sock:
        auth = base64.b64encode(f"sandbox:{TOKEN}".encode())
        sock.sendall(b"GET http://api.test:%d/tok HTTP/1.1\r\nHost: api.test\r\nProxy-Authorization: Basic %s\r\n"
                     b"Authorization: Bearer visible\r\n\r\n" % (PLAIN_PORT, auth))  # fmt: skip
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.")
    recorded = control.origin_requests(1)[-1]
    assert recorded["path"] == "/tok" and TOKEN not in json.dumps(recorded)


def test_per_client_connections_are_capped(control: Control) -> None:
    held = [socket.create_connection(("127.0.0.1", control.port), timeout=10) for _ in range(PER_CLIENT)]
    try:
        _wait(lambda: _status(control)["topology"]["proxy"]["active"] >= PER_CLIENT, "held connections counted")
        result = curl(control, f"http://api.test:{PLAIN_PORT}/capped")
        assert result.stdout.rstrip().endswith("503 000"), result.stdout
        assert json.loads(result.stdout.rsplit("\n", 1)[0])["error"] == "too_many_connections"
        assert any(e.get("reason") == "too-many-connections" for e in control.events("proxy.refused"))
    finally:
        for sock in held:
            sock.close()
    _wait(lambda: _status(control)["topology"]["proxy"]["active"] == 0, "held connections released")
    assert curl(control, f"http://api.test:{PLAIN_PORT}/after").stdout.rstrip().endswith("200 000")


def _status(control: Control) -> dict[str, Any]:
    result = subprocess.run([*CLI, "status", "--json", f"--api={control.api}"], capture_output=True, text=True,
                            timeout=30)  # fmt: skip
    assert result.returncode == 0, result.stderr
    body: dict[str, Any] = json.loads(result.stdout)
    return body


def test_status_records_topology_and_acknowledgement(control: Control) -> None:
    status = _status(control)
    assert status["ready"] is True, status
    topology = status["topology"]
    assert topology["name"] == "proxy-pod" and topology["identity"] == "relaxed"
    assert topology["networkpolicy_enforcement"] == "acknowledged"
    (event,) = control.events("topology")
    assert event["networkpolicy_enforcement"] == "acknowledged"
    warning = control.events("policy.identity-relaxed")
    assert len(warning) == 1 and "proxy-pod" in warning[0]["reason"]


@pytest.mark.parametrize("verb", [["exec", "--", "true"], ["signal", "TERM"], ["wait"]])
def test_process_operations_name_the_topology(control: Control, verb: list[str]) -> None:
    result = subprocess.run([*CLI, verb[0], f"--api={control.api}", *verb[1:]], capture_output=True, text=True,
                            timeout=30)  # fmt: skip
    assert result.returncode != 0
    assert "proxy-pod topology" in result.stderr + result.stdout


@pytest.mark.parametrize(
    ("drop", "message"),
    [
        ("--binary-identity", "requires --binary-identity=relaxed"),
        ("--ack", "requires --acknowledge-networkpolicy-enforcement"),
        ("--proxy-token-file", "needs --proxy-token-file"),
    ],
)
def test_refused_without_its_requirements(tmp_path: Path, drop: str, message: str) -> None:
    issue_bundle(tmp_path / "bundle", SAMPLE_CLAIMS)
    (tmp_path / "token").write_text(TOKEN)
    argv = control_args(tmp_path, **{drop: ""})
    if drop != "--ack":
        argv.append("--acknowledge-networkpolicy-enforcement")
    result = subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and message in result.stderr, result.stderr
