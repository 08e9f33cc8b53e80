"""The launcher ("zygote") process and the PID-namespace init it may fork (docs/reference/boundary.md §2.2, §2.6, §2.7).

The fork image's process model lives in modules of one job each: the wire (wire.py) and its typed messages
(messages.py), a fresh fork's process state (procstate.py), the forking side (spawner.py, with a spawn's fds in
spawn_fds.py), the workload PID namespace's init (init.py), an exec's own init and the spares (exec_init.py);
the child's side is child.py, mounts rootfs.py, ids privilege.py. This module is the zygote's loop and its
operations, and the rules all of them keep.

The rules:

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
pyroute2 out of the init's image); the launcher hands that code to the zygote (``capture.calls``), so the
init's imports — its image — hold no ``threading`` and its at-fork handler. Once the init has
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

import contextlib
import errno
import fcntl
import os
import select
import signal
import socket
import stat
import struct
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, NoReturn, Protocol

from supervisor.protocol.json_value import JsonValue
from supervisor.protocol.privilege_model import PrivilegeModel

from . import capabilities, linux, privilege, rootfs
from .init import exec_init_image
from .messages import (
    CaptureCall,
    CaptureReply,
    Done,
    ErrorReply,
    Exit,
    KillAll,
    MessageError,
    NamespacePlan,
    Ping,
    PingReply,
    Prepare,
    PrepareReply,
    Ready,
    SocketRequest,
    SpawnRequest,
    request_from_wire,
)
from .procstate import drain, install_sigchld_wakeup, reset_process
from .spawner import Spawner
from .wire import close_all, receive, send, socket_pair

HIDE_OPTIONS: Final = "mode=0555,size=4k"
HIDE_FLAGS: Final = linux.MS_RDONLY | linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
SIGKILL_STATUS: Final = signal.SIGKILL  # raw wait status of a process killed by SIGKILL
KILL_ALL_TIMEOUT: Final = 10.0
_SIOCGIFFLAGS: Final = 0x8913
_SIOCSIFFLAGS: Final = 0x8914
_IFF_UP: Final = 0x1


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


# --- the zygote ------------------------------------------------------------------------------------------
class CaptureWork(Protocol):
    """What the zygote runs for the capture (``capture.calls``: the launcher passes that module in, so neither
    the zygote nor the init imports ``capture.setup``)."""

    def call(self, name: str, args: Mapping[str, JsonValue], proc_net: str = ...) -> dict[str, JsonValue]: ...

    def prepare(self, capture: Mapping[str, JsonValue]) -> tuple[list[str], dict[str, JsonValue], list[int]]: ...


class Zygote:
    def __init__(self, sock: socket.socket, capture: CaptureWork) -> None:
        self.sock = sock
        self.capture = capture
        self.wake = install_sigchld_wakeup()
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
                    drain(self.wake)
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

    def reply(self, message: Mapping[str, JsonValue], fds: Iterable[int] = ()) -> None:
        """Send to the boundary; once it is gone, keep going (we are cleaning up on our way out)."""
        if self.boundary_gone:
            return
        try:
            send(self.sock, message, fds)
        except (BrokenPipeError, ConnectionResetError):
            self.boundary_gone = True

    def handle(self, message: dict[str, JsonValue], fds: list[int]) -> None:
        rid = message.get("id")
        try:
            request = request_from_wire(message)
        except MessageError as exc:
            close_all(fds)
            self.reply(ErrorReply(rid, errno.EINVAL, str(exc)).to_wire())
            return
        try:
            self.HANDLERS[type(request)](self, request, fds)
        except Exception as exc:
            self.reply(ErrorReply.of(rid, exc).to_wire())
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
                    self.reply(Exit(sid, status).to_wire())

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

    def _relay(self, message: dict[str, JsonValue], fds: list[int]) -> None:
        """Pass on what the init sent unprompted: exits, orphan reports, and leases with their fds."""
        try:
            if "exit" in message:
                self.init_live.discard(Exit.from_wire(message).sid)
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
            self.reply(Exit(sid, SIGKILL_STATUS).to_wire())
        self.init_live.clear()
        self.pidns_gone = True

    # -- requests --
    def op_ping(self, request: Ping, fds: list[int]) -> None:
        close_all(fds)
        self.reply(PingReply(request.id, os.getpid()).to_wire())

    def op_prepare(self, request: Prepare, fds: list[int]) -> None:
        close_all(fds)
        rid = request.id
        if self.plan is not None or self.prepare_failed:
            raise OSError(errno.EALREADY, "launcher already prepared")
        plan = request.plan.effective()
        try:
            out_fds, names, report = self._prepare(plan)
        except BaseException:
            self.prepare_failed = True
            raise
        self.plan = plan
        try:
            self.reply(PrepareReply(rid, tuple(names), report, self.init_pid).to_wire(), out_fds)
        finally:
            close_all(out_fds)

    def _prepare(self, plan: NamespacePlan) -> tuple[list[int], list[str], dict[str, JsonValue]]:
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
        names: list[str] = []
        report: dict[str, JsonValue] = {}
        if plan.pidns and plan.mountns:  # the init mounted the namespace's /proc: /proc/self is not us there
            self.proc_net = "/proc/1/net"  # the init's: it lives in the agent's network namespace, as we do
        if plan.capture is not None:
            # Here, not in the init: the capture's netlink code (pyroute2, ~13 MB) would otherwise become part
            # of the image every exec forks ("The init's image").
            names, report, out_fds = self.capture.prepare(plan.capture)
        elif plan.netns:
            _loopback_up()
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

    def _start_init(self, mount_proc: bool, root: dict[str, JsonValue] | None = None, narrow: bool = False) -> None:
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
        got = receive(ours)
        try:
            ready = Ready(False) if got is None else Ready.from_wire(got[0])
        except MessageError as exc:
            ready = Ready(False, errno=errno.EPROTO, error=str(exc))
        if not ready.ready:
            self.init_sock = ours
            self._init_gone()
            raise OSError(ready.errno or errno.ECHILD, ready.error or "init failed")
        self.init_sock = ours
        self.poller.register(ours, select.POLLIN)

    def op_capture_call(self, request: CaptureCall, fds: list[int]) -> None:
        """A capture call, run here in the agent's network namespace. Once the init mounted the namespace's
        own ``/proc``, ``/proc/self`` names nothing for us (we are outside that PID namespace): a probe reads
        the TCP tables through the init's entry (``proc_net``), so a call after the init is gone fails."""
        close_all(fds)
        if self.init_sock is None and self.plan is not None and self.plan.pidns and self.plan.mountns:
            raise OSError(errno.ESRCH, "the workload PID namespace is gone")
        self.reply(CaptureReply(request.id, self.capture.call(request.fn, request.args, self.proc_net)).to_wire())

    def op_socket(self, request: SocketRequest, fds: list[int]) -> None:
        close_all(fds)
        if self.plan is None:
            raise OSError(errno.EAGAIN, "launcher not prepared")
        sock = socket.socket(request.family, request.type, request.proto)
        try:
            self.reply(Done(request.id).to_wire(), [sock.fileno()])
        finally:
            sock.close()

    def op_spawn(self, request: SpawnRequest, fds: list[int]) -> None:
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
                self.init_live.add(int(request.sid or 0))
            self.reply(reply, out)
        finally:
            close_all(out)

    def _via_init(self, request: SpawnRequest, fds: list[int], out: list[int] | None = None) -> dict[str, JsonValue]:
        """Forward ``request`` (and ``fds``, closed here) to the init; return its reply, its fds into ``out``."""
        assert self.init_sock is not None
        try:
            send(self.init_sock, request.to_wire(), fds)
        finally:
            close_all(fds)
        reply, got = self._await_init_reply(request.id)
        if out is None:
            close_all(got)
        else:
            out.extend(got)
        return reply

    def _await_init_reply(self, rid: Any) -> tuple[dict[str, JsonValue], list[int]]:
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

    def op_kill_all(self, request: KillAll, fds: list[int]) -> None:
        close_all(fds)
        self.kill_all()
        self.reply(Done(request.id).to_wire())

    def kill_all(self) -> None:
        if self.init_pid is not None:
            self._init_gone()  # rule 4
            return
        if self.spawner is not None:
            self._kill_descendants()

    def _kill_descendants(self) -> None:
        """No PID namespace: SIGKILL every descendant until a scan finds none, reaping as we go."""

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

    HANDLERS: Final[dict[type, Callable[[Zygote, Any, list[int]], None]]] = {
        Ping: op_ping,
        Prepare: op_prepare,
        CaptureCall: op_capture_call,
        SocketRequest: op_socket,
        SpawnRequest: op_spawn,
        KillAll: op_kill_all,
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
        reset_process([sock.detach()])
        with contextlib.suppress(OSError):
            os.setsid()  # out of the boundary's session: a terminal ^C is not ours to take
        Zygote(socket.socket(fileno=3), capture).serve()
    finally:
        os._exit(1)
