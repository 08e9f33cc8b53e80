"""The CLI exec client driven from outside: in a real PTY (pexpect) for ``-it``, through pipes otherwise.

Each case runs a small driver in a fresh interpreter: it forks the real launcher (as root; the fake one
otherwise) before trio starts, launches the command in a process table, attaches ``pump_exec`` to one end of a
socketpair and ``run_exec_client`` to the other, and exits with the client's code.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import termios
from pathlib import Path

import pexpect
import pytest

REPO = Path(__file__).resolve().parents[2]

DRIVER = r"""
import json, os, socket, sys
import trio
cfg = json.loads(sys.argv[1])
real = os.geteuid() == 0
if real:
    from supervisor.boundary.forkimage import NamespacePlan
    from supervisor.boundary.process import Launcher
    launcher = Launcher.fork()
else:
    from tests.integration.test_process_table import FakeLauncher
    launcher = FakeLauncher()
from supervisor.boundary.process.environment import build_process_spec, managed_env
from supervisor.boundary.process.exec_session import pump_exec
from supervisor.boundary.process.table import ProcessTable
from supervisor.cli.exec_client import run_exec_client
from supervisor.jsonlog import JsonLog
from supervisor.protocol.errors import OpError
from supervisor.protocol.process_ops import parse_exec_request

async def main():
    if real:
        await launcher.prepare(NamespacePlan("R"))
    table = ProcessTable(launcher, log=JsonLog("boundary", stream=open(os.devnull, "w")))
    req = parse_exec_request(cfg["request"])
    spec = build_process_spec(req, agent_uid=1000, agent_gid=1000, managed_env=managed_env(),
                              default_cwd="/tmp", landlock=None)
    a, b = socket.socketpair()
    client, server = (trio.SocketStream(trio.socket.from_stdlib_socket(s)) for s in (a, b))
    async with trio.open_nursery() as n:
        await n.start(table.run)
        try:
            entry = await table.start(spec, kind="exec")
        except OpError as exc:
            from supervisor.protocol.channel import Error, encode_frame
            await server.send_all(encode_frame(Error(exc)))
            await server.aclose()
        else:
            n.start_soon(pump_exec, entry, server)
        code = await run_exec_client(client, tty=cfg["tty"], interactive=cfg["interactive"])
        n.cancel_scope.cancel()
    return code

code = trio.run(main)
if os.isatty(0):
    import termios
    lflag = termios.tcgetattr(0)[3]
    os.write(1, b"\r\nTERMINAL echo=%d icanon=%d\r\n" % (bool(lflag & termios.ECHO), bool(lflag & termios.ICANON)))
if real:
    launcher.close()
sys.exit(code)
"""


def driver_argv(request: dict[str, object], *, tty: bool, interactive: bool) -> list[str]:
    cfg = {"request": request, "tty": tty, "interactive": interactive}
    return [sys.executable, "-c", DRIVER, json.dumps(cfg)]


def run_piped(
    request: dict[str, object], stdin: bytes = b"", interactive: bool = True
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        driver_argv(request, tty=False, interactive=interactive), input=stdin, capture_output=True, cwd=REPO,
        timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


def test_streams_are_payload_and_exit_code_propagates() -> None:
    done = run_piped({"argv": ["/bin/sh", "-c", "echo out; echo err >&2; exit 4"]})
    assert (done.stdout, done.stderr, done.returncode) == (b"out\n", b"err\n", 4)


def test_stdin_forwarded_with_eof() -> None:
    data = b"".join(b"line %d\n" % i for i in range(5000))
    done = run_piped({"argv": ["cat"]}, stdin=data)
    assert (done.stdout, done.returncode) == (data, 0)


def test_without_interactive_stdin_is_closed() -> None:
    done = run_piped({"argv": ["cat"]}, stdin=b"never read", interactive=False)
    assert (done.stdout, done.returncode) == (b"", 0)


def test_signal_exit_renders_128_plus_n() -> None:
    done = run_piped({"argv": ["/bin/sh", "-c", "kill -TERM $$"]})
    assert done.returncode == 143


@pytest.mark.parametrize(
    ("argv", "code"),
    [(["/nonexistent/program"], 127), (["/etc/hostname"], 126)],
)
def test_launch_failure_codes(argv: list[str], code: int) -> None:
    done = run_piped({"argv": argv})
    assert done.returncode == code
    assert done.stdout == b""
    assert b"exec failed" in done.stderr


def test_interactive_shell_in_a_real_pty() -> None:
    child = pexpect.spawn(
        sys.executable, driver_argv({"argv": ["/bin/sh", "-i"], "tty": True, "cols": 90, "rows": 30},
                                    tty=True, interactive=True)[1:],
        cwd=str(REPO), env={**os.environ, "PYTHONPATH": str(REPO)}, dimensions=(30, 90), timeout=20,
    )  # fmt: skip
    try:
        child.expect(r"[$#] ")  # the remote shell's prompt
        # raw mode on our side: the local terminal does not echo, the remote PTY does
        raw = termios.tcgetattr(child.child_fd)
        assert not raw[3] & termios.ECHO and not raw[3] & termios.ICANON
        child.send("echo hello $((6*7))\r")
        child.expect("hello 42")
        child.expect(r"[$#] ")
        child.send("stty size\r")
        child.expect("30 90")
        child.expect(r"[$#] ")
        child.setwinsize(40, 100)  # SIGWINCH to the client → RESIZE → remote TIOCSWINSZ
        child.send("stty size\r")
        child.expect("40 100")
        child.expect(r"[$#] ")
        child.send("sleep 30\r")
        child.send("\x03")  # Ctrl-C travels as a byte; the remote terminal turns it into SIGINT
        child.expect(r"[$#] ")
        child.send("echo still here\r")
        child.expect("still here")
        child.send("exit 3\r")
        child.expect("TERMINAL echo=1 icanon=1")  # restored before the client process exits
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 3
    finally:
        if child.isalive():
            child.terminate(force=True)


def test_terminal_restored_when_the_client_is_killed() -> None:
    child = pexpect.spawn(
        sys.executable, driver_argv({"argv": ["/bin/sh", "-i"], "tty": True}, tty=True, interactive=True)[1:],
        cwd=str(REPO), env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=20,
    )  # fmt: skip
    try:
        child.expect(r"[$#] ")
        child.kill(signal.SIGTERM)
        child.expect("TERMINAL echo=1 icanon=1")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 128 + signal.SIGTERM
    finally:
        if child.isalive():
            child.terminate(force=True)


def test_tty_without_interactive_keeps_ctrl_c_local() -> None:
    # -t without -i: nothing is forwarded, so the terminal stays cooked and Ctrl-C stops the client itself
    child = pexpect.spawn(
        sys.executable, driver_argv({"argv": ["/bin/sh", "-c", "echo started; sleep 30"], "tty": True},
                                    tty=True, interactive=False)[1:],
        cwd=str(REPO), env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=20,
    )  # fmt: skip
    try:
        child.expect("started")
        child.sendintr()
        child.expect("TERMINAL echo=1 icanon=1")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 128 + signal.SIGINT
    finally:
        if child.isalive():
            child.terminate(force=True)
