"""Process table, exec pump, terminate and forward on the real launcher (root, model R namespaces).

Each test gets a launcher of its own, forked by a sync fixture before the test's trio run (as the boundary's
main() forks it before trio.run) and prepared with network, mount and PID namespaces.
"""

from __future__ import annotations

import errno
import functools
import math
import os
import random
import secrets
import socket
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

import pytest
import trio
import trio.testing

from supervisor.boundary.forkimage import NamespacePlan, SpawnSpec
from supervisor.boundary.forward import open_forward
from supervisor.boundary.process import Launcher
from supervisor.boundary.process.environment import build_process_spec, managed_env
from supervisor.boundary.process.exec_session import pump_exec
from supervisor.boundary.process.table import ProcessTable
from supervisor.boundary.process.terminate import everything, kill_tree, read_stat
from supervisor.jsonlog import JsonLog
from supervisor.link.relay import relay
from supervisor.protocol.channel import Resize, Stdin, StdinEof, encode_frame
from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.process_ops import ExecRequest
from tests.integration.test_process_table import (
    BrokenStream,
    Collected,
    collect,
    comm,
    run_exec,
    still_alive,
    wait_for,
)
from tests.waiting import await_until

AGENT_UID = 1000


def _unused_uid(low: int = 64200, high: int = 65500) -> int:
    """A uid no process on the machine runs as, chosen afresh per run: RLIMIT_NPROC counts every process of the
    uid, so the fork bomb's count is its alone even beside another run of this suite (which bombs too)."""
    in_use = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                in_use.add(os.stat(f"/proc/{entry}").st_uid)
            except OSError:
                pass
    free = [uid for uid in range(low, high) if uid not in in_use]
    return secrets.choice(free)


if os.geteuid() != 0:
    pytest.skip("needs root for the launcher's namespaces (model R)", allow_module_level=True)


@pytest.fixture
def launcher() -> Iterator[Launcher]:
    zygote = Launcher.fork()  # a sync fixture runs before the test's trio.run, as the boundary's main() does
    yield zygote
    zygote.close()


async def make_table(launcher: Launcher) -> ProcessTable:
    try:
        await launcher.prepare(NamespacePlan("R"))
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"launcher cannot prepare model R here: {exc}")
    log = JsonLog("boundary", stream=open(os.devnull, "w"))  # noqa: SIM115, ASYNC230
    return ProcessTable(launcher, log=log)


@pytest.fixture
async def table(launcher: Launcher) -> AsyncIterator[ProcessTable]:
    t = await make_table(launcher)
    async with trio.open_nursery() as n:
        await n.start(t.run)
        yield t
        for live in t.live():
            await t.terminate(live.handle, 0)
        await kill_tree(everything(t.launcher.workload_pids))  # whatever a test left behind
        n.cancel_scope.cancel()


def spec(
    argv: Sequence[str],
    *,
    tty: bool = False,
    cols: int = 80,
    rows: int = 24,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    uid: int = AGENT_UID,
) -> SpawnSpec:
    req = ExecRequest(argv=tuple(argv), env=tuple((env or {}).items()), cwd=cwd, tty=tty, cols=cols, rows=rows)
    return build_process_spec(
        req, agent_uid=uid, agent_gid=uid, managed_env=managed_env(), default_cwd="/tmp", landlock=None
    )


def sh(script: str, **kw: Any) -> SpawnSpec:
    return spec(["/bin/sh", "-c", script], **kw)


def alive(table: ProcessTable) -> list[str]:
    """Workload processes that are not zombies (zombies are the reaper's, and count as gone)."""
    out = []
    for pid in table.launcher.workload_pids():
        stat = read_stat(pid)
        if stat is not None and stat.alive:
            out.append(f"{pid}:{stat.state}")
    return out


async def leftovers(table: ProcessTable) -> list[str]:
    """``alive`` once a process that was just SIGKILLed had the time to die (a budget for a loaded machine)."""
    with trio.move_on_after(10):
        await await_until(lambda: not alive(table), "every workload process dead")
    return alive(table)


def sleeps(table: ProcessTable) -> list[int]:
    """The workload's running ``sleep`` processes: how a test knows its commands have all started."""
    return [pid for pid in table.launcher.workload_pids() if comm(pid) == "sleep" and pid in running(table)]


def running(table: ProcessTable) -> set[int]:
    return {pid for pid in table.launcher.workload_pids() if (s := read_stat(pid)) is not None and s.alive}


# -- fidelity -------------------------------------------------------------------------------------------------


async def test_exit_code_and_signal_fidelity(table: ProcessTable) -> None:
    for i in range(60):
        code = i % 6
        out, entry = await run_exec(table, sh(f"echo {i}; exit {code}"))
        assert out.exit is not None and bytes(out.stdout) == b"%d\n" % i
        assert (out.exit["code"], out.exit["signal"], out.exit["rendered"]) == (code, None, code)
        assert (await table.wait(entry.handle, 0)).to_wire() == out.exit
    for i in range(20):
        name, number = ("TERM", 15) if i % 2 else ("KILL", 9)
        out, _ = await run_exec(table, sh(f"kill -{name} $$"))
        assert out.exit is not None
        assert (out.exit["code"], out.exit["signal"], out.exit["signal_number"], out.exit["rendered"]) == (
            None, name, number, 128 + number,
        )  # fmt: skip


async def test_seq_output_complete_every_run(table: ProcessTable) -> None:
    expected = b"".join(b"%d\n" % i for i in range(1, 100001))
    for _ in range(20):
        out, _ = await run_exec(table, spec(["seq", "1", "100000"]))
        assert bytes(out.stdout) == expected
        assert out.exit is not None and out.exit["code"] == 0
    for _ in range(5):  # through a PTY, where the last bytes are the classic casualty
        out, _ = await run_exec(table, spec(["seq", "1", "100000"], tty=True))
        assert bytes(out.stdout).replace(b"\r\n", b"\n") == expected


async def test_environment_is_exactly_ours(table: ProcessTable) -> None:
    os.environ["B2_BOUNDARY_SECRET"] = "must-not-leak"
    try:
        out, _ = await run_exec(table, spec(["env", "-0"], env={"FOO": "bar", "PATH": "/bin:/usr/bin"}))
    finally:
        del os.environ["B2_BOUNDARY_SECRET"]
    env = dict(item.split("=", 1) for item in bytes(out.stdout).decode().split("\0") if item)
    expected = {
        "PATH": "/bin:/usr/bin", "USER": env["USER"], "HOME": env["HOME"], "SHELL": "/bin/bash", "TERM": "dumb",
        "OPENSHELL_SANDBOX": "1", "FOO": "bar", **managed_env(),
    }  # fmt: skip
    assert env == expected


async def test_stdin_with_eof(table: ProcessTable) -> None:
    out, _ = await run_exec(table, spec(["cat"]), [Stdin(b"one\n"), Stdin(b"two"), StdinEof()])
    assert bytes(out.stdout) == b"one\ntwo"
    assert out.exit is not None and out.exit["code"] == 0


async def test_stdout_stderr_separate_without_pty_merged_with(table: ProcessTable) -> None:
    out, _ = await run_exec(table, sh("echo o; echo e >&2"))
    assert (bytes(out.stdout), bytes(out.stderr)) == (b"o\n", b"e\n")
    out, _ = await run_exec(table, sh("echo o; echo e >&2", tty=True))
    assert (bytes(out.stdout), bytes(out.stderr)) == (b"o\r\ne\r\n", b"")


# -- PTY ------------------------------------------------------------------------------------------------------


async def test_pty_initial_size_and_resize(table: ProcessTable) -> None:
    entry = await table.start(sh("stty size; read x; stty size", tty=True, cols=120, rows=40), kind="exec")
    client, server = trio.testing.memory_stream_pair()
    out = Collected()
    async with trio.open_nursery() as n:
        n.start_soon(pump_exec, entry, server)
        n.start_soon(collect, client, out)
        await wait_for(lambda: b"40 120" in out.stdout)
        await client.send_all(encode_frame(Resize(90, 33)) + encode_frame(Stdin(b"\n")))
    assert bytes(out.stdout).replace(b"\r\n", b"\n") == b"40 120\n\n33 90\n"


async def test_resize_reaches_foreground_group_as_sigwinch(table: ProcessTable) -> None:
    script = "trap 'stty size; exit 0' WINCH; echo ready; while :; do sleep 0.05; done"
    entry = await table.start(sh(script, tty=True), kind="exec")
    client, server = trio.testing.memory_stream_pair()
    out = Collected()
    async with trio.open_nursery() as n:
        n.start_soon(pump_exec, entry, server)
        n.start_soon(collect, client, out)
        await wait_for(lambda: b"ready" in out.stdout)
        table.resize(entry.handle, 101, 21)
    assert b"21 101" in out.stdout and out.exit is not None and out.exit["code"] == 0


@pytest.mark.parametrize("tty", [False, True])
async def test_exit_reported_when_a_background_child_holds_the_output(table: ProcessTable, tty: bool) -> None:
    t0 = trio.current_time()
    out, entry = await run_exec(table, sh("sleep 30 & echo last; exit 6", tty=tty))
    elapsed = trio.current_time() - t0
    # The exec has its own PID namespace (docs/design.md "Limits"): the background child ends with it, and the
    # output with it, so EXIT comes at once with or without a PTY.
    assert elapsed < 8
    assert bytes(out.stdout).replace(b"\r\n", b"\n") == b"last\n"
    assert out.exit is not None and out.exit["code"] == 6
    with pytest.raises(OpError):
        await table.terminate(entry.handle, 0)  # exited: "terminated", but the background child is swept
    assert await leftovers(table) == []


async def test_resize_on_non_pty_is_invalid(table: ProcessTable) -> None:
    entry = await table.start(spec(["sleep", "30"]), kind="exec")
    with pytest.raises(OpError) as info:
        table.resize(entry.handle, 80, 24)
    assert info.value.kind is ErrorKind.INVALID
    # and as a channel frame: an ``invalid`` error, never silently ignored; the process lives on
    client, server = trio.testing.memory_stream_pair()
    out = Collected()
    async with trio.open_nursery() as n:
        n.start_soon(pump_exec, entry, server)
        await client.send_all(encode_frame(Resize(80, 24)))
        with trio.fail_after(10):
            await collect(client, out)
    assert out.error is not None and out.error["kind"] == "invalid" and "terminal" in out.error["reason"], out
    assert entry.result is None
    await table.terminate(entry.handle, 0)


# -- signals, terminate, reaping ------------------------------------------------------------------------------


async def test_signal_group_and_exited_handle(table: ProcessTable) -> None:
    entry = await table.start(sh("sleep 30 & sleep 30; echo after"), kind="exec")
    await await_until(lambda: len(sleeps(table)) == 2, "both sleeps running")
    table.signal(entry.handle, "TERM", "group")
    result = await table.wait(entry.handle, 5)
    assert result.signal == "TERM"
    with pytest.raises(OpError) as info:
        table.signal(entry.handle, "KILL")
    assert info.value.kind is ErrorKind.TERMINATED
    assert await leftovers(table) == []


async def test_no_zombies_after_orphan_producing_commands(table: ProcessTable) -> None:
    handles = []
    for _ in range(30):
        entry = await table.start(sh("sleep 0.3 & sleep 0.2 & exit 0"), kind="exec")
        handles.append(entry.handle)
    for h in handles:
        assert (await table.wait(h, 10)).code == 0

    def zombies() -> list[int]:
        return [pid for pid in table.launcher.workload_pids() if (s := read_stat(pid)) is not None and s.state == "Z"]

    # the orphans end (their own sleeps) and must be reaped by the launcher's init: nothing left, not even zombies
    await await_until(lambda: not running(table) and not zombies(), "every orphan ended and reaped")
    assert zombies() == []
    assert await leftovers(table) == []


async def test_terminate_leaves_no_descendant(table: ProcessTable) -> None:
    script = "trap '' TERM; (trap '' TERM; sleep 60 & sleep 60) & (sleep 60 &) ; sleep 60 & wait"
    entry = await table.start(sh(script), kind="exec")
    await await_until(lambda: len(sleeps(table)) == 4, "all four sleeps running")
    assert len(entry.scan()().live) >= 5
    t0 = trio.current_time()
    result = await table.terminate(entry.handle, 0.3)
    assert trio.current_time() - t0 < 5
    assert (result.signal, result.reason) == ("KILL", "terminated")
    assert await leftovers(table) == []


async def test_fork_bomb_does_not_survive_terminate(table: ProcessTable) -> None:
    # Bounded by RLIMIT_NPROC of a uid of its own (dash spells it -p, bash -u; never run unbounded): the
    # four loops that keep forking at the limit for as long as they live, then the classic recursion.
    bomb = (
        "ulimit -u 150 2>/dev/null || ulimit -p 150 || exit 99; "
        "for i in 1 2 3 4; do (while :; do sleep 60 & done) 2>/dev/null & done; f() { f | f & }; f; sleep 60"
    )
    entry = await table.start(sh(bomb, uid=_unused_uid()), kind="exec")
    await wait_for(lambda: len(alive(table)) > 30)
    assert entry.result is None, entry.result
    result = await table.terminate(entry.handle, 0.1)
    assert result.reason == "terminated"
    assert await leftovers(table) == []


async def test_setsid_after_being_seen_is_still_terminated(table: ProcessTable) -> None:
    # A double-forked child (reparented to the launcher at once) is seen by a first scan while it is still in
    # the exec's session, then calls setsid: membership is sticky, so terminate still reaches it. The child
    # waits for a line on fd 3 (the exec's stdin; an asynchronous list's own stdin is /dev/null) to call setsid.
    script = "exec 3<&0; ( (read x <&3; exec setsid sleep 60 3<&-) & ); exec 3<&-; sleep 60"
    entry = await table.start(sh(script), kind="exec")
    await await_until(lambda: len(sleeps(table)) == 1 and len(entry.scan()().live) >= 3, "the scan that remembers")
    assert entry.stdin_fd is not None
    os.write(entry.stdin_fd.fileno(), b"go\n")

    def left_the_session() -> bool:
        stats = [s for s in map(read_stat, table.launcher.workload_pids()) if s is not None and s.alive]
        command = next(s for s in stats if s.ppid == entry.pid)  # under its namespace's init
        return any(s.sid == s.pid != command.pid for s in stats if s.pid != entry.pid)

    await await_until(left_the_session, "the daemon left the session")
    await table.terminate(entry.handle, 0.2)
    assert await leftovers(table) == []


async def test_timeout_terminates(table: ProcessTable) -> None:
    out, _ = await run_exec(table, sh("trap '' TERM; sleep 30"), timeout_s=0.3, grace_s=0.2)
    assert out.exit is not None and (out.exit["reason"], out.exit["rendered"]) == ("timeout", 124)
    assert await leftovers(table) == []


async def test_launch_failures(table: ProcessTable) -> None:
    with pytest.raises(OpError) as info:
        await table.start(spec(["/nonexistent/program"]), kind="exec")
    assert (info.value.kind, info.value.stage, info.value.errno) == (ErrorKind.FAILED, "execve", errno.ENOENT)
    with pytest.raises(OpError) as info:
        await table.start(spec(["true"], cwd="/root"), kind="exec")  # 0700 root: the workload uid cannot enter
    assert (info.value.kind, info.value.stage, info.value.errno) == (ErrorKind.FAILED, "chdir", errno.EACCES)
    assert table.live() == []


# -- attacks from inside the workload -------------------------------------------------------------------------


async def test_workload_cannot_signal_the_boundary(table: ProcessTable) -> None:
    me = os.getpid()
    out, _ = await run_exec(table, sh(f"kill -0 {me} && echo reached; kill -0 1 && echo init; exit 0"))
    assert b"reached" not in out.stdout
    assert os.getpid() == me  # still here


async def test_control_drop_mid_exec_keeps_process(table: ProcessTable) -> None:
    entry = await table.start(sh("read x; echo got $x"), kind="exec")
    await pump_exec(entry, BrokenStream())
    # what a resumed control sees; the reattach below proves the same process kept running
    assert [e.handle for e in table.live()] == [entry.handle]
    assert "pid" not in table.live()[0].to_wire()
    client, server = trio.testing.memory_stream_pair()
    out = Collected()
    async with trio.open_nursery() as n:
        n.start_soon(pump_exec, entry, server)
        await client.send_all(encode_frame(Stdin(b"back\n")))
        await collect(client, out)
    assert bytes(out.stdout) == b"got back\n"


# -- agent exit -----------------------------------------------------------------------------------------------


async def test_agent_exit_ends_everything_within_a_second(launcher: Launcher) -> None:
    t = await make_table(launcher)
    async with trio.open_nursery() as n:
        await n.start(t.run)
        agent = await t.start(sh("read x; exit 0"), kind="agent")
        execs = [
            await t.start(sh("trap '' TERM; sleep 60"), kind="exec"),
            await t.start(sh("setsid sh -c 'sleep 60 & exit 0' & sleep 60"), kind="exec"),  # a detached daemon
            await t.start(sh("sleep 60", tty=True), kind="exec"),
        ]
        await await_until(lambda: len(sleeps(t)) == 4, "every exec's sleeps running")
        assert len(alive(t)) >= 5
        members = {e.handle: e.scan()().live for e in execs}
        assert agent.stdin_fd is not None
        answered: dict[str, tuple[str, list[Any]]] = {}

        async def wait_one(handle: str) -> None:
            result = await t.wait(handle, 5)
            answered[handle] = (str(result.reason), still_alive(members[handle]))  # the moment wait answered

        t0 = time.monotonic()
        os.write(agent.stdin_fd.fileno(), b"\n")
        async with trio.open_nursery() as waits:
            for e in execs:
                waits.start_soon(wait_one, e.handle)
        assert time.monotonic() - t0 < 3  # target 1 s; margin for a loaded CI machine
        assert answered == {e.handle: ("agent-exit", []) for e in execs}, answered
        assert await leftovers(t) == []
        assert (await t.wait(agent.handle, 0)).code == 0
        with pytest.raises(OpError) as info:
            await t.start(spec(["true"]), kind="exec")
        assert info.value.kind is ErrorKind.TERMINATED
        n.cancel_scope.cancel()


# -- forward --------------------------------------------------------------------------------------------------


async def test_forward_reaches_workload_loopback_only(table: ProcessTable) -> None:
    launcher = table.launcher
    assert isinstance(launcher, Launcher)
    inside = await launcher.socket_in_netns(socket.AF_INET, socket.SOCK_STREAM)
    inside.bind(("127.0.0.1", 0))
    inside.listen()
    port = inside.getsockname()[1]
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(inside))

    async def echo_once() -> None:
        conn = await listener.accept()
        async with conn:
            while data := await conn.receive_some(1024):
                await conn.send_all(data.upper())

    async with trio.open_nursery() as n:
        n.start_soon(echo_once)
        stream = await open_forward(launcher, "localhost", port, reserved_ports={3128})
        client, server = trio.testing.memory_stream_pair()
        n.start_soon(functools.partial(relay, server, stream, idle_timeout=math.inf))
        await client.send_all(b"hello")
        await client.send_eof()
        got = b""
        while data := await client.receive_some(1024):
            got += data
        assert got == b"HELLO"
    await listener.aclose()

    # a listener on the boundary's own loopback is not reachable: the dial happens in the workload netns
    host_side = listen_outside_ephemeral_range()
    try:
        with pytest.raises(OpError) as info:
            await open_forward(launcher, "127.0.0.1", host_side.getsockname()[1], reserved_ports=())
        assert (info.value.kind, info.value.errno) == (ErrorKind.FAILED, errno.ECONNREFUSED)
    finally:
        host_side.close()


def listen_outside_ephemeral_range() -> socket.socket:
    """A listener on the boundary's loopback. Benchmarks on this machine can exhaust the ephemeral range
    (port 0), so pick a port below it."""
    for _ in range(50):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", random.randrange(20000, 32000)))
        except OSError:
            sock.close()
            continue
        sock.listen()
        return sock
    raise RuntimeError("no free port below the ephemeral range")


@pytest.mark.parametrize(
    ("host", "port", "kind"),
    [
        ("169.254.169.254", 80, ErrorKind.DENIED),
        ("::ffff:169.254.169.254", 80, ErrorKind.DENIED),
        ("0.0.0.0", 80, ErrorKind.DENIED),
        ("10.0.0.1", 80, ErrorKind.DENIED),
        ("fe80::1", 80, ErrorKind.DENIED),
        ("localhost.", 80, ErrorKind.INVALID),
        ("127.1", 80, ErrorKind.INVALID),
        ("2130706433", 80, ErrorKind.INVALID),
        ("127.0.0.1", 3128, ErrorKind.DENIED),  # the boundary's own proxy listener
        ("::1", 3128, ErrorKind.DENIED),
    ],
)
async def test_forward_attacks_refused(table: ProcessTable, host: str, port: int, kind: ErrorKind) -> None:
    launcher = table.launcher
    assert isinstance(launcher, Launcher)
    with pytest.raises(OpError) as info:
        await open_forward(launcher, host, port, reserved_ports={3128, 53})
    assert info.value.kind is kind


async def test_unowned_reaps_are_reported_aggregated(table: ProcessTable) -> None:
    # Orphans reparented to the workload's init are reaped there and reported once per second at most, as a
    # count with the first pids: three double-forked children of the agent, one report.
    reports: list[tuple[int, list[int]]] = []
    table.launcher.on_unowned = lambda count, pids: reports.append((count, pids))  # type: ignore[attr-defined]
    await table.start(sh("(sleep 0.1 &); (sleep 0.1 &); (sleep 0.1 &); sleep 30"), kind="agent")
    await wait_for(lambda: sum(count for count, _ in reports) >= 3)
    assert len(reports) == 1 and len(reports[0][1]) == reports[0][0], reports
