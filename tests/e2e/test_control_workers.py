"""Control with two worker processes (``--workers=2``), attacked from the agent's side: what one process learnt
must hold in the other.

The boundary hands connections to its egress links in turn, and control's two processes hold two links each, so
consecutive connections land on both processes; every test checks, from the events' ``worker`` field, that they
did. Each asserts what the agent got, what control logged, and what reached the origin (a recorder on a test
host).

* A binary swapped between two connections is refused in the other process too: the pin has one owner.
* A DNS answer one process gave is honoured by the other: a transparent connection to the issued address is
  decided as the name.
* After the boundary acknowledged a policy generation, no process admits anything under the older one, even
  when compiling the new policy takes a worker seconds.
* Control told to end logs the end of every process's tunnels before it exits.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.safe_dirs import safe_dir
from tests.netns_hosts import DnsServer, NetnsHost, open_test_host, require_netns
from tests.sandbox_api import api_env

CLI = [sys.executable, "-m", "supervisor.cli"]
RECORDER = Path(__file__).parent.parent / "https_recorder.py"
PORT = 8000
SLOW_PORT = 8001  # an origin that answers every request with an endless body, a byte at a time
SLOW_ORIGIN = """
import socket, sys, threading, time
def serve(conn):
    try:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: 100000000\\r\\n\\r\\n")
        while True:
            conn.sendall(b".")
            time.sleep(0.1)
    except OSError:
        conn.close()
listener = socket.create_server((sys.argv[1], int(sys.argv[2])), backlog=64)
while True:
    threading.Thread(target=serve, args=(listener.accept()[0],), daemon=True).start()
"""
AGENT = 61000  # the agent's uid and gid (dev's --agent-user)
MODELS = ["R", "U"]


@dataclass
class Origin:
    host: NetnsHost
    dns: DnsServer
    log: Path

    def paths(self) -> list[str]:
        """The paths of every request that reached the origin."""
        if not self.log.exists():
            return []
        return [json.loads(line)["path"] for line in self.log.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def origin() -> Iterator[Origin]:
    require_netns()
    if os.geteuid() != 0:
        pytest.skip("dev mode runs the boundary in model R here (root)")
    if shutil.which("curl") is None:
        pytest.skip("curl is needed as a real client")
    scratch = Path(tempfile.mkdtemp(prefix="osb-workers-"))
    try:
        with open_test_host() as host:
            log = scratch / "requests.jsonl"
            servers = [
                host.popen([sys.executable, str(RECORDER), host.address, str(PORT), "-", "-", str(log)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
                host.popen([sys.executable, "-c", SLOW_ORIGIN, host.address, str(SLOW_PORT)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
            ]  # fmt: skip
            try:
                with DnsServer({"api.test": [host.address]}) as dns:
                    _wait_port(host.address, PORT)
                    _wait_port(host.address, SLOW_PORT)
                    yield Origin(host, dns, log)
            finally:
                for server in servers:
                    server.kill()
                    server.wait()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _wait_port(address: str, port: int) -> None:
    import socket

    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            socket.create_connection((address, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("the test origin did not come up")


def _policy(origin: Origin, binary: str, *, fillers: int = 0, port: int = PORT) -> str:
    text = (
        "version: 1\nnetwork_policies:\n  api:\n    endpoints:\n"
        f'      - host: api.test\n        port: {port}\n        allowed_ips: ["{origin.host.address}/32"]\n'
        f"    binaries:\n      - path: {binary}\n"
    )
    for i in range(fillers):  # rules that allow nothing reachable: only the compile gets slower
        text += f"  filler{i}:\n    endpoints:\n      - host: f{i}.filler.invalid\n        port: 443\n"
        text += "    binaries:\n      - path: /usr/bin/curl\n"
    return text


LINKS = 4  # two egress links per process (control's default), two processes


class Dev:
    """One dev sandbox with ``--workers=2``, its output in files (a pipe left unread would stall it). The agent's
    script starts only once :meth:`release` saw every process's egress links up: a worker dials its own after
    the attach, and a connection made before would land on the primary alone."""

    def __init__(self, origin: Origin, workdir: Path, policy: Path, script: str, *, runtime: str, model: str = "R",
                 scratch: Path) -> None:  # fmt: skip
        self.runtime = runtime
        self.go = workdir / "go"
        gate = f"while [ ! -e {self.go} ]; do sleep 0.05; done; "
        argv = [*CLI, "dev", "--log-format=json", "--workers=2", f"--privilege-model={model}", f"--policy={policy}",
                f"--agent-user={AGENT}:{AGENT}", f"--workdir={workdir}",
                f"--dns-server={origin.dns.address[0]}:{origin.dns.address[1]}",
                "--", "sh", "-c", gate + script]  # fmt: skip
        self.out, self.err = scratch / "dev.out", scratch / "dev.err"
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True,
                                         env={**os.environ, "XDG_RUNTIME_DIR": runtime})  # fmt: skip

    def status(self) -> dict[str, Any] | None:
        env = api_env({**os.environ, "XDG_RUNTIME_DIR": self.runtime})  # the socket appears once dev is up
        done = subprocess.run([*CLI, "status", "--json"], capture_output=True, text=True, timeout=30, env=env)
        return json.loads(done.stdout) if done.returncode == 0 else None

    def wait_status(self, ok: Callable[[dict[str, Any]], bool], what: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        seen: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"dev ended while waiting for {what}: {self.err.read_text()[-3000:]}")
            seen = self.status()
            if seen is not None and ok(seen):
                return seen
            time.sleep(0.1)
        raise AssertionError(f"status never showed {what}: {json.dumps(seen)[-2000:]}")

    def release(self) -> None:
        self.wait_status(lambda s: s["egress"]["links"] == LINKS, f"{LINKS} egress links")
        self.go.touch()

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.err.read_text().splitlines() if line.startswith("{")]

    def wait_event(self, ok: Callable[[dict[str, Any]], bool], what: str, timeout: float = 90) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = next((e for e in self.events() if ok(e)), None)
            if found is not None:
                return found
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no {what} event: {self.err.read_text()[-3000:]}")

    def finish(self, timeout: float = 180) -> Run:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        return Run(self.out.read_text(), self.err.read_text(), self.events())


@dataclass
class Run:
    stdout: str
    stderr: str
    events: list[dict[str, Any]]

    def egress(self, **match: object) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == "egress" and all(e.get(k) == v for k, v in match.items())]


def _workers_of(events: list[dict[str, Any]]) -> set[int]:
    """Which control processes an event list came from (the primary's events carry no ``worker``)."""
    return {int(e.get("worker", 0)) for e in events}


@pytest.fixture
def workdir() -> Iterator[Path]:
    with safe_dir("osb-workers-work-", owner=AGENT) as path:
        yield path


@pytest.fixture
def runtime() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="osr-", dir="/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("model", MODELS)
def test_a_binary_swapped_between_connections_is_refused_by_every_worker(
    origin: Origin, workdir: Path, runtime: str, tmp_path: Path, model: str
) -> None:
    tool = workdir / "tool"
    policy = tmp_path / "policy.yaml"
    policy.write_text(_policy(origin, str(tool)))
    before = origin.paths()
    # The agent copies curl to its workdir (the policy allows that path), uses it once (the pin), then changes
    # the file and tries again: four connections, which the links' rotation spreads over both processes.
    url = f"http://api.test:{PORT}"
    script = (
        f"cp /usr/bin/curl {tool} && {tool} -s -o /dev/null -w 'first %{{http_code}}\\n' {url}/pinned-{model}; "
        f"printf 'x' >> {tool}; "
        f"for i in 1 2 3 4; do {tool} -s -o /dev/null -w 'swapped %{{http_code}}\\n' {url}/swapped-{model}-$i; done"
    )
    dev = Dev(origin, workdir, policy, script, model=model, runtime=runtime, scratch=tmp_path)
    dev.release()
    run = dev.finish()
    assert "first 200" in run.stdout, run.stderr[-3000:]
    answers = [line for line in run.stdout.splitlines() if line.startswith("swapped")]
    assert answers == ["swapped 403"] * 4, run.stdout

    allowed = run.egress(decision="allow")
    refused = run.egress(decision="deny")
    assert len(allowed) == 1 and len(refused) == 4
    assert {e.get("reason") for e in refused} == {"binary-digest-changed"}
    assert _workers_of(refused) == {0, 1}, refused  # refused by both processes, whichever pinned it
    reached = origin.paths()[len(before) :]
    assert reached == [f"/pinned-{model}"]  # nothing of the swapped binary reached the origin


def test_a_dns_answer_given_by_one_worker_is_honoured_by_the_other(
    origin: Origin, workdir: Path, runtime: str, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(_policy(origin, "/usr/bin/curl"))
    before = origin.paths()
    # No proxy: curl asks the sandbox's DNS (the boundary's stub, over whichever egress link is next), then dials
    # the address it got, captured transparently on the next link. Each must be decided as api.test, whichever
    # process the connection landed on.
    script = (
        f"for i in 1 2 3 4; do curl --noproxy '*' -s -o /dev/null -w 'direct %{{http_code}}\\n' "
        f"http://api.test:{PORT}/by-address-$i; done"
    )
    dev = Dev(origin, workdir, policy, script, runtime=runtime, scratch=tmp_path)
    dev.release()
    run = dev.finish()
    answers = [line for line in run.stdout.splitlines() if line.startswith("direct")]
    assert answers == ["direct 200"] * 4, (run.stdout, run.stderr[-3000:])
    dns = [e for e in run.events if e.get("event") == "dns" and e.get("decision") == "answered"]
    assert dns and all(e.get("worker") is None for e in dns)  # answered (and recorded) by the primary
    allowed = run.egress(decision="allow")
    assert len(allowed) == 4 and all(e.get("name") == "api.test" for e in allowed), allowed
    assert {e.get("capture") for e in allowed} == {"transparent"}
    assert _workers_of(allowed) == {0, 1}, allowed
    assert origin.paths()[len(before) :] == [f"/by-address-{i}" for i in range(1, 5)]


def test_nothing_is_admitted_under_the_old_generation_after_the_boundary_acknowledged_the_new(
    origin: Origin, workdir: Path, runtime: str, tmp_path: Path
) -> None:
    """The new policy denies curl and is slow to compile (thousands of rules); the agent waits until the boundary
    has acknowledged it (a file the test writes once the event is out), then connects four times."""
    with safe_dir() as directory:  # a watched policy file: under /tmp it would be loaded once
        policy = directory / "policy.yaml"
        policy.write_text(_policy(origin, "/usr/bin/curl"))
        acked = workdir / "acked"
        url = f"http://api.test:{PORT}"
        script = (
            f"curl -s -o /dev/null -w 'before %{{http_code}}\\n' {url}/before; "
            f"while [ ! -e {acked} ]; do sleep 0.05; done; "
            f"for i in 1 2 3 4; do curl -s -o /dev/null -w 'after %{{http_code}}\\n' {url}/after-$i; done"
        )
        before = origin.paths()
        dev = Dev(origin, workdir, policy, script, runtime=runtime, scratch=tmp_path)
        try:
            dev.release()
            dev.wait_event(lambda e: e.get("event") == "egress" and e.get("decision") == "allow", "allowed egress")
            # the first connection is in: now the slow revision (deny: curl is no longer the binary)
            staged = directory / "policy.tmp"
            staged.write_text(_policy(origin, "/nonexistent/tool", fillers=3000))
            staged.rename(policy)
            dev.wait_event(lambda e: e.get("event") == "policy.acknowledged" and e.get("policy_generation") == 1,
                           "policy.acknowledged of generation 1")  # fmt: skip
            # what status says of the worker, as an operator reads it (its figures are at most 0.5 s old)
            dev.wait_status(lambda s: [w["generation"] for w in s.get("workers") or []] == [1], "the worker at 1")
            env = api_env({**os.environ, "XDG_RUNTIME_DIR": runtime})
            human = subprocess.run([*CLI, "status"], capture_output=True, text=True, timeout=30, env=env)
            assert "workers     2 processes" in human.stdout, human.stdout
            acked.touch()
        finally:
            run = dev.finish()
        assert run.stdout.splitlines() == ["before 200", *["after 403"] * 4], run.stderr[-3000:]
        refused = run.egress(decision="deny")
        assert len(refused) == 4 and all(e.get("policy_generation") == 1 for e in refused), refused
        assert _workers_of(refused) == {0, 1}, refused
        assert origin.paths()[len(before) :] == ["/before"]


def test_a_revision_cuts_the_live_tunnels_of_every_worker(
    origin: Origin, workdir: Path, runtime: str, tmp_path: Path
) -> None:
    """Four endless downloads, spread over both processes; a revision that denies them cuts all four."""
    with safe_dir() as directory:
        policy = directory / "policy.yaml"
        policy.write_text(_policy(origin, "/usr/bin/curl", port=SLOW_PORT))
        url = f"http://api.test:{SLOW_PORT}/endless"
        script = (
            f"for i in 1 2 3 4; do curl -s -o /dev/null -w 'ended %{{http_code}} %{{exitcode}}\\n' {url}-$i & "
            "sleep 0.3; done; wait"
        )
        dev = Dev(origin, workdir, policy, script, runtime=runtime, scratch=tmp_path)
        try:
            dev.release()
            status = dev.wait_status(lambda s: s["egress"]["live"] == 4, "4 live connections")
            in_worker = sum(w["live"] for w in status["workers"])
            assert 1 <= in_worker <= 3, status["workers"]  # tunnels in both processes
            staged = directory / "policy.tmp"
            staged.write_text(_policy(origin, "/usr/bin/curl", port=PORT))  # SLOW_PORT no longer allowed
            staged.rename(policy)
        finally:
            run = dev.finish(timeout=120)
        revoked = [e for e in run.events if e.get("event") == "egress.revoked"]
        assert len(revoked) == 4 and {e["policy_generation"] for e in revoked} == {1}, run.stderr[-3000:]
        assert _workers_of(revoked) == {0, 1}, revoked
        ended = run.stdout.splitlines()
        assert len(ended) == 4 and all(e.startswith("ended 200") and not e.endswith(" 0") for e in ended), run.stdout


def test_control_told_to_end_logs_the_last_connections_of_every_worker(
    origin: Origin, workdir: Path, runtime: str, tmp_path: Path
) -> None:
    """SIGTERM to control (a pod's end, a rollout): every process ends its live tunnels, and each tunnel's event —
    a worker's too — is logged before control exits, as one process's would be. Dev then restarts control."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(_policy(origin, "/usr/bin/curl", port=SLOW_PORT))
    url = f"http://api.test:{SLOW_PORT}/endless"
    script = (
        f"for i in 1 2 3 4; do curl -s -o /dev/null -w 'ended %{{http_code}} %{{exitcode}}\\n' {url}-$i & "
        "sleep 0.3; done; wait"
    )
    dev = Dev(origin, workdir, policy, script, runtime=runtime, scratch=tmp_path)
    try:
        dev.release()
        status = dev.wait_status(lambda s: s["egress"]["live"] == 4, "4 live connections")
        in_worker = sum(w["live"] for w in status["workers"])
        assert 1 <= in_worker <= 3, status["workers"]  # tunnels in both processes
        (workers,) = [e for e in dev.events() if e.get("event") == "control.workers"]
        os.kill(workers["pids"][0], signal.SIGTERM)
    finally:
        run = dev.finish(timeout=120)
    ended = [e for e in run.egress(decision="allow") if e.get("destination") == f"api.test:{SLOW_PORT}"]
    assert len(ended) == 4, run.stderr[-3000:]
    assert _workers_of(ended) == {0, 1}, ended
    assert [e for e in run.events if e.get("event") == "control.failed"] == [], run.stderr[-3000:]
    assert len(run.stdout.splitlines()) == 4 and all(not e.endswith(" 0") for e in run.stdout.splitlines())
