"""The boundary's handle on its launcher ("zygote") process (docs/reference/boundary.md §2.2, §2.6, §2.7, §2.9).

Rules of this module:

1. ``Launcher.fork`` runs before ``trio.run`` and before any thread exists; everything else is async (trio)
   and never blocks the event loop, except ``close`` (shutdown).
2. One reader at a time: there is no background task. Whoever awaits a reply or an exit status reads the
   launcher socket while nobody else does, files every message it reads under its key, and wakes the other
   waiters. A cancelled reader loses nothing (a message is read whole or not at all).
3. ``spawn`` returns only once the child's status pipe reached EOF without a failure record, i.e. after
   ``execve`` succeeded; every failure is a ``SpawnError(stage, errno)``.
4. The launcher (zygote or its PID-namespace init) is the one reaper of workload processes; exit statuses
   arrive here as messages (``Spawned.wait_status``), except an exec's through a leased spare: its exec-init
   sends its command's status, once nothing else is left in its namespace, on a report socket whose other end
   came with the lease (and if it is killed before, its pidfd says when the kernel has emptied the namespace);
   its next lease then comes on the same socket (zygote ``_serve``), also after a launch that failed.
5. A lease (zygote.py "Spares") is used for one nested spawn whose confinement is the one it was prepared for,
   and only while the launcher can pass listeners to the connect-notify socket; any other lease is let go
   (closing its socket ends the waiting spare).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno as _errno
import itertools
import os
import signal
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeVar

import trio

from supervisor.boundary.capture import calls as capture_calls
from supervisor.boundary.forkimage import child, privilege, spawner, wire, zygote
from supervisor.boundary.forkimage.child import SpawnSpec, Stage
from supervisor.boundary.forkimage.messages import (
    CaptureCall,
    CaptureReply,
    ErrorReply,
    Exit,
    KillAll,
    MessageError,
    NamespacePlan,
    Ping,
    PingReply,
    Prepare,
    PrepareReply,
    Request,
    SocketRequest,
    SpareBack,
    SpareLease,
    SpawnReply,
    SpawnRequest,
    Unowned,
)
from supervisor.protocol.exit_codes import ExitCode, for_launch_errno
from supervisor.protocol.json_value import JsonValue, is_json_object
from supervisor.protocol.privilege_model import PrivilegeModel

if TYPE_CHECKING:
    from supervisor.boundary.capture.connect_record import FirstExecs

CLOSE_GRACE = 2.0


class LauncherError(Exception):
    """The launcher cannot do what was asked (not prepared, namespaces unavailable, launcher gone...)."""


class SpawnError(Exception):
    """A launch failed at ``stage`` with ``errno`` before the workload ran any instruction."""

    def __init__(self, stage: str, errno: int, detail: str = "") -> None:
        self.stage = stage
        self.errno = errno
        self.detail = detail or (os.strerror(errno) if errno else "")
        super().__init__(f"launch failed at {stage}: {self.detail} (errno {errno})")

    @property
    def exit_code(self) -> int:
        """The code a CLI reports for this failure (docs/design.md "Streams are for payload")."""
        if self.stage == Stage.EXECVE:
            return for_launch_errno(self.errno)
        return ExitCode.SELF_FAILED


@dataclass
class Prepared:
    model: PrivilegeModel
    fds: dict[str, int]
    report: dict[str, JsonValue]  # capture.setup.prepare's, logged whole
    netns_path: str | None


@dataclass
class Spawned:
    pid: int  # host pid (the boundary's PID namespace)
    pidfd: int
    stdin: int | None
    stdout: int | None
    stderr: int | None
    pty_master: int | None
    ns_pid: int | None = None  # pid inside the workload PID namespace, when there is one
    notes: tuple[str, ...] = ()  # best-effort degradations the child reported (Landlock)
    nested: bool = False  # pid is the init of the process's own PID namespace (exec_init.exec_init)
    _launcher: Launcher | None = field(default=None, repr=False, compare=False)
    _sid: int = field(default=0, repr=False, compare=False)
    _status: int | None = field(default=None, repr=False, compare=False)
    _lease: Lease | None = field(default=None, repr=False, compare=False)  # the lease it ran through

    async def wait_status(self) -> int:
        """The raw wait status, as reaped by the launcher (or reported by a leased exec-init, rule 4); the same
        value on every call."""
        if self._status is None:
            if self._lease is not None:
                lease, self._lease = self._lease, None
                self._status, renewing = await _leased_status(lease.report, lease.pidfd)
                if renewing and self._launcher is not None and not self._launcher._closed:
                    self._launcher._returning.append(lease)  # it makes itself a spare again (exec_init._serve)
                else:
                    wire.close_all([lease.report, lease.pidfd])
            else:
                assert self._launcher is not None
                self._status = await self._launcher._exit_status(self._sid)
        return self._status


@dataclass
class Lease:
    """A spare leased to the boundary (zygote.py "Spares"): its exec-init's pids, our end of its command socket,
    a pidfd of the exec-init, our end of its report socket (statuses, then its next lease), the confinement it
    was prepared for."""

    pid: int
    ns_pid: int
    sock: socket.socket | None
    pidfd: int
    report: int
    confinement: child.Confinement
    notes: tuple[str, ...]

    def close(self) -> None:
        """Let it go: the waiting exec-init sees EOF on its command socket and ends."""
        if self.sock is not None:
            self.sock.close()
        wire.close_all([self.pidfd, self.report])


# --- privilege model ---------------------------------------------------------------------------------------


def detect_privilege_model(requested: PrivilegeModel | Literal["auto"]) -> tuple[PrivilegeModel, str]:
    """``(model, reason)``: the strongest model available for ``auto``, else the one asked for if available.

    Call before threads exist (the user-namespace probe forks).
    """
    if requested != "auto" and requested not in tuple(PrivilegeModel):
        raise LauncherError(f"unknown privilege model {requested!r}")
    if requested == PrivilegeModel.P:
        return PrivilegeModel.P, "requested: no namespaces (proxy-env)"
    missing_r = privilege.model_r_missing()
    if requested in ("auto", PrivilegeModel.R) and not missing_r:
        return PrivilegeModel.R, "euid 0 with CAP_SYS_ADMIN and CAP_NET_ADMIN"
    if requested == PrivilegeModel.R:
        raise LauncherError("privilege model R unavailable: missing " + ", ".join(missing_r))
    userns = privilege.probe_userns()
    if userns is None:
        why = (
            "requested"
            if requested == PrivilegeModel.U
            else "model R unavailable (missing " + ", ".join(missing_r) + ")"
        )
        return PrivilegeModel.U, f"{why}; unprivileged user namespaces work"
    if requested == PrivilegeModel.U:
        raise LauncherError(f"privilege model U unavailable: user namespace probe failed: {userns}")
    return (
        PrivilegeModel.P,
        f"model R unavailable (missing {', '.join(missing_r)}); user namespaces unavailable ({userns})",
    )


# --- the launcher ----------------------------------------------------------------------------------------
class Launcher:
    def __init__(self, sock: socket.socket, pid: int) -> None:
        self._sock = sock
        self._pid = pid
        self._ids = itertools.count(1)
        self._replies: dict[int, tuple[dict[str, JsonValue], list[int]]] = {}
        self._exits: dict[int, int] = {}
        self._discard: set[int] = set()
        self._abandoned: set[int] = set()
        self._reading = False
        self._progress: trio.Event | None = None
        self._dead: str | None = None
        self._closed = False
        self._prepared: Prepared | None = None
        self._init_pid: int | None = None
        # The spares the init leased us, oldest first (rule 5): no workload code runs there until we hand one a
        # command, so they are left out of ``workload_pids`` while we hold them.
        self._leases: list[Lease] = []
        self._returning: list[Lease] = []  # used, their exec-init coming back as a spare (exec_init._serve)
        # The connect-notify hand-off socket (capture/connect_notify.py): when set, every spawned child gets a
        # copy, installs the notify filter and sends its listener over it before exec (a spare exec-init's one
        # listener, from its first lease, is sent over it here).
        self.notify_socket: socket.socket | None = None
        # The notifier's record of first execs we vouch for (connect_record.py rule 6): a launch through a spare
        # opens a window for its exec-init until its status pipe says it is over.
        self.first_execs: FirstExecs | None = None
        self.on_unowned: Callable[[int, list[int]], None] | None = None  # (count, first pids in the namespace)

    @classmethod
    def fork(cls) -> Launcher:
        """Fork the zygote. Call before ``trio.run`` and before any thread exists (rule 1)."""
        ours, theirs = wire.socket_pair()
        boundary = os.getpid()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - becomes the zygote
            ours.close()
            zygote.main(theirs, boundary, capture_calls)
        theirs.close()
        ours.setblocking(False)
        return cls(ours, pid)

    @property
    def pid(self) -> int:
        """The zygote's pid; after ``prepare`` it lives in the agent's network namespace."""
        return self._pid

    @property
    def init_pid(self) -> int | None:
        """The host pid of the workload's init (PID 1 of its PID namespace), once prepared with one."""
        return self._init_pid

    @property
    def prepared(self) -> Prepared | None:
        return self._prepared

    # -- transport (rule 2) --
    async def _send(self, message: Mapping[str, JsonValue], fds: Sequence[int] = ()) -> None:
        self._check_alive()
        while True:
            try:
                wire.send(self._sock, message, fds)
                return
            except BlockingIOError:
                await trio.lowlevel.wait_writable(self._sock)
            except OSError as exc:
                if exc.errno == _errno.EMSGSIZE:  # this message is refused; the launcher is fine
                    raise LauncherError(str(exc)) from exc
                self._dead = f"launcher socket: {exc.strerror}"
                raise LauncherError(self._dead) from exc

    def _check_alive(self) -> None:
        if self._closed:
            raise LauncherError("launcher closed")
        if self._dead is not None:
            raise LauncherError(self._dead)

    def _file(self, message: dict[str, JsonValue], fds: list[int]) -> None:
        if "spare" in message:
            self._take_lease(message, fds)
        elif "exit" in message:
            wire.close_all(fds)
            ended = Exit.from_wire(message)
            if ended.sid in self._discard:
                self._discard.discard(ended.sid)
            else:
                self._exits[ended.sid] = ended.status
        elif "unowned" in message:  # orphans the workload's init reaped, one report per second at most
            wire.close_all(fds)
            if self.on_unowned is not None:
                unowned = Unowned.from_wire(message)
                self.on_unowned(unowned.count, list(unowned.pids))
        elif message.get("id") in self._abandoned:
            # The requester was cancelled: a child launched for it must not run unobserved.
            self._abandoned.discard(message["id"])
            if message.get("ok") and "ns_pid" in message and fds:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(fds[0], signal.SIGKILL)
            wire.close_all(fds)
        elif isinstance(rid := message.get("id"), int):
            self._replies[rid] = (message, fds)
        else:
            wire.close_all(fds)

    def _take_lease(self, message: Mapping[str, JsonValue], fds: list[int]) -> None:
        """File a lease from the init (rule 5): its fds are the command socket, the pidfd, the report socket and,
        under the connect-notify filter, the listener, which goes to the notifier now (it serves it before the
        exec)."""
        try:
            lease = SpareLease.from_wire(message)
            confinement = child.Confinement.from_wire(lease.confinement)
            if len(fds) != 3 + int(confinement.notify):
                raise LauncherError(f"a lease came with {len(fds)} fds")
            self._file_lease(
                Lease(lease.host_pid, lease.ns_pid, None, fds[1], fds[2], confinement, ()),
                lease.notes, fds[0], fds[3:],
            )  # fmt: skip
            fds[:3] = []
        except (LauncherError, OSError, KeyError, TypeError, ValueError):
            pass  # no lease: the next exec goes through the init
        finally:
            wire.close_all(fds)

    def collect_returning(self) -> None:
        """File the leases of exec-inits that served an exec and made themselves spares again (exec_init._serve):
        ``{"spare": true, "notes"}`` on their report socket, with the command socket (the exec-init's listener came
        with its first lease and is served still). One that ended instead (let go, killed) is forgotten; the init
        makes its successor. The process table calls it once an exec's exit is out (its exec-init is back by then,
        usually), so that the next exec does not file it on its way."""
        for lease in list(self._returning):
            sock = _seqpacket(lease.report)
            try:
                got = wire.receive(sock, nowait=True)
            except BlockingIOError:
                continue
            except OSError:
                got = None
            finally:
                sock.detach()
            self._returning.remove(lease)
            fds = [] if got is None else got[1]
            try:
                if got is None or len(fds) != 1:
                    raise LauncherError("an exec-init ended instead of coming back")
                back = SpareBack.from_wire(got[0])
                self._file_lease(lease, back.notes, fds[0], fds[1:])
                fds[:1] = []
            except (LauncherError, OSError, TypeError, ValueError):
                wire.close_all([lease.pidfd, lease.report])
            finally:
                wire.close_all(fds)

    def _file_lease(self, made: Lease, notes: tuple[str, ...], cmd: int, listener: list[int]) -> None:
        """Our end of a spare's command socket in a lease (``made``'s exec-init, pidfd, report socket and
        confinement); its listener, if any, to the notifier. Raises before taking ``cmd`` on a bad one."""
        if listener:
            if self.notify_socket is None:
                raise LauncherError("a lease under the connect-notify filter, and no notifier")
            socket.send_fds(self.notify_socket, [b"listener"], listener, socket.MSG_DONTWAIT)
        sock = _seqpacket(cmd)
        sock.setblocking(False)
        self._leases.append(dataclasses.replace(made, sock=sock, notes=notes))
        while len(self._leases) > spawner.SPARES:  # more than the init keeps out: not ours to hold
            self._leases.pop(0).close()

    def _drain(self) -> None:
        """File the messages already waiting on the socket, when no task is reading it. The init's announcements
        (its spare, orphans) arrive unprompted, after the exit that made them due: with no request or exit
        awaited they would wait unread, and a new spare would count as a workload process until then. With a
        reader, nobody else may read (it waits for the socket, not for us); it files them as they come."""
        if self._reading or self._dead is not None or self._closed:
            return
        while True:
            try:
                got = wire.receive(self._sock, nowait=True)
            except BlockingIOError:
                return
            except OSError as exc:
                self._dead = f"launcher socket: {exc}"
                return
            if got is None:
                self._dead = "launcher exited"
                return
            self._file(*got)

    async def _pump(self) -> None:
        """Read one message (or wait while someone else does); wake every waiter afterwards."""
        if self._progress is None:
            self._progress = trio.Event()
        progress = self._progress
        if self._reading:
            await progress.wait()
            return
        self._reading = True
        try:
            while True:
                try:
                    got = wire.receive(self._sock)
                    break
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(self._sock)
            if got is None:
                self._dead = "launcher exited"
            else:
                self._file(*got)
        except OSError as exc:
            self._dead = f"launcher socket: {exc}"
        finally:
            self._reading = False
            self._progress = trio.Event()
            progress.set()

    async def _request(
        self, message: Callable[[int], Request], fds: Sequence[int] = ()
    ) -> tuple[dict[str, JsonValue], list[int]]:
        """Send the request ``message`` makes for a fresh id, and wait for its reply."""
        rid = next(self._ids)
        await self._send(message(rid).to_wire(), fds)
        try:
            while rid not in self._replies:
                self._check_alive()
                await self._pump()
        except BaseException:
            if rid in self._replies:
                wire.close_all(self._replies.pop(rid)[1])
            else:
                self._abandoned.add(rid)
            raise
        return self._replies.pop(rid)

    async def _exit_status(self, sid: int) -> int:
        while sid not in self._exits:
            self._check_alive()
            await self._pump()
        return self._exits.pop(sid)

    @staticmethod
    def _raise(reply: Mapping[str, JsonValue], what: str) -> None:
        if reply.get("ok"):
            return
        failed = _parse(ErrorReply.from_wire, reply, what)
        text = f"{what}: {failed.error}"
        if failed.stage is not None:
            raise SpawnError(failed.stage, failed.errno, text)
        raise LauncherError(text + (f" (errno {failed.errno})" if failed.errno else ""))

    # -- operations --
    async def prepare(self, plan: NamespacePlan) -> Prepared:
        if plan.model not in tuple(PrivilegeModel):
            raise LauncherError(f"unknown privilege model {plan.model!r}")
        reply, fds = await self._request(lambda rid: Prepare(rid, plan))
        try:
            self._raise(reply, f"prepare (model {plan.model})")
        except LauncherError:
            wire.close_all(fds)
            raise
        try:
            prepared = _parse(PrepareReply.from_wire, reply, "prepare")
        except LauncherError:
            wire.close_all(fds)
            raise
        names = list(prepared.fd_names)
        if len(names) != len(fds):
            wire.close_all(fds)
            raise LauncherError("prepare: fd count does not match fd names")
        self._init_pid = prepared.init_pid
        effective = plan.effective()
        self._prepared = Prepared(
            model=plan.model,
            fds=dict(zip(names, fds, strict=True)),
            report=dict(prepared.report),
            netns_path=f"/proc/{self._pid}/ns/net" if effective.netns else None,
        )
        return self._prepared

    async def capture_call(self, fn: str, args: dict[str, JsonValue]) -> dict[str, JsonValue]:
        """Run the capture function ``fn`` (``capture.calls``) in the agent's network namespace; its JSON answer."""
        if fn not in capture_calls.CAPTURE_CALLS:
            raise LauncherError(f"capture call {fn!r} is not allowed")
        reply, fds = await self._request(lambda rid: CaptureCall(rid, fn, dict(args)))
        wire.close_all(fds)
        self._raise(reply, f"capture {fn}")
        result = _parse(CaptureReply.from_wire, reply, f"capture {fn}").result
        return result if is_json_object(result) else {"result": result}

    async def socket_in_netns(self, family: int, type: int, proto: int = 0) -> socket.socket:
        reply, fds = await self._request(lambda rid: SocketRequest(rid, int(family), int(type), int(proto)))
        if not reply.get("ok") or len(fds) != 1:
            wire.close_all(fds)
            self._raise(reply, "socket")
            raise LauncherError("socket: no fd received")
        return socket.socket(fileno=fds[0])

    async def spawn(self, spec: SpawnSpec, *, own_pidns: bool = False) -> Spawned:
        """Launch ``spec``; ``own_pidns``: in a PID namespace of its own under the workload's (R, U; ignored
        without a workload PID namespace), so ending it ends everything it started (exec_init.exec_init)."""
        problem = child.validate(spec)
        if problem is not None:
            raise SpawnError(Stage.VALIDATE, _errno.EINVAL, problem)
        if len(wire.encode(spec.to_wire())) > wire.MAX_SPEC:
            raise SpawnError(Stage.VALIDATE, _errno.E2BIG, f"argv and environment exceed {wire.MAX_SPEC} bytes")
        if self._prepared is None:
            raise LauncherError("spawn before prepare")
        ours: list[int] = []  # the boundary's ends, returned in Spawned
        theirs: list[int] = []  # the child's ends, closed here once sent
        lease: Lease | None = None
        try:
            ends, layout = _make_stdio(spec, ours, theirs)
            status_r, status_w = os.pipe2(os.O_CLOEXEC)
            ours.append(status_r)
            theirs.append(status_w)
            layout.append(len(theirs) - 1)
            sid = next(self._ids)
            lease = self._use_lease(spec, layout, theirs) if own_pidns else None
            if lease is not None:
                wire.close_all(theirs)  # the child has them: EOF on the status pipe is its execve
                if spec.tty:  # the exec-init opened the terminal in the agent's namespace (terminal.py)
                    ends["pty_master"] = await _pty_from(lease)
                    if ends["pty_master"] is not None:
                        ours.append(ends["pty_master"])
                else:
                    assert lease.sock is not None
                    lease.sock.close()
                ours.append(lease.report)
                pidfd, reply = lease.pidfd, SpawnReply(sid, lease.pid, lease.ns_pid, nested=True)
                lease.pidfd = os.dup(pidfd)  # the lease's own, for its exec-init's next lease (Spawned's is closed)
                ours.append(lease.pidfd)
            else:
                pidfd, reply, master = await self._spawn_via_launcher(spec, sid, layout, theirs, own_pidns)
                if master is not None:
                    ours.append(master)
                    ends["pty_master"] = master
            try:
                notes, failure = await _read_status(status_r)
            except BaseException:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                if lease is None:
                    self._forget(sid)
                os.close(pidfd)
                raise
            finally:
                if lease is not None and self.first_execs is not None:
                    self.first_execs.close(lease.pid)
            if failure is not None:
                if lease is None:
                    self._forget(sid)
                else:
                    await self._take_back(lease, ours)
                os.close(pidfd)
                raise failure
        except BaseException:
            wire.close_all(ours)
            raise
        finally:
            wire.close_all(theirs)
        os.close(status_r)
        return Spawned(
            pid=reply.pid,
            pidfd=pidfd,
            ns_pid=reply.ns_pid,
            notes=(*(lease.notes if lease else ()), *notes),
            nested=reply.nested,
            _launcher=self,
            _sid=sid,
            _lease=lease,
            **ends,
        )

    async def _take_back(self, lease: Lease, ours: list[int]) -> None:
        """A launch through ``lease`` failed before its command ran: its exec-init reports at once (127's status)
        and comes back as a spare (zygote ``_serve``), as after any exec; its report socket and pidfd stay ours."""
        for fd in (lease.report, lease.pidfd):
            ours.remove(fd)
        _, renewing = await _leased_status(lease.report, lease.pidfd)
        if renewing and not self._closed:
            self._returning.append(lease)
        else:
            wire.close_all([lease.report, lease.pidfd])

    def _use_lease(self, spec: SpawnSpec, layout: list[int], fds: list[int]) -> Lease | None:
        """Send this spawn to the leased spare if it was prepared for the spec's confinement (rule 5); ``None``:
        there is none, or it is let go, and the launcher forks the exec-init."""
        self.collect_returning()
        if not self._leases:
            return None
        lease = self._leases.pop(0)
        assert lease.sock is not None  # only a lease in use has given its socket up
        if lease.confinement != child.confinement(spec, self.notify_socket is not None):
            for stale in (lease, *self._leases):  # prepared for what we no longer run: the init makes new ones
                stale.close()
            self._leases.clear()
            return None
        if self.first_execs is not None and self.first_execs.vouches_for(spec.env):
            self.first_execs.open(lease.pid)  # before the command can reach its execve
        try:
            wire.send(lease.sock, SpawnRequest(spec.to_wire(), tuple(layout)).to_wire(), fds)
        except OSError:  # it ended while waiting (only a signal from our side can do that)
            if self.first_execs is not None:
                self.first_execs.close(lease.pid)
            lease.close()
            return None
        return lease  # its command socket is closed by the caller (it brings a terminal's master back first)

    async def _spawn_via_launcher(
        self, spec: SpawnSpec, sid: int, layout: list[int], theirs: list[int], own_pidns: bool
    ) -> tuple[int, SpawnReply, int | None]:
        """The spawn request to the zygote (and on to the init): the child's pidfd, the reply and, with a
        terminal, the PTY master the forking process opened in the agent's namespace (terminal.py)."""
        notify: int | None = None
        if self.notify_socket is not None:
            theirs.append(os.dup(self.notify_socket.fileno()))
            notify = len(theirs) - 1
        try:
            reply, fds = await self._request(
                lambda rid: SpawnRequest(spec.to_wire(), tuple(layout), rid, sid, notify, own_pidns), theirs
            )
        except BaseException:
            self._forget(sid)
            raise
        finally:
            wire.close_all(theirs)
        if not reply.get("ok") or len(fds) != (2 if spec.tty else 1) or bool(reply.get("pty")) != spec.tty:
            wire.close_all(fds)
            self._raise(reply, "spawn")
            raise LauncherError("spawn: no pidfd (or no terminal) received")
        try:
            spawned = _parse(SpawnReply.from_wire, reply, "spawn")
        except LauncherError:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(fds[0], signal.SIGKILL)  # launched, and not to run unobserved
            wire.close_all(fds)
            raise
        return fds[0], spawned, fds[1] if spec.tty else None

    def _forget(self, sid: int) -> None:
        """A launch that failed: drop its exit status whenever it arrives."""
        if self._exits.pop(sid, None) is None:
            self._discard.add(sid)

    def workload_pids(self) -> set[int]:
        """Host pids of every live workload process: descendants of the zygote, minus the init, the init's
        waiting spare exec-init and its child (they run nothing of the workload's) and zombies."""
        self._drain()  # the init's latest spare announcement, which nobody may be waiting to read
        parents, zombies = zygote.proc_scan()
        found = zygote.descendants(self._pid, parents) - zombies
        found.discard(self._init_pid or -1)
        self.collect_returning()
        for lease in (*self._leases, *self._returning):
            found -= {lease.pid, *zygote.descendants(lease.pid, parents)}
        return found

    async def kill_all(self) -> None:
        """SIGKILL every workload process (the PID-ns init, or every descendant) and wait until reaped."""
        reply, fds = await self._request(KillAll)
        wire.close_all(fds)
        self._raise(reply, "kill_all")

    async def ping(self) -> int:
        reply, fds = await self._request(Ping)
        wire.close_all(fds)
        self._raise(reply, "ping")
        return _parse(PingReply.from_wire, reply, "ping").pid

    def close(self) -> None:
        """Stop the launcher: it kills the workload on EOF; reap it (SIGKILL after a grace period)."""
        if self._closed:
            return
        self._closed = True
        for _message, fds in self._replies.values():
            wire.close_all(fds)
        self._replies.clear()
        for lease in (*self._leases, *self._returning):
            lease.close()
        self._leases.clear()
        self._returning.clear()
        self._sock.close()
        deadline = time.monotonic() + CLOSE_GRACE
        try:
            while time.monotonic() < deadline:
                pid, _ = os.waitpid(self._pid, os.WNOHANG)
                if pid:
                    return
                time.sleep(0.005)
            os.kill(self._pid, signal.SIGKILL)
            os.waitpid(self._pid, 0)
        except (ChildProcessError, ProcessLookupError):
            pass  # already reaped by someone else's waitpid(-1)


def _make_stdio(spec: SpawnSpec, ours: list[int], theirs: list[int]) -> tuple[dict[str, int | None], list[int]]:
    """Create the child's stdio; returns the boundary ends for ``Spawned`` and the stdio layout indexes."""
    ends: dict[str, int | None] = {"stdin": None, "stdout": None, "stderr": None, "pty_master": None}
    if spec.tty:  # opened by the forking process, in the agent's mount namespace (terminal.py)
        return ends, []
    layout: list[int] = []
    for name in ("stdin", "stdout", "stderr"):
        mode = getattr(spec, name)
        if mode == "inherit":
            theirs.append(os.dup((0, 1, 2)[len(layout)]))
        elif mode == "null":
            theirs.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
        else:
            r, w = os.pipe2(os.O_CLOEXEC)
            mine, child_end = (w, r) if name == "stdin" else (r, w)
            ours.append(mine)
            theirs.append(child_end)
            ends[name] = mine
        layout.append(len(theirs) - 1)
    return ends, layout


async def _pty_from(lease: Lease) -> int | None:
    """The PTY master a leased exec-init sends back on the command socket before it starts a command with a
    terminal; ``None`` when it closed the socket instead (its failure is then on the status pipe)."""
    sock = lease.sock
    assert sock is not None
    try:
        while True:
            try:
                got = wire.receive(sock, nowait=True)
                break
            except BlockingIOError:
                await trio.lowlevel.wait_readable(sock)
            except OSError:
                return None
    finally:
        sock.close()
    if got is None:
        return None
    message, fds = got
    if message.get("pty") is not True or len(fds) != 1:
        wire.close_all(fds)
        return None
    return fds[0]


async def _leased_status(report: int, pidfd: int) -> tuple[int, bool]:
    """A leased exec-init's report (rule 4): its command's raw wait status, sent in one message once nothing else
    is left in its namespace (zygote ``_empty_namespace``), and ``True``: the exec-init goes on, as a spare again,
    and both fds stay open for its next lease. Or, if it sent none (it was killed), SIGKILL's once the exec-init
    has exited and the kernel emptied its namespace, and ``False``: both fds are closed."""
    try:
        os.set_blocking(report, False)
        while True:
            try:
                data = os.read(report, 64)
                break
            except BlockingIOError:
                await trio.lowlevel.wait_readable(report)
        if not data:
            await trio.lowlevel.wait_readable(pidfd)
    except BaseException:
        wire.close_all([report, pidfd])
        raise
    try:
        return int(data), True
    except ValueError:
        wire.close_all([report, pidfd])
        return zygote.SIGKILL_STATUS, False


def _seqpacket(fd: int) -> socket.socket:
    """A socket object for one end of a ``wire.socket_pair`` (named: no kernel query of its type)."""
    return socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, 0, fileno=fd)


async def _read_status(fd: int) -> tuple[list[str], SpawnError | None]:
    """Read the child's status pipe to EOF: ``(notes, the failure its last failure record says, or None)``."""
    import json

    os.set_blocking(fd, False)
    data = bytearray()
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(fd)
            continue
        if not chunk:
            break
        data += chunk
    notes: list[str] = []
    failure: SpawnError | None = None
    for line in bytes(data).splitlines():
        try:
            record = json.loads(line)
            if not is_json_object(record):
                raise ValueError("not an object")
        except ValueError:
            failure = SpawnError("unknown", _errno.EPROTO, "unreadable status record")
            continue
        if "note" in record:
            notes.append(str(record["note"]))
        else:
            failure = _failure(record)
    return notes, failure


def _failure(record: dict[str, JsonValue]) -> SpawnError:
    """A failure record (``child.Failure``) as the error it is; a field it lacks has its default."""
    errno = record.get("errno") or 0
    return SpawnError(
        str(record.get("stage", "unknown")),
        int(errno) if isinstance(errno, int | float | str) else 0,
        str(record.get("detail", "")),
    )


_Reply = TypeVar("_Reply")


def _parse(from_wire: Callable[[Mapping[str, JsonValue]], _Reply], reply: Mapping[str, JsonValue], what: str) -> _Reply:
    """``from_wire(reply)``; a malformed reply is the launcher's fault: a ``LauncherError`` naming the field."""
    try:
        return from_wire(reply)
    except MessageError as exc:
        raise LauncherError(f"{what}: {exc}") from None
