"""PID 1 of the workload PID namespace (the init): its own interpreter, started by the zygote's first child
after ``unshare(CLONE_NEWPID)``, that forks and reaps on the zygote's behalf (zygote.py rules 2 and 4)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Mapping
from typing import Any, Final, NoReturn

from supervisor.protocol.interpreter import import_path

from . import capabilities, child, exec_init, linux, privilege, rootfs
from .procstate import drain, install_sigchld_wakeup, keep_fds, reset_process
from .spawner import SPARE_IDLE_MS, SPARES, Spawner
from .wire import close_all, receive, send

PROC_FLAGS: Final = linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
UNOWNED_REPORT_S: Final = 1.0
UNOWNED_PIDS: Final = 10  # the first pids of a report; the count is all of them


def _init_request(spawner: Spawner, request: dict[str, Any], fds: list[int]) -> tuple[dict[str, Any], list[int]]:
    """What the init does for the zygote: spawn."""
    op = request.get("op")
    if op == "spawn":
        return spawner.spawn(request, fds)
    close_all(fds)
    return {"id": request.get("id"), "ok": False, "errno": errno.EINVAL, "error": f"init does not serve {op!r}"}, []


# The init's image. Every exec forks the init twice (the spare exec-init, then its command), and a fork's cost
# (copying the page tables, copy-on-write faults as Python writes reference counts, tearing the copy down at
# ``execve`` and exit) grows with the image: a fork of the boundary's (trio, h2, cryptography: ~37 MB anonymous) costs
# 2.7 ms CPU to fork and exit, one of an interpreter that imported only the fork image (~10 MB) 0.6 ms. So the init's
# child ``execve``s a fresh interpreter that imports this module (and the fork image it needs) and nothing of the
# boundary's, and carries no copy of the boundary's memory (its keys included) either; the capture's pyroute2 (~13 MB)
# runs in the zygote for the same reason. ``-I -S``: no environment variable, user site or ``.pth`` file has a say;
# the module path is the boundary's own installation's (supervisor/protocol/interpreter.py rule 2). The init and every
# exec-init forked from it live in the workload's PID namespace, where the agent's `ps` reads their command lines: so
# their argv names no path of the host (the interpreter is ``/proc/self/exe``, which Python resolves to find its
# library) and carries no data. The import path and the init's plan (the agent's root: binds, hidden paths) come on fd
# 5, a sealed memfd read once at start.
_INIT_BOOT: Final = (
    "import json, os, sys; boot = json.load(os.fdopen(5, 'rb')); sys.path[:0] = boot['path']; "
    "from supervisor.boundary.forkimage.init import init_entry; init_entry(boot)"
)
INIT_ARGV0: Final = "/proc/self/exe"


def exec_init_image(  # pragma: no cover - the init before its execve
    sock_fd: int, host_proc_fd: int, mount_proc: bool, root: Mapping[str, Any] | None, narrow: bool = False
) -> NoReturn:
    """In the zygote's first child after ``unshare(CLONE_NEWPID)``: ``execve`` the init's own interpreter
    (``init_entry``) with the zygote's socket on fd 3, the host procfs on 4 and its boot data on 5 (see
    ``_INIT_BOOT``). A failure is the init's ``ready: false``."""
    try:
        linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)  # kept across the execve (not set-id)
        privilege.keep_across_exec()
        boot = os.memfd_create("openshell-init-boot", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        data = json.dumps({"path": import_path(), "mount_proc": mount_proc, "root": root, "narrow": narrow}).encode()
        written = 0
        while written < len(data):
            written += os.write(boot, data[written:])
        os.lseek(boot, 0, os.SEEK_SET)
        fcntl.fcntl(boot, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
                    | fcntl.F_SEAL_WRITE)  # fmt: skip
        keep_fds([sock_fd, host_proc_fd, boot])
        for fd in (3, 4, 5):
            os.set_inheritable(fd, True)
        if not sys.executable:
            raise OSError(errno.ENOEXEC, "this interpreter does not know its own executable")
        os.execv(sys.executable, [INIT_ARGV0, "-I", "-S", "-c", _INIT_BOOT])
    except BaseException as exc:
        with contextlib.suppress(BaseException):
            reason = f"start the init ({sys.executable or '?'}): {exc}"
            send(socket.socket(fileno=3), {"ready": False, "errno": getattr(exc, "errno", None), "error": reason})
    finally:
        os._exit(1)


def init_entry(boot: dict[str, Any]) -> NoReturn:  # pragma: no cover - own pid ns
    """The init's interpreter, right after its ``execve`` (``_INIT_BOOT``), with its boot data from fd 5."""
    try:
        init_main(3, 4, bool(boot["mount_proc"]), boot["root"], bool(boot.get("narrow")))
    finally:
        os._exit(1)


def init_main(  # pragma: no cover - own pid ns
    sock_fd: int, host_proc_fd: int, mount_proc: bool, root: dict[str, Any] | None = None, narrow: bool = False
) -> NoReturn:
    """PID 1 of the workload PID namespace: mount its ``/proc``, build the agent's root (whose ``/proc`` is
    that one), then fork and reap on the zygote's behalf. ``narrow`` (model R): once the root is entered it keeps
    only ``capabilities.INIT_KEEPS``, and each exec-init only ``EXEC_INIT_KEEPS``."""
    try:
        reset_process([sock_fd, host_proc_fd])  # socket on 3, host procfs on 4
        sock = socket.socket(fileno=3)
        linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
        try:
            if mount_proc:
                linux.mount("proc", "/proc", "proc", PROC_FLAGS)
        except OSError as exc:
            send(sock, {"ready": False, "errno": exc.errno, "error": f"mount /proc: {exc.strerror}"})
            os._exit(1)
        try:
            plan = rootfs.RootPlan.from_wire(root) if root is not None else None
        except (KeyError, TypeError, ValueError) as exc:
            send(sock, {"ready": False, "errno": errno.EINVAL, "error": f"agent root: {exc}"})
            os._exit(1)
        # Nothing the init runs gains a capability at execve, and it never execs itself: an empty bounding set
        # costs it nothing and spares each child's stages a drop per capability (each a credential commit).
        with contextlib.suppress(OSError):
            privilege.clear_bounding_set()
        linux.reset_reserved_signals()
        child.RESERVED_SIGNALS_DEFAULT = True
        wake = install_sigchld_wakeup()
        spawner = Spawner(host_proc_fd=4, root=plan)
        if narrow:
            spawner.narrow_to = capabilities.mask(capabilities.INIT_KEEPS)
            exec_init.EXEC_INIT_KEEPS = capabilities.mask(capabilities.EXEC_INIT_KEEPS)
        with contextlib.suppress(OSError):  # exec handles get nested namespaces only when we can come back
            spawner.pidns_fd = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        send(sock, {"ready": True})
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        poller.register(wake, select.POLLIN)
        report_at: float | None = None  # orphans reaped: one aggregated report per second at most
        # A spawn went out through us: fork the next spares once its exit is reported (its process ended: the
        # forks no longer compete with it) or after SPARE_IDLE_MS idle. (A taken lease is replaced at once.)
        spare_due = False

        def lease() -> None:
            """Lease spares until SPARES spare exec-inits live (``replenish`` says when not to)."""
            with contextlib.suppress(OSError):  # none: the next exec forks its exec-init as before
                while (got := spawner.replenish()) is not None:
                    message, fds, state_r = got
                    poller.register(state_r, select.POLLIN)
                    try:
                        send(sock, message, fds)
                    finally:
                        close_all(fds)

        while True:
            timeout = None if report_at is None else max(0, int((report_at - time.monotonic()) * 1000) + 1)
            if spare_due:
                timeout = SPARE_IDLE_MS if timeout is None else min(timeout, SPARE_IDLE_MS)
            ready = poller.poll(timeout)
            if spare_due and not ready:
                spare_due = False
                lease()
            if spawner.unowned and report_at is not None and time.monotonic() >= report_at:
                send(sock, {"unowned": len(spawner.unowned), "pids": spawner.unowned[:UNOWNED_PIDS]})
                spawner.unowned.clear()
                report_at = None
            for fd, _ in ready:
                if fd == wake:
                    drain(wake)
                    for sid, status in spawner.reap():
                        send(sock, {"exit": sid, "status": status})
                    if spawner.spare_killed:
                        spawner.spare_killed = False
                        spare_due = True
                    if spare_due:
                        spare_due = False
                        lease()
                    if spawner.unowned and report_at is None:
                        report_at = time.monotonic() + UNOWNED_REPORT_S
                elif fd in spawner.running_long:
                    ended = spawner.spare_state(fd)
                    if ended is not None:
                        poller.unregister(fd)
                        # Replaced after SPARE_IDLE_MS of quiet or the next exit, not at once (``spare_state``).
                        spare_due = spare_due or ended
                    elif spawner.available() < SPARES:
                        lease()  # an exec runs long: its exec-init no longer counts as a spare coming back
                elif fd == sock.fileno():
                    got = receive(sock)
                    if got is None:
                        os._exit(0)
                    reply, out = _init_request(spawner, *got)
                    try:
                        send(sock, reply, out)
                    finally:
                        close_all(out)
                    if reply.get("ok") and got[0].get("op") == "spawn":
                        spare_due = True
    finally:
        os._exit(1)
