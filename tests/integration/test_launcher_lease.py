"""Execs through a leased spare (zygote.py "Spares", launcher.py rules 4 and 5), as root (model R).

The workload's init leases a spare exec-init that applied the stages its commands share to itself
(``child.SELF``) for the last spawn's confinement; the boundary sends a matching exec straight to it (it starts the
command with ``posix_spawn``, spawn.py) and reads its status from the report socket.

Checked here: statuses and signals read back through that socket, a kill through the pidfd ends the
exec's whole namespace, a mismatched confinement lets the spare go and runs as asked, stdio and a terminal work,
and the agent can neither reach the waiting spare nor keep the next exec from taking it.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from supervisor.boundary.forkimage import (
    LandlockSpec,
    NamespacePlan,
    SpawnSpec,
    child,
    exec_init,
    landlock,
    spawner,
    zygote,
)
from supervisor.boundary.process import Launcher
from supervisor.boundary.process.launcher import Lease, Spawned, SpawnError

from .test_launcher_spawn import PY, READ_ONLY, STATUS_PROBE, alive, make_spec, read_all, read_pty, run_spawned

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="launcher model R tests need root")
ROOT = Path(__file__).resolve().parents[2]  # the checkout: the script imports the package from it


@pytest.fixture
def launcher() -> Iterator[Launcher]:
    zyg = Launcher.fork()  # before trio.run, as the boundary's main() does
    yield zyg
    zyg.close()


async def await_lease(launcher: Launcher, *, besides: Collection[int] = ()) -> Lease:
    """The lease the next matching exec takes (the oldest held), once it is not one of the spares ``besides``,
    filing unprompted messages as the boundary's readers do."""
    deadline = time.monotonic() + 10
    while not launcher._leases or launcher._leases[0].pid in besides:
        assert time.monotonic() < deadline, f"no spare was leased besides {besides}"
        launcher._drain()
        await trio.sleep(0.005)
    return launcher._leases[0]


async def prime(launcher: Launcher, **kw: Any) -> Lease:
    """Prepare model R and run one exec through the init, so the next spare is prepared for its confinement."""
    await launcher.prepare(NamespacePlan("R"))
    spec = make_spec("/bin/true", stdin="null", **kw)
    first = await launcher.spawn(spec, own_pidns=True)
    assert await first.wait_status() == 0
    return await all_leased(launcher, child.confinement(spec, False))


async def all_leased(launcher: Launcher, confinement: dict[str, Any], besides: Collection[int] = ()) -> Lease:
    """Wait until the init has leased all its spares (``spawner.SPARES``), none of them ``besides``, each for
    ``confinement``; the one the next exec takes."""
    deadline = time.monotonic() + 10
    while len(held := [lease for lease in launcher._leases if lease.pid not in besides]) < spawner.SPARES:
        assert time.monotonic() < deadline, f"{len(held)} of {spawner.SPARES} spares leased"
        launcher._drain()
        await trio.sleep(0.005)
    assert [lease.confinement for lease in launcher._leases] == [confinement] * spawner.SPARES
    return launcher._leases[0]


async def run_exec(launcher: Launcher, spec: SpawnSpec, stdin: bytes = b"") -> tuple[Spawned, int, bytes, bytes]:
    """An exec (``own_pidns``): write ``stdin``, read stdout and stderr to EOF; (spawned, raw status, out, err)."""
    return await run_spawned(launcher, spec, own_pidns=True, stdin=stdin)


def tree(pid: int) -> set[int]:
    """``pid`` and its live descendants, as /proc shows them now."""
    parents, zombies = zygote.proc_scan()
    return ({pid} | zygote.descendants(pid, parents)) - zombies


def nice_of(pid: int) -> int:
    """The nice value of ``pid`` (field 19 of /proc/PID/stat)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def status_of(pid: int) -> dict[str, list[str]]:
    with open(f"/proc/{pid}/status") as fh:
        return {key: value.split() for key, value in (line.split(":", 1) for line in fh.read().splitlines())}


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        return [int(p) for p in fh.read().split()]


# --- 1: statuses through the report socket ---------------------------------------------------------------
async def test_a_leased_exec_reports_its_exit_code_and_signal(launcher: Launcher) -> None:
    lease = await prime(launcher)
    spawned, status, out, err = await run_exec(launcher, make_spec("/bin/sh", "-c", "echo $$; exit 3"))
    assert (spawned.pid, spawned.ns_pid, spawned.nested) == (lease.pid, lease.ns_pid, True), "the lease was not used"
    assert status == 3 << 8, (status, err)
    assert out == b"2\n"  # the command is the exec-init's first child in a namespace of its own
    # Taken: the init leases the next spare at once, for the same confinement.
    second = await await_lease(launcher, besides={lease.pid})
    spawned, status, _, err = await run_exec(launcher, make_spec("/bin/sh", "-c", "kill -TERM $$"))
    assert spawned.pid == second.pid
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, (status, err)


async def test_a_leased_exec_killed_through_its_pidfd_leaves_nothing(launcher: Launcher) -> None:
    lease = await prime(launcher)
    spawned = await launcher.spawn(
        make_spec("/bin/sh", "-c", "sleep 1000 & exec sleep 1000", stdin="null", stdout="inherit", stderr="inherit"),
        own_pidns=True,
    )
    assert spawned.pid == lease.pid
    deadline = time.monotonic() + 10
    while len(pids := tree(spawned.pid)) < 3:  # the exec-init, the exec'd sleep and the one it backgrounded
        assert time.monotonic() < deadline, f"the exec did not start its sleeps: {pids}"
        await trio.sleep(0.005)
    assert pids - {spawned.pid} <= launcher.workload_pids()  # taken: its processes are the workload's now
    signal.pidfd_send_signal(spawned.pidfd, signal.SIGKILL)
    with trio.fail_after(10):
        status = await spawned.wait_status()
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    # The status comes once the exec-init is gone, i.e. its namespace is empty: nothing left to wait for.
    assert not [pid for pid in pids if alive(pid)], pids
    os.close(spawned.pidfd)


# --- 2: a confinement the spare was not prepared for -------------------------------------------------------
MISMATCHES: dict[str, dict[str, Any]] = {
    "uid": {"uid": 1001, "gid": 1000},
    "gid": {"gid": 1001},
    "groups": {"groups": (2000,)},
    "seccomp": {"seccomp": False},
    "landlock": {"landlock": LandlockSpec(read_only=READ_ONLY, read_write=("/tmp",))},
}
PROBE = "id -u; id -g; id -G; grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status"


@pytest.mark.parametrize("field", sorted(MISMATCHES))
async def test_a_mismatched_exec_lets_the_spare_go_and_runs_as_asked(launcher: Launcher, field: str) -> None:
    if field == "landlock" and landlock.abi_version() < 1:
        pytest.skip("Landlock not available")
    lease = await prime(launcher)
    old: set[int] = set()
    for held in launcher._leases:
        pids = tree(held.pid)
        assert len(pids) == 1, pids  # the exec-init alone: no child waits for the command
        old |= pids
    kw = MISMATCHES[field]
    spec = make_spec("/bin/sh", "-c", PROBE, stdin="null", **kw)
    assert child.confinement(spec, False) != lease.confinement
    spawned, status, out, err = await run_exec(launcher, spec)
    assert status == 0, err
    assert spawned.nested and spawned.pid not in old, "a spare prepared for another confinement ran the exec"
    lines = out.decode().splitlines()
    uid, gid = kw.get("uid", 1000), kw.get("gid", 1000)
    assert lines[:3] == [str(uid), str(gid), " ".join(str(g) for g in (gid, *kw.get("groups", ())))], lines
    assert lines[3:] == ["NoNewPrivs:\t1", f"Seccomp:\t{2 if kw.get('seccomp', True) else 0}"], lines
    deadline = time.monotonic() + 10
    while gone := [pid for pid in old if alive(pid)]:
        assert time.monotonic() < deadline, f"the spares let go are still there: {gone}"
        await trio.sleep(0.005)
    assert not [held for held in launcher._leases if held.pid in old]


async def test_after_a_mismatch_the_next_spare_is_for_the_new_confinement(launcher: Launcher) -> None:
    await prime(launcher)
    old = [held.pid for held in launcher._leases]
    spec = make_spec("/usr/bin/id", "-u", uid=1001, gid=1001, stdin="null")
    first, status, out, _ = await run_exec(launcher, spec)
    assert (first.pid not in old, status, out) == (True, 0, b"1001\n")
    fresh = await all_leased(launcher, child.confinement(spec, False), besides=old)
    spawned, status, out, _ = await run_exec(launcher, spec)
    assert (spawned.pid, status, out) == (fresh.pid, 0, b"1001\n")


# --- 3: the agent's side ----------------------------------------------------------------------------------
async def test_a_waiting_spare_is_confined_and_root_before_and_after_an_exec(launcher: Launcher) -> None:
    """While it waits, the spare exec-init is already under no_new_privs, both seccomp filters (the listener's
    mode shows as 2 too), with empty bounding, inheritable and ambient sets, and still root and not dumpable: the
    agent's uid owns nothing of it. Its command gets the agent's ids (spawn.py rule 2) and none of its
    capabilities; the exec-init has its own ids back once the command started, and keeps them as a spare again."""
    lease = await prime(launcher)
    for served in (False, True):
        got = status_of(lease.pid)
        assert got["Uid"] == ["0"] * 4 and got["Gid"] == ["0"] * 4, (served, got)
        assert (got["NoNewPrivs"], got["Seccomp"]) == (["1"], ["2"]), got
        assert got["CapBnd"] == got["CapInh"] == got["CapAmb"] == ["0000000000000000"], got
        assert children(lease.pid) == [] and nice_of(lease.pid) == 0
        if served:
            break
        spawned = await launcher.spawn(make_spec(PY, "-c", STATUS_PROBE, stdin="null"), own_pidns=True)
        assert spawned.pid == lease.pid and spawned.stdout is not None
        with trio.fail_after(10):
            out = json.loads(await read_all(spawned.stdout))
            assert await spawned.wait_status() == 0
        assert out["Uid"] == ["1000"] * 4 and out["Gid"] == ["1000"] * 4, out
        assert [int(out[key][0], 16) for key in ("CapInh", "CapPrm", "CapEff", "CapAmb")] == [0] * 4, out
        deadline = time.monotonic() + 10
        while lease.pid not in [held.pid for held in launcher._leases]:  # back as a spare
            assert time.monotonic() < deadline, "the exec-init did not come back"
            launcher.workload_pids()  # files what came in meanwhile, its comeback lease included
            await trio.sleep(0.005)


EXEC_ATTACK = """
import json, os, sys
out = {}
for pid in sys.stdin.read().split():  # the test names them once the next spare is leased
    out[f"{pid}/visible"] = os.path.exists(f"/proc/{pid}/status")
    for what in ("mem", "environ", "fd/3", "ns/pid"):
        try:
            os.close(os.open(f"/proc/{pid}/{what}", os.O_RDONLY))
            out[f"{pid}/{what}"] = "opened"
        except OSError as exc:
            out[f"{pid}/{what}"] = exc.errno
print(json.dumps(out))
"""


async def test_an_exec_of_the_agent_cannot_reach_the_next_spare(launcher: Launcher) -> None:
    """An exec has a PID namespace of its own (its kill(2) and ptrace(2) cannot name the spare; test_launcher_spawn
    tries those from the workload's namespace) but sees the workload's /proc, where the spare leased while it
    runs shows up: it can open nothing of that spare, which stays as it was and takes the next exec."""
    lease = await prime(launcher)
    attacker = await launcher.spawn(make_spec(PY, "-c", EXEC_ATTACK), own_pidns=True)
    assert attacker.pid == lease.pid and attacker.stdin is not None
    await all_leased(launcher, lease.confinement, besides={lease.pid})  # the one it took is replaced
    spares = [held.pid for held in launcher._leases]
    before = {pid: status_of(pid) for spare in spares for pid in (spare, *children(spare))}
    assert len(before) == len(spares)  # each exec-init alone: no child waits for the command
    targets = [was["NSpid"][1] for was in before.values()]  # as the workload's /proc names them
    os.write(attacker.stdin, " ".join(targets).encode())
    os.close(attacker.stdin)
    with trio.fail_after(30):
        out = await read_all(attacker.stdout)
        err = await read_all(attacker.stderr)
        assert await attacker.wait_status() == 0, err
    got = json.loads(out)
    expected: dict[str, object] = {f"{t}/visible": True for t in targets}  # the attempt is real: they are there
    expected |= {f"{t}/{w}": errno.EACCES for t in targets for w in ("mem", "environ", "fd/3", "ns/pid")}
    assert got == expected
    for pid, was in before.items():  # still waiting, as they were
        now = status_of(pid)
        assert (now["State"][0], now["Uid"], now["SigPnd"], now["ShdPnd"]) == (
            "S", was["Uid"], was["SigPnd"], was["ShdPnd"]
        ), (pid, now)  # fmt: skip
    for spare in spares:
        assert children(spare) == []
    # The attacker's exec-init may be back by now (the launcher then lets the oldest lease go): one of the
    # spares it attacked, or itself, takes the next exec.
    spawned, status, out, _ = await run_exec(launcher, make_spec("/usr/bin/id", "-u", stdin="null"))
    assert (spawned.pid in {*spares, lease.pid}, status, out) == (True, 0, b"1000\n")


@pytest.fixture
def landlock_dirs() -> Iterator[Path]:
    """``rw`` and ``other``, both the workload uid's, in a directory it can reach (pytest's is root-only)."""
    base = Path(tempfile.mkdtemp(prefix="lease-landlock-"))
    base.chmod(0o755)
    for name in ("rw", "other"):
        (base / name).mkdir()
        os.chown(base / name, 1000, 1000)
    yield base
    shutil.rmtree(base)


# --- how many spares the init keeps ---------------------------------------------------------------------------
async def test_a_long_exec_stops_counting_as_a_spare_and_the_init_makes_another(launcher: Launcher) -> None:
    """An exec that runs past SPARE_BUSY_S (an interactive shell) tells the init, which makes another spare: the
    launcher holds SPARES leases again while it runs, all of other exec-inits; once it ends its exec-init is back
    (the launcher then holds the newest SPARES). A short exec tells the init nothing (it is not woken per exec)."""
    await prime(launcher)
    spawned = await launcher.spawn(make_spec("/bin/sleep", "3", stdin="null"), own_pidns=True)
    before = time.monotonic()
    with trio.fail_after(10):
        await all_leased(launcher, child.confinement(make_spec("/bin/true", stdin="null"), False), {spawned.pid})
    assert time.monotonic() - before >= exec_init.SPARE_BUSY_S * 0.9  # not before it ran long
    signal.pidfd_send_signal(spawned.pidfd, signal.SIGKILL)
    assert os.WTERMSIG(await spawned.wait_status()) == signal.SIGKILL


async def test_a_spare_killed_in_a_short_exec_is_replaced_at_once(launcher: Launcher) -> None:
    """Terminate kills an exec's exec-init (its pidfd, SIGKILL) before it ran long: the init, which reaps it,
    makes another at once — without waiting for a spawn through it, which may never come."""
    lease = await prime(launcher)
    others = {held.pid for held in launcher._leases} - {lease.pid}
    spawned = await launcher.spawn(make_spec("/bin/sleep", "100", stdin="null"), own_pidns=True)
    assert spawned.pid == lease.pid
    signal.pidfd_send_signal(spawned.pidfd, signal.SIGKILL)
    assert os.WTERMSIG(await spawned.wait_status()) == signal.SIGKILL
    # Nothing else would replace it: no spawn goes through the init here, and a dead exec-init never says its
    # exec ran long.
    with trio.fail_after(10):
        fresh = await all_leased(launcher, lease.confinement, {lease.pid})
    assert fresh.pid in others  # the oldest is the one that was there; the new one is behind it
    assert {held.pid for held in launcher._leases} - others - {lease.pid}


# --- launch failures through a spare (spawn.py) ---------------------------------------------------------------
async def test_a_spare_fails_a_launch_as_a_forked_child_would(
    launcher: Launcher, landlock_dirs: Path, tmp_path: Path
) -> None:
    """posix_spawn's failures carry the stage a forked child would name: not found (127), not executable (126),
    and a working directory the agent's uid cannot enter, which the exec-init's own (root) could: the ids are
    the agent's before ``chdir`` (spawn.py rule 2). After each, the same exec-init is a spare again (the
    launcher takes its lease back, ``Launcher._take_back``: no spare is lost to a typo) and the next exec runs as
    the agent."""
    workdir = landlock_dirs / "rw"  # the agent's
    script = workdir / "not-executable"
    script.write_text("#!/bin/sh\necho nope\n")
    script.chmod(0o644)
    private = tmp_path / "root-only"  # under pytest's root-only tree too
    private.mkdir(mode=0o700)
    cases = [
        (make_spec("/no/such/program", stdin="null"), ("execve", errno.ENOENT, 127)),
        (make_spec("no-such-program-here", stdin="null"), ("execve", errno.ENOENT, 127)),
        (make_spec(str(script), stdin="null"), ("execve", errno.EACCES, 126)),
        (make_spec("not-executable", stdin="null", env={"PATH": str(workdir)}), ("execve", errno.EACCES, 126)),
        (make_spec("/bin/true", stdin="null", cwd=str(private)), ("chdir", errno.EACCES, 125)),
    ]
    await prime(launcher)
    spares = {held.pid for held in launcher._leases}
    for spec, expected in cases:
        lease = await await_lease(launcher)
        with pytest.raises(SpawnError) as info:
            await launcher.spawn(spec, own_pidns=True)
        assert (info.value.stage, info.value.errno, info.value.exit_code) == expected, spec.argv
        deadline = time.monotonic() + 10
        while lease.pid not in [held.pid for held in launcher._leases]:
            assert time.monotonic() < deadline, f"the exec-init did not come back after {spec.argv}"
            launcher.workload_pids()
            await trio.sleep(0.005)
        assert status_of(lease.pid)["Uid"] == ["0"] * 4  # its own ids back
    assert not (workdir / "nope").exists()
    assert {held.pid for held in launcher._leases} == spares  # no spare was lost to a failed launch
    spawned, status, out, _ = await run_exec(launcher, make_spec("/usr/bin/id", "-u", stdin="null"))
    assert (spawned.pid in spares, status, out) == (True, 0, b"1000\n")


# --- 4: stdio and a terminal --------------------------------------------------------------------------------
async def test_a_leased_exec_reads_stdin_and_writes_both_streams(launcher: Launcher) -> None:
    lease = await prime(launcher)
    payload = b"line one\nline two\n" * 1000
    spawned, status, out, err = await run_exec(launcher, make_spec("/bin/sh", "-c", "cat; echo err >&2"), stdin=payload)
    assert spawned.pid == lease.pid
    assert (status, out, err) == (0, payload, b"err\n")


async def test_a_tty_exec_through_a_lease(launcher: Launcher) -> None:
    lease = await prime(launcher)  # tty is not part of the confinement: the spare takes it
    spawned = await launcher.spawn(
        make_spec("/bin/sh", "-c", "stty size; tty; test -t 0 && echo isatty; read x; echo got $x", tty=True,
                  rows=33, cols=111),
        own_pidns=True,
    )  # fmt: skip
    assert spawned.pid == lease.pid and spawned.pty_master is not None and spawned.stdout is None
    os.write(spawned.pty_master, b"hello\n")
    with trio.fail_after(10):
        out = await read_pty(spawned.pty_master)
        assert await spawned.wait_status() == 0
    os.close(spawned.pty_master)
    os.close(spawned.pidfd)
    text = out.decode().replace("\r", "")
    assert "33 111" in text.splitlines(), text
    assert "/dev/pts/" in text and "isatty" in text and "got hello" in text, text


# --- the split stages lose nothing ------------------------------------------------------------------------
async def test_a_leased_exec_is_as_confined_as_one_forked_whole(launcher: Launcher) -> None:
    """The same probe test_launcher_spawn runs on a child that ran every stage in one go: through a lease (half
    the stages applied by the exec-init to itself, the rest by ``posix_spawn`` with the agent's ids) every
    control is in force, no fd of the spare's (command socket, report socket, state pipe, signalfd) reached the
    command, and it has a session of its own."""
    lease = await prime(launcher, groups=(2000, 2001))
    spawned, status, out, err = await run_exec(launcher, make_spec(PY, "-c", STATUS_PROBE, groups=(2000, 2001)))
    assert (spawned.pid, status) == (lease.pid, 0), err
    got = json.loads(out)
    assert got["Uid"] == ["1000"] * 4 and got["Gid"] == ["1000"] * 4 and sorted(got["Groups"]) == ["2000", "2001"]
    for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(got[key][0], 16) == 0, key
    assert (got["NoNewPrivs"], got["Seccomp"], got["setuid0"]) == (["1"], ["2"], errno.EPERM)
    assert (got["sid_is_pid"], got["umask"], got["core"], got["nice"]) == (True, 0o022, [0, 0], 0)  # nice: see below
    assert got["fds"][:3] == [0, 1, 2] and len(got["fds"]) <= 4, got["fds"]  # 0-2 and the one listdir opens
    # Nothing ignored or blocked crosses execve (python ignores SIGPIPE and SIGXFSZ itself: grep reads it). The
    # exec-init blocks every signal it forwards, and it and the init ignore some; none of it reaches the command.
    grep = make_spec("/bin/grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status", stdin="null")
    spawned, status, out, err = await run_exec(launcher, grep)
    assert (spawned.nested, status) == (True, 0), err
    fields = dict(line.split(":\t") for line in out.decode().splitlines())
    assert fields == {"SigIgn": "0" * 16, "SigBlk": "0" * 16}


async def test_spares_ended_while_waiting_leave_the_next_exec_to_the_init(launcher: Launcher) -> None:
    """End-all's SIGTERM reaches a waiting spare (the boundary is root): it ends, and the next exec, finding its
    lease dead, goes through the init and runs as asked."""
    await prime(launcher)
    old = {pid for held in launcher._leases for pid in tree(held.pid)}
    for held in launcher._leases:
        os.kill(held.pid, signal.SIGTERM)  # blocked, and pending on its signalfd: it ends (exec_init._await_command)
    deadline = time.monotonic() + 10
    while gone := [pid for pid in old if alive(pid)]:
        assert time.monotonic() < deadline, f"the spares did not end: {gone}"
        await trio.sleep(0.005)
    spawned, status, out, err = await run_exec(launcher, make_spec("/bin/sh", "-c", "id -u; exit 4", stdin="null"))
    assert spawned.nested and spawned.pid not in old
    assert (status, out) == (4 << 8, b"1000\n"), err


async def test_a_leased_exec_gets_signals_sent_to_its_handle(launcher: Launcher) -> None:
    """A signal to the exec's handle (the exec-init's pidfd: terminate's SIGTERM) is forwarded to its command."""
    lease = await prime(launcher)
    spawned = await launcher.spawn(make_spec("/bin/sh", "-c", "echo up; exec sleep 1000"), own_pidns=True)
    assert spawned.pid == lease.pid and spawned.stdout is not None and spawned.stdin is not None
    os.close(spawned.stdin)
    with trio.fail_after(10):
        async with trio.lowlevel.FdStream(os.dup(spawned.stdout)) as stream:
            assert await stream.receive_some(16) == b"up\n"
        signal.pidfd_send_signal(spawned.pidfd, signal.SIGTERM)
        status = await spawned.wait_status()
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, status
    for fd in (spawned.stdout, spawned.stderr, spawned.pidfd):
        if fd is not None:
            os.close(fd)


NO_SYS_NICE = r"""
import json, os, sys
import trio
from supervisor.boundary.forkimage import NamespacePlan, SpawnSpec
from supervisor.boundary.process import Launcher
launcher = Launcher.fork()

async def run(spec):
    spawned = await launcher.spawn(spec, own_pidns=True)
    async with trio.lowlevel.FdStream(spawned.stdout) as out:
        text = b"".join([chunk async for chunk in out])
    os.close(spawned.stderr)
    return spawned, await spawned.wait_status(), text.decode().strip()

async def main():
    await launcher.prepare(NamespacePlan("R"))
    spec = SpawnSpec(argv=("/bin/sh", "-c", "cut -d' ' -f19 /proc/self/stat"), env={"PATH": "/usr/bin:/bin"},
                     cwd="/", uid=1000, gid=1000, stdin="null")
    await run(spec)  # through the init: the spares are made for this confinement
    with trio.fail_after(10):
        while not launcher._leases:
            launcher.workload_pids()
            await trio.sleep(0.005)
    lease = launcher._leases[0].pid
    spawned, status, nice = await run(spec)
    print(json.dumps({"leased": spawned.pid == lease, "status": status, "nice": nice}))

try:
    trio.run(main)
finally:
    launcher.close()
"""


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) drops the capability here")
def test_without_cap_sys_nice_a_leased_exec_runs_at_the_usual_priority(tmp_path: Path) -> None:
    """A container that grants root no CAP_SYS_NICE (podman's default set): nothing of a spare's may change a
    priority it could not raise again — the exec runs, at nice 0, through the spare (an earlier version, whose
    waiting child lowered its own, failed every such exec at 'fork': EPERM, caught by the podman pods)."""
    script = tmp_path / "no_sys_nice.py"
    script.write_text(NO_SYS_NICE)
    done = subprocess.run(
        ["setpriv", "--bounding-set=-sys_nice", "--inh-caps=-sys_nice", "--", sys.executable, str(script)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"leased": True, "status": 0, "nice": "0"}


# --- exec-inits that come back (exec_init._serve) -------------------------------------------------------------
async def test_an_exec_init_serves_a_later_exec_with_nothing_left_of_the_last(launcher: Launcher) -> None:
    """The agent's exec leaves a daemon behind; its exec-init ends it before it reports, then serves a later exec
    in the same namespace, where nothing of the first is left (the daemon's pid names no process there)."""
    await prime(launcher)
    leave = make_spec("/bin/sh", "-c", "setsid sleep 1000 >/dev/null 2>&1 & echo $!", stdin="null")
    first, status, out, _ = await run_exec(launcher, leave)
    assert status == 0 and first.nested
    daemon = int(out)
    probe = make_spec("/bin/sh", "-c", f"kill -0 {daemon} 2>/dev/null && echo alive || echo gone", stdin="null")
    later: dict[int, bytes] = {}
    with trio.fail_after(20):
        while first.pid not in later:  # the other spare serves the execs in between
            spawned, status, out, _ = await run_exec(launcher, probe)
            assert status == 0
            later[spawned.pid] = out
    assert later[first.pid] == b"gone\n"


LANDLOCK_PROBE = """
import json, os, sys
out = {"fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd"))}
for name in ("rw", "other"):
    try:
        with open(os.path.join(sys.argv[1], name, "f"), "w") as fh:
            fh.write(name)
        out[name] = 0
    except OSError as exc:
        out[name] = exc.errno
print(json.dumps(out))
"""


@pytest.mark.skipif(landlock.abi_version() < 2, reason="Landlock ABI >= 2 not available")
async def test_each_exec_an_exec_init_serves_is_confined_by_the_ruleset_it_built_once(
    launcher: Launcher, landlock_dirs: Path
) -> None:
    """A spare exec-init applies its Landlock ruleset to itself, once (``child.SELF``), for every command it
    starts: the first exec it serves and a later one are both held to it (a write outside ``read_write`` is
    refused that the same uid may make without Landlock), both get the note of the path it skipped, and neither
    holds the ruleset's fd."""
    base = str(landlock_dirs)
    spec = LandlockSpec(read_only=(*READ_ONLY, "/no/such/dir", os.path.dirname(PY)), read_write=(f"{base}/rw",))
    first_lease = await prime(launcher, landlock=spec)
    probe = make_spec(PY, "-c", LANDLOCK_PROBE, base, stdin="null", landlock=spec)
    served: dict[int, list[dict[str, Any]]] = {}
    with trio.fail_after(20):
        while len(served.get(first_lease.pid, ())) < 2:  # the other spare serves the execs in between
            spawned, status, out, err = await run_exec(launcher, probe)
            assert status == 0, err
            assert any("/no/such/dir" in note for note in spawned.notes), spawned.notes
            served.setdefault(spawned.pid, []).append(json.loads(out))
    for got in served[first_lease.pid]:
        assert (got["rw"], got["other"]) == (0, errno.EACCES), got
        assert got["fds"][:3] == [0, 1, 2] and len(got["fds"]) <= 4, got["fds"]  # 0-2 and the one listdir opens
    assert not (landlock_dirs / "other" / "f").exists()  # nothing of any confined exec reached the denied directory
    # Baseline: the same uid, no Landlock, writes there.
    _, status, out, _ = await run_exec(launcher, make_spec(PY, "-c", LANDLOCK_PROBE, base, stdin="null"))
    assert json.loads(out)["other"] == 0
