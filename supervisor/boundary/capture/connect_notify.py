"""Identity fixed at ``connect()``: the boundary's side of the seccomp user-notification filter
(docs/design.md "Identity"; the filter is ``supervisor.boundary.forkimage.seccomp.NOTIFY_RULES``).

Rules:

1. Each workload child installs the filter after fork and before ``execve`` and sends its listener fd over the
   hand-off socket (:meth:`ConnectNotifier.child_end`, one copy per spawn). A spare exec-init installs it on itself
   once for all the commands it starts, and its one listener comes over the same socket, sent by the launcher
   when it files the exec-init's first lease (its later leases carry none); served until every process under it is
   gone. The launcher, the workload's init and the fence probe never get one. :meth:`ConnectNotifier.serve` receives
   listeners and serves each in its own task without ever blocking trio: it waits on the fd with
   ``trio.lowlevel.wait_readable`` and receives only when ``poll`` says a notification is pending (a receive with
   none pending would block).
2. Every notification is answered ``CONTINUE``: the filter decides nothing, it only lets the boundary look.
   ``connect`` on a TCP socket (``AF_INET``/``AF_INET6``, ``SOCK_STREAM``) takes the socket (``pidfd_getfd``),
   reads its inode and ``SO_COOKIE``, resolves the caller's identity and records it; anything else is answered
   at once. ``execve``/``execveat`` first note the caller's children in the exec log (the image they were
   created under) and the loader variables of the environment it passes (read from its memory).
3. An identity is recorded only if the notification is still valid after it was read
   (``SECCOMP_IOCTL_NOTIF_ID_VALID``): the task was alive throughout, so its pid named it.
4. Notifications are answered inline, in the task that receives them, with no checkpoint; only the first
   connection of a binary not hashed yet waits, in a task of its own, for a worker thread to hash it, and is
   answered ``CONTINUE`` without a record after ``bound`` seconds (the connection is then refused at accept
   as ``no-record``): the agent never hangs on a slow boundary. If the boundary is gone (its listener closed)
   the kernel fails a trapped call with ``ENOSYS``.
5. Any failure while looking is a missing record, never a refusal here: the decision is made at accept.
6. When the caller's image was hashed before, ``CONTINUE`` goes out as soon as the socket is taken and the
   image opened, and the rest is read before trio reaches its next checkpoint: the caller is not kept waiting
   on /proc reads, and neither an accept nor an exec notification (of the caller or an ancestor) is handled
   before the record is stored. If the caller exits meanwhile (its pidfd readable) the record is dropped.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import select
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import trio

from supervisor.boundary.capture.connect_record import FirstExecs
from supervisor.boundary.capture.identity import IdentityResolver
from supervisor.boundary.forkimage import linux, seccomp
from supervisor.protocol.event_names import EventName
from supervisor.protocol.json_value import JsonValue

# struct seccomp_notif { u64 id; u32 pid; u32 flags; struct seccomp_data { int nr; u32 arch; u64 ip; u64 args[6] } }
_NOTIF: Final = struct.Struct("=QIIiIQ6Q")
_RESP: Final = struct.Struct("=QqiI")  # id, val, error, flags
_IOC_READ_WRITE: Final = 3 << 30
_IOC_WRITE: Final = 1 << 30
NOTIF_RECV: Final = _IOC_READ_WRITE | (_NOTIF.size << 16) | (ord("!") << 8) | 0
NOTIF_SEND: Final = _IOC_READ_WRITE | (_RESP.size << 16) | (ord("!") << 8) | 1
NOTIF_ID_VALID: Final = _IOC_WRITE | (8 << 16) | (ord("!") << 8) | 2
FLAG_CONTINUE: Final = 1
SECCOMP_GET_ACTION_AVAIL: Final = 2
SO_COOKIE: Final = 57
DEFAULT_BOUND: Final = 2.0
_MAX_FDS: Final = 8


def available() -> bool:
    """Whether this kernel can return ``SECCOMP_RET_USER_NOTIF`` (asked without installing anything) and we may
    call ``pidfd_getfd``."""
    table = seccomp.SYSCALLS.get(linux.MACHINE)
    if table is None:
        return False
    action = ctypes.c_uint32(seccomp.RET_USER_NOTIF)
    try:
        linux.syscall(table["seccomp"], SECCOMP_GET_ACTION_AVAIL, 0, ctypes.c_void_p(ctypes.addressof(action)))
        # pidfd_getfd on ourselves: a container runtime's seccomp profile may deny it to us
        pidfd = os.pidfd_open(os.getpid())
        try:
            os.close(pidfd_getfd(pidfd, pidfd))
        finally:
            os.close(pidfd)
    except OSError:
        return False
    return True


def pidfd_getfd(pidfd: int, fd: int) -> int:
    return linux.syscall(seccomp.SYSCALLS[linux.MACHINE]["pidfd_getfd"], pidfd, fd, 0)


@dataclass(frozen=True)
class Notification:
    id: int
    pid: int  # the calling thread, in our PID namespace
    nr: int
    args: tuple[int, ...]


def receive(listener: int) -> Notification:
    buf = bytearray(_NOTIF.size)
    fcntl.ioctl(listener, NOTIF_RECV, buf, True)
    nid, pid, _flags, nr, _arch, _ip, *args = _NOTIF.unpack(buf)
    return Notification(nid, pid, nr, tuple(args))


def answer_continue(listener: int, nid: int) -> None:
    """Let the call proceed; a task that died meanwhile (``ENOENT``) needs no answer, nor can anything else."""
    with contextlib.suppress(OSError):
        fcntl.ioctl(listener, NOTIF_SEND, bytearray(_RESP.pack(nid, 0, 0, FLAG_CONTINUE)), True)


def still_valid(listener: int, nid: int) -> bool:
    try:
        fcntl.ioctl(listener, NOTIF_ID_VALID, bytearray(struct.pack("=Q", nid)), True)
    except OSError:
        return False
    return True


def _pending(listener: int) -> tuple[bool, bool]:
    """``(a notification is pending, every filter user is gone)`` without blocking."""
    poller = select.poll()
    poller.register(listener, select.POLLIN | select.POLLHUP)
    events = poller.poll(0)
    mask = events[0][1] if events else 0
    return bool(mask & select.POLLIN), bool(mask & (select.POLLHUP | select.POLLERR | select.POLLNVAL))


@dataclass(frozen=True)
class _Pending:
    """A connect waiting for its caller's image to be hashed; owns ``pidfd`` and ``exe_fd``."""

    tgid: int
    pidfd: int
    exe_fd: int
    path: str
    inode: int
    cookie: int
    started: int


class ConnectNotifier:
    """Receives the workload's listeners and records who called ``connect`` (rules above)."""

    def __init__(
        self,
        resolver: IdentityResolver,
        *,
        bound: float = DEFAULT_BOUND,
        on_event: Callable[[EventName, dict[str, JsonValue]], None] | None = None,
    ) -> None:
        if resolver.records is None:
            raise ValueError("the resolver needs a connect record store")
        self.resolver = resolver
        self.records = resolver.records
        self.bound = bound
        self._on_event = on_event
        self._ours, self._theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._ours.setblocking(False)
        self._syscalls = seccomp.SYSCALLS[linux.MACHINE]
        self._listeners: dict[int, trio.CancelScope] = {}
        #: the launcher's windows of first execs it vouches for (connect_record.py rule 6), shared with it
        self.first_execs = FirstExecs()
        self.counters = {
            "listeners": 0, "notifications": 0, "recorded": 0, "unrecorded": 0, "timed_out": 0, "vouched_execs": 0,
        }  # fmt: skip

    def child_end(self) -> socket.socket:
        """The end workload children send their listener over (the launcher gives each spawn a copy)."""
        return self._theirs

    def close(self) -> None:
        self.close_listeners()
        self._ours.close()
        self._theirs.close()

    def close_listeners(self) -> None:
        """Close every listener now: a trapped call still waiting, or made later, fails with ``ENOSYS``."""
        for fd, scope in list(self._listeners.items()):
            scope.cancel()
            trio.lowlevel.notify_closing(fd)
            os.close(fd)
        self._listeners.clear()

    async def serve(self) -> None:
        """Receive listeners until cancelled; each is served in its own task."""
        async with trio.open_nursery() as nursery:
            while True:
                await trio.lowlevel.wait_readable(self._ours)
                try:
                    _msg, fds, _flags, _addr = socket.recv_fds(self._ours, 64, _MAX_FDS)
                except BlockingIOError:
                    continue
                for fd in fds:
                    os.set_inheritable(fd, False)
                    self.counters["listeners"] += 1
                    nursery.start_soon(self._serve_listener, fd)

    async def _serve_listener(self, listener: int) -> None:
        scope = trio.CancelScope()
        self._listeners[listener] = scope
        try:
            with scope, contextlib.suppress(trio.ClosedResourceError):
                await self._receive_loop(listener)
        finally:
            if self._listeners.pop(listener, None) is not None:
                trio.lowlevel.notify_closing(listener)
                os.close(listener)

    async def _receive_loop(self, listener: int) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                try:
                    await trio.lowlevel.wait_readable(listener)
                except trio.ClosedResourceError:
                    return  # close_listeners()
                ready, gone = _pending(listener)
                if not ready:
                    if gone:
                        return  # every process under this filter has exited
                    continue
                try:
                    note = receive(listener)
                except FileNotFoundError:
                    continue  # the caller died between poll and receive
                self.counters["notifications"] += 1
                pending = self._handle(listener, note)
                if pending is not None:
                    nursery.start_soon(self._finish, listener, note, pending)

    def _handle(self, listener: int, note: Notification) -> _Pending | None:
        """Answer ``note`` now, unless the caller's image must be hashed first: then what the hash needs."""
        pending: _Pending | None = None
        answered = False  # _connect answers the caller itself (a second answer would be one more failing ioctl)
        try:
            if note.nr in (self._syscalls["execve"], self._syscalls["execveat"]):
                envp = note.args[2] if note.nr == self._syscalls["execve"] else note.args[3]
                if self.resolver.note_execve(note.pid, self._thread_group(note.pid), envp, self.first_execs):
                    self.counters["vouched_execs"] += 1
            elif note.nr == self._syscalls["connect"]:
                pending = self._connect(listener, note)
                answered = pending is None
        except Exception as exc:  # rule 5: whatever went wrong, no record (and the boundary goes on)
            if note.nr == self._syscalls["connect"]:
                self.counters["unrecorded"] += 1
                self._event(EventName.IDENTITY_CONNECT_UNRECORDED, pid=note.pid, detail=str(exc)[:300])
        finally:
            if pending is None and not answered:
                self._release(listener, note)
        return pending

    def _thread_group(self, tid: int) -> int:
        """The process of task ``tid``: itself when it leads its thread group (a pidfd opens, the usual case, two
        system calls), else read from its status."""
        try:
            os.close(os.pidfd_open(tid))  # succeeds for a thread group leader only
            return tid
        except OSError:
            return self.resolver.thread_group(tid)

    def _release(self, listener: int, note: Notification) -> None:
        if listener in self._listeners:  # else closed: the kernel failed the call already
            answer_continue(listener, note.id)

    def _connect(self, listener: int, note: Notification) -> _Pending | None:
        """Rule 2 and rule 6, without a checkpoint. ``None`` once answered (recorded or not)."""
        started = time.perf_counter_ns()
        try:
            tgid, pidfd = note.pid, os.pidfd_open(note.pid)  # succeeds for a thread group leader only
        except OSError:
            tgid = self.resolver.thread_group(note.pid)
            pidfd = os.pidfd_open(tgid)
        exe_fd: int | None = None
        try:
            if not still_valid(listener, note.id):
                raise ProcessLookupError(f"pid {tgid} is no longer the caller")
            sock_fd = pidfd_getfd(pidfd, note.args[0] & 0xFFFFFFFF)
            try:
                sock = socket.socket(fileno=sock_fd)
            except OSError:
                os.close(sock_fd)
                self._release(listener, note)  # not a socket: the kernel will say so to the caller
                return None
            try:
                if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
                    self._release(listener, note)  # only TCP is captured
                    return None
                cookie = struct.unpack("=Q", sock.getsockopt(socket.SOL_SOCKET, SO_COOKIE, 8))[0]
                inode = os.fstat(sock.fileno()).st_ino
            finally:
                sock.close()
            hit, digest = self.resolver.cached_digest(f"/proc/{tgid}/exe")
            if not hit:  # first time this binary is seen: hashed off the event loop, the caller waiting
                exe_fd, path = self.resolver.open_exe(tgid)
                pending = _Pending(tgid, pidfd, exe_fd, path, inode, cookie, started)
                pidfd = exe_fd = -1  # now the pending hash's
                return pending
            # Rule 6: the image cannot change before we answer the caller's next trapped call (an execve),
            # which this loop reaches only after the record is stored.
            self._release(listener, note)
            self._store(tgid, pidfd, self.resolver.exe_path(tgid), digest, inode, cookie, started)
            return None
        finally:
            for fd in (pidfd, exe_fd):
                if fd is not None and fd >= 0:
                    os.close(fd)

    def _store(
        self, tgid: int, pidfd: int, path: str, digest: str | None, inode: int, cookie: int, started: int
    ) -> None:
        identity = self.resolver.connector(tgid, path, digest, started, recheck=False)
        if _exited(pidfd):
            raise ProcessLookupError(f"pid {tgid} exited while it was read")  # its pid may name another now
        self.records.put(inode, cookie, identity)
        self.counters["recorded"] += 1

    async def _finish(self, listener: int, note: Notification, pending: _Pending) -> None:
        """The first connection of a binary not hashed yet: hash, record, answer — within the bound (rule 4)."""
        try:
            with trio.move_on_after(self.bound) as scope:
                copy = os.dup(pending.exe_fd)
                digest = await trio.to_thread.run_sync(_digest_and_close, self.resolver, copy, abandon_on_cancel=True)
                if still_valid(listener, note.id):  # rule 3
                    self._store(pending.tgid, pending.pidfd, pending.path, digest, pending.inode, pending.cookie,
                                pending.started)  # fmt: skip
                else:
                    self.counters["unrecorded"] += 1
            if scope.cancelled_caught:
                self.counters["timed_out"] += 1
                self.counters["unrecorded"] += 1
                self._event(EventName.IDENTITY_CONNECT_TIMEOUT, pid=note.pid, bound_s=self.bound)
        except Exception as exc:  # rule 5
            self.counters["unrecorded"] += 1
            self._event(EventName.IDENTITY_CONNECT_UNRECORDED, pid=note.pid, detail=str(exc)[:300])
        finally:
            os.close(pending.pidfd)
            os.close(pending.exe_fd)
            self._release(listener, note)

    def _event(self, name: EventName, **fields: JsonValue) -> None:
        if self._on_event is not None:
            self._on_event(name, fields)


def _exited(pidfd: int) -> bool:
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def _digest_and_close(resolver: IdentityResolver, fd: int) -> str | None:
    try:
        return resolver.digest(fd)
    finally:
        os.close(fd)
