"""``dev --topology proxy-pod`` end to end: an unmodified agent command — curl, ``python3 -m pip
download`` — in a network namespace whose only route is control's proxy listener. The origin (an HTTPS server
with a pip simple index) lives on a test host in a namespace this module creates; the index is
``PIP_INDEX_URL`` there, never the real one.

A representative subset of the boundary topology's egress e2e tests, from the agent's side: allowed works
through TLS termination, denied is refused and never reached, and the agent cannot get around the proxy (no
direct connection, no route or filter change, no request without the token).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme

from tests.netns_hosts import DnsServer, NetnsHost, open_test_host, require_netns

CLI = [sys.executable, "-m", "supervisor.cli"]
RECORDER = Path(__file__).parent.parent / "https_recorder.py"
SYSTEM_PYTHON = "/usr/bin/python3"
TLS_PORT = 8443
WHEEL = "tinypkg-1.0-py3-none-any.whl"

POLICY = """\
version: 1
network_policies:
  index:
    endpoints:
      - {{host: pypi.test, port: {tls}, allowed_ips: ["{address}/32"]}}
    binaries:
      - path: /usr/bin/curl
"""


@dataclass
class World:
    host: NetnsHost
    dns: DnsServer
    policy: Path
    origin_ca: Path
    origin_log: Path
    wheel_sha256: str
    root: Path

    def dev(
        self, script: str, *, timeout: float = 120, extra: tuple[str, ...] = ()
    ) -> tuple[subprocess.CompletedProcess[str], list[Any]]:
        state = self.root / "state"
        result = subprocess.run(
            [*CLI, "dev", "--topology=proxy-pod", "--log-format=json", f"--policy={self.policy}",
             f"--dns-server={self.dns.address[0]}:{self.dns.address[1]}", f"--upstream-ca={self.origin_ca}",
             *extra, "--", "sh", "-c", script],
            capture_output=True, text=True, timeout=timeout,
            env={**os.environ, "XDG_STATE_HOME": str(state), "XDG_RUNTIME_DIR": str(self.root / "run")},
        )  # fmt: skip
        events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
        return result, events

    def origin_requests(self) -> list[dict[str, Any]]:
        if not self.origin_log.exists():
            return []
        return [json.loads(line) for line in self.origin_log.read_text().splitlines()]


def _wheel(directory: Path) -> str:
    """A minimal valid wheel of one module, and its sha256."""
    path = directory / WHEEL
    files = {
        "tinypkg.py": "VALUE = 1\n",
        "tinypkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
        "tinypkg-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = ""
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record += f"{name},sha256={digest},{len(text.encode())}\n"
    files["tinypkg-1.0.dist-info/RECORD"] = record + "tinypkg-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    require_netns()
    if os.geteuid() != 0:
        pytest.skip("dev --topology proxy-pod needs root")
    for tool in ("curl", "nft"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is needed")
    if subprocess.run([SYSTEM_PYTHON, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        pytest.skip(f"{SYSTEM_PYTHON} -m pip is needed (the agent runs as uid 1000)")
    root = Path(tempfile.mkdtemp(prefix="osb-ppdev-"))
    try:
        serve = root / "www"
        (serve / "packages").mkdir(parents=True)
        (serve / "simple" / "tinypkg").mkdir(parents=True)
        digest = _wheel(serve / "packages")
        (serve / "simple" / "tinypkg" / "index.html").write_text(
            f'<html><body><a href="/packages/{WHEEL}#sha256={digest}">{WHEEL}</a></body></html>\n'
        )
        ca = trustme.CA()
        leaf = ca.issue_cert("pypi.test", "denied.test")
        cert, key, origin_ca = root / "cert.pem", root / "key.pem", root / "origin-ca.pem"
        leaf.private_key_and_cert_chain_pem.write_to_path(str(key))
        for blob in leaf.cert_chain_pems:
            blob.write_to_path(str(cert), append=True)
        ca.cert_pem.write_to_path(str(origin_ca))
        log = root / "origin.jsonl"
        (root / "state").mkdir()
        (root / "run").mkdir()
        with open_test_host() as host:
            host.popen([sys.executable, str(RECORDER), host.address, str(TLS_PORT), str(cert), str(key), str(log)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       env={**os.environ, "RECORDER_ROOT": str(serve)})  # fmt: skip
            with DnsServer({"pypi.test": [host.address], "denied.test": [host.address]}) as dns:
                policy = root / "policy.yaml"
                policy.write_text(POLICY.format(tls=TLS_PORT, address=host.address))
                from tests.e2e.egress_world import _wait_http

                _wait_http(host.address, TLS_PORT)
                yield World(host, dns, policy, origin_ca, log, digest, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _egress(events: list[Any], decision: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("event") == "egress" and e.get("decision") == decision]


def test_curl_and_pip_download_through_control(world: World) -> None:
    before = len(world.origin_requests())
    script = (
        f"curl -sS --fail https://pypi.test:{TLS_PORT}/simple/tinypkg/ >/dev/null && echo curl-ok; "
        f"PIP_INDEX_URL=https://pypi.test:{TLS_PORT}/simple/ PIP_DISABLE_PIP_VERSION_CHECK=1 "
        f"{SYSTEM_PYTHON} -m pip download --no-deps --only-binary=:all: -d dl tinypkg==1.0 >pip.log 2>&1 "
        f"&& sha256sum dl/{WHEEL} || cat pip.log"
    )
    result, events = world.dev(script)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "curl-ok" in result.stdout, result.stdout + result.stderr[-2000:]
    assert world.wheel_sha256 in result.stdout, result.stdout
    paths = [r["path"] for r in world.origin_requests()[before:]]
    assert "/simple/tinypkg/" in paths and f"/packages/{WHEEL}" in paths
    allowed = _egress(events, "allow")
    assert allowed and all(e.get("identity") == "relaxed" and e.get("inspected") for e in allowed)
    (topology,) = [e for e in events if e.get("event") == "topology"]
    assert topology["topology"] == "proxy-pod" and topology["networkpolicy_enforcement"] == "acknowledged"


def test_two_control_processes_share_the_proxy_port(world: World) -> None:
    """``--workers=2``: both processes listen on the proxy port (SO_REUSEPORT) and the kernel spreads the
    workload's connections over them; each decides and relays as one control would, denials included."""
    before = len(world.origin_requests())
    script = (
        f"for i in $(seq 1 24); do curl -sS -o /dev/null -w '%{{http_code}}\\n' "
        f"'https://pypi.test:{TLS_PORT}/simple/tinypkg/?n='$i; done; "
        # silent: curl writes its error in pieces, and control's event lines share dev's stderr with the agent's
        f"curl -s -o /dev/null -w 'denied %{{http_code}}\\n' https://denied.test:{TLS_PORT}/x"
    )
    result, events = world.dev(script, extra=("--workers=2",))
    lines = result.stdout.splitlines()
    assert lines[:24] == ["200"] * 24 and lines[24].startswith("denied 000"), result.stdout + result.stderr[-2000:]
    allowed = _egress(events, "allow")
    assert len(allowed) == 24
    # 24 connections hashed over two sockets: all on one would be a 1-in-8-million chance
    assert {e.get("worker", 0) for e in allowed} == {0, 1}, allowed
    paths = [r["path"] for r in world.origin_requests()[before:]]
    assert sorted(paths) == sorted(f"/simple/tinypkg/?n={i}" for i in range(1, 25))
    assert [e["destination"] for e in _egress(events, "deny")] == [f"denied.test:{TLS_PORT}"], result.stderr[-4000:]
    (workers,) = [e for e in events if e.get("event") == "control.workers"]
    assert workers["workers"] == 2 and len(workers["pids"]) == 2


def test_denied_host_is_refused_and_never_reached(world: World) -> None:
    before = len(world.origin_requests())
    result, events = world.dev(
        f"curl -s -o /dev/null -w '%{{http_code}} %{{http_connect}}\\n' https://denied.test:{TLS_PORT}/x; "
        f"curl -sS -w '\\n%{{http_code}}\\n' http://denied.test:{TLS_PORT}/x"
    )
    assert "000 403" in result.stdout and "policy_denied" in result.stdout, result.stdout + result.stderr[-2000:]
    assert len(world.origin_requests()) == before
    assert {e["destination"] for e in _egress(events, "deny")} == {f"denied.test:{TLS_PORT}"}


def test_agent_cannot_get_around_the_proxy(world: World) -> None:
    """From the agent's side: direct connections (to the origin, to control's host-side address on another
    port), a route of its own, a flushed filter and a request without the token all fail; afterwards the
    origin has seen nothing of them."""
    before = len(world.origin_requests())
    script = (
        'ctl=$(echo "$HTTPS_PROXY" | sed "s|.*@||; s|:.*||"); '
        f"curl -sS -m 3 --noproxy '*' -k https://{world.host.address}:{TLS_PORT}/direct; echo direct=$?; "
        f"curl -sS -m 3 --noproxy '*' http://$ctl:{TLS_PORT}/; echo hostside=$?; "
        f"ip route add default via $ctl 2>/dev/null; echo route=$?; "
        "nft flush ruleset 2>/dev/null; echo flush=$?; "
        f"curl -sS -m 3 --noproxy '*' -k https://{world.host.address}:{TLS_PORT}/after; echo after=$?; "
        'noauth=$(echo "$HTTPS_PROXY" | sed "s|sandbox:[^@]*@||"); '
        f"curl -sS -m 5 -o /dev/null -w '%{{http_code}}\\n' -x $noauth http://pypi.test:{TLS_PORT}/noauth; "
        "id -u"
    )
    result, events = world.dev(script)
    out = result.stdout
    for probe in ("direct", "hostside", "route", "flush", "after"):
        assert f"{probe}=0" not in out, out
    assert "407" in out.split(), out
    assert out.split()[-1] != "0"  # the agent is not root
    assert any(e.get("event") == "proxy.refused" and e.get("reason") == "proxy-token-missing" for e in events)
    assert len(world.origin_requests()) == before


# The agent (as uid 1000, with dev's proxy variables and CA bundle): tunnels through control's proxy with the
# token, each carrying one keep-alive HTTPS request that is then held open. Prints one JSON line per tunnel.
CAPPED_AGENT = """\
import base64, json, os, socket, ssl, time, urllib.parse
proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
auth = base64.b64encode(f"{proxy.username}:{proxy.password}".encode()).decode()
ctx = ssl.create_default_context()  # SSL_CERT_FILE: the system store plus control's interception CA
def response(sock):
    data = b""
    while b"\\r\\n\\r\\n" not in data and (chunk := sock.recv(4096)):
        data += chunk
    head, _, body = data.partition(b"\\r\\n\\r\\n")
    lines = head.decode().split("\\r\\n")
    length = int(next((v for k, _, v in (x.partition(":") for x in lines[1:]) if k.lower() == "content-length"), 0))
    while len(body) < length and (chunk := sock.recv(4096)):
        body += chunk
    return lines[0].split(" ")[1] if lines[0] else "eof", body
def tunnel(path):
    sock = socket.create_connection((proxy.hostname, proxy.port), timeout=15)
    sock.sendall(f"CONNECT pypi.test:{PORT} HTTP/1.1\\r\\nHost: pypi.test:{PORT}\\r\\n"
                 f"Proxy-Authorization: Basic {auth}\\r\\n\\r\\n".encode())
    status, body = response(sock)
    if status != "200":
        sock.close()
        print(json.dumps({"path": path, "connect": status, "body": body.decode()}), flush=True)
        return None
    tls = ctx.wrap_socket(sock, server_hostname="pypi.test")
    tls.sendall(f"GET {path} HTTP/1.1\\r\\nHost: pypi.test:{PORT}\\r\\n\\r\\n".encode())
    status, _ = response(tls)
    print(json.dumps({"path": path, "connect": "200", "get": status}), flush=True)
    return tls
held = [tunnel("/held-1"), tunnel("/held-2")]
tunnel("/third")
held[0].close()
deadline = time.monotonic() + 30  # control counts the closed tunnel out once it has seen its end
while tunnel("/after") is None and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def test_connection_cap_refuses_beyond_it_and_serves_again_after_a_close(world: World) -> None:
    """``--proxy-max-connections 2``: two tunnels held open are served; a third is answered 503
    too_many_connections and never reaches the origin; once one of the two closes, a new one is served."""
    before = len(world.origin_requests())
    agent = CAPPED_AGENT.replace("{PORT}", str(TLS_PORT))
    result, events = world.dev(f"exec {SYSTEM_PYTHON} -c {shlex.quote(agent)}", extra=("--proxy-max-connections=2",))
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines[:2] == [{"path": f"/held-{n}", "connect": "200", "get": "200"} for n in (1, 2)], lines
    third = lines[2]
    assert third["path"] == "/third" and third["connect"] == "503", lines
    assert json.loads(third["body"])["error"] == "too_many_connections", third
    assert lines[-1] == {"path": "/after", "connect": "200", "get": "200"}, lines
    assert all(line["connect"] == "503" for line in lines[3:-1]), lines  # refused until the close was counted
    paths = [r["path"] for r in world.origin_requests()[before:]]
    assert paths == ["/held-1", "/held-2", "/after"], paths  # the third never reached the origin
    (listening,) = [e for e in events if e.get("event") == "proxy.listening"]
    assert listening["max_connections"] == listening["per_client"] == 2, listening
    refused = [e for e in events if e.get("event") == "proxy.refused"]
    assert len(refused) == len(lines) - 3 and all(e["reason"] == "too-many-connections" for e in refused), refused


def test_needs_root_says_why(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        result = subprocess.run([*CLI, "dev", "--topology=proxy-pod", "--", "true"], capture_output=True, text=True)
        assert result.returncode == 125 and "needs root" in result.stderr
        return
    if not os.access(SYSTEM_PYTHON, os.X_OK) or shutil.which("setpriv") is None:
        pytest.skip("setpriv and the system python are needed to run dev as another uid")
    from tests.portable import portable_tree

    tree = portable_tree("osppdev-")
    try:
        result = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", SYSTEM_PYTHON, "-m", "supervisor.cli",
             "dev", "--topology=proxy-pod", "--", "true"],
            capture_output=True, text=True, timeout=60, cwd="/",
            env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin", "XDG_STATE_HOME": str(tmp_path),
                 "XDG_RUNTIME_DIR": str(tmp_path)},
        )  # fmt: skip
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    assert result.returncode == 125 and "needs root" in result.stderr, result.stderr


@pytest.mark.parametrize("flag", ["--pids-limit=5", "--privilege-model=U", "--api-listen=127.0.0.1:0"])
def test_boundary_only_flags_are_refused(flag: str) -> None:
    result = subprocess.run([*CLI, "dev", "--topology=proxy-pod", flag, "--", "true"], capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert result.returncode in (2, 125) and (flag.split("=")[0] in result.stderr or "needs root" in result.stderr)
