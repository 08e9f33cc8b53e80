"""The boundary's table of workload processes: handles, wait results, signals, terminate (spec §2.3–§2.8).

Size (over ~500 lines on purpose): handles, results, signals and terminate all act on the one table's entries.

Rules:

1. A handle is ``p_`` + 16 random hex digits, issued once per process instance and never reused; it is pinned
   to the instance by the pidfd the launcher returned. No operation takes a pid.
2. The launcher is the one reaper; each process has one watcher task here that awaits its raw wait status and
   turns it into the §2.5 result, which never changes afterwards.
3. Signals go through the pidfd only (``pidfd_send_signal``), from the closed allow-list; a process whose
   result is known answers ``terminated``.
4. The agent's exit (any code, any signal) ends the table: every other workload process is terminated within
   1 s (``end_all``) and further ``start`` calls answer ``terminated``; ``wait`` keeps answering. A result that
   says we ended a process (``agent-exit``, ``terminated``, ``timeout``) is published only once the sweep that
   ends its tree is over: never while one of its members still runs.
5. Results are retained for ``retention_s`` after exit or for the newest ``retention_count`` exits, whichever
   keeps more (the agent's forever); a pruned handle answers ``terminated`` with reason ``not-retained``.
6. Live exec processes are capped at ``max_execs``; beyond it ``start`` answers ``unavailable``.
7. A process that died of SIGKILL nobody here sent, while the workload memory cgroup's OOM-kill counter
   (``oom_kills``) went up since it started, ends with reason ``oom-killed``: the kernel killed it at the
   workload's memory limit. (Another workload process killed for memory while this one was SIGKILLed by one of
   its own is read the same way: both need the agent's doing.)
"""

from __future__ import annotations

import collections
import math
import os
import secrets
import select
import signal as _signal
from collections.abc import Callable
from typing import Any, Final, Protocol

import trio

from supervisor.boundary.process.description import Kind, ProcessDescription
from supervisor.boundary.process.exec_session import ExecOutput, OutputStream, OwnedFd, set_winsize
from supervisor.boundary.process.terminate import (
    Membership,
    Scan,
    everything,
    kill_tree,
    read_stat,
    scanner,
    terminate_tree,
)
from supervisor.jsonlog import JsonLog, now_rfc3339
from supervisor.protocol.channel import Stderr, Stdout
from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.event_names import EventName
from supervisor.protocol.exit_codes import ExitCode, for_signal
from supervisor.protocol.exit_result import EndReason, ExitResult
from supervisor.protocol.process_ops import SignalScope, signal_number

__all__ = ["EndReason", "ProcessEntry", "ProcessTable", "render_result"]

END_ALL_GRACE_S: Final = 0.3
_EXIT_REPORT_S: Final = 2.0
_PIDFD_SIGNAL_PROCESS_GROUP: Final = 1 << 2  # Linux 6.9+


# -- what the table needs from the launcher (supervisor.boundary.process.launcher) ---------------------------


class SpawnedLike(Protocol):
    pid: int
    pidfd: int
    stdin: int | None
    stdout: int | None
    stderr: int | None
    pty_master: int | None

    async def wait_status(self) -> int: ...


class LauncherLike(Protocol):
    async def spawn(self, spec: Any, *, own_pidns: bool = False) -> Any: ...

    def workload_pids(self) -> set[int]: ...

    async def kill_all(self) -> None: ...

    def collect_returning(self) -> None: ...


def render_result(handle: str, status: int | None, reason: EndReason) -> ExitResult:
    """The §2.5 wait object from a raw wait status (``None``: the status was lost; reported as KILL)."""
    code: int | None = None
    number: int | None = None
    core = False
    if status is not None and os.WIFEXITED(status):
        code = os.WEXITSTATUS(status)
    elif status is not None and os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        core = os.WCOREDUMP(status)
    else:
        number = int(_signal.SIGKILL)
    name: str | None = None
    if number is not None:
        try:
            name = _signal.Signals(number).name.removeprefix("SIG")
        except ValueError:
            name = str(number)
    rendered = code if code is not None else for_signal(number or 0)
    if reason is EndReason.TIMEOUT:
        rendered = ExitCode.TIMEOUT  # as timeout(1) reports it; the signal fields still say what ended the process
    return ExitResult(
        handle=handle,
        code=code,
        signal=name,
        signal_number=number,
        rendered=rendered,
        core_dumped=core,
        reason=reason,
        ended_at=now_rfc3339(),
    )


def _pidfd_exited(pidfd: int) -> bool:
    readable, _, _ = select.select([pidfd], [], [], 0)
    return bool(readable)


class ProcessEntry:
    """One process the boundary started; lives in the table until its result is no longer retained."""

    def __init__(self, table: ProcessTable, handle: str, kind: Kind, spawned: SpawnedLike) -> None:
        self._table = table
        self.handle = handle
        self.kind: Kind = kind
        self.pid = spawned.pid
        # pid is the init of the process's own PID namespace (R, U execs): it forwards signals to the command
        self.nested = bool(getattr(spawned, "nested", False))
        self.started_at = now_rfc3339()
        self.argv: tuple[str, ...] = ()  # as it was asked for (status shows it, placeholders redacted)
        self._pidfd: int | None = spawned.pidfd
        stat = read_stat(spawned.pid)
        trusted = stat is not None and not _pidfd_exited(spawned.pidfd)
        self.membership = Membership(spawned.pid, stat.starttime if stat and trusted else None)
        self.pty = OwnedFd(spawned.pty_master) if spawned.pty_master is not None else None
        self._stdin = OwnedFd(spawned.stdin) if spawned.stdin is not None and self.pty is None else None
        for fd in (self._stdin, self.pty):
            if fd is not None:
                os.set_blocking(fd.fileno(), False)  # an event loop never blocks on a child's stdin
        streams: list[OutputStream] = []
        if self.pty is not None:
            streams.append(OutputStream(self.pty, Stdout, owns_fd=False))
        else:
            if spawned.stdout is not None:
                streams.append(OutputStream(OwnedFd(spawned.stdout), Stdout))
            if spawned.stderr is not None:
                streams.append(OutputStream(OwnedFd(spawned.stderr), Stderr))
        self.output = ExecOutput(streams) if streams else None
        self.result: ExitResult | None = None
        self.exited = trio.Event()
        self.ended_at = math.inf  # trio clock
        self.end_reason: EndReason | None = None  # why we are ending it, once we are
        # set once the sweep that ends it (terminate, timeout, end_all) is over: a result that says we ended the
        # process is published only then, never while a member of its tree still runs (rule 4)
        self.swept = trio.Event()
        self.oom_baseline: int | None = None  # the memory cgroup's OOM kills before it started (rule 7)

    # -- state ----------------------------------------------------------------------------------------------

    @property
    def tty(self) -> bool:
        return self.pty is not None

    @property
    def stdin_fd(self) -> OwnedFd | None:
        return self.pty if self.pty is not None else self._stdin

    def require_running(self) -> None:
        if self.result is not None:
            raise OpError(ErrorKind.TERMINATED, "process has exited", field="handle")

    async def wait_result(self) -> ExitResult:
        await self.exited.wait()
        assert self.result is not None
        return self.result

    def log_event(self, event: EventName, **fields: Any) -> None:
        self._table.log.emit(event, handle=self.handle, kind=self.kind, **fields)

    def describe(self) -> ProcessDescription:
        """For status and resume: never a pid (spec invariant 4)."""
        return ProcessDescription(
            handle=self.handle,
            kind=self.kind,
            argv=self.argv,
            tty=self.tty,
            started_at=self.started_at,
            running=self.result is None,
            stream_attached=bool(self.output and self.output.attached),
        )

    # -- operations -----------------------------------------------------------------------------------------

    def send_signal(self, sig: int, scope: SignalScope = SignalScope.PROCESS) -> None:
        self.require_running()
        assert self._pidfd is not None
        try:
            if scope is SignalScope.PROCESS:
                _signal.pidfd_send_signal(self._pidfd, sig)
            else:
                self._signal_group(sig)
        except ProcessLookupError:
            raise OpError(ErrorKind.TERMINATED, "process has exited", field="handle") from None
        self.log_event(EventName.PROCESS_SIGNALLED, signal=_signal.Signals(sig).name, scope=str(scope))

    def _signal_group(self, sig: int) -> None:
        assert self._pidfd is not None
        if self.nested:
            # The command leads its own session and group under its namespace's init (our pid): that group.
            for pid in self._table.launcher.workload_pids():
                stat = read_stat(pid)
                if stat is not None and stat.ppid == self.pid and stat.sid == pid and stat.pgid == pid:
                    os.killpg(pid, sig)
                    return
            raise ProcessLookupError(3, "no process group")
        try:
            _signal.pidfd_send_signal(self._pidfd, sig, None, _PIDFD_SIGNAL_PROCESS_GROUP)
        except OSError as exc:
            if exc.errno not in (22, 95):  # EINVAL / EOPNOTSUPP: kernel older than 6.9
                raise
            # The root leads its own session and group (the launcher calls setsid), and a group id stays
            # allocated while the group has members, so the root's pid names the group while it runs.
            os.killpg(self.pid, sig)

    def resize(self, cols: int, rows: int) -> None:
        if self.pty is None:
            raise OpError(ErrorKind.INVALID, "process has no terminal", field="handle")
        self.require_running()
        if not (1 <= cols <= 0xFFFF and 1 <= rows <= 0xFFFF):
            raise OpError(ErrorKind.INVALID, "terminal size out of range", field="cols")
        set_winsize(self.pty, cols, rows)

    def close_stdin(self) -> None:
        if self._stdin is not None:
            self._stdin.close()

    # -- lifecycle (table only) -----------------------------------------------------------------------------

    def _finish(self, status: int | None) -> None:
        if self.result is not None:
            return
        self.result = render_result(self.handle, status, self.end_reason or EndReason.EXITED)
        self.ended_at = trio.current_time()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        self.close_stdin()
        if self.output is not None:
            self.output.process_exited()
        self.exited.set()

    def _release(self, *, force: bool = False) -> None:
        """Close the fds once the output is drained, or now (``force``: pruned, or the table ended)."""
        if self.output is not None and not (force or self.output.done):
            return
        if self.output is not None:
            for s in self.output.streams:
                s.fd.close()  # wakes a reader still waiting on it; it then reports EOF
        if self.pty is not None:
            self.pty.close()

    def scan(self) -> Scan:
        return scanner(self.membership, self._table.launcher.workload_pids)


class ProcessTable:
    def __init__(
        self,
        launcher: LauncherLike,
        *,
        log: JsonLog,
        max_execs: int = 64,
        retention_s: float = 600,
        retention_count: int = 1024,
    ) -> None:
        self.launcher = launcher
        self.log = log
        self.max_execs = max_execs
        self.retention_s = retention_s
        self.retention_count = retention_count
        self.agent: ProcessEntry | None = None
        self.agent_exited = trio.Event()
        self._entries: dict[str, ProcessEntry] = {}
        self._finished: collections.deque[ProcessEntry] = collections.deque()
        self._live_execs = 0  # exec entries without a result (rule 6): counted, not found among retained ones
        self._issued: set[str] = set()
        self._starting = 0
        self._starting_agent = False
        self._ended: str | None = None
        self._nursery: trio.Nursery | None = None
        self.oom_kills: Callable[[], int | None] | None = None  # the memory cgroup's OOM-kill counter (rule 7)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the per-process tasks (watchers, output readers, timeouts) for the table's lifetime."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None

    # -- start ----------------------------------------------------------------------------------------------

    def _new_handle(self) -> str:
        while True:
            handle = "p_" + secrets.token_hex(8)
            if handle not in self._issued:
                self._issued.add(handle)
                return handle

    async def start(self, spec: Any, *, kind: Kind, timeout_s: float = 0, grace_s: float = 5) -> ProcessEntry:
        """Launch ``spec`` (a launcher ``SpawnSpec``); returns once the process has exec'd."""
        nursery = self._nursery
        if nursery is None:
            raise RuntimeError("ProcessTable.run() is not running")
        asked = trio.current_time()
        if self._ended is not None or self.agent_exited.is_set():
            raise OpError(ErrorKind.TERMINATED, "the agent has exited; no process can be started")
        if kind == "agent" and (self.agent is not None or self._starting_agent):
            raise OpError(ErrorKind.INVALID, "the agent was already started")
        if kind == "exec" and self._live_execs + self._starting >= self.max_execs:
            raise OpError(ErrorKind.UNAVAILABLE, f"too many running exec processes (limit {self.max_execs})")
        self._prune()
        self._starting += 1
        self._starting_agent = self._starting_agent or kind == "agent"
        oom_baseline = self.oom_kills() if self.oom_kills is not None else None
        try:
            # An exec gets a PID namespace of its own: terminate ends all it started (setsid, double forks).
            spawned = await self.launcher.spawn(spec, own_pidns=kind == "exec")
        except Exception as exc:
            if kind == "agent":
                self._starting_agent = False
            raise self._spawn_error(exc) from exc
        finally:
            self._starting -= 1
        entry = ProcessEntry(self, self._new_handle(), kind, spawned)
        entry.argv = tuple(spec.argv)
        entry.oom_baseline = oom_baseline
        self._entries[entry.handle] = entry
        if kind == "exec":
            self._live_execs += 1
        if kind == "agent":
            self.agent = entry
        if entry.output is not None:
            # Nobody streams a piped agent's output: it goes to the log. An agent's terminal is streamed to the
            # client that attaches to it (dev mode's terminal): held for it, never logged (keystrokes echo there).
            logged = kind == "agent" and not entry.tty
            entry.output.set_lossy(logged)
            if logged:
                for s in entry.output.streams:
                    s.on_chunk = self._agent_output_logger(entry, s.frame.__name__.lower())
            nursery.start_soon(self._run_output, entry)
        nursery.start_soon(self._watch, entry, spawned)
        if timeout_s > 0:
            nursery.start_soon(self._timeout, entry, timeout_s, grace_s)
        # start_ms: asked to exec'd, the boundary's share of an exec's latency (the exec histogram on /metrics)
        took_ms = round((trio.current_time() - asked) * 1000, 3)
        entry.log_event(EventName.PROCESS_STARTED, tty=entry.tty, start_ms=took_ms)
        if self._ended is not None:  # the table ended while we were spawning: this one goes too
            nursery.start_soon(self._terminate_entry, entry, 0.0, EndReason.AGENT_EXIT)
            raise OpError(ErrorKind.TERMINATED, "the agent has exited; no process can be started")
        return entry

    def _spawn_error(self, exc: BaseException) -> OpError:
        if isinstance(exc, OpError):
            return exc
        stage = getattr(exc, "stage", None)
        err = getattr(exc, "errno", None)
        reason = f"launch failed: {exc}"
        if isinstance(err, int) and err > 0:
            reason = f"launch failed at {stage or 'spawn'}: {os.strerror(err)}"
        self.log.emit(EventName.PROCESS_START_FAILED, stage=stage, errno=err, reason=str(exc))
        return OpError(
            ErrorKind.FAILED,
            reason,
            stage=stage if isinstance(stage, str) else None,
            errno=err if isinstance(err, int) else None,
        )

    def _agent_output_logger(self, entry: ProcessEntry, stream: str) -> Callable[[bytes], None]:
        def log_chunk(data: bytes) -> None:
            entry.log_event(EventName.PROCESS_OUTPUT, stream=stream, text=data.decode("utf-8", "replace"))

        return log_chunk

    # -- per-process tasks ----------------------------------------------------------------------------------

    async def _run_output(self, entry: ProcessEntry) -> None:
        assert entry.output is not None
        try:
            await entry.output.run()
        finally:
            if entry.result is not None:
                entry._release()

    async def _watch(self, entry: ProcessEntry, spawned: SpawnedLike) -> None:
        status: int | None
        try:
            status = await spawned.wait_status()
        except trio.Cancelled:
            raise
        except Exception as exc:  # the launcher is gone; the process is too (its init or zygote died)
            self.log.emit(EventName.PROCESS_EXITED, handle=entry.handle, error=f"status lost: {exc}")
            status = None
        if entry.end_reason is not None:  # we are ending it: its members may still be going
            await entry.swept.wait()
        elif self._oom_killed(entry, status):
            entry.end_reason = EndReason.OOM_KILLED
        self._finished_entry(entry, status)
        result = await entry.wait_result()
        if entry.kind == "exec":
            await trio.lowlevel.checkpoint()  # the stream's EXIT goes first; the event and the spare can wait
        entry.log_event(EventName.PROCESS_EXITED, code=result.code, signal=result.signal, reason=str(result.reason))
        if entry.kind == "exec":  # its exec-init is back as a spare by now, usually: filed off the next exec's path
            self.launcher.collect_returning()
        if entry.kind == "agent":
            self.agent_exited.set()
            await self.end_all(EndReason.AGENT_EXIT)

    def _oom_killed(self, entry: ProcessEntry, status: int | None) -> bool:
        """Rule 7: a SIGKILL we did not send, and the memory cgroup counted an OOM kill since it started."""
        if status is None or not os.WIFSIGNALED(status) or os.WTERMSIG(status) != _signal.SIGKILL:
            return False
        if self.oom_kills is None or entry.oom_baseline is None:
            return False
        now = self.oom_kills()
        return now is not None and now > entry.oom_baseline

    def _finished_entry(self, entry: ProcessEntry, status: int | None) -> None:
        if entry.result is not None:
            return
        entry._finish(status)
        entry._release()
        if entry.kind == "exec":
            self._live_execs -= 1
            self._finished.append(entry)

    async def _timeout(self, entry: ProcessEntry, timeout_s: float, grace_s: float) -> None:
        with trio.move_on_after(timeout_s):
            await entry.exited.wait()
            return
        await self._terminate_entry(entry, grace_s, EndReason.TIMEOUT)

    # -- lookup and retention ---------------------------------------------------------------------------------

    def entry(self, handle: str) -> ProcessEntry:
        self._prune()
        found = self._entries.get(handle)
        if found is not None:
            return found
        if handle in self._issued:
            raise OpError(ErrorKind.TERMINATED, "not-retained", field="handle")
        raise OpError(ErrorKind.INVALID, "unknown handle", field="handle")

    def _prune(self) -> None:
        """Rule 5. ``_finished`` holds exited exec entries in the order they ended."""
        cutoff = trio.current_time() - self.retention_s
        while len(self._finished) > self.retention_count and self._finished[0].ended_at < cutoff:
            e = self._finished[0]
            if e.output is not None and e.output.attached:
                break  # a stream is still delivering it; look again later
            self._finished.popleft()
            e._release(force=True)
            del self._entries[e.handle]

    def live(self) -> list[ProcessDescription]:
        return [e.describe() for e in self._entries.values() if e.result is None]

    # -- operations -----------------------------------------------------------------------------------------

    async def wait(self, handle: str, timeout_s: float | None) -> ExitResult:
        entry = self.entry(handle)
        if entry.result is not None:
            await trio.lowlevel.checkpoint()
            return entry.result
        with trio.move_on_after(math.inf if timeout_s is None else timeout_s):
            return await entry.wait_result()
        raise OpError(ErrorKind.UNAVAILABLE, "timeout", field="timeout_s")

    def signal(self, handle: str, signal_name: str, scope: str = "process") -> None:
        sig = signal_number(signal_name)
        try:
            where = SignalScope(scope)
        except ValueError:
            raise OpError(ErrorKind.INVALID, 'must be "process" or "group"', field="scope") from None
        self.entry(handle).send_signal(sig, where)

    def resize(self, handle: str, cols: int, rows: int) -> None:
        self.entry(handle).resize(cols, rows)

    async def terminate(self, handle: str, grace_s: float = 5) -> ExitResult:
        entry = self.entry(handle)
        if entry.result is not None:
            # Already ended: still sweep what it left in its session, but the answer is "terminated".
            await kill_tree(entry.scan())
            raise OpError(ErrorKind.TERMINATED, "process has exited", field="handle")
        await self._terminate_entry(entry, grace_s, EndReason.TERMINATED)
        return await entry.wait_result()

    async def _terminate_entry(self, entry: ProcessEntry, grace_s: float, reason: EndReason) -> None:
        if entry.result is None and entry.end_reason is None:
            entry.end_reason = reason
        entry.log_event(EventName.PROCESS_TERMINATE, grace_s=grace_s, reason=str(reason))
        try:
            gone = await terminate_tree(entry.scan(), grace_s)
        finally:
            entry.swept.set()
        if not gone:
            entry.log_event(EventName.PROCESS_LEFTOVER, reason="members survived freeze-and-kill")
        with trio.move_on_after(_EXIT_REPORT_S):
            await entry.exited.wait()
        if entry.result is None and entry._pidfd is not None and _pidfd_exited(entry._pidfd):
            self._finished_entry(entry, None)  # dead, but the launcher never reported its status

    async def end_all(self, reason: str, *, kill: bool = False) -> None:
        """Terminate every workload process within about a second (agent exit, shutdown); ``kill``: SIGKILL
        at once, no SIGTERM and no grace (enforcement lost)."""
        if self._ended is not None:
            return
        self._ended = reason
        try:
            why = EndReason(reason)
        except ValueError:
            why = EndReason.TERMINATED  # e.g. "shutdown"
        for e in self._entries.values():
            if e.result is None and e.end_reason is None:
                e.end_reason = why
        self.log.emit(EventName.PROCESS_END_ALL, reason=reason, live=len(self.live()))
        try:
            if not kill:
                with trio.move_on_after(1.0):
                    await terminate_tree(everything(self.launcher.workload_pids), END_ALL_GRACE_S)
            try:
                await self.launcher.kill_all()  # the backstop: the workload PID namespace or every descendant
            except Exception as exc:
                self.log.emit(EventName.PROCESS_END_ALL, reason=reason, error=f"launcher kill_all failed: {exc}")
            with trio.move_on_after(_EXIT_REPORT_S):
                await kill_tree(everything(self.launcher.workload_pids))  # until the last one is dead
        finally:
            for e in self._entries.values():
                e.swept.set()
        with trio.move_on_after(_EXIT_REPORT_S):
            for e in list(self._entries.values()):
                await e.exited.wait()
        for e in list(self._entries.values()):
            if e.result is None:
                self._finished_entry(e, None)
                e._release(force=True)
