"""Identity drop for a workload child, and the probes that pick a privilege model
(docs/reference/boundary.md §2.2, §2.9).

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

    An unprivileged process cannot and need not: with ``no_new_privs`` it gains nothing at ``execve``. Its
    ambient set is emptied all the same (that needs no privilege; the init's may be full, ``keep_across_exec``).
    Once the bounding set was seen empty here, or before a fork that made this process, it is not read again:
    nothing can add to it.
    """
    global _BOUNDING_SET_EMPTY
    if _BOUNDING_SET_EMPTY:
        linux.prctl(linux.PR_CAP_AMBIENT, linux.PR_CAP_AMBIENT_CLEAR_ALL)
        return
    if os.geteuid() != 0 and not linux.has_effective_cap(linux.CAP_SETPCAP):
        linux.prctl(linux.PR_CAP_AMBIENT, linux.PR_CAP_AMBIENT_CLEAR_ALL)
        return
    last = linux.cap_last_cap()
    if _bounding_set_empty(last):  # inherited empty (the workload's init clears its own): one read, no drop each
        linux.prctl(linux.PR_CAP_AMBIENT, linux.PR_CAP_AMBIENT_CLEAR_ALL)
        _BOUNDING_SET_EMPTY = True
        return
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
    _BOUNDING_SET_EMPTY = True


_BOUNDING_SET_EMPTY = False  # seen empty here or in an ancestor before it forked (the bounding set only shrinks)


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


def clear_inheritable() -> None:
    """Empty the inheritable set, keeping the effective and permitted ones."""
    effective, permitted, inheritable = linux.capget()
    if inheritable:
        linux.capset(effective, permitted, 0)


def keep_across_exec() -> None:
    """Keep this process's permitted capabilities through its next ``execve`` (the init's fresh interpreter,
    zygote.py "The init's image"): where its uid is not 0 in its user namespace (model U without root) the
    kernel would recompute them as empty. Each becomes inheritable and ambient (capabilities(7)); uid 0 needs
    nothing. Every child's stages empty the ambient set again (``clear_bounding_set``, ``clear_capabilities``)."""
    if os.geteuid() == 0:
        return
    effective, permitted, _inheritable = linux.capget()
    if not permitted:
        return
    linux.capset(effective, permitted, permitted)  # ambient must stay within permitted and inheritable
    for cap in range(linux.cap_last_cap() + 1):
        if permitted >> cap & 1:
            linux.prctl(linux.PR_CAP_AMBIENT, linux.PR_CAP_AMBIENT_RAISE, cap)


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


def root_id_maps(agent_uid: int, agent_gid: int) -> tuple[str, str]:
    """Model U under euid 0: ``(uid_map, gid_map)`` text mapping the agent's ids to themselves, never to 0.

    The launcher's own ids (host 0) are mapped too, to themselves: it is host root already, and a mapped fsuid
    lets it create the agent's root in the namespace's own tmpfs. The agent never runs as them; it runs as its
    own mapped ids, so on the host its files are its uid's and root's files are not its own.
    """
    if agent_uid == 0 or agent_gid == 0:
        raise PermissionError(errno.EPERM, "model U under root never maps the agent to uid or gid 0")
    return f"0 0 1\n{agent_uid} {agent_uid} 1\n", f"0 0 1\n{agent_gid} {agent_gid} 1\n"


def fork_id_map_writer(uid_map: str, gid_map: str) -> tuple[int, int]:
    """Fork, before ``unshare(CLONE_NEWUSER)``, a child that writes our id maps once told to (``(pid, fd)``;
    finish with :func:`finish_id_map_writer`).

    A process may map only its own ids into a namespace it just created (it has no capability in the parent
    namespace any more); mapping others takes a writer with ``CAP_SETUID``/``CAP_SETGID`` in the parent, which
    this child keeps. ``setgroups`` stays allowed so the workload child can drop host supplementary groups.
    """
    rfd, wfd = os.pipe2(os.O_CLOEXEC)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the writer child
        code = 1
        try:
            os.close(wfd)
            if os.read(rfd, 1) == b"x":
                for name, text in (("uid_map", uid_map), ("gid_map", gid_map)):
                    fd = os.open(f"/proc/{parent}/{name}", os.O_WRONLY | os.O_CLOEXEC)
                    try:
                        os.write(fd, text.encode())
                    finally:
                        os.close(fd)
                code = 0
        except OSError as exc:
            code = min(exc.errno or 1, 255)
        finally:
            os._exit(code)
    os.close(rfd)
    return pid, wfd


def finish_id_map_writer(pid: int, fd: int, *, write: bool = True) -> None:
    """Tell the writer to map (after our ``unshare``) or, with ``write=False``, to give up; reap it."""
    try:
        if write:
            os.write(fd, b"x")
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if write and code != 0:
        raise OSError(code if code > 0 else errno.ECHILD, f"writing the user namespace's id maps: "
                      f"{os.strerror(code) if code > 0 else 'killed'}")  # fmt: skip


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
