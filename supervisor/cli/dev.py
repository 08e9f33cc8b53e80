"""Local dev mode: control and boundary as two OS processes on loopback, CMD as the agent.

``openshell-sandbox dev -- CMD`` mints a throwaway bootstrap bundle in a private temporary directory, starts
the boundary (which holds the agent until ``start``) on an ephemeral loopback port, then control pointed at
it. Without a terminal the agent inherits dev's stdin, stdout and stderr; stdout carries only the agent's output.
With one (stdin and stdout a terminal, or ``-t``) the agent gets a terminal of its own and dev is its client
(``supervisor/cli/dev_terminal.py``).

Talking to a person (docs/design.md "Events"): both daemons append their JSON events to
``$XDG_STATE_HOME/openshell-sandbox/<sandbox>/events.jsonl`` (kept after exit; ``supervisor/cli/state_dirs.py``),
and dev mode tails that file to print a ready line and one human line per refusal on stderr
(``supervisor/cli/dev_console.py``). ``--log-format json`` (or ``ocsf``) streams the events to stderr instead of
those lines; ``-q`` prints nothing of ours (fatal errors aside). The file is opened by each daemon close-on-exec,
so no workload process inherits it. The exit code is the agent's (128+N for a signal; 125 when the
sandbox itself failed). On Ctrl-C or SIGTERM the agent is terminated and both daemons stop; Ctrl-C without a
terminal of the agent's exits 130 (with one, Ctrl-C is the agent's). Nothing is left: no process, no socket, no
temporary directory, no cgroup.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.cli.dev_common import (
    DevOptions,
    _die_with_dev,
    _entry,
    _stop,
    daemon_environment,
    dev_claims,
    installation_refusal,
    remove_state,
    start_sandbox,
)
from supervisor.cli.dev_confinement import DevSetupError, prepare, resolve_model
from supervisor.cli.dev_terminal import TerminalSession, agent_terminal_flags, wants_terminal
from supervisor.cli.state_dirs import events_path
from supervisor.protocol.certs import issue_bundle
from supervisor.protocol.exit_codes import ExitCode, for_signal
from supervisor.protocol.runtime_dir import RuntimeDirError, ensure_runtime_base

PORT_WAIT_S = 30.0
CONTROL_RESTARTS = 5


def run_dev(opts: DevOptions) -> int:
    if opts.topology == "proxy-pod":
        from supervisor.cli.dev_proxy_pod import run_proxy_pod

        return run_proxy_pod(opts)
    if (runtime_base := _runtime_base(opts)) is None:
        return ExitCode.SELF_FAILED
    start = start_sandbox(opts, "openshell-dev-")  # events.jsonl must also be hidden from the agent's view (U, P)
    if start is None:
        return ExitCode.SELF_FAILED
    sandbox, tick, say, tmp = start.sandbox, start.tick, start.say, start.tmp
    terminal = wants_terminal(opts.tty)
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
        issue_bundle(tmp / "bundle", dev_claims(sandbox), operator=opts.api_listen is not None)
        runtime = runtime_base / sandbox
        port_file = tmp / "boundary.port"
        env = daemon_environment(opts)
        try:
            plan = prepare(
                sandbox=sandbox, tmp=tmp, runtime_parent=runtime.parent, model=resolve_model(opts.privilege_model)[0],
                workdir=opts.workdir, agent_user=opts.agent_user, policy=opts.policy, credentials=opts.credentials,
                inference_routes=opts.inference_routes,
                workdir_read_only=opts.workdir_read_only,
            )  # fmt: skip
        except DevSetupError as exc:
            print(f"openshell-sandbox: {exc}", file=sys.stderr)
            return ExitCode.SELF_FAILED
        for note in plan.notes:
            say(f"openshell-sandbox: {note}")
        log_flags = _log_flags(opts, sandbox)
        boundary_cmd = _boundary_command(opts, tmp, port_file, plan.boundary_flags, log_flags, terminal)
        stdin = subprocess.DEVNULL if terminal else None  # the terminal is dev's to read (dev_terminal.py)
        procs.append(subprocess.Popen(boundary_cmd, env=env, stdin=stdin, preexec_fn=_die_with_dev))
        port = _wait_for_port(port_file, procs[0])
        if port is None:
            return _finish(procs, received, default=ExitCode.SELF_FAILED, tick=tick, say=say)
        control_cmd = _control_command(opts, tmp, port, runtime, plan.control_flags, log_flags)
        if opts.api_listen is not None:
            host, _, api_port = opts.api_listen.rpartition(":")
            say(f"openshell-sandbox: operator API on https://{host}:{api_port} --cert {tmp / 'bundle' / 'operator'}"
                " (removed when dev exits)")  # fmt: skip
        procs.append(subprocess.Popen(control_cmd, env=env, stdin=subprocess.DEVNULL, preexec_fn=_die_with_dev))
        restart = Restart(control_cmd, env, runtime / "api.sock")

        def finish() -> int:
            from supervisor.cli.policy_suggest import suggest_hint  # only at the end: dev starts without it

            code = _finish(procs, received, default=ExitCode.SELF_FAILED, restart_control=restart, tick=tick, say=say)
            if (hint := suggest_hint(events_path(sandbox), opts.policy)) is not None:
                say(hint)
            return code

        if terminal:
            session = TerminalSession(
                api=runtime / "api.sock", escape=opts.escape, stop=lambda: on_signal(signal.SIGTERM, None),
                wait_for_ready_line=not opts.quiet and opts.log_format == "text",
            )  # fmt: skip
            return session.run(finish)
        code = finish()
        return for_signal(signal.SIGINT) if received and received[0] == signal.SIGINT else code
    finally:
        _clean_up(procs, previous, tmp, runtime)
        remove_state(opts, sandbox)


def _runtime_base(opts: DevOptions) -> Path | None:
    """The private runtime directory's parent (None, said why, when this installation or it is unsafe)."""
    if (refusal := installation_refusal(opts.workdir)) is not None:
        print(f"openshell-sandbox: {refusal}", file=sys.stderr)
        return None
    try:
        return ensure_runtime_base()  # hidden from the agent by a tmpfs (supervisor/cli/dev_confinement.py)
    except RuntimeDirError as exc:
        print(f"openshell-sandbox: {exc}", file=sys.stderr)
        return None


def _clean_up(
    procs: list[subprocess.Popen[bytes]], previous: dict[signal.Signals, Any], tmp: Path, runtime: Path | None
) -> None:
    """Nothing is left: no daemon, no signal handler of ours, no temporary or runtime directory."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for signum, handler in previous.items():
        signal.signal(signum, handler)
    shutil.rmtree(tmp, ignore_errors=True)
    if runtime is not None:
        shutil.rmtree(runtime, ignore_errors=True)


def _log_flags(opts: DevOptions, sandbox: str) -> list[str]:
    """Both daemons write the events file; the stream carries them only for ``--log-format json|ocsf``."""
    return [f"--log-stream={'stderr' if opts.log_format in ('json', 'ocsf') and not opts.quiet else 'none'}",
            f"--log-format={'ocsf' if opts.log_format == 'ocsf' else 'json'}",
            f"--log-file={events_path(sandbox)}"]  # fmt: skip


def _fence_flags(opts: DevOptions) -> list[str]:
    """Dev mode never probes (docs/design.md: no probe leaves the machine): the fence is acknowledged-unprobed."""
    return ["--acknowledge-external-fence", "--acknowledge-unprobed-fence"] if opts.acknowledge_external_fence else []


def _boundary_command(opts: DevOptions, tmp: Path, port_file: Path, plan_flags: list[str], log_flags: list[str],
                      terminal: bool) -> list[str]:  # fmt: skip
    """The boundary on an ephemeral loopback port, writing it to ``port_file``; the agent's argv last."""
    return [
        *_entry(), "--mode=boundary", f"--bootstrap={tmp / 'bundle' / 'boundary'}", "--listen=127.0.0.1:0",
        f"--port-file={port_file}", *plan_flags,
        f"--tls-dir={tmp / 'tls'}", "--exit-linger=5", *log_flags, *_fence_flags(opts), *agent_terminal_flags(terminal),
        *([f"--pids-limit={opts.pids_limit}"] if opts.pids_limit is not None else []),
        *([f"--memory-limit={opts.memory_limit}"] if opts.memory_limit is not None else []),
        *([f"--metrics-listen={opts.boundary_metrics_listen}"] if opts.boundary_metrics_listen else []),
        "--", *opts.argv,
    ]  # fmt: skip


def _control_command(opts: DevOptions, tmp: Path, port: int, runtime: Path, plan_flags: list[str],
                     log_flags: list[str]) -> list[str]:  # fmt: skip
    """Control dialling the boundary's ``port``, its API socket under ``runtime``, and dev's options passed on."""
    control_cmd = [
        *_entry(), "--mode=control", f"--bootstrap={tmp / 'bundle' / 'control'}", f"--boundary=127.0.0.1:{port}",
        f"--api={runtime / 'api.sock'}", f"--interception-ca={tmp / 'interception'}", *log_flags, *_fence_flags(opts),
    ]  # fmt: skip
    if opts.acknowledge_external_fence:
        control_cmd.append("--capture-mode=proxy-env")
    control_cmd += plan_flags  # private copies of --policy/--credentials, agent ids, workdir
    if opts.upstream_ca is not None:
        control_cmd.append(f"--upstream-ca={opts.upstream_ca}")
    if opts.inference_idle_timeout is not None:
        control_cmd.append(f"--inference-idle-timeout={opts.inference_idle_timeout:g}")
    control_cmd += [f"--dns-server={server}" for server in opts.dns_servers]
    control_cmd += [f"--ipv6-egress={opts.ipv6_egress}", *(f"--self-address={a}" for a in opts.self_addresses)]
    control_cmd.append(f"--workers={opts.workers}")
    if opts.api_listen is not None:
        control_cmd.append(f"--api-listen={opts.api_listen}")
    if opts.metrics_listen is not None:
        control_cmd.append(f"--metrics-listen={opts.metrics_listen}")
    return control_cmd


def _wait_for_port(port_file: Path, boundary: subprocess.Popen[bytes]) -> int | None:
    deadline = time.monotonic() + PORT_WAIT_S
    while time.monotonic() < deadline:
        if port_file.exists():
            return int(port_file.read_text())
        if boundary.poll() is not None:
            return None
        time.sleep(0.02)
    return None


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Restart:
    """How dev mode restarts control, and how it tells that control had come up: its API socket appeared."""

    argv: list[str]
    env: dict[str, str]
    api: Path


def _finish(
    procs: list[subprocess.Popen[bytes]],
    received: list[int],
    *,
    default: int,
    restart_control: Restart | None = None,
    tick: Callable[[], None] = lambda: None,
    say: Callable[[str], None] | None = None,
) -> int:
    """Wait for the boundary (its exit code is the agent's), then stop control.

    Control is restarted when it dies on its own after it had come up (as its Deployment would restart it): the
    agent keeps running, its connections fail closed meanwhile, and the new control resumes the boundary. A
    control that dies before its API ever listened failed at start-up (a permission, a bad file, a port in use):
    a restart cannot fix that, so its one error stands and the sandbox stops. After ``CONTROL_RESTARTS`` deaths
    the sandbox is stopped and our own failure reported. ``tick`` runs on every turn (and once after the end) to
    print what the events file has to say.
    """
    boundary = procs[0]
    restarts = 0
    came_up = False
    while boundary.poll() is None:
        tick()
        control = procs[1] if len(procs) > 1 else None
        if control is not None and control.poll() is None and restart_control is not None and not came_up:
            came_up = restart_control.api.exists()
        if control is not None and control.poll() is not None and not received:
            if restart_control is None or restarts >= CONTROL_RESTARTS or not came_up:
                why = "" if came_up or restart_control is None else " at start-up (its error is above)"
                print(f"openshell-sandbox: control exited ({control.returncode}){why}; stopping the sandbox",
                      file=sys.stderr)  # fmt: skip
                _stop(boundary)
                return default
            restarts += 1
            (say or _to_stderr)(f"openshell-sandbox: control exited ({control.returncode}); restarting it ({restarts})")
            time.sleep(min(0.2 * restarts, 2.0))
            procs[1] = subprocess.Popen(restart_control.argv, env=restart_control.env, stdin=subprocess.DEVNULL,
                                        preexec_fn=_die_with_dev)  # fmt: skip
        time.sleep(0.05)
    code = boundary.returncode
    for proc in procs[1:]:
        _stop(proc)
    tick()
    if code < 0:  # the boundary itself died of a signal
        return default
    return code
