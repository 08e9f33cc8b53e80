"""What each of model R's boundary processes keeps of its capabilities once the sandbox is up
(docs/kubernetes.md "Model R: capabilities after start").

The pod gives the boundary nine capabilities; building the agent's namespaces, fence and root needs them all, but
little of that is done again later. Each process narrows itself, at its own point, to what it still uses:

- the **boundary** (the container's PID 1), once ``confirm`` passed and the fence watch is subscribed:
  ``BOUNDARY_KEEPS``;
- the **launcher** (zygote), once ``prepare`` made the namespaces and forked the workload's init:
  ``LAUNCHER_KEEPS``;
- the workload's **init**, once it entered the agent's root (its first spawn): ``INIT_KEEPS``;
- every **exec-init** (an exec's own PID namespace, spare or not), as it becomes one: ``EXEC_INIT_KEEPS``.

Rules of this module:

1. Each set is its capability's use, named; anything the process holds beyond it goes from the permitted,
   effective, inheritable, ambient and bounding sets, so no later ``execve`` brings it back. A capability that
   was never held is not gained (the kept set is intersected with what is held).
2. The bounding set is cut first (that needs ``CAP_SETPCAP``, which is then dropped with the rest), and every set
   is read back; anything left over is an error, and the caller fails closed.
3. Only ``prctl`` and ``capget`` are read: the launcher's ``/proc`` is the workload's once its init mounted it.
4. Capabilities are per thread. ``restrict`` narrows the calling thread; a thread created after it inherits the
   narrowed sets. ``threads_beyond`` says which other threads of the process still hold more.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from typing import Final

from . import linux

# Numbers from linux/capability.h.
CAPABILITY_NUMBERS: Final[Mapping[str, int]] = {
    "CHOWN": 0, "DAC_OVERRIDE": 1, "DAC_READ_SEARCH": 2, "FOWNER": 3, "FSETID": 4, "KILL": 5, "SETGID": 6,
    "SETUID": 7, "SETPCAP": 8, "LINUX_IMMUTABLE": 9, "NET_BIND_SERVICE": 10, "NET_BROADCAST": 11,
    "NET_ADMIN": 12, "NET_RAW": 13, "IPC_LOCK": 14, "IPC_OWNER": 15, "SYS_MODULE": 16, "SYS_RAWIO": 17,
    "SYS_CHROOT": 18, "SYS_PTRACE": 19, "SYS_PACCT": 20, "SYS_ADMIN": 21, "SYS_BOOT": 22, "SYS_NICE": 23,
    "SYS_RESOURCE": 24, "SYS_TIME": 25, "SYS_TTY_CONFIG": 26, "MKNOD": 27, "LEASE": 28, "AUDIT_WRITE": 29,
    "AUDIT_CONTROL": 30, "SETFCAP": 31, "MAC_OVERRIDE": 32, "MAC_ADMIN": 33, "SYSLOG": 34, "WAKE_ALARM": 35,
    "BLOCK_SUSPEND": 36, "AUDIT_READ": 37, "PERFMON": 38, "BPF": 39, "CHECKPOINT_RESTORE": 40,
}  # fmt: skip

# What each process keeps, and the operation that needs it (docs/kubernetes.md repeats this table).
BOUNDARY_KEEPS: Final[Mapping[str, str]] = {
    "KILL": "signal and terminate: the agent's processes run as another uid",
    "SYS_PTRACE": "binary identity: pidfd_getfd of a connecting socket, /proc/PID/exe and /proc/PID/mem of the "
    "agent's non-dumpable processes",
    "DAC_READ_SEARCH": "binary identity: hashing an executable the agent made unreadable to others",
}
LAUNCHER_KEEPS: Final[Mapping[str, str]] = {
    "NET_ADMIN": "the fence watch's re-read: `nft list ruleset` in the agent's network namespace",
}
INIT_KEEPS: Final[Mapping[str, str]] = {
    "SYS_ADMIN": "exec: each exec's own PID namespace (unshare(CLONE_NEWPID), then setns back to its own)",
    "SETUID": "exec and the agent: a child's setresuid to the agent's uid (passed on to every exec-init)",
    "SETGID": "exec and the agent: a child's setgroups and setresgid (passed on to every exec-init)",
    "KILL": "passed on to every exec-init",
}
EXEC_INIT_KEEPS: Final[Mapping[str, str]] = {
    "SETUID": "its command's setresuid to the agent's uid, and back",
    "SETGID": "its command's setgroups and setresgid, and back",
    "KILL": "signal: forwarding a signal to its command; ending what the command left in its namespace",
}

# Kept by the boundary only where it holds it and needs it: dev mode as root, never the rendered pod (which has none).
BOUNDARY_CLEANUP_KEEPS: Final[Mapping[str, str]] = {
    "DAC_OVERRIDE": "exit: removing the workload's cgroups, where their parent is not writable by its owner",
}

PR_CAP_AMBIENT_IS_SET: Final = 1


class CapabilityError(PermissionError):
    """A process could not narrow itself to its kept set (rule 2)."""


def mask(names: Mapping[str, str] | tuple[str, ...]) -> int:
    return sum(1 << CAPABILITY_NUMBERS[name] for name in names)


def names(bits: int) -> list[str]:
    by_number = {number: name for name, number in CAPABILITY_NUMBERS.items()}
    return [by_number.get(cap, str(cap)) for cap in range(64) if bits >> cap & 1]


def bounding() -> int:
    """This thread's bounding set (``PR_CAPBSET_READ``; rule 3)."""
    found = 0
    for cap in range(linux.cap_last_cap() + 1):
        try:
            if linux.prctl(linux.PR_CAPBSET_READ, cap):
                found |= 1 << cap
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                break
            raise
    return found


def ambient() -> int:
    found = 0
    for cap in range(linux.cap_last_cap() + 1):
        try:
            if linux.prctl(linux.PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, cap):
                found |= 1 << cap
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                break
            raise
    return found


def restrict(keep: int) -> tuple[int, int]:
    """Narrow the calling thread to ``keep`` (rules 1, 2); ``(kept, dropped)`` masks of the permitted set."""
    permitted = linux.capget()[1]
    kept = keep & permitted
    for cap in range(linux.cap_last_cap() + 1):
        if kept >> cap & 1:
            continue
        try:
            if linux.prctl(linux.PR_CAPBSET_READ, cap):
                linux.prctl(linux.PR_CAPBSET_DROP, cap)
        except OSError as exc:
            if exc.errno == errno.EINVAL:  # beyond this kernel's last capability
                break
            raise CapabilityError(exc.errno, f"bounding set: cannot drop {names(1 << cap)[0]}") from None
    linux.prctl(linux.PR_CAP_AMBIENT, linux.PR_CAP_AMBIENT_CLEAR_ALL)
    linux.capset(kept, kept, 0)
    now = linux.capget()
    extra = bounding() & ~kept
    if now != (kept, kept, 0) or extra or ambient():
        raise CapabilityError(
            errno.EPERM, f"capabilities remain beyond {names(kept)}: {names((now[1] | now[0] | extra) & ~kept)}"
        )
    return kept, permitted & ~kept


def threads_beyond(keep: int, proc: str = "/proc/self") -> list[int]:
    """Thread ids of this process whose effective, permitted or bounding set holds more than ``keep`` (rule 4)."""
    found: list[int] = []
    try:
        tids = os.listdir(f"{proc}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"{proc}/task/{tid}/status", "rb") as fh:
                text = fh.read()
        except OSError:
            continue  # ended meanwhile
        sets = {}
        for line in text.splitlines():
            key, _, value = line.partition(b":")
            if key in (b"CapEff", b"CapPrm", b"CapBnd", b"CapAmb"):
                sets[key] = int(value.strip(), 16)
        if any(bits & ~keep for bits in sets.values()):
            found.append(int(tid))
    return found


def owner_writes(directory: str) -> bool:
    """Whether uid 0 may remove an entry of ``directory`` without ``CAP_DAC_OVERRIDE``: it owns it, with write and
    search permission for its owner."""
    try:
        st = os.stat(directory)
    except OSError:
        return True  # gone: nothing to remove there
    return st.st_uid == os.geteuid() and st.st_mode & 0o300 == 0o300
