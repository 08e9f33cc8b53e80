"""Model P's fence observed through control's canary (docs/reference/boundary.md §1.2), with the real daemons by hand.

The "pod" is a test host's network namespace (tests/netns_hosts.py): the boundary runs there in model P
(proxy-env), control in the test's namespace with its canary on the veth's test-side address. Nothing leaves
the machine: the canary is an address of ours, reachable from the pod only over the veth the test made.

- A route out (the pod's default route reaches the canary): the boundary's probe connects, ``confirm`` fails,
  the boundary exits 125 and control's /readyz names it. The agent never starts.
- The fence in place (nftables in the pod drops every new outgoing connection, as an egress-deny NetworkPolicy
  does): the probe fails, control's self-check answered and nothing else arrived, ``confirm`` passes and status
  says ``probe: canary``. Removing the fence later is caught by the repeated round: enforcement lost.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from supervisor.protocol.certs import make_ca
from supervisor.protocol.claims import Role
from tests import controls_daemon
from tests.certs_fixtures import leaf_bundle
from tests.controls import protection_off
from tests.netns_hosts import NetnsHost, open_test_host

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")

CLI = [sys.executable, "-m", "supervisor.cli"]
POD_FENCE = """
table inet podfence {
    chain out {
        type filter hook output priority 0; policy drop;
        oif "lo" accept
        ct state established,related accept
    }
}
"""


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def _wait(what: str, check: Callable[[], bool], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{log.read_text()}"
        time.sleep(0.05)


def _free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


@dataclass
class Sandbox:
    host: NetnsHost
    boundary: subprocess.Popen[bytes]
    control: subprocess.Popen[bytes]
    boundary_log: Path
    control_log: Path
    api: Path
    canary: str

    def cli(self, command: str, *args: str) -> subprocess.CompletedProcess[str]:
        """``openshell-sandbox COMMAND --api=OURS ARGS…``: the API named before any ``--``, so this sandbox is asked."""
        return subprocess.run([*CLI, command, f"--api={self.api}", *args], capture_output=True, text=True,
                              timeout=60)  # fmt: skip

    def status(self) -> dict[str, Any]:
        result = self.cli("status", "--json")
        assert result.returncode == 0, result
        status: dict[str, Any] = json.loads(result.stdout)
        return status


@contextlib.contextmanager
def p_sandbox(
    tmp_path: Path, *, fenced: bool, interval_s: float = 30.0, boundary_cli: list[str] = CLI
) -> Iterator[Sandbox]:
    """The pod and both daemons; ``boundary_cli`` is how the boundary is started (a twin starts it with one
    protection off: tests/controls_daemon.py)."""
    if shutil.which("nft") is None:
        pytest.skip("needs nft")
    with open_test_host() as host:
        if fenced:
            host.run(["nft", "-f", "-"], input=POD_FENCE.encode(), check=True)
        ca = make_ca(validity=datetime.timedelta(days=1), now=datetime.datetime.now(datetime.UTC))
        leaf_bundle(tmp_path / "boundary", ca, Role.BOUNDARY)
        leaf_bundle(tmp_path / "control", ca, Role.CONTROL)
        port_file, api = tmp_path / "port", tmp_path / "api.sock"
        boundary_log, control_log = tmp_path / "boundary.log", tmp_path / "control.log"
        canary = f"{host.gateway}:{_free_port(host.gateway)}"
        procs: list[subprocess.Popen[bytes]] = []
        try:
            with boundary_log.open("w") as out:
                procs.append(host.popen(
                    [*boundary_cli, "--mode=boundary", f"--bootstrap={tmp_path / 'boundary'}",
                     f"--listen={host.address}:0", f"--port-file={port_file}", "--privilege-model=P",
                     "--acknowledge-external-fence", f"--tls-dir={tmp_path / 'tls'}", "--agent-stdio=pipe",
                     "--workdir=/tmp", "--exit-linger=5", "--", "sleep", "1000"],
                    stdout=out, stderr=subprocess.STDOUT,
                ))  # fmt: skip
            _wait("the boundary's port", port_file.exists, 60, boundary_log)
            with control_log.open("w") as out:
                procs.append(subprocess.Popen(
                    [*CLI, "--mode=control", f"--bootstrap={tmp_path / 'control'}",
                     f"--boundary={host.address}:{port_file.read_text()}", f"--api={api}",
                     "--capture-mode=proxy-env", "--acknowledge-external-fence", f"--fence-canary={canary}",
                     f"--fence-canary-interval={interval_s:g}"],
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                ))  # fmt: skip
            yield Sandbox(host, procs[0], procs[1], boundary_log, control_log, api, canary)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()


@pytest.fixture
def boundary_cli() -> list[str]:
    return CLI


def exit_code(proc: subprocess.Popen[bytes], timeout: float, log: Path) -> int:
    """The daemon's exit code; still running after ``timeout`` fails the test on its assertion."""
    _wait("the daemon's exit", lambda: proc.poll() is not None, timeout, log)
    return int(proc.returncode)


def test_model_p_with_a_route_out_fails_confirm_through_the_canary(tmp_path: Path, boundary_cli: list[str]) -> None:
    with p_sandbox(tmp_path, fenced=False, boundary_cli=boundary_cli) as sb:
        assert exit_code(sb.boundary, 60, sb.boundary_log) == 125, sb.boundary_log.read_text()
        events = _events(sb.boundary_log)
        probes = [e for e in events if e["event"] == "fence.canary-probe"]
        assert probes and probes[0]["connected"] is True and probes[0]["target"] == sb.canary, events
        failed = [e for e in events if e["event"] == "lifecycle.failed"]
        assert failed and "path out" in failed[0]["reason"], events
        assert not any(e["event"] in ("lifecycle.ready", "lifecycle.running") for e in events), "never Ready"
        # Control saw the boundary's connection arrive on its canary, and says why the sandbox is not ready.
        _wait("control's report", lambda: any(e["event"] == "boundary.refused" for e in _events(sb.control_log)),
              30, sb.control_log)  # fmt: skip
        seen = [e for e in _events(sb.control_log) if e["event"] == "fence.canary-connection"]
        assert seen and seen[0]["peer"].startswith(f"{sb.host.address}:"), sb.control_log.read_text()
        ready = sb.cli("readyz")
        assert ready.returncode == 1, ready
        assert "path out" in ready.stdout + ready.stderr, ready


def test_model_p_with_the_fence_in_place_passes_and_a_fence_removed_later_is_lost(
    tmp_path: Path, boundary_cli: list[str]
) -> None:
    with p_sandbox(tmp_path, fenced=True, interval_s=3, boundary_cli=boundary_cli) as sb:
        _wait("ready", lambda: sb.cli("readyz").returncode == 0, 60, sb.control_log)
        fence = sb.status()["boundary"]["fence"]
        assert fence["mode"] == "proxy-env" and fence["probe"] == "canary", fence
        assert fence["canary"] == sb.canary and "timeout" in fence["probe_error"], fence
        rounds = [e for e in _events(sb.control_log) if e["event"] == "fence.canary-round"]
        assert rounds[0]["self_check"] == "ok" and rounds[0]["seen"] == 0, rounds
        assert not any(e["event"] == "fence.canary-connection" for e in _events(sb.control_log))
        human = sb.cli("status")
        assert f"probe canary {sb.canary}" in human.stdout, human
        assert sb.boundary.poll() is None

        # The fence goes away under a running agent: the next round's probe connects -> enforcement lost.
        sb.host.run(["nft", "delete", "table", "inet", "podfence"], check=True)
        code = exit_code(sb.boundary, 30, sb.boundary_log)
        events = _events(sb.boundary_log)
        lost = [e for e in events if e["event"] == "enforcement-lost"]
        assert lost and "path out" in lost[0]["reason"], events
        exited = [e for e in events if e["event"] == "agent.exited"]
        assert exited and exited[0]["result"].get("reason") == "enforcement-lost", exited
        assert code != 0


# The boundary blind to its own probe: control's canary still counts the connection, so the sandbox still fails
# or loses — for control's reason, not the probe's "path out", which is what these tests assert.
CANARY_PROBE_OFF = pytest.mark.parametrize("boundary_cli", [controls_daemon.argv("canary-probe")], ids=["off"])


@protection_off("the boundary's reading of its canary probe (a connect that succeeded is a path out)")
@CANARY_PROBE_OFF
def test_model_p_with_a_route_out_fails_confirm_through_the_canary_twin(
    tmp_path: Path, boundary_cli: list[str]
) -> None:
    test_model_p_with_a_route_out_fails_confirm_through_the_canary(tmp_path, boundary_cli)


@protection_off("the boundary's reading of its canary probe (a connect that succeeded is a path out)")
@CANARY_PROBE_OFF
def test_model_p_with_the_fence_in_place_passes_and_a_fence_removed_later_is_lost_twin(
    tmp_path: Path, boundary_cli: list[str]
) -> None:
    test_model_p_with_the_fence_in_place_passes_and_a_fence_removed_later_is_lost(tmp_path, boundary_cli)
