"""Process operations through the real CLI against a running dev sandbox: `exec -it` in a real terminal, plain
exec, forward, signal, wait, terminate — and the forward attacks from the operator's side."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pexpect
import pytest

from tests.interrupt import interruptible
from tests.sandbox_api import api_env

CLI = [sys.executable, "-m", "supervisor.cli"]
WORKLOAD_PORT = 8000
# A tiny HTTP server the agent runs on its own loopback (inside the workload's network namespace).
AGENT = (
    "import http.server, socketserver\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        body = b'hello from inside the workload\\n'\n"
    "        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers()\n"
    "        self.wfile.write(body)\n"
    "    def log_message(self, *a): pass\n"
    f"socketserver.TCPServer(('127.0.0.1', {WORKLOAD_PORT}), H).serve_forever()\n"
)


@dataclass
class Sandbox:
    env: dict[str, str]  # once ready: OPENSHELL_SANDBOX_API names this sandbox's socket (tests/sandbox_api.py)

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=api_env(self.env))


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    if os.geteuid() != 0:
        pytest.skip("dev mode runs the boundary in model R here (root)")
    runtime = tempfile.mkdtemp(prefix="osr-", dir="/tmp")
    env = {**os.environ, "XDG_RUNTIME_DIR": runtime}
    dev = subprocess.Popen([*CLI, "dev", "--", "/usr/bin/python3", "-c", AGENT], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    box = Sandbox(env)
    try:
        deadline = time.monotonic() + 60
        while box.cli("readyz").returncode != 0:
            assert dev.poll() is None, dev.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the sandbox never became ready"
            time.sleep(0.2)
        box.env = api_env(env)
        yield box
    finally:
        dev.terminate()
        dev.wait(timeout=30)
        shutil.rmtree(runtime, ignore_errors=True)


def test_exec_it_answers_an_interactive_shell(sandbox: Sandbox) -> None:
    child = pexpect.spawn(CLI[0], [*CLI[1:], "exec", "-it", "--", "sh", "-i"], env=sandbox.env,
                          encoding="utf-8", timeout=30, dimensions=(24, 80))  # fmt: skip
    try:
        child.expect(r"\$ ")
        child.sendline("stty size; id -u")
        child.expect(r"24 80\s+610\d\d")  # dev's dedicated agent uid (61000-61183)
        child.setwinsize(40, 132)  # SIGWINCH → RESIZE frame → TIOCSWINSZ on the workload's terminal
        deadline = time.monotonic() + 60  # the frame is asynchronous: ask until the new size shows
        while True:
            child.sendline("stty size")
            if child.expect([r"40 132", r"\d+ \d+\s"]) == 0:
                break
            assert time.monotonic() < deadline, f"the terminal kept its old size: {child.after!r}"
        child.sendline("exit 7")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 7
    finally:
        if child.isalive():
            child.terminate(force=True)


def test_exec_it_terminal_is_the_agents_own(sandbox: Sandbox) -> None:
    """The PTY comes from the agent's own devpts: `tty` and ``ttyname`` name it, it is the agent's, and the only
    terminal in the agent's /dev/pts besides ptmx is its own (no host terminal is visible or reachable)."""
    script = (
        "import os; name = os.ttyname(0); st = os.stat(name);"
        "fd = lambda n: '/proc/self/fd/%d' % n;"
        "fds = [os.readlink(fd(n)) for n in range(64) if os.path.lexists(fd(n))];"
        "print('TTY', name, st.st_uid == os.getuid(), os.ttyname(1) == name, sorted(os.listdir('/dev/pts')));"
        "print('MASTERS', sum('ptmx' in f for f in fds))"
    )
    child = pexpect.spawn(CLI[0], [*CLI[1:], "exec", "-it", "--", "sh", "-c", f"tty; python3 -c \"{script}\""],
                          env=sandbox.env, encoding="utf-8", timeout=30)  # fmt: skip
    try:
        child.expect(r"(/dev/pts/\d+|not a tty)\r\n")
        assert child.match.group(1).startswith("/dev/pts/"), child.match.group(1)
        child.expect(r"TTY (/dev/pts/(\d+)) True True \[(.*)\]")
        listed = {name.strip(" '") for name in child.match.group(3).split(",")}
        assert child.match.group(2) in listed and "ptmx" in listed
        child.expect(r"MASTERS (\d+)")
        assert child.match.group(1) == "0"  # no master reached the agent
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


def test_exec_keeps_streams_apart_and_seq_is_complete(sandbox: Sandbox) -> None:
    result = sandbox.cli("exec", "--", "sh", "-c", "seq 1 100000; echo done >&2; exit 3")
    assert result.returncode == 3
    assert result.stdout == "".join(f"{i}\n" for i in range(1, 100001))
    assert result.stderr.endswith("done\n")


def test_exec_missing_program_is_127(sandbox: Sandbox) -> None:
    assert sandbox.cli("exec", "--", "/nonexistent/tool").returncode == 127


def test_exec_stdin_with_eof(sandbox: Sandbox) -> None:
    result = subprocess.run([*CLI, "exec", "-i", "--", "sh", "-c", "wc -c"], input="x" * 70000,
                            capture_output=True, text=True, timeout=60, env=sandbox.env)  # fmt: skip
    assert result.returncode == 0 and result.stdout.strip() == "70000"


def test_forward_reaches_the_workloads_loopback(sandbox: Sandbox) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        local_port = probe.getsockname()[1]
    proc = subprocess.Popen([*CLI, "forward", f"{local_port}:{WORKLOAD_PORT}"], env=sandbox.env,
                            preexec_fn=interruptible, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        answer = b""
        while time.monotonic() < deadline and b"hello" not in answer:
            try:
                with socket.create_connection(("127.0.0.1", local_port), timeout=5) as conn:
                    conn.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
                    while chunk := conn.recv(4096):
                        answer += chunk
            except OSError:
                time.sleep(0.2)
        assert b"hello from inside the workload" in answer
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("10.0.0.1:80", "denied"), ("169.254.169.254:80", "denied"), ("[::ffff:10.0.0.1]:80", "denied"),
        ("localhost.:80", "invalid"), ("127.1:80", "invalid"), ("2130706433:80", "invalid"),
        ("0.0.0.0:80", "denied"), ("127.0.0.1:3128", "denied"), ("127.0.0.1:53", "denied"),
    ],
)  # fmt: skip
def test_forward_refuses_anything_but_the_workloads_loopback(sandbox: Sandbox, target: str, why: str) -> None:
    result = sandbox.cli("forward", f"0:{target}", timeout=30)
    assert result.returncode != 0
    assert why in result.stderr, result.stderr


def test_signal_wait_terminate_by_handle(sandbox: Sandbox) -> None:
    # exec a long sleep through the API, then drive it by its handle.
    status = json.loads(sandbox.cli("status", "--json").stdout)
    agent = status["boundary"]["agent"]["handle"]
    assert agent.startswith("p_")
    # only this test's exec: an earlier test's may still be running in the shared sandbox (an interactive
    # shell, which ignores SIGTERM, made `wait` hang when picked)
    earlier = {p["handle"] for p in status["boundary"]["processes"]}
    proc = subprocess.Popen([*CLI, "exec", "--", "sleep", "300"], env=sandbox.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        handle = None
        deadline = time.monotonic() + 60
        while handle is None and time.monotonic() < deadline:
            live = json.loads(sandbox.cli("status", "--json").stdout)["boundary"]["processes"]
            handles = [p["handle"] for p in live
                       if p["kind"] == "exec" and p["state"] == "running" and p["handle"] not in earlier]  # fmt: skip
            handle = handles[0] if handles else None
            time.sleep(0.1)
        assert handle is not None
        assert sandbox.cli("signal", "TERM", handle).returncode == 0
        waited = sandbox.cli("wait", handle)
        assert waited.returncode == 128 + signal.SIGTERM
        assert json.loads(waited.stdout)["signal"] == "TERM"
        again = sandbox.cli("signal", "TERM", handle)  # the handle's process is gone
        assert again.returncode != 0 and "terminated" in again.stderr
        assert sandbox.cli("signal", "TERM", "p_0000000000000000").returncode != 0  # never issued
        assert sandbox.cli("signal", "9", agent).returncode != 0  # numbers are not signals here
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
