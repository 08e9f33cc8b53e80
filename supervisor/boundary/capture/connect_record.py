"""What the connect-time notification learned, kept until accept (docs/design.md "Identity").

Rules:

1. A record is keyed by the connecting socket's inode and carries its cookie; :meth:`ConnectRecords.take`
   returns it only when the cookie the accept side saw (``sock_diag``) is the same, so a record left by a
   socket that was closed unaccepted can never name a later socket that reuses the inode. Taking consumes it.
2. The first record of a socket wins: a second ``connect`` on an already connecting socket fails in the kernel
   and must not rename it.
3. Both stores are bounded: records older than ``ttl`` go first, then the oldest; the exec log forgets the
   oldest entries (their processes have long exited, or their children count with their current image).
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
from collections.abc import Mapping
from dataclasses import dataclass

from supervisor.protocol.identity import ConnectionIdentity

DEFAULT_TTL = 120.0
MAX_RECORDS = 65_536
MAX_EXEC_LOG = 65_536
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


class ExecLog:
    def __init__(self, *, limit: int = MAX_EXEC_LOG) -> None:
        self._parent_exe: OrderedDict[tuple[int, int], str] = OrderedDict()
        self._loader: OrderedDict[tuple[int, int], tuple[str, ...]] = OrderedDict()
        self.limit = limit

    def __len__(self) -> int:
        return len(self._parent_exe)

    def note_child(self, pid: int, start_time: int, parent_exe: str) -> None:
        key = (pid, start_time)
        if key in self._parent_exe:
            return  # rule 4: the image at creation is the one before the parent's first exec since
        self._parent_exe[key] = parent_exe
        while len(self._parent_exe) > self.limit:
            self._parent_exe.popitem(last=False)

    def parent_exe(self, pid: int, start_time: int) -> str | None:
        return self._parent_exe.get((pid, start_time))

    def note_loader(self, pid: int, start_time: int, names: tuple[str, ...]) -> None:
        key = (pid, start_time)
        self._loader[key] = tuple(sorted({*self._loader.pop(key, ()), *names}))  # rule 5
        while len(self._loader) > self.limit:
            self._loader.popitem(last=False)

    def loader(self, pid: int, start_time: int) -> tuple[str, ...] | None:
        """The loader variables ``pid`` ever exec'd with; ``None`` if it never exec'd under the filter."""
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
