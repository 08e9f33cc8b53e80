"""What both dev-mode topologies share (``cli/dev.py``, ``cli/dev_proxy_pod.py``): the options, the sandbox's
throwaway claims, how the daemons are started and stopped, and the console that prints their events."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from supervisor.cli.dev_console import Console, EventsTail, launch_failure_line
from supervisor.cli.state_dirs import (
    StateDirError,
    ensure_sandbox_state_dir,
    events_path,
    sandbox_state_dir,
    write_owner,
)
from supervisor.protocol.claims import Claims
from supervisor.protocol.event_names import EventName
from supervisor.protocol.interpreter import cli_argv, composed_environment, import_path, installation_problem
from supervisor.protocol.runtime_dir import runtime_base


@dataclass
class DevOptions:
    argv: list[str]
    policy: Path | None = None
    dns_servers: tuple[str, ...] = ()
    privilege_model: str = "auto"
    workdir: str | None = None  # None: <state dir>/work (supervisor/cli/dev_confinement.py)
    agent_user: str | None = None
    workdir_read_only: bool = False  # the agent only reads --workdir: not refused when it cannot write it
    acknowledge_external_fence: bool = False
    credentials: Path | None = None
    upstream_ca: Path | None = None
    inference_routes: Path | None = None  # control's --inference-routes (a private copy; the original watched)
    inference_idle_timeout: float | None = None  # control's --inference-idle-timeout (None: its default)
    log_format: str = "text"  # "text": human lines on stderr; "json": the daemons' JSON events on stderr
    quiet: bool = False  # nothing of ours on stderr (fatal errors aside)
    ipv6_egress: str = "auto"  # control's --ipv6-egress
    workers: str = "1"  # control's --workers
    self_addresses: tuple[str, ...] = ()  # control's --self-address
    api_listen: str | None = None  # control's --api-listen ADDR:PORT; an operator bundle is minted for it
    metrics_listen: str | None = None  # control's --metrics-listen ADDR:PORT
    boundary_metrics_listen: str | None = None  # the boundary's --metrics-listen ADDR:PORT
    pids_limit: int | None = None  # the boundary's --pids-limit (None: its default)
    memory_limit: int | None = None  # the boundary's --memory-limit in bytes (None: its default)
    topology: str = "boundary"  # "proxy-pod": supervisor/cli/dev_proxy_pod.py
    # proxy-pod only: control's --proxy-max-connections and --proxy-per-client (None: control's defaults)
    proxy_max_connections: int | None = None
    tty: bool | None = None  # the agent's own terminal: -t True, -T False, None: when stdin and stdout are one
    escape: int | None = ord("~")  # with a terminal: the escape character (supervisor/cli/dev_terminal.py)
    remove_state: bool = False  # --rm: the sandbox's state directory (events, default workdir) goes at exit


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


def _die_with_dev() -> None:
    """In the daemon child before exec: SIGTERM it when dev mode itself dies, however it dies (dev is single-
    threaded when it starts them, so this pre-exec hook is safe)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _entry() -> list[str]:
    """The daemons' interpreter: isolated, on the installation's import path (docs/design.md "Our own
    interpreters"); their flags follow."""
    return cli_argv()


def daemon_environment(opts: DevOptions) -> dict[str, str]:
    """The daemons' environment, composed (supervisor/protocol/interpreter.py rule 4): what control documents it
    reads — the ``*_env`` variables the credentials file names, upstream trust, time zone, locale."""
    return composed_environment(extra=secret_env_names(opts.credentials))


def secret_env_names(credentials: Path | None) -> list[str]:
    """The variables a credentials file names with ``secret_env`` (or, for an access key pair, ``access_key_id_env``,
    ``secret_access_key_env``, ``session_token_env``); control reports a file it cannot read."""
    if credentials is None:
        return []
    try:
        data = yaml.safe_load(credentials.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return []
    if not isinstance(data, dict):
        return []
    entries = [raw for raw in data.values() if isinstance(raw, dict)]
    keys = ("secret_env", "access_key_id_env", "secret_access_key_env", "session_token_env")
    return [raw[key] for raw in entries for key in keys if isinstance(raw.get(key), str)]


def installation_refusal(workdir: str | None = None) -> str | None:
    """Why dev mode must not start its daemons from this installation, if it must not (rule 3 of
    supervisor/protocol/interpreter.py): whoever can write there could run code as them — the agent too, when
    its workdir holds a directory of the daemons' import path."""
    if workdir is not None:
        top = os.path.realpath(workdir)
        for entry in import_path():
            if os.path.commonpath([top, os.path.realpath(entry)]) == top:
                return (f"refusing --workdir={workdir}: the agent can write it, and the daemons import from {entry} "
                        "below it")  # fmt: skip
    problem = installation_problem()
    if problem is None:
        return None
    return (f"refusing to start: {problem}, and the daemons import from there (uid {os.geteuid()} would run code "
            "that someone else can change); install openshell-sandbox where only root"
            f"{' and you' if os.geteuid() else ''} can write")  # fmt: skip


def _default_policy_file() -> Path:
    return Path(__file__).resolve().parent.parent / "control" / "default_policy.yaml"


def _console(opts: DevOptions, sandbox: str) -> tuple[Callable[[], None], Callable[[str], None]]:
    """The tick that prints new human lines from the events file, and how dev mode says anything itself."""

    def say(message: str) -> None:
        if not opts.quiet:
            print(message, file=sys.stderr, flush=True)

    if opts.log_format in ("json", "ocsf") and not opts.quiet:
        return (lambda: None), say  # the events themselves go to stderr
    if opts.quiet:  # nothing of ours but what is fatal: the agent that could not be started
        quiet_tail = EventsTail(events_path(sandbox))

        def fatal_only() -> None:
            for event in quiet_tail.read():
                if event.get("event") == EventName.AGENT_LAUNCH_FAILED and event.get("component") == "boundary":
                    print(launch_failure_line(event.get("program"), event.get("error")), file=sys.stderr, flush=True)

        return fatal_only, say
    policy = opts.policy.resolve() if opts.policy is not None else _default_policy_file()
    label = str(opts.policy) if opts.policy is not None else "embedded deny-all"
    console = Console(sandbox=sandbox, policy=policy, policy_label=label, events_path=events_path(sandbox),
                      api=runtime_base() / sandbox / "api.sock",
                      policy_source=str(opts.policy.absolute()) if opts.policy is not None else None)  # fmt: skip
    tail = EventsTail(events_path(sandbox))

    def tick() -> None:
        for event in tail.read():
            for line in console.lines_for(event):
                say(line)

    return tick, say


@dataclass(frozen=True)
class DevStart:
    """A new dev sandbox's name, its console and its 0711 temporary directory (traversable for the agent's CA
    files; what must stay private lives in 0700 directories below it)."""

    sandbox: str
    tick: Callable[[], None]
    say: Callable[[str], None]
    tmp: Path


def start_sandbox(opts: DevOptions, tmp_prefix: str) -> DevStart | None:
    """Name the sandbox and make its state directory (0711: the agent's uid may traverse it to a work/ below,
    never list it; events.jsonl is 0600) and temporary directory; None, said on stderr, when the state
    directory cannot be made."""
    sandbox = "dev-" + secrets.token_hex(4)
    try:
        write_owner(ensure_sandbox_state_dir(sandbox))
    except OSError as exc:
        print(f"openshell-sandbox: state directory: {exc}", file=sys.stderr)
        return None
    except StateDirError as exc:
        print(f"openshell-sandbox: {exc} (set XDG_STATE_HOME to a directory of yours)", file=sys.stderr)
        return None
    tick, say = _console(opts, sandbox)
    tmp = Path(tempfile.mkdtemp(prefix=tmp_prefix))
    os.chmod(tmp, 0o711)
    return DevStart(sandbox, tick, say, tmp)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def remove_state(opts: DevOptions, sandbox: str) -> None:
    """``--rm``: the run's state directory (its events and default workdir) removed at exit; a ``--workdir`` of
    the user's is elsewhere and stays."""
    if opts.remove_state:
        shutil.rmtree(sandbox_state_dir(sandbox), ignore_errors=True)  # symlinks inside are removed, not followed
