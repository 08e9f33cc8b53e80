"""The launcher ("zygote") process and the PID-namespace init it may fork (docs/reference/boundary.md §2.2, §2.6, §2.7).

Size (over ~500 lines on purpose): the launcher's whole protocol runs in one single-threaded process image forked
before trio; its operations, the init and the exec-init share the fd and reaping rules below, so they stay together
(the child's side is child.py, mounts rootfs.py, ids privilege.py).

Rules of this module:

1. Single-threaded, always: the zygote and the init are forked before any thread exists and never start one,
   so ``fork`` is safe and ``unshare``/``setns`` work. No ``subprocess``, no ``preexec_fn``.
2. Whoever forks reaps. Without a PID namespace the zygote forks the workload, is a child subreaper (orphans
   come back to it) and reaps; with one, the init (PID 1 of the namespace) forks and reaps everything in it.
   Exit statuses of launched processes go up as ``{"exit": sid, "status": raw}``; other pids are discarded.
3. A pidfd is opened by the forking process right after ``fork``: the child cannot have been reaped yet
   because that process is its only reaper. The host pid is read there too, through the host procfs.
4. Killing the init kills the namespace (the kernel SIGKILLs and reaps every member before the init's own
   exit is reported). Launched processes whose exit the init had not reported are then reported as SIGKILL.
5. The zygote answers requests one at a time, in order; nothing it receives is trusted beyond its JSON shape.

Wire: ``SOCK_SEQPACKET``, one JSON object per message, fds as ``SCM_RIGHTS``. Requests carry ``op`` and ``id``;
replies carry the same ``id`` and ``ok``; exits are unsolicited.

Theory of operation. ``Launcher.fork`` calls ``main`` in a fresh child of the boundary. ``prepare`` unshares
the namespaces the plan asks for (model U creates the user namespace in the same call and maps only its own
uid/gid; under euid 0 a writer forked before the ``unshare`` maps the agent's ids to themselves instead, see
``privilege.root_id_maps``), makes ``/`` a recursive slave so nothing mounted here leaks out, then forks the
init before anything else can fork (the first child after ``unshare(CLONE_NEWPID)`` *is* the namespace's PID 1);
the init mounts a fresh ``/proc``. When the plan has a ``root``, whichever process forks the workload enters
the agent's own root right before its first child (``rootfs.enter``: a mount namespace of its own, so the
zygote of a PID namespace keeps the host's view); a plan without one covers each hidden directory with an
empty read-only tmpfs in the zygote's namespace instead. Then ``lo`` comes up,
or the capture setup runs. ``spawn`` goes to whichever process forks (rule 2), which forks a child that runs
``child.run``. The capture setup and calls run in the zygote (in the agent's network namespace, and keeping
pyroute2 out of the init's image); the launcher hands that code to the zygote (``capture.calls``), so this
module's imports — the init's image — hold no ``threading`` and its at-fork handler. Once the init has
mounted the namespace's ``/proc``, ``/proc/self`` names nothing for the zygote (it is outside that PID
namespace): the one read of it, a probe's TCP tables, goes through ``/proc/1`` (the init, in the same network
namespace).

An exec gets a PID namespace of its own (``exec_init``). Spares keep the ``unshare``, the forks and the stages
that need no command off its path, and the zygote and the init off it altogether (``Spawner.replenish``,
``spare_main``, ``_serve``): the init forks a spare exec-init, already PID 1 of a fresh namespace, which applies to
itself, once, what all its commands share (``child.SELF``: umask, capability sets, core limit, ``no_new_privs``,
Landlock, the connect-notify filter and the deny list) for the confinement of the last spawn, and then waits on a
socket for its command with the init's credentials. Once it is ready the init *leases* it to the boundary:
``{"spare": host_pid, "ns_pid", "confinement", "notes"}`` with the command socket, a pidfd of the exec-init, the
boundary's end of its report socket and, under the connect-notify filter, the filter's listener; the init keeps
none of them. The boundary sends the next nested spawn whose confinement matches straight to that socket (the
exec-init checks the match again), and reads the command's status from the report socket itself. The exec-init
starts the command with ``posix_spawn`` (``spawn.py``: no fork of Python, no copied pages), or, with a terminal,
in a forked child that runs the rest of the stages (``child.IN_CHILD``). Once the command ended and its namespace
is empty, it reports and leases itself again over the report socket, with a new command socket and without a
listener (the boundary serves the one the first lease brought for as long as the exec-init lives): no fork of the
init, of an exec-init or of a waiting child per exec. The init keeps SPARES spare exec-inits *available*:
waiting, or whose exec began less than SPARE_BUSY_S ago (a state pipe carries "t" from the exec-init once its exec
has run that long, "b" when it is back: nothing for a short exec, so the init is not woken per exec), and makes
another when fewer are, or at once when one is killed in its exec; it reaps them without a report. One let go (EOF
on its command socket) ends, and is replaced after the next spawn, or at once if a spawn changed the confinement
since it was made. While a spare is leased and unused (or coming back) the boundary leaves it out of the
workload's processes.
"""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import functools
import gc
import json
import os
import select
import signal
import socket
import stat
import struct
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, NoReturn, Protocol

from supervisor.protocol.exit_codes import ExitCode
from supervisor.protocol.interpreter import import_path
from supervisor.protocol.privilege_model import PrivilegeModel

from . import capabilities, child, linux, privilege, rootfs, seccomp, spawn, terminal

MAX_MESSAGE: Final = 1 << 20
MAX_SPEC: Final = 256 * 1024  # argv + env + the rest, encoded; below any default socket send buffer
MAX_FDS: Final = 32
SOCKET_BUFFER: Final = 1 << 20
HIDE_OPTIONS: Final = "mode=0555,size=4k"
HIDE_FLAGS: Final = linux.MS_RDONLY | linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
PROC_FLAGS: Final = linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
SIGKILL_STATUS: Final = signal.SIGKILL  # raw wait status of a process killed by SIGKILL
KILL_ALL_TIMEOUT: Final = 10.0
UNOWNED_REPORT_S: Final = 1.0
UNOWNED_PIDS: Final = 10  # the first pids of a report; the count is all of them
SPARE_IDLE_MS: Final = 5  # the init forks the next spare exec-init after an exit report or this long idle
SPARE_BUSY_S: Final = 0.5  # a spare's exec running longer than this no longer counts: the init makes another
SPARE_READY_S: Final = 2.0  # a spare exec-init that has not confined itself by then is let go
SPARES: Final = 2  # leases out at once: one exec takes one while the next is made, back-to-back execs find one
_INT_SIZE: Final = array.array("i").itemsize
_SIOCGIFFLAGS: Final = 0x8913
_SIOCSIFFLAGS: Final = 0x8914
_IFF_UP: Final = 0x1


@dataclass(frozen=True)
class NamespacePlan:
    model: PrivilegeModel
    netns: bool = True
    pidns: bool = True
    mountns: bool = True
    hide_paths: tuple[str, ...] = ()
    capture: dict[str, Any] | None = None
    root: dict[str, Any] | None = None  # rootfs.RootPlan.to_wire(): the agent's own root (needs mountns)
    agent_ids: tuple[int, int] | None = None  # model U under euid 0: the ids the user namespace maps the agent to

    def to_wire(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "netns": self.netns,
            "pidns": self.pidns,
            "mountns": self.mountns,
            "hide_paths": list(self.hide_paths),
            "capture": self.capture,
            "root": self.root,
            "agent_ids": list(self.agent_ids) if self.agent_ids is not None else None,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> NamespacePlan:
        return cls(
            model=PrivilegeModel(data["model"]),
            netns=bool(data["netns"]),
            pidns=bool(data["pidns"]),
            mountns=bool(data["mountns"]),
            hide_paths=tuple(data["hide_paths"]),
            capture=data["capture"],
            root=data.get("root"),
            agent_ids=_id_pair(data["agent_ids"]) if data.get("agent_ids") else None,
        )

    def effective(self) -> NamespacePlan:
        """Model P creates no namespace whatever the flags say."""
        if self.model == PrivilegeModel.P:
            return NamespacePlan(PrivilegeModel.P, False, False, False, self.hide_paths, self.capture, None)
        return self


def _id_pair(value: Any) -> tuple[int, int]:
    """``[uid, gid]``; anything else is a ``ValueError`` (the request is answered with an error)."""
    if not isinstance(value, list) or len(value) != 2 or not all(type(i) is int for i in value):
        raise ValueError("agent_ids must be [uid, gid]")
    return value[0], value[1]


# --- wire ------------------------------------------------------------------------------------------------
def encode(message: Mapping[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def send(sock: socket.socket, message: Mapping[str, Any], fds: Iterable[int] = ()) -> None:
    data = encode(message)
    if len(data) > MAX_MESSAGE:  # the peer's receive buffer would truncate it
        raise OSError(errno.EMSGSIZE, f"launcher message of {len(data)} bytes exceeds {MAX_MESSAGE}")
    socket.send_fds(sock, [data], list(fds))


def decode(data: bytes, fds: list[int], flags: int) -> tuple[dict[str, Any], list[int]]:
    """Parse one received message; on a truncated or malformed one close its fds and raise."""
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        close_all(fds)
        raise OSError(errno.EMSGSIZE, "launcher message truncated")
    try:
        message = json.loads(data)
        if not isinstance(message, dict):
            raise ValueError("not an object")
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply for json
        close_all(fds)
        raise OSError(errno.EPROTO, f"bad launcher message: {exc}") from None
    return message, fds


def receive(sock: socket.socket, *, nowait: bool = False) -> tuple[dict[str, Any], list[int]] | None:
    """One message, or ``None`` at EOF. Blocks if the socket does, unless ``nowait`` (then BlockingIOError).

    Not ``socket.recv_fds``: on 3.11 it ignores its flags, and we need ``MSG_CMSG_CLOEXEC`` (received fds
    must never leak into an exec) and ``MSG_DONTWAIT``.
    """
    want = socket.MSG_CMSG_CLOEXEC | (socket.MSG_DONTWAIT if nowait else 0)
    data, ancillary, flags, _ = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(MAX_FDS * _INT_SIZE), want)
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += array.array("i", payload[: len(payload) - len(payload) % _INT_SIZE])
    if not data:
        close_all(fds)
        return None
    return decode(data, fds, flags)


def close_all(fds: Iterable[int]) -> None:
    """Close ``fds``; a list is emptied too, so a second call cannot close a reused fd number."""
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    if isinstance(fds, list):
        fds.clear()


def socket_pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s in (a, b):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
    return a, b


def error_reply(rid: Any, exc: BaseException, **extra: Any) -> dict[str, Any]:
    err = exc.errno if isinstance(exc, OSError) and exc.errno else 0
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
    return {"id": rid, "ok": False, "errno": err, "error": text, **extra}


# --- /proc -----------------------------------------------------------------------------------------------
def proc_scan(proc: str = "/proc") -> tuple[dict[int, int], set[int]]:
    """``(pid -> ppid, zombie pids)`` for every process visible in ``proc`` (racy by nature: callers rescan)."""
    parents: dict[int, int] = {}
    zombies: set[int] = set()
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/stat", "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            parents[int(name)] = int(fields[1])
            if fields[0] == b"Z":
                zombies.add(int(name))
    return parents, zombies


def descendants(root: int, parents: Mapping[int, int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    stack = [root]
    while stack:
        for kid in children.get(stack.pop(), ()):
            if kid not in found:
                found.add(kid)
                stack.append(kid)
    return found


# --- signals ---------------------------------------------------------------------------------------------
def _install_sigchld_wakeup() -> int:
    """Route SIGCHLD to a non-blocking pipe watched by ``poll``; returns the read end."""
    rfd, wfd = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
    return rfd


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 4096):
            pass


# What a forked helper ignores: SIGPIPE (a vanished peer is an EPIPE, not a death), and what a terminal sends
# its foreground group — Ctrl-C in dev mode reaches the launcher too, but only the boundary decides when the
# workload ends (and PR_SET_PDEATHSIG ends us with it).
_IGNORED: Final = (signal.SIGPIPE, signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def _reset_process(keep: list[int]) -> None:
    """Make a fresh fork a clean single-purpose process: default signals (SIGPIPE ignored), ``keep[i]`` moved
    to fd ``3 + i``, every other fd closed, /dev/null on 0-2, and inherited objects never finalised."""
    signal.set_wakeup_fd(-1)  # the boundary's wakeup fd number means nothing here
    for sig in signal.valid_signals():
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            with contextlib.suppress(OSError, ValueError):
                signal.signal(sig, signal.SIG_DFL)
    for sig in _IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    _keep_fds(keep)
    null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
    for fd in (0, 1, 2):
        if fd != null:
            os.dup2(null, fd)
    if null > 2:
        os.close(null)
    gc.freeze()  # objects inherited from the boundary may own fd numbers: never let them be finalised


def _keep_fds(keep: list[int]) -> None:
    """``keep[i]`` moved to fd ``3 + i`` (close-on-exec), every other fd above 2 closed."""
    lifted = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100) for fd in keep]
    for index, fd in enumerate(lifted):
        os.dup2(fd, 3 + index, inheritable=False)
    linux.close_range(3 + len(keep))


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
        # Spares (module docstring): the confinement of the last spawn (the next spare is prepared for it), the
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

    def spawn(self, request: Mapping[str, Any], fds: list[int]) -> tuple[dict[str, Any], list[int]]:
        rid, sid = request["id"], int(request["sid"])
        out: list[int] = []
        try:
            self._enter_root()
        except OSError as exc:
            close_all(fds)
            return error_reply(rid, exc, stage=child.Stage.MOUNT_NS.value), []
        try:
            spec = child.SpawnSpec.from_wire(request["spec"])
            stdio, status_fd, master = _stdio_fds(request, fds, spec)
            out = [] if master is None else [master]  # the PTY's master goes up with the reply (terminal.py)
            notify = _notify_fd(request, fds)
            self.confinement = child.confinement(spec, notify is not None)
            parent = os.getpid()
            nested = bool(request.get("own_pidns")) and self.pidns_fd is not None
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
            self.live[pid] = sid
            pidfd = os.pidfd_open(pid)
            host_pid = pid if self.host_proc_fd is None else linux.pidfd_pid(pidfd, dir_fd=self.host_proc_fd)
            reply = {"id": rid, "ok": True, "pid": host_pid, "ns_pid": pid, "nested": nested, "pty": bool(out)}
            return reply, [pidfd, *out]
        except Exception as exc:
            close_all(out)
            return error_reply(rid, exc, stage=child.Stage.FORK.value), []
        finally:
            close_all(fds)

    def replenish(self) -> tuple[dict[str, Any], list[int], int] | None:
        """Fork the next spare and lease it (module docstring): the lease message and its fds, which the caller
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
            spec, notify = child.confinement_spec(confinement), bool(confinement["notify"])
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
            if not ready[0].get("ready") or len(ready[1]) != int(bool(confinement["notify"])):
                close_all(ready[1])
                self.failed_confinement = confinement
                raise OSError(int(ready[0].get("errno") or errno.EIO), f"spare: {ready[0].get('detail')}")
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
        message = {"spare": host_pid, "ns_pid": pid, "confinement": confinement, "notes": ready[0].get("notes") or []}
        return message, out, state_r

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


def _await_ready(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
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
    return got


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


_FORWARDED: Final = tuple(
    s for s in signal.valid_signals()
    if s not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD) and s < signal.SIGRTMIN
)  # fmt: skip
_WAITED: Final = frozenset({*_FORWARDED, signal.SIGCHLD})  # what an exec-init waits for (sigwaitinfo)


def exec_init(ctx: child.ChildContext, report_r: int, report_w: int) -> NoReturn:  # pragma: no cover - own pid ns
    """PID 1 of one exec's own PID namespace (docs/design.md "Limits"): fork the command (``child.run``), forward every
    catchable signal to it, reap everything, and when the command ends write its raw wait status to
    ``report_w`` and exit — the kernel then kills whatever it left in the namespace (setsid, double forks).
    SIGKILL to this process (terminate's last step) ends the namespace, the command included. (A spare's is
    ``spare_main``.)"""
    try:
        if report_r >= 0:
            os.close(report_r)
        try:
            _become_exec_init()
        except OSError as exc:
            child.fail(ctx, child.Stage.CAPS, exc)
        ctx.parent_pid = os.getpid()  # our copy (a fork): the caller's object is not touched
        pid = os.fork()
        if pid == 0:
            os.close(report_w)
            child.run(ctx)
        # Every fd but the report: the command's ends (EOF on its pipes once it and its children are done), and
        # what we inherited from the init (its socket to the zygote, the host procfs).
        if report_w > 3:
            linux.close_range(3, report_w - 1)
        linux.close_range(report_w + 1)
        status = _wait_command(pid)
        _empty_namespace()
        with contextlib.suppress(OSError):
            os.write(report_w, str(status).encode())
        os._exit(0)
    finally:
        os._exit(1)


# Model R: what an exec-init keeps of the init's capabilities (capabilities.EXEC_INIT_KEEPS); set in the init.
_EXEC_INIT_KEEPS: int | None = None


def _become_exec_init() -> None:  # pragma: no cover - an exec-init
    if _EXEC_INIT_KEEPS is not None:  # first: no SYS_ADMIN while it serves the agent's commands
        capabilities.restrict(_EXEC_INIT_KEEPS)
    os.setsid()  # a group of our own: a group signal to this handle never reaches the workload's init
    # Signals are taken with sigwaitinfo, not caught: no handler per signal to install here (and none for the
    # command's SIGNALS stage to reset). Blocked first; then what the init ignores or catches goes back to
    # default, since an ignored signal is dropped even while blocked (and a blocked one is never acted on).
    signal.pthread_sigmask(signal.SIG_BLOCK, _WAITED)  # a forked command inherits this mask; SIGNALS empties it
    child.default_dispositions()  # and no wakeup fd (the init's pipe is not ours): its children skip both


_STATE_W: Final = 5  # a spare's state pipe to the init: "t" once its exec runs long, "b" when it is back


def _wait_command(pid: int, on_long: Callable[[], None] | None = None) -> int:  # pragma: no cover - an exec-init
    """Forward every signal but SIGCHLD to ``pid`` until it ends; its raw wait status (other children, the
    command's orphans, are reaped on the way). ``on_long`` is called once if it runs SPARE_BUSY_S."""
    deadline = None if on_long is None else time.monotonic() + SPARE_BUSY_S
    while True:
        if deadline is None:
            signum = signal.sigwaitinfo(_WAITED).si_signo
        else:
            info = signal.sigtimedwait(_WAITED, max(0.0, deadline - time.monotonic()))
            if info is None:
                deadline = None
                assert on_long is not None
                on_long()
                continue
            signum = info.si_signo
        if signum != signal.SIGCHLD:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
            continue
        while True:  # SIGCHLDs coalesce: reap all that are done
            try:
                got, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                os._exit(1)
            if got == 0:
                break
            if got == pid:
                return status


def _empty_namespace() -> None:  # pragma: no cover - an exec-init, PID 1 of its namespace
    """End and reap whatever the command left in our namespace (setsid, double forks) before the report goes
    out, so a report means the exec is over: its reader need not wait for our own exit (``kill(-1)`` from a
    namespace's init reaches every other process in it)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        while True:
            os.waitpid(-1, 0)


def spare_main(  # pragma: no cover - own pid ns
    sock_fd: int, report_w: int, state_w: int, confinement: child.Confinement, ctx: child.ChildContext
) -> NoReturn:
    """PID 1 of a PID namespace made ahead of its exec (``Spawner.replenish``): a spare exec-init. It confines
    itself for ``confinement`` (``child.SELF``: Landlock, ``no_new_privs``, both seccomp filters, the umask, the
    capability sets and the core limit, all inherited by its commands), tells the init it is ready on the command
    socket (``{"ready": true, "notes"}`` with the connect-notify listener, or ``{"ready": false}`` with the failed
    stage), then serves the boundary's commands one at a time (``_serve``).

    It holds the command socket (fd 3), the report socket (fd 4) and the state pipe to the init (fd 5). It is not
    dumpable and waits with the init's credentials: only the boundary's side can signal it (root, or the user
    namespace's owner; the agent has no capability and another uid)."""
    try:
        # The init's process state but its fds (its 0-2 are /dev/null already).
        _keep_fds([sock_fd, report_w, state_w])
        linux.prctl(linux.PR_SET_DUMPABLE, 0)
        _become_exec_init()
        ctx.parent_pid = os.getpid()
        failure = child.run_self(ctx)
        signals = linux.signalfd(_FORWARDED)  # what ends us while we wait (``_await_command``)
        sock = socket.socket(fileno=3)
        listener = [] if ctx.listener is None else [ctx.listener]
        ctx.listener = None
        send(sock, {"ready": True, "notes": ctx.notes} if failure is None else {"ready": False, **failure}, listener)
        close_all(listener)
        if failure is None:
            _serve(ctx, confinement, sock, socket.socket(fileno=4), signals)
    finally:
        os._exit(1)


def _serve(  # pragma: no cover - a spare exec-init
    ctx: child.ChildContext, confinement: child.Confinement, sock: socket.socket, report: socket.socket, signals: int
) -> NoReturn:
    """A spare's life: take the command the boundary sends on ``sock`` (``_await_command``; none: we end), run
    it (``_run``), and once it ended and our namespace is empty, send its raw status on the report socket and
    lease ourselves again over it: ``{"spare": true, "notes"}`` with a new command socket (no listener: the
    boundary has ours since the first lease). One namespace serves one exec handle at a time, and no fork of the
    init or of a new exec-init is made per exec."""
    notes = list(ctx.notes)
    while True:
        got = _await_command(sock, signals)
        if got is None:
            os._exit(0)
        ran_long: list[bool] = []
        status = _run(ctx, confinement, *got, functools.partial(_tell_long, ran_long), sock)
        _empty_namespace()
        try:
            report.send(str(status).encode(), socket.MSG_NOSIGNAL)
            sock, theirs = socket_pair()
            try:
                send(report, {"spare": True, "notes": notes}, [theirs.fileno()])
            finally:
                theirs.close()
            if ran_long:
                os.write(_STATE_W, b"b")
        except OSError:
            os._exit(0)  # the boundary is gone: the init replaces this spare


# Signals whose default action would not end a process: a spare that waits for its command is left alone by them.
_LEFT_ALONE: Final = frozenset({
    signal.SIGCONT, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGURG, signal.SIGWINCH,
})  # fmt: skip


def _await_command(sock: socket.socket, signals: int) -> tuple[dict[str, Any], list[int]] | None:  # pragma: no cover
    """The next command on ``sock``, or ``None``: EOF (the boundary let the spare go), or a signal from the
    boundary's side (end-all's SIGTERM) whose default action would end a process. As PID 1 of its namespace a
    spare exec-init is spared every signal it neither catches nor blocks; it blocks them (``_WAITED``), so a
    signalfd (``signals``) says when one is pending while it waits."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    poller.register(signals, select.POLLIN)
    while True:
        for fd, _ in poller.poll():
            if fd == signals:
                if any(signum not in _LEFT_ALONE for signum in linux.read_signals(signals)):
                    return None
            else:
                try:
                    return receive(sock)
                except OSError:
                    return None


def _tell_long(ran_long: list[bool]) -> None:  # pragma: no cover - a spare exec-init
    """Our exec has run SPARE_BUSY_S: tell the init, which makes another spare (an interactive shell must not
    hold one); "b" follows when we are back."""
    with contextlib.suppress(OSError):
        os.write(_STATE_W, b"t")
        ran_long.append(True)


def _run(  # pragma: no cover - a spare exec-init
    ctx: child.ChildContext,
    confinement: child.Confinement,
    request: dict[str, Any],
    fds: list[int],
    on_long: Callable[[], None],
    sock: socket.socket,
) -> int:
    """One command: checked as the init checks a spawn's, its confinement the one we applied to ourselves; then
    started with ``posix_spawn`` (``spawn.launch``), or with a terminal in a forked child that runs what is left
    of the stages (``child.IN_CHILD``). A terminal is opened here, in the agent's mount namespace, and its master
    sent back on the command socket ``sock`` (closed here) before the command starts (terminal.py). Its raw wait
    status, or 127's where it did not start (the failure is on its status pipe, as a forked child reports it)."""
    try:
        try:
            spec = child.SpawnSpec.from_wire(request["spec"])
            ctx.stdio, ctx.status_fd, master = _stdio_fds(request, fds, spec)
        except (KeyError, TypeError, ValueError):
            close_all(fds)
            return ExitCode.NOT_FOUND << 8
        except OSError as exc:
            if len(request.get("stdio") or ()) == 1 and 0 <= request["stdio"][0] < len(fds):
                ctx.status_fd = fds[request["stdio"][0]]
                child.report_failure(ctx, child.Stage.STDIO, exc)
            close_all(fds)
            return ExitCode.NOT_FOUND << 8
        if master is not None:  # the slave is in fds: ours is closed once the command has it
            try:
                send(sock, {"pty": True}, [master])
            except OSError as exc:
                child.report_failure(ctx, child.Stage.STDIO, exc)
                close_all(fds)
                return ExitCode.NOT_FOUND << 8
            finally:
                os.close(master)
    finally:
        sock.close()
    ctx.spec, ctx.notes = spec, []
    try:
        if child.confinement(spec, ctx.keep_listener) != confinement:
            raise spawn.StageFailure(
                child.Stage.VALIDATE, PermissionError(errno.EPERM, "the spare was prepared for another confinement")
            )
        if spec.tty:
            pid = os.fork()
            if pid == 0:
                child.run(ctx, child.IN_CHILD)
        else:
            pid = spawn.launch(ctx, started=functools.partial(close_all, fds))
    except spawn.StageFailure as failed:
        child.report_failure(ctx, failed.stage, failed.error)
        return ExitCode.NOT_FOUND << 8
    except OSError as exc:  # the fork
        child.report_failure(ctx, child.Stage.FORK, exc)
        return ExitCode.NOT_FOUND << 8
    finally:
        close_all(fds)  # our copies of its stdio and status pipe: EOF on the latter now means it execs
    return _wait_command(pid, on_long)


def _stdio_fds(
    request: Mapping[str, Any], fds: list[int], spec: child.SpawnSpec
) -> tuple[tuple[int, int, int], int, int | None]:
    """``(stdin, stdout, stderr), status, PTY master or None``. The layout indexes ``fds``: stdin, stdout,
    stderr and status; with a terminal, status alone, and the PTY is opened here (terminal.py rule 1): the slave
    is appended to ``fds`` (closed with them), the master is the caller's."""
    layout = request["stdio"]
    want = 1 if spec.tty else 4
    if len(layout) != want or not all(isinstance(i, int) and 0 <= i < len(fds) for i in layout):
        raise OSError(errno.EINVAL, "bad stdio layout")
    if not spec.tty:
        return (fds[layout[0]], fds[layout[1]], fds[layout[2]]), fds[layout[3]], None
    master, slave = terminal.open_pty(spec.rows, spec.cols)
    fds.append(slave)
    return (slave, slave, slave), fds[layout[0]], master


def _notify_fd(request: Mapping[str, Any], fds: list[int]) -> int | None:
    """The connect-notify hand-off socket the boundary sent with a spawn (``"notify"`` indexes ``fds``), if any."""
    index = request.get("notify")
    if index is None:
        return None
    if not isinstance(index, int) or not 0 <= index < len(fds):
        raise OSError(errno.EINVAL, "bad notify index")
    return fds[index]


def _init_request(spawner: Spawner, request: dict[str, Any], fds: list[int]) -> tuple[dict[str, Any], list[int]]:
    """What the init does for the zygote: spawn."""
    op = request.get("op")
    if op == "spawn":
        return spawner.spawn(request, fds)
    close_all(fds)
    return {"id": request.get("id"), "ok": False, "errno": errno.EINVAL, "error": f"init does not serve {op!r}"}, []


# The init's image. Every exec forks the init twice (the spare exec-init, then its command), and a fork's cost
# (copying the page tables, copy-on-write faults as Python writes reference counts, tearing the copy down at
# ``execve`` and exit) grows with the image: a fork of the boundary's (trio, h2, cryptography: ~37 MB anonymous)
# costs 2.7 ms CPU to fork and exit, one of an interpreter that imported only this module (~10 MB) 0.6 ms. So
# the init's child ``execve``s a fresh interpreter that imports this module and nothing of the boundary's, and
# carries no copy of the boundary's memory (its keys included) either; the capture's pyroute2 (~13 MB) runs in
# the zygote for the same reason. ``-I -S``: no environment variable, user site or ``.pth`` file has a say; the
# module path is the boundary's own installation's (supervisor/protocol/interpreter.py rule 2).
# The init and every exec-init forked from it live in the workload's PID namespace, where the agent's `ps` reads
# their command lines: so their argv names no path of the host (the interpreter is ``/proc/self/exe``, which
# Python resolves to find its library) and carries no data. The import path and the init's plan (the agent's
# root: binds, hidden paths) come on fd 5, a sealed memfd read once at start.
_INIT_BOOT: Final = (
    "import json, os, sys; boot = json.load(os.fdopen(5, 'rb')); sys.path[:0] = boot['path']; "
    "from supervisor.boundary.forkimage.zygote import init_entry; init_entry(boot)"
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
        _keep_fds([sock_fd, host_proc_fd, boot])
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
    global _EXEC_INIT_KEEPS
    try:
        _reset_process([sock_fd, host_proc_fd])  # socket on 3, host procfs on 4
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
        wake = _install_sigchld_wakeup()
        spawner = Spawner(host_proc_fd=4, root=plan)
        if narrow:
            spawner.narrow_to = capabilities.mask(capabilities.INIT_KEEPS)
            _EXEC_INIT_KEEPS = capabilities.mask(capabilities.EXEC_INIT_KEEPS)
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
                    _drain(wake)
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


# --- the zygote ------------------------------------------------------------------------------------------
class CaptureWork(Protocol):
    """What the zygote runs for the capture (``capture.calls``: the launcher passes that module in, so neither
    the zygote nor the init imports ``capture.setup``)."""

    def call(self, request: Mapping[str, Any], proc_net: str = ...) -> dict[str, Any]: ...

    def prepare(self, request: Mapping[str, Any]) -> tuple[dict[str, Any], list[int]]: ...


class Zygote:
    def __init__(self, sock: socket.socket, capture: CaptureWork) -> None:
        self.sock = sock
        self.capture = capture
        self.wake = _install_sigchld_wakeup()
        self.plan: NamespacePlan | None = None
        self.prepare_failed = False
        self.spawner: Spawner | None = None  # set when the zygote forks the workload itself
        self.init_pid: int | None = None
        self.init_sock: socket.socket | None = None
        self.init_live: set[int] = set()  # sids running under the init
        self.pidns_gone = False
        self.proc_net = "/proc/self/net"  # where capture probes read this network namespace's TCP tables
        self.boundary_gone = False
        self.poller = select.poll()
        self.poller.register(self.sock, select.POLLIN)
        self.poller.register(self.wake, select.POLLIN)

    # -- loop --
    def serve(self) -> NoReturn:
        while True:
            for fd, _ in self.poller.poll():
                if fd == self.wake:
                    _drain(self.wake)
                    self.reap()
                elif self.init_sock is not None and fd == self.init_sock.fileno():
                    self.pump_init()
                elif fd == self.sock.fileno():
                    got = receive(self.sock)
                    if got is None:  # the boundary is gone: take the workload with us
                        self.boundary_gone = True
                        self.kill_all()
                        os._exit(0)
                    self.handle(*got)

    def reply(self, message: Mapping[str, Any], fds: Iterable[int] = ()) -> None:
        """Send to the boundary; once it is gone, keep going (we are cleaning up on our way out)."""
        if self.boundary_gone:
            return
        try:
            send(self.sock, message, fds)
        except (BrokenPipeError, ConnectionResetError):
            self.boundary_gone = True

    def handle(self, request: dict[str, Any], fds: list[int]) -> None:
        rid = request.get("id")
        op = request.get("op")
        handler = self.HANDLERS.get(str(op))
        if handler is None:
            close_all(fds)
            self.reply({"id": rid, "ok": False, "errno": errno.EINVAL, "error": f"unknown op {op!r}"})
            return
        try:
            handler(self, request, fds)
        except Exception as exc:
            self.reply(error_reply(rid, exc))
        finally:
            close_all(fds)  # handlers that passed fds on have emptied the list

    # -- reaping --
    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.init_pid:
                self.init_pid = None  # reaped: its pid may be reused, never signal it again
                self._init_gone()
            elif self.spawner is not None:
                sid = self.spawner.live.pop(pid, None)
                if sid is not None:
                    self.reply({"exit": sid, "status": status})

    def pump_init(self) -> None:
        """Forward what the init sent unprompted (exits); EOF means the init is gone."""
        assert self.init_sock is not None
        while True:
            try:
                got = receive(self.init_sock, nowait=True)
            except BlockingIOError:
                return
            if got is None:
                self._init_gone()
                return
            self._relay(*got)

    def _relay(self, message: dict[str, Any], fds: list[int]) -> None:
        """Pass on what the init sent unprompted: exits, orphan reports, and leases with their fds."""
        try:
            if "exit" in message:
                self.init_live.discard(int(message["exit"]))
                self.reply(message)
            elif "spare" in message:
                self.reply(message, fds)
            elif "unowned" in message:
                self.reply(message)
        finally:
            close_all(fds)

    def _init_gone(self) -> None:
        """The PID namespace died: kill and reap the init, relay its last words, report the rest as killed."""
        if self.init_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.init_pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.init_pid, 0)
            self.init_pid = None
        if self.init_sock is not None:
            sock, self.init_sock = self.init_sock, None
            with contextlib.suppress(OSError):
                self.poller.unregister(sock)
            with contextlib.suppress(OSError):
                while (got := receive(sock, nowait=True)) is not None:
                    self._relay(*got)
            sock.close()
        for sid in sorted(self.init_live):
            self.reply({"exit": sid, "status": SIGKILL_STATUS})
        self.init_live.clear()
        self.pidns_gone = True

    # -- requests --
    def op_ping(self, request: dict[str, Any], fds: list[int]) -> None:
        close_all(fds)
        self.reply({"id": request.get("id"), "ok": True, "pid": os.getpid()})

    def op_prepare(self, request: dict[str, Any], fds: list[int]) -> None:
        close_all(fds)
        rid = request.get("id")
        if self.plan is not None or self.prepare_failed:
            raise OSError(errno.EALREADY, "launcher already prepared")
        plan = NamespacePlan.from_wire(request["plan"]).effective()
        try:
            out_fds, names, report = self._prepare(plan)
        except BaseException:
            self.prepare_failed = True
            raise
        self.plan = plan
        try:
            self.reply({"id": rid, "ok": True, "fd_names": names, "report": report, "init_pid": self.init_pid}, out_fds)
        finally:
            close_all(out_fds)

    def _prepare(self, plan: NamespacePlan) -> tuple[list[int], list[str], dict[str, Any]]:
        if (plan.hide_paths or plan.root is not None) and not plan.mountns:
            raise OSError(errno.EINVAL, "hide_paths and an agent root need a mount namespace")
        if plan.capture is not None and not plan.netns:  # it would rewire the pod's own network
            raise OSError(errno.EINVAL, "capture setup needs the agent's own network namespace")
        flags = (
            (linux.CLONE_NEWNET if plan.netns else 0)
            | (linux.CLONE_NEWNS if plan.mountns else 0)
            | (linux.CLONE_NEWPID if plan.pidns else 0)
        )
        if plan.model == PrivilegeModel.U:
            flags |= linux.CLONE_NEWUSER
        uid, gid = os.geteuid(), os.getegid()
        writer: tuple[int, int] | None = None
        if plan.model == PrivilegeModel.U and uid == 0:  # never leave the agent host root: map it to its own ids
            if plan.agent_ids is None:
                raise OSError(errno.EINVAL, "model U under root needs the agent's uid and gid")
            writer = privilege.fork_id_map_writer(*privilege.root_id_maps(*plan.agent_ids))
        try:
            if flags:
                linux.unshare(flags)
        except BaseException:
            if writer is not None:
                privilege.finish_id_map_writer(*writer, write=False)
            raise
        if writer is not None:
            privilege.finish_id_map_writer(*writer)
        elif plan.model == PrivilegeModel.U:
            privilege.write_id_maps(uid, gid)
        if plan.mountns:
            linux.mount(None, "/", None, linux.MS_REC | linux.MS_SLAVE)
        if plan.pidns:
            # Before anything else forks: the first child forked after unshare(CLONE_NEWPID) is the init. Before
            # the hiding too: its fresh interpreter starts from files a hidden path could cover.
            self._start_init(mount_proc=plan.mountns, root=plan.root, narrow=plan.model == PrivilegeModel.R)
        if plan.mountns:
            for path in plan.hide_paths:  # without an agent root; with one, its plan hides them (rootfs rule 4)
                st = os.lstat(path)
                if not stat.S_ISDIR(st.st_mode):
                    raise OSError(errno.ENOTDIR, f"hide path is not a directory: {path}")
                linux.mount("tmpfs", path, "tmpfs", HIDE_FLAGS, HIDE_OPTIONS)
        if not plan.pidns:
            linux.prctl(linux.PR_SET_CHILD_SUBREAPER, 1)
            root = rootfs.RootPlan.from_wire(plan.root) if plan.root is not None else None
            self.spawner = Spawner(host_proc_fd=None, root=root)
        out_fds: list[int] = []
        reply: dict[str, Any] = {"fd_names": [], "report": {}}
        if plan.pidns and plan.mountns:  # the init mounted the namespace's /proc: /proc/self is not us there
            self.proc_net = "/proc/1/net"  # the init's: it lives in the agent's network namespace, as we do
        if plan.capture is not None:
            # Here, not in the init: the capture's netlink code (pyroute2, ~13 MB) would otherwise become part
            # of the image every exec forks ("The init's image").
            reply, out_fds = self.capture.prepare({"op": "capture_prepare", "id": "prepare", "capture": plan.capture})
            if not reply.get("ok"):
                close_all(out_fds)
                raise OSError(int(reply.get("errno") or errno.EIO), f"capture setup: {reply.get('error')}")
        elif plan.netns:
            _loopback_up()
        names, report = list(reply["fd_names"]), dict(reply["report"])
        # model R: the init forks the workload, we only read the fence from now on
        if plan.model == PrivilegeModel.R and plan.pidns:
            try:
                capabilities.restrict(capabilities.mask(capabilities.LAUNCHER_KEEPS))
            except OSError:
                close_all(out_fds)
                raise
        if plan.model == PrivilegeModel.P:
            # Same uid as the agent: keep it from reading our memory (a copy of the boundary's) via /proc.
            linux.prctl(linux.PR_SET_DUMPABLE, 0)
        return out_fds, names, report

    def _start_init(self, mount_proc: bool, root: dict[str, Any] | None = None, narrow: bool = False) -> None:
        host_proc_fd = os.open("/proc", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        ours, theirs = socket_pair()
        try:
            pid = os.fork()
            if pid == 0:  # pragma: no cover - becomes PID 1 of the namespace
                exec_init_image(theirs.fileno(), host_proc_fd, mount_proc, root, narrow)
        finally:
            theirs.close()
            os.close(host_proc_fd)
        self.init_pid = pid
        ready = receive(ours)
        if ready is None or not ready[0].get("ready"):
            self.init_sock = ours
            self._init_gone()
            detail = ready[0] if ready else {}
            raise OSError(int(detail.get("errno") or errno.ECHILD), str(detail.get("error", "init failed")))
        self.init_sock = ours
        self.poller.register(ours, select.POLLIN)

    def op_capture_call(self, request: dict[str, Any], fds: list[int]) -> None:
        """A capture call, run here in the agent's network namespace. Once the init mounted the namespace's
        own ``/proc``, ``/proc/self`` names nothing for us (we are outside that PID namespace): a probe reads
        the TCP tables through the init's entry (``proc_net``), so a call after the init is gone fails."""
        close_all(fds)
        if self.init_sock is None and self.plan is not None and self.plan.pidns and self.plan.mountns:
            raise OSError(errno.ESRCH, "the workload PID namespace is gone")
        self.reply(self.capture.call(request, self.proc_net))

    def op_socket(self, request: dict[str, Any], fds: list[int]) -> None:
        close_all(fds)
        if self.plan is None:
            raise OSError(errno.EAGAIN, "launcher not prepared")
        sock = socket.socket(int(request["family"]), int(request["type"]), int(request.get("proto", 0)))
        try:
            self.reply({"id": request.get("id"), "ok": True}, [sock.fileno()])
        finally:
            sock.close()

    def op_spawn(self, request: dict[str, Any], fds: list[int]) -> None:
        if self.plan is None:
            raise OSError(errno.EAGAIN, "launcher not prepared")
        if self.spawner is not None:
            reply, pidfds = self.spawner.spawn(request, fds)
            try:
                self.reply(reply, pidfds)
            finally:
                close_all(pidfds)
            return
        if self.init_sock is None or self.pidns_gone:
            raise OSError(errno.ESRCH, "the workload PID namespace is gone")
        out: list[int] = []
        try:
            reply = self._via_init(request, fds, out)
            if reply.get("ok"):
                self.init_live.add(int(request["sid"]))
            self.reply(reply, out)
        finally:
            close_all(out)

    def _via_init(self, request: dict[str, Any], fds: list[int], out: list[int] | None = None) -> dict[str, Any]:
        """Forward ``request`` (and ``fds``, closed here) to the init; return its reply, its fds into ``out``."""
        assert self.init_sock is not None
        try:
            send(self.init_sock, request, fds)
        finally:
            close_all(fds)
        reply, got = self._await_init_reply(request.get("id"))
        if out is None:
            close_all(got)
        else:
            out.extend(got)
        return reply

    def _await_init_reply(self, rid: Any) -> tuple[dict[str, Any], list[int]]:
        sock = self.init_sock
        assert sock is not None
        while True:
            got = receive(sock)
            if got is None:
                self._init_gone()
                raise OSError(errno.ESRCH, "the workload PID namespace died during spawn")
            message, fds = got
            if message.get("id") == rid and "ok" in message:
                return message, fds
            self._relay(message, fds)

    def op_kill_all(self, request: dict[str, Any], fds: list[int]) -> None:
        close_all(fds)
        self.kill_all()
        self.reply({"id": request.get("id"), "ok": True})

    def kill_all(self) -> None:
        if self.init_pid is not None:
            self._init_gone()  # rule 4
            return
        if self.spawner is not None:
            self._kill_descendants()

    def _kill_descendants(self) -> None:
        """No PID namespace: SIGKILL every descendant until a scan finds none, reaping as we go."""
        import time

        me = os.getpid()
        deadline = time.monotonic() + KILL_ALL_TIMEOUT
        while True:
            self.reap()
            found = descendants(me, proc_scan()[0])
            if not found:
                break
            for pid in found:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise OSError(errno.ETIMEDOUT, f"workload processes survive SIGKILL: {sorted(found)}")
            time.sleep(0.002)
        self.reap()

    HANDLERS: Final[dict[str, Callable[[Zygote, dict[str, Any], list[int]], None]]] = {
        "ping": op_ping,
        "prepare": op_prepare,
        "capture_call": op_capture_call,
        "socket": op_socket,
        "spawn": op_spawn,
        "kill_all": op_kill_all,
    }


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        ifreq = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(sock.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def main(sock: socket.socket, boundary_pid: int, capture: CaptureWork) -> NoReturn:  # pragma: no cover - zygote
    """Entry point of the freshly forked zygote; never returns."""
    try:
        linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != boundary_pid:
            os._exit(0)
        _reset_process([sock.detach()])
        with contextlib.suppress(OSError):
            os.setsid()  # out of the boundary's session: a terminal ^C is not ours to take
        Zygote(socket.socket(fileno=3), capture).serve()
    finally:
        os._exit(1)
