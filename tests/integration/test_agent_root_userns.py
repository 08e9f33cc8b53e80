"""The agent's own root in model U run by a normal user (uid 65534 here): attacked from the workload's side.

The boundary's side (the launcher) runs unprivileged, as in non-root dev mode, so the agent shares the
operator's uid and DAC protects nothing: only the mount layout can. The script plans the layout with
``rootfs.plan_root`` (a workdir, a read-only tree holding a file of the agent's own uid, a hidden file, a trust
directory), prepares model U with it and runs probes as the workload with Landlock off, then a second launcher
checks that ``/dev/shm`` did not outlive the first. The test plants the host side and asserts every attempt
failed and nothing changed. The root-run dev-mode versions are in tests/e2e/test_attack_filesystem.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.portable import SYSTEM_PYTHON, portable_tree

NOBODY = 65534

SCRIPT = r"""
import json, os, sys, trio
from supervisor.boundary.forkimage import NamespacePlan, SpawnSpec
from supervisor.boundary.process import Launcher, LauncherError, detect_privilege_model
from supervisor.boundary.forkimage.rootfs import plan_root

config = json.loads(sys.argv[1])
try:
    if detect_privilege_model("auto")[0] != "U":
        raise LauncherError("auto did not pick U")
except LauncherError as exc:
    print(json.dumps({"skip": str(exc)}))
    sys.exit(0)
uid, gid = os.getuid(), os.getgid()
plan = plan_root(workdir=config["workdir"], read_only=[config["ro_dir"]], trust_dir=config["tls"], agent_uid=uid,
                 agent_gid=gid, hide=[config["hidden"]], shm_size="8m")
ENV = {"PATH": "/usr/bin:/bin"}


async def run(launcher, code):
    await launcher.prepare(NamespacePlan("U", root=plan.to_wire()))
    spawned = await launcher.spawn(SpawnSpec(argv=("/usr/bin/python3", "-c", code, json.dumps(config)), env=ENV,
                                             cwd=config["workdir"], uid=uid, gid=gid, stdin="null"))
    data = b""
    async with trio.lowlevel.FdStream(spawned.stdout) as stream:
        while chunk := await stream.receive_some(65536):
            data += chunk
    err = b""
    async with trio.lowlevel.FdStream(spawned.stderr) as stream:
        while chunk := await stream.receive_some(65536):
            err += chunk
    await spawned.wait_status()
    return json.loads(data) if data else {"error": err.decode()}


results = []
for code in (sys.argv[2], sys.argv[3]):
    launcher = Launcher.fork()
    results.append(trio.run(run, launcher, code))
    launcher.close()
print(json.dumps({"first": results[0], "second": results[1]}))
"""

PROBES = r"""
import errno, json, os, socket, sys, time
c = json.loads(sys.argv[1])
out = {}
def attempt(name, fn):
    try:
        fn(); out[name] = "ok"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
def write(path, mode="a"):
    with open(path, mode) as fh:
        fh.write("pwned\n")
def connect(path):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(2)
        s.connect(path)
attempt("write_etc", lambda: write("/etc/osb-" + c["tag"], "w"))
attempt("write_owned", lambda: write(c["owned"]))
attempt("chmod_owned", lambda: os.chmod(c["owned"], 0o777))
attempt("utime_owned", lambda: os.utime(c["owned"], (0, 0)))
attempt("setxattr_owned", lambda: os.setxattr(c["owned"], "user.osb", b"x"))
attempt("create_in_ro", lambda: write(c["ro_dir"] + "/new", "w"))
attempt("write_home", lambda: write(c["home"] + "/.bashrc"))
attempt("read_hidden", lambda: open(c["hidden"]).read())
attempt("chmod_hidden", lambda: os.chmod(c["hidden"], 0o644))
attempt("unlink_hidden", lambda: os.unlink(c["hidden"]))
attempt("read_tls", lambda: open("/run/openshell-boundary/tls/ca.pem").read())
attempt("write_tls", lambda: write("/run/openshell-boundary/tls/ca.pem"))
for name, path in c["sockets"].items():
    attempt("connect_" + name, lambda path=path: connect(path))
pid = os.fork()
if pid == 0:
    time.sleep(30)
    os._exit(0)
attempt("proc_mem", lambda: os.close(os.open(f"/proc/{pid}/mem", os.O_RDWR)))
attempt("init_root", lambda: os.listdir("/proc/1/root/"))  # the init keeps the host's view
attempt("init_fds", lambda: os.listdir("/proc/1/fd/") and os.readlink("/proc/1/fd/3"))
os.kill(pid, 9)
os.waitpid(pid, 0)
attempt("write_shm", lambda: write("/dev/shm/osb-" + c["tag"], "w"))
attempt("write_tmp", lambda: write("/tmp/osb-" + c["tag"], "w"))
attempt("write_workdir", lambda: write(c["workdir"] + "/ok", "w"))
print(json.dumps(out))
"""

SECOND = r"""
import json, os, sys
c = json.loads(sys.argv[1])
print(json.dumps({"shm_left": os.path.exists("/dev/shm/osb-" + c["tag"]),
                  "tmp_left": os.path.exists("/tmp/osb-" + c["tag"])}))
"""


def _listen(path: Path, uid: int) -> socket.socket:
    path.parent.mkdir(parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    os.chmod(path, 0o777)
    os.chown(path, uid, uid)
    sock.listen(4)
    sock.setblocking(False)
    return sock


@pytest.fixture(scope="module")
def attacked() -> Iterator[dict[str, Any]]:
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is needed for a process of another uid")
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to run the launcher as an unprivileged uid")
    uid = NOBODY if os.geteuid() == 0 else os.geteuid()
    tag = secrets.token_hex(4)
    tree = portable_tree("osb-rootns-")
    base = tree / "world"
    base.mkdir(mode=0o755)
    paths: dict[str, Any] = {"tag": tag}
    for name in ("workdir", "ro_dir", "tls", "home"):
        (base / name).mkdir(mode=0o755)
        os.chown(base / name, uid, uid)
        paths[name] = str(base / name)
    (base / "tls" / "ca.pem").write_text("ca\n")
    os.chown(base / "tls" / "ca.pem", uid, uid)  # the agent's own uid: only the read-only mount stops a write
    owned, hidden, bashrc = base / "ro_dir" / "owned", base / "workdir" / "policy.yaml", base / "home" / ".bashrc"
    for path, text in ((owned, "mine\n"), (hidden, "secret\n"), (bashrc, "# operator\n")):
        path.write_text(text)
        os.chown(path, uid, uid)
    paths.update(owned=str(owned), hidden=str(hidden))
    sockets = {"tmp": Path(f"/tmp/osb-usock-{tag}/s"), "home": base / "home" / "bus"}
    run_user = Path(f"/run/user/{uid}")
    made_run_user = False
    if os.geteuid() == 0 and not run_user.exists():
        run_user.mkdir(parents=True)
        os.chown(run_user, uid, uid)
        made_run_user = True
    if os.access(run_user, os.W_OK):
        sockets["run_user"] = run_user / f"osb-bus-{tag}"
    servers = {name: _listen(path, uid) for name, path in sockets.items()}
    paths["sockets"] = {name: str(path) for name, path in sockets.items()}

    def snapshot() -> Any:
        st = os.stat(owned)
        return [st.st_mode, st.st_mtime_ns, os.listxattr(owned), owned.read_text(), hidden.read_text(),
                bashrc.read_text(), sorted(os.listdir(base / "ro_dir")), os.path.exists(f"/etc/osb-{tag}"),
                os.path.exists(f"/dev/shm/osb-{tag}"), os.path.exists(f"/tmp/osb-{tag}")]  # fmt: skip

    before = snapshot()
    prefix = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"] if os.geteuid() == 0 else []
    try:
        done = subprocess.run(
            [*prefix, SYSTEM_PYTHON, "-c", SCRIPT, json.dumps(paths), PROBES, SECOND],
            env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}, cwd="/", capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
        if "skip" in result:
            pytest.skip(result["skip"])
        accepted = []
        for name, sock in servers.items():
            with contextlib.suppress(BlockingIOError):
                sock.accept()[0].close()
                accepted.append(name)
        result.update(accepted=accepted, unchanged=snapshot() == before, before=before, after=snapshot())
        yield result
    finally:
        for sock in servers.values():
            sock.close()
        shutil.rmtree(tree, ignore_errors=True)
        shutil.rmtree(f"/tmp/osb-usock-{tag}", ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            (run_user / f"osb-bus-{tag}").unlink()
        if made_run_user:
            shutil.rmtree(run_user, ignore_errors=True)


def test_writes_and_metadata_changes_outside_the_workdir_fail(attacked: dict[str, Any]) -> None:
    got = attacked["first"]
    assert got.get("write_workdir") == "ok", got  # the control
    for name in ("write_etc", "write_owned", "chmod_owned", "utime_owned", "setxattr_owned", "create_in_ro"):
        assert got[name] == "EROFS", (name, got)
    assert got["write_home"] == "ENOENT", got  # the operator's home is not in the view
    assert attacked["unchanged"], (attacked["before"], attacked["after"])


def test_hidden_file_reads_nothing_and_cannot_be_uncovered(attacked: dict[str, Any]) -> None:
    got = attacked["first"]
    assert got["read_hidden"] == "EACCES" and got["chmod_hidden"] == "EROFS", got
    assert got["unlink_hidden"] in ("EBUSY", "EROFS"), got


def test_trust_dir_is_read_only_at_the_fixed_path(attacked: dict[str, Any]) -> None:
    got = attacked["first"]
    assert (got["read_tls"], got["write_tls"]) == ("ok", "EROFS"), got


def test_no_planted_socket_is_reachable(attacked: dict[str, Any]) -> None:
    got = attacked["first"]
    connects = {k: v for k, v in got.items() if k.startswith("connect_")}
    assert connects and set(connects.values()) == {"ENOENT"}, connects
    assert attacked["accepted"] == []


def test_proc_pid_mem_is_read_only_without_landlock(attacked: dict[str, Any]) -> None:
    assert attacked["first"]["proc_mem"] == "EROFS", attacked["first"]


def test_the_inits_host_view_is_out_of_reach(attacked: dict[str, Any]) -> None:
    """The namespace's init (same uid in U, but more capabilities) keeps the host's root and an fd of the
    agent's namespace: ``/proc/1/root`` and its fds are ptrace-guarded."""
    got = attacked["first"]
    assert (got["init_root"], got["init_fds"]) == ("EACCES", "EACCES"), got


def test_tmp_and_dev_shm_are_private_and_die_with_the_sandbox(attacked: dict[str, Any]) -> None:
    assert (attacked["first"]["write_shm"], attacked["first"]["write_tmp"]) == ("ok", "ok")
    assert attacked["second"] == {"shm_left": False, "tmp_left": False}
