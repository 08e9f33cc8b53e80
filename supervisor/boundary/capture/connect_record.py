"""What the connect-time notification learned, kept until accept (docs/design.md "Identity", "Bounded tables").

Rules:

1. A record is keyed by the connecting socket's inode and carries its cookie; :meth:`ConnectRecords.take`
   returns it only when the cookie the accept side saw (``sock_diag``) is the same, so a record left by a
   socket that was closed unaccepted can never name a later socket that reuses the inode. Taking consumes it.
2. The first record of a socket wins: a second ``connect`` on an already connecting socket fails in the kernel
   and must not rename it.
3. Both stores are bounded, and neither bound can loosen a decision. Records older than ``ttl`` go first, then
   the oldest (a socket without a record is refused at accept, ``no-record``). The exec log keeps what is alive:
   an entry names a process by (pid, start time), and only entries whose process is gone (``/proc/<pid>/stat``
   missing or with another start time) are dropped, a few of the oldest checked per new entry once a table
   holds :data:`SWEEP_AT` (live ones go to the back); a dead process's key can never name a later one, so that
   drops only garbage. A live entry is never evicted. A table is capped at the live-process bound (the
   workload's ``pids.max`` where enforced, else ``kernel.pid_max``; :func:`live_bound`); a new entry that finds
   it full after a full sweep is refused, and from then on a lookup finding no entry for a process started no
   later than the refused one raises :class:`ExecLogGap` (no identity) instead of answering "none"; such a
   process gets no entry later either (its first note may be the one lost).
4. The exec log maps a process, by (pid, start time), to the executable its parent had when it was created:
   filled when the parent ``execve``s (its children at that moment were created under the old image), read
   by the ancestor walk so a parent's later ``exec`` grants nothing. The first entry for a child wins.
5. It also keeps, per process, the loader variables of every environment it passed to ``execve`` (read from
   its memory at the notification). They only accumulate: an ``execve`` that then fails cannot clear them.
6. :class:`FirstExecs`: the one ``execve`` whose environment the boundary knows without reading it. A spare's
   exec-init starts each command the boundary sends it in a child of its own (``posix_spawn``'s, or the forked
   child of a terminal exec) that runs none of the agent's code before its ``execve``, which passes the spec's
   environment; nothing else lives in the exec-init's namespace then (it is emptied before each report). So from
   the send until the status pipe says the launch is over (a window), the first ``execve`` notification from a
   child of that exec-init is that launch's, and where the spec's environment holds no loader variable the exec
   log takes it as such without reading the caller's memory. One per window: every later one (another ``PATH``
   candidate, the command re-executing itself, an orphan of it adopted by the exec-init while the boundary has
   not yet read the status) is read like any other, and so is every ``execve`` outside a window.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from supervisor.boundary import procfs
from supervisor.protocol.identity import ConnectionIdentity

DEFAULT_TTL = 120.0
MAX_RECORDS = 65_536
SWEEP_AT = 4096  # an exec log table this full checks a few of its oldest entries per new one (rule 3)...
SWEEP_STEP = 4  # ...this many: past SWEEP_AT, dead entries stay under about a quarter of a table
PID_MAX_LIMIT = 4_194_304  # the kernel's largest pid_max, when it cannot be read
LOADER_VARIABLES = frozenset({"LD_AUDIT", "LD_LIBRARY_PATH", "LD_PRELOAD"})  # what the exec log looks for (rule 5)


@dataclass(frozen=True)
class ConnectRecord:
    cookie: int
    identity: ConnectionIdentity
    at: float


class ConnectRecords:
    def __init__(self, *, ttl: float = DEFAULT_TTL, limit: int = MAX_RECORDS) -> None:
        self._records: OrderedDict[int, ConnectRecord] = OrderedDict()
        self.ttl = ttl
        self.limit = limit

    def __len__(self) -> int:
        return len(self._records)

    def put(self, inode: int, cookie: int, identity: ConnectionIdentity) -> bool:
        """Record ``identity`` for the socket; False if it already has a record (rule 2)."""
        now = time.monotonic()
        self._expire(now)
        old = self._records.get(inode)
        if old is not None and old.cookie == cookie:
            return False
        self._records.pop(inode, None)
        self._records[inode] = ConnectRecord(cookie, identity, now)
        while len(self._records) > self.limit:
            self._records.popitem(last=False)
        return True

    def take(self, inode: int, cookie: int | None) -> ConnectionIdentity | None:
        """The identity recorded for the socket, consumed; ``cookie=None`` when the accept side has none."""
        self._expire(time.monotonic())
        record = self._records.get(inode)
        if record is None or (cookie is not None and record.cookie != cookie):
            return None
        del self._records[inode]
        return record.identity

    def _expire(self, now: float) -> None:
        while self._records:
            inode, record = next(iter(self._records.items()))
            if now - record.at <= self.ttl:
                return
            del self._records[inode]


class ExecLogGap(Exception):
    """The exec log cannot answer for a process: it had to refuse an entry that may have been this one's (rule 3)."""


def proc_alive(pid: int, start_time: int, proc: str = "/proc") -> bool:
    """Whether the process (``pid``, ``start_time``) still exists (a zombie does). Only a definite "gone" is False:
    an unreadable entry counts as alive, since dropping a live process's entry is what could loosen a decision."""
    try:
        text = procfs.read(f"{proc}/{pid}/stat")
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        return True
    try:
        return int(text[text.rindex(b")") + 2 :].split()[19]) == start_time  # field 22 of proc(5)
    except (ValueError, IndexError):
        return True


def live_bound(pids_limit: int | None = None, proc: str = "/proc") -> int:
    """How many processes can be alive at once: the workload's enforced ``pids.max``, else ``kernel.pid_max``."""
    if pids_limit is not None and pids_limit > 0:
        return pids_limit
    try:
        return int(procfs.read(f"{proc}/sys/kernel/pid_max"))
    except (OSError, ValueError):
        return PID_MAX_LIMIT


_V = TypeVar("_V")


class _LiveTable(Generic[_V]):
    """One table of the exec log: (pid, start time) → value, kept while the process lives (rule 3)."""

    def __init__(self, limit: int, alive: Callable[[int, int], bool], sweep_at: int) -> None:
        self.entries: OrderedDict[tuple[int, int], _V] = OrderedDict()
        self.limit = limit
        self.sweep_at = sweep_at
        self.gap = -1  # the latest start time of a process whose entry was refused
        self._alive = alive

    def get(self, key: tuple[int, int]) -> _V | None:
        found = self.entries.get(key)
        if found is None and key[1] <= self.gap:
            raise ExecLogGap(f"the exec log was full when process {key[0]} may have needed an entry")
        return found

    def put(self, key: tuple[int, int], value: _V) -> bool:
        """Store ``value`` (a new key only where there is room); False if refused."""
        if key in self.entries:
            self.entries[key] = value
            self.entries.move_to_end(key)
            return True
        if key[1] <= self.gap:
            return False  # its first note may be the one refused: a later one must not pass for it
        if len(self.entries) >= self.sweep_at:
            self.sweep(SWEEP_STEP)
        if len(self.entries) >= self.limit:
            self.sweep(len(self.entries))
        if len(self.entries) >= self.limit:
            self.gap = max(self.gap, key[1])
            return False
        self.entries[key] = value
        return True

    def sweep(self, count: int) -> None:
        """Check up to ``count`` of the oldest entries: a dead process's goes, a live one's to the back."""
        for _ in range(min(count, len(self.entries))):
            key = next(iter(self.entries))
            if self._alive(*key):
                self.entries.move_to_end(key)
            else:
                del self.entries[key]


class ExecLog:
    """Rules 3-5. ``limit``: entries per table at most (default :func:`live_bound`); ``alive(pid, start_time)``:
    whether a process still exists (default :func:`proc_alive`)."""

    def __init__(
        self,
        *,
        limit: int | None = None,
        alive: Callable[[int, int], bool] = proc_alive,
        sweep_at: int = SWEEP_AT,
    ) -> None:
        self.limit = live_bound() if limit is None else limit
        sweep_at = min(sweep_at, max(1, self.limit // 2))  # a small cap sweeps early, not only when full
        self._parent_exe: _LiveTable[str] = _LiveTable(self.limit, alive, sweep_at)
        self._loader: _LiveTable[tuple[str, ...]] = _LiveTable(self.limit, alive, sweep_at)

    def __len__(self) -> int:
        return len(self._parent_exe.entries)

    @property
    def sizes(self) -> tuple[int, int]:
        """Entries held: (images at creation, loader variables)."""
        return len(self._parent_exe.entries), len(self._loader.entries)

    def note_child(self, pid: int, start_time: int, parent_exe: str) -> None:
        key = (pid, start_time)
        if key in self._parent_exe.entries:
            return  # rule 4: the image at creation is the one before the parent's first exec since
        self._parent_exe.put(key, parent_exe)

    def parent_exe(self, pid: int, start_time: int) -> str | None:
        """The parent's image when the process was created, if its parent exec'd since; :class:`ExecLogGap` if
        the log cannot say (rule 3)."""
        return self._parent_exe.get((pid, start_time))

    def note_loader(self, pid: int, start_time: int, names: tuple[str, ...]) -> None:
        key = (pid, start_time)
        self._loader.put(key, tuple(sorted({*self._loader.entries.get(key, ()), *names})))  # rule 5

    def loader(self, pid: int, start_time: int) -> tuple[str, ...] | None:
        """The loader variables ``pid`` ever exec'd with; ``None`` if it never exec'd under the filter;
        :class:`ExecLogGap` if the log cannot say (rule 3)."""
        return self._loader.get((pid, start_time))


class FirstExecs:
    """Rule 6. The launcher opens a window per launch through a spare's exec-init and closes it when the launch
    is over; the connect notifier asks :meth:`take` for each ``execve`` notification."""

    def __init__(self) -> None:
        self._open: set[int] = set()  # exec-inits (pids) whose window is open and not yet spent

    def vouches_for(self, env: Mapping[str, str]) -> bool:
        """Whether a launch with ``env`` opens a window: one without loader variables (rule 6)."""
        return LOADER_VARIABLES.isdisjoint(env)

    def open(self, exec_init: int) -> None:
        self._open.add(exec_init)

    def close(self, exec_init: int) -> None:
        self._open.discard(exec_init)

    def take(self, ppid: int) -> bool:
        """Whether an ``execve`` by a child of ``ppid`` (a thread group leader) is the vouched first one of a
        window; the window is spent by it."""
        if ppid not in self._open:
            return False
        self._open.discard(ppid)
        return True
