"""Identity fixed at ``connect()`` (docs/design.md "Identity"), attacked from the agent's side with the real launcher.

The test is the boundary: it prepares the launcher (models R, U and P, as root), gives it the connect-notify
hand-off socket, opens a listener inside the agent's network namespace and, for every connection accepted,
resolves the identity the way the boundary does (by the record the notification left) and answers it back to
the agent as an HTTP/1.0 body. The agent then runs one attack from tests/integration/connect_attacks.py and
reports what it saw; every attack must fail — the connection is attributed to the process that called
``connect`` — while the plain client and real descendants keep working.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from supervisor.boundary.capture import connect_notify
from supervisor.boundary.capture.connect_notify import ConnectNotifier
from supervisor.boundary.capture.connect_record import SWEEP_AT, ConnectRecords, ExecLog, FirstExecs
from supervisor.boundary.capture.identity import IdentityResolver, IdentityUnresolved
from supervisor.boundary.forkimage import NamespacePlan, SpawnSpec
from supervisor.boundary.process import Launcher
from tests.controls import protection_off

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the launcher's models R and U need root here"),
    pytest.mark.skipif(not connect_notify.available(), reason="this kernel lacks SECCOMP_RET_USER_NOTIF"),
    pytest.mark.skipif(not os.path.exists("/usr/bin/curl"), reason="curl is the 'allowed binary' of these attacks"),
]

PY = "/usr/bin/python3"
PYTHON = os.path.realpath(PY)
SH = os.path.realpath("/bin/sh")
CURL = os.path.realpath("/usr/bin/curl")
UID = GID = 1000
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
SCRIPT = Path(__file__).with_name("connect_attacks.py")


@pytest.fixture
def launcher() -> Iterator[Launcher]:
    zyg = Launcher.fork()  # before trio.run, as the boundary's main() does
    yield zyg
    zyg.close()


@pytest.fixture
def script_dir(tmp_path: Path) -> Iterator[Path]:
    """The attack script where the agent's uid can read it (pytest's tmp_path is under a root-only tree)."""
    base = Path("/tmp") / f"connect-identity-{os.getpid()}-{tmp_path.name}"
    base.mkdir(mode=0o755)
    shutil.copy(SCRIPT, base / SCRIPT.name)
    os.chmod(base / SCRIPT.name, 0o644)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def plan(model: str) -> NamespacePlan:
    return NamespacePlan(model, agent_ids=(UID, GID) if model == "U" else None)  # type: ignore[arg-type]


class World:
    def __init__(self, launcher: Launcher, notifier_cls: type[ConnectNotifier] = ConnectNotifier, **kw: Any) -> None:
        self.launcher = launcher
        self.agent: int | None = None
        self.scans = 0  # how often the workload's pid set (a scan of every process on the host) was taken

        def workload_pids() -> set[int]:
            self.scans += 1
            return launcher.workload_pids()

        self.resolver = IdentityResolver(
            anchor_pid=launcher.pid,
            workload_pids=workload_pids,
            agent_pid=lambda: self.agent,
            budget_us=5_000_000,
            records=ConnectRecords(),
            exec_log=ExecLog(),
        )
        self.notifier = notifier_cls(self.resolver, **kw)
        launcher.notify_socket = self.notifier.child_end()
        launcher.first_execs = self.notifier.first_execs  # as the boundary wires them
        self.verdicts: list[dict[str, Any]] = []

    async def serve(self, listener: trio.SocketListener) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                stream = await listener.accept()
                nursery.start_soon(self._one, stream)

    async def _one(self, stream: trio.SocketStream) -> None:
        async with stream:
            local, remote = stream.socket.getsockname(), stream.socket.getpeername()
            verdict: dict[str, Any]
            try:
                identity = self.resolver.resolve(local[:2], remote[:2])
                verdict = {"binary": identity.binary_path, "ancestors": list(identity.ancestors),
                           "loader_env": list(identity.loader_env), "pid": identity.pid}  # fmt: skip
            except IdentityUnresolved as exc:
                verdict = {"refused": str(exc.stage)}
            self.verdicts.append(verdict)
            body = (json.dumps(verdict) + "\n").encode()
            with trio.move_on_after(10):  # the request line (or curl's request); answer either way
                await stream.receive_some(4096)
            head = f"HTTP/1.0 200 OK\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            try:
                await stream.send_all(head + body)
            except trio.BrokenResourceError:
                pass

    async def run(
        self, model: str, case: str, script_dir: Path, *, stdin_after: Any = None, leased: bool = False, **kw: Any
    ) -> dict[str, Any]:
        """Prepare ``model``, run ``case`` as the agent, and return its report. ``leased``: run it as an exec
        through a spare the init leased (zygote.py "Spares"), after one exec through the init that prepares it:
        the spare's filter and listener were installed before its command existed."""
        return (await self.run_leased(model, case, script_dir, stdin_after=stdin_after, leased=leased, **kw))[0][1]

    async def run_leased(
        self, model: str, case: str, script_dir: Path, *, stdin_after: Any = None, leased: bool = True, times: int = 1,
        env: dict[str, str] | None = None, budget_s: float = 60,
    ) -> list[tuple[int, dict[str, Any]]]:  # fmt: skip
        """``run``, repeated (``leased``) until the first spare's exec-init has served ``times`` execs (the other
        spare serves those in between): each exec's ``(pid, report)``. ``env``: added to the agent's environment;
        ``budget_s``: how long it all may take."""
        await self.launcher.prepare(plan(model))
        raw = await self.launcher.socket_in_netns(socket.AF_INET, socket.SOCK_STREAM)
        raw.bind(("127.0.0.1", 0))
        raw.listen(16)
        port = raw.getsockname()[1]
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(raw))
        spec = SpawnSpec(
            argv=(PY, str(script_dir / SCRIPT.name), case, str(port)),
            env={**ENV, **(env or {})}, cwd="/", uid=UID, gid=GID, stderr="pipe",
        )  # fmt: skip
        with trio.fail_after(budget_s):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.notifier.serve)
                nursery.start_soon(self.serve, listener)
                lease = await self._prepare_lease(spec) if leased else None
                served: list[tuple[int, dict[str, Any]]] = []
                while not served or (lease is not None and sum(pid == lease for pid, _ in served) < times):
                    if served:
                        self._file_comebacks()
                    spawned = await self.launcher.spawn(spec, own_pidns=leased)
                    assert lease is None or served or spawned.pid == lease, "the exec did not go through the spare"
                    self.agent = spawned.pid
                    if stdin_after is not None:
                        await stdin_after(self, spawned.stdin)
                    elif spawned.stdin is not None:
                        os.close(spawned.stdin)
                    out, err = await _read(spawned.stdout), await _read(spawned.stderr)
                    status = await spawned.wait_status()
                    os.close(spawned.pidfd)
                    assert os.waitstatus_to_exitcode(status) == 0, err.decode()
                    served.append((spawned.pid, dict(json.loads(out.decode().strip().splitlines()[-1]))))
                nursery.cancel_scope.cancel()
        return served

    def _file_comebacks(self) -> None:
        """File the leases of exec-inits back from an exec, as the boundary's readers do."""
        self.launcher.workload_pids()

    async def _prepare_lease(self, spec: SpawnSpec) -> int:
        """One exec through the init with ``spec``'s confinement, then the pid of the spare leased for it."""
        first = await self.launcher.spawn(dataclasses.replace(spec, argv=("/bin/true",), stdin="null"), own_pidns=True)
        await _read(first.stdout)
        await _read(first.stderr)
        await first.wait_status()
        os.close(first.pidfd)
        while not self.launcher._leases:
            self.launcher.workload_pids()  # files the lease while nobody reads the launcher's socket
            await trio.sleep(0.005)
        assert self.launcher._leases[0].confinement.notify, "a spare without the connect-notify filter"
        return self.launcher._leases[0].pid


async def _read(fd: int | None) -> bytes:
    if fd is None:
        return b""
    out = bytearray()
    async with trio.lowlevel.FdStream(fd) as stream:
        while chunk := await stream.receive_some(65536):
            out += chunk
    return bytes(out)


MODELS = pytest.mark.parametrize("model", ["R", "U", "P"])  # P: no namespaces of ours, as root (docs/design.md)


@MODELS
async def test_plain_client_and_real_descendant_are_identified(
    launcher: Launcher, script_dir: Path, model: str
) -> None:
    world = World(launcher)
    report = await world.run(model, "plain", script_dir)
    assert report["verdict"] == {"binary": PYTHON, "ancestors": [], "loader_env": [], "pid": world.agent}
    assert world.scans == 0  # the agent has no ancestor to check: its connect costs no scan of the host's /proc
    launcher2 = Launcher.fork()
    try:
        world2 = World(launcher2)
        report = await world2.run(model, "descendant", script_dir)
    finally:
        launcher2.close()
    verdict = report["verdict"]
    assert (verdict["binary"], verdict["ancestors"], verdict["loader_env"]) == (CURL, [SH, PYTHON], [])
    assert world2.scans >= 1  # a descendant's ancestors are checked against the workload


@pytest.mark.parametrize("model", ["R", "U"])  # P has no PID namespace, so no spare
async def test_every_exec_an_exec_init_serves_is_identified_through_its_one_listener(
    launcher: Launcher, script_dir: Path, model: str
) -> None:
    """A spare exec-init installs the connect-notify filter on itself, once (``child.SELF``): its first
    lease carries the listener and its later ones none, yet every exec it serves is under the filter and its
    connect is recorded through that one listener (without a record it would be refused as no-record), and no
    exec it serves holds that listener (or anything else of the exec-init's) beyond its stdio."""
    world = World(launcher)
    served = await world.run_leased(model, "held_fds", script_dir, times=3)
    first = served[0][0]
    assert sum(pid == first for pid, _ in served) == 3
    for pid, report in served:
        assert report["verdict"].get("binary") == PYTHON, (pid, report, world.verdicts)
        # The agent's side: nothing of its exec-init's (the listener it could answer itself with) reached it.
        assert {fd: target for fd, target in report["fds"].items() if int(fd) > 2} == {}, report["fds"]
    assert world.notifier.counters["recorded"] >= len(served)
    # One listener per exec-init (and the one exec that prepared the spares, through the init), not one per exec.
    exec_inits = {pid for pid, _ in served}
    assert world.notifier.counters["listeners"] <= 1 + len(exec_inits) + 1, world.notifier.counters


@pytest.mark.parametrize("model", ["R", "U"])  # P has no PID namespace, so no spare
@pytest.mark.parametrize("case", ["plain", "scm_rights_then_exec"])
async def test_an_exec_through_a_leased_spare_is_identified_at_connect(
    launcher: Launcher, script_dir: Path, model: str, case: str
) -> None:
    """A spare installs the connect-notify filter before its command exists and its listener reaches the notifier
    with the lease: the exec's connect is recorded (without a record it would be refused as no-record), and a
    socket handed on and exec'd over still names the python that connected."""
    world = World(launcher)
    report = await world.run(model, case, script_dir, leased=True)
    assert report["verdict"].get("binary") == PYTHON, (report, world.verdicts)
    assert world.verdicts == [report["verdict"]]
    assert world.notifier.counters["recorded"] >= 1
    # its first execve was one the launcher vouched for (connect_record.py rule 6): the same identity, nothing read
    assert world.notifier.counters["vouched_execs"] == 1, world.notifier.counters


@pytest.mark.parametrize("model", ["R", "U"])  # P has no PID namespace, so no spare
async def test_a_command_that_execs_itself_under_ld_preload_in_its_window_is_read_from_memory(
    launcher: Launcher, script_dir: Path, model: str
) -> None:
    """connect_record.py rule 6 from the agent's side, in the worst case: the window of first execs held open for
    the command's whole life (as if the boundary never got to read its status pipe). The command's own first
    execve is the one vouched for; it then re-executes itself, same pid, under LD_PRELOAD and erases the variable
    from its environment block before it connects, so only that execve's notification can name the preload: it
    is read from its memory, and the connection names it."""
    world = World(launcher)
    closed: list[int] = []
    world.notifier.first_execs.close = closed.append  # type: ignore[method-assign]  # never closes
    [(_pid, report)] = await world.run_leased(model, "reexec_preload_scrubbed", script_dir)
    assert report["scrubbed"] is True  # the attack happened: /proc/PID/environ no longer shows it
    assert report["verdict"]["loader_env"] == ["LD_PRELOAD"], (report, world.verdicts)
    assert world.notifier.counters["vouched_execs"] == 1, world.notifier.counters  # the first exec's, only
    assert closed, "the launcher never ended the window"


@pytest.fixture
def windows_never_spent(monkeypatch: pytest.MonkeyPatch) -> None:
    """Protection off: a window of first execs vouches for every ``execve`` while open, not for the first only."""
    monkeypatch.setattr(FirstExecs, "take", lambda self, ppid: ppid in self._open)


@protection_off("one vouched execve per window of first execs")
async def test_a_command_that_execs_itself_under_ld_preload_in_its_window_is_read_from_memory_twin(
    windows_never_spent: None, launcher: Launcher, script_dir: Path
) -> None:
    await test_a_command_that_execs_itself_under_ld_preload_in_its_window_is_read_from_memory(launcher, script_dir, "R")


@MODELS
async def test_scm_rights_hand_off_then_exec_keeps_the_connector(
    launcher: Launcher, script_dir: Path, model: str
) -> None:
    """Connect, pass the socket on, exec sh on it: accept-time resolution would name sh; the record names
    the python that called connect."""
    world = World(launcher)
    report = await world.run(model, "scm_rights_then_exec", script_dir)
    assert report["verdict"].get("binary") == PYTHON, (report, world.verdicts)
    assert world.verdicts == [report["verdict"]]


@MODELS
async def test_child_forked_before_its_parent_execs_is_not_the_new_images_descendant(
    launcher: Launcher, script_dir: Path, model: str
) -> None:
    world = World(launcher)
    report = await world.run(model, "fork_before_exec", script_dir)
    assert report["parent_exe"] == SH  # the attack happened: the parent is sh when its child connects
    assert report["verdict"]["binary"] == PYTHON
    assert report["verdict"]["ancestors"] == [PYTHON], report  # the parent as it was when the child was forked


@pytest.fixture
def no_image_at_creation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Protection off: the exec log never notes the image a child was created under."""
    monkeypatch.setattr(ExecLog, "note_child", lambda self, pid, start_time, parent_exe: None)


@protection_off("the parent's image at the child's creation (the exec log)")
async def test_child_forked_before_its_parent_execs_is_not_the_new_images_descendant_twin(
    no_image_at_creation: None, launcher: Launcher, script_dir: Path
) -> None:
    await test_child_forked_before_its_parent_execs_is_not_the_new_images_descendant(launcher, script_dir, "R")


CHURN_ROUNDS = 100_000  # short-lived processes: far more than the 65,536 entries a count-bounded log kept


class PeakExecLog(ExecLog):
    """The exec log, remembering the most entries either table held."""

    peak = 0

    def note_child(self, pid: int, start_time: int, parent_exe: str) -> None:
        super().note_child(pid, start_time, parent_exe)
        self.peak = max(self.peak, *self.sizes)

    def note_loader(self, pid: int, start_time: int, names: tuple[str, ...]) -> None:
        super().note_loader(pid, start_time, names)
        self.peak = max(self.peak, *self.sizes)


@pytest.mark.parametrize("model", ["R", "U"])
async def test_no_churn_of_short_lived_processes_makes_the_exec_log_forget(
    launcher: Launcher, script_dir: Path, model: str
) -> None:
    """The agent makes a child, then its parent execs sh; it starts a process under LD_PRELOAD that erases the
    variable from its environment block. Both connect, then the agent makes 100,000 short-lived processes that
    each leave the exec log two entries, then both connect again: each is still what it was (the parent as it
    was when the child was made, the preload named), and the log held about what was alive, not what churned."""
    world = World(launcher)
    log = world.resolver.exec_log = PeakExecLog()
    report = await world.run(model, "churn_then_connect", script_dir, env={"CHURN_ROUNDS": str(CHURN_ROUNDS)},
                             budget_s=240)  # fmt: skip
    assert report["parent_exe"] == SH  # the attack happened: the parent is sh when its child connects
    for when in ("before", "after"):
        verdict = report[when]
        assert (verdict["binary"], verdict["ancestors"]) == (PYTHON, [PYTHON]), (when, report)
        preloaded = report[f"preloaded_{when}"]
        assert preloaded["scrubbed"] is True, report  # /proc/PID/environ no longer shows it
        assert preloaded["verdict"]["loader_env"] == ["LD_PRELOAD"], (when, report)
    counters = world.notifier.counters
    assert counters["notifications"] >= CHURN_ROUNDS, counters  # the churn was seen
    print(f"churn {report['churn_s']} s, exec log peak {log.peak} entries, {counters['notifications']} notifications")
    assert log.peak <= SWEEP_AT + SWEEP_AT // 3 + 2 * 250, (log.peak, report["churn_s"])


@MODELS
async def test_loader_injection_is_reported(launcher: Launcher, script_dir: Path, model: str) -> None:
    world = World(launcher)
    report = await world.run(model, "preload", script_dir)
    assert report["verdict"]["binary"] == CURL
    assert report["verdict"]["loader_env"] == ["LD_PRELOAD"]
    launcher2 = Launcher.fork()
    try:
        report = await World(launcher2).run(model, "library_path", script_dir)
    finally:
        launcher2.close()
    assert report["verdicts"]["writable"]["loader_env"] == ["LD_LIBRARY_PATH"]
    assert report["verdicts"]["system"]["loader_env"] == []


@MODELS
async def test_a_preload_that_erases_itself_is_still_reported(launcher: Launcher, script_dir: Path, model: str) -> None:
    """The variable is read from the environment passed to execve, not (only) from the process's own memory,
    which it can rewrite; a fork of that process inherits it."""
    world = World(launcher)
    report = await world.run(model, "preload_scrubbed", script_dir)
    assert report["scrubbed"] is True  # the attack happened: /proc/PID/environ no longer shows it
    assert report["verdict"]["binary"] == PYTHON and report["verdict"]["loader_env"] == ["LD_PRELOAD"], report
    assert report["child"]["loader_env"] == ["LD_PRELOAD"], report


@pytest.fixture
def no_envp_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Protection off: the environment passed to ``execve`` is not read; only ``/proc/PID/environ`` is."""
    monkeypatch.setattr(IdentityResolver, "_envp_loader_env", lambda self, tid, envp: ())


@protection_off("reading the loader variables from the environment passed to execve")
async def test_a_preload_that_erases_itself_is_still_reported_twin(
    no_envp_read: None, launcher: Launcher, script_dir: Path
) -> None:
    await test_a_preload_that_erases_itself_is_still_reported(launcher, script_dir, "R")


@MODELS
async def test_fast_open_send_is_refused(launcher: Launcher, script_dir: Path, model: str) -> None:
    world = World(launcher)
    report = await world.run(model, "fastopen", script_dir)
    assert report["fastopen"] == errno.errorcode[errno.EOPNOTSUPP], report
    assert report["then"]["binary"] == PYTHON  # an ordinary connect afterwards still works
    assert len(world.verdicts) == 1  # nothing reached the listener by the refused send


@MODELS
async def test_a_second_listener_is_refused(launcher: Launcher, script_dir: Path, model: str) -> None:
    world = World(launcher)
    report = await world.run(model, "second_listener", script_dir)
    assert report["listener"] == "EPERM", report
    assert report["then"]["binary"] == PYTHON  # still recorded by our listener


async def test_every_trapped_call_is_answered_once(
    launcher: Launcher, script_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One answer per notification: a recorded connect is answered before its record is stored, and not again
    (a second answer is a failing ioctl on the boundary's loop for every connection)."""
    answers: list[int] = []
    answer = connect_notify.answer_continue

    def counted(listener: int, nid: int) -> None:
        answers.append(nid)
        answer(listener, nid)

    monkeypatch.setattr(connect_notify, "answer_continue", counted)
    world = World(launcher)
    report = await world.run("R", "descendant", script_dir)
    assert report["verdict"]["binary"] == CURL
    assert world.notifier.counters["recorded"] >= 1
    assert len(answers) == len(set(answers)) == world.notifier.counters["notifications"]


async def test_a_stalled_boundary_never_hangs_the_agent(launcher: Launcher, script_dir: Path) -> None:
    """Hashing the caller's binary (its first connection) never finishes: the connect is let through after the
    bound, without a record, and refused at accept."""
    world = World(launcher, bound=0.5)
    world.resolver.digest = lambda fd: time.sleep(20)  # type: ignore[method-assign]
    report = await world.run("R", "stalled", script_dir)
    assert 0.4 <= report["connected_after_s"] < 5, report
    assert report["verdict"] == {"refused": "no-record"}
    assert world.notifier.counters["timed_out"] == 1


async def test_without_the_boundary_a_trapped_connect_fails(launcher: Launcher, script_dir: Path) -> None:
    """The listener closed (the boundary gone): the kernel fails the call with ENOSYS, never hangs it."""

    async def close_listeners_then_go(world: World, stdin: int | None) -> None:
        assert stdin is not None
        # the agent is past its exec once it waits on stdin: the listener can go
        for _ in range(500):
            if _waiting_on_read(world.agent):
                break
            await trio.sleep(0.01)
        world.notifier.close_listeners()
        os.write(stdin, b"go\n")
        os.close(stdin)

    world = World(launcher)
    report = await world.run("R", "boundary_gone", script_dir, stdin_after=close_listeners_then_go)
    assert report == {"connect": errno.errorcode[errno.ENOSYS]}
    assert world.verdicts == []


def _waiting_on_read(pid: int | None) -> bool:
    """The agent runs the case's python and sleeps (reading its stdin)."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return exe == PYTHON and state == "S"


def test_the_filter_denies_what_it_must_without_a_boundary() -> None:
    """The filter program on its own (no listener served): FASTOPEN and a nested listener are refused."""
    code = (
        "import socket, errno, os\n"
        "s = socket.socket()\n"
        "try:\n"
        "    s.sendto(b'x', socket.MSG_FASTOPEN, ('127.0.0.1', 9))\n"
        "    print('sent')\n"
        "except OSError as e:\n"
        "    print(errno.errorcode[e.errno])\n"
    )
    installer = (
        "import os, sys, ctypes\n"
        "from supervisor.boundary.forkimage import seccomp, linux\n"
        "linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)\n"
        "fd = seccomp.install_listener(seccomp.notify_program())\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        f"    exec({code!r})\n"
        "    sys.stdout.flush()\n"  # os._exit does not (a pipe's stdout is buffered unless PYTHONUNBUFFERED)
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", installer], capture_output=True,
                         timeout=30, cwd=Path(__file__).parents[2])  # fmt: skip
    assert out.stdout.decode().strip() == errno.errorcode[errno.EOPNOTSUPP], out.stderr.decode()


def test_sock_diag_reports_the_connecting_sockets_cookie() -> None:
    """What ties an accepted connection to its record: sock_diag's cookie is the client's SO_COOKIE."""
    from supervisor.boundary.capture._sockdiag import SockDiag

    with socket.socket() as server, socket.socket() as client:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        client.connect(server.getsockname())
        diag = SockDiag.open()
        try:
            found = diag.lookup(client.getsockname(), server.getsockname())
        finally:
            diag.close()
        cookie = int.from_bytes(client.getsockopt(socket.SOL_SOCKET, connect_notify.SO_COOKIE, 8), "little")
        assert found is not None and found.cookie == cookie != 0
        assert found.inode == os.fstat(client.fileno()).st_ino
