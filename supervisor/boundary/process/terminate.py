"""Ending a process tree without leaving anything behind, in /proc mode (docs/reference/boundary.md §2.6).

Membership of a handle's tree, from what /proc shows (restricted to the launcher's workload processes, so
nothing outside the workload is ever signalled):

- the root process, while its pid still names it (pid + start time);
- every process in the root's session or process group — the launcher makes each root a session leader, and
  the kernel keeps a session's id allocated while any member lives, so the id cannot name a stranger unless
  the root's pid now belongs to a *different* process (then the session id is not ours and is ignored);
- every descendant (PPid chain) of a member;
- every process seen as a member in an earlier scan (membership is sticky, so a member that is reparented
  or calls ``setsid`` after being seen stays a member).

A process that double-forks *and* calls ``setsid`` before any scan saw it is not attributable to one handle
by /proc alone; it stays inside the workload (the launcher's subreaper or PID namespace) and ends with the
agent (``end_all`` kills every workload process, then the launcher's ``kill_all``). In models R and U this
only matters for the agent: every exec handle's root is the init of the exec's own PID namespace
(``exec_init.exec_init``), a member of its tree, and its SIGKILL ends everything in that namespace. Model P keeps
the residual (docs/reference/boundary.md §2.6).

Algorithm: SIGTERM (+ SIGCONT, so a stopped member can act on it) to every member; poll every 50 ms until the
grace ends, signalling members that appear; then *freeze and kill*: SIGSTOP every member, rescan, repeat until
a pass finds nobody new (a stopped process cannot fork), SIGKILL them all, and start over until only zombies
or nothing remain. Every signal goes through a pidfd opened after re-checking the pid's start time, so a
recycled pid is never hit.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

import trio

from supervisor.boundary import procfs

__all__ = [
    "Membership", "ProcStat", "Tree", "everything", "kill_tree", "read_stat", "scanner", "send_signal",
    "snapshot", "terminate_tree",
]  # fmt: skip

POLL_S: Final = 0.05
_MAX_KILL_ROUNDS: Final = 200


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    starttime: int

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X", "x")


def read_stat(pid: int) -> ProcStat | None:
    """Parse /proc/PID/stat (the command may contain spaces and parentheses: split at the last ``)``)."""
    try:
        raw = procfs.read(f"/proc/{pid}/stat")
    except OSError:
        return None
    try:
        rest = raw[raw.rindex(b")") + 2 :].split()
        return ProcStat(pid, int(rest[1]), int(rest[2]), int(rest[3]), rest[0].decode(), int(rest[19]))
    except (ValueError, IndexError):
        return None


def snapshot(pids: Iterable[int]) -> dict[int, ProcStat]:
    out: dict[int, ProcStat] = {}
    for pid in pids:
        stat = read_stat(pid)
        if stat is not None:
            out[pid] = stat
    return out


def send_signal(stat: ProcStat, sig: int) -> bool:
    """Signal the exact process instance ``stat`` describes; False if it is gone or the pid was reused."""
    try:
        pidfd = os.pidfd_open(stat.pid)
    except OSError:
        return False
    try:
        now = read_stat(stat.pid)
        if now is None or now.starttime != stat.starttime:
            return False
        signal.pidfd_send_signal(pidfd, sig)
        return True
    except OSError:
        return False
    finally:
        os.close(pidfd)


@dataclass(frozen=True)
class Tree:
    """One scan: the live members, and the process groups that hold only members (signalled as a whole)."""

    live: list[ProcStat]
    groups: frozenset[int]


class Membership:
    """The sticky member set of one handle's tree."""

    def __init__(self, root_pid: int, root_starttime: int | None) -> None:
        self.root_pid = root_pid
        self.root_starttime = root_starttime
        self._known: dict[int, int] = {}  # pid -> start time of every member ever seen

    def tree(self, snap: dict[int, ProcStat]) -> Tree:
        root = snap.get(self.root_pid)
        ours = root is None or (self.root_starttime is not None and root.starttime == self.root_starttime)
        seeds = [
            p
            for p in snap.values()
            if self._known.get(p.pid) == p.starttime
            or (ours and (p.pid == self.root_pid or p.sid == self.root_pid or p.pgid == self.root_pid))
        ]
        children: dict[int, list[ProcStat]] = {}
        for p in snap.values():
            children.setdefault(p.ppid, []).append(p)
        found: dict[int, ProcStat] = {}
        todo = seeds
        while todo:
            p = todo.pop()
            if p.pid in found:
                continue
            found[p.pid] = p
            todo.extend(children.get(p.pid, ()))
        # forget pids that are gone, so a reused pid is not mistaken for a member
        self._known = {p.pid: p.starttime for p in found.values()}
        live = [p for p in found.values() if p.alive]
        # A group id stays allocated while the group has a member, so it names our group when its leader is a
        # member, or when it is the root's id and the root's pid was not reused.
        groups = {p.pgid for p in live if p.pgid in found or (ours and p.pgid == self.root_pid)}
        return Tree(live, frozenset(groups))


Scan = Callable[[], Tree]


def scanner(membership: Membership, candidates: Callable[[], Iterable[int]]) -> Scan:
    return lambda: membership.tree(snapshot(candidates()))


def everything(candidates: Callable[[], Iterable[int]]) -> Scan:
    """Every workload process (agent exit, shutdown): all their groups are workload groups."""

    def scan() -> Tree:
        live = [p for p in snapshot(candidates()).values() if p.alive]
        return Tree(live, frozenset(p.pgid for p in live))

    return scan


def _signal_all(tree: Tree, sig: int, skip: set[tuple[int, int]] | None = None) -> None:
    # Whole groups first: one kill(-pgid) reaches every member at once, and the kernel makes a fork racing
    # with it retry, so a forking group (a fork bomb) cannot outrun it the way it outruns a /proc scan.
    for pgid in tree.groups:
        try:
            os.killpg(pgid, sig)
        except OSError:
            pass
    for p in tree.live:
        if skip is None or (p.pid, p.starttime) not in skip:
            send_signal(p, sig)


async def kill_tree(scan: Scan) -> bool:
    """Freeze, then kill, until nothing is left; True when the tree is gone (zombies count as gone)."""
    for _ in range(_MAX_KILL_ROUNDS):
        stopped: set[tuple[int, int]] = set()
        while True:
            tree = scan()
            fresh = [p for p in tree.live if (p.pid, p.starttime) not in stopped]
            if not fresh:
                break
            _signal_all(Tree(fresh, tree.groups), signal.SIGSTOP)
            stopped.update((p.pid, p.starttime) for p in fresh)
        tree = scan()
        if not tree.live:
            return True
        _signal_all(tree, signal.SIGKILL)
        await trio.sleep(0.005)
        if not scan().live:
            return True
    return False


async def terminate_tree(scan: Scan, grace_s: float) -> bool:
    """SIGTERM, grace, then freeze-and-kill (§2.6 steps 2–3). True when nothing of the tree is left."""
    signalled: set[tuple[int, int]] = set()
    deadline = trio.current_time() + grace_s
    while True:
        tree = scan()
        if not tree.live:
            return True
        fresh = [p for p in tree.live if (p.pid, p.starttime) not in signalled]
        if fresh:
            _signal_all(Tree(fresh, tree.groups), signal.SIGTERM)
            _signal_all(Tree(fresh, tree.groups), signal.SIGCONT)
            signalled.update((p.pid, p.starttime) for p in fresh)
        if trio.current_time() >= deadline:
            break
        await trio.sleep(min(POLL_S, max(0.0, deadline - trio.current_time())))
    return await kill_tree(scan)
