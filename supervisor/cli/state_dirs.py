"""Where a local sandbox keeps what outlives it: ``$XDG_STATE_HOME/openshell-sandbox/<sandbox>/``.

Dev mode writes the daemons' JSON events to ``events.jsonl`` there and uses ``work/`` as the agent's default
workdir (docs/design.md "Events", "Default filesystem"); both are kept after the sandbox exits.

Rules:

1. ``$XDG_STATE_HOME`` counts only when it is an absolute path (the XDG base-directory spec says a relative
   one is ignored); otherwise ``~/.local/state``.
2. A sandbox name is one path component: no ``/``, no ``.`` or ``..``, nothing empty.
3. Directories we create above the sandbox's are 0700 (the XDG default). The sandbox's own directory is 0711:
   the agent's uid (model R) must traverse it to reach ``work/``, but can list nothing in it; the events file
   is 0600. The agent's view hides the whole directory where it can (R and U); see the confinement code.
4. An existing sandbox directory must be a real directory owned by us, never a symlink: it holds our logs.
5. The dev process that made a sandbox's directory records itself in ``owner`` (its pid and the start time the
   kernel gives it, so a recycled pid is not mistaken for it). A directory whose owner is alive belongs to a
   running sandbox and is never removed (``openshell-sandbox clean``, ``supervisor/cli/clean.py``).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

STATE_DIR_MODE = 0o711  # traversable for work/ (agent uid in model R), listable by us only
EVENTS_FILE = "events.jsonl"
OWNER_FILE = "owner"  # "<pid> <start time in clock ticks since boot>" of the dev process that made it (rule 5)


class StateDirError(Exception):
    """The state directory cannot be used; the message names the path at fault."""


def state_home() -> Path:
    """``$XDG_STATE_HOME`` when absolute, else ``~/.local/state``."""
    value = os.environ.get("XDG_STATE_HOME", "")
    if value and os.path.isabs(value):
        return Path(value)
    return Path.home() / ".local" / "state"


def sandbox_state_dir(sandbox: str) -> Path:
    """``<state home>/openshell-sandbox/<sandbox>`` (not created; see :func:`ensure_sandbox_state_dir`)."""
    if not sandbox or sandbox in (".", "..") or "/" in sandbox or "\0" in sandbox:
        raise StateDirError(f"sandbox name {sandbox!r} is not a single path component")
    return state_home() / "openshell-sandbox" / sandbox


def events_path(sandbox: str) -> Path:
    """The sandbox's JSON-lines event log."""
    return sandbox_state_dir(sandbox) / EVENTS_FILE


def ensure_sandbox_state_dir(sandbox: str) -> Path:
    """Create the sandbox's state directory (and its parents, 0700) and check it is ours; return it."""
    path = sandbox_state_dir(sandbox)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            path.mkdir(mode=STATE_DIR_MODE)
        except FileExistsError:
            pass
        info = path.lstat()
    except OSError as exc:
        raise StateDirError(f"state directory {path}: {exc.strerror or exc}") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise StateDirError(f"state directory {path} is not a directory (a symlink or file is in its place)")
    if info.st_uid != os.geteuid():
        raise StateDirError(f"state directory {path} is owned by uid {info.st_uid}, not by us ({os.geteuid()})")
    os.chmod(path, STATE_DIR_MODE)  # mkdir's mode is masked by the umask
    return path


def _start_time(pid: int) -> int | None:
    """The process's start time (``/proc/PID/stat`` field 22), or None when there is no such process."""
    try:
        stat_text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return int(stat_text.rsplit(")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return None


def write_owner(directory: Path) -> None:
    """Rule 5: record this process as the owner of a sandbox's state directory."""
    pid = os.getpid()
    (directory / OWNER_FILE).write_text(f"{pid} {_start_time(pid)}\n")


def owner_alive(directory: Path) -> bool:
    """Whether the process recorded in ``directory``'s ``owner`` is still running (rule 5); False without one."""
    try:
        pid_text, start_text = (directory / OWNER_FILE).read_text().split()
        pid, start = int(pid_text), int(start_text)
    except (OSError, ValueError):
        return False
    return _start_time(pid) == start
