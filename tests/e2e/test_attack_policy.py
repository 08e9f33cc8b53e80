"""The agent attacks its own policy and control's secrets (part of the project's attack list).

Each run starts ``openshell-sandbox dev`` with a policy file that control *does* hot-reload (a 0755 directory
under /var/tmp owned by the operator) and a credentials file readable by the operator's group and others
(0644: only the agent's view protects it). The agent — ``/usr/bin/python3``, which every uid can read —
waits for ``targets.json`` in its workdir: the test writes it once the daemons are up, naming the originals,
control's private copies, control's key, the interception CA key, the boundary's key and the events file
(found on the daemons' command lines). The agent then tries to read each of them and to rename, write,
chmod and touch the policy file and its directory, prints one JSON object, and waits for ``exit``.

The test asserts every attempt failed, that no byte of any secret reached the agent, that the policy file and
its directory are unchanged, and that ``policy get`` still reports generation 0 — then proves the watch was
live by changing the file itself and seeing generation 1. Runs: models R and U as root, model U as a normal
user (uid 65534 through ``setpriv``, with the repository's .venv built on /usr/bin/python3). As root, the
agent also shows its files on the host belong to its uid (never 0) and that a root-only 0600 file in its own
workdir stays closed to it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.safe_dirs import safe_dir
from tests.host_proxy_port import model_p_proxy_port

AGENT_PYTHON = "/usr/bin/python3"
VENV_PYTHON = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "python"
NOBODY = 65534
SECRET = "sk-live-0123456789abcdef-attack-me"
DENY_ALL = "version: 1\nnetwork_policies: {}\n"
ALLOW_ALL = """\
version: 1
network_policies:
  everything:
    endpoints: [{host: "*.example.com", port: 443}]
    binaries: [{path: /usr/bin/python3*}]
"""
REVISION = """\
version: 1
network_policies:
  revised:
    endpoints: [{host: a.example.com, port: 443}]
    binaries: [{path: /usr/bin/curl}]
"""
CREDENTIALS = f"API_TOKEN:\n  secret: {SECRET}\n  hosts: [api.example.com]\n"

AGENT = r"""
import errno, json, os, sys, time

def wait_for(name, seconds=60):
    deadline = time.monotonic() + seconds
    while not os.path.exists(name):
        if time.monotonic() > deadline:
            sys.exit(f"{name} never came")
        time.sleep(0.05)

def attempt(fn):
    try:
        result = fn()
    except OSError as exc:
        return ["err", errno.errorcode.get(exc.errno, str(exc.errno))]
    return ["ok", result]

def read(path):
    with open(path, "rb") as f:
        return f.read().decode("latin-1")

def listing(path):
    return sorted(os.listdir(path))

def write(path):
    with open(path, "r+b") as f:
        f.write(b"# agent was here\n")

def truncate(path):
    with open(path, "wb") as f:
        f.write(EVIL.encode())

def create(path):
    with open(path, "xb") as f:
        f.write(EVIL.encode())

wait_for("targets.json")
t = json.load(open("targets.json"))
EVIL = t["evil"]
with open("evil.yaml", "w") as f:
    f.write(EVIL)
policy, parent = t["policy"], os.path.dirname(t["policy"])
out = {"uid": os.getuid(), "gid": os.getgid()}
for name, path in t["secrets"].items():
    out["read " + name] = attempt(lambda p=path: read(p))
    out["list " + name] = attempt(lambda p=os.path.dirname(path): listing(p))
out["policy: write"] = attempt(lambda: write(policy))
out["policy: truncate"] = attempt(lambda: truncate(policy))
out["policy: rename over"] = attempt(lambda: os.rename("evil.yaml", policy))
out["policy: unlink"] = attempt(lambda: os.unlink(policy))
out["policy: chmod"] = attempt(lambda: os.chmod(policy, 0o666))
out["policy: utime"] = attempt(lambda: os.utime(policy, (0, 0)))
out["dir: create"] = attempt(lambda: create(os.path.join(parent, "next.yaml")))
out["dir: symlink"] = attempt(lambda: os.symlink("/etc/passwd", os.path.join(parent, "link.yaml")))
out["dir: rename"] = attempt(lambda: os.rename(parent, parent + ".moved"))
out["dir: chmod"] = attempt(lambda: os.chmod(parent, 0o777))
out["root-only"] = attempt(lambda: read(t["root_only"])) if t.get("root_only") else ["err", "skipped"]
with open("mine", "w") as f:
    f.write("the agent's file\n")
print(json.dumps(out), flush=True)
wait_for("exit")
"""


@dataclass
class Run:
    dev: subprocess.Popen[str]
    stderr_path: Path
    runtime: Path
    policy: Path

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def _daemon_flags(run: Run, deadline: float) -> dict[str, dict[str, str]]:
    """``{"boundary": {flag: value}, "control": {...}}`` from the daemons' command lines, once both run."""
    while time.monotonic() < deadline:
        assert run.dev.poll() is None, f"dev exited ({run.dev.returncode}): {run.stderr()[-3000:]}"
        found: dict[str, dict[str, str]] = {}
        for child in _children(run.dev.pid):
            argv = _cmdline(child)
            for role in ("boundary", "control"):
                if f"--mode={role}" in argv:
                    pairs = (a.split("=", 1) for a in argv if a.startswith("--") and "=" in a)
                    found[role] = {name: value for name, value in pairs}
        if len(found) == 2:
            return found
        time.sleep(0.05)
    raise AssertionError(f"dev mode's daemons never both ran; dev's stderr: {run.stderr()[-3000:]}")


def _wait_for_text(path: Path, pattern: str, deadline: float, proc: subprocess.Popen[str]) -> re.Match[str]:
    while time.monotonic() < deadline:
        match = re.search(pattern, path.read_text(errors="replace"))
        if match:
            return match
        assert proc.poll() is None, f"dev exited ({proc.returncode}): {path.read_text(errors='replace')}"
        time.sleep(0.05)
    raise AssertionError(f"{pattern!r} never appeared in {path.read_text(errors='replace')}")


def _policy_get(run: Run, api: str) -> dict[str, Any]:
    result = subprocess.run([sys.executable, "-m", "supervisor.cli", "policy", "get", f"--api={api}"],
                            capture_output=True, text=True, timeout=30)  # fmt: skip
    assert result.returncode == 0, result.stderr
    body: dict[str, Any] = json.loads(result.stdout)
    return body


def _snapshot(directory: Path) -> dict[str, tuple[int, int, int, str]]:
    """Every entry of ``directory`` (and the directory itself): mode, uid, mtime, content hash."""
    out = {}
    for path in (directory, *sorted(directory.iterdir())):
        st = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
        out[str(path)] = (st.st_mode, st.st_uid, st.st_mtime_ns, digest)
    return out


@pytest.fixture
def scratch() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="attack-policy-", dir="/var/tmp"))
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _as_operator(uid: int | None) -> list[str]:
    if uid is None:
        return [sys.executable]
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to run dev mode as a normal user")
    if not os.access(VENV_PYTHON, os.X_OK):
        pytest.skip(f"{VENV_PYTHON} (make venv) is needed for dev mode under another uid")
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", str(VENV_PYTHON)]


@pytest.mark.parametrize(("model", "operator"), [("R", None), ("U", None), ("U", NOBODY)],
                         ids=["R-root", "U-root", "U-nonroot"])  # fmt: skip
def test_agent_cannot_change_its_policy_or_read_controls_secrets(
    model: str, operator: int | None, scratch: Path
) -> None:
    if not os.access(AGENT_PYTHON, os.X_OK):
        pytest.skip(f"{AGENT_PYTHON} is needed: the agent's uid cannot read pyenv under /root")
    prefix = _as_operator(operator)
    home = scratch / "home"
    home.mkdir(mode=0o700)
    if operator is not None:
        os.chown(home, operator, operator)
    env = {**os.environ, "HOME": str(home), "XDG_STATE_HOME": str(home / "state"), "XDG_RUNTIME_DIR": str(home / "run")}
    with safe_dir("attack-policy-", owner=operator) as directory:
        policy, credentials = directory / "policy.yaml", directory / "credentials.yaml"
        policy.write_text(DENY_ALL)
        credentials.write_text(CREDENTIALS)
        for path in (policy, credentials):
            os.chmod(path, 0o644)
            if operator is not None:
                os.chown(path, operator, operator)
        before = _snapshot(directory)
        stderr_path = scratch / "dev.stderr"
        with stderr_path.open("w") as err:
            dev = subprocess.Popen(
                [*prefix, "-m", "supervisor.cli", "dev", f"--privilege-model={model}", f"--policy={policy}",
                 f"--credentials={credentials}", "--", AGENT_PYTHON, "-c", AGENT],
                stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=str(scratch),
            )  # fmt: skip
        run = Run(dev, stderr_path, home / "run", policy)
        try:
            _attack_and_check(run, model, operator, directory, credentials, before)
        finally:
            if dev.poll() is None:
                dev.terminate()
            dev.wait(timeout=30)


def _attack_and_check(
    run: Run, model: str, operator: int | None, directory: Path, credentials: Path,
    before: dict[str, tuple[int, int, int, str]],
) -> None:  # fmt: skip
    deadline = time.monotonic() + 60
    flags = _daemon_flags(run, deadline)
    workdir = Path(_wait_for_text(run.stderr_path, r"workdir (\S+)", deadline, run.dev).group(1))
    ids = _wait_for_text(run.stderr_path, r"agent uid:gid (\d+):(\d+)", deadline, run.dev)
    agent_uid = int(ids.group(1))
    _wait_for_text(run.stderr_path, r"is ready", deadline, run.dev)
    assert "watched for revisions" in run.stderr(), run.stderr()
    control, boundary = flags["control"], flags["boundary"]
    api = control["--api"]
    assert _policy_get(run, api)["generation"] == 0
    tmp = Path(boundary["--bootstrap"]).parents[1]
    ca_keys = [p for p in Path(control["--interception-ca"]).iterdir() if "key" in p.name]
    assert ca_keys, "control wrote no interception CA key"
    secrets = {
        "policy original": str(run.policy),
        "policy copy": control["--policy"],
        "credentials original": str(credentials),
        "credentials copy": control["--credentials"],
        "control key": str(Path(control["--bootstrap"]) / "key.pem"),
        "boundary key": str(Path(boundary["--bootstrap"]) / "key.pem"),
        "interception CA key": str(ca_keys[0]),
        "events file": str(Path(boundary["--log-file"])),
        "api socket": api,
    }
    assert str(tmp) in control["--policy"] and str(tmp) in control["--credentials"]
    targets: dict[str, Any] = {"policy": str(run.policy), "secrets": secrets, "evil": ALLOW_ALL}
    if operator is None:  # as root: a root-only file where the agent can reach it
        root_only = workdir / "root-only"
        root_only.write_text(SECRET)
        os.chmod(root_only, 0o600)
        targets["root_only"] = str(root_only)
    (workdir / "targets.tmp").write_text(json.dumps(targets))
    os.chmod(workdir / "targets.tmp", 0o644)
    (workdir / "targets.tmp").rename(workdir / "targets.json")

    assert run.dev.stdout is not None
    line = run.dev.stdout.readline()
    assert line, run.stderr()
    out = json.loads(line)
    failures = {k: v for k, v in out.items() if isinstance(v, list) and v[0] != "err"}
    # a directory on the way may be visible (the skeleton of a granted path): never with the secret in it
    failures = {
        k: v for k, v in failures.items()
        if not (k.startswith("list ") and Path(secrets[k[5:]]).name not in v[1])
    }  # fmt: skip
    assert not failures, failures
    assert SECRET not in line and "sk-live" not in line

    # nothing changed: the files, the directory, the generation in force
    assert _snapshot(directory) == before
    assert _policy_get(run, api)["generation"] == 0
    mine = workdir / "mine"
    assert mine.stat().st_uid == agent_uid == out["uid"]
    if operator is None:
        assert agent_uid != 0 and out["gid"] != 0, "the agent ran as host root"
        assert out["root-only"][1] == "EACCES", out["root-only"]
    else:
        assert agent_uid == operator  # model U without root: our own uid, protected by the view alone

    # the watch was live: the operator's own change is a revision
    tmp_policy = directory / "next.tmp"
    tmp_policy.write_text(REVISION)
    if operator is not None:
        os.chown(tmp_policy, operator, operator)
    tmp_policy.rename(run.policy)
    deadline = time.monotonic() + 30
    while _policy_get(run, api)["generation"] != 1:
        assert time.monotonic() < deadline, "the operator's revision was never loaded"
        time.sleep(0.1)

    (workdir / "exit").write_text("")
    assert run.dev.wait(timeout=30) == 0, run.stderr()


def test_model_p_says_secrets_are_not_protected_and_never_watches(scratch: Path) -> None:
    """Model P locally is one uid and no mount namespace: dev says so plainly and control loads the policy once."""
    with safe_dir("attack-policy-") as directory, model_p_proxy_port():
        policy = directory / "policy.yaml"
        policy.write_text(DENY_ALL)
        env = {**os.environ, "XDG_STATE_HOME": str(scratch / "state"), "XDG_RUNTIME_DIR": str(scratch / "run")}
        result = subprocess.run(
            [sys.executable, "-m", "supervisor.cli", "dev", "--privilege-model=P", "--acknowledge-external-fence",
             f"--policy={policy}", "--", "true"],
            capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "secrets are NOT protected" in result.stderr
    assert "loaded once (--no-policy-watch)" in result.stderr
    events = (scratch / "state" / "openshell-sandbox").glob("*/events.jsonl")
    watch = [json.loads(line) for path in events for line in path.read_text().splitlines() if "policy.watch" in line]
    assert watch and all(event["watching"] is False for event in watch), watch
