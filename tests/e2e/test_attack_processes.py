"""The agent attacks with processes: a fork bomb is held by the workload's pids cgroup while the
boundary keeps answering, and ``terminate`` ends it; an exec's setsid + double-fork child does not outlive
``terminate``.

The bomb is bounded twice so a shared machine stays safe: ``--pids-limit=64``, and every process sleeps after a
refused fork instead of spinning. Whatever happens, the sandbox is torn down (dev killed, which ends the
workload) and the test checks that no member of the workload's cgroup is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.sandbox_api import api_env
from tests.waiting import wait_until

CLI = [sys.executable, "-m", "supervisor.cli"]
PIDS_LIMIT = 64
STATUS_BOUND_S = 10.0  # "a generous bound": status must answer within this while the bomb runs
# Every process forks again as soon as it can: exponential until the cgroup refuses (EAGAIN), then each one
# retries every 50 ms for ever. Only a limit stops it.
BOMB = "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.05)\n"


@dataclass
class Sandbox:
    env: dict[str, str]  # once ready: OPENSHELL_SANDBOX_API names this sandbox's socket (tests/sandbox_api.py)
    dev: subprocess.Popen[str]

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=api_env(self.env))

    def status(self) -> dict[str, Any]:
        result = self.cli("status", "--json", timeout=STATUS_BOUND_S + 20)
        assert result.returncode == 0, result.stderr
        return dict(json.loads(result.stdout))


def _cgroup_members(group: Path) -> set[int]:
    """Members of the workload's cgroup (gone with the cgroup: the boundary removes it at exit)."""
    try:
        return {int(p) for p in (group / "cgroup.procs").read_text().split()}
    except OSError:
        return set()


def _start(argv: list[str], *flags: str) -> Iterator[Sandbox]:
    if os.geteuid() != 0:
        pytest.skip("dev mode runs the boundary in model R here (root)")
    runtime = tempfile.mkdtemp(prefix="osp-", dir="/tmp")
    env = {**os.environ, "XDG_RUNTIME_DIR": runtime}
    dev = subprocess.Popen([*CLI, "dev", *flags, "--", *argv], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)  # fmt: skip
    box = Sandbox(env, dev)
    try:
        deadline = time.monotonic() + 60
        while box.cli("readyz").returncode != 0:
            assert dev.poll() is None, dev.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the sandbox never became ready"
            time.sleep(0.2)
        box.env = api_env(env)
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


@pytest.fixture
def bomb() -> Iterator[Sandbox]:
    groups: list[Path] = []
    for box in _start(["/usr/bin/python3", "-c", BOMB], f"--pids-limit={PIDS_LIMIT}"):
        cgroup = box.status()["boundary"]["limits"]["pids_cgroup"]  # "cgroup v1 /sys/fs/cgroup/pids/…"
        groups.append(Path(cgroup.split(" ", 2)[2]))
        yield box
    deadline = time.monotonic() + 30
    while any(_cgroup_members(g) for g in groups):  # teardown ended the workload: nothing of it may survive
        assert time.monotonic() < deadline, f"workload processes left: {[_cgroup_members(g) for g in groups]}"
        time.sleep(0.1)


def test_fork_bomb_is_contained_status_answers_and_terminate_ends_it(bomb: Sandbox) -> None:
    limits: dict[str, Any] = {}
    group = Path(bomb.status()["boundary"]["limits"]["pids_cgroup"].split(" ", 2)[2])
    deadline = time.monotonic() + 60
    while True:  # the bomb reaches the limit; the boundary answers each status within the bound
        started = time.monotonic()
        status = bomb.status()
        assert time.monotonic() - started < STATUS_BOUND_S
        limits = status["boundary"]["limits"]
        assert limits["pids"] == PIDS_LIMIT, limits
        if limits.get("pids_current", 0) >= PIDS_LIMIT:
            break
        assert time.monotonic() < deadline, f"the bomb never reached the limit: {limits}"
        time.sleep(0.2)
    for _ in range(3):  # held at the limit, and still answering
        started = time.monotonic()
        status = bomb.status()
        assert time.monotonic() - started < STATUS_BOUND_S
        assert status["boundary"]["limits"]["pids_current"] <= PIDS_LIMIT
        assert len(_cgroup_members(group)) <= PIDS_LIMIT
    assert status["boundary"]["state"] == "running"

    ended = bomb.cli("terminate", "--grace=0.5", timeout=60)
    assert ended.returncode == 0, ended
    result = json.loads(ended.stdout)
    assert result["reason"] == "terminated" and result["signal"] in ("TERM", "KILL"), result
    bomb.dev.wait(timeout=60)  # the agent's end ends the sandbox
    deadline = time.monotonic() + 30
    while _cgroup_members(group):
        assert time.monotonic() < deadline, f"bomb processes survived terminate: {_cgroup_members(group)}"
        time.sleep(0.1)
    assert not group.exists(), "the boundary removes the workload's cgroup at exit"


# Sleeps of MARK+N seconds are this run's, found in the host's /proc by their argv; random per run, so that a
# suite running beside this one is never counted (or killed) as ours.
MARK = str(100000 + uuid.uuid4().int % 900000)


def _marked() -> dict[int, str]:
    found: dict[int, str] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if len(argv) > 1 and argv[0].endswith(b"sleep") and argv[1].startswith(MARK.encode()):
                found[int(name)] = argv[1].decode()
    return found


@pytest.fixture
def quiet() -> Iterator[Sandbox]:
    yield from _start(["sleep", "100000"])


def test_setsid_double_fork_child_of_an_exec_is_gone_after_terminate(quiet: Sandbox) -> None:
    script = f'setsid sh -c "sleep {MARK}1 & sleep {MARK}2 &"; sleep {MARK}0'
    execing = subprocess.Popen([*CLI, "exec", "--", "sh", "-c", script], env=quiet.env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while sorted(_marked().values()) != [f"{MARK}0", f"{MARK}1", f"{MARK}2"]:
            assert execing.poll() is None, execing.communicate()
            assert time.monotonic() < deadline, _marked()
            time.sleep(0.1)
        handles = [p["handle"] for p in quiet.status()["boundary"]["processes"] if p["kind"] == "exec"]
        assert len(handles) == 1, handles
        ended = quiet.cli("terminate", handles[0], "--grace=2")
        assert ended.returncode == 0, ended
        result = json.loads(ended.stdout)
        assert result["reason"] == "terminated" and result["signal"] == "TERM", result  # sh died of the TERM
        deadline = time.monotonic() + 10
        while _marked():
            assert time.monotonic() < deadline, f"left behind after terminate: {_marked()}"
            time.sleep(0.1)
        waited = quiet.cli("wait", handles[0])
        assert json.loads(waited.stdout)["signal"] == "TERM", waited
        assert quiet.status()["boundary"]["agent"]["result"] is None, "the agent is untouched"
    finally:
        execing.kill()
        execing.wait()
        for pid in _marked():  # never leave a stray sleep on the shared machine
            with contextlib.suppress(OSError):
                os.kill(pid, 9)


@pytest.fixture
def exiting() -> Iterator[Sandbox]:
    yield from _start(["sh", "-c", 'trap "exit 3" TERM; while :; do sleep 0.05; done'])


def test_terminate_racing_the_agents_exit_answers_its_result(exiting: Sandbox) -> None:
    ended = exiting.cli("terminate", "--grace=5")  # the agent exits on the TERM: the sandbox ends meanwhile
    assert ended.returncode == 0, ended
    result = json.loads(ended.stdout)
    assert (result["code"], result["reason"]) == (3, "terminated"), result
    assert exiting.dev.wait(timeout=60) == 3


def test_exec_refusal_names_the_env_key(quiet: Sandbox) -> None:
    refused = quiet.cli("exec", "--env", "OPENSHELL_SANDBOX_X=1", "--", "true")
    assert refused.returncode != 0
    assert "invalid" in refused.stderr and "env.OPENSHELL_SANDBOX_X" in refused.stderr, refused.stderr


def _control_pid(dev: subprocess.Popen[str]) -> int:
    for name in Path(f"/proc/{dev.pid}/task/{dev.pid}/children").read_text().split():
        if b"--mode=control" in Path(f"/proc/{name}/cmdline").read_bytes():
            return int(name)
    raise AssertionError("no control process under dev")


# The exec prints its tail only when told (USR1 through the API), never after a fixed time: on a loaded
# machine a `status` call can take longer than any sleep, and the process must still be running for it.
TAIL_ON_CUE = 'trap "go=1" USR1; echo one; while [ -z "$go" ]; do sleep 0.05; done; echo two; echo err >&2; exit 5'


def _detached(box: Sandbox, handle: str) -> bool:
    """The handle runs with no stream attached (what follows is buffered for ``attach``)."""
    live = {p["handle"]: p for p in box.status()["boundary"]["processes"]}
    return handle in live and live[handle]["state"] == "running" and not live[handle]["stream_attached"]


def _cue(box: Sandbox, handle: str) -> None:
    wait_until(lambda: _detached(box, handle), f"{handle} running and detached")
    cued = box.cli("signal", "USR1", handle)
    assert cued.returncode == 0, cued


def test_reattach_after_a_control_restart_shows_the_tail_and_the_exit_code(quiet: Sandbox) -> None:
    first = subprocess.Popen([*CLI, "exec", "--", "sh", "-c", TAIL_ON_CUE], env=quiet.env, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        assert first.stdout is not None and first.stdout.readline() == "one\n"
        handles = [p["handle"] for p in quiet.status()["boundary"]["processes"] if p["kind"] == "exec"]
        assert len(handles) == 1, handles
        os.kill(_control_pid(quiet.dev), 9)  # control dies mid-exec; dev restarts it, the process keeps running
        first.wait(timeout=30)
    finally:
        first.kill()
        first.wait()
    deadline = time.monotonic() + 30
    while quiet.cli("readyz").returncode != 0:
        assert time.monotonic() < deadline, "control did not come back"
        time.sleep(0.1)
    _cue(quiet, handles[0])
    again = quiet.cli("attach", handles[0])
    assert again.returncode == 5, again
    assert again.stdout == "two\n" and again.stderr.endswith("err\n"), again
    refused = quiet.cli("attach", "p_0123456789abcdef")
    assert refused.returncode != 0 and "unknown handle" in refused.stderr, refused


def _attach_when_detached(box: Sandbox, handle: str) -> subprocess.CompletedProcess[str]:
    """``attach`` once the killed client's stream is gone (until then the boundary answers 'already attached')."""
    deadline = time.monotonic() + 30
    while True:
        result = box.cli("attach", handle)
        if "already attached" not in result.stderr:
            return result
        assert time.monotonic() < deadline, result
        time.sleep(0.1)


def _exec_until_first_line(box: Sandbox, script: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([*CLI, "exec", "--", "sh", "-c", script], env=box.env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "one\n"
    handles = [p["handle"] for p in box.status()["boundary"]["processes"] if p["kind"] == "exec"]
    assert len(handles) == 1, handles
    return proc, handles[0]


def test_reattach_after_the_cli_is_killed_shows_the_tail_and_the_exit_code(quiet: Sandbox) -> None:
    """The CLI dies mid-exec (SIGKILL): control resets the boundary's stream at once, so the output that comes
    after is buffered for ``attach`` instead of being sent into a dead client."""
    first, handle = _exec_until_first_line(quiet, TAIL_ON_CUE)
    first.kill()
    first.wait()
    _cue(quiet, handle)  # the tail comes after the client died
    again = _attach_when_detached(quiet, handle)
    assert again.returncode == 5, again
    assert again.stdout == "two\n" and again.stderr.endswith("err\n"), again


def test_reattach_after_the_cli_is_killed_says_lagged_past_the_buffer(quiet: Sandbox) -> None:
    """More than the 1 MiB buffer comes out while no client is attached: ``attach`` shows the newest MiB and
    says how much was dropped; the exit code still arrives."""
    script = ('trap "go=1" USR1; echo one; while [ -z "$go" ]; do sleep 0.05; done; '
              "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo end; exit 3")  # fmt: skip
    first, handle = _exec_until_first_line(quiet, script)
    first.kill()
    first.wait()
    _cue(quiet, handle)  # all of it comes out after the client died
    deadline = time.monotonic() + 30
    while any(p["handle"] == handle for p in quiet.status()["boundary"]["processes"]):  # all of it came out
        assert time.monotonic() < deadline, "the exec never finished"
        time.sleep(0.2)
    again = _attach_when_detached(quiet, handle)
    assert again.returncode == 3, again.stderr
    assert "bytes of output were dropped" in again.stderr, again.stderr
    assert again.stdout.endswith("x\nend\n") and 1_000_000 <= len(again.stdout) <= 1 << 20, len(again.stdout)
