"""The forking side: the zygote without a PID namespace, or the init with one (zygote.py rules 2 and 3).
It forks workload children and spare exec-inits, owns their pidfds until handed up, and reaps."""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import socket
from typing import Final

from supervisor.protocol.json_value import JsonValue

from . import capabilities, child, linux, rootfs, seccomp
from .exec_init import exec_init, spare_main
from .messages import ErrorReply, MessageError, Ready, SpareLease, SpawnReply, SpawnRequest
from .spawn_fds import notify_fd, stdio_fds
from .wire import close_all, receive, socket_pair

SPARE_IDLE_MS: Final = 5  # the init forks the next spare exec-init after an exit report or this long idle
SPARE_READY_S: Final = 2.0  # a spare exec-init that has not confined itself by then is let go
SPARES: Final = 2  # leases out at once: one exec takes one while the next is made, back-to-back execs find one


# --- the forking side (zygote without PID namespace, or the init) -----------------------------------------
class Spawner:
    """Forks workload children, owns their pidfds until handed up, and reaps (rule 2, rule 3)."""

    def __init__(
        self, host_proc_fd: int | None, mount_ns: int | None = None, root: rootfs.RootPlan | None = None
    ) -> None:
        with contextlib.suppress(OSError):
            seccomp.warm()  # built once here, inherited by every child
        self.host_proc_fd = host_proc_fd  # set in the init: read host pids through the boundary's procfs
        self.mount_ns = mount_ns  # a mount namespace fd every child enters (setns) first; None: inherit ours
        self.root = root  # the agent's own root, entered before the first child (rootfs rule 5)
        self.root_error: OSError | None = None  # entering failed: never fork a child in a half-built view
        # Model R's init: the capabilities it keeps once the agent's root is entered (capabilities.INIT_KEEPS).
        self.narrow_to: int | None = None
        self.live: dict[int, int] = {}  # local pid -> sid
        # The PID namespace we are init of (its fd), so an exec can get a nested one and we get ours back.
        self.pidns_fd: int | None = None
        self.exit_reports: dict[int, int] = {}  # exec-init pid -> read end of its command's status report
        self.unowned: list[int] = []  # reaped orphans nobody launched, not yet reported
        # Spares (zygote.py's docstring): the confinement of the last spawn (the next spare is prepared for it), the
        # one whose own stages failed (not tried again), and the exec-inits leased to the boundary (reaped
        # without a report: the boundary reads their report sockets); their state pipes are below.
        self.confinement: child.Confinement | None = None
        self.failed_confinement: child.Confinement | None = None
        self.leased: set[int] = set()
        # Each live spare exec-init's "state" pipe, read end -> whether its exec runs long (a byte "t" from it once
        # its exec has run SPARE_BUSY_S, "b" when it is a spare again): nothing is written for a short exec, so
        # the init is not woken per exec. The same pipes: the confinement each was made for, and its pid.
        self.running_long: dict[int, bool] = {}
        self.made_for: dict[int, child.Confinement] = {}
        self.spare_pid: dict[int, int] = {}
        self.spares_killed: set[int] = set()  # reaped, killed (in an exec: terminate), their pipes not yet at EOF
        self.spare_killed = False  # one was killed since the caller last looked: replace it at once
        self._spare_ctx: tuple[child.Confinement, child.ChildContext] | None = None  # what a spare starts from

    def _enter_root(self) -> None:
        if self.root_error is not None:
            raise self.root_error
        if self.root is not None:
            plan, self.root = self.root, None
            try:
                rootfs.enter(plan)
            except OSError as exc:
                self.root_error = OSError(exc.errno or errno.EIO, f"agent root: {exc.strerror or exc}")
                raise self.root_error from None
        if self.narrow_to is not None:  # the root was the last thing built with them (capabilities.py)
            keep, self.narrow_to = self.narrow_to, None
            try:
                capabilities.restrict(keep)
            except OSError as exc:
                self.root_error = OSError(exc.errno or errno.EPERM, f"capabilities: {exc.strerror or exc}")
                raise self.root_error from None

    def spawn(self, req: SpawnRequest, fds: list[int]) -> tuple[dict[str, JsonValue], list[int]]:
        rid = req.id
        out: list[int] = []
        try:
            self._enter_root()
        except OSError as exc:
            close_all(fds)
            return ErrorReply.of(rid, exc, stage=child.Stage.MOUNT_NS.value).to_wire(), []
        try:
            spec = child.SpawnSpec.from_wire(req.spec)
            stdio, status_fd, master = stdio_fds(req, fds, spec)
            out = [] if master is None else [master]  # the PTY's master goes up with the reply (terminal.py)
            notify = notify_fd(req, fds)
            self.confinement = child.confinement(spec, notify is not None)
            parent = os.getpid()
            nested = req.own_pidns and self.pidns_fd is not None
            report_r = report_w = -1
            if nested:  # its own PID namespace: the first child after this unshare is its init (exec_init)
                report_r, report_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
                linux.unshare(linux.CLONE_NEWPID)
            try:
                pid = os.fork()
            except BaseException:
                if nested:
                    self._own_pidns_again()
                    close_all([report_r, report_w])
                raise
            if pid and nested:
                self._own_pidns_again()
            if pid == 0:  # pragma: no cover - the child never returns
                ctx = child.ChildContext(spec, stdio, status_fd, parent, mount_ns=self.mount_ns, notify_fd=notify)
                if nested:
                    exec_init(ctx, report_r, report_w)
                child.run(ctx)
            if nested:
                os.close(report_w)
                self.exit_reports[pid] = report_r
            self.live[pid] = int(req.sid or 0)
            pidfd = os.pidfd_open(pid)
            host_pid = pid if self.host_proc_fd is None else linux.pidfd_pid(pidfd, dir_fd=self.host_proc_fd)
            reply = SpawnReply(int(req.id or 0), host_pid, pid, nested, bool(out))
            return reply.to_wire(), [pidfd, *out]
        except Exception as exc:
            close_all(out)
            return ErrorReply.of(rid, exc, stage=child.Stage.FORK.value).to_wire(), []
        finally:
            close_all(fds)

    def replenish(self) -> tuple[dict[str, JsonValue], list[int], int] | None:
        """Fork the next spare and lease it (zygote.py's docstring): the lease message and its fds, which the caller
        sends to the zygote and closes, and the read end of its state pipe (which the caller watches,
        ``spare_state``); ``None`` if there is to be no spare now.

        Only where nested namespaces are made (the init, ``pidns_fd``), after the agent's root was entered (the
        spare's mount view is the workload's), after a spawn told us the confinement, and while fewer than
        SPARES spare exec-inits are ``available`` (each comes back as a spare after its exec: ``exec_init``;
        one whose exec runs longer than SPARE_BUSY_S is replaced); any failure leaves no spare and the next exec
        forks as before."""
        if self.available() >= SPARES or self.pidns_fd is None or self.mount_ns is not None:
            return None
        if self.root is not None or self.root_error is not None:
            return None
        confinement = self.confinement
        if confinement is None or confinement == self.failed_confinement:
            return None
        ours, theirs = socket_pair()
        report, report_theirs = socket_pair()  # the exec-init's statuses and its next leases, to the boundary
        report_r, report_w = report.detach(), report_theirs.detach()
        state_r, state_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)  # the exec-init's, to us
        its = [report_w, state_w]  # the spare's alone once it is forked
        pid: int | None = None
        out: list[int] = []
        # Made here once, not in each spare: what a spare starts from (its fork inherits it built).
        if self._spare_ctx is None or self._spare_ctx[0] != confinement:
            spec, notify = child.confinement_spec(confinement), confinement.notify
            self._spare_ctx = confinement, child.ChildContext(spec, (-1, -1, -1), -1, 0, keep_listener=notify)
        spare_ctx = self._spare_ctx[1]
        try:
            linux.unshare(linux.CLONE_NEWPID)
            try:
                pid = os.fork()
            finally:
                with contextlib.suppress(OSError):  # the child's namespace is made; ours is ours again
                    self._own_pidns_again()
            if pid == 0:  # pragma: no cover - PID 1 of its own namespace
                spare_main(theirs.fileno(), report_w, state_w, confinement, spare_ctx)
            self.leased.add(pid)  # from now on reaped without a report, whatever happens to it
            close_all([theirs.detach(), *its])
            its = []
            ready = _await_ready(ours)
            if not ready[0].ready or len(ready[1]) != int(confinement.notify):
                close_all(ready[1])
                self.failed_confinement = confinement
                raise OSError(ready[0].errno or errno.EIO, f"spare: {ready[0].detail}")
            pidfd = os.pidfd_open(pid)  # our unreaped child (rule 3)
            out = [ours.detach(), pidfd, report_r, *ready[1]]
            host_pid = pid if self.host_proc_fd is None else linux.pidfd_pid(pidfd, dir_fd=self.host_proc_fd)
        except BaseException:
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)  # its namespace goes with it; ``reap`` takes it quietly
            ours.close()
            close_all([*out, *its, report_r, state_r])
            raise
        finally:
            theirs.close()
        self.running_long[state_r] = False
        self.made_for[state_r] = confinement
        self.spare_pid[state_r] = pid
        return SpareLease(host_pid, pid, confinement.to_wire(), ready[0].notes).to_wire(), out, state_r

    def available(self) -> int:
        """Spare exec-inits that wait, or whose exec began less than SPARE_BUSY_S ago (it comes back soon)."""
        return sum(
            1
            for state_r, long in self.running_long.items()
            if not long and self.spare_pid.get(state_r) not in self.spares_killed
        )

    def spare_state(self, state_r: int) -> bool | None:
        """One event on a spare's state pipe. ``None`` while the spare lives; once it is gone (EOF: it ended),
        whether to replace it: yes if its exec ran long, or it was made for a confinement a spawn has changed
        since (the boundary let it go for that spawn, which may have been served before this was read). One
        killed in a short exec is replaced once reaped (``reap``: ``spare_killed``); one let go otherwise is
        replaced after the next spawn."""
        try:
            event = os.read(state_r, 1)
        except BlockingIOError:
            return None
        except OSError:
            event = b""
        if not event:
            os.close(state_r)
            made_for = self.made_for.pop(state_r, None)
            self.spares_killed.discard(self.spare_pid.pop(state_r, -1))
            return self.running_long.pop(state_r, False) or made_for != self.confinement
        if event in (b"t", b"b"):
            self.running_long[state_r] = event == b"t"
        return None

    def _own_pidns_again(self) -> None:
        """After an exec's nested namespace was made: our next children are in our own namespace again."""
        assert self.pidns_fd is not None
        linux.setns(self.pidns_fd, linux.CLONE_NEWPID)

    def reap(self) -> list[tuple[int, int]]:
        """Reap every exited child; return ``(sid, raw_status)`` for launched ones."""
        exits: list[tuple[int, int]] = []
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid in self.leased:  # the boundary has its report socket: nothing to say here
                self.leased.discard(pid)
                if os.WIFSIGNALED(status):  # killed (a terminate, mid-exec): not coming back, replace it now
                    self.spare_killed = True
                    if pid in self.spare_pid.values():
                        self.spares_killed.add(pid)
                continue
            sid = self.live.pop(pid, None)
            report = self.exit_reports.pop(pid, None)
            if report is not None:
                status = _reported_status(report, status)
            if sid is not None:
                exits.append((sid, status))
            else:
                self.unowned.append(pid)
        return exits


def _await_ready(sock: socket.socket) -> tuple[Ready, list[int]]:
    """A spare exec-init's message once it confined itself: ``{"ready": true, "notes"}`` with the connect-notify
    listener if it has one, or ``{"ready": false, "stage", "errno", "detail"}``; a timeout is an error."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    if not poller.poll(int(SPARE_READY_S * 1000)):
        raise OSError(errno.ETIMEDOUT, "spare child not ready")
    got = receive(sock)
    if got is None:
        raise OSError(errno.ECHILD, "spare child exited before it was ready")
    if len(got[1]) > 1:
        close_all(got[1])
        raise OSError(errno.EPROTO, "spare child sent more than its listener")
    try:
        return Ready.from_wire(got[0]), got[1]
    except MessageError as exc:
        close_all(got[1])
        raise OSError(errno.EPROTO, f"spare child: {exc}") from None


def _reported_status(fd: int, own: int) -> int:
    """An exec-init's exit: its command's raw status if it reported one (it exits 0 after), else its own
    (SIGKILL: the namespace was killed, the command with it)."""
    try:
        data = os.read(fd, 32)
    except OSError:
        data = b""
    finally:
        os.close(fd)
    try:
        return int(data) if data else own
    except ValueError:
        return own
