"""A pids limit for the workload: a cgroup of its own under the boundary's (docs/reference/boundary.md §2.10).

Rules:

1. The limit is a cgroup's ``pids.max``, never ``RLIMIT_NPROC`` (that counts every process of the uid, the
   boundary's own included in models U and P, and is checked only at fork by the forking uid).
2. cgroup v1: a child of the boundary's cgroup in the ``pids`` hierarchy, where that directory is writable.
   cgroup v2: a child of the boundary's cgroup where ``pids`` is delegated (listed in ``cgroup.controllers``).
   v2 forbids processes in a cgroup whose children have controllers enabled, so when enabling ``+pids`` in
   ``cgroup.subtree_control`` is refused with ``EBUSY`` the boundary's own processes move to a sibling leaf
   first (that is how a delegated container cgroup is used).
3. Nothing half-applied: a child whose ``pids.max`` could not be written is removed, and the caller reports the
   limit as unenforced with the reason (inside a pod the cluster's ``podPidsLimit`` is the limit).
4. The launcher (zygote) joins the child before ``prepare``: everything it forks after that — the PID
   namespace's init and every workload process — is counted; the boundary itself is not, so it keeps answering.
5. A boundary that was SIGKILLed never removed its child. The child's name says whose it is
   (``openshell-boundary-<pid>-<id>``, :func:`workload_cgroup_name`), so each boundary, before making its own,
   removes the empty children of that shape whose owner pid is gone. Only those: any other name, an owner that
   is alive, or a cgroup with members (rmdir refuses) is left alone.

Where the cgroup is comes from ``/proc/self/cgroup`` and ``/proc/self/mountinfo`` (a mount's root field is the
part of our path the mount hides, e.g. inside a cgroup namespace).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "DEFAULT_PIDS_LIMIT",
    "CgroupError",
    "PidsCgroup",
    "create_pids_cgroup",
    "locate",
    "remove_stale_children",
    "v2_enable",
    "workload_cgroup_name",
    "write",
]

DEFAULT_PIDS_LIMIT: Final = 1024
NAME_PREFIX: Final = "openshell-boundary-"
# ours: the prefix, the owner's pid, 8 hex digits of its instance id; v2's leaf for the boundary itself too. The
# whole name (fullmatch: ``$`` also matches before a final newline) and ASCII digits (``\d`` is any Unicode digit)
_OURS = re.compile(rf"{NAME_PREFIX}([0-9]+)-[0-9a-f]{{8}}(-supervisor)?")


def workload_cgroup_name(pid: int, instance: str) -> str:
    """The workload cgroup's name for the boundary ``pid`` (rule 5): it names its owner."""
    return f"{NAME_PREFIX}{pid}-{instance.replace('-', '')[:8]}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_children(directory: Path, *, alive: Callable[[int], bool] = _pid_alive) -> list[str]:
    """Rule 5: remove the empty children of ``directory`` a dead boundary left; returns their names."""
    removed: list[str] = []
    try:
        entries = list(directory.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _OURS.fullmatch(entry.name)
        if match is None or not entry.is_dir() or alive(int(match.group(1))):
            continue
        try:
            entry.rmdir()  # a cgroup with members or children is refused (EBUSY/ENOTEMPTY): left alone
        except OSError:
            continue
        removed.append(entry.name)
    return removed


class CgroupError(Exception):
    """No pids cgroup could be made; the message says why (reported as ``limits.pids: unenforced``)."""


@dataclass(frozen=True)
class Location:
    version: int  # 1 or 2
    directory: Path  # the boundary's own cgroup directory in that hierarchy


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _mounts(mountinfo: str) -> list[tuple[str, str, str, set[str]]]:
    """``(root, mountpoint, fstype, super options)`` of every mount line."""
    found = []
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(rest) < 3:
            continue
        found.append((_unescape(fields[3]), _unescape(fields[4]), rest[0], set(rest[2].split(","))))
    return found


def _join(mountpoint: str, mount_root: str, path: str) -> Path | None:
    """Our cgroup ``path`` seen through a mount of the hierarchy at ``mount_root``; None if it hides us."""
    if mount_root != "/" and path != mount_root and not path.startswith(mount_root.rstrip("/") + "/"):
        return None
    rel = path[len(mount_root) :] if mount_root != "/" else path
    return Path(mountpoint) / rel.lstrip("/")


def locate(self_cgroup: str, mountinfo: str, controller: str = "pids") -> Location:
    """The boundary's cgroup directory for ``controller``: v1's hierarchy if mounted, else v2's. Raises
    CgroupError."""
    v1_path: str | None = None
    v2_path: str | None = None
    for line in self_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2_path = parts[2]
        elif controller in parts[1].split(","):
            v1_path = parts[2]
    mounts = _mounts(mountinfo)
    if v1_path is not None:
        for root, point, fstype, options in mounts:
            if fstype == "cgroup" and controller in options and (where := _join(point, root, v1_path)) is not None:
                return Location(1, where)
        raise CgroupError(f"the {controller} hierarchy (cgroup v1, {v1_path}) is not mounted where we can see it")
    if v2_path is not None:
        for root, point, fstype, _options in mounts:
            if fstype == "cgroup2" and (where := _join(point, root, v2_path)) is not None:
                return Location(2, where)
        raise CgroupError(f"the cgroup v2 hierarchy ({v2_path}) is not mounted where we can see it")
    raise CgroupError(f"no {controller} cgroup: neither a cgroup v1 {controller} hierarchy nor cgroup v2")


@dataclass(frozen=True)
class PidsCgroup:
    version: int
    directory: Path
    limit: int
    stale_removed: tuple[str, ...] = ()  # empty children of dead boundaries removed first (rule 5)

    def describe(self) -> str:
        return f"cgroup v{self.version} {self.directory}"

    def add(self, pid: int) -> None:
        """Move ``pid`` (the launcher) into the cgroup; its later children are counted from then on."""
        (self.directory / "cgroup.procs").write_text(f"{pid}\n")

    def current(self) -> int | None:
        try:
            return int((self.directory / "pids.current").read_text().strip())
        except (OSError, ValueError):
            return None

    def remove(self, wait_s: float = 0.0) -> bool:
        """Remove the cgroup once it is empty: the kernel refuses (EBUSY) while a member is still dying, so
        retry for up to ``wait_s``. True when it is gone."""
        return remove_dir(self.directory, wait_s)


def remove_dir(directory: Path, wait_s: float) -> bool:
    """``rmdir`` a cgroup, retrying for up to ``wait_s`` while the kernel refuses (EBUSY: a member still dying).
    True when it is gone."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            directory.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)


def write(path: Path, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def v2_enable(parent: Path, name: str, controller: str = "pids") -> None:
    """Rule 2 for v2: ``+controller`` in the parent's subtree_control; on EBUSY our processes move to a leaf
    first."""
    control = parent / "cgroup.subtree_control"
    with contextlib.suppress(OSError):
        if controller in control.read_text().split():
            return
    try:
        write(control, f"+{controller}")
        return
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise CgroupError(f"cannot enable {controller} in {control}: {exc.strerror}") from None
    leaf = parent / f"{name}-supervisor"
    try:
        leaf.mkdir(exist_ok=True)
        for pid in (parent / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError, OSError):
                write(leaf / "cgroup.procs", pid)
        write(control, f"+{controller}")
    except OSError as exc:
        raise CgroupError(f"cannot enable {controller} in {control}: {exc.strerror or exc}") from None


def create_pids_cgroup(
    name: str, limit: int, *, self_cgroup: str | None = None, mountinfo: str | None = None
) -> PidsCgroup:
    """Make the workload's cgroup ``name`` under ours with ``pids.max = limit``. Raises CgroupError (rule 3)."""
    if limit < 1:
        raise CgroupError(f"pids limit must be at least 1, not {limit}")
    if "/" in name or name in ("", ".", ".."):
        raise CgroupError(f"bad cgroup name {name!r}")
    try:
        if self_cgroup is None:
            self_cgroup = Path("/proc/self/cgroup").read_text()
        if mountinfo is None:
            mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError as exc:
        raise CgroupError(f"cannot read our cgroup: {exc.strerror}") from None
    where = locate(self_cgroup, mountinfo)
    if where.version == 2:
        try:
            controllers = (where.directory / "cgroup.controllers").read_text().split()
        except OSError as exc:
            raise CgroupError(f"cannot read {where.directory}/cgroup.controllers: {exc.strerror}") from None
        if "pids" not in controllers:
            raise CgroupError(f"pids is not delegated to {where.directory} (cgroup v2)")
    if not os.access(where.directory, os.W_OK):
        raise CgroupError(f"{where.directory} is not writable (cgroup v{where.version})")
    stale = tuple(remove_stale_children(where.directory))
    if where.version == 2:
        v2_enable(where.directory, name)
    child = where.directory / name
    try:
        child.mkdir()
    except OSError as exc:
        raise CgroupError(f"cannot create {child}: {exc.strerror}") from None
    try:
        write(child / "pids.max", str(limit))
        if (child / "pids.max").read_text().strip() != str(limit):
            raise OSError(errno.EIO, "pids.max did not take the value")
    except OSError as exc:
        with contextlib.suppress(OSError):
            child.rmdir()
        raise CgroupError(f"cannot set {child}/pids.max: {exc.strerror or exc}") from None
    return PidsCgroup(where.version, child, limit, stale)
