"""Model R's boundary processes keep only what they still use once the sandbox is up (docs/kubernetes.md "Model R:
capabilities after start").

A dev sandbox runs under the workload pod's bounding set (the nine capabilities of the rendered manifest, cut with
``setpriv``, as tests/e2e/test_model_r_pod_capabilities.py does). After ready, with the agent running and an exec
in flight, every task of the boundary, the launcher, the workload's init, each exec-init and every workload
process has exactly its documented effective, permitted, bounding and ambient sets — so a bug that let the agent
run code in one of them would find no SYS_ADMIN, NET_ADMIN or SETPCAP in the boundary, nor SYS_PTRACE in the init.
Then the operations that run after the drop still work: exec, exec on a terminal, signal, terminate, a later exec
through a spare.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pexpect
import pytest

from supervisor.boundary.forkimage import capabilities
from supervisor.k8s.objects import MODEL_R_CAPABILITIES
from tests import process_caps
from tests.sandbox_api import api_env

CLI = [sys.executable, "-m", "supervisor.cli"]
AGENT = 1000
POD = capabilities.mask(tuple(MODEL_R_CAPABILITIES))


@dataclass
class Box:
    env: dict[str, str]
    dev: subprocess.Popen[str]

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=self.env)

    def boundary_pid(self) -> int:
        for pid in Path(f"/proc/{self.dev.pid}/task/{self.dev.pid}/children").read_text().split():
            if "--mode=boundary" in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode():
                return int(pid)
        raise AssertionError("no boundary under the dev process")

    def census(self) -> process_caps.Census:
        done = subprocess.run([sys.executable, "-c", process_caps.CENSUS], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return process_caps.parse(done.stdout)


@pytest.fixture(scope="module")
def box() -> Iterator[Box]:
    if os.geteuid() != 0:
        pytest.skip("model R needs root")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to cut the bounding set")
    bounding = ",".join(["-all", *(f"+{cap.lower()}" for cap in MODEL_R_CAPABILITIES)])
    runtime = tempfile.mkdtemp(prefix="osb-rdrop-", dir="/tmp")
    workdir = Path(runtime, "work")
    workdir.mkdir(mode=0o777)
    workdir.chmod(0o777)
    env = {**os.environ, "XDG_RUNTIME_DIR": runtime, "XDG_STATE_HOME": runtime}
    dev = subprocess.Popen(
        ["setpriv", f"--bounding-set={bounding}", *CLI, "dev", "--privilege-model=R", f"--workdir={workdir}",
         f"--agent-user={AGENT}:{AGENT}", "--", "/bin/sleep", "1000"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd="/",
    )  # fmt: skip
    box = Box(env, dev)
    try:
        deadline = time.monotonic() + 90
        box.env = api_env(env)
        while box.cli("readyz").returncode != 0:
            assert dev.poll() is None, dev.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the sandbox never became ready"
            box.env = api_env(env)  # the socket's directory is named once dev made it
            time.sleep(0.2)
        yield box
    finally:
        dev.terminate()
        dev.wait(timeout=60)
        shutil.rmtree(runtime, ignore_errors=True)


def test_every_boundary_process_keeps_only_its_documented_capabilities_after_ready(box: Box) -> None:
    exec_in_flight = subprocess.Popen([*CLI, "exec", "--", "/bin/sleep", "300"], env=box.env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        boundary = box.boundary_pid()
        census = process_caps.check(box.census, boundary, POD, workload=2)  # the agent and the exec's command
        found = process_caps.roles(census, boundary)
        # What the drop took away, by name, where it mattered most.
        boundary_eff = found["boundary"][0]["tasks"][0]["CapEff"]
        assert capabilities.names(boundary_eff) == ["DAC_READ_SEARCH", "KILL", "SYS_PTRACE"]
        for role in ("boundary", "launcher", "init", "exec-init"):
            for proc in found[role]:
                assert all(
                    task["CapEff"] & capabilities.mask(("SETPCAP", "NET_BIND_SERVICE")) == 0 for task in proc["tasks"]
                ), role
        assert all(proc["uid"] == AGENT for proc in found["workload"])
    finally:
        exec_in_flight.terminate()
        exec_in_flight.wait(timeout=30)


def test_exec_pty_signal_and_terminate_work_after_the_drop(box: Box) -> None:
    result = box.cli("exec", "--", "sh", "-c", "id -u; grep CapEff /proc/self/status")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == str(AGENT)
    assert "CapEff:\t0000000000000000" in result.stdout
    child = pexpect.spawn(CLI[0], [*CLI[1:], "exec", "-it", "--", "sh", "-i"], env=box.env, encoding="utf-8",
                          timeout=60, dimensions=(24, 80))  # fmt: skip
    try:
        child.expect(r"\$ ")
        child.sendline("stty size; id -u")  # a terminal of its own (stty reads its size)
        child.expect(r"24 80\s+" + str(AGENT))
        child.sendline("exit 7")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 7
    handle, proc = _running_exec(box, "sleep 300")
    try:
        assert box.cli("signal", "TERM", handle).returncode == 0  # the command runs as the agent: needs KILL
        waited = box.cli("wait", handle)
        assert json.loads(waited.stdout)["signal"] == "TERM", waited
    finally:
        proc.kill()
        proc.wait(timeout=30)
    handle, proc = _running_exec(box, "trap '' TERM; sleep 300")  # only SIGKILL ends it
    try:
        ended = box.cli("terminate", handle, "--grace", "1")
        assert ended.returncode == 0, ended.stderr
        waited = box.cli("wait", handle)
        assert json.loads(waited.stdout)["signal"] == "KILL", waited
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert box.cli("exec", "--", "true").returncode == 0  # and a spare serves the next exec


def _running_exec(box: Box, script: str) -> tuple[str, subprocess.Popen[str]]:
    """Start ``sh -c SCRIPT`` through the CLI; its handle once status shows it running."""
    earlier = {p["handle"] for p in json.loads(box.cli("status", "--json").stdout)["boundary"]["processes"]}
    proc = subprocess.Popen([*CLI, "exec", "--", "sh", "-c", script], env=box.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        live = json.loads(box.cli("status", "--json").stdout)["boundary"]["processes"]
        handles = [p["handle"] for p in live
                   if p["kind"] == "exec" and p["state"] == "running" and p["handle"] not in earlier]  # fmt: skip
        if handles:
            return handles[0], proc
        assert time.monotonic() < deadline, "the exec never showed in status"
        time.sleep(0.1)
