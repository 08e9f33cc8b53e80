"""A memory limit for the workload: a memory cgroup of its own under the boundary's (docs/reference/boundary.md §2).

Rules:

1. Same members as the pids cgroup (``cgroups.py`` rule 4): the launcher joins before ``prepare``, so the
   workload's init and every workload process are charged; the boundary itself is not, so a memory-cgroup OOM
   can never pick it and it keeps answering.
2. cgroup v1: a child of the boundary's cgroup in the ``memory`` hierarchy with ``memory.limit_in_bytes`` and,
   where swap accounting exists (``memory.memsw.limit_in_bytes``), memory plus swap capped at the same value
   (swapping out is no way around the limit). cgroup v2: the same child as the pids one where ``memory`` is
   delegated (made here if the pids limit made none), with ``memory.max`` and ``memory.swap.max = 0``.
3. Nothing half-applied: a limit that did not take removes the child (in v2 a child the pids limit made stays,
   without a memory limit), and the caller reports the limit as unenforced with the reason.
4. The OOM-kill counter (v1 ``memory.oom_control``'s ``oom_kill``, else ``memory.failcnt``; v2
   ``memory.events``' ``oom_kill``) tells a workload process the kernel killed for memory from one killed
   otherwise: the process table compares it before and after (``table.py``).
5. The workload's ``oom_score_adj`` (:func:`set_oom_score_adj`) is raised to 1000 (no capability needed to
   raise it). Written by a boundary with ``CAP_SYS_RESOURCE`` in the initial user namespace, the kernel also makes
   1000 the process's floor (``oom_score_adj_min``), inherited at fork, so the agent cannot lower it without that
   capability (:func:`privileged_for_oom_score` says whether we have it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from supervisor.boundary.process.cgroups import CgroupError, locate, remove_dir, remove_stale_children, v2_enable, write

__all__ = [
    "DEFAULT_CAP_BYTES",
    "MemoryCgroup",
    "create_memory_cgroup",
    "default_memory_limit",
    "parse_size",
    "privileged_for_oom_score",
    "set_oom_score_adj",
]

DEFAULT_CAP_BYTES: Final = 4 << 30
WORKLOAD_OOM_SCORE_ADJ: Final = 1000  # picked first by any OOM kill
LAUNCHER_OOM_SCORE_ADJ: Final = -1000  # never picked: the one member of the cgroup that is not the workload's
_PAGE: Final = os.sysconf("SC_PAGE_SIZE")
_SIZE = re.compile(r"([0-9]+)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)
_UNITS: Final = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}
_PROC_USER_INIT_INO: Final = 0xEFFFFFFD  # the initial user namespace's inode number (include/linux/proc_ns.h)
_CAP_SYS_RESOURCE: Final = 24


def parse_size(text: str) -> int:
    """Bytes in ``text``: a number with an optional binary suffix (``256M``, ``4g``, ``512MiB``, ``1073741824``).
    Raises ValueError."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a size like 256M, 4G or 1073741824")
    return int(match.group(1)) << _UNITS[match.group(2).lower()]


def default_memory_limit(physical: int | None = None) -> int:
    """Half of physical memory or 4 GiB, whichever is smaller: a runaway agent leaves the machine half of
    itself, and an ordinary agent (an interpreter, a compiler, a test suite) rarely needs more than 4 GiB."""
    if physical is None:
        physical = os.sysconf("SC_PHYS_PAGES") * _PAGE
    return min(physical // 2, DEFAULT_CAP_BYTES)


@dataclass(frozen=True)
class MemoryCgroup:
    version: int
    directory: Path
    limit: int  # bytes, as the kernel took it (a whole number of pages)
    swap: str  # how swap is held: "capped" (memsw or swap.max=0) or why it is not
    stale_removed: tuple[str, ...] = ()
    shares_pids_child: bool = False  # v2: the one child holds both controllers; the pids side removes it

    def describe(self) -> str:
        return f"cgroup v{self.version} {self.directory}"

    def add(self, pid: int) -> None:
        (self.directory / "cgroup.procs").write_text(f"{pid}\n")

    def current(self) -> int | None:
        name = "memory.usage_in_bytes" if self.version == 1 else "memory.current"
        try:
            return int((self.directory / name).read_text().strip())
        except (OSError, ValueError):
            return None

    def oom_kills(self) -> int | None:
        """Rule 4: how many OOM kills the kernel made in this cgroup so far (None: it cannot say)."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            text = (self.directory / name).read_text()
        except OSError:
            return None
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        if self.version == 1:  # before Linux 4.13: how often the limit was hit
            with contextlib.suppress(OSError, ValueError):
                return int((self.directory / "memory.failcnt").read_text().strip())
        return None

    def remove(self, wait_s: float = 0.0) -> bool:
        """As ``PidsCgroup.remove``; a v2 child shared with the pids limit is left to that one."""
        if self.shares_pids_child:
            return True
        return remove_dir(self.directory, wait_s)


def _set(path: Path, value: str) -> None:
    write(path, value)
    if path.read_text().strip() != value:
        raise OSError(errno.EIO, f"{path.name} did not take the value")


def create_memory_cgroup(
    name: str, limit: int, *, self_cgroup: str | None = None, mountinfo: str | None = None
) -> MemoryCgroup:
    """Make (v1) or reuse (v2: the pids child ``name``, made first) the workload's memory cgroup with ``limit``
    bytes. Raises CgroupError (rule 3)."""
    limit -= limit % _PAGE
    if limit < _PAGE:
        raise CgroupError(f"memory limit must be at least one page ({_PAGE} bytes)")
    if "/" in name or name in ("", ".", ".."):
        raise CgroupError(f"bad cgroup name {name!r}")
    try:
        if self_cgroup is None:
            self_cgroup = Path("/proc/self/cgroup").read_text()
        if mountinfo is None:
            mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError as exc:
        raise CgroupError(f"cannot read our cgroup: {exc.strerror}") from None
    where = locate(self_cgroup, mountinfo, "memory")
    parent = where.directory
    if where.version == 2:
        try:
            controllers = (parent / "cgroup.controllers").read_text().split()
        except OSError as exc:
            raise CgroupError(f"cannot read {parent}/cgroup.controllers: {exc.strerror}") from None
        if "memory" not in controllers:
            raise CgroupError(f"memory is not delegated to {parent} (cgroup v2)")
    if not os.access(parent, os.W_OK):
        raise CgroupError(f"{parent} is not writable (cgroup v{where.version})")
    child = parent / name
    if where.version == 1:
        stale = tuple(remove_stale_children(parent))
        try:
            child.mkdir()
        except OSError as exc:
            raise CgroupError(f"cannot create {child}: {exc.strerror}") from None
        try:
            _set(child / "memory.limit_in_bytes", str(limit))
            if (parent / "memory.memsw.limit_in_bytes").exists():
                _set(child / "memory.memsw.limit_in_bytes", str(limit))
                swap = "capped"
            else:
                swap = "uncapped: no swap accounting (memory.memsw) in this kernel"
        except OSError as exc:
            with contextlib.suppress(OSError):
                child.rmdir()
            raise CgroupError(f"cannot set the memory limit in {child}: {exc.strerror or exc}") from None
        return MemoryCgroup(1, child, limit, swap, stale)
    shared = child.is_dir()  # the pids limit made it: one cgroup holds both (v2 has one hierarchy)
    stale = () if shared else tuple(remove_stale_children(parent))
    v2_enable(parent, name, "memory")
    if not shared:
        try:
            child.mkdir()
        except OSError as exc:
            raise CgroupError(f"cannot create {child}: {exc.strerror}") from None
    try:
        _set(child / "memory.max", str(limit))
        swap = "uncapped: no memory.swap.max"
        if (parent / "memory.swap.max").exists():
            _set(child / "memory.swap.max", "0")
            swap = "capped"
    except OSError as exc:
        with contextlib.suppress(OSError):
            write(child / "memory.max", "max")
            if not shared:
                child.rmdir()
        raise CgroupError(f"cannot set the memory limit in {child}: {exc.strerror or exc}") from None
    return MemoryCgroup(2, child, limit, swap, stale, shares_pids_child=shared)


def privileged_for_oom_score() -> str | None:
    """Rule 5: None when we may give the workload an ``oom_score_adj`` floor it cannot lower, else why not."""
    try:
        if os.stat("/proc/self/ns/user").st_ino != _PROC_USER_INIT_INO:
            return "the boundary runs in a user namespace (no CAP_SYS_RESOURCE over the host's kernel)"
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                if int(line.split()[1], 16) >> _CAP_SYS_RESOURCE & 1:
                    return None
                break
    except (OSError, ValueError) as exc:
        return f"cannot read our capabilities: {exc}"
    return "the boundary lacks CAP_SYS_RESOURCE"


def set_oom_score_adj(pid: int, value: int, *, proc: Path = Path("/proc")) -> None:
    """Write ``value`` to ``pid``'s ``oom_score_adj`` and read it back. Raises OSError."""
    _set(proc / str(pid) / "oom_score_adj", str(value))
