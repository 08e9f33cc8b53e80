"""Domain fronting from inside the agent, on every kind of endpoint (docs/reference/policy.md §3.7, §3.9).

Every endpoint but ``tls: skip`` is TLS-terminated and every HTTP request in it is bound to the tunnel's
``host:port``. The agent tries to reach ``other.test`` through a tunnel admitted for ``plain.test`` (no L7
rules) or ``rest.test`` (L7 rules): by ``Host``, by absolute-form target, by SNI, in plaintext and in TLS,
through CONNECT and by dialling the address, with a prefix split over two writes, a ClientHello sent late, a
method no list names, and a ``16 03 05`` record. Each must be refused, and — asserted at the origins, which
record every request with its unique path — nothing of it may arrive anywhere. A ``tls: skip`` endpoint relays
the client's own TLS to the origin's own certificate untouched.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme

from tests.netns_hosts import DnsServer, NetnsHost, open_test_host, require_netns
from tests.sandbox_api import api_env

CLI = [sys.executable, "-m", "supervisor.cli"]
RECORDER = Path(__file__).parent.parent / "https_recorder.py"
TLS_PORT = 8443
PLAIN_PORT = 8080
NAMES = ("plain.test", "rest.test", "other.test", "skip.test")

POLICY = """\
version: 1
network_policies:
  plain:
    name: no L7 rules
    endpoints:
      - {{host: plain.test, port: {tls}, allowed_ips: ["{address}/32"]}}
      - {{host: plain.test, port: {plain}, allowed_ips: ["{address}/32"]}}
    binaries: &clients [{{path: /usr/bin/python3*}}, {{path: /usr/bin/curl}}]
  rest:
    name: GET only
    endpoints:
      - host: rest.test
        port: {tls}
        protocol: rest
        enforcement: enforce
        allowed_ips: ["{address}/32"]
        rules: [{{allow: {{method: GET, path: "/**"}}}}]
      - host: rest.test
        port: {plain}
        protocol: rest
        enforcement: enforce
        allowed_ips: ["{address}/32"]
        rules: [{{allow: {{method: GET, path: "/**"}}}}]
    binaries: *clients
  other:
    name: the fronting target is allowed too, so only the binding stops it
    endpoints:
      - {{host: other.test, port: {tls}, allowed_ips: ["{address}/32"]}}
      - {{host: other.test, port: {plain}, allowed_ips: ["{address}/32"]}}
    binaries: *clients
  skip:
    name: certificate pinning client
    endpoints:
      - {{host: skip.test, port: {tls}, tls: skip, allowed_ips: ["{address}/32"]}}
    binaries: *clients
"""

# The agent's side: one probe per line of output, {"probe": name, ...}. ``SSL_CERT_FILE`` (the sandbox CA) is
# what the agent's clients trust; ORIGIN_CA is the origin's own CA, for the tls: skip probe only.
PROBES = r"""
import json, os, socket, ssl, sys, time

TLS, PLAIN = int(sys.argv[1]), int(sys.argv[2])
ORIGIN_CA = open("origin-ca.pem").read()

def report(name, **fields):
    print(json.dumps({"probe": name, **fields}), flush=True)

def read_all(sock, limit=5.0):
    sock.settimeout(limit)
    out = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return out, "eof"
            out += chunk
    except socket.timeout:
        return out, "timeout"
    except (ConnectionResetError, ssl.SSLError, OSError) as exc:
        return out, type(exc).__name__

def status_of(data):
    line = data.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None

def error_of(data):
    try:
        return json.loads(data.split(b"\r\n\r\n", 1)[1]).get("error")
    except Exception:
        return None

def tunnel(host, port):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(1)
        if not chunk:
            raise RuntimeError("proxy closed")
        head += chunk
    assert b" 200 " in head.split(b"\r\n")[0], head
    return s

def direct(host, port):
    address = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    return socket.create_connection((address, port), timeout=10)

def tls(sock, name, cadata=None):
    ctx = ssl.create_default_context(cadata=cadata) if cadata else ssl.create_default_context()
    return ctx.wrap_socket(sock, server_hostname=name)

def request(path, host, method="GET", target=None):
    return f"{method} {target or path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()

def probe(name, make, payload, pieces=1, pause=0.0):
    try:
        sock = make()
    except (ssl.SSLError, OSError) as exc:
        report(name, status=None, error=None, end="handshake:" + type(exc).__name__)
        return
    try:
        if pieces == 1:
            sock.sendall(payload)
        else:
            sock.sendall(payload[:1])
            time.sleep(pause)
            sock.sendall(payload[1:])
        data, end = read_all(sock)
    except (ssl.SSLError, OSError) as exc:
        data, end = b"", type(exc).__name__
    report(name, status=status_of(data), error=error_of(data), end=end)
    sock.close()

for host in ("plain.test", "rest.test"):
    other_tls, other_plain = f"other.test:{TLS}", f"other.test:{PLAIN}"
    # allowed, the control: proof that the refusals below are the binding, not a broken path
    probe(f"{host} ok tls", lambda: tls(tunnel(host, TLS), host), request(f"/ok-tls-{host}", f"{host}:{TLS}"))
    probe(f"{host} ok plain", lambda: direct(host, PLAIN), request(f"/ok-plain-{host}", f"{host}:{PLAIN}"))
    # fronting by Host
    probe(f"{host} host tls", lambda: tls(tunnel(host, TLS), host), request(f"/front-host-tls-{host}", other_tls))
    probe(f"{host} host plain connect", lambda: tunnel(host, PLAIN),
          request(f"/front-host-plain-connect-{host}", other_plain))
    probe(f"{host} host plain direct", lambda: direct(host, PLAIN),
          request(f"/front-host-plain-direct-{host}", other_plain))
    # fronting by absolute-form target (Host agreeing with it, or naming the tunnel)
    probe(f"{host} absolute tls", lambda: tls(tunnel(host, TLS), host),
          request("", other_tls, target=f"https://{other_tls}/front-abs-tls-{host}"))
    probe(f"{host} absolute plain", lambda: direct(host, PLAIN),
          request("", f"{host}:{PLAIN}", target=f"http://{other_plain}/front-abs-plain-{host}"))
    # fronting by SNI: the tunnel says one host, the ClientHello another
    probe(f"{host} sni", lambda: tls(tunnel(host, TLS), "other.test"), request(f"/front-sni-{host}", other_tls))
    # dialling the address: the SNI may only pick a name this sandbox's DNS issued for it (below), not any name
    probe(f"{host} sni direct", lambda: tls(direct(host, TLS), "unissued.test"),
          request(f"/front-sni-direct-{host}", f"unissued.test:{TLS}"))
    # a prefix split over two writes, and a ClientHello that comes late
    probe(f"{host} split plain", lambda: direct(host, PLAIN), request(f"/front-split-{host}", other_plain),
          pieces=2, pause=0.4)
    def late():
        sock = tunnel(host, TLS)
        time.sleep(0.5)
        return tls(sock, host)
    probe(f"{host} late hello", late, request(f"/front-late-{host}", other_tls))
    # a method no list of nine names
    probe(f"{host} method", lambda: direct(host, PLAIN), request(f"/front-method-{host}", other_plain, "PROPFIND"))
    # a TLS record with a version byte no TLS has: never relayed raw
    probe(f"{host} 160305", lambda: tunnel(host, TLS),
          b"\x16\x03\x05\x00\x05hello" + request(f"/front-160305-{host}", other_tls))

# two allowed names on one address (a CDN): dialled by address, each gets its own leaf, verified by name
first = socket.getaddrinfo("plain.test", TLS, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
second = socket.getaddrinfo("other.test", TLS, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
report("same address", same=first == second)
for name in ("plain.test", "other.test"):
    probe(f"cdn {name}", lambda: tls(socket.create_connection((first, TLS), timeout=10), name),
          request(f"/cdn-{name}", f"{name}:{TLS}"))

# tls: skip: the client's own TLS reaches the origin's own certificate
try:
    sock = tls(tunnel("skip.test", TLS), "skip.test", cadata=ORIGIN_CA)
    issuer = dict(x[0] for x in sock.getpeercert()["issuer"])
    sock.sendall(request("/skip", f"skip.test:{TLS}"))
    data, end = read_all(sock)
    report("skip", status=status_of(data), issuer=issuer.get("organizationName"), end=end)
except (ssl.SSLError, OSError) as exc:
    report("skip", status=None, error=type(exc).__name__)
"""


# A streamed response while the policy changes underneath (an unrelated rule is added), then one more request
# on the same kept-alive connection: both must go through (the new generation still allows the connection).
RELOAD = r"""
import http.client, json, os, sys, time

host, port = sys.argv[1], int(sys.argv[2])
conn = http.client.HTTPSConnection("127.0.0.1", 3128, timeout=30)
conn.set_tunnel(host, port)
conn.request("GET", "/slow/30")
response = conn.getresponse()
first = response.read(1024)
print("started", flush=True)
rest = response.read()
while not os.path.exists(f"reloaded-{host}"):
    time.sleep(0.05)
conn.request("GET", f"/after-reload-{host}")
second = conn.getresponse()
second.read()
print(json.dumps({"body": len(first) + len(rest), "second": second.status}), flush=True)
"""

UNRELATED_RULE = """
  unrelated:
    name: added while a response streams
    endpoints: [{host: unrelated.test, port: 443}]
    binaries: [{path: /usr/bin/curl}]
"""


@dataclass
class World:
    host: NetnsHost
    dns: DnsServer
    logs: tuple[Path, Path]
    policy: Path
    upstream_ca: Path
    workdir: Path
    runtime: str

    def _each(self) -> list[list[dict[str, Any]]]:
        return [[json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
                for log in self.logs]  # fmt: skip

    def mark(self) -> tuple[int, ...]:
        return tuple(len(seen) for seen in self._each())

    def requests(self, since: tuple[int, ...] | None = None) -> list[dict[str, Any]]:
        """What reached either origin (after ``since``, a :meth:`mark`)."""
        starts = since or (0,) * len(self.logs)
        return [entry for seen, start in zip(self._each(), starts, strict=True) for entry in seen[start:]]

    def dev(self) -> tuple[subprocess.CompletedProcess[str], dict[str, dict[str, Any]], list[dict[str, Any]]]:
        result = subprocess.run(
            [*CLI, "dev", "--log-format=json", f"--policy={self.policy}",
             f"--dns-server={self.dns.address[0]}:{self.dns.address[1]}", f"--upstream-ca={self.upstream_ca}",
             f"--workdir={self.workdir}", "--workdir-read-only", "--", "python3", "probes.py", str(TLS_PORT),
             str(PLAIN_PORT)],
            capture_output=True, text=True, timeout=240, env={**os.environ, "XDG_RUNTIME_DIR": self.runtime},
        )  # fmt: skip
        probes = {}
        for line in result.stdout.splitlines():
            if line.startswith("{"):
                entry = json.loads(line)
                probes[entry.pop("probe")] = entry
        events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
        return result, probes, events


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    require_netns()
    if os.geteuid() != 0:
        pytest.skip("dev mode runs the boundary in model R here (root)")
    root = Path(tempfile.mkdtemp(prefix="osb-front-"))
    runtime = tempfile.mkdtemp(prefix="osr-", dir="/tmp")
    try:
        ca = trustme.CA()
        leaf = ca.issue_cert(*NAMES)
        cert, key, ca_file = root / "cert.pem", root / "key.pem", root / "ca.pem"
        leaf.private_key_and_cert_chain_pem.write_to_path(str(key))
        for blob in leaf.cert_chain_pems:
            blob.write_to_path(str(cert), append=True)
        ca.cert_pem.write_to_path(str(ca_file))
        workdir = root / "agent"
        workdir.mkdir()
        (workdir / "probes.py").write_text(PROBES)
        (workdir / "reload.py").write_text(RELOAD)
        shutil.copy(ca_file, workdir / "origin-ca.pem")
        logs = (root / "tls.jsonl", root / "plain.jsonl")
        with open_test_host() as host:
            host.popen([sys.executable, str(RECORDER), host.address, str(TLS_PORT), str(cert), str(key), str(logs[0])],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
            host.popen([sys.executable, str(RECORDER), host.address, str(PLAIN_PORT), "-", "-", str(logs[1])],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
            with DnsServer({name: [host.address] for name in NAMES}) as dns:
                policy = root / "policy.yaml"
                policy.write_text(POLICY.format(tls=TLS_PORT, plain=PLAIN_PORT, address=host.address))
                subprocess.run(["chmod", "-R", "a+rwX", str(root)], check=True)
                for port in (TLS_PORT, PLAIN_PORT):
                    _wait(host.address, port)
                yield World(host, dns, logs, policy, ca_file, workdir, runtime)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)


def _wait(address: str, port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection((address, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"the origin on {address}:{port} did not come up")


REFUSED_BY_ANSWER = ("host tls", "host plain connect", "host plain direct", "split plain", "late hello", "method")


@dataclass
class Run:
    result: subprocess.CompletedProcess[str]
    probes: dict[str, dict[str, Any]]
    events: list[dict[str, Any]]
    seen: list[dict[str, Any]]


@pytest.fixture(scope="module")
def run(world: World) -> Run:
    before = world.mark()
    result, probes, events = world.dev()
    return Run(result, probes, events, world.requests(before))


def test_fronting_is_refused_everywhere_and_nothing_reaches_an_origin(run: Run) -> None:
    result, p, events, seen = run.result, run.probes, run.events, run.seen
    said = "\n".join(line for line in result.stderr.splitlines() if not line.startswith("{"))
    explain = f"stdout:\n{result.stdout}\nstderr (events left out):\n{said[-4000:]}"
    assert result.returncode == 0, explain
    paths = [r["path"] for r in seen]
    for host in ("plain.test", "rest.test"):
        # the controls went through, so each refusal below is the binding
        assert p[f"{host} ok tls"]["status"] == 200, explain
        assert p[f"{host} ok plain"]["status"] == 200, explain
        assert f"/ok-tls-{host}" in paths and f"/ok-plain-{host}" in paths, paths
        for name in REFUSED_BY_ANSWER:
            answer = p[f"{host} {name}"]
            assert (answer["status"], answer["error"]) == (403, "request_authority_mismatch"), (name, answer, explain)
        for name in ("absolute tls", "absolute plain"):  # refused with 403 or closed: never forwarded
            answer = p[f"{host} {name}"]
            assert answer["status"] in (403, None), (name, answer, explain)
        for name in ("sni", "sni direct", "160305"):  # the handshake never completes
            assert p[f"{host} {name}"]["status"] is None, (name, p[f"{host} {name}"], explain)
    assert not [path for path in paths if "front-" in path], f"fronted requests reached an origin: {paths}"
    assert not [r for r in seen if (r["host"] or "").startswith("other.test") and not r["path"].startswith("/cdn-")]
    mismatches = [
        e
        for e in events
        if e.get("event") in ("http", "http.tunnel")
        and ("request_authority_mismatch" in json.dumps(e) or "request-authority-mismatch" in json.dumps(e))
    ]
    assert mismatches, "each refusal is an event"


def test_two_names_on_one_address_each_get_their_own_leaf(run: Run) -> None:
    p = run.probes
    assert p["same address"]["same"], p
    for name in ("plain.test", "other.test"):  # each verified against its own name (hostname checking on)
        assert p[f"cdn {name}"]["status"] == 200, (name, p[f"cdn {name}"], run.result.stderr[-3000:])
        assert [r["host"] for r in run.seen if r["path"] == f"/cdn-{name}"] == [f"{name}:{TLS_PORT}"]


def test_tls_skip_relays_the_clients_own_tls(run: Run) -> None:
    p = run.probes
    assert p["skip"]["status"] == 200, run.result.stderr[-3000:]
    assert p["skip"]["issuer"].startswith("trustme"), p["skip"]  # the origin's certificate, not a sandbox leaf
    assert "/skip" in [r["path"] for r in run.seen]
    skip = [e for e in run.events if e.get("event") == "egress" and e.get("destination") == f"skip.test:{TLS_PORT}"]
    assert skip and not skip[0].get("inspected"), skip


@pytest.mark.parametrize("host", ["plain.test", "rest.test"])
def test_a_streamed_response_survives_an_unrelated_policy_reload(world: World, host: str) -> None:
    """Reloads re-decide each live inspected connection and close only those the new generation denies."""
    before = world.mark()
    env = {**os.environ, "XDG_RUNTIME_DIR": world.runtime}
    dev = subprocess.Popen(
        [*CLI, "dev", "--log-format=json", f"--policy={world.policy}",
         f"--dns-server={world.dns.address[0]}:{world.dns.address[1]}", f"--upstream-ca={world.upstream_ca}",
         f"--workdir={world.workdir}", "--workdir-read-only", "--", "python3", "reload.py", host, str(TLS_PORT)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert dev.stdout is not None
        assert dev.stdout.readline().strip() == "started", dev.stderr.read() if dev.stderr else ""
        revised = world.workdir.parent / f"revised-{host}.yaml"
        revised.write_text(world.policy.read_text() + UNRELATED_RULE)
        applied = subprocess.run([*CLI, "policy", "apply", str(revised)], capture_output=True, text=True,
                                 timeout=30, env=api_env(env))  # fmt: skip
        assert applied.returncode == 0, applied.stderr
        (world.workdir / f"reloaded-{host}").touch()
        out, err = dev.communicate(timeout=60)
    finally:
        with suppress(ProcessLookupError):
            dev.kill()
    result = json.loads(out.strip().splitlines()[-1])
    assert result == {"body": 30 * 1024, "second": 200}, (result, err[-3000:])
    events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert not [e for e in events if e.get("event") == "egress.revoked"], "nothing was revoked"
    later = [e for e in events if e.get("event") == "http" and e.get("path") == f"/after-reload-{host}"]
    assert later and later[0]["policy_generation"] == 1, later  # judged under the new generation
    assert f"/after-reload-{host}" in [r["path"] for r in world.requests(before)]
