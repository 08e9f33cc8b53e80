"""E2e fixtures for attacking the egress path from the agent's side.

One module-scoped :class:`AttackWorld` per test module:

* a **test host** (its own network namespace) running :data:`HOST_SERVER`, a small asyncio TCP server whose
  behaviour depends on the port (echo, reply-after-EOF, server-closes-first, reset mid-transfer, endless drip
  raw or as an HTTP answer),
  plus UDP sinks that must never receive a datagram; every accepted connection is logged with its time;
* **traps** on ``127.0.0.1`` in the root namespace (where control runs) on two ephemeral ports the policy
  names: if control could be talked into dialling loopback, a connection would wait in a trap's backlog;
* the test's own **DNS server**: ``api.test`` → the host, ``loop.test`` and ``localhost`` → 127.0.0.1,
  ``rebind.test`` → the host once, then 127.0.0.1;
* a **policy**: ``api.test`` on the host's ports (allowed_ips the host), a hostless endpoint on trap port
  ``p1`` (every host name matches, so only address vetting can refuse), and ``loop.test``/``rebind.test``
  named exactly on trap port ``p2`` (internal answers allowed, loopback never);
* agent-side Python helpers (:data:`AGENT_PRELUDE`, run by ``/usr/bin/python3`` as uid 1000: pyenv under
  /root is unreadable to it) that print one JSON line per probe.

``world.run_agent(body)`` writes the prelude plus ``body`` to a 0755 directory, runs it as the agent in dev
mode and returns the probes (name → result), the daemons' JSON events and the completed process.
``world.start(argv)`` is the same with a :class:`DevRun` handle for tests that act while the agent runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

from tests.netns_hosts import DnsServer, NetnsHost, open_test_host, rebinding, require_netns

CLI = [sys.executable, "-m", "supervisor.cli"]
AGENT_PYTHON = "/usr/bin/python3"  # readable by the agent's uid, unlike pyenv under /root

# ports of the test host's server (HOST_SERVER); all named by the policy, so all are capture ports too
ECHO_PORT = 9001  # echo until EOF, then close
AFTER_EOF_PORT = 9002  # read until EOF, then answer "got <n> <sha256>"
SERVER_FIRST_PORT = 9003  # greet, half-close, read until EOF, log what arrived
RESET_PORT = 9004  # HTTP/1.0 close-delimited response, part of a body, then RST
DRIP_PORT = 9005  # 1 KiB every 20 ms until the peer goes away, from the moment it connects (server-first)
UDP_PORT = 9006  # UDP sink (also one on 53): nothing may ever arrive
HTTP_DRIP_PORT = 9007  # the drip as an HTTP answer: read a request head, a close-delimited 200, then the drip
HOST_TCP_PORTS = (ECHO_PORT, AFTER_EOF_PORT, SERVER_FIRST_PORT, RESET_PORT, DRIP_PORT, HTTP_DRIP_PORT)

POLICY = """\
version: 1
network_policies:
  test-api:
    endpoints:
      - host: api.test
        ports: [{ports}]
        allowed_ips: ["{address}/32"]
    binaries:
      - path: /usr/bin/curl
      - path: /usr/bin/python3*
  hostless:
    endpoints:
      - ports: [{p1}]
        allowed_ips: ["{address}/32"]
    binaries:
      - path: /usr/bin/curl
      - path: /usr/bin/python3*
  named-internal:
    endpoints:
      - host: loop.test
        port: {p2}
      - host: rebind.test
        port: {p2}
    binaries:
      - path: /usr/bin/curl
      - path: /usr/bin/python3*
"""

HOST_SERVER = r'''
"""Test-host server: python3 server.py ADDRESS LOGDIR ECHO AFTER_EOF SERVER_FIRST RESET DRIP HTTP_DRIP EXTRA_ECHO..."""
import asyncio, hashlib, socket, struct, sys, time

ADDRESS, LOGDIR = sys.argv[1], sys.argv[2]
ECHO, AFTER_EOF, SERVER_FIRST, RESET, DRIP, HTTP_DRIP = (int(p) for p in sys.argv[3:9])
EXTRA_ECHO = [int(p) for p in sys.argv[9:]]


def log(name, line):
    with open(f"{LOGDIR}/{name}", "a") as f:
        f.write(line + "\n")


async def read_all(reader):
    digest, size = hashlib.sha256(), 0
    while data := await reader.read(65536):
        digest.update(data)
        size += len(data)
    return size, digest.hexdigest()


async def echo(reader, writer):
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()


async def after_eof(reader, writer):
    size, digest = await read_all(reader)
    writer.write(f"got {size} {digest}\n".encode())
    await writer.drain()


async def server_first(reader, writer):
    writer.write(b"hello from the server\n")
    await writer.drain()
    writer.write_eof()
    size, digest = await read_all(reader)
    log("server-first.log", f"received {size} {digest}")


async def reset(reader, writer):
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: application/octet-stream\r\n\r\n" + b"x" * 65536)
    await writer.drain()
    await asyncio.sleep(0.3)  # let it arrive: the reset must come mid-transfer, not instead of it
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def drip(reader, writer):
    while True:
        writer.write(b"d" * 1024)
        await writer.drain()
        await asyncio.sleep(0.02)


async def http_drip(reader, writer):
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n")
    while True:
        writer.write(b"d" * 1024)
        await writer.drain()
        await asyncio.sleep(0.02)


def handler(port, work):
    async def handle(reader, writer):
        peer = writer.get_extra_info("peername")
        log("accepts.log", f"{time.time():.6f} {port} {peer[0]}:{peer[1]}")
        try:
            await work(reader, writer)
        except (OSError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()
    return handle


async def main():
    table = {ECHO: echo, AFTER_EOF: after_eof, SERVER_FIRST: server_first, RESET: reset, DRIP: drip,
             HTTP_DRIP: http_drip}
    table.update({port: echo for port in EXTRA_ECHO})
    servers = [await asyncio.start_server(handler(p, w), ADDRESS, p, backlog=4096) for p, w in table.items()]
    log("ready", "ready")
    await asyncio.gather(*(s.serve_forever() for s in servers))


asyncio.run(main())
'''

AGENT_PRELUDE = r'''
import hashlib, json, os, socket, sys, time

CONFIG = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "config.json")))
HOST = CONFIG["host"]
PROXY = ("127.0.0.1", 3128)


def report(probe, **fields):
    print(json.dumps({"probe": probe, **fields}), flush=True)


def outcome(exc):
    """What an agent would see, named: refused / reset / timeout / error:<errno name>."""
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, (ConnectionResetError, BrokenPipeError)):
        return "reset"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "timeout"
    import errno
    return "error:" + errno.errorcode.get(getattr(exc, "errno", 0) or 0, type(exc).__name__)


def dial(host, port, timeout=30.0):
    """A connected socket, or the outcome string of the failed connect. The timeout is a budget for a loaded
    machine, not a measurement: no probe expects a timeout, so a long one only slows a failure."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect((host, port))
    except OSError as exc:
        sock.close()
        return outcome(exc)
    return sock


def read_to_end(sock, limit=1 << 24):
    """(bytes, end) where end is "eof" for a clean close, else the outcome of the error."""
    data = bytearray()
    try:
        while len(data) < limit:
            chunk = sock.recv(65536)
            if not chunk:
                return bytes(data), "eof"
            data += chunk
    except OSError as exc:
        return bytes(data), outcome(exc)
    return bytes(data), "limit"


def status_of(data):
    line = data.split(b"\r\n", 1)[0].split()
    return int(line[1]) if len(line) >= 2 and line[0].startswith(b"HTTP/") and line[1].isdigit() else None


def body_of(data):
    body = data.partition(b"\r\n\r\n")[2]
    try:
        return json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")


def connect_head(authority, extra=b""):
    return f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n".encode() + extra + b"\r\n"


def get_head(authority, version="1.1"):
    """An absolute-form GET for the proxy listener."""
    return f"GET http://{authority}/ HTTP/{version}\r\nHost: {authority}\r\n\r\n".encode()


def proxy_raw(raw, timeout=30.0):
    """Send raw bytes to the proxy listener; the whole answer, its status and how the connection ended."""
    sock = dial(*PROXY, timeout=timeout)
    if isinstance(sock, str):
        return {"status": None, "end": sock, "body": None}
    try:
        sock.sendall(raw)
        data, end = read_to_end(sock)
    except OSError as exc:
        data, end = b"", outcome(exc)
    finally:
        sock.close()
    return {"status": status_of(data), "end": end, "body": body_of(data)}


def tunnel(authority, timeout=30.0):
    """CONNECT through the proxy: (socket, None) once established, else (None, answer)."""
    sock = dial(*PROXY, timeout=timeout)
    if isinstance(sock, str):
        return None, {"status": None, "end": sock, "body": None}
    sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    head = bytearray()
    try:
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(1)
            if not chunk:
                break
            head += chunk
    except OSError as exc:
        sock.close()
        return None, {"status": None, "end": outcome(exc), "body": None}
    if status_of(bytes(head)) == 200:
        return sock, None
    rest, end = read_to_end(sock)
    sock.close()
    return None, {"status": status_of(bytes(head)), "end": end, "body": body_of(bytes(head) + rest)}


def echo_check(sock, payload=b"ping"):
    """Through an echo server: the payload comes back before we half-close (so the connection was admitted
    first), then the end of the connection. The payload is sent as a line: control waits for more of a first
    line that could still become an HTTP request line ("attempt 1 HTTP/1.1"), and a newline ends that doubt."""
    got = bytearray()
    line = payload + b"\n"
    try:
        sock.sendall(line)
        while len(got) < len(line):
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
        sock.shutdown(socket.SHUT_WR)
        rest, end = read_to_end(sock)
    except OSError as exc:
        rest, end = b"", outcome(exc)
    sock.close()
    return {"end": end, "data": (bytes(got) + rest).removesuffix(b"\n")[:200].decode("utf-8", "replace")}


def wait_end(sock):
    """Send nothing, read until the connection ends: how did it end?"""
    data, end = read_to_end(sock)
    sock.close()
    return {"end": end, "data": data[:200].decode("utf-8", "replace")}


def dial_and_wait_end(host, port):
    """Dial, send nothing, read until the connection ends: {"connect": ..., "end": ..., "data": ...}.
    ECONNRESET from connect() means the handshake completed (a listener accepted: an RST in SYN-SENT is
    ECONNREFUSED) and the RST arrived before this process looked at the socket, as it does on a loaded
    machine: the same outcome as a connection that was accepted and then reset."""
    sock = dial(host, port)
    if sock == "reset":
        return {"connect": "ok", "end": "reset", "data": ""}
    if isinstance(sock, str):
        return {"connect": sock}
    return {"connect": "ok", **wait_end(sock)}


def dns_query(name, qtype=1, qid=0x4242):
    """A minimal DNS query (RD set) for ``name``; the agent has no dnspython."""
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.strip(".").split("."))
    return qid.to_bytes(2, "big") + b"\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + labels + b"\x00" + \
        qtype.to_bytes(2, "big") + b"\x00\x01"


def udp_probe(host, port, payload, wait=1.0):
    """Send one datagram and wait for an answer: "answered:<n bytes>", "refused", or "silent"."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    sock.settimeout(wait)
    try:
        sock.connect((host, port))
        sock.send(payload)
        data = sock.recv(65535)
        return f"answered:{len(data)}", data
    except (socket.timeout, TimeoutError):
        return "silent", b""
    except OSError as exc:
        return outcome(exc), b""
    finally:
        sock.close()


def exchange(sock, payload=b"", half_close=True):
    """Send, optionally half-close, read to the end: what came back and how it ended."""
    try:
        sock.sendall(payload)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
    except OSError as exc:
        sock.close()
        return {"end": outcome(exc), "data": ""}
    data, end = read_to_end(sock)
    sock.close()
    return {"end": end, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "data": data[:200].decode("utf-8", "replace")}
'''


@dataclass
class Trap:
    """A listener nobody may reach: a connection would wait, accepted by the kernel, in its backlog."""

    sock: socket.socket
    udp: socket.socket

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def reached(self) -> list[str]:
        hits = []
        for sock in (self.sock, self.udp):
            sock.setblocking(False)
            while True:
                try:
                    if sock.type == socket.SOCK_STREAM:
                        conn, peer = sock.accept()
                        conn.close()
                    else:
                        _, peer = sock.recvfrom(65535)
                except BlockingIOError:
                    break
                hits.append(f"{'tcp' if sock.type == socket.SOCK_STREAM else 'udp'} from {peer}")
        return hits


def _trap() -> Trap:
    """TCP and UDP on the same free loopback port of the root namespace. Chosen below the ephemeral range:
    a busy machine (benchmarks leave tens of thousands of TIME-WAIT sockets) can make ``bind(0)`` fail."""
    rng = random.Random()
    for _attempt in range(200):
        port = rng.randrange(20000, 32000)
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            tcp.bind(("127.0.0.1", port))
            udp.bind(("127.0.0.1", port))
        except OSError:
            tcp.close()
            udp.close()
            continue
        tcp.listen(64)
        return Trap(tcp, udp)
    raise OSError("no loopback port free for a trap")


@dataclass
class Agent:
    """What one agent run left behind."""

    result: subprocess.CompletedProcess[str]
    probes: dict[str, dict[str, Any]]
    events: list[dict[str, Any]]

    def egress(self, destination: str | None = None, capture: str | None = None) -> list[dict[str, Any]]:
        """Control's decision events, optionally for one destination and capture kind."""
        return [
            e for e in self.events
            if e.get("event") == "egress" and destination in (None, e.get("destination"))
            and capture in (None, e.get("capture"))
        ]  # fmt: skip

    def explain(self) -> str:
        """The agent's output and the egress/DNS events, for assertion messages."""
        keep = ("egress", "dns", "link", "lifecycle", "control", "boundary")
        events = [
            json.dumps({k: v for k, v in e.items() if k not in ("time", "sandbox", "binary_sha256", "ancestors")})
            for e in self.events if str(e.get("event", "")).startswith(keep)
        ]  # fmt: skip
        other = [line for line in self.result.stderr.splitlines() if not line.startswith("{")]
        return "\n".join(["stdout:", self.result.stdout[-3000:], "events:", *events[-60:], "stderr:", *other[-30:]])


def _events(text: str) -> list[dict[str, Any]]:
    events = []
    for line in text.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
    return events


def _probes(stdout: str) -> dict[str, dict[str, Any]]:
    probes: dict[str, dict[str, Any]] = {}
    for line in stdout.splitlines():
        if line.startswith('{"probe"'):
            obj = json.loads(line)
            probes[obj.pop("probe")] = obj
    return probes


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, NUL-joined argv) of every live child of ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != pid:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        found.append((int(entry), argv))
    return found


class DevRun:
    """A dev-mode sandbox running in the background; the agent's stdout is read line by line."""

    def __init__(self, argv: list[str], env: dict[str, str], scratch: Path) -> None:
        self._stderr_path = scratch / f"dev-{time.monotonic_ns()}.stderr"
        # a file, not a pipe, so that thousands of event lines never block the daemons; closed in finish()
        self._stderr: IO[str] = open(self._stderr_path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._stderr, text=True, env=env)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stdout: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next_probe(self, timeout: float) -> dict[str, Any] | None:
        """The agent's next JSON probe line (others are kept in ``stdout``), or None at EOF / timeout."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                return None
            if line is None:
                self.lines.put(None)
                return None
            self.stdout.append(line)
            if line.startswith('{"probe"'):
                obj: dict[str, Any] = json.loads(line)
                return obj
        return None

    def child(self, mode: str, timeout: float = 30.0) -> int:
        """The pid of dev's daemon child running ``--mode=<mode>``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for pid, argv in _children(self.proc.pid):
                if f"--mode={mode}" in argv.split("\0"):
                    return pid
            time.sleep(0.05)
        raise AssertionError(f"no {mode} child of dev pid {self.proc.pid}")

    def boundary_port(self, timeout: float = 30.0) -> int:
        """The boundary's link port (on 127.0.0.1 of the root namespace), from its --port-file."""
        pid = self.child("boundary")
        argv = dict(_children(self.proc.pid))[pid].split("\0")
        port_file = Path(next(a for a in argv if a.startswith("--port-file=")).split("=", 1)[1])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                return int(port_file.read_text())
            time.sleep(0.05)
        raise AssertionError("the boundary never wrote its port file")

    def stderr_text(self) -> str:
        self._stderr.flush()
        return self._stderr_path.read_text()

    def finish(self, timeout: float = 90.0) -> Agent:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self._reader.join(10)
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.stdout.append(line)
        self._stderr.close()
        stdout, stderr = "".join(self.stdout), self._stderr_path.read_text()
        self._stderr_path.unlink(missing_ok=True)
        result = subprocess.CompletedProcess(self.proc.args, self.proc.returncode, stdout, stderr)
        return Agent(result, _probes(stdout), _events(stderr))

    def kill(self) -> None:
        """Stop the whole sandbox (dev's SIGTERM handler tears down the daemons and the agent)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
                self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class AttackWorld:
    host: NetnsHost
    dns: DnsServer
    policy: Path
    runtime: str
    agent_dir: Path  # 0755: scripts and config for the agent; files the agent may read
    logdir: Path  # the test host server's logs
    trap_any_host: Trap  # p1: hostless endpoint, any name matches
    trap_named: Trap  # p2: loop.test / rebind.test named exactly
    udp_sinks: dict[int, socket.socket] = field(default_factory=dict)
    _scripts: int = 0
    # how ``openshell-sandbox`` is run for dev (a twin's runs its daemons with one protection off:
    # tests/controls_dev.py)
    cli: list[str] = field(default_factory=lambda: list(CLI))

    @property
    def p1(self) -> int:
        return self.trap_any_host.port

    @property
    def p2(self) -> int:
        return self.trap_named.port

    def dev_argv(self, agent_argv: list[str]) -> list[str]:
        # The scripts' directory is the workdir: the agent's own root holds nothing else of the host's /tmp.
        return [*self.cli, "dev", "--log-format=json", f"--policy={self.policy}",
                f"--dns-server={self.dns.address[0]}:{self.dns.address[1]}", f"--workdir={self.agent_dir}",
                "--workdir-read-only", "--", *agent_argv]  # fmt: skip

    def script(self, body: str) -> str:
        """Write prelude + body for the agent; returns the path."""
        self._scripts += 1
        path = self.agent_dir / f"agent{self._scripts}.py"
        path.write_text(AGENT_PRELUDE + "\n" + body)
        path.chmod(0o644)
        return str(path)

    def start(self, agent_argv: list[str]) -> DevRun:
        return DevRun(self.dev_argv(agent_argv), {**os.environ, "XDG_RUNTIME_DIR": self.runtime}, self.agent_dir.parent)

    def run_agent(self, body: str, *, timeout: float = 90.0) -> Agent:
        """Run prelude + ``body`` as the agent (``/usr/bin/python3``) in dev mode, to the end."""
        return self.start([AGENT_PYTHON, self.script(body)]).finish(timeout)

    def run_shell(self, script: str, *, timeout: float = 90.0) -> Agent:
        return self.start(["sh", "-c", script]).finish(timeout)

    def accepts(self, port: int | None = None) -> list[tuple[float, int]]:
        """(time, port) of every connection the test host's server accepted."""
        path = self.logdir / "accepts.log"
        if not path.exists():
            return []
        rows = [(float(t), int(p)) for t, p, _peer in (line.split() for line in path.read_text().splitlines())]
        return [r for r in rows if port in (None, r[1])]

    def log_lines(self, name: str) -> list[str]:
        path = self.logdir / name
        return path.read_text().splitlines() if path.exists() else []

    def udp_received(self) -> list[str]:
        hits = []
        for port, sock in self.udp_sinks.items():
            while True:
                try:
                    data, peer = sock.recvfrom(65535)
                except BlockingIOError:
                    break
                hits.append(f"udp:{port} {len(data)} bytes from {peer}")
        return hits


@contextlib.contextmanager
def open_attack_world() -> Iterator[AttackWorld]:
    require_netns()
    if os.geteuid() != 0:
        pytest.skip("dev mode runs the boundary in model R here (root)")
    if not os.access(AGENT_PYTHON, os.X_OK):
        pytest.skip(f"{AGENT_PYTHON} is needed: the agent's uid cannot read pyenv's python")
    if shutil.which("curl") is None:
        pytest.skip("curl is needed as a real client")
    scratch = Path(tempfile.mkdtemp(prefix="osb-attack-"))
    runtime = tempfile.mkdtemp(prefix="osr-", dir="/tmp")
    traps: list[Trap] = []
    try:
        os.chmod(scratch, 0o755)
        agent_dir, logdir = scratch / "agent", scratch / "log"
        agent_dir.mkdir(mode=0o755)
        logdir.mkdir()
        os.chmod(agent_dir, 0o755)
        traps = [_trap(), _trap()]
        with open_test_host() as host:
            server = scratch / "host_server.py"
            server.write_text(HOST_SERVER)
            host.popen([sys.executable, str(server), host.address, str(logdir), *map(str, HOST_TCP_PORTS),
                        str(traps[0].port), str(traps[1].port)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
            sinks = {}
            for port in (UDP_PORT, 53):
                sock = host.socket(socket.AF_INET, socket.SOCK_DGRAM)
                sock.bind((host.address, port))
                sock.setblocking(False)
                sinks[port] = sock
            records = {"api.test": [host.address], "loop.test": ["127.0.0.1"], "localhost": ["127.0.0.1"]}
            with DnsServer(records, sequences={"rebind.test": rebinding(host.address)}) as dns:
                policy = scratch / "policy.yaml"
                ports = ", ".join(map(str, (8000, *HOST_TCP_PORTS)))
                policy.write_text(POLICY.format(ports=ports, address=host.address, p1=traps[0].port,
                                                p2=traps[1].port))  # fmt: skip
                (agent_dir / "config.json").write_text(json.dumps({
                    "host": host.address, "p1": traps[0].port, "p2": traps[1].port, "echo": ECHO_PORT,
                    "after_eof": AFTER_EOF_PORT, "server_first": SERVER_FIRST_PORT, "reset": RESET_PORT,
                    "drip": DRIP_PORT, "http_drip": HTTP_DRIP_PORT, "udp": UDP_PORT,
                }))  # fmt: skip
                (agent_dir / "config.json").chmod(0o644)
                deadline = time.monotonic() + 15
                while not (logdir / "ready").exists():
                    if time.monotonic() > deadline:
                        raise AssertionError("the test host's server did not come up")
                    time.sleep(0.05)
                world = AttackWorld(host, dns, policy, runtime, agent_dir, logdir, traps[0], traps[1], sinks)
                try:
                    yield world
                finally:
                    for sock in sinks.values():
                        sock.close()
    finally:
        for trap in traps:
            trap.sock.close()
            trap.udp.close()
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)


@pytest.fixture(scope="module")
def attack_world() -> Iterator[AttackWorld]:
    with open_attack_world() as world:
        yield world
