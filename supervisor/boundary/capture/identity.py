"""Binary identity of the process behind an accepted connection (docs/reference/boundary.md §4.2).

Size (over ~500 lines on purpose): the resolver's stages (socket → connect record → owners → executable and
ancestors), their budget and their failure kinds are one decision path.

Rules:

1. Resolution runs for every accepted capture/proxy connection before a byte is read from it, and any
   failure is a refusal: :class:`IdentityUnresolved` names the stage, which the caller reports as
   ``identity-unresolved: <stage>``. Nothing here ever returns a partial identity.
2. The socket is found by its full 4-tuple — with an exact ``sock_diag`` lookup when the launcher gave us a
   netlink socket of the agent's namespace, else in its TCP tables (``/proc/<anchor>/net/tcp{,6}``) —
   ESTABLISHED (or FIN_WAIT1/2: the agent may half-close before resolution), IPv4-mapped addresses
   normalised: the agent's end has local = the accepted socket's peer and remote = the accepted socket's
   local address.
3. Owners are looked for among the workload's processes, and every other process except the boundary itself
   is checked too (unless ``scan_foreign=False``): a socket of the agent held by anything outside the
   workload is ``foreign-owner``. All owners must agree on
   (path, digest, ancestors, command-line paths), else ``ambiguous``; the lowest pid is reported.
4. Each owner is pinned with ``pidfd_open`` and its start time is read before and after everything else, and
   the socket must still be in its fd table at the end: a process that exited or was recycled meanwhile is
   ``vanished``.
5. The digest is of the bytes behind the opened ``/proc/<pid>/exe`` fd (the live image, even if the path was
   replaced), cached on that fd's (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns). No TOFU deny here:
   pinning digests is control's policy. Files larger than ``max_hash_bytes`` get ``binary_sha256 = None``.
6. Ancestors are exe paths, nearest first, up to the agent (inclusive) or 64 levels; a chain that leaves the
   workload before reaching the agent (a reparented orphan) stops there and is marked ``orphaned``.
   ``cmdline_paths`` (absolute argv entries not already named) are diagnostic only and never authorise.
7. The budget (default 50 ms) covers the /proc walk; hashing a binary seen for the first time is excluded
   (it is paid once per binary), so a large interpreter does not make its first connection fail.

Residual window (documented in §4.2): identity is reconstructed after ``accept``, so a process that ``execve``s
between ``connect`` and resolution is reported as its new image.

With a connect-time record store (``records``, filled by capture/connect_notify.py; docs/design.md "Identity"),
rules 2-7 run at ``connect`` instead, on the process that called it (:meth:`IdentityResolver.connector`), and
``resolve`` only finds the record by the accepted peer's inode and cookie: a connection without one is
``no-record``. With an exec log, every ancestor counts with the image it had when its child was created; where
the log cannot answer for a process (connect_record.py rule 3) there is no identity.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Container
from dataclasses import dataclass

from supervisor.boundary import procfs
from supervisor.boundary.capture import _procnet
from supervisor.boundary.capture._sockdiag import SockDiag
from supervisor.boundary.capture.connect_record import ConnectRecords, ExecLog, ExecLogGap, FirstExecs
from supervisor.protocol.identity import ConnectionIdentity

MAX_ANCESTORS = 64
_MAX_ENV = 65_536  # entries of an execve envp array read at most
_ENV_CHUNK = 64  # envp pointers per read
_ENV_GAP = 512  # env strings this close are checked with one read of their span...
_ENV_SPAN = 64 * 1024  # ...of at most this many bytes
DEFAULT_BUDGET_US = 50_000
DEFAULT_MAX_HASH_BYTES = 512 * 1024 * 1024
_HASH_CHUNK = 1024 * 1024
_CACHE_LIMIT = 4096
_DELETED = " (deleted)"


class IdentityStage(enum.StrEnum):
    """Where resolution failed; the value is the string in ``identity-unresolved: <stage>`` events."""

    ANCHOR = "anchor"  # the anchor's TCP tables cannot be read
    INODE = "inode"  # no open socket with that 4-tuple in the agent's namespace
    OWNERS = "owners"  # no workload process holds the socket (or a workload fd table is unreadable)
    FOREIGN_OWNER = "foreign-owner"  # a process outside the workload holds the socket
    AMBIGUOUS = "ambiguous"  # owners disagree on their identity
    VANISHED = "vanished"  # an owner exited or was recycled during resolution
    EXE = "exe"  # the executable cannot be opened or named
    ANCESTORS = "ancestors"  # the ancestor chain changed while it was read
    BUDGET = "budget"  # resolution took longer than the budget
    NO_RECORD = "no-record"  # connect-time identity in force, and the connecting socket has no record


class IdentityUnresolved(Exception):
    def __init__(self, stage: IdentityStage, detail: str) -> None:
        super().__init__(f"identity-unresolved: {stage}: {detail}")
        self.stage = stage
        self.detail = detail

    @property
    def reason(self) -> str:
        return f"identity-unresolved: {self.stage}"


# The resolved identity is the protocol's one shape (docs/reference/boundary.md §4.2); the boundary's name for it.
Identity = ConnectionIdentity


@dataclass(frozen=True)
class _Owner:
    pid: int
    fd_name: str


@dataclass(frozen=True)
class _OwnerIdentity:
    pid: int
    path: str
    sha256: str | None
    ancestors: tuple[str, ...]
    cmdline_paths: tuple[str, ...]
    start_time: int
    uid: int
    orphaned: bool
    loader_env: tuple[str, ...] = ()

    @property
    def policy_key(self) -> tuple[object, ...]:
        return (self.path, self.sha256, self.ancestors, self.cmdline_paths, self.loader_env)


class IdentityResolver:
    """Resolves identities for one workload. Thread-safe (the digest cache is locked), blocking on /proc."""

    def __init__(
        self,
        *,
        anchor_pid: int,
        workload_pids: Callable[[], set[int]],
        agent_pid: Callable[[], int | None],
        root_prefix: Callable[[int], str] | None = None,
        budget_us: int = DEFAULT_BUDGET_US,
        max_hash_bytes: int = DEFAULT_MAX_HASH_BYTES,
        sock_diag: socket.socket | None = None,
        scan_foreign: bool = True,
        proc: str = "/proc",
        records: ConnectRecords | None = None,
        exec_log: ExecLog | None = None,
    ) -> None:
        """``anchor_pid``: any process living in the agent's network namespace (its TCP tables are read).
        ``root_prefix(pid)``: where the boundary sees the workload's ``/`` (e.g. the rootfs of a pivoted
        mount namespace); stripped from exe paths so they read as inside the workload.
        ``sock_diag``: a ``NETLINK_SOCK_DIAG`` socket opened inside the agent's namespace
        (:func:`supervisor.boundary.capture.setup.open_sock_diag`); finds the inode with one hash lookup
        instead of reading the TCP tables (milliseconds each). ``scan_foreign=False`` skips the check that no
        process outside the workload holds the socket (a full /proc fd walk; keep it on unless the boundary's
        /proc shows only the workload anyway)."""
        self.anchor_pid = anchor_pid
        self._diag = SockDiag(sock_diag) if sock_diag is not None else None
        self._scan_foreign = scan_foreign
        self._workload_pids = workload_pids
        self._agent_pid = agent_pid
        self._root_prefix = root_prefix
        self.budget_us = budget_us
        self.max_hash_bytes = max_hash_bytes
        self._proc = proc
        self._digests: dict[tuple[int, int, int, int, int], str | None] = {}
        self._lock = threading.Lock()
        self.records = records
        self.exec_log = exec_log

    # -- public ------------------------------------------------------------------------------------------

    def resolve(self, local: tuple[str, int], remote: tuple[str, int]) -> Identity:
        """``local``: the accepted socket's local address (listener end); ``remote``: its peer (the agent's)."""
        started = time.perf_counter_ns()
        if self.records is not None:
            return self._recorded(_procnet.normalise(remote), _procnet.normalise(local), started)
        # The budget bounds the work of this resolution: this thread's CPU time, less first-time hashing. Wall
        # time would also count waiting for the GIL and the CPU, which under load refused honest connections.
        cpu_started = time.thread_time_ns()
        hashing_ns = [0]
        inode = self._inode(_procnet.normalise(remote), _procnet.normalise(local))
        workload = set(self._workload_pids())
        owners = self._owners(inode, workload)
        agent = self._agent_pid()
        resolved = [self._owner_identity(owner, inode, workload, agent, hashing_ns) for owner in owners]
        if len({r.policy_key for r in resolved}) > 1:
            pids = [r.pid for r in resolved]
            raise IdentityUnresolved(
                IdentityStage.AMBIGUOUS, f"inode {inode} is held by {pids} with different identities"
            )
        elapsed_ns = time.perf_counter_ns() - started
        work_us = (time.thread_time_ns() - cpu_started - hashing_ns[0]) // 1000
        if work_us > self.budget_us:
            raise IdentityUnresolved(IdentityStage.BUDGET, f"took {work_us} µs of CPU (wall {elapsed_ns // 1000} µs)")
        first = resolved[0]
        return Identity(
            binary_path=first.path,
            binary_sha256=first.sha256,
            ancestors=first.ancestors,
            cmdline_paths=first.cmdline_paths,
            pid=first.pid,
            start_time=first.start_time,
            uid=first.uid,
            owners=len(resolved),
            resolved_in_us=elapsed_ns // 1000,
            orphaned=first.orphaned,
            loader_env=first.loader_env,
        )

    def _recorded(self, agent_end: tuple[str, int], listener_end: tuple[str, int], started: int) -> Identity:
        assert self.records is not None
        cookie: int | None = None
        inode: int | None = None
        if self._diag is not None:
            try:
                found = self._diag.lookup(agent_end, listener_end)
            except OSError:
                found = None
            if found is not None and found.state in _procnet.OPEN_CLIENT_STATES and found.inode != 0:
                inode, cookie = found.inode, found.cookie
        if inode is None:
            inode = self._inode(agent_end, listener_end)
        identity = self.records.take(inode, cookie)
        if not isinstance(identity, Identity):
            raise IdentityUnresolved(
                IdentityStage.NO_RECORD, f"socket {agent_end} → {listener_end} was not recorded at connect"
            )
        elapsed_us = (time.perf_counter_ns() - started) // 1000
        return dataclasses.replace(identity, resolved_in_us=identity.resolved_in_us + elapsed_us)

    # -- connect time (capture/connect_notify.py) -------------------------------------------------------------

    def open_exe(self, pid: int) -> tuple[int, str]:
        """An fd of ``pid``'s live image and its path (inside the workload); the caller closes the fd."""
        return self._open_exe(pid)

    def exe_path(self, pid: int) -> str:
        return self._exe_path(pid)

    def cached_digest(self, fd: int | str) -> tuple[bool, str | None]:
        """``(hit, digest)`` from the cache only, for an open image or a path to stat: never reads the file."""
        st = os.fstat(fd) if isinstance(fd, int) else os.stat(fd)
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        with self._lock:
            if key in self._digests:
                return True, self._digests[key]
        return False, None

    def digest(self, fd: int) -> str | None:
        return self._digest(fd)

    def connector(self, pid: int, path: str, digest: str | None, started: int, *, recheck: bool = True) -> Identity:
        """The identity of ``pid`` (a thread group leader blocked in ``connect``) as it is now. ``recheck=False``
        when the caller checks otherwise (a pidfd) that ``pid`` did not exit meanwhile."""
        start_time = self._start_time(pid)
        uid = self._uid(pid)
        # The workload's pid set is a scan of every process on the host: asked for only when an ancestor's
        # membership is (the agent itself, the usual caller, has none to check).
        workload = _LazyPids(self._workload_pids)
        agent = self._agent_pid()
        ancestors, ancestor_pids, orphaned = self._ancestors(pid, workload, agent)
        invalidate = getattr(self._workload_pids, "invalidate", None)
        if orphaned and callable(invalidate):  # a cached pid set may predate a parent forked just now
            invalidate()
            workload = _LazyPids(self._workload_pids)
            ancestors, ancestor_pids, orphaned = self._ancestors(pid, workload, agent)
        cmdline_paths = self._cmdline_paths([pid, *ancestor_pids], {path, *ancestors})
        loader_env = tuple(sorted({*self._loader_env(pid, uid), *self._inherited_loader_env(pid, workload)}))
        if recheck and self._start_time(pid) != start_time:
            raise IdentityUnresolved(IdentityStage.VANISHED, f"pid {pid} changed during resolution")
        return Identity(
            binary_path=path,
            binary_sha256=digest,
            ancestors=ancestors,
            cmdline_paths=cmdline_paths,
            pid=pid,
            start_time=start_time,
            uid=uid,
            owners=1,
            resolved_in_us=(time.perf_counter_ns() - started) // 1000,
            orphaned=orphaned,
            loader_env=loader_env,
        )

    def note_execve(self, tid: int, pid: int, envp: int, first_execs: FirstExecs | None = None) -> bool:
        """Task ``tid`` of process ``pid`` is about to ``execve`` with the environment at ``envp``: the exec log
        notes the process's children so far (created under its current image) and the loader variables of that
        environment (read from its memory while it waits). One ``stat`` read serves both: the caller waits. A first
        exec ``first_execs`` vouches for has neither children nor loader variables (connect_record.py rule 6):
        nothing is read but the ``stat``. Whether it was one."""
        if self.exec_log is None:
            return False
        fields = self._stat_fields(pid)
        if tid == pid and first_execs is not None and first_execs.take(int(fields[1])):  # field 4: the parent
            self.exec_log.note_loader(pid, int(fields[19]), ())
            return True
        self._note_children(pid, threads=int(fields[17]))  # field 20 of proc(5)
        self.exec_log.note_loader(pid, int(fields[19]), self._envp_loader_env(tid, envp))
        return False

    def _note_children(self, pid: int, *, threads: int) -> None:
        assert self.exec_log is not None
        try:  # a single-threaded process (the usual caller, a fork about to exec) has one task: itself
            tasks = [str(pid)] if threads == 1 else os.listdir(f"{self._proc}/{pid}/task")
        except OSError:
            return
        exe: str | None = None
        for tid in tasks:
            try:
                children = procfs.read(f"{self._proc}/{pid}/task/{tid}/children").split()
            except OSError:
                continue
            for child in children:
                try:
                    exe = exe or self._exe_path(pid)
                    self.exec_log.note_child(int(child), self._start_time(int(child)), exe)
                except (IdentityUnresolved, ValueError):
                    continue

    def _envp_loader_env(self, tid: int, envp: int) -> tuple[str, ...]:
        """Loader variables in the ``envp`` array of a caller blocked in ``execve``, read from its memory.
        Unreadable memory counts as ``LD_PRELOAD`` (the exec itself would fail with EFAULT). This runs while the
        caller waits in ``execve`` (every exec is one): the array and the strings' heads are read in few reads."""
        if envp == 0:
            return ()
        found: set[str] = set()
        try:
            fd = os.open(f"{self._proc}/{tid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise IdentityUnresolved(IdentityStage.VANISHED, f"reading the memory of {tid}: {exc}") from exc
        try:
            for pointer in _loader_candidates(fd, _env_pointers(fd, envp)):
                entry = _c_string(fd, pointer)
                name, _, value = entry.partition(b"=")
                if name in (b"LD_PRELOAD", b"LD_AUDIT") and value.strip():
                    found.add(name.decode())
                elif name == b"LD_LIBRARY_PATH" and self._writable_dirs(
                    tid, self._uid(tid), value.decode("utf-8", "replace")
                ):
                    found.add("LD_LIBRARY_PATH")
        except (OSError, _Unreadable):
            return ("LD_PRELOAD",)
        finally:
            os.close(fd)
        return tuple(sorted(found))

    def _inherited_loader_env(self, pid: int, workload: Container[int]) -> tuple[str, ...]:
        """What ``pid``'s image was exec'd with: its own exec's, else (never exec'd: a fork of its parent's
        image) its nearest ancestor's."""
        if self.exec_log is None:
            return ()
        current = pid
        for _ in range(MAX_ANCESTORS):
            try:
                found = self.exec_log.loader(current, self._start_time(current))
            except ExecLogGap as exc:  # connect_record.py rule 3: not "never exec'd", which would ask the parent
                raise IdentityUnresolved(IdentityStage.ANCESTORS, str(exc)) from exc
            if found is not None:
                return found
            parent = self._ppid(current)
            if parent <= 0 or parent not in workload:
                return ()
            current = parent
        return ()

    def thread_group(self, tid: int) -> int:
        """The thread group (process) of task ``tid``; a notification names the calling thread."""
        try:
            text = procfs.read(f"{self._proc}/{tid}/status")
        except OSError as exc:
            raise IdentityUnresolved(IdentityStage.VANISHED, f"reading status of {tid}: {exc}") from exc
        at = text.find(b"\nTgid:")
        if at < 0:
            raise IdentityUnresolved(IdentityStage.VANISHED, f"no Tgid line for {tid}")
        return int(text[at + 6 :].split(None, 1)[0])

    def _loader_env(self, pid: int, uid: int) -> tuple[str, ...]:
        """Loader variables of ``pid``'s initial environment that can inject code (docs/policy.md)."""
        try:
            entries = procfs.read(f"{self._proc}/{pid}/environ").split(b"\0")
        except OSError as exc:
            raise IdentityUnresolved(IdentityStage.VANISHED, f"reading environ of {pid}: {exc}") from exc
        found: list[str] = []
        for entry in entries:
            if not entry.startswith(b"LD_"):
                continue
            name, _, value = entry.partition(b"=")
            if name in (b"LD_PRELOAD", b"LD_AUDIT") and value.strip():
                found.append(name.decode())
            elif name == b"LD_LIBRARY_PATH" and self._writable_dirs(pid, uid, value.decode("utf-8", "replace")):
                found.append("LD_LIBRARY_PATH")
        return tuple(sorted(set(found)))

    def _writable_dirs(self, pid: int, uid: int, search_path: str) -> bool:
        """Whether any entry of a library search path is relative or a directory ``uid`` could write."""
        for entry in search_path.replace(";", ":").split(":") if search_path else ():
            if not entry.startswith("/"):
                return True  # empty or relative: the working directory, which the workload picks
            probe = entry
            while True:
                try:
                    st = os.stat(f"{self._proc}/{pid}/root{probe}")
                    break
                except FileNotFoundError:
                    if probe == "/":
                        return True
                    probe = os.path.dirname(probe.rstrip("/")) or "/"  # a missing directory: can it be made?
                except OSError:
                    return True
            if uid == 0 or (st.st_uid == uid and st.st_mode & 0o200) or st.st_mode & 0o022:
                return True
        return False

    @property
    def cached_digests(self) -> int:
        return len(self._digests)

    # -- stage 1: socket → inode -------------------------------------------------------------------------

    def _inode(self, agent_end: tuple[str, int], listener_end: tuple[str, int]) -> int:
        if self._diag is not None:
            try:
                found = self._diag.lookup(agent_end, listener_end)
            except OSError:
                found = None  # no inet_diag here: the tables below decide
            if found is not None:
                if found.state not in _procnet.OPEN_CLIENT_STATES or found.inode == 0:
                    raise IdentityUnresolved(IdentityStage.INODE, f"socket {agent_end} → {listener_end} is not open")
                return found.inode
            # "no such socket" is rare (a refusal); the tables confirm it, and cover kernels without inet_diag
        try:
            rows = _procnet.find_rows(f"{self._proc}/{self.anchor_pid}/net", agent_end, listener_end)
        except OSError as exc:
            raise IdentityUnresolved(IdentityStage.ANCHOR, f"reading the anchor's TCP tables: {exc}") from exc
        inodes = {
            row.inode
            for row in rows
            if row.state in _procnet.OPEN_CLIENT_STATES
            and row.local == agent_end
            and row.remote == listener_end
            and row.inode != 0
        }
        if len(inodes) != 1:
            what = "no" if not inodes else "more than one"
            raise IdentityUnresolved(IdentityStage.INODE, f"{what} open socket {agent_end} → {listener_end}")
        return inodes.pop()

    # -- stage 2: inode → owners -------------------------------------------------------------------------

    def _owners(self, inode: int, workload: set[int]) -> list[_Owner]:
        target = f"socket:[{inode}]"
        owners: list[_Owner] = []
        for pid in sorted(workload):
            try:
                owners += self._holding(pid, target)
            except PermissionError as exc:
                raise IdentityUnresolved(IdentityStage.OWNERS, f"cannot read the fd table of {pid}") from exc
        # the boundary itself holds every accepted end (other inodes) and is not a foreign owner: skipping it
        # keeps the walk independent of how many connections are open
        me = os.getpid()
        for name in os.listdir(self._proc) if self._scan_foreign else ():
            if not name.isdigit() or int(name) in workload or int(name) == me:
                continue
            try:
                foreign = self._holding(int(name), target)
            except PermissionError:
                continue  # unreadable without privileges; the boundary runs with ptrace-level access
            if foreign:
                raise IdentityUnresolved(
                    IdentityStage.FOREIGN_OWNER, f"pid {name} outside the workload holds socket inode {inode}"
                )
        if not owners:
            raise IdentityUnresolved(IdentityStage.OWNERS, f"no workload process holds socket inode {inode}")
        return owners

    def _holding(self, pid: int, target: str) -> list[_Owner]:
        """The (first) fd of ``pid`` that refers to ``target``; [] if none or the process is gone."""
        fd_dir = f"{self._proc}/{pid}/fd"
        try:
            names = os.listdir(fd_dir)
        except (FileNotFoundError, ProcessLookupError):
            return []
        # newest first: a process opening many connections most often holds the one we look for near the top
        names.sort(key=lambda name: -int(name) if name.isdigit() else 0)
        for fd_name in names:
            try:
                if os.readlink(f"{fd_dir}/{fd_name}") == target:
                    return [_Owner(pid, fd_name)]
            except OSError:
                continue
        return []

    # -- stage 3: owner → identity -----------------------------------------------------------------------

    def _owner_identity(
        self, owner: _Owner, inode: int, workload: set[int], agent: int | None, hashing_ns: list[int]
    ) -> _OwnerIdentity:
        pid = owner.pid
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError as exc:
            raise IdentityUnresolved(IdentityStage.VANISHED, f"pid {pid} exited") from exc
        try:
            start_time = self._start_time(pid)
            exe_fd, path = self._open_exe(pid)
            try:
                before = time.thread_time_ns()
                digest = self._digest(exe_fd)
                hashing_ns[0] += time.thread_time_ns() - before
            finally:
                os.close(exe_fd)
            uid = self._uid(pid)
            ancestors, ancestor_pids, orphaned = self._ancestors(pid, workload, agent)
            cmdline_paths = self._cmdline_paths([pid, *ancestor_pids], {path, *ancestors})
            loader_env = self._loader_env(pid, uid)
            still_holds = self._readlink(f"{self._proc}/{pid}/fd/{owner.fd_name}") == f"socket:[{inode}]"
            if not still_holds or self._start_time(pid) != start_time or _exited(pidfd):
                raise IdentityUnresolved(IdentityStage.VANISHED, f"pid {pid} changed during resolution")
        finally:
            os.close(pidfd)
        return _OwnerIdentity(pid, path, digest, ancestors, cmdline_paths, start_time, uid, orphaned, loader_env)

    def _open_exe(self, pid: int) -> tuple[int, str]:
        link = f"{self._proc}/{pid}/exe"
        try:
            fd = os.open(link, os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, ProcessLookupError) as exc:
            raise IdentityUnresolved(IdentityStage.VANISHED, f"pid {pid} exited") from exc
        except OSError as exc:
            raise IdentityUnresolved(IdentityStage.EXE, f"opening {link}: {exc}") from exc
        try:
            path = self._exe_path(pid)
        except BaseException:
            os.close(fd)
            raise
        return fd, path

    def _exe_path(self, pid: int) -> str:
        link = f"{self._proc}/{pid}/exe"
        try:
            raw = os.readlink(link)
        except (FileNotFoundError, ProcessLookupError) as exc:
            raise IdentityUnresolved(IdentityStage.VANISHED, f"pid {pid} exited") from exc
        except OSError as exc:
            raise IdentityUnresolved(IdentityStage.EXE, f"reading {link}: {exc}") from exc
        # the kernel appends " (deleted)" once; strip it only when no file of the literal name exists
        if raw.endswith(_DELETED) and not os.path.lexists(raw):
            raw = raw[: -len(_DELETED)]
        if self._root_prefix is not None:
            prefix = self._root_prefix(pid).rstrip("/")
            if prefix and raw.startswith(prefix + "/"):
                raw = raw[len(prefix) :]
        if not raw.startswith("/"):
            raise IdentityUnresolved(IdentityStage.EXE, f"pid {pid} has no executable path ({raw!r})")
        return raw

    def _digest(self, fd: int) -> str | None:
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        with self._lock:
            if key in self._digests:
                return self._digests[key]
        digest: str | None
        if st.st_size > self.max_hash_bytes:
            digest = None
        else:
            try:
                hasher = hashlib.sha256()
                offset = 0
                while chunk := os.pread(fd, _HASH_CHUNK, offset):
                    hasher.update(chunk)
                    offset += len(chunk)
                digest = hasher.hexdigest()
            except OSError:
                return None  # a read error reports no digest (control decides) and is not cached
        with self._lock:
            if len(self._digests) >= _CACHE_LIMIT:
                self._digests.clear()
            self._digests[key] = digest
        return digest

    def _ancestors(
        self, pid: int, workload: Container[int], agent: int | None
    ) -> tuple[tuple[str, ...], list[int], bool]:
        """(exe paths nearest first, their pids, orphaned). Retried once if the chain changes under us."""
        for attempt in (1, 2):
            try:
                return self._walk(pid, workload, agent)
            except IdentityUnresolved:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _walk(self, pid: int, workload: Container[int], agent: int | None) -> tuple[tuple[str, ...], list[int], bool]:
        paths: list[str] = []
        pids: list[int] = []
        if pid == agent:
            return (), [], False
        current = pid
        while len(paths) < MAX_ANCESTORS:
            parent = self._ppid(current)
            if parent <= 0 or parent not in workload:
                return tuple(paths), pids, True
            try:
                paths.append(self._exe_at_creation(current, parent))
            except IdentityUnresolved as exc:
                raise IdentityUnresolved(IdentityStage.ANCESTORS, f"ancestor {parent}: {exc.detail}") from exc
            pids.append(parent)
            if parent == agent:
                return tuple(paths), pids, False
            current = parent
        return tuple(paths), pids, False

    def _exe_at_creation(self, child: int, parent: int) -> str:
        """``parent``'s image when ``child`` was created: the exec log's, else the current one."""
        if self.exec_log is not None:
            try:
                logged = self.exec_log.parent_exe(child, self._start_time(child))
            except IdentityUnresolved as exc:
                raise IdentityUnresolved(IdentityStage.ANCESTORS, f"process {child}: {exc.detail}") from exc
            except ExecLogGap as exc:  # connect_record.py rule 3: no answer is no identity, never "the current"
                raise IdentityUnresolved(IdentityStage.ANCESTORS, str(exc)) from exc
            if logged is not None:
                return logged
        return self._exe_path(parent)

    def _cmdline_paths(self, pids: list[int], known: set[str]) -> tuple[str, ...]:
        seen: list[str] = []
        for pid in pids:
            try:
                argv = procfs.read(f"{self._proc}/{pid}/cmdline").split(b"\0")
            except OSError:
                continue  # diagnostic only
            for arg in argv:
                text = arg.decode("utf-8", "replace")
                if text.startswith("/") and text not in known and text not in seen:
                    seen.append(text)
        return tuple(seen)

    # -- /proc readers -----------------------------------------------------------------------------------

    def _stat_fields(self, pid: int) -> list[str]:
        try:
            text = procfs.read(f"{self._proc}/{pid}/stat").decode("utf-8", "replace")
        except (FileNotFoundError, ProcessLookupError) as exc:
            raise IdentityUnresolved(IdentityStage.VANISHED, f"pid {pid} exited") from exc
        except OSError as exc:
            raise IdentityUnresolved(IdentityStage.VANISHED, f"reading stat of {pid}: {exc}") from exc
        # the command name may contain anything, including ")": fields start after the last one
        return text[text.rindex(")") + 2 :].split()

    def _start_time(self, pid: int) -> int:
        return int(self._stat_fields(pid)[19])  # field 22 of proc(5)

    def _ppid(self, pid: int) -> int:
        try:
            return int(self._stat_fields(pid)[1])  # field 4
        except IdentityUnresolved as exc:
            raise IdentityUnresolved(IdentityStage.ANCESTORS, exc.detail) from exc

    def _uid(self, pid: int) -> int:
        try:
            text = procfs.read(f"{self._proc}/{pid}/status")
        except OSError as exc:
            raise IdentityUnresolved(IdentityStage.VANISHED, f"reading status of {pid}: {exc}") from exc
        at = text.find(b"\nUid:")
        if at < 0:
            raise IdentityUnresolved(IdentityStage.VANISHED, f"no Uid line for {pid}")
        return int(text[at + 5 :].split(None, 1)[0])

    @staticmethod
    def _readlink(path: str) -> str | None:
        try:
            return os.readlink(path)
        except OSError:
            return None


class _LazyPids:
    """The workload's pid set, taken from ``scan`` on the first membership question and kept for the rest."""

    def __init__(self, scan: Callable[[], set[int]]) -> None:
        self._scan = scan
        self._pids: set[int] | None = None

    def __contains__(self, pid: object) -> bool:
        if self._pids is None:
            self._pids = set(self._scan())
        return pid in self._pids


class _Unreadable(Exception):
    """A caller's memory could not be read where its ``execve`` arguments say it holds something."""


def _env_pointers(fd: int, envp: int) -> list[int]:
    """The pointers of the NULL-terminated array at ``envp`` (at most ``_MAX_ENV``), read ``_ENV_CHUNK`` at a
    time: a read across the end of a mapping comes back short, and the next one fails if nothing is left."""
    pointers: list[int] = []
    address = envp
    while len(pointers) < _MAX_ENV:
        raw = os.pread(fd, 8 * _ENV_CHUNK, address)
        count = len(raw) // 8
        if count == 0:
            raise _Unreadable(f"envp at {address:#x}")
        for pointer in struct.unpack(f"={count}Q", raw[: 8 * count]):
            if pointer == 0:
                return pointers
            pointers.append(pointer)
        address += 8 * count
    return pointers[:_MAX_ENV]


def _loader_candidates(fd: int, pointers: list[int]) -> list[int]:
    """Which ``pointers`` name a string beginning ``LD_``. Strings close together (gaps under ``_ENV_GAP``) are
    checked with one read of their span (at most ``_ENV_SPAN``); a span that cannot be read in full is checked
    string by string, so a bad pointer still fails (``_Unreadable``) as it would alone."""
    found: set[int] = set()
    ordered = sorted(set(pointers))
    start = 0
    while start < len(ordered):
        end = start + 1
        while (
            end < len(ordered)
            and ordered[end] - ordered[end - 1] <= _ENV_GAP
            and ordered[end] + 3 - ordered[start] <= _ENV_SPAN
        ):
            end += 1
        group, low = ordered[start:end], ordered[start]
        span = os.pread(fd, group[-1] + 3 - low, low)
        if len(span) == group[-1] + 3 - low:
            found.update(pointer for pointer in group if span[pointer - low : pointer - low + 3] == b"LD_")
        else:
            for pointer in group:
                head = os.pread(fd, 3, pointer)
                if not head:
                    raise _Unreadable(f"string at {pointer:#x}")
                if head == b"LD_":
                    found.add(pointer)
        start = end
    return [pointer for pointer in pointers if pointer in found]


def _c_string(fd: int, address: int, limit: int = 128 * 1024) -> bytes:
    """The NUL-terminated string at ``address`` of an open ``/proc/<pid>/mem`` (at most ``limit`` bytes)."""
    out = b""
    while len(out) < limit:
        chunk = os.pread(fd, 256, address + len(out))
        if not chunk:
            break
        end = chunk.find(b"\0")
        if end >= 0:
            return out + chunk[:end]
        out += chunk
    return out


def _exited(pidfd: int) -> bool:
    """A pidfd becomes readable when its process exits."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))
