"""Local dev mode: control and boundary as two OS processes on loopback, CMD as the agent.

``openshell-sandbox dev -- CMD`` mints a throwaway bootstrap bundle in a private temporary directory, starts
the boundary (which holds the agent until ``start``) on an ephemeral loopback port, then control pointed at
it. The agent inherits this terminal's stdin, stdout and stderr; both daemons log JSON lines to stderr (so
stdout carries only the agent's output). The exit code is the agent's (128+N for a signal; 125 when the
sandbox itself failed). On Ctrl-C or SIGTERM the agent is terminated and both daemons stop. Nothing is left:
no process, no socket, no temporary directory.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from supervisor.protocol.certs import issue_bundle
from supervisor.protocol.claims import Claims

EXIT_SELF_FAILED = 125
PORT_WAIT_S = 30.0


@dataclass
class DevOptions:
    argv: list[str]
    policy: Path | None = None
    dns_servers: tuple[str, ...] = ()
    privilege_model: str = "auto"
    workdir: str = "/"
    agent_user: str | None = None


def dev_claims(sandbox: str) -> Claims:
    return Claims(
        namespace="dev",
        sandbox=sandbox,
        sandbox_uid=secrets.token_hex(16),
        control_deployment=f"os-ctl-{sandbox}",
        network_policy=f"os-np-{sandbox}",
        image="local/dev",
        generation=1,
        policy_resource=f"File/{sandbox}-policy",
    )


def _entry() -> list[str]:
    return [sys.executable, "-m", "supervisor.cli"]


def run_dev(opts: DevOptions) -> int:
    sandbox = "dev-" + secrets.token_hex(4)
    tmp = Path(tempfile.mkdtemp(prefix="openshell-dev-"))
    os.chmod(tmp, 0o700)
    procs: list[subprocess.Popen[bytes]] = []
    received: list[int] = []
    runtime: Path | None = None

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        # Bundle directories must be traversable by the daemons' uid only: both are ours here.
        issue_bundle(tmp / "bundle", dev_claims(sandbox))
        runtime = Path(os.environ.get("XDG_RUNTIME_DIR") or "/run") / "openshell-sandbox" / sandbox
        port_file = tmp / "boundary.port"
        runtime.parent.mkdir(parents=True, exist_ok=True, mode=0o755)  # hidden from the agent by a tmpfs
        log_flags = ["--log-stream=stderr"]
        boundary_cmd = [
            *_entry(), "--mode=boundary", f"--bootstrap={tmp / 'bundle' / 'boundary'}", "--listen=127.0.0.1:0",
            f"--port-file={port_file}", f"--privilege-model={opts.privilege_model}", f"--workdir={opts.workdir}",
            f"--hide-path={runtime.parent}", "--exit-linger=5", *log_flags, "--", *opts.argv,
        ]  # fmt: skip
        procs.append(subprocess.Popen(boundary_cmd, start_new_session=False))
        port = _wait_for_port(port_file, procs[0])
        if port is None:
            return _finish(procs, received, default=EXIT_SELF_FAILED)
        control_cmd = [
            *_entry(), "--mode=control", f"--bootstrap={tmp / 'bundle' / 'control'}", f"--boundary=127.0.0.1:{port}",
            f"--api={runtime / 'api.sock'}", *log_flags,
        ]  # fmt: skip
        if opts.policy is not None:
            control_cmd.append(f"--policy={opts.policy}")
        if opts.agent_user is not None:
            control_cmd.append(f"--agent-user={opts.agent_user}")
        control_cmd += [f"--dns-server={server}" for server in opts.dns_servers]
        procs.append(subprocess.Popen(control_cmd, stdin=subprocess.DEVNULL))
        return _finish(procs, received, default=EXIT_SELF_FAILED)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        shutil.rmtree(tmp, ignore_errors=True)
        if runtime is not None:
            shutil.rmtree(runtime, ignore_errors=True)


def _wait_for_port(port_file: Path, boundary: subprocess.Popen[bytes]) -> int | None:
    deadline = time.monotonic() + PORT_WAIT_S
    while time.monotonic() < deadline:
        if port_file.exists():
            return int(port_file.read_text())
        if boundary.poll() is not None:
            return None
        time.sleep(0.02)
    return None


def _finish(procs: list[subprocess.Popen[bytes]], received: list[int], *, default: int) -> int:
    """Wait for the boundary (its exit code is the agent's), then stop control.

    If control dies first the sandbox cannot go on (nothing would ever start or release the agent): stop the
    boundary and report our own failure.
    """
    boundary, others = procs[0], procs[1:]
    while boundary.poll() is None:
        dead = [p for p in others if p.poll() is not None]
        if dead:
            print(f"openshell-sandbox: control exited ({dead[0].returncode}); stopping the sandbox", file=sys.stderr)
            _stop(boundary)
            return default
        time.sleep(0.05)
    code = boundary.returncode
    for proc in others:
        _stop(proc)
    if code < 0:  # the boundary itself died of a signal
        return default
    return code


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
