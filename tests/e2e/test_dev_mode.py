"""Dev mode end to end: real processes, the real CLI, exit codes, teardown, status and exec."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.waiting import wait_until

CLI = [sys.executable, "-m", "supervisor.cli"]


@pytest.fixture(autouse=True)
def _private_runtime_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test's sandbox and clients see only its own API socket (a short path: Unix sockets allow 107 bytes)."""
    runtime = tempfile.mkdtemp(prefix="osr-", dir="/tmp")
    monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)
    yield
    shutil.rmtree(runtime, ignore_errors=True)


def run_cli(*args: str, timeout: float = 60, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload,no-any-return]


def descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("code", [0, 3])
def test_exit_code_is_the_agents(code: int) -> None:
    result = run_cli("dev", "--log-format=json", "--", "sh", "-c", f"echo out; echo err >&2; exit {code}")
    assert result.returncode == code, result.stderr
    assert result.stdout == "out\n"  # stdout carries only the agent's stdout
    assert "err\n" in result.stderr
    events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    names = [e["event"] for e in events]
    for expected in ("lifecycle.bound", "lifecycle.ready", "lifecycle.running", "agent.exited"):
        assert expected in names


def test_signal_death_is_128_plus_n() -> None:
    result = run_cli("dev", "--", "sh", "-c", "kill -TERM $$")
    assert result.returncode == 128 + signal.SIGTERM, result.stderr


def test_missing_program_is_127() -> None:
    result = run_cli("dev", "--", "/nonexistent/agent-binary")
    assert result.returncode == 127, result.stderr


def test_agent_runs_as_another_uid_with_only_loopback() -> None:
    # /proc/net/dev shows the reader's network namespace (/sys/class/net would show sysfs's mounter's).
    api_dir = Path(os.environ["XDG_RUNTIME_DIR"]) / "openshell-sandbox"
    script = f"id -u; tail -n +3 /proc/net/dev | cut -d: -f1; ls -A {api_dir} | wc -l"
    result = run_cli("dev", "--", "sh", "-c", script)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split()
    # dev's agent: a dedicated unused uid (61000-61183), printed at start; never root, never a real user's 1000
    assert f"agent uid:gid {lines[0]}:" in result.stderr, result.stderr
    assert 61000 <= int(lines[0]) < 61184
    assert lines[1:-1] == ["lo"], "the agent must have nothing but loopback"
    assert lines[-1] == "0", "control's API directory must be hidden from the agent"


def test_sigterm_tears_everything_down() -> None:
    # The sleeps' own argv is computed by the shell, so it never matches dev's or the boundary's argv.
    seconds = 900000 + uuid.uuid4().int % 99999
    marker = f"sleep {seconds}"
    runtime = Path(os.environ.get("XDG_RUNTIME_DIR") or "/run") / "openshell-sandbox"
    proc = subprocess.Popen(
        [*CLI, "dev", "--", "sh", "-c", f"sleep $(({seconds}+0)) & sleep $(({seconds}+0)); echo never"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(processes_with(marker)) < 2:
            time.sleep(0.1)
        assert len(processes_with(marker)) >= 2, "the agent never started"
        tree = descendants(proc.pid)
        assert len(tree) >= 4, "expected control, boundary, launcher and the agent's processes"
        bundles = {
            Path(arg.split("=", 1)[1]).parent.parent
            for pid in tree
            for arg in _cmdline(pid)
            if arg.startswith("--bootstrap=")
        }
        assert len(bundles) == 1, bundles
        proc.send_signal(signal.SIGTERM)
        out, _err = proc.communicate(timeout=30)
        assert proc.returncode != 0
        assert "never" not in out
        # SIGKILLed processes take a moment to die: wait for it, with a budget for a loaded machine
        wait_until(lambda: processes_with(marker) == [], "every workload process gone", within_s=10)
        wait_until(lambda: not [pid for pid in tree if alive(pid)], "every process of the sandbox gone", within_s=10)
        after = set(runtime.glob("*")) if runtime.is_dir() else set()
        assert after == set(), f"runtime directory left behind: {after}"
        assert not any(b.exists() for b in bundles), "temporary bundle directory left behind"
    finally:
        if proc.poll() is None:  # a failed assertion above must not leave a sandbox running
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_status_and_exec_find_the_running_sandbox() -> None:
    """The clients' own search for the sandbox (no ``--api``): the one test that relies on it, in this test's own
    runtime directory (``_private_runtime_dir``), where its sandbox is the only one there can be."""
    marker = f"openshell-e2e-{uuid.uuid4().hex}"
    proc = subprocess.Popen(
        [*CLI, "dev", "--", "sleep", f"{1000}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 30
        ready = None
        while time.monotonic() < deadline:
            ready = run_cli("readyz", timeout=10)
            if ready.returncode == 0:
                break
            time.sleep(0.2)
        if ready is None or ready.returncode != 0:
            proc.terminate()
            _, dev_err = proc.communicate(timeout=30)
            raise AssertionError(f"never ready: {ready.stderr if ready else ''}\n{dev_err[-3000:]}")
        status = run_cli("status", "--json", timeout=10)
        body = json.loads(status.stdout)
        assert body["ready"] is True and body["boundary"]["state"] == "running"
        assert body["policy"]["generation"] == 0
        result = run_cli("exec", "--", "sh", "-c", f"echo {marker}; echo to-stderr >&2; exit 5", timeout=30)
        assert result.returncode == 5, result.stderr
        assert result.stdout == f"{marker}\n"
        assert "to-stderr" in result.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_ctrl_c_in_a_terminal_tears_everything_down() -> None:
    """Without a terminal of the agent's (``-T``), Ctrl-C reaches the whole foreground process group (dev, both
    daemons, the launcher): the launcher must not die of it, the boundary ends the agent and records its result
    (a second signal right behind the first must not kill it), dev exits 130, and nothing is left, cgroups
    included."""
    import pexpect

    seconds = 900000 + uuid.uuid4().int % 99999
    marker = f"sleep {seconds}"
    child = pexpect.spawn(
        CLI[0], [*CLI[1:], "dev", "-T", "--", "sh", "-c", f"echo started; sleep $(({seconds}+0))"],
        env={**os.environ}, encoding="utf-8", timeout=30,
    )  # fmt: skip
    try:
        child.expect("started")
        deadline = time.monotonic() + 10
        while not processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_with(marker), "the agent is not running"
        tree = descendants(child.pid)
        child.sendcontrol("c")
        child.expect(pexpect.EOF, timeout=30)
        child.close()
        assert child.exitstatus == 130, child.before
        logs = Path(os.environ["XDG_STATE_HOME"], "openshell-sandbox").glob("*/events.jsonl")
        events = [json.loads(line) for log in logs for line in log.read_text().splitlines() if line.strip()]
        mine = [e for e in events if any(str(seconds) in str(a) for a in e.get("argv") or [])]
        sandbox = mine[0]["sandbox"] if mine else None
        kinds = [e["event"] for e in events if e.get("sandbox") == sandbox]
        assert "agent.exited" in kinds and "boundary.exit" in kinds, kinds
        assert "limits.pids-cgroup-left" not in kinds
        for event in events:
            if event.get("sandbox") == sandbox and event["event"] == "limits.pids" and event.get("cgroup"):
                assert not Path(str(event["cgroup"]).split()[-1]).exists()
        wait_until(lambda: processes_with(marker) == [], "every workload process gone after Ctrl-C", within_s=10)
        wait_until(lambda: not [pid for pid in tree if alive(pid)], "every sandbox process gone after Ctrl-C",
                   within_s=10)  # fmt: skip
    finally:
        if child.isalive():
            child.terminate(force=True)


def test_killing_dev_itself_takes_the_sandbox_down() -> None:
    """SIGKILL cannot be handled by dev; its daemons get SIGTERM from the kernel (PR_SET_PDEATHSIG) instead."""
    seconds = 900000 + uuid.uuid4().int % 99999
    marker = f"sleep {seconds}"
    proc = subprocess.Popen([*CLI, "dev", "--", "sh", "-c", f"sleep $(({seconds}+0))"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not processes_with(marker):
            time.sleep(0.1)
        assert processes_with(marker), "the agent never started"
        tree = descendants(proc.pid)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and [pid for pid in tree if alive(pid)]:
            time.sleep(0.1)
        assert [pid for pid in tree if alive(pid)] == [], "daemons or workload outlived dev"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
