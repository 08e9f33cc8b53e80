"""The agent (or whoever can write where dev is started) plants Python modules for our own interpreters to import.

docs/design.md "Our own interpreters": every Python process the product starts runs ``-I -S`` on the
installation's import path with a composed environment, and a CLI started from an exposed path re-executes
itself so. Each planted module writes a marker when imported; every test asserts there is none, and that the
planted files were really there to be found. Runs as root (model R) and as a normal user (model U, uid 65534).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv" / "bin"
NOBODY = 65534
# names the daemons and the CLI import (or the interpreter looks for at start), and one of the standard library's
PLANTED = ("secrets", "trio", "yaml", "logging", "json", "argparse", "h2", "cryptography", "sitecustomize")
MARKER = (
    "import os, sys\nopen(os.path.join({markers!r}, '{name}-' + str(os.getpid())), 'w').write(' '.join(sys.argv))\n"
)


@pytest.fixture
def scratch() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="attack-interp-", dir="/var/tmp"))
    path.chmod(0o755)
    (path / "markers").mkdir(mode=0o1777)
    (path / "markers").chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _plant(directory: Path, markers: Path, names: tuple[str, ...] = PLANTED) -> None:
    directory.mkdir(mode=0o755, exist_ok=True)
    for name in names:
        (directory / f"{name}.py").write_text(MARKER.format(markers=str(markers), name=name))
        (directory / f"{name}.py").chmod(0o644)


def _markers(scratch: Path) -> list[str]:
    return sorted(f"{p.name}: {p.read_text()[:200]}" for p in (scratch / "markers").iterdir())


def _operator(uid: int | None, scratch: Path) -> tuple[list[str], dict[str, str]]:
    """The command prefix and environment of a person running dev: root, or ``uid`` through setpriv."""
    home = scratch / "home"
    home.mkdir(mode=0o700)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "XDG_STATE_HOME": str(home / "state"),
           "XDG_RUNTIME_DIR": str(home / "run")}  # fmt: skip
    if uid is None:
        return [], env
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to run dev mode as a normal user")
    if not os.access(VENV / "python", os.X_OK):
        pytest.skip(f"{VENV / 'python'} (make venv) is needed for dev mode under another uid")
    os.chown(home, uid, uid)
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"], env


def _our_processes(dev: subprocess.Popen[str]) -> list[int]:
    """dev itself and every process below it that runs our interpreter (the agent's ``sh`` is left out)."""
    found, todo = [], [dev.pid]
    while todo:
        pid = todo.pop()
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            continue
        if "python" in os.path.basename(exe):
            found.append(pid)
        todo.extend(int(c) for c in children)
    return found


WAITING_AGENT = ("sh", "-c", "read line; echo agent-ok")


def _run_dev(prefix: list[str], entry: list[str], env: dict[str, str], cwd: Path, *flags: str,
             agent: tuple[str, ...] = WAITING_AGENT) -> tuple[subprocess.Popen[str], list[int]]:  # fmt: skip
    """Start dev; once the sandbox is ready, return it with its interpreters' pids (the agent waits on stdin)."""
    dev, pids, _ = _start_dev(prefix, entry, env, cwd, *flags, agent=agent)
    return dev, pids


def _start_dev(prefix: list[str], entry: list[str], env: dict[str, str], cwd: Path, *flags: str,
               agent: tuple[str, ...] = WAITING_AGENT) -> tuple[subprocess.Popen[str], list[int], str]:  # fmt: skip
    """``_run_dev``, and what dev said up to its ready line (which names the sandbox)."""
    pipe = subprocess.PIPE
    dev = subprocess.Popen([*prefix, *entry, "dev", *flags, "--", *agent], cwd=cwd, env=env,
                           stdin=pipe, stdout=pipe, stderr=pipe, text=True)  # fmt: skip
    assert dev.stderr is not None
    deadline = time.monotonic() + 90
    seen = ""
    while "is ready" not in seen:
        line = dev.stderr.readline()
        markers = _markers(cwd.parent) if (cwd.parent / "markers").is_dir() else []
        assert line or dev.poll() is None, f"dev ended before ready; planted modules imported: {markers}; {seen}"
        assert time.monotonic() < deadline, f"dev not ready: {seen}"
        seen += line
    return dev, _our_processes(dev), seen


def _finish(dev: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = dev.communicate("\n", timeout=60)
    return dev.returncode, out, err


ENTRIES = {"script": [str(VENV / "openshell-sandbox")], "module": [str(VENV / "python"), "-m", "supervisor.cli"]}


@pytest.mark.parametrize("entry", ["script", "module"])
@pytest.mark.parametrize(("model", "operator"), [("R", None), ("U", NOBODY)], ids=["R-root", "U-nonroot"])
def test_modules_planted_in_the_current_directory_and_on_pythonpath_are_never_imported(
    entry: str, model: str, operator: int | None, scratch: Path
) -> None:
    prefix, env = _operator(operator, scratch)
    here, on_path = scratch / "here", scratch / "on-path"
    _plant(here, scratch / "markers")
    _plant(on_path, scratch / "markers", tuple(n for n in PLANTED if n != "sitecustomize"))
    (on_path / "startup.py").write_text(MARKER.format(markers=str(scratch / "markers"), name="startup"))
    env |= {"PYTHONPATH": str(on_path), "PYTHONSTARTUP": str(on_path / "startup.py")}
    dev, ours = _run_dev(prefix, ENTRIES[entry], env, here, f"--privilege-model={model}")
    try:
        daemons = [pid for pid in ours if pid != dev.pid]
        assert len(daemons) >= 2, f"control and the boundary run our interpreter: {ours}"
        for pid in daemons:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = dict(item.split(b"=", 1) for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                           if b"=" in item)  # fmt: skip
            assert argv[1:3] == [b"-I", b"-S"], argv[:4]
            assert not [k for k in environ if k.startswith(b"PYTHON") or k.startswith(b"LD_")], environ.keys()
    finally:
        code, out, err = _finish(dev)
    assert _markers(scratch) == [], "a planted module was imported by one of our processes"
    assert (code, out.strip()) == (0, "agent-ok"), err[-3000:]


AGENT_PYTHON = "/usr/bin/python3"
PLANTING_AGENT = """\
import sys
for name in sys.argv[2:]:
    open(name + ".py", "w").write(sys.argv[1].replace("@NAME@", name))
input()
print("agent-ok")
"""


@pytest.mark.parametrize(("model", "operator"), [("R", None), ("U", NOBODY)], ids=["R-root", "U-nonroot"])
def test_modules_the_agent_writes_in_its_workdir_are_not_imported_by_the_next_dev_started_there(
    model: str, operator: int | None, scratch: Path
) -> None:
    prefix, env = _operator(operator, scratch)
    workdir = scratch / "project"
    workdir.mkdir(mode=0o777)
    workdir.chmod(0o777)  # the agent's uid (model R: a dedicated one) writes here
    template = MARKER.format(markers=str(scratch / "markers"), name="@NAME@")
    planting = (AGENT_PYTHON, "-c", PLANTING_AGENT, template, *PLANTED)
    entry = ENTRIES["script"]
    dev, _ = _run_dev(prefix, entry, env, scratch, f"--privilege-model={model}", f"--workdir={workdir}",
                      agent=planting)  # fmt: skip
    assert _finish(dev)[:2] == (0, "agent-ok\n")
    assert sorted(p.name for p in workdir.glob("*.py")) == sorted(f"{n}.py" for n in PLANTED), "the agent planted"
    dev, _ = _run_dev(prefix, entry, env, workdir, f"--privilege-model={model}", f"--workdir={workdir}")
    code, out, err = _finish(dev)
    assert _markers(scratch) == [], "a module the agent wrote was imported by one of our processes"
    assert (code, out.strip()) == (0, "agent-ok"), err[-3000:]


def test_dev_refuses_an_installation_another_user_can_write(scratch: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give the copy of the package to another uid")
    from tests.portable import SYSTEM_PYTHON, portable_tree

    tree = portable_tree("osb-owned-")
    try:
        os.chown(tree / "supervisor" / "cli", NOBODY, NOBODY)
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tree), "XDG_STATE_HOME": str(scratch / "state"),
               "XDG_RUNTIME_DIR": str(scratch / "run")}  # fmt: skip
        result = subprocess.run([SYSTEM_PYTHON, "-m", "supervisor.cli", "dev", "--", "true"], env=env, cwd="/",
                                capture_output=True, text=True, timeout=60)  # fmt: skip
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    assert result.returncode == 125, result.stderr
    assert f"{tree}/supervisor/cli is owned by uid {NOBODY}" in result.stderr
    assert not (scratch / "state").exists(), "nothing was started"


def test_a_normal_user_without_xdg_runtime_dir_runs_dev(scratch: Path) -> None:
    prefix, env = _operator(NOBODY, scratch)
    del env["XDG_RUNTIME_DIR"]
    dev, _, said = _start_dev(prefix, ENTRIES["script"], env, scratch)
    try:
        base = Path(f"/tmp/openshell-sandbox-{NOBODY}")
        name = re.search(r"sandbox (dev-[0-9a-f]+) is ready", said)
        assert name, said
        system = Path("/run/openshell-sandbox")
        if system.is_dir() and system.stat().st_mode & 0o002:
            pytest.skip("/run/openshell-sandbox is writable by everyone here: rule 3 picks it")
        info = base.stat()
        assert (info.st_uid, info.st_mode & 0o777) == (NOBODY, 0o700)
        sockets = list(base.glob(f"{name[1]}/api.sock"))  # this dev's: another suite's may share the base
        assert sockets, "control's socket is in the private runtime directory"
        status = subprocess.run([*prefix, str(VENV / "openshell-sandbox"), "status", f"--api={sockets[0]}"],
                                env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
        assert status.returncode == 0, status.stderr
    finally:
        code, out, err = _finish(dev)
    assert (code, out.strip()) == (0, "agent-ok"), err[-3000:]


def test_a_control_that_fails_at_start_up_is_not_restarted_and_its_error_is_said_once(scratch: Path) -> None:
    _, env = _operator(None, scratch)
    # a resolver control refuses at start-up (dev checks its --policy and --credentials itself, before anything)
    result = subprocess.run([*ENTRIES["script"], "dev", "--dns-server=999.0.0.1", "--", "true"], env=env,
                            cwd=scratch, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 125, result.stderr
    assert "restarting" not in result.stderr, result.stderr
    errors = re.findall(r"999\.0\.0\.1", result.stderr)
    assert len(errors) == 1, result.stderr
    assert "at start-up" in result.stderr


def test_dev_refuses_a_workdir_that_holds_the_daemons_import_path(scratch: Path) -> None:
    _, env = _operator(None, scratch)
    result = subprocess.run([*ENTRIES["script"], "dev", f"--workdir={REPO}", "--", "true"], env=env, cwd=scratch,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 125, result.stderr
    assert f"refusing --workdir={REPO}: the agent can write it" in result.stderr
    assert not (scratch / "home" / "state").exists(), "nothing was started"
