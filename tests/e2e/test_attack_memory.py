"""The agent attacks with memory: a hog is killed at the workload's memory limit, both daemons keep answering
``status`` meanwhile, and the agent's result (and an exec's) says the kernel killed it for memory.

The hog is bounded twice so a shared machine stays safe: ``--memory-limit=256M``, and the hog itself stops at
four times that (it then exits 3: the limit did not hold). It allocates and touches 8 MiB at a time, and only on
cue (files the test writes into its workdir), so the test sees the sandbox answer while it holds memory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests import controls_dev
from tests.controls import protection_off
from tests.waiting import wait_until

CLI = [sys.executable, "-m", "supervisor.cli"]
AGENT_PYTHON = "/usr/bin/python3"  # readable by the agent's uid
LIMIT = 256 << 20
STATUS_BOUND_S = 5.0  # each status must answer within this while the hog runs
NEAR = 3 * LIMIT // 4  # the agent's hog pauses here until cued on
# argv: the limit, then "cue" (wait for ./go, pause at NEAR until ./go-on) or "now". Stops itself at 4x.
HOG = """\
import os, sys, time
limit, cued = int(sys.argv[1]), sys.argv[2] == "cue"
while cued and not os.path.exists("go"):
    time.sleep(0.02)
held, step = [], 8 << 20
while len(held) * step < 4 * limit:
    held.append(b"\\x01" * step)
    if cued and len(held) * step >= 3 * limit // 4 and not os.path.exists("go-on"):
        open("near", "w").close()
        while not os.path.exists("go-on"):
            time.sleep(0.02)
    time.sleep(0.005)
print("hog: the limit never stopped me at", len(held) * step, flush=True)
sys.exit(3)
"""


@dataclass
class Box:
    env: dict[str, str]
    dev: subprocess.Popen[str]
    api: Path
    workdir: Path
    events: Path
    polls: list[tuple[float, float, int, dict[str, Any] | None]] = field(default_factory=list)

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=self.env)

    def status(self) -> tuple[float, int, dict[str, Any] | None]:
        """One ``status`` through the sandbox's own socket: (seconds it took, exit code, body)."""
        started = time.monotonic()
        result = self.cli("status", f"--api={self.api}", "--json", timeout=STATUS_BOUND_S + 30)
        took = time.monotonic() - started
        return took, result.returncode, json.loads(result.stdout) if result.returncode == 0 else None

    def events_named(self, name: str) -> list[dict[str, Any]]:
        lines = self.events.read_text().splitlines() if self.events.exists() else []
        return [e for e in map(json.loads, lines) if e.get("event") == name]


def _members(group: Path) -> set[int]:
    try:
        return {int(p) for p in (group / "cgroup.procs").read_text().split()}
    except OSError:
        return set()


def _start(dev_cli: list[str], *flags: str) -> Iterator[Box]:
    runtime = tempfile.mkdtemp(prefix="osm-", dir="/tmp")
    state = tempfile.mkdtemp(prefix="osm-state-", dir="/tmp")
    env = {**os.environ, "XDG_RUNTIME_DIR": runtime, "XDG_STATE_HOME": state}
    argv = [AGENT_PYTHON, "-c", HOG, str(LIMIT), "cue"]
    dev = subprocess.Popen([*dev_cli, "dev", *flags, "--", *argv], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        api = wait_until(lambda: next(Path(runtime).glob("openshell-sandbox/*/api.sock"), None) or dev.poll(),
                         "the sandbox's API socket", within_s=60)  # fmt: skip
        assert isinstance(api, Path), dev.communicate()
        sandbox = api.parent.name
        box = Box(env, dev, api, Path(state) / "openshell-sandbox" / sandbox / "work",
                  Path(state) / "openshell-sandbox" / sandbox / "events.jsonl")  # fmt: skip
        wait_until(lambda: box.cli("readyz", f"--api={api}").returncode == 0 or dev.poll() is not None,
                   "the sandbox is ready", within_s=60)  # fmt: skip
        assert dev.poll() is None, dev.communicate()
        yield box
    finally:
        if dev.poll() is None:
            dev.terminate()
            try:
                dev.wait(timeout=30)
            except subprocess.TimeoutExpired:
                dev.kill()
                dev.wait()
        shutil.rmtree(runtime, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
def dev_cli() -> list[str]:
    """How ``openshell-sandbox`` is run for dev (a twin's runs its daemons with one protection off:
    tests/controls_dev.py)."""
    return CLI


@pytest.fixture
def hog(dev_cli: list[str]) -> Iterator[Box]:
    groups: list[Path] = []
    for box in _start(dev_cli, f"--memory-limit={LIMIT >> 20}M"):
        _, code, body = box.status()
        assert code == 0 and body is not None
        limits = body["boundary"]["limits"]
        assert limits["memory"] == LIMIT, limits  # enforced, at the limit asked for
        groups.append(Path(limits["memory_cgroup"].split(" ", 2)[2]))
        yield box
    for group in groups:  # the sandbox is gone: nothing of the workload survives, the cgroup is removed
        wait_until(lambda g=group: not _members(g) and not g.exists(), f"{group} emptied and removed")


def _poll_status(box: Box, stop: threading.Event) -> None:
    """Status over and over until the sandbox ends; every answer is recorded with how long it took."""
    while not stop.is_set() and box.dev.poll() is None:
        started = time.monotonic()
        took, code, body = box.status()
        box.polls.append((started, took, code, body))


def test_memory_hog_is_oom_killed_at_the_limit_while_the_sandbox_answers(hog: Box) -> None:
    # An exec hogs first: the kernel kills it at the limit, its result says so, and the agent is untouched.
    execed = hog.cli("exec", f"--api={hog.api}", "--", AGENT_PYTHON, "-c", HOG, str(LIMIT), "now", timeout=120)
    assert execed.returncode == 137, (execed.returncode, execed.stdout, execed.stderr)
    assert "never stopped" not in execed.stdout
    exited = wait_until(lambda: [e for e in hog.events_named("process.exited") if e.get("kind") == "exec"],
                        "the exec's process.exited event")  # fmt: skip
    assert exited[0]["signal"] == "KILL" and exited[0]["reason"] == "oom-killed", exited

    _, code, body = hog.status()
    assert code == 0 and body is not None
    assert body["boundary"]["agent"]["result"] is None, "the exec's OOM kill left the agent running"
    kills_before = body["boundary"]["limits"]["memory_oom_kills"]
    assert kills_before >= 1, body["boundary"]["limits"]

    stop = threading.Event()
    poller = threading.Thread(target=_poll_status, args=(hog, stop), daemon=True)
    poller.start()
    try:
        (hog.workdir / "go").touch()
        wait_until(lambda: (hog.workdir / "near").exists() or hog.dev.poll() is not None, "the hog near the limit")
        cued_at = time.monotonic()
        wait_until(lambda: sum(1 for at, _, c, _ in hog.polls if at >= cued_at and c == 0) >= 3,
                   "three status answers while the hog holds 3/4 of the limit", within_s=60)  # fmt: skip
        near = [b for at, _, c, b in hog.polls if at >= cued_at and c == 0 and b is not None]
        assert near[-1]["boundary"]["state"] == "running"
        assert near[-1]["boundary"]["limits"]["memory_current"] >= NEAR, near[-1]["boundary"]["limits"]
        (hog.workdir / "go-on").touch()
        code = hog.dev.wait(timeout=120)
    finally:
        stop.set()
        poller.join(timeout=STATUS_BOUND_S + 40)
    out, err = hog.dev.communicate()
    assert "never stopped" not in out, out
    assert code == 137, (code, err[-2000:])  # 128 + SIGKILL
    assert "out of memory at the workload's memory limit (256 MiB)" in err, err[-2000:]
    slow = [(round(took, 2), c) for _, took, c, _ in hog.polls if took >= STATUS_BOUND_S]
    assert not slow, f"status took {STATUS_BOUND_S} s or more while the hog ran: {slow}"
    assert all(c == 0 for at, _, c, _ in hog.polls if at < cued_at), "status failed before the hog was cued on"
    agent_exits = hog.events_named("agent.exited")
    assert {e["component"] for e in agent_exits} == {"boundary", "control"}, agent_exits
    for event in agent_exits:
        result = event["result"]
        assert (result["signal"], result["rendered"], result["reason"]) == ("KILL", 137, "oom-killed"), result
    assert sorted(p.name for p in hog.workdir.iterdir()) == ["go", "go-on", "near"]  # all the hog wrote


@protection_off("the workload's memory limit (its cgroup made, the limit lifted)")
@pytest.mark.parametrize("dev_cli", [controls_dev.argv("memory-limit")], ids=["off"])
def test_memory_hog_is_oom_killed_at_the_limit_while_the_sandbox_answers_twin(hog: Box) -> None:
    test_memory_hog_is_oom_killed_at_the_limit_while_the_sandbox_answers(hog)


LOWER = """\
for value in 0 -1000 999; do echo "$value" > /proc/self/oom_score_adj 2>/dev/null && echo "took $value"; done
cat /proc/self/oom_score_adj
"""


def test_the_agent_cannot_lower_its_oom_score_and_the_boundary_is_never_in_its_memory_cgroup(hog: Box) -> None:
    lowered = hog.cli("exec", f"--api={hog.api}", "--", "sh", "-c", LOWER)
    assert lowered.returncode == 0, lowered.stderr
    assert lowered.stdout.split() == ["1000"], lowered.stdout  # no write took; still the workload's score
    _, code, body = hog.status()
    assert code == 0 and body is not None
    limits = body["boundary"]["limits"]
    assert limits["oom_score_adj"] == 1000, limits
    group = Path(limits["memory_cgroup"].split(" ", 2)[2])
    members = _members(group)
    boundary = [pid for pid in map(int, Path(f"/proc/{hog.dev.pid}/task/{hog.dev.pid}/children").read_text().split())
                if b"--mode=boundary" in Path(f"/proc/{pid}/cmdline").read_bytes()]  # fmt: skip
    assert len(boundary) == 1 and boundary[0] not in members, (boundary, members)
    # the launcher (the boundary's child, its argv) is the one member that is not the workload's: never at 1000
    scores = {pid: int(Path(f"/proc/{pid}/oom_score_adj").read_text()) for pid in members}
    launchers = [pid for pid in members if b"--mode=boundary" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(launchers) == 1 and scores[launchers[0]] <= 0, scores
    assert {score for pid, score in scores.items() if pid not in launchers} == {1000}, scores


@protection_off("the workload's oom_score_adj of 1000 (never written; the launcher's own score still is)")
@pytest.mark.parametrize("dev_cli", [controls_dev.argv("workload-oom-score")], ids=["off"])
def test_the_agent_cannot_lower_its_oom_score_and_the_boundary_is_never_in_its_memory_cgroup_twin(hog: Box) -> None:
    test_the_agent_cannot_lower_its_oom_score_and_the_boundary_is_never_in_its_memory_cgroup(hog)
