"""The agent's view of the filesystem, attacked from inside (models R and U, dev mode run as root).

Part of the project's attack list: each test has the agent (Debian's ``/usr/bin/python3``) try a route out and
print what the kernel answered, then asserts the attempt failed *and* that nothing changed on the host.
The host side is planted before the run: a victim home with a ``.bashrc`` and a listening socket, sockets in
``/run/user/<uid>``, ``/tmp`` and ``/var/lib``, a file owned by the agent's uid inside a read-only tree
(``/opt``) and a world-writable directory outside the workdir. Non-root runs of the same layout are in
tests/integration/test_agent_root_userns.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from supervisor.boundary.forkimage.rootfs import TRUST_PATH
from supervisor.boundary.process import LauncherError, detect_privilege_model

CLI = [sys.executable, "-m", "supervisor.cli"]
AGENT_PYTHON = "/usr/bin/python3"
AGENT_ID = 61500  # an unused uid/gid (no passwd entry); --agent-user
MODELS = ["R", "U"]

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="dev mode as root (models R and U forced)"),
    pytest.mark.skipif(not os.access(AGENT_PYTHON, os.X_OK), reason=f"{AGENT_PYTHON} is needed by the agent's uid"),
]

PRELUDE = r"""
import errno, json, os, socket, sys
OUT = {}
def attempt(name, fn):
    try:
        fn()
        OUT[name] = "ok"
    except OSError as exc:
        OUT[name] = errno.errorcode.get(exc.errno, str(exc.errno))
def write(path, mode="a"):
    with open(path, mode) as fh:
        fh.write("pwned\n")
def done():
    print(json.dumps(OUT), flush=True)
"""


def _model_available(model: str) -> str | None:
    try:
        detect_privilege_model(model)
    except LauncherError as exc:
        return str(exc)
    return None


def _listen(path: Path) -> socket.socket:
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    os.chmod(path, 0o777)  # DAC would let anyone in: only the agent's view can keep it out
    sock.listen(16)
    sock.setblocking(False)
    return sock


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


@dataclass
class Host:
    """Everything planted on the host, and how it looked before the agent ran."""

    tag: str
    workdir: Path
    home: Path
    owned: Path  # owned by the agent's uid, inside /opt (a read-only tree of the default layout)
    open_dir: Path  # 0777, outside the workdir
    run_user: Path
    servers: dict[str, socket.socket] = field(default_factory=dict)
    cleanup: list[Path] = field(default_factory=list)

    def snapshot(self) -> dict[str, Any]:
        st = os.stat(self.owned)
        return {
            "owned": (st.st_mode, st.st_mtime_ns, st.st_uid, os.listxattr(self.owned), _digest(self.owned)),
            "bashrc": _digest(self.home / ".bashrc"),
            "root_bashrc": _digest(Path("/root/.bashrc")),
            "passwd": (os.stat("/etc/passwd").st_mode, _digest(Path("/etc/passwd"))),
            "etc_probe": os.path.exists(f"/etc/osb-{self.tag}"),
            "open_dir": sorted(os.listdir(self.open_dir)),
            "shm": sorted(n for n in os.listdir("/dev/shm") if self.tag in n),
        }

    def connections(self) -> list[str]:
        """Planted servers that accepted anything (must stay empty)."""
        got = []
        for name, sock in self.servers.items():
            try:
                conn, _ = sock.accept()
                conn.close()
                got.append(name)
            except BlockingIOError:
                pass
        return got


@pytest.fixture(scope="module")
def host() -> Iterator[Host]:
    tag = secrets.token_hex(4)
    base = Path(tempfile.mkdtemp(prefix=f"osb-fsatk-{tag}-", dir="/tmp"))
    base.chmod(0o755)
    workdir = base / "work"
    workdir.mkdir(mode=0o777)
    workdir.chmod(0o777)
    home = Path(f"/home/osb-victim-{tag}")
    home.mkdir(parents=True)
    (home / ".bashrc").write_text("# the operator's\n")
    opt = Path(f"/opt/osb-{tag}")
    opt.mkdir()
    owned = opt / "owned"
    owned.write_text("agent-owned\n")
    os.chown(owned, AGENT_ID, AGENT_ID)
    open_dir = Path(f"/var/tmp/osb-open-{tag}")
    open_dir.mkdir()
    open_dir.chmod(0o777)
    run_user = Path(f"/run/user/{AGENT_ID}")
    made_run_user = not run_user.exists()
    run_user.mkdir(parents=True, exist_ok=True)
    os.chown(run_user, AGENT_ID, AGENT_ID)
    planted = Host(tag, workdir, home, owned, open_dir, run_user)
    planted.cleanup = [base, home, opt, open_dir, Path(f"/var/lib/osb-{tag}"), *([run_user] if made_run_user else [])]
    socket_paths = {
        "run_user": run_user / f"osb-bus-{tag}",
        "tmp": Path(f"/tmp/osb-sock-{tag}/s"),
        "var_lib": Path(f"/var/lib/osb-{tag}/s"),
        "home": home / "s",
    }
    planted.cleanup.append(Path(f"/tmp/osb-sock-{tag}"))
    try:
        for name, path in socket_paths.items():
            planted.servers[name] = _listen(path)
        yield planted
    finally:
        for sock in planted.servers.values():
            sock.close()
        for path in (run_user / f"osb-bus-{tag}",):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        for path in planted.cleanup:
            shutil.rmtree(path, ignore_errors=True)
        for name in os.listdir("/dev/shm"):
            if tag in name:
                os.unlink(f"/dev/shm/{name}")


def run_agent(host: Host, model: str, body: str, *, env: dict[str, str] | None = None,
              policy: Path | None = None) -> dict[str, Any]:  # fmt: skip
    if (problem := _model_available(model)) is not None:
        pytest.skip(f"model {model}: {problem}")
    script = host.workdir / f"agent-{secrets.token_hex(3)}.py"
    script.write_text(PRELUDE + body + "\ndone()\n")
    script.chmod(0o644)
    argv = [*CLI, "dev", f"--privilege-model={model}", f"--workdir={host.workdir}",
            f"--agent-user={AGENT_ID}:{AGENT_ID}"]  # fmt: skip
    if policy is not None:
        argv.append(f"--policy={policy}")
    result = subprocess.run([*argv, "--", AGENT_PYTHON, str(script)], capture_output=True, text=True, timeout=120,
                            env={**os.environ, **(env or {})}, cwd="/")  # fmt: skip
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert result.returncode == 0 and lines, f"rc={result.returncode}\n{result.stdout}\n{result.stderr[-3000:]}"
    out: dict[str, Any] = json.loads(lines[-1])
    return out


@pytest.mark.parametrize("model", MODELS)
def test_agent_writes_nothing_outside_its_workdir(host: Host, model: str) -> None:
    before = host.snapshot()
    got = run_agent(
        host,
        model,
        f"""
attempt("write_home", lambda: write("{host.home}/.bashrc"))
attempt("write_operator_home", lambda: write("/root/.bashrc"))
attempt("write_etc", lambda: write("/etc/osb-{host.tag}", "w"))
attempt("write_outside_workdir", lambda: write("{host.open_dir}/x", "w"))
attempt("write_owned", lambda: write("{host.owned}"))
attempt("chmod_owned", lambda: os.chmod("{host.owned}", 0o777))
attempt("utime_owned", lambda: os.utime("{host.owned}", (0, 0)))
attempt("setxattr_owned", lambda: os.setxattr("{host.owned}", "user.osb", b"x"))
attempt("chmod_passwd", lambda: os.chmod("/etc/passwd", 0o666))
attempt("mkdir_root", lambda: os.mkdir("/osb-{host.tag}"))
attempt("init_root_write", lambda: write("/proc/1/root/etc/osb-{host.tag}", "w"))  # the init keeps the host's
attempt("write_workdir", lambda: write("{host.workdir}/ok-{model}", "w"))
""",
    )
    assert got.pop("write_workdir") == "ok", got  # the control: writing is possible where it is granted
    assert all(result != "ok" for result in got.values()), got
    # chmod/utime/setxattr on the agent's own file fail because the tree is a read-only mount (Landlock does
    # not cover them): the mount layer answers before any permission check.
    assert {got[k] for k in ("chmod_owned", "utime_owned", "setxattr_owned", "write_owned")} == {"EROFS"}, got
    assert got["write_home"] == "ENOENT" and got["write_outside_workdir"] == "ENOENT", got  # not in the view
    assert host.snapshot() == before
    assert (host.workdir / f"ok-{model}").exists()


def _listening_unix_sockets() -> list[tuple[str, int]]:
    """(path, socket type) of every listening pathname socket in the host's /proc/net/unix."""
    found = []
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[7].startswith("/") and int(fields[3], 16) & 0x10000:  # __SO_ACCEPTCON
            found.append((fields[7], int(fields[4], 16)))
    return found


@pytest.mark.parametrize("model", MODELS)
def test_no_host_socket_is_reachable(host: Host, model: str) -> None:
    targets = _listening_unix_sockets()
    planted = {str(p) for p in (host.run_user / f"osb-bus-{host.tag}", Path(f"/tmp/osb-sock-{host.tag}/s"),
                                Path(f"/var/lib/osb-{host.tag}/s"), host.home / "s")}  # fmt: skip
    assert planted <= {path for path, _ in targets}
    listing = host.workdir / f"sockets-{model}.json"
    listing.write_text(json.dumps(targets))
    got = run_agent(
        host,
        model,
        f"""
for path, kind in json.load(open("{listing}")):
    def connect(path=path, kind=kind):
        with socket.socket(socket.AF_UNIX, kind) as s:
            s.settimeout(2)
            s.connect(path)
    attempt(path, connect)
""",
    )
    assert set(got) == {path for path, _ in targets}
    assert all(result != "ok" for result in got.values()), {p: r for p, r in got.items() if r == "ok"}
    assert host.connections() == []


@pytest.mark.parametrize("model", MODELS)
def test_dev_shm_is_private_and_gone_after_the_sandbox(host: Host, model: str) -> None:
    seen_by_host = Path(f"/dev/shm/osb-host-{host.tag}")
    seen_by_host.write_text("host\n")
    try:
        name = f"/dev/shm/osb-{model}-{host.tag}"
        first = run_agent(
            host,
            model,
            f"""
attempt("write_shm", lambda: write("{name}", "w"))
attempt("read_host_shm", lambda: open("{seen_by_host}").read())
OUT["statvfs_mib"] = os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize // 2**20
""",
        )
        assert first["write_shm"] == "ok" and first["read_host_shm"] == "ENOENT", first
        assert first["statvfs_mib"] == 64  # the default --shm-size cap
        assert not os.path.exists(name)  # never on the host's /dev/shm
        second = run_agent(host, model, f'attempt("read_old_shm", lambda: open("{name}").read())')
        assert second["read_old_shm"] == "ENOENT"  # gone with the first sandbox
        assert seen_by_host.read_text() == "host\n"
    finally:
        seen_by_host.unlink()


PROC_POLICY = """\
version: 1
filesystem_policy:
  include_workdir: true
  read_only: [/usr, /lib, /lib64, /bin, /etc, /proc]
network_policies: {}
"""


@pytest.mark.parametrize("model", MODELS)
def test_proc_pid_mem_is_not_writable_even_with_landlock_off(host: Host, model: str, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(PROC_POLICY)
    tmp_path.chmod(0o755)
    got = run_agent(host, model, """
import signal, time
pid = os.fork()
if pid == 0:
    time.sleep(30)
    os._exit(0)
attempt("landlock_off_proof", lambda: write("/tmp/not-granted-by-the-policy", "w"))
attempt("mem_other", lambda: os.close(os.open(f"/proc/{pid}/mem", os.O_RDWR)))
attempt("mem_self", lambda: os.close(os.open("/proc/self/mem", os.O_WRONLY)))
attempt("oom_adj", lambda: write(f"/proc/{pid}/oom_score_adj", "w"))
os.kill(pid, signal.SIGKILL)
os.waitpid(pid, 0)
""", env={"OPENSHELL_TEST_LANDLOCK_OFF": "1"}, policy=policy)  # fmt: skip
    assert got.pop("landlock_off_proof") == "ok", "Landlock was on: this run would not test the mount layer"
    assert got == {"mem_other": "EROFS", "mem_self": "EROFS", "oom_adj": "EROFS"}


@pytest.mark.parametrize("model", MODELS)
def test_trust_files_are_read_only_at_the_fixed_path(host: Host, model: str) -> None:
    got = run_agent(
        host,
        model,
        f"""
OUT["env"] = os.environ.get("SSL_CERT_FILE")
before = open("{TRUST_PATH}/openshell-ca.pem").read()
attempt("overwrite_ca", lambda: write("{TRUST_PATH}/openshell-ca.pem", "w"))
attempt("create", lambda: write("{TRUST_PATH}/extra.pem", "w"))
attempt("chmod", lambda: os.chmod("{TRUST_PATH}/ca-bundle.pem", 0o666))
attempt("rename", lambda: os.rename("{TRUST_PATH}/ca-bundle.pem", "{TRUST_PATH}/x"))
OUT["unchanged"] = open("{TRUST_PATH}/openshell-ca.pem").read() == before and "BEGIN CERTIFICATE" in before
""",
    )
    assert got.pop("env") == f"{TRUST_PATH}/ca-bundle.pem" and got.pop("unchanged") is True, got
    assert set(got.values()) == {"EROFS"}, got


@pytest.mark.parametrize("model", MODELS)
def test_resolver_configuration_is_readable_by_the_agent(host: Host, model: str) -> None:
    """A resolved-style /etc/resolv.conf (symlink into /run) keeps working: the layout logic is unit-tested
    (tests/unit/test_rootfs_plan.py), a swapped /etc answered on 127.0.0.53 in
    tests/integration/test_agent_root_resolved.py, the host's own file here only where it is such a symlink."""
    real = os.path.realpath("/etc/resolv.conf")
    if not os.path.exists(real):
        pytest.skip("no /etc/resolv.conf here")
    got = run_agent(
        host,
        model,
        """
OUT["resolv"] = open("/etc/resolv.conf").read()
OUT["localhost"] = sorted({a[4][0] for a in socket.getaddrinfo("localhost", 80, type=socket.SOCK_STREAM)})
""",
    )
    assert got["resolv"] == Path(real).read_text()
    assert "127.0.0.1" in got["localhost"] or "::1" in got["localhost"]
    if not (os.path.islink("/etc/resolv.conf") and real.startswith("/run/")):
        pytest.skip(f"/etc/resolv.conf is not a symlink into /run here ({real}): the plain case passed")


def test_uncreatable_tls_dir_is_refused_at_start_naming_it(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    for bad in ("/proc/osb-no/tls", str(blocker / "tls")):
        result = subprocess.run([*CLI, "--mode=boundary", f"--bootstrap={tmp_path}", f"--tls-dir={bad}",
                                 f"--workdir={tmp_path}", "--listen=127.0.0.1:0", "--", "true"],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert result.returncode == 125, result.stderr
        assert bad in result.stderr and "--tls-dir" in result.stderr
        assert not os.path.exists(bad)


def test_planted_files_exist_as_the_attack_expects(host: Host) -> None:
    """The fixture's own check: the agent's uid really owns the planted file and DAC alone would allow it."""
    st = os.stat(host.owned)
    assert (st.st_uid, stat.S_IMODE(os.stat(host.open_dir).st_mode)) == (AGENT_ID, 0o777)


def test_model_r_builds_the_root_with_the_pods_capabilities_only(host: Host) -> None:
    """Model R's pod has no CAP_SYS_CHROOT (docs/kubernetes.md "Model R"): the agent's root needs only
    CAP_SYS_ADMIN, so a boundary without SYS_CHROOT still confines the agent."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to drop CAP_SYS_CHROOT")
    script = host.workdir / "no-chroot.py"
    script.write_text(PRELUDE + 'attempt("write_etc", lambda: write("/etc/osb-nochroot", "w"))\n'
                      'OUT["root"] = sorted(os.listdir("/"))\ndone()\n')  # fmt: skip
    script.chmod(0o644)
    result = subprocess.run(
        ["setpriv", "--bounding-set=-sys_chroot", *CLI, "dev", "--privilege-model=R", f"--workdir={host.workdir}",
         f"--agent-user={AGENT_ID}:{AGENT_ID}", "--", AGENT_PYTHON, str(script)],
        capture_output=True, text=True, timeout=120, cwd="/",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.splitlines()[-1])
    assert got["write_etc"] == "EROFS" and "home" not in got["root"] and "root" not in got["root"], got


def test_a_workdir_named_through_a_symlink_is_entered_at_its_real_path(host: Host) -> None:
    """The agent's root binds the real path (a symlink would lead nowhere inside it): the boundary resolves it."""
    link = host.workdir.parent / "work-link"
    link.symlink_to(host.workdir)
    result = subprocess.run(
        [*CLI, "dev", "--privilege-model=R", f"--workdir={link}", f"--agent-user={AGENT_ID}:{AGENT_ID}", "--",
         "sh", "-c", "pwd; echo x > via-link && echo wrote"],
        capture_output=True, text=True, timeout=120, cwd="/",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == [str(host.workdir), "wrote"]
    assert (host.workdir / "via-link").read_text() == "x\n"
