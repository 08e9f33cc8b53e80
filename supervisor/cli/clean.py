"""``openshell-sandbox clean [--older-than AGE] [--dry-run]``: remove the state directories old dev runs left.

Every dev run keeps ``$XDG_STATE_HOME/openshell-sandbox/<sandbox>/`` (its events and default workdir) after it
exits (``supervisor/cli/state_dirs.py``); this removes those of the caller's own state home that are old enough.

Rules:

1. Only the caller's own ``$XDG_STATE_HOME/openshell-sandbox`` is looked at, and in it only real directories
   owned by the caller's uid with a sandbox's name (``dev-…``); nothing is followed through a symlink.
2. Never a running sandbox's: one whose recorded owner (the dev process, ``state_dirs.owner_alive``) is alive,
   or whose operator API socket still answers, is kept whatever its age.
3. Age is the newest modification time of the directory, its events file and its workdir: a sandbox written to
   within ``--older-than`` is kept.
4. Removal does not follow symlinks the agent may have left in its workdir (``shutil.rmtree`` on a directory
   descriptor); one that cannot be removed is named and the exit code is 1.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import stat
import sys
import time
from pathlib import Path

from supervisor.cli.state_dirs import EVENTS_FILE, owner_alive, state_home
from supervisor.protocol.runtime_dir import runtime_base

_AGE = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_NAME = re.compile(r"dev-[0-9a-f]{8}")


def age(text: str) -> float:
    """``30m``, ``12h``, ``7d``, ``90`` (seconds) → seconds; argparse's type for ``--older-than``."""
    match = _AGE.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not an age such as 30m, 12h or 7d")
    return float(match.group(1)) * _UNIT[match.group(2)]


def _touched(directory: Path) -> float:
    times = []
    for path in (directory, directory / EVENTS_FILE, directory / "work"):
        try:
            times.append(path.lstat().st_mtime)
        except OSError:
            continue
    return max(times)


def _api_answers(sandbox: str) -> bool:
    import socket

    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1)
    try:
        probe.connect(str(runtime_base() / sandbox / "api.sock"))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def candidates(older_than: float, now: float | None = None) -> tuple[list[Path], list[tuple[Path, str]]]:
    """(directories to remove, [(directory kept, why)]) under the caller's state home (rules 1-3)."""
    root = state_home() / "openshell-sandbox"
    now = time.time() if now is None else now
    remove: list[Path] = []
    kept: list[tuple[Path, str]] = []
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return [], []
    for directory in entries:
        try:
            info = directory.lstat()
        except OSError:
            continue
        if not _NAME.fullmatch(directory.name) or not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            continue
        if owner_alive(directory) or _api_answers(directory.name):
            kept.append((directory, "running"))
        elif now - _touched(directory) < older_than:
            kept.append((directory, "recent"))
        else:
            remove.append(directory)
    return remove, kept


def run_clean(older_than: float, *, dry_run: bool = False) -> int:
    remove, kept = candidates(older_than)
    failed = 0
    for directory in remove:
        if dry_run:
            print(f"would remove {directory}")
            continue
        try:
            shutil.rmtree(directory)
        except OSError as exc:
            failed += 1
            print(f"openshell-sandbox: cannot remove {directory}: {exc.strerror or exc}", file=sys.stderr)
            continue
        print(f"removed {directory}")
    running = sum(1 for _, why in kept if why == "running")
    if running:
        print(f"kept {running} running sandbox{'es' if running != 1 else ''}'s", file=sys.stderr)
    return 1 if failed else 0
