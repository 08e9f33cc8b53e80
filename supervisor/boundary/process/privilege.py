"""Identity drop for a workload child, and the probes that pick a privilege model (docs/spec/boundary.md §2.2, §2.9).

Rules of this module:

1. Supplementary groups are never inherited where they can be set: ``setgroups`` runs first. Only when it
   cannot (no ``CAP_SETGID``, or ``setgroups`` denied in a user namespace, models U and P) and no groups were
   asked for is ``EPERM`` tolerated — the process keeps what it has and cannot widen it.
2. Every ``set*id`` is verified by reading the ids back; the bounding set is cleared while still privileged
   and must read back empty; after the uid change no capability may remain in any set, and ``setuid(0)`` must
   fail.
3. The model probes never touch the calling process: they fork, try, and report through a pipe.
"""

from __future__ import annotations

import errno
import os
from typing import Final

from . import linux

DEFAULT_CHILD_MODE: Final = 0o022


def set_groups(groups: tuple[int, ...]) -> None:
    try:
        os.setgroups(list(groups))
    except PermissionError:
        if groups:
            raise
        return  # rule 1: cannot change them, and nothing was asked for
    if sorted(os.getgroups()) != sorted(set(groups)):
        raise PermissionError(errno.EPERM, "supplementary groups did not take")


def set_gid(gid: int) -> None:
    os.setresgid(gid, gid, gid)
    if os.getresgid() != (gid, gid, gid):
        raise PermissionError(errno.EPERM, "gid did not take")


def clear_bounding_set() -> None:
    """Drop every capability from the bounding and ambient sets when privileged enough to (root or SETPCAP).

    An unprivileged process cannot and need not: with ``no_new_privs`` it gains nothing at ``execve``.
    """
    if os.geteuid() != 0 and not linux.has_effective_cap(linux.CAP_SETPCAP):
        return
    last = linux.cap_last_cap()
    for cap in range(last + 1):
        try:
            linux.prctl(linux.PR_CAPBSET_DROP, cap)
        except OSError as exc:
            if exc.errno == errno.EINVAL:  # beyond this kernel's last capability
                break
            if exc.errno != errno.EPERM or linux.prctl(linux.PR_CAPBSET_READ, cap):
                raise
    linux.prctl(linux.PR_CAP_AMBIENT, linux.PR_CAP_AMBIENT_CLEAR_ALL)
    if not _bounding_set_empty(last):
        raise PermissionError(errno.EPERM, "capability bounding set not empty")


def _bounding_set_empty(last: int) -> bool:
    """One read of ``CapBnd`` (cheaper than a prctl per capability); prctl only if /proc is unreadable."""
    try:
        fd = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
        try:
            text = os.read(fd, 8192)
        finally:
            os.close(fd)
        for line in text.splitlines():
            if line.startswith(b"CapBnd:"):
                return int(line.split()[1], 16) == 0
    except (OSError, ValueError, IndexError):
        pass
    return not any(linux.prctl(linux.PR_CAPBSET_READ, cap) for cap in range(last + 1))


def set_uid(uid: int) -> None:
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid):
        raise PermissionError(errno.EPERM, "uid did not take")


def clear_capabilities() -> None:
    """Empty effective/permitted/inheritable (a same-uid drop in a user namespace keeps them otherwise)."""
    if any(linux.capget()):
        linux.capset_clear()
    if any(linux.capget()):
        raise PermissionError(errno.EPERM, "capabilities remain after the drop")


def verify_cannot_regain_root() -> None:
    try:
        os.setuid(0)
    except OSError:
        return
    raise PermissionError(errno.EPERM, "setuid(0) succeeded after the drop")


# --- privilege model probes ------------------------------------------------------------------------------
def model_r_missing() -> list[str]:
    """What model R lacks here: euid 0 plus effective CAP_SYS_ADMIN and CAP_NET_ADMIN."""
    missing = []
    if os.geteuid() != 0:
        missing.append(f"euid 0 (running as {os.geteuid()})")
    effective = linux.capget()[0]
    for name, cap in (("CAP_SYS_ADMIN", linux.CAP_SYS_ADMIN), ("CAP_NET_ADMIN", linux.CAP_NET_ADMIN)):
        if not effective >> cap & 1:
            missing.append(name)
    return missing


def write_id_maps(uid: int, gid: int) -> None:
    """Map only our own ids into a fresh user namespace (all an unprivileged process may map)."""
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1\n"), ("gid_map", f"{gid} {gid} 1\n")):
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)


USERNS_FLAGS: Final = linux.CLONE_NEWUSER | linux.CLONE_NEWNET | linux.CLONE_NEWNS | linux.CLONE_NEWPID


def probe_userns() -> str | None:
    """``None`` if model U works here: user+net+mount+PID namespaces and a fresh ``/proc``; else the reason.

    Runs in a forked child (and a grandchild for the PID namespace), so call it before threads exist.
    """
    uid, gid = os.geteuid(), os.getegid()
    rfd, wfd = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the probe child
        step = "unshare"
        try:
            os.close(rfd)
            linux.unshare(USERNS_FLAGS)
            step = "id maps"
            write_id_maps(uid, gid)
            step = "mount propagation"
            linux.mount(None, "/", None, linux.MS_REC | linux.MS_SLAVE)
            step = "fork into the PID namespace"
            inner = os.fork()
            if inner == 0:
                try:
                    linux.mount("proc", "/proc", "proc", linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC)
                    os._exit(0)
                except OSError as exc:
                    os._exit(min(exc.errno or 1, 255))
            _, status = os.waitpid(inner, 0)
            if os.waitstatus_to_exitcode(status) != 0:
                code = os.waitstatus_to_exitcode(status)
                os.write(wfd, f"mount proc: {os.strerror(code) if code > 0 else 'killed'}".encode())
                os._exit(1)
            os._exit(0)
        except OSError as exc:
            os.write(wfd, f"{step}: {exc.strerror}".encode())
        finally:
            os._exit(1)
    os.close(wfd)
    try:
        reason = os.read(rfd, 512).decode(errors="replace")
    finally:
        os.close(rfd)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) == 0:
        return None
    return reason or f"probe exited with status {status}"
