"""The operator API from outside the pod: the real CLI over ``--api https://127.0.0.1:PORT --cert DIR``
against hand-run daemons (control with ``--api-listen``), and every certificate that is not this sandbox's
operator's refused by control's TCP listener and logged.

The bundle comes from the CLI (``certs issue --operator --ca-key-out``), the expired operator certificate from a
later mint with the kept CA key (``certs operator --not-after=-1m``). The attacker's attempts use a plain TLS client
that trusts any server (as an attacker would) from their own loopback source addresses (127.0.0.N), so that the
per-source rate limit of one case never touches another, nor the real operator on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pexpect
import pytest

from supervisor.control.api_tls import FAILURE_LIMIT
from supervisor.protocol.certs import CertificateAuthority, write_role_dir
from supervisor.protocol.claims import Role, parse_claims_json
from tests.certs_fixtures import differing
from tests.interrupt import interruptible

CLI = [sys.executable, "-m", "supervisor.cli"]
WORKLOAD_PORT = 8000
COUNT_PORT = 8001  # reads until the client half-closes, then answers with the byte count
AGENT = (
    "import http.server, socketserver, threading\n"
    "class C(socketserver.BaseRequestHandler):\n"
    "    def handle(self):\n"
    "        n = 0\n"
    "        while chunk := self.request.recv(65536):\n"
    "            n += len(chunk)\n"
    "        self.request.sendall(b'got %d bytes' % n)\n"
    f"threading.Thread(target=socketserver.TCPServer(('127.0.0.1', {COUNT_PORT}), C).serve_forever).start()\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        body = b'hello from inside the workload\\n'\n"
    "        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers()\n"
    "        self.wfile.write(body)\n"
    "    def log_message(self, *a): pass\n"
    f"socketserver.TCPServer(('127.0.0.1', {WORKLOAD_PORT}), H).serve_forever()\n"
)
CLAIM_FLAGS = [
    "--namespace=agents", "--sandbox=remote-op", "--sandbox-uid=9d1c", "--control-deployment=os-ctl-r",
    "--network-policy=os-np-r", "--image=local/agent", "--generation=1", "--policy-resource=File/p",
]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _wait(what: str, check: Callable[[], Any], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@dataclass
class Remote:
    root: Path
    port: int
    env: dict[str, str]
    procs: list[subprocess.Popen[bytes]]

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def operator(self) -> Path:
        return self.root / "bundle" / "operator"

    def cli(self, *args: str, cert: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """A client command over the TCP API (``--api``/``--cert`` after the command's own arguments)."""
        flags = ["--api", self.url, "--cert", str(cert or self.operator)]
        words = 2 if args[0] == "policy" else 1  # `policy get|apply` takes them after its own subcommand
        return subprocess.run([*CLI, *args[:words], *flags, *args[words:]], capture_output=True, text=True,
                              timeout=timeout, env=self.env)  # fmt: skip

    def events(self) -> list[dict[str, Any]]:
        lines = (self.root / "control.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def refusals(self, source: str) -> list[dict[str, Any]]:
        return [e for e in self.events() if e["event"] == "api.refused" and e["peer"].startswith(f"{source}:")]


def _certs(*args: str) -> None:
    result = subprocess.run([*CLI, "certs", *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Remote]:
    root = tmp_path_factory.mktemp("remote-operator")
    _certs("issue", f"--out={root / 'bundle'}", "--operator", f"--ca-key-out={root / 'ca.key'}", *CLAIM_FLAGS)
    _certs("operator", f"--out={root / 'expired'}", f"--bundle={root / 'bundle' / 'control'}",
           f"--ca-key={root / 'ca.key'}", "--not-after=-1m")  # fmt: skip
    other = [flag.replace("remote-op", "another-box") for flag in CLAIM_FLAGS]
    _certs("issue", f"--out={root / 'other'}", "--operator", *other)
    runtime = root / "runtime"  # no socket to find: the Unix API must not be what answers
    runtime.mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    env.pop("OPENSHELL_SANDBOX_API", None)
    env.pop("OPENSHELL_SANDBOX_CERT", None)
    port = _free_port()
    procs: list[subprocess.Popen[bytes]] = []
    box = Remote(root, port, env, procs)
    try:
        procs.append(subprocess.Popen(
            [*CLI, "--mode=boundary", f"--bootstrap={root / 'bundle' / 'boundary'}", "--listen=127.0.0.1:0",
             f"--port-file={root / 'port'}", "--privilege-model=R", "--agent-stdio=pipe", "--exit-linger=1",
             "--workdir=/tmp", f"--tls-dir={root / 'tls'}", "--", "/usr/bin/python3", "-c", AGENT],
            stdout=(root / "boundary.log").open("w"), stderr=subprocess.STDOUT,
        ))  # fmt: skip

        def boundary_port() -> str | None:
            assert procs[0].poll() is None, (root / "boundary.log").read_text()
            return (root / "port").read_text() if (root / "port").exists() else None

        boundary = int(_wait("the boundary's port", boundary_port))
        procs.append(subprocess.Popen(
            [*CLI, "--mode=control", f"--bootstrap={root / 'bundle' / 'control'}", f"--boundary=127.0.0.1:{boundary}",
             f"--api={root / 'api.sock'}", f"--api-listen=127.0.0.1:{port}", f"--interception-ca={root / 'ica'}",
             "--log-stream=none", f"--log-file={root / 'control.jsonl'}"],
            stdout=(root / "control.log").open("w"), stderr=subprocess.STDOUT,
        ))  # fmt: skip

        def ready() -> bool:
            assert procs[1].poll() is None, (root / "control.log").read_text()
            return box.cli("readyz", timeout=30).returncode == 0

        _wait("the sandbox to be ready over the TCP API", ready)
        yield box
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        shutil.rmtree(root, ignore_errors=True)


# --- the operator's side ----------------------------------------------------------------------------------------


def test_status_over_tcp(remote: Remote) -> None:
    result = remote.cli("status")
    assert result.returncode == 0, result.stderr
    assert "agents/remote-op" in result.stdout and "ready       yes" in result.stdout
    raw = json.loads(remote.cli("status", "--json").stdout)
    assert raw["sandbox"] == "remote-op"
    actions = [e for e in remote.events() if e["event"] == "api.operator" and e["action"] == "GET /v1/status"]
    assert actions, "no operator action logged"
    identity = actions[-1]["operator"]
    assert identity["uri"] == "spiffe://openshell/ns/agents/sandbox/remote-op/operator"
    assert identity["sha256"].startswith("sha256:") and identity["serial"]


def test_the_api_from_the_environment(remote: Remote) -> None:
    env = {**remote.env, "OPENSHELL_SANDBOX_API": remote.url, "OPENSHELL_SANDBOX_CERT": str(remote.operator)}
    result = subprocess.run([*CLI, "status", "--json"], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["sandbox"] == "remote-op"


def test_exec_it_over_tcp(remote: Remote) -> None:
    args = ["exec", "--api", remote.url, "--cert", str(remote.operator), "-it", "--", "sh", "-i"]
    child = pexpect.spawn(CLI[0], [*CLI[1:], *args], env=remote.env, encoding="utf-8", timeout=30,
                          dimensions=(24, 80))  # fmt: skip
    try:
        child.expect(r"\$ ")
        child.sendline("stty size; echo in-the-$((6*7))-workload")
        child.expect(r"24 80\s+in-the-42-workload")
        child.sendline("exit 7")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 7
    finally:
        if child.isalive():
            child.terminate(force=True)
    logged = [e for e in remote.events() if e["event"] == "api.operator" and e["action"] == "POST /v1/exec"]
    assert any(e.get("request", {}).get("argv") == ["sh", "-i"] for e in logged)


def test_exec_keeps_streams_apart_over_tcp(remote: Remote) -> None:
    result = remote.cli("exec", "--", "sh", "-c", "seq 1 20000; echo done >&2; exit 3")
    assert result.returncode == 3
    assert result.stdout == "".join(f"{i}\n" for i in range(1, 20001))
    assert result.stderr.endswith("done\n")


def test_cp_both_ways_over_tcp(remote: Remote, tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("over mutual TLS\n")
    there = remote.cli("cp", str(tmp_path / "in.txt"), ":cp-over-tcp.txt")
    assert there.returncode == 0, there.stderr
    back = remote.cli("cp", ":cp-over-tcp.txt", str(tmp_path / "back.txt"))
    assert back.returncode == 0, back.stderr
    assert (tmp_path / "back.txt").read_text() == "over mutual TLS\n"


def test_forward_over_tcp(remote: Remote) -> None:
    local_port = _free_port()
    proc = subprocess.Popen([*CLI, "forward", "--api", remote.url, "--cert", str(remote.operator),
                             f"{local_port}:{WORKLOAD_PORT}"], env=remote.env, preexec_fn=interruptible,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:

        def fetch() -> bytes:
            assert proc.poll() is None, proc.communicate()[1]
            answer = b""
            try:
                with socket.create_connection(("127.0.0.1", local_port), timeout=10) as conn:
                    conn.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
                    while chunk := conn.recv(4096):
                        answer += chunk
            except OSError:
                return b""
            return answer if b"hello" in answer else b""

        assert b"hello from inside the workload" in _wait("an answer through the forward", fetch, timeout=30)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)
    logged = [e for e in remote.events() if e["event"] == "api.operator" and e["action"] == "POST /v1/forward"]
    assert any(e.get("request") == {"host": "127.0.0.1", "port": WORKLOAD_PORT} for e in logged)


def test_forward_carries_half_close_both_ways(remote: Remote) -> None:
    """The local client shuts its sending side; the workload sees EOF, answers, and closes: TLS 1.3 close_notify
    carries each end of data across the TCP API without closing the other direction."""
    local_port = _free_port()
    proc = subprocess.Popen([*CLI, "forward", "--api", remote.url, "--cert", str(remote.operator),
                             f"{local_port}:{COUNT_PORT}"], env=remote.env, preexec_fn=interruptible,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:

        def exchange() -> bytes:
            assert proc.poll() is None, proc.communicate()[1]
            answer = b""
            try:
                with socket.create_connection(("127.0.0.1", local_port), timeout=10) as conn:
                    conn.sendall(b"x" * 100000)
                    conn.shutdown(socket.SHUT_WR)
                    while chunk := conn.recv(4096):
                        answer += chunk
            except OSError:
                return b""
            return answer

        assert _wait("an answer after the half-close", exchange, timeout=30) == b"got 100000 bytes"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)


def test_policy_apply_and_get_over_tcp(remote: Remote) -> None:
    before = json.loads(remote.cli("policy", "get").stdout)["generation"]
    policy = remote.root / "next.yaml"
    policy.write_text("version: 1\nnetwork_policies: {}\n")
    applied = remote.cli("policy", "apply", str(policy))
    assert applied.returncode == 0, applied.stderr
    assert json.loads(applied.stdout)["generation"] == before + 1
    assert json.loads(remote.cli("policy", "get").stdout)["generation"] == before + 1
    logged = [e for e in remote.events() if e["event"] == "api.operator" and e["action"] == "PUT /v1/policy"]
    assert logged and logged[-1]["request"]["bytes"] == len(policy.read_bytes())


def test_logs_and_logs_follow_over_tcp(remote: Remote) -> None:
    result = remote.cli("logs", "--json", "-n", "500", "--event", "api")
    assert result.returncode == 0, result.stderr
    kinds = {json.loads(line)["event"] for line in result.stdout.splitlines()}
    assert {"api.listening", "api.operator"} <= kinds
    follow = subprocess.Popen([*CLI, "logs", "--api", remote.url, "--cert", str(remote.operator), "-f", "-n", "0",
                               "--json", "--event", "api.operator"], env=remote.env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert follow.stdout is not None
        deadline = time.monotonic() + 30
        line = ""
        while not line:  # act until the follower, once connected, prints the action
            assert time.monotonic() < deadline, "logs -f printed nothing"
            assert remote.cli("status").returncode == 0
            if select.select([follow.stdout], [], [], 1)[0]:
                line = follow.stdout.readline()
        seen = json.loads(line)
        assert seen["event"] == "api.operator" and seen["operator"]["uri"].endswith("/remote-op/operator")
    finally:
        follow.terminate()
        follow.wait(timeout=10)


def test_signal_and_wait_over_tcp(remote: Remote) -> None:
    proc = subprocess.Popen([*CLI, "exec", "--api", remote.url, "--cert", str(remote.operator), "--", "sleep", "300"],
                            env=remote.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:

        def handle() -> str | None:
            live = json.loads(remote.cli("status", "--json").stdout)["boundary"]["processes"]
            running = [p["handle"] for p in live if p["kind"] == "exec" and p["state"] == "running"]
            return running[0] if running else None

        target = _wait("the exec'd sleep", handle, timeout=20)
        assert remote.cli("signal", "TERM", target).returncode == 0
        assert remote.cli("wait", target).returncode == 128 + signal.SIGTERM
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()


# --- the attacker's side: every certificate but this sandbox's operator's is refused, and logged ----------------


def _attempt(remote: Remote, source: str, cert_dir: Path | None) -> bytes:
    """A TLS client that trusts any server and presents ``cert_dir``'s certificate (or none); asks to exec.

    Returns whatever HTTP answer came back (nothing, for a refusal)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["http/1.1"])
    if cert_dir is not None:
        ctx.load_cert_chain(cert_dir / "cert.pem", cert_dir / "key.pem")
    body = json.dumps({"argv": ["touch", "/tmp/remote-operator-pwned"], "stdin": "null"}).encode()
    request = (b"POST /v1/exec HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: openshell-channel\r\n"
               b"content-length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
    answer = b""
    try:
        raw = socket.create_connection(("127.0.0.1", remote.port), timeout=10, source_address=(source, 0))
        with raw, ctx.wrap_socket(raw) as tls:
            tls.sendall(request)
            while chunk := tls.recv(4096):
                answer += chunk
    except (ssl.SSLError, OSError):
        pass
    return answer


def _foreign_operator(remote: Remote, field: str) -> Path:
    """An operator certificate signed by this sandbox's own CA (its key leaked) but for another sandbox's claims."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from supervisor.protocol.certs import make_leaf

    control = remote.root / "bundle" / "control"
    ca_key = serialization.load_pem_private_key((remote.root / "ca.key").read_bytes(), password=None)
    ca = CertificateAuthority(key=ca_key, certificate=x509.load_pem_x509_certificate((control / "ca.pem").read_bytes()))  # type: ignore[arg-type]
    claims = differing(parse_claims_json((control / "claims.json").read_bytes()), field)
    key, cert = make_leaf(ca, claims, Role.OPERATOR)
    out = remote.root / f"foreign-{field}"
    write_role_dir(out, ca.certificate, key, cert, claims)
    return out


@pytest.mark.parametrize(
    ("source", "which", "field", "reason"),
    [
        ("127.0.0.2", "boundary", "role", "expected 'operator', got 'boundary'"),
        ("127.0.0.3", "control", "role", "expected 'operator', got 'control'"),
        ("127.0.0.4", "other", "tls", "certificate verify failed"),
        ("127.0.0.5", "expired", "tls", "certificate has expired"),
        ("127.0.0.6", None, "tls", "certificate"),
        ("127.0.0.7", "foreign-sandbox", "sandbox", "claim 'sandbox' differs"),
        ("127.0.0.8", "foreign-generation", "generation", "claim 'generation' differs"),
    ],
)  # fmt: skip
def test_refused_and_logged(remote: Remote, source: str, which: str | None, field: str, reason: str) -> None:
    paths = {"boundary": remote.root / "bundle" / "boundary", "control": remote.root / "bundle" / "control",
             "other": remote.root / "other" / "operator", "expired": remote.root / "expired"}  # fmt: skip
    if which is None:
        cert_dir = None
    elif which.startswith("foreign-"):
        cert_dir = _foreign_operator(remote, which.removeprefix("foreign-"))
    else:
        cert_dir = paths[which]
    generation = json.loads(remote.cli("policy", "get").stdout)["generation"]
    answer = _attempt(remote, source, cert_dir)
    assert b"HTTP/1.1" not in answer, answer[:200]
    refusal = _wait(f"the refusal of {which} logged", lambda: remote.refusals(source), timeout=20)[-1]
    assert refusal["field"] == field and reason in refusal["reason"], refusal
    assert not [e for e in remote.events() if e["event"] == "api.operator" and e["peer"].startswith(f"{source}:")]
    assert not Path("/tmp/remote-operator-pwned").exists()
    assert json.loads(remote.cli("policy", "get").stdout)["generation"] == generation  # nothing changed


def test_cli_with_an_expired_operator_certificate_says_so(remote: Remote) -> None:
    result = remote.cli("status", cert=remote.root / "expired")
    assert result.returncode == 125
    assert "refused the connection" in result.stderr and "certificate expired" in result.stderr, result.stderr


def test_cli_refuses_a_link_bundle_as_operator_certificate(remote: Remote) -> None:
    result = remote.cli("status", cert=remote.root / "bundle" / "boundary")
    assert result.returncode == 125
    assert "not the operator role's" in result.stderr


def test_failed_handshakes_are_rate_limited_per_source(remote: Remote) -> None:
    source = "127.0.0.9"
    for _ in range(FAILURE_LIMIT):
        _attempt(remote, source, remote.root / "expired")
    _wait("the source blocked", lambda: [e for e in remote.events() if e["event"] == "api.rate-limited"
                                          and e["address"] == source], timeout=20)  # fmt: skip
    refused = len(remote.refusals(source))
    # Now even this sandbox's operator certificate gets no handshake from that source...
    assert _attempt(remote, source, remote.operator) == b""
    assert len(remote.refusals(source)) == refused  # closed before TLS: no handshake, nothing more logged
    # ... while the operator elsewhere is unaffected.
    assert remote.cli("status").returncode == 0


def test_dev_api_listen_prints_the_operator_bundle(tmp_path: Path) -> None:
    """``dev --api-listen``: dev mints an operator certificate, says where it is, and the CLI reaches control."""
    port = _free_port()
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state")}
    dev = subprocess.Popen([*CLI, "dev", "--api-listen", f"127.0.0.1:{port}", "--", "sleep", "1000"], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert dev.stderr is not None
        line = ""
        deadline = time.monotonic() + 60
        while "operator API on" not in line:
            assert time.monotonic() < deadline and dev.poll() is None, line
            if select.select([dev.stderr], [], [], 1)[0]:
                line = dev.stderr.readline()
        url, cert = line.split("operator API on ", 1)[1].split(" (", 1)[0].split(" --cert ")
        assert url == f"https://127.0.0.1:{port}"

        def status() -> subprocess.CompletedProcess[str] | None:
            result = subprocess.run([*CLI, "status", "--json", "--api", url, "--cert", cert], capture_output=True,
                                    text=True, timeout=60, env=env)  # fmt: skip
            return result if result.returncode == 0 and json.loads(result.stdout).get("ready") else None

        assert json.loads(_wait("dev's control ready over TCP", status).stdout)["namespace"] == "dev"
    finally:
        dev.terminate()
        dev.wait(timeout=30)
    assert not Path(cert).exists()  # removed with dev's temporary directory


@pytest.mark.parametrize("alpn", ["openshell-ops/1", "openshell-egress/1"])
def test_operator_cert_refused_on_the_boundarys_link_port(remote: Remote, alpn: str) -> None:
    """The operator certificate dials the real boundary as if it were control, on each link protocol."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(remote.operator / "ca.pem")
    ctx.load_cert_chain(remote.operator / "cert.pem", remote.operator / "key.pem")
    ctx.set_alpn_protocols([alpn])
    port = int((remote.root / "port").read_text())
    log = remote.root / "boundary.log"

    def refusals() -> list[dict[str, Any]]:
        lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
        return [e for e in lines if e["event"] == "link.refused" and "got 'operator'" in e.get("reason", "")]

    before = len(refusals())
    answer = b""
    try:
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        with raw, ctx.wrap_socket(raw) as tls:
            while chunk := tls.recv(4096):
                answer += chunk
    except (ssl.SSLError, OSError):
        pass
    refusal = _wait("the boundary's refusal", lambda: refusals()[before:], timeout=20)[-1]
    assert refusal["field"] == "role"
    assert remote.cli("status").returncode == 0  # control's own link is untouched
