"""Process table + exec pump against a fake launcher (no root needed): the table's own logic.

The fake launcher forks with subprocess (a new session per process, ``setsid -c`` for a PTY) and reaps with
waitpid on the pidfd; the same tests run against B1's real launcher in test_process_table_real.py.
"""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import subprocess
import termios
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
import trio.testing

from supervisor.boundary.process.exec_session import pump_exec
from supervisor.boundary.process.table import ProcessEntry, ProcessTable
from supervisor.boundary.process.terminate import Membership, ProcStat, read_stat
from supervisor.jsonlog import JsonLog
from supervisor.protocol.channel import (
    CLOSED,
    NEED_DATA,
    ChannelDecoder,
    Direction,
    Error,
    Exit,
    Lagged,
    Resize,
    Stderr,
    Stdin,
    StdinEof,
    Stdout,
    encode_frame,
)
from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.exit_result import ExitResult
from tests.waiting import await_until, wait_until


@dataclass(frozen=True)
class Spec:
    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=lambda: {"PATH": "/usr/bin:/bin"})
    cwd: str = "/"
    tty: bool = False
    cols: int = 80
    rows: int = 24
    stdin: str = "pipe"


class SpawnFailed(Exception):
    def __init__(self, stage: str, errno: int) -> None:
        super().__init__(f"{stage}: {os.strerror(errno)}")
        self.stage = stage
        self.errno = errno


@dataclass
class FakeSpawned:
    pid: int
    pidfd: int
    stdin: int | None
    stdout: int | None
    stderr: int | None
    pty_master: int | None

    async def wait_status(self) -> int:
        await trio.lowlevel.wait_readable(self.pidfd)
        _, status = os.waitpid(self.pid, 0)  # noqa: ASYNC222 - a zombie already: returns at once
        return status


class FakeLauncher:
    def __init__(self) -> None:
        self.roots: set[int] = set()
        self.killed = False

    async def spawn(self, spec: Any, *, own_pidns: bool = False) -> FakeSpawned:
        argv = list(spec.argv)
        try:
            if spec.tty:
                master, slave = os.openpty()
                fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", spec.rows, spec.cols, 0, 0))
                proc = subprocess.Popen(  # noqa: ASYNC220
                    ["setsid", "-c", *argv], stdin=slave, stdout=slave, stderr=slave,
                    env=dict(spec.env), cwd=spec.cwd,
                )  # fmt: skip
                os.close(slave)
                fds: tuple[int | None, ...] = (None, None, None, master)
            else:
                stdin = subprocess.PIPE if spec.stdin == "pipe" else subprocess.DEVNULL
                proc = subprocess.Popen(  # noqa: ASYNC220
                    argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    env=dict(spec.env), cwd=spec.cwd, start_new_session=True,
                )  # fmt: skip
                fds = (
                    os.dup(proc.stdin.fileno()) if proc.stdin else None,
                    os.dup(proc.stdout.fileno()) if proc.stdout else None,
                    os.dup(proc.stderr.fileno()) if proc.stderr else None,
                    None,
                )
                for f in (proc.stdin, proc.stdout, proc.stderr):
                    if f is not None:
                        f.close()
        except FileNotFoundError as exc:
            raise SpawnFailed("execve", exc.errno) from None
        except PermissionError as exc:
            raise SpawnFailed("execve", exc.errno) from None
        proc.returncode = 0  # the table reaps; stop Popen.__del__ from trying
        self.roots.add(proc.pid)
        return FakeSpawned(proc.pid, os.pidfd_open(proc.pid), *fds)

    def collect_returning(self) -> None:
        pass  # no spares here

    def workload_pids(self) -> set[int]:
        """Descendants of what this fake spawned, and whatever stays in their sessions (orphans reparent
        away from the test process). Never the test's other children, such as real launchers."""
        stats = [s for s in (read_stat(int(p)) for p in os.listdir("/proc") if p.isdigit()) if s is not None]
        children: dict[int, list[int]] = {}
        for s in stats:
            children.setdefault(s.ppid, []).append(s.pid)
        out: set[int] = set()
        todo = [s.pid for s in stats if s.pid in self.roots or s.sid in self.roots]
        while todo:
            pid = todo.pop()
            if pid not in out:
                out.add(pid)
                todo.extend(children.get(pid, ()))
        return out

    async def kill_all(self) -> None:
        self.killed = True
        for pid in self.workload_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# -- shared helpers (used by the real-launcher tests too) -----------------------------------------------------


@dataclass
class Collected:
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    exit: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    lagged: int = 0
    frames: int = 0


async def collect(stream: trio.abc.ReceiveStream, out: Collected) -> None:
    dec = ChannelDecoder(Direction.TO_CLIENT)
    while True:
        ev = dec.next_frame()
        if ev is NEED_DATA:
            try:
                dec.receive_data(await stream.receive_some(1 << 16))
            except trio.BrokenResourceError:
                dec.receive_data(b"")
            continue
        if ev is CLOSED:
            return
        out.frames += 1
        match ev:
            case Stdout(data):
                out.stdout += data
            case Stderr(data):
                out.stderr += data
            case Exit(result):
                out.exit = result.to_wire()
            case Error(error):
                out.error = error.to_json()
            case Lagged(n):
                out.lagged += n


async def run_exec(
    table: ProcessTable, spec: Any, send: Sequence[Any] = (), *, timeout_s: float = 0, grace_s: float = 5
) -> tuple[Collected, ProcessEntry]:
    entry = await table.start(spec, kind="exec", timeout_s=timeout_s, grace_s=grace_s)
    client, server = trio.testing.memory_stream_pair()
    out = Collected()
    async with trio.open_nursery() as n:
        n.start_soon(pump_exec, entry, server)
        for ev in send:
            await client.send_all(encode_frame(ev))
        await collect(client, out)
    return out, entry


class BrokenStream(trio.abc.HalfCloseableStream):
    """A carrier that died: every operation fails as a reset connection would."""

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        raise trio.BrokenResourceError("reset")

    async def wait_send_all_might_not_block(self) -> None:
        raise trio.BrokenResourceError("reset")

    async def send_eof(self) -> None:
        raise trio.BrokenResourceError("reset")

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        raise trio.BrokenResourceError("reset")

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


@pytest.fixture
async def fake_table() -> AsyncIterator[ProcessTable]:
    log = JsonLog("boundary", stream=open(os.devnull, "w"))  # noqa: SIM115, ASYNC230
    table = ProcessTable(FakeLauncher(), log=log, retention_count=4, retention_s=0.5)
    async with trio.open_nursery() as n:
        await n.start(table.run)
        yield table
        n.cancel_scope.cancel()


async def wait_for(predicate: Callable[[], bool]) -> None:
    with trio.fail_after(5):
        while not predicate():  # noqa: ASYNC110 - polling output a collector task fills
            await trio.sleep(0.01)


def sh(script: str, **kw: Any) -> Spec:
    return Spec(["/bin/sh", "-c", script], **kw)


# -- tests ----------------------------------------------------------------------------------------------------


async def test_exit_codes_and_separate_streams(fake_table: ProcessTable) -> None:
    out, entry = await run_exec(fake_table, sh("echo out; echo err >&2; exit 7"))
    assert (bytes(out.stdout), bytes(out.stderr)) == (b"out\n", b"err\n")
    assert out.exit is not None
    assert (out.exit["code"], out.exit["signal"], out.exit["rendered"], out.exit["reason"]) == (7, None, 7, "exited")
    assert (
        out.exit
        == (await fake_table.wait(entry.handle, None)).to_wire()
        == (await fake_table.wait(entry.handle, 0)).to_wire()
    )
    assert out.exit["handle"] == entry.handle and entry.handle.startswith("p_") and len(entry.handle) == 18


async def test_signal_result(fake_table: ProcessTable) -> None:
    out, _ = await run_exec(fake_table, sh("kill -KILL $$"))
    assert out.exit is not None
    assert (out.exit["code"], out.exit["signal"], out.exit["signal_number"], out.exit["rendered"]) == (
        None, "KILL", 9, 137,
    )  # fmt: skip


async def test_stdin_and_eof(fake_table: ProcessTable) -> None:
    out, _ = await run_exec(fake_table, Spec(["cat"]), [Stdin(b"hello "), Stdin(b"world"), StdinEof()])
    assert bytes(out.stdout) == b"hello world"
    assert out.exit is not None and out.exit["code"] == 0


async def test_large_output_complete(fake_table: ProcessTable) -> None:
    expected = b"".join(b"%d\n" % i for i in range(1, 100001))
    out, _ = await run_exec(fake_table, Spec(["seq", "1", "100000"]))
    assert bytes(out.stdout) == expected


async def test_backpressure_slow_client_loses_nothing(fake_table: ProcessTable) -> None:
    entry = await fake_table.start(Spec(["seq", "1", "200000"]), kind="exec")
    client, server = trio.testing.lockstep_stream_pair()
    got = bytearray()
    async with trio.open_nursery() as n:
        n.start_soon(pump_exec, entry, server)
        dec = ChannelDecoder(Direction.TO_CLIENT)
        done = False
        while not done:
            await trio.sleep(0.001)  # a slow reader
            chunk = await client.receive_some(4096)
            dec.receive_data(chunk)
            while (ev := dec.next_frame()) not in (NEED_DATA, CLOSED):
                if isinstance(ev, Stdout):
                    got += ev.data
                done = done or isinstance(ev, Exit) or not chunk
            if not chunk:
                break
    assert bytes(got) == b"".join(b"%d\n" % i for i in range(1, 200001))


async def test_pty_size_and_resize(fake_table: ProcessTable) -> None:
    spec = sh("stty size; read line; stty size; echo err >&2", tty=True, cols=100, rows=30)
    entry = await fake_table.start(spec, kind="exec")
    client, server = trio.testing.memory_stream_pair()
    out = Collected()
    async with trio.open_nursery() as n:
        n.start_soon(pump_exec, entry, server)
        n.start_soon(collect, client, out)
        await wait_for(lambda: b"30 100" in out.stdout)
        await client.send_all(encode_frame(Resize(132, 43)) + encode_frame(Stdin(b"go\n")))
    text = bytes(out.stdout).replace(b"\r\n", b"\n")
    assert text == b"30 100\ngo\n43 132\nerr\n"  # one merged stream, with the terminal's echo
    assert out.stderr == b""
    with pytest.raises(OpError) as info:
        fake_table.resize(entry.handle, 10, 10)
    assert info.value.kind is ErrorKind.TERMINATED


async def test_resize_delivers_sigwinch(fake_table: ProcessTable) -> None:
    script = "trap 'stty size; exit 0' WINCH; echo ready; while :; do sleep 0.05; done"
    entry = await fake_table.start(sh(script, tty=True), kind="exec")
    client, server = trio.testing.memory_stream_pair()
    out = Collected()
    async with trio.open_nursery() as n:
        n.start_soon(pump_exec, entry, server)
        n.start_soon(collect, client, out)
        await wait_for(lambda: b"ready" in out.stdout)
        fake_table.resize(entry.handle, 77, 11)
    assert b"11 77" in out.stdout


async def test_resize_without_pty_is_invalid(fake_table: ProcessTable) -> None:
    entry = await fake_table.start(Spec(["sleep", "5"]), kind="exec")
    with pytest.raises(OpError) as info:
        fake_table.resize(entry.handle, 80, 24)
    assert info.value.kind is ErrorKind.INVALID
    await fake_table.terminate(entry.handle, 0)


async def test_signal_and_exited_handle(fake_table: ProcessTable) -> None:
    entry = await fake_table.start(Spec(["sleep", "30"]), kind="exec")
    fake_table.signal(entry.handle, "TERM")
    result = (await fake_table.wait(entry.handle, 5)).to_wire()
    assert (result["signal"], result["rendered"], result["reason"]) == ("TERM", 143, "exited")
    for name in ("TERM", "KILL"):
        with pytest.raises(OpError) as info:
            fake_table.signal(entry.handle, name)
        assert info.value.kind is ErrorKind.TERMINATED
    with pytest.raises(OpError) as info:
        fake_table.signal(entry.handle, "SEGV")
    assert info.value.kind is ErrorKind.INVALID


async def test_unknown_handle_and_wait_timeout(fake_table: ProcessTable) -> None:
    with pytest.raises(OpError) as info:
        await fake_table.wait("p_0000000000000000", 0)
    assert info.value.kind is ErrorKind.INVALID
    entry = await fake_table.start(Spec(["sleep", "30"]), kind="exec")
    with pytest.raises(OpError) as info:
        await fake_table.wait(entry.handle, 0.05)
    assert (info.value.kind, info.value.reason) == (ErrorKind.UNAVAILABLE, "timeout")
    assert entry.result is None  # unaffected
    result = (await fake_table.terminate(entry.handle, 1)).to_wire()
    assert (result["signal"], result["reason"]) == ("TERM", "terminated")


async def test_terminate_kills_descendants_and_ignorers(fake_table: ProcessTable) -> None:
    script = "trap '' TERM; (trap '' TERM; sleep 60 & sleep 60) & sleep 60 & echo started; wait"
    entry = await fake_table.start(sh(script), kind="exec")
    await await_until(lambda: len(running_sleeps(entry)) == 3, "the three sleeps running")
    tree = entry.scan()().live
    assert len(tree) >= 4
    result = (await fake_table.terminate(entry.handle, 0.2)).to_wire()
    assert (result["signal"], result["reason"]) == ("KILL", "terminated")
    assert all(read_stat(p.pid) is None or read_stat(p.pid).state == "Z" for p in tree)  # type: ignore[union-attr]


async def test_timeout(fake_table: ProcessTable) -> None:
    out, _ = await run_exec(fake_table, Spec(["sleep", "30"]), timeout_s=0.2)
    assert out.exit is not None
    assert (out.exit["reason"], out.exit["rendered"], out.exit["signal"]) == ("timeout", 124, "TERM")


async def test_drain_cut_when_grandchild_holds_pipe(fake_table: ProcessTable) -> None:
    with trio.fail_after(6):
        out, entry = await run_exec(fake_table, sh("sleep 30 & echo last; exit 3"))
    assert bytes(out.stdout) == b"last\n"
    assert out.exit is not None and out.exit["code"] == 3
    with pytest.raises(OpError):
        await fake_table.terminate(entry.handle, 0)
    assert entry.scan()().live == []  # the leftover sleep was swept


async def test_stream_break_keeps_process_and_reattach(fake_table: ProcessTable) -> None:
    entry = await fake_table.start(sh("read x; echo got $x; exit 5"), kind="exec")
    async with trio.open_nursery() as n:  # control drops mid-exec: its stream handler is cancelled
        _, server = trio.testing.memory_stream_pair()
        n.start_soon(pump_exec, entry, server)
        output = entry.output
        assert output is not None
        await await_until(lambda: output.attached, "the stream attached")
        n.cancel_scope.cancel()
    await pump_exec(entry, BrokenStream())  # or the stream itself breaks
    assert entry.result is None  # (and the reattach below proves the same process kept running)
    assert [e.handle for e in fake_table.live()] == [entry.handle]
    # a resumed control re-attaches and finishes the conversation
    out = Collected()
    client, server = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as n:
        n.start_soon(pump_exec, entry, server)
        await client.send_all(encode_frame(Stdin(b"again\n")))
        await collect(client, out)
    assert bytes(out.stdout) == b"got again\n"
    assert out.exit is not None and out.exit["code"] == 5


async def test_detached_output_is_ring_buffered_and_lagged(fake_table: ProcessTable) -> None:
    entry = await fake_table.start(sh("read x; seq 1 400000; exit 0"), kind="exec")
    await pump_exec(entry, BrokenStream())
    assert entry.stdin_fd is not None
    os.write(entry.stdin_fd.fileno(), b"\n")
    await fake_table.wait(entry.handle, 10)
    out = Collected()
    client, server = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as n:
        n.start_soon(pump_exec, entry, server)
        await collect(client, out)
    total = len(b"".join(b"%d\n" % i for i in range(1, 400001)))
    assert out.lagged > 0 and out.lagged + len(out.stdout) == total
    assert out.stdout.endswith(b"399999\n400000\n")
    assert out.exit is not None


async def test_second_stream_refused(fake_table: ProcessTable) -> None:
    entry = await fake_table.start(Spec(["sleep", "30"]), kind="exec")
    _c1, s1 = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as n:
        n.start_soon(pump_exec, entry, s1)
        output = entry.output
        assert output is not None
        await await_until(lambda: output.attached, "the first stream attached")
        _, s2 = trio.testing.memory_stream_pair()
        with pytest.raises(OpError) as info:
            await pump_exec(entry, s2)
        assert info.value.kind is ErrorKind.UNAVAILABLE
        await fake_table.terminate(entry.handle, 0)


async def test_bad_frame_from_client(fake_table: ProcessTable) -> None:
    entry = await fake_table.start(Spec(["sleep", "30"]), kind="exec")
    client, server = trio.testing.memory_stream_pair()
    out = Collected()
    async with trio.open_nursery() as n:
        n.start_soon(pump_exec, entry, server)
        await client.send_all(encode_frame(Exit(ExitResult.from_wire({"code": 0}))))  # a client forging an exit
        await collect(client, out)
    assert out.exit is None and out.error is not None and out.error["kind"] == "invalid"
    assert entry.result is None  # the process is untouched
    await fake_table.terminate(entry.handle, 0)


async def test_launch_failure(fake_table: ProcessTable) -> None:
    with pytest.raises(OpError) as info:
        await fake_table.start(Spec(["/nonexistent/prog"]), kind="exec")
    assert (info.value.kind, info.value.stage, info.value.errno) == (ErrorKind.FAILED, "execve", 2)


async def test_exec_limit(fake_table: ProcessTable) -> None:
    fake_table.max_execs = 2
    a = await fake_table.start(Spec(["sleep", "30"]), kind="exec")
    b = await fake_table.start(Spec(["sleep", "30"]), kind="exec")
    with pytest.raises(OpError) as info:
        await fake_table.start(Spec(["true"]), kind="exec")
    assert info.value.kind is ErrorKind.UNAVAILABLE
    await fake_table.terminate(a.handle, 0)
    c = await fake_table.start(Spec(["true"]), kind="exec")
    await fake_table.wait(c.handle, 5)
    await fake_table.terminate(b.handle, 0)


async def test_retention(fake_table: ProcessTable) -> None:
    handles = []
    for _ in range(6):
        e = await fake_table.start(Spec(["true"]), kind="exec")
        await fake_table.wait(e.handle, 5)
        handles.append(e.handle)
    assert (await fake_table.wait(handles[0], 0)).code == 0  # within retention_s, all kept

    def pruned() -> bool:
        try:
            fake_table.entry(handles[0])
        except OpError:
            return True
        return False

    await await_until(pruned, "the oldest result pruned once retention_s (0.5 s) passed")
    with pytest.raises(OpError) as info:
        await fake_table.wait(handles[0], 0)
    assert (info.value.kind, info.value.reason) == (ErrorKind.TERMINATED, "not-retained")
    for h in handles[2:]:  # the newest retention_count stay
        assert (await fake_table.wait(h, 0)).code == 0


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def running_sleeps(entry: ProcessEntry) -> list[ProcStat]:
    return [p for p in entry.scan()().live if comm(p.pid) == "sleep"]


def still_alive(members: list[ProcStat]) -> list[ProcStat]:
    """The members (exact instances) not yet dead: zombies and reused pids count as gone."""
    now = [read_stat(p.pid) for p in members]
    return [p for p, n in zip(members, now, strict=True) if n is not None and n.starttime == p.starttime and n.alive]


async def test_agent_exit_ends_everything(fake_table: ProcessTable) -> None:
    agent = await fake_table.start(sh("read x; exit 3"), kind="agent")
    execs = {
        "ignores TERM": await fake_table.start(sh("trap '' TERM; sleep 60"), kind="exec"),
        "background child": await fake_table.start(sh("sleep 60 & sleep 60"), kind="exec"),
        # the root dies at SIGTERM; its member ignores it and lives until the kill after the grace: a result
        # published when the root dies would answer while the member still runs
        "member outlives root": await fake_table.start(sh("(trap '' TERM; exec sleep 60) & exec sleep 61"),
                                                       kind="exec"),
    }  # fmt: skip
    sleeps = {"ignores TERM": 1, "background child": 2, "member outlives root": 2}
    members: dict[str, list[ProcStat]] = {}
    for name, e in execs.items():

        def started(e: ProcessEntry = e, count: int = sleeps[name]) -> bool:
            return len(running_sleeps(e)) == count

        await await_until(started, f"{name}: its {sleeps[name]} sleep(s) running")
        members[name] = e.scan()().live
    with pytest.raises(OpError):
        await fake_table.start(Spec(["true"]), kind="agent")
    assert agent.stdin_fd is not None
    answered: dict[str, tuple[dict[str, Any], list[ProcStat]]] = {}

    async def wait_one(name: str, entry: ProcessEntry) -> None:
        result = (await fake_table.wait(entry.handle, 5)).to_wire()
        answered[name] = (result, still_alive(members[name]))  # at the moment wait answered

    t0 = trio.current_time()
    os.write(agent.stdin_fd.fileno(), b"\n")
    async with trio.open_nursery() as waits:
        for name, entry in execs.items():
            waits.start_soon(wait_one, name, entry)
    await fake_table.agent_exited.wait()
    assert (await fake_table.wait(agent.handle, 0)).code == 3
    assert trio.current_time() - t0 < 3  # target 1 s; margin for a loaded CI machine
    for name, (result, alive) in answered.items():
        assert result["reason"] == "agent-exit", (name, result)
        assert alive == [], f"{name}: wait answered agent-exit while members still ran: {alive}"
    with pytest.raises(OpError) as info:
        await fake_table.start(Spec(["true"]), kind="exec")
    assert info.value.kind is ErrorKind.TERMINATED
    assert fake_table.live() == []


# -- membership (pure: driven by synthetic /proc snapshots) ---------------------------------------------------


def st(pid: int, ppid: int, pgid: int, sid: int, state: str = "S", start: int = 100) -> ProcStat:
    return ProcStat(pid, ppid, pgid, sid, state, start)


def snap(*stats: ProcStat) -> dict[int, ProcStat]:
    return {s.pid: s for s in stats}


def test_membership_session_group_and_descendants() -> None:
    m = Membership(10, 100)
    tree = m.tree(snap(
        st(10, 1, 10, 10),            # the root
        st(11, 10, 10, 10),           # a child
        st(12, 11, 12, 12),           # a grandchild that called setsid: still a descendant
        st(13, 1, 10, 10),            # an orphan still in the session
        st(14, 1, 14, 14),            # a stranger
        st(15, 12, 12, 12, "Z"),      # a zombie member: not live
    ))  # fmt: skip
    assert sorted(p.pid for p in tree.live) == [10, 11, 12, 13]
    assert tree.groups == {10, 12}


def test_membership_is_sticky_across_setsid_and_reparenting() -> None:
    m = Membership(10, 100)
    m.tree(snap(st(10, 1, 10, 10), st(11, 10, 10, 10)))
    # 11 double-forked away: new session, parent is the launcher's init now
    tree = m.tree(snap(st(10, 1, 10, 10), st(11, 1, 11, 11), st(20, 11, 11, 11)))
    assert sorted(p.pid for p in tree.live) == [10, 11, 20]


def test_membership_forgets_reused_pids() -> None:
    m = Membership(10, 100)
    m.tree(snap(st(10, 1, 10, 10), st(11, 10, 10, 10)))
    m.tree(snap(st(10, 1, 10, 10)))  # 11 is gone
    tree = m.tree(snap(st(10, 1, 10, 10), st(11, 1, 11, 11, start=999)))  # 11 reused by a stranger
    assert [p.pid for p in tree.live] == [10]


def test_membership_ignores_session_when_root_pid_was_reused() -> None:
    m = Membership(10, 100)
    # pid 10 now names another session leader (started later): its session is not ours
    tree = m.tree(snap(st(10, 1, 10, 10, start=500), st(11, 10, 10, 10, start=501)))
    assert tree.live == [] and tree.groups == frozenset()
    # the root is gone and nothing reused its pid: its session id still names our session
    tree = Membership(10, 100).tree(snap(st(13, 1, 10, 10)))
    assert [p.pid for p in tree.live] == [13] and tree.groups == {10}


def test_membership_untrusted_root_start() -> None:
    # the root's start time could not be trusted (it exited before it was read): pid 10 is not matched
    tree = Membership(10, None).tree(snap(st(10, 1, 10, 10), st(11, 10, 10, 10)))
    assert tree.live == []


def test_read_stat_parses_hostile_command_names(tmp_path: Any) -> None:
    # the command name is the executable's base name: make it look like the fields that follow it
    hostile = tmp_path / ") Z 1 1 1 (x"
    hostile.symlink_to("/bin/sleep")
    proc = subprocess.Popen([str(hostile), "5"], start_new_session=True)
    try:
        wait_until(lambda: comm(proc.pid) == hostile.name, "the hostile name exec'd")
        stat = read_stat(proc.pid)
        assert stat is not None and (stat.pid, stat.sid, stat.pgid) == (proc.pid, proc.pid, proc.pid)
        assert stat.ppid == os.getpid() and stat.state != "Z" and stat.alive and stat.starttime > 0
    finally:
        proc.kill()
        proc.wait()
    assert read_stat(proc.pid) is None
    assert read_stat(2**22 + 7) is None


class OomCounter:
    """The memory cgroup's OOM-kill counter as the table reads it (``ProcessTable.oom_kills``)."""

    def __init__(self) -> None:
        self.kills = 0

    def __call__(self) -> int:
        return self.kills


async def test_sigkill_with_an_oom_kill_counted_meanwhile_is_oom_killed(fake_table: ProcessTable) -> None:
    counter = OomCounter()
    fake_table.oom_kills = counter
    entry = await fake_table.start(Spec(["sleep", "30"]), kind="exec")
    counter.kills += 1  # the kernel's OOM kill of this process, as the cgroup counts it
    os.kill(entry.pid, signal.SIGKILL)
    result = (await fake_table.wait(entry.handle, 5)).to_wire()
    assert (result["signal"], result["rendered"], result["reason"]) == ("KILL", 137, "oom-killed")


async def test_sigkill_without_an_oom_kill_or_another_death_is_not_oom_killed(fake_table: ProcessTable) -> None:
    counter = OomCounter()
    counter.kills = 3  # kills before these processes started never count
    fake_table.oom_kills = counter
    killed = await fake_table.start(Spec(["sleep", "30"]), kind="exec")
    os.kill(killed.pid, signal.SIGKILL)
    assert (await fake_table.wait(killed.handle, 5)).reason == "exited"
    termed = await fake_table.start(Spec(["sleep", "30"]), kind="exec")
    counter.kills += 1
    os.kill(termed.pid, signal.SIGTERM)  # counted meanwhile, but not a SIGKILL: not the kernel's OOM kill
    assert (await fake_table.wait(termed.handle, 5)).reason == "exited"
    ours = await fake_table.start(Spec(["sh", "-c", "trap '' TERM; sleep 30"]), kind="exec")
    counter.kills += 1
    result = await fake_table.terminate(ours.handle, 0.1)  # our own SIGKILL after the grace: terminated
    assert (result.signal, result.reason) == ("KILL", "terminated")
