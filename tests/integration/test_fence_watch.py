"""The fence is watched after confirm (docs/reference/boundary.md §1.2), with the real daemons by hand.

A veth pair (a dummy link where veth is unavailable) appears in the agent's network namespace while the agent
runs — what an attacker with a way to CAP_NET_ADMIN there would do. Within 5 s every workload process is
killed, the agent's result says ``{signal: KILL, reason: enforcement-lost}``, the boundary logs
``enforcement-lost``, control's ``/readyz`` fails naming it, and once the boundary has gone control answers from
the agent's result: ``wait`` gives it, ``exec`` and ``signal`` are ``terminated`` naming why, and nothing runs. A
netlink event that leaves the fingerprint unchanged (lo set up again) ends nothing.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from supervisor.protocol.certs import make_ca
from supervisor.protocol.claims import Role
from tests import controls_daemon
from tests.certs_fixtures import leaf_bundle
from tests.controls import protection_off

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the boundary runs in model R (root); nsenter needs root")

CLI = [sys.executable, "-m", "supervisor.cli"]
LOST_WITHIN_S = 5.0


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


@dataclass
class Daemons:
    boundary: subprocess.Popen[bytes]
    control: subprocess.Popen[bytes]
    boundary_log: Path
    control_log: Path
    api: Path

    def cli(self, command: str, *args: str) -> subprocess.CompletedProcess[str]:
        """``openshell-sandbox COMMAND --api=OURS ARGS…``: the API named before any ``--``, so this sandbox is asked."""
        return subprocess.run([*CLI, command, f"--api={self.api}", *args], capture_output=True, text=True,
                              timeout=60)  # fmt: skip

    def launcher_pid(self) -> int:
        """The zygote: the boundary's one child, living in the agent's network namespace after attach."""
        children = Path(f"/proc/{self.boundary.pid}/task/{self.boundary.pid}/children").read_text().split()
        assert len(children) == 1, children
        return int(children[0])

    def in_agent_netns(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["nsenter", "-t", str(self.launcher_pid()), "-n", *argv], capture_output=True,
                              text=True, timeout=30)  # fmt: skip


@pytest.fixture
def boundary_cli() -> list[str]:
    """How the boundary is started (a twin starts it with one protection off: tests/controls_daemon.py)."""
    return CLI


@pytest.fixture
def daemons(tmp_path: Path, boundary_cli: list[str]) -> Iterator[Daemons]:
    for tool in ("ip", "nsenter"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is needed")
    ca = make_ca(validity=datetime.timedelta(days=1), now=datetime.datetime.now(datetime.UTC))
    leaf_bundle(tmp_path / "boundary", ca, Role.BOUNDARY)
    leaf_bundle(tmp_path / "control", ca, Role.CONTROL)
    port_file, api = tmp_path / "port", tmp_path / "api.sock"
    boundary_log, control_log = tmp_path / "boundary.log", tmp_path / "control.log"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with boundary_log.open("w") as out:
            procs.append(subprocess.Popen(
                [*boundary_cli, "--mode=boundary", f"--bootstrap={tmp_path / 'boundary'}", "--listen=127.0.0.1:0",
                 f"--port-file={port_file}", "--privilege-model=R", "--agent-stdio=pipe", "--workdir=/tmp",
                 "--exit-linger=30", "--", "sleep", "1000"],
                stdout=out, stderr=subprocess.STDOUT,
            ))  # fmt: skip
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert procs[0].poll() is None, boundary_log.read_text()
            assert time.monotonic() < deadline, "boundary did not start listening"
            time.sleep(0.02)
        with control_log.open("w") as out:
            procs.append(subprocess.Popen(
                [*CLI, "--mode=control", f"--bootstrap={tmp_path / 'control'}",
                 f"--boundary=127.0.0.1:{port_file.read_text()}", f"--api={api}",
                 "--agent-user=61999:61999"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            ))  # fmt: skip
        box = Daemons(procs[0], procs[1], boundary_log, control_log, api)
        deadline = time.monotonic() + 60
        while box.cli("readyz").returncode != 0:
            assert procs[0].poll() is None, boundary_log.read_text()
            assert procs[1].poll() is None, control_log.read_text()
            assert time.monotonic() < deadline, f"never ready: {box.cli('readyz')}"
            time.sleep(0.2)
        yield box
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def test_a_link_added_in_the_agents_namespace_ends_the_workload(daemons: Daemons) -> None:
    watching = [e for e in _events(daemons.boundary_log) if e["event"] == "fence.watch"]
    assert watching and watching[0]["notifications"] is True, watching
    # A notification that changes nothing is a re-read, not a loss.
    assert daemons.in_agent_netns("ip", "link", "set", "lo", "up").returncode == 0
    time.sleep(0.5)  # a loss would be logged within the debounce; give it ten times that
    assert not [e for e in _events(daemons.boundary_log) if e["event"] == "enforcement-lost"]
    assert daemons.cli("readyz").returncode == 0

    added = daemons.in_agent_netns("ip", "link", "add", "osx0", "type", "veth", "peer", "name", "osx1")
    if added.returncode != 0:  # no veth module: a dummy link is just as much a change of the fence
        added = daemons.in_agent_netns("ip", "link", "add", "osx0", "type", "dummy")
    assert added.returncode == 0, added.stderr
    changed_at = time.monotonic()
    while not (lost := [e for e in _events(daemons.boundary_log) if e["event"] == "enforcement-lost"]):
        assert time.monotonic() - changed_at < LOST_WITHIN_S, "the change went unnoticed"
        time.sleep(0.05)
    assert "osx0" in lost[0]["reason"], lost[0]
    exited = [e for e in _events(daemons.boundary_log) if e["event"] == "agent.exited"]
    deadline = changed_at + LOST_WITHIN_S
    while not exited:
        assert time.monotonic() < deadline, "the agent was not killed within 5 s"
        time.sleep(0.05)
        exited = [e for e in _events(daemons.boundary_log) if e["event"] == "agent.exited"]
    result = exited[0]["result"]
    assert result["signal"] == "KILL" and result["reason"] == "enforcement-lost", result

    deadline = time.monotonic() + 20
    while True:
        ready = daemons.cli("readyz")
        if "enforcement lost" in ready.stdout + ready.stderr:
            break
        assert time.monotonic() < deadline, ready
        time.sleep(0.1)
    assert ready.returncode == 1
    assert daemons.boundary.wait(timeout=60) == 128 + 9  # the agent's rendered code
    assert [e for e in _events(daemons.control_log) if e["event"] == "enforcement-lost"]

    # The boundary has gone; control answers for the ended sandbox from the agent's result (spec §1.3–1.4).
    waited = daemons.cli("wait")
    assert waited.returncode == 128 + 9, waited
    answer = json.loads(waited.stdout)
    assert (answer["signal"], answer["reason"]) == ("KILL", "enforcement-lost"), answer
    started = daemons.cli("exec", "--", "echo", "ran")
    assert started.returncode == 125 and "ran" not in started.stdout, started  # refused, and nothing ran
    why = "the agent has terminated: reason enforcement-lost (signal KILL)"
    assert f"openshell-sandbox: terminated: exec: {why}" in started.stderr, started
    signalled = daemons.cli("signal", "TERM")
    assert signalled.returncode == 125 and f"terminated: signal: {why}" in signalled.stderr, signalled


@protection_off("the fence watch's comparison of each re-read with the fingerprint confirm took")
@pytest.mark.parametrize("boundary_cli", [controls_daemon.argv("fence-watch")], ids=["fence-watch-off"])
def test_a_link_added_in_the_agents_namespace_ends_the_workload_twin(daemons: Daemons) -> None:
    test_a_link_added_in_the_agents_namespace_ends_the_workload(daemons)


NFT_ACCEPT_ALL_OUT = (
    "add table inet osx\nadd chain inet osx out { type filter hook output priority -1; }\n"
    "add rule inet osx out accept\n"
)


def test_an_nft_rule_added_in_the_agents_namespace_ends_the_workload_at_once(daemons: Daemons) -> None:
    """nftables changes are not on rtnetlink: the watch subscribes to nfnetlink's nftables group in the agent's
    namespace, so the re-read follows the change at once, not the 5 s timer (which stays as the backstop)."""
    if shutil.which("nft") is None:
        pytest.skip("needs nft")
    watching = [e for e in _events(daemons.boundary_log) if e["event"] == "fence.watch" and "interval_s" in e]
    assert watching and watching[0]["nftables_notifications"] is True, watching
    added = subprocess.run(["nsenter", "-t", str(daemons.launcher_pid()), "-n", "nft", "-f", "-"],
                           input=NFT_ACCEPT_ALL_OUT, capture_output=True, text=True, timeout=30)  # fmt: skip
    assert added.returncode == 0, added.stderr
    changed_at = time.monotonic()
    while not (lost := [e for e in _events(daemons.boundary_log) if e["event"] == "enforcement-lost"]):
        assert time.monotonic() - changed_at < LOST_WITHIN_S, "the change went unnoticed"
        time.sleep(0.05)
    assert lost[0]["trigger"] == "notification", lost[0]  # not the timer
    assert time.monotonic() - changed_at < 2.0, "the nftables change was noticed late"
    exited = [e for e in _events(daemons.boundary_log) if e["event"] == "agent.exited"]
    deadline = changed_at + LOST_WITHIN_S
    while not exited:
        assert time.monotonic() < deadline, "the agent was not killed within 5 s"
        time.sleep(0.05)
        exited = [e for e in _events(daemons.boundary_log) if e["event"] == "agent.exited"]
    assert exited[0]["result"]["reason"] == "enforcement-lost", exited


@protection_off("the fence watch's comparison of each re-read with the fingerprint confirm took")
@pytest.mark.parametrize("boundary_cli", [controls_daemon.argv("fence-watch")], ids=["fence-watch-off"])
def test_an_nft_rule_added_in_the_agents_namespace_ends_the_workload_at_once_twin(daemons: Daemons) -> None:
    test_an_nft_rule_added_in_the_agents_namespace_ends_the_workload_at_once(daemons)
