"""Model U: the launcher run by an unprivileged uid builds user+net+mount+PID namespaces for the workload.

The boundary side runs as uid 65534 (through ``setpriv`` when the suite runs as root, or as the current
non-root user otherwise) with Debian's ``/usr/bin/python3`` and a copy of the package and its pure-Python
dependencies in a 0755 directory: the pyenv interpreter under /root is unreadable to other uids. One script
run exercises the whole model, and the test asserts on the JSON it prints.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import supervisor

SYSTEM_PYTHON = "/usr/bin/python3"
NOBODY = 65534
DEPENDENCIES = ("trio", "attr", "attrs", "outcome", "sniffio", "sortedcontainers", "idna")

PID1_ATTACK = (
    "trap 'echo term-forwarded; exit 7' TERM; kill -KILL 1; kill -STOP 1; echo survived; kill -TERM 1; "
    "while :; do :; done"
)
SCRIPT = r"""
import errno, json, os, socket, sys
import trio
from supervisor.boundary.forkimage import NamespacePlan, SpawnSpec, spawner, zygote
from supervisor.boundary.process import Launcher, LauncherError, SpawnError, detect_privilege_model

hidden = sys.argv[1]
out = {}
try:
    out["auto"] = detect_privilege_model("auto")
except LauncherError as exc:
    print(json.dumps({"skip": str(exc)}))
    sys.exit(0)
if out["auto"][0] != "U":
    print(json.dumps({"skip": "user namespaces unavailable: " + out["auto"][1]}))
    sys.exit(0)
try:
    detect_privilege_model("R")
    out["force_r"] = "accepted"
except LauncherError as exc:
    out["force_r"] = str(exc)

launcher = Launcher.fork()
me = os.getpid()
uid, gid = os.getuid(), os.getgid()
ENV = {"PATH": "/usr/bin:/bin"}

PROBE = '''
import errno, json, os, socket, sys
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines())
def attempt(fn):
    try:
        fn(); return 0
    except OSError as e:
        return e.errno
def dial(port):
    s = socket.socket(); s.settimeout(2)
    try:
        return attempt(lambda: s.connect(("127.0.0.1", port)))
    finally:
        s.close()
print(json.dumps({
    "pid": os.getpid(),
    "procs": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "links": [n for _, n in socket.if_nameindex()],
    "hidden": os.listdir(sys.argv[1]),
    "kill_boundary": attempt(lambda: os.kill(int(sys.argv[2]), 0)),
    "outer_listener": dial(int(sys.argv[3])),
    "uid": os.getuid(),
    "caps": [int(status[k].split()[0], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")],
    "nnp": status["NoNewPrivs"].strip(), "seccomp": status["Seccomp"].strip(),
}))
'''

DAEMONIZE = "(setsid sh -c 'sleep 1000 & sleep 1000' &) ; exec sleep 1000"


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def read_all(fd):
    data = b""
    async with trio.lowlevel.FdStream(fd) as stream:
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data


async def main():
    prepared = await launcher.prepare(NamespacePlan("U", hide_paths=(hidden,)))
    out["netns_differs"] = os.stat(prepared.netns_path).st_ino != os.stat("/proc/self/ns/net").st_ino
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        spawned = await launcher.spawn(SpawnSpec(
            argv=("/usr/bin/python3", "-c", PROBE, hidden, str(me), str(port)),
            env=ENV, cwd="/", uid=uid, gid=gid, stdin="null"))
        text = await read_all(spawned.stdout)
        out["probe_err"] = (await read_all(spawned.stderr)).decode()
        out["probe_status"] = await spawned.wait_status()
        out["probe"] = json.loads(text or b"null")
        out["probe_ns_pid"] = spawned.ns_pid
    # The init's spare exec-inits (and any children), as the probe names them: the init leases spares to the
    # launcher once they are ready (after the probe's spawn), which files them as it drains.
    out["spare_ns"] = []
    for _ in range(500):
        if launcher.workload_pids() is not None and len(launcher._leases) >= spawner.SPARES:
            break
        await trio.sleep(0.01)
    for spare in [lease.pid for lease in launcher._leases]:
        with open(f"/proc/{spare}/task/{spare}/children") as fh:
            for p in [spare, *(int(c) for c in fh.read().split())]:
                with open(f"/proc/{p}/status") as fh:
                    nspid = next(l for l in fh if l.startswith("NSpid:")).split()
                out["spare_ns"].append(int(nspid[2]))
    # An exec's path: a PID namespace of its own, the spare exec-init's child (forked from the init, whose
    # capabilities were raised ambient to survive its interpreter's execve).
    nested = await launcher.spawn(SpawnSpec(
        argv=("/usr/bin/python3", "-c", PROBE, hidden, str(me), str(port)),
        env=ENV, cwd="/", uid=uid, gid=gid, stdin="null"), own_pidns=True)
    text = await read_all(nested.stdout)
    await read_all(nested.stderr)
    await nested.wait_status()
    out["nested_probe"] = json.loads(text or b"null")
    # The agent attacks its exec-init, PID 1 of its namespace and of its own uid here (model U): KILL and STOP
    # must do nothing (a namespace's init takes neither from inside), a TERM must reach the command (forwarded).
    attacker = await launcher.spawn(SpawnSpec(argv=("/bin/sh", "-c", PID1_ATTACK), env=ENV, cwd="/", uid=uid,
                                              gid=gid, stdin="null"), own_pidns=True)  # fmt: skip
    with trio.fail_after(20):
        out["pid1_attack_out"] = (await read_all(attacker.stdout)).decode()
        await read_all(attacker.stderr)
        out["pid1_attack_status"] = await attacker.wait_status()
    try:
        await launcher.spawn(SpawnSpec(argv=("/bin/true",), env=ENV, cwd="/", uid=1000, gid=1000))
        out["other_uid"] = "spawned"
    except SpawnError as exc:
        out["other_uid"] = [exc.stage, exc.errno]
    inner = await launcher.socket_in_netns(socket.AF_INET, socket.SOCK_STREAM)
    inner.bind(("127.0.0.1", 0))
    out["socket_in_netns"] = inner.getsockname()[0]
    inner.close()
    roots = [await launcher.spawn(SpawnSpec(argv=("/bin/sh", "-c", DAEMONIZE), env=ENV, cwd="/",
                                            uid=uid, gid=gid, stdin="null")) for _ in range(2)]
    with trio.fail_after(10):
        while len(launcher.workload_pids()) < 2 * 4:
            await trio.sleep(0.02)
    pids = launcher.workload_pids()
    out["sessions"] = len({os.getsid(p) for p in pids})
    await launcher.kill_all()
    out["survivors"] = [p for p in pids if alive(p)]
    out["root_statuses"] = [await r.wait_status() for r in roots]


trio.run(main)
launcher.close()
print(json.dumps(out))
"""


def _unprivileged_env() -> Path:
    """A 0755 tree holding the package and its pure-Python dependencies, readable by any uid."""
    root = Path(tempfile.mkdtemp(prefix="launcher-userns-"))
    root.chmod(0o755)
    shutil.copytree(Path(supervisor.__file__).parent, root / "supervisor", ignore=shutil.ignore_patterns("__pycache__"))
    for name in DEPENDENCIES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        source = Path(module.__file__ or "").parent
        shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "script.py").write_text(f"PID1_ATTACK = {PID1_ATTACK!r}\n{SCRIPT}")
    hidden = root / "keys"
    hidden.mkdir()
    (hidden / "boundary.key").write_text("secret")
    subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
    return root


@pytest.fixture(scope="module")
def userns_result() -> Iterator[dict[str, Any]]:
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} not available for the unprivileged run")
    root = _unprivileged_env()
    try:
        prefix: list[str] = []
        if os.geteuid() == 0:
            if shutil.which("setpriv") is None:
                pytest.skip("setpriv (util-linux) needed to run the boundary as an unprivileged uid")
            prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        check = subprocess.run(
            [*prefix, SYSTEM_PYTHON, "-c", "import trio"],
            env={"PYTHONPATH": str(root)},
            capture_output=True,
            cwd="/",
            timeout=60,
        )
        if check.returncode != 0:
            pytest.skip(f"trio not importable by {SYSTEM_PYTHON}: {check.stderr.decode()[-300:]}")
        run = subprocess.run(
            [*prefix, SYSTEM_PYTHON, str(root / "script.py"), str(root / "keys")],
            env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            cwd="/",
            timeout=120,
        )
        assert run.returncode == 0, run.stderr.decode()
        result: dict[str, Any] = json.loads(run.stdout.decode().strip().splitlines()[-1])
        if "skip" in result:
            pytest.skip(result["skip"])
        result["_hidden_on_host"] = sorted(os.listdir(root / "keys"))
        yield result
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_auto_picks_u_and_r_is_refused(userns_result: dict[str, Any]) -> None:
    assert userns_result["auto"][0] == "U"
    assert "model R unavailable" in userns_result["force_r"] and "CAP_SYS_ADMIN" in userns_result["force_r"]


def test_workload_is_confined(userns_result: dict[str, Any]) -> None:
    probe = userns_result["probe"]
    assert userns_result["probe_status"] == 0, userns_result["probe_err"]
    assert userns_result["netns_differs"] is True
    assert probe["links"] == ["lo"]
    assert probe["outer_listener"] == 111  # ECONNREFUSED: the boundary's netns is not reachable
    assert probe["pid"] == userns_result["probe_ns_pid"]
    # Own /proc: neither the boundary nor the zygote is visible; at most the init's spare exec-init and its child.
    assert probe["procs"][0] == 1 and probe["pid"] in probe["procs"]
    assert set(probe["procs"]) - {1, probe["pid"]} <= set(userns_result["spare_ns"])
    assert probe["kill_boundary"] == 3  # ESRCH: the boundary's pid names nothing in the namespace
    assert probe["caps"] == [0, 0, 0, 0, 0]
    assert (probe["nnp"], probe["seccomp"]) == ("1", "2")
    assert probe["uid"] == NOBODY or os.geteuid() != 0
    nested = userns_result["nested_probe"]  # an exec: the spare exec-init's child, under the init's ambient set
    assert nested["caps"] == [0, 0, 0, 0, 0]
    assert (nested["nnp"], nested["seccomp"], nested["uid"]) == (probe["nnp"], probe["seccomp"], probe["uid"])


def test_hidden_path_is_empty_inside_only(userns_result: dict[str, Any]) -> None:
    assert userns_result["probe"]["hidden"] == []
    assert userns_result["_hidden_on_host"] == ["boundary.key"]


def test_only_own_uid_is_mapped(userns_result: dict[str, Any]) -> None:
    stage, err = userns_result["other_uid"]
    assert stage in ("setresgid", "setresuid") and err == 22  # EINVAL: 1000 is not mapped


def test_socket_in_netns_unprivileged(userns_result: dict[str, Any]) -> None:
    assert userns_result["socket_in_netns"] == "127.0.0.1"


def test_kill_all_kills_double_forked_daemons(userns_result: dict[str, Any]) -> None:
    assert userns_result["sessions"] >= 3  # two launch sessions plus the daemons' own
    assert userns_result["survivors"] == []
    assert userns_result["root_statuses"] == [9, 9]  # SIGKILL


def test_the_agent_can_neither_kill_nor_stop_its_exec_init(userns_result: dict[str, Any]) -> None:
    """From inside an exec, as the exec-init's own uid: KILL and STOP to PID 1 change nothing (the command went
    on and its exit is the exec's result), a TERM is forwarded to the command (its trap ran)."""
    assert userns_result["pid1_attack_out"] == "survived\nterm-forwarded\n"
    assert os.waitstatus_to_exitcode(userns_result["pid1_attack_status"]) == 7
