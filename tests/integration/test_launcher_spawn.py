"""The launcher as root (model R, and P forced): real forks, namespaces, uid drop, Landlock, seccomp.

Security properties are checked from the workload's side: a child script tries the forbidden thing and
reports what the kernel answered. Each such test has a baseline run without the control, so the test can
tell "blocked" from "never worked here".
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from supervisor.boundary.forkimage import LandlockSpec, NamespacePlan, SpawnSpec, landlock, spawner
from supervisor.boundary.process import Launcher, LauncherError, SpawnError
from supervisor.boundary.process.launcher import Spawned

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="launcher model R tests need root")

PY = "/usr/bin/python3"  # readable by the workload uid (the pyenv python under /root is not)
UID = GID = 1000
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


@pytest.fixture
def launcher() -> Iterator[Launcher]:
    zyg = Launcher.fork()  # sync fixture: runs before trio.run, as the boundary's main() does
    yield zyg
    zyg.close()


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    """A directory the workload uid can write (pytest's tmp_path is under a root-only tree)."""
    base = Path("/tmp") / f"launcher-test-{os.getpid()}-{tmp_path.name}"
    base.mkdir(mode=0o755)
    os.chown(base, UID, GID)
    yield base
    subprocess.run(["rm", "-rf", str(base)], check=False)


def make_spec(*argv: str, **kw: Any) -> SpawnSpec:
    kw.setdefault("env", ENV)
    kw.setdefault("cwd", "/")
    kw.setdefault("uid", UID)
    kw.setdefault("gid", GID)
    return SpawnSpec(argv=argv, **kw)


async def read_all(fd: int | None) -> bytes:
    if fd is None:
        return b""
    out = bytearray()
    async with trio.lowlevel.FdStream(fd) as stream:
        while chunk := await stream.receive_some(65536):
            out += chunk
    return bytes(out)


async def run(zyg: Launcher, spec: SpawnSpec) -> tuple[int, bytes, bytes]:
    """Spawn, collect stdout/stderr to EOF, and return (raw status, stdout, stderr)."""
    _spawned, status, out, err = await run_spawned(zyg, spec)
    return status, out, err


async def run_spawned(
    zyg: Launcher, spec: SpawnSpec, *, own_pidns: bool = False, stdin: bytes = b""
) -> tuple[Spawned, int, bytes, bytes]:
    """Spawn, write ``stdin``, collect stdout/stderr to EOF: (spawned, raw status, stdout, stderr)."""
    spawned = await zyg.spawn(spec, own_pidns=own_pidns)
    if spawned.stdin is not None:
        os.write(spawned.stdin, stdin)
        os.close(spawned.stdin)
    results: dict[str, bytes] = {}

    async def collect(name: str, fd: int | None) -> None:
        results[name] = await read_all(fd)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect, "out", spawned.stdout)
            nursery.start_soon(collect, "err", spawned.stderr)
        status = await spawned.wait_status()
    os.close(spawned.pidfd)
    return spawned, status, results["out"], results["err"]


async def run_py(zyg: Launcher, code: str, **kw: Any) -> Any:
    """Run a python snippet as the workload; it prints one JSON document."""
    status, out, err = await run(zyg, make_spec(PY, "-c", code, **kw))
    assert os.waitstatus_to_exitcode(status) == 0, err.decode()
    return json.loads(out)


async def eventually(predicate: Any, seconds: float = 5.0) -> bool:
    """Poll ``predicate`` until it holds or ``seconds`` pass; returns its last value."""
    for _ in range(int(seconds / 0.01)):
        if predicate():
            return True
        await trio.sleep(0.01)
    return bool(predicate())


def proc_line(path: str, key: str) -> list[str]:
    with open(path) as fh:
        return next(line.split()[1:] for line in fh if line.startswith(key))


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # ESRCH: reaped between the open and the read
        return False


# --- exit statuses ---------------------------------------------------------------------------------------
async def test_exit_codes_and_signals(launcher: Launcher) -> None:
    await launcher.prepare(NamespacePlan("R"))
    status, _, _ = await run(launcher, make_spec("/bin/true"))
    assert os.waitstatus_to_exitcode(status) == 0
    status, _, _ = await run(launcher, make_spec("/bin/sh", "-c", "exit 3"))
    assert os.waitstatus_to_exitcode(status) == 3
    status, _, _ = await run(launcher, make_spec("/bin/sh", "-c", "kill -TERM $$"))
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
    status, out, err = await run(launcher, make_spec("/bin/sh", "-c", "echo out; echo err >&2"))
    assert (out, err) == (b"out\n", b"err\n")  # stdout and stderr kept apart


async def test_stdin_pipe_and_environment_exact(launcher: Launcher) -> None:
    await launcher.prepare(NamespacePlan("R"))
    spawned = await launcher.spawn(make_spec("/bin/sh", "-c", "cat; env | sort", env={"PATH": "/bin", "K": "v"}))
    assert spawned.stdin is not None
    os.write(spawned.stdin, b"hello\n")
    os.close(spawned.stdin)  # EOF reaches cat
    out = await read_all(spawned.stdout)
    await read_all(spawned.stderr)
    assert os.waitstatus_to_exitcode(await spawned.wait_status()) == 0
    lines = out.decode().splitlines()
    assert lines[0] == "hello"
    # Only what the spec gave (plus what sh itself sets: PWD, SHLVL, _): nothing from our own environment.
    keys = {line.split("=", 1)[0] for line in lines[1:]}
    assert keys <= {"PATH", "K", "PWD", "SHLVL", "_", "OLDPWD"}
    assert "K=v" in lines[1:]


async def test_wait_status_is_stable(launcher: Launcher) -> None:
    await launcher.prepare(NamespacePlan("R"))
    spawned = await launcher.spawn(make_spec("/bin/sh", "-c", "exit 7", stdin="null"))
    first = await spawned.wait_status()
    assert first == await spawned.wait_status()
    assert os.waitstatus_to_exitcode(first) == 7


# --- launch failures -------------------------------------------------------------------------------------
async def test_enoent_is_127(launcher: Launcher) -> None:
    await launcher.prepare(NamespacePlan("R"))
    for argv0 in ("no-such-program-here", "/no/such/program"):
        with pytest.raises(SpawnError) as info:
            await launcher.spawn(make_spec(argv0))
        assert (info.value.stage, info.value.errno, info.value.exit_code) == ("execve", errno.ENOENT, 127)


async def test_eacces_is_126(launcher: Launcher, workdir: Path) -> None:
    await launcher.prepare(NamespacePlan("R"))
    script = workdir / "not-executable"
    script.write_text("#!/bin/sh\necho nope\n")
    script.chmod(0o644)
    with pytest.raises(SpawnError) as info:
        await launcher.spawn(make_spec(str(script)))
    assert (info.value.stage, info.value.errno, info.value.exit_code) == ("execve", errno.EACCES, 126)
    # Found on PATH but not executable: EACCES too, not "not found".
    with pytest.raises(SpawnError) as info:
        await launcher.spawn(make_spec("not-executable", env={"PATH": str(workdir)}))
    assert info.value.exit_code == 126


async def test_cwd_the_uid_cannot_enter(launcher: Launcher, tmp_path: Path) -> None:
    await launcher.prepare(NamespacePlan("R"))
    private = tmp_path / "root-only"
    private.mkdir(mode=0o700)
    with pytest.raises(SpawnError) as info:
        await launcher.spawn(make_spec("/bin/true", cwd=str(private)))
    assert (info.value.stage, info.value.errno) == ("chdir", errno.EACCES)
    # The same directory as root is fine: the failure comes from the drop happening first.
    status, _, _ = await run(launcher, make_spec("/bin/true", cwd=str(private), uid=0, gid=0))
    assert status == 0


async def test_failed_launch_leaves_no_process(launcher: Launcher) -> None:
    await launcher.prepare(NamespacePlan("R"))
    for _ in range(5):
        with pytest.raises(SpawnError):
            await launcher.spawn(make_spec("/no/such"))
    # The failed children exit on their own; the init reaps them.
    assert await eventually(lambda: not launcher.workload_pids())
    await launcher.ping()
    assert not launcher._exits  # exits of failed launches are dropped, not kept for a waiter that never comes


async def test_spawn_before_prepare_and_prepare_twice(launcher: Launcher) -> None:
    with pytest.raises(LauncherError):
        await launcher.spawn(make_spec("/bin/true"))
    await launcher.prepare(NamespacePlan("R"))
    with pytest.raises(LauncherError):
        await launcher.prepare(NamespacePlan("R"))


async def test_validation_errors_before_fork(launcher: Launcher) -> None:
    await launcher.prepare(NamespacePlan("R"))
    with pytest.raises(SpawnError) as info:
        await launcher.spawn(make_spec("/bin/true", env={"A=B": "1"}))
    assert info.value.stage == "validate" and info.value.exit_code == 125
    with pytest.raises(SpawnError) as info:
        await launcher.spawn(make_spec("/bin/true", env={"BIG": "x" * 300_000}))
    assert (info.value.stage, info.value.errno) == ("validate", errno.E2BIG)
    status, _, _ = await run(launcher, make_spec("/bin/true"))  # the launcher is still fine
    assert status == 0


# --- identity and hardening, from the child's side --------------------------------------------------------
STATUS_PROBE = r"""
import json, os
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
out = {k: status[k].split() for k in ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd",
                                      "CapAmb", "NoNewPrivs", "Seccomp")}
try:
    os.setuid(0); out["setuid0"] = "succeeded"
except OSError as e:
    out["setuid0"] = e.errno
out["sid_is_pid"] = os.getsid(0) == os.getpid()
out["umask"] = os.umask(0)
out["fds"] = sorted(int(f) for f in os.listdir("/proc/self/fd"))
out["core"] = __import__("resource").getrlimit(__import__("resource").RLIMIT_CORE)
out["nice"] = os.getpriority(os.PRIO_PROCESS, 0)
print(json.dumps(out))
"""


async def test_child_identity_and_hardening(launcher: Launcher) -> None:
    await launcher.prepare(NamespacePlan("R"))
    out = await run_py(launcher, STATUS_PROBE, groups=(2000, 2001))
    assert out["Uid"] == ["1000"] * 4 and out["Gid"] == ["1000"] * 4
    assert sorted(out["Groups"]) == ["2000", "2001"]
    for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(out[key][0], 16) == 0, key
    assert out["NoNewPrivs"] == ["1"] and out["Seccomp"] == ["2"]
    assert out["setuid0"] == errno.EPERM
    assert out["nice"] == 0
    assert out["sid_is_pid"] is True  # own session
    assert out["umask"] == 0o022
    assert out["fds"][:3] == [0, 1, 2] and len(out["fds"]) <= 4  # 0-2 plus the fd listdir itself opens
    assert out["core"] == [0, 0]


async def test_signal_dispositions_and_mask_are_reset(launcher: Launcher) -> None:
    """The zygote ignores SIGPIPE and catches SIGCHLD; neither may reach the workload through execve."""
    await launcher.prepare(NamespacePlan("R"))
    # (Caught signals cannot cross execve at all; ignored ones and the mask can.)
    status, out, err = await run(launcher, make_spec("/bin/grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status"))
    assert status == 0, err
    fields = dict(line.split(":\t") for line in out.decode().splitlines())
    assert fields == {"SigIgn": "0" * 16, "SigBlk": "0" * 16}


async def test_root_groups_are_not_inherited(launcher: Launcher) -> None:
    await launcher.prepare(NamespacePlan("R"))
    out = await run_py(launcher, STATUS_PROBE)
    assert out["Groups"] == []


ATTACKS = r"""
import ctypes, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def call(fn):
    try:
        r = fn()
        if isinstance(r, int) and r < 0:
            return ctypes.get_errno()
        return 0
    except OSError as e:
        return e.errno
out = {
    "ptrace_traceme": call(lambda: libc.ptrace(0, 0, None, None)),
    "unshare_user": call(lambda: libc.unshare(0x10000000)),
    "memfd_create": call(lambda: os.memfd_create("x")),
    "af_packet": call(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW)),
    "netlink_route": call(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)),
    "pidfd_open": call(lambda: os.pidfd_open(os.getpid())),
    "io_uring_setup": call(lambda: libc.syscall(425, 1, None)),
}
print(json.dumps(out))
"""


@pytest.mark.parametrize("with_seccomp", [True, False])
async def test_seccomp_blocks_attacks(launcher: Launcher, with_seccomp: bool) -> None:
    await launcher.prepare(NamespacePlan("R"))
    out = await run_py(launcher, ATTACKS, seccomp=with_seccomp)
    assert out["netlink_route"] == 0  # getifaddrs keeps working either way
    if with_seccomp:
        for name in ("ptrace_traceme", "unshare_user", "memfd_create", "af_packet", "pidfd_open", "io_uring_setup"):
            assert out[name] == errno.EPERM, name
    else:  # baseline: these do work for uid 1000 here, so the EPERM above is the filter's doing
        assert out["unshare_user"] == 0 and out["memfd_create"] == 0 and out["ptrace_traceme"] == 0
        assert out["pidfd_open"] == 0


# --- Landlock -------------------------------------------------------------------------------------------
READ_ONLY = ("/usr", "/bin", "/lib", "/lib64", "/etc", "/dev", "/proc")


@pytest.mark.skipif(landlock.abi_version() < 2, reason="Landlock ABI >= 2 not available")
async def test_landlock_denies_writes_outside_read_write(launcher: Launcher, workdir: Path) -> None:
    await launcher.prepare(NamespacePlan("R"))
    allowed, denied = workdir / "rw", workdir / "other"
    for d in (allowed, denied):
        d.mkdir()
        os.chown(d, UID, GID)
    script = f"echo a > {allowed}/f && echo ok; echo b > {denied}/f && echo LEAK"
    spec = LandlockSpec(read_only=(*READ_ONLY, "/no/such/dir"), read_write=(str(allowed),))
    spawned = await launcher.spawn(make_spec("/bin/sh", "-c", script, landlock=spec))
    out = await read_all(spawned.stdout)
    err = await read_all(spawned.stderr)
    await spawned.wait_status()
    assert out == b"ok\n", err
    assert b"Permission denied" in err
    assert not (denied / "f").exists() and (allowed / "f").read_text() == "a\n"
    assert any("/no/such/dir" in note for note in spawned.notes)  # the skipped path is reported
    # Baseline: without Landlock the same uid writes there.
    _, out, _ = await run(launcher, make_spec("/bin/sh", "-c", script))
    assert b"LEAK" in out


@pytest.mark.skipif(landlock.abi_version() < 2, reason="Landlock ABI >= 2 not available")
async def test_landlock_hard_requirement_with_nothing_grantable_fails(launcher: Launcher) -> None:
    await launcher.prepare(NamespacePlan("R"))
    spec = LandlockSpec(read_only=("/no/such/a",), read_write=(), mode="hard_requirement")
    with pytest.raises(SpawnError) as info:
        await launcher.spawn(make_spec("/bin/true", landlock=spec))
    assert info.value.stage == "landlock"


@pytest.fixture
def victim() -> Iterator[int]:
    """A process of the workload uid outside the workload (think: another tenant, or the boundary in P)."""
    proc = subprocess.Popen(["setpriv", f"--reuid={UID}", f"--regid={GID}", "--clear-groups", "sleep", "60"])
    yield proc.pid
    proc.kill()
    proc.wait()


KILL_PROBE = """
import json, os, sys
try:
    os.kill(int(sys.argv[1]), 0)
    print(0)
except OSError as e:
    print(e.errno)
"""


@pytest.mark.skipif(landlock.abi_version() < 6, reason="Landlock signal scoping needs ABI >= 6")
async def test_landlock_scopes_signals(launcher: Launcher, victim: int) -> None:
    """Without a PID namespace the target pid is nameable; Landlock's signal scope is what stops the kill."""
    await launcher.prepare(NamespacePlan("R", pidns=False))
    spec = LandlockSpec(read_only=READ_ONLY, read_write=())
    _, out, _ = await run(launcher, make_spec(PY, "-c", KILL_PROBE, str(victim), landlock=spec))
    assert int(out) == errno.EPERM
    _, out, _ = await run(launcher, make_spec(PY, "-c", KILL_PROBE, str(victim)))
    assert int(out) == 0  # baseline: same uid, no scope, the signal goes through


# --- namespaces ------------------------------------------------------------------------------------------
NET_PROBE = r"""
import json, socket, sys
port = int(sys.argv[1])
out = {"links": [name for _, name in socket.if_nameindex()]}
def dial(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect((host, port)); return 0
    except OSError as e:
        return e.errno or -1
    finally:
        s.close()
out["outer_listener"] = dial("127.0.0.1", port)
out["test_net"] = dial("198.51.100.7", 80)  # no route in the agent netns: nothing leaves
print(json.dumps(out))
"""


async def test_agent_netns_has_only_loopback(launcher: Launcher) -> None:
    prepared = await launcher.prepare(NamespacePlan("R"))
    assert prepared.netns_path == f"/proc/{launcher.pid}/ns/net"
    assert os.stat(prepared.netns_path).st_ino != os.stat("/proc/self/ns/net").st_ino
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        status, out, err = await run(launcher, make_spec(PY, "-c", NET_PROBE, str(port)))
    assert status == 0, err
    result = json.loads(out)
    assert result["links"] == ["lo"]
    assert result["outer_listener"] == errno.ECONNREFUSED
    assert result["test_net"] == errno.ENETUNREACH


async def test_socket_in_netns_is_reachable_only_from_inside(launcher: Launcher) -> None:
    await launcher.prepare(NamespacePlan("R"))
    listener = await launcher.socket_in_netns(socket.AF_INET, socket.SOCK_STREAM)
    with listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code = (
            f"import socket, json\ns = socket.create_connection(('127.0.0.1', {port}), 2)\n"
            "s.sendall(b'inside'); s.close(); print(json.dumps('sent'))"
        )
        assert await run_py(launcher, code) == "sent"
        conn, _ = listener.accept()
        with conn:
            assert conn.recv(16) == b"inside"
        with socket.socket() as outside:  # from the test's own netns the port is not there
            assert outside.connect_ex(("127.0.0.1", port)) == errno.ECONNREFUSED


@pytest.fixture
def secret_dir(workdir: Path) -> Path:
    keys = workdir / "keys"
    keys.mkdir(mode=0o755)
    (keys / "boundary.key").write_text("secret")
    (keys / "boundary.key").chmod(0o644)
    return keys


async def test_hide_paths_show_an_empty_directory(launcher: Launcher, secret_dir: Path) -> None:
    await launcher.prepare(NamespacePlan("R", hide_paths=(str(secret_dir),)))
    code = f"import os, json\nprint(json.dumps(os.listdir({str(secret_dir)!r})))"
    assert await run_py(launcher, code, uid=0, gid=0) == []  # even root in the workload sees nothing
    assert (secret_dir / "boundary.key").read_text() == "secret"  # the host's view is untouched


async def test_pid_namespace_and_own_proc(launcher: Launcher) -> None:
    await launcher.prepare(NamespacePlan("R"))
    code = (
        "import os, json\nprint(json.dumps([os.getpid(), sorted(int(p) for p in os.listdir('/proc') if p.isdigit())]))"
    )
    spawned = await launcher.spawn(make_spec(PY, "-c", code))
    out = json.loads(await read_all(spawned.stdout))
    await spawned.wait_status()
    ns_pid, visible = out
    assert ns_pid == spawned.ns_pid and ns_pid != spawned.pid
    # The init and itself: not the boundary, not the zygote; and at most the init's spare exec-inits (forked
    # after this spawn's reply, so the listing may or may not have caught them).
    extra = set(visible) - {1, ns_pid}
    assert visible[0] == 1 and ns_pid in visible
    if extra:
        spares = await _spares(launcher, spawner.SPARES)
        assert extra <= {_ns_pids(pid)[1] for spare in spares for pid in (spare, *_children(spare))}


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


async def _spare(launcher: Launcher) -> int:
    """The host pid of the oldest spare exec-init the init leased the launcher, once it has."""
    return (await _spares(launcher, 1))[0]


async def _spares(launcher: Launcher, count: int) -> list[int]:
    """The host pids of the spare exec-inits leased to the launcher, once there are ``count``."""
    deadline = time.monotonic() + 10
    while len(launcher._leases) < count:
        assert time.monotonic() < deadline, f"fewer than {count} spare exec-inits were leased"
        launcher.workload_pids()  # files what the zygote sent while nobody reads its socket
        await trio.sleep(0.01)
    return [lease.pid for lease in launcher._leases]


def _ns_pids(host_pid: int) -> list[int]:
    return [int(p) for p in proc_line(f"/proc/{host_pid}/status", "NSpid:")]


SPARE_ATTACK = """
import ctypes, json, os, signal, sys
pid = int(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
out = {}
for name, sig in (("kill", signal.SIGKILL), ("term", signal.SIGTERM), ("stop", signal.SIGSTOP)):
    try:
        os.kill(pid, sig)
        out[name] = "sent"
    except OSError as exc:
        out[name] = exc.errno
out["ptrace"] = 0 if libc.ptrace(16, pid, None, None) == 0 else ctypes.get_errno()  # PTRACE_ATTACH
for what in ("mem", "environ", "ns/pid", "fd/3"):
    try:
        os.close(os.open(f"/proc/{pid}/{what}", os.O_RDONLY))
        out[what] = "opened"
    except OSError as exc:
        out[what] = exc.errno
print(json.dumps(out))
"""


async def test_the_agent_cannot_touch_the_spare_exec_init(launcher: Launcher) -> None:
    """The spare exec-init waits in the workload's PID namespace: the agent (another uid, no capability) can
    see it but cannot signal, stop, trace, read or enter it, and an exec afterwards still runs through it. The
    same holds once it served an exec and waits again (it took its own ids back after the spawn)."""
    await launcher.prepare(NamespacePlan("R"))
    agent = await launcher.spawn(make_spec("/bin/sleep", "60", stdin="null"))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(agent.wait_status)  # as the boundary always does: the launcher's messages are read
        await _spare_attack(launcher)
        signal.pidfd_send_signal(agent.pidfd, signal.SIGKILL)


async def _spare_attack(launcher: Launcher) -> None:
    spare = await _spare(launcher)
    workload = launcher.workload_pids()
    assert spare not in workload  # not a workload process: end-all does not wait for it
    for served in (False, True):
        # It confined itself (child.SELF) with the init's ids: no_new_privs, both filters, no capability to pass on.
        own = [proc_line(f"/proc/{spare}/status", key)[0] for key in ("NoNewPrivs:", "Seccomp:", "CapBnd:", "CapInh:")]
        assert own == ["1", "2", "0000000000000000", "0000000000000000"], own
        assert proc_line(f"/proc/{spare}/status", "Uid:") == ["0"] * 4
        assert proc_line(f"/proc/{spare}/status", "Gid:") == ["0"] * 4
        ns_pid = _ns_pids(spare)[1]  # as the agent names it
        status, out, err = await run(launcher, make_spec(PY, "-c", SPARE_ATTACK, str(ns_pid), stdin="null"))
        assert status == 0, err
        got = json.loads(out)
        assert got == {
            "kill": errno.EPERM, "term": errno.EPERM, "stop": errno.EPERM, "ptrace": errno.EPERM,
            "mem": errno.EACCES, "environ": errno.EACCES, "ns/pid": errno.EACCES, "fd/3": errno.EACCES,
        }, (served, got)  # fmt: skip
        assert _children(spare) == []  # no child waits: its commands are spawned when they come
        assert proc_line(f"/proc/{spare}/status", "State:")[0] == "S"  # still waiting, untouched
        assert spare in [lease.pid for lease in launcher._leases]
        if served:
            break
        exec_ = await launcher.spawn(make_spec("/usr/bin/id", "-u", stdin="null"), own_pidns=True)
        assert exec_.nested and exec_.pid == spare  # the next exec took it
        assert exec_.stdout is not None and await read_all(exec_.stdout) == b"1000\n"  # as the agent
        assert await exec_.wait_status() == 0
        deadline = time.monotonic() + 10
        while spare not in [lease.pid for lease in launcher._leases]:  # back as a spare
            assert time.monotonic() < deadline, "the exec-init did not come back"
            launcher.workload_pids()
            await trio.sleep(0.01)


async def test_host_pid_matches_pidfd(launcher: Launcher) -> None:
    await launcher.prepare(NamespacePlan("R"))
    spawned = await launcher.spawn(make_spec("/bin/sleep", "30", stdin="null"))
    assert spawned.pid == int(proc_line(f"/proc/self/fdinfo/{spawned.pidfd}", "Pid:")[0])
    assert spawned.pid in launcher.workload_pids()
    assert proc_line(f"/proc/{spawned.pid}/status", "Uid:") == ["1000"] * 4
    for fd in (spawned.pidfd, spawned.stdout, spawned.stderr):  # nothing received may leak into an exec
        assert fd is not None and not os.get_inheritable(fd)
    with await launcher.socket_in_netns(socket.AF_INET, socket.SOCK_STREAM) as inner:
        assert not inner.get_inheritable()
    signal.pidfd_send_signal(spawned.pidfd, signal.SIGKILL)
    assert os.WTERMSIG(await spawned.wait_status()) == signal.SIGKILL


# --- killing everything ----------------------------------------------------------------------------------
DAEMONIZE = "(setsid sh -c 'sleep 1000 & sleep 1000' &) ; sleep 1000 & exec sleep 1000"


async def _workload_with_daemon(zyg: Launcher) -> tuple[list[Any], set[int]]:
    spawned = [await zyg.spawn(make_spec("/bin/sh", "-c", DAEMONIZE, stdin="null")) for _ in range(3)]
    # Per spawn: the exec'd sleep, its background sleep, the daemon sh and its two sleeps.
    assert await eventually(lambda: len(zyg.workload_pids()) >= 3 * 5, seconds=10)
    return spawned, zyg.workload_pids()


@pytest.mark.parametrize("pidns", [True, False])
async def test_kill_all_leaves_nothing(launcher: Launcher, pidns: bool) -> None:
    await launcher.prepare(NamespacePlan("R", pidns=pidns))
    spawned, pids = await _workload_with_daemon(launcher)
    sessions = {os.getsid(pid) for pid in pids}
    assert len(sessions) > len(spawned)  # the daemons did leave their launch sessions
    with trio.fail_after(10):
        await launcher.kill_all()
    assert launcher.workload_pids() == set()
    assert not [pid for pid in pids if alive(pid)]
    for s in spawned:
        assert os.WTERMSIG(await s.wait_status()) == signal.SIGKILL


async def test_pidns_gone_after_kill_all(launcher: Launcher) -> None:
    await launcher.prepare(NamespacePlan("R"))
    await launcher.kill_all()
    with pytest.raises(LauncherError):
        await launcher.spawn(make_spec("/bin/true"))


async def test_closing_the_launcher_kills_the_workload(launcher: Launcher) -> None:
    await launcher.prepare(NamespacePlan("R", pidns=False))
    _, pids = await _workload_with_daemon(launcher)
    launcher.close()
    assert await eventually(lambda: not [pid for pid in pids if alive(pid)])


async def test_zygote_death_fails_operations_closed(launcher: Launcher) -> None:
    await launcher.prepare(NamespacePlan("R"))
    spawned = await launcher.spawn(make_spec("/bin/sleep", "100", stdin="null"))
    os.kill(launcher.pid, signal.SIGKILL)
    with pytest.raises(LauncherError):
        await spawned.wait_status()
    with pytest.raises(LauncherError):
        await launcher.spawn(make_spec("/bin/true"))
    assert await eventually(lambda: not alive(spawned.pid))  # the init had PDEATHSIG: the namespace dies


# --- terminal -----------------------------------------------------------------------------------------
async def read_pty(master: int) -> bytes:
    """What the terminal's slave side wrote, until it is closed (EIO) or EOF."""
    out = bytearray()
    while True:
        await trio.lowlevel.wait_readable(master)
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the slave side is closed, all output read
            break
        if not chunk:
            break
        out += chunk
    return bytes(out)


async def test_tty_has_size_and_controlling_terminal(launcher: Launcher) -> None:
    await launcher.prepare(NamespacePlan("R"))
    spawned = await launcher.spawn(
        make_spec("/bin/sh", "-c", "stty size; tty; test -t 0 && echo isatty", tty=True, rows=33, cols=111)
    )
    assert spawned.pty_master is not None and spawned.stdout is None
    with trio.fail_after(10):
        out = await read_pty(spawned.pty_master)
    await spawned.wait_status()
    os.close(spawned.pty_master)
    text = out.decode().replace("\r", "")
    assert text.splitlines()[0] == "33 111"
    assert "/dev/pts/" in text and "isatty" in text


# --- model P forced as root -----------------------------------------------------------------------------
async def test_model_p_shares_the_network_namespace(launcher: Launcher) -> None:
    prepared = await launcher.prepare(NamespacePlan("P"))
    assert prepared.netns_path is None
    code = "import os, json\nprint(json.dumps(os.readlink('/proc/self/ns/net')))"
    assert await run_py(launcher, code) == os.readlink("/proc/self/ns/net")
    with pytest.raises(LauncherError):
        await launcher.capture_call("reconfigure", {})


@pytest.mark.parametrize(
    "plan",
    [
        NamespacePlan("P", capture={"capture_ports": [15001]}),  # would rewire the pod's own netns
        NamespacePlan("P", hide_paths=("/tmp",)),  # nothing to hide it in
        NamespacePlan("R", netns=False, capture={"capture_ports": [15001]}),
    ],
)
async def test_plans_that_cannot_be_honoured_fail_closed(launcher: Launcher, plan: NamespacePlan) -> None:
    with pytest.raises(LauncherError):
        await launcher.prepare(plan)
    with pytest.raises(LauncherError):  # and the launcher stays unusable rather than half-configured
        await launcher.spawn(make_spec("/bin/true"))


# --- overhead -------------------------------------------------------------------------------------------
async def test_spawn_to_exit_latency(launcher: Launcher) -> None:
    await launcher.prepare(NamespacePlan("R"))
    samples = []
    for _ in range(30):
        start = time.perf_counter()
        spawned = await launcher.spawn(make_spec("/bin/true", stdin="null", stdout="inherit", stderr="inherit"))
        assert await spawned.wait_status() == 0
        samples.append(time.perf_counter() - start)
        os.close(spawned.pidfd)
    samples.sort()
    print(
        f"\nspawn->exit /bin/true: p50 {statistics.median(samples) * 1000:.2f} ms, "
        f"p90 {samples[int(len(samples) * 0.9)] * 1000:.2f} ms",
        file=sys.stderr,
    )


# --- capture setup inside the namespaces ---------------------------------------------------------------
def threads_of(pid: int) -> int:
    return int(proc_line(f"/proc/{pid}/status", "Threads:")[0])


async def test_capture_listeners_and_calls_inside_the_namespaces(launcher: Launcher) -> None:
    prepared = await launcher.prepare(NamespacePlan("R", capture={"capture_ports": [15001]}))
    try:
        assert prepared.report.get("ok") is True
        assert threads_of(launcher.pid) == 1  # the capture setup left the zygote single-threaded
        listener = socket.socket(fileno=prepared.fds.pop("tcp4:15001"))
        # inspect/probe read /proc/self: they must work although the zygote is outside the PID namespace.
        fence = await launcher.capture_call("inspect", {"expect_anyip": True})
        assert fence["ok"] is True, fence
        probe = await launcher.capture_call("probe", {"address": "192.0.2.1", "port": 15001})
        assert probe["captured"] is True and probe["local"] == "192.0.2.1:15001"
        with listener:
            listener.setblocking(True)
            conn, _ = listener.accept()  # the probe's connection, queued on our listener
            conn.close()
            code = "import socket\ns = socket.create_connection(('203.0.113.9', 15001), 2)\ns.sendall(b'hi')"
            status, _, err = await run(launcher, make_spec(PY, "-c", code))
            assert status == 0, err
            conn, _ = listener.accept()
            with conn:
                assert conn.getsockname() == ("203.0.113.9", 15001)  # the original destination
                assert conn.recv(2) == b"hi"
        with pytest.raises(LauncherError):
            await launcher.capture_call("prepare", {})  # not on the allow-list
    finally:
        for fd in prepared.fds.values():
            os.close(fd)
