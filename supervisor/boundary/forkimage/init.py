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
from typing import Final, NoReturn

from supervisor.protocol.interpreter import import_path
from supervisor.protocol.json_value import JsonValue, is_json_object

from . import capabilities, child, exec_init, linux, privilege, rootfs
from .messages import ErrorReply, Exit, MessageError, Ready, SpawnRequest, Unowned, request_from_wire
from .procstate import drain, install_sigchld_wakeup, keep_fds, reset_process
from .spawner import SPARE_IDLE_MS, SPARES, Spawner
from .wire import close_all, receive, send

PROC_FLAGS: Final = linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
UNOWNED_REPORT_S: Final = 1.0
UNOWNED_PIDS: Final = 10  # the first pids of a report; the count is all of them


def _init_request(
    spawner: Spawner, message: dict[str, JsonValue], fds: list[int]
) -> tuple[dict[str, JsonValue], list[int]]:
    """What the init does for the zygote: spawn."""
    try:
        request = request_from_wire(message)
    except MessageError as exc:
        close_all(fds)
        return ErrorReply(message.get("id"), errno.EINVAL, str(exc)).to_wire(), []
    if isinstance(request, SpawnRequest):
        return spawner.spawn(request, fds)
    close_all(fds)
    return ErrorReply(request.id, errno.EINVAL, f"init does not serve {message.get('op')!r}").to_wire(), []


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
    sock_fd: int, host_proc_fd: int, mount_proc: bool, root: Mapping[str, JsonValue] | None, narrow: bool = False
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
            send(socket.socket(fileno=3), Ready(False, errno=getattr(exc, "errno", None), error=reason).to_wire())
    finally:
        os._exit(1)


def init_entry(boot: dict[str, JsonValue]) -> NoReturn:  # pragma: no cover - own pid ns
    """The init's interpreter, right after its ``execve`` (``_INIT_BOOT``), with its boot data from fd 5."""
    try:
        root = boot["root"]
        init_main(3, 4, bool(boot["mount_proc"]), root if is_json_object(root) else None, bool(boot.get("narrow")))
    finally:
        os._exit(1)


def init_main(  # pragma: no cover - own pid ns
    sock_fd: int, host_proc_fd: int, mount_proc: bool, root: dict[str, JsonValue] | None = None, narrow: bool = False
) -> NoReturn:
    """PID 1 of the workload PID namespace: mount its ``/proc``, build the agent's root (whose ``/proc`` is
    that one), then fork and reap on the zygote's behalf. ``narrow`` (model R): once the root is entered it keeps
    only ``capabilities.INIT_KEEPS``, and each exec-init only ``EXEC_INIT_KEEPS``."""
    try:
        reset_process([sock_fd, host_proc_fd])  # socket on 3, host procfs on 4
        sock = socket.socket(fileno=3)
        linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
        plan = _boot(sock, mount_proc, root)
        _shed()
        wake = install_sigchld_wakeup()
        spawner = _spawner(plan, narrow)
        send(sock, Ready(True).to_wire())
        _InitLoop(sock, wake, spawner).run()
    finally:
        os._exit(1)


def _boot(
    sock: socket.socket, mount_proc: bool, root: Mapping[str, JsonValue] | None
) -> rootfs.RootPlan | None:  # pragma: no cover
    """The namespace's own ``/proc`` and the agent root's plan; a failure is the init's ``ready: false``."""
    try:
        if mount_proc:
            linux.mount("proc", "/proc", "proc", PROC_FLAGS)
    except OSError as exc:
        send(sock, Ready(False, errno=exc.errno, error=f"mount /proc: {exc.strerror}").to_wire())
        os._exit(1)
    try:
        return rootfs.RootPlan.from_wire(root) if root is not None else None
    except (KeyError, TypeError, ValueError) as exc:
        send(sock, Ready(False, errno=errno.EINVAL, error=f"agent root: {exc}").to_wire())
        os._exit(1)


def _shed() -> None:  # pragma: no cover - own pid ns
    """What the init never needs: nothing it runs gains a capability at execve, and it never execs itself, so an
    empty bounding set costs it nothing and spares each child's stages a drop per capability (each a credential
    commit); the reserved signals go back to default once, here, for every child."""
    with contextlib.suppress(OSError):
        privilege.clear_bounding_set()
    linux.reset_reserved_signals()
    child.RESERVED_SIGNALS_DEFAULT = True


def _spawner(plan: rootfs.RootPlan | None, narrow: bool) -> Spawner:  # pragma: no cover - own pid ns
    """The init's forking side: host pids through fd 4, the agent's root to enter, model R's narrowing, and the
    namespace's fd that nested exec namespaces come back to."""
    spawner = Spawner(host_proc_fd=4, root=plan)
    if narrow:
        spawner.narrow_to = capabilities.mask(capabilities.INIT_KEEPS)
        exec_init.EXEC_INIT_KEEPS = capabilities.mask(capabilities.EXEC_INIT_KEEPS)
    with contextlib.suppress(OSError):  # exec handles get nested namespaces only when we can come back
        spawner.pidns_fd = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    return spawner


class _InitLoop:  # pragma: no cover - own pid ns
    """The init's loop: the zygote's requests, SIGCHLD (reap, report exits), spares' state pipes, and the
    aggregated report of orphans nobody launched."""

    def __init__(self, sock: socket.socket, wake: int, spawner: Spawner) -> None:
        self.sock = sock
        self.wake = wake
        self.spawner = spawner
        self.poller = select.poll()
        self.poller.register(sock, select.POLLIN)
        self.poller.register(wake, select.POLLIN)
        self.report_at: float | None = None  # orphans reaped: one aggregated report per second at most
        # A spawn went out through us: fork the next spares once its exit is reported (its process ended: the
        # forks no longer compete with it) or after SPARE_IDLE_MS idle. (A taken lease is replaced at once.)
        self.spare_due = False

    def run(self) -> NoReturn:
        while True:
            ready = self.poller.poll(self._timeout())
            if self.spare_due and not ready:
                self.spare_due = False
                self.lease()
            self._report_unowned()
            for fd, _ in ready:
                if fd == self.wake:
                    self._reap()
                elif fd in self.spawner.running_long:
                    self._spare_state(fd)
                elif fd == self.sock.fileno():
                    self._request()

    def _timeout(self) -> int | None:
        timeout = None if self.report_at is None else max(0, int((self.report_at - time.monotonic()) * 1000) + 1)
        if self.spare_due:
            timeout = SPARE_IDLE_MS if timeout is None else min(timeout, SPARE_IDLE_MS)
        return timeout

    def lease(self) -> None:
        """Lease spares until SPARES spare exec-inits live (``replenish`` says when not to)."""
        with contextlib.suppress(OSError):  # none: the next exec forks its exec-init as before
            while (got := self.spawner.replenish()) is not None:
                message, fds, state_r = got
                self.poller.register(state_r, select.POLLIN)
                try:
                    send(self.sock, message, fds)
                finally:
                    close_all(fds)

    def _report_unowned(self) -> None:
        spawner = self.spawner
        if spawner.unowned and self.report_at is not None and time.monotonic() >= self.report_at:
            send(self.sock, Unowned(len(spawner.unowned), tuple(spawner.unowned[:UNOWNED_PIDS])).to_wire())
            spawner.unowned.clear()
            self.report_at = None

    def _reap(self) -> None:
        drain(self.wake)
        for sid, status in self.spawner.reap():
            send(self.sock, Exit(sid, status).to_wire())
        if self.spawner.spare_killed:
            self.spawner.spare_killed = False
            self.spare_due = True
        if self.spare_due:
            self.spare_due = False
            self.lease()
        if self.spawner.unowned and self.report_at is None:
            self.report_at = time.monotonic() + UNOWNED_REPORT_S

    def _spare_state(self, fd: int) -> None:
        ended = self.spawner.spare_state(fd)
        if ended is not None:
            self.poller.unregister(fd)
            # Replaced after SPARE_IDLE_MS of quiet or the next exit, not at once (``spare_state``).
            self.spare_due = self.spare_due or ended
        elif self.spawner.available() < SPARES:
            self.lease()  # an exec runs long: its exec-init no longer counts as a spare coming back

    def _request(self) -> None:
        got = receive(self.sock)
        if got is None:
            os._exit(0)
        reply, out = _init_request(self.spawner, *got)
        try:
            send(self.sock, reply, out)
        finally:
            close_all(out)
        if reply.get("ok") and got[0].get("op") == "spawn":
            self.spare_due = True
