"""Dev mode's errors said once, in the user's terms: an invalid ``--policy``/``--credentials`` is refused before
anything starts, naming the user's own file; a program that cannot be run is named with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "supervisor.cli"]

BAD_POLICY = """version: 1
network_policies:
  a:
    endpoints:
      - host: x.test
        port: 0
        protocl: rest
    binaries:
      - path: /usr/bin/curl
"""


def dev(tmp_path: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_RUNTIME_DIR": str(tmp_path / "run")}
    return subprocess.run([*CLI, "dev", *args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


def test_an_invalid_policy_is_refused_before_anything_starts_naming_the_users_file(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(BAD_POLICY)
    marker = tmp_path / "agent-ran"
    result = dev(tmp_path, "--policy", "bad.yaml", "--", "touch", str(marker), cwd=tmp_path)
    check = subprocess.run([*CLI, "policy", "check", "bad.yaml"], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    # policy check's own lines, against the path the user typed, once each; never dev's private copy
    assert result.stderr.splitlines()[:-1] == check.stdout.splitlines(), result.stderr
    assert result.stderr.splitlines()[-1] == "bad.yaml: 2 errors (openshell-sandbox policy check bad.yaml)"
    assert "private" not in result.stderr and "restarting" not in result.stderr
    assert not marker.exists()
    assert not (tmp_path / "state").exists(), "nothing may be started (no state directory made)"


def test_an_invalid_credentials_file_is_refused_before_anything_starts(tmp_path: Path) -> None:
    (tmp_path / "creds.yaml").write_text("TOKEN: {secret: 12, hosts: [api.test]}\n")
    result = dev(tmp_path, "--credentials", "creds.yaml", "--", "true", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr == "openshell-sandbox: --credentials: creds.yaml: TOKEN.secret: expected a string\n"
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize(
    ("program", "code", "reason"),
    [("/no/such/binary", 127, "No such file or directory"), ("/etc/passwd", 126, "Permission denied")],
)
def test_a_program_that_cannot_run_is_named_with_the_reason(tmp_path: Path, program: str, code: int,
                                                            reason: str) -> None:  # fmt: skip
    if os.geteuid() != 0:
        pytest.skip("dev mode runs the boundary in model R here (root)")
    result = dev(tmp_path, "--", program)
    assert result.returncode == code, result.stderr
    assert f"openshell-sandbox: cannot run {program}: {reason}\n" in result.stderr
    assert result.stderr.count("cannot run") == 1
    quiet = dev(tmp_path, "-q", "--", program)  # fatal: said even with -q, and nothing else of ours
    assert (quiet.returncode, quiet.stderr) == (code, f"openshell-sandbox: cannot run {program}: {reason}\n")


def test_workdir_dot_is_this_directory(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("dev mode runs the boundary in model R here (root)")
    work = tmp_path / "project"
    work.mkdir()
    work.chmod(0o1777)  # the dedicated agent uid may write it
    result = dev(tmp_path, "--workdir", ".", "--", "sh", "-c", "pwd; echo made > by-agent", cwd=work)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{work}\n"
    assert (work / "by-agent").read_text() == "made\n"


def test_a_workdir_the_agent_cannot_write_is_refused_naming_owner_and_mode(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("dev mode runs the boundary in model R here (root)")
    work = tmp_path / "project"
    work.mkdir()
    work.chmod(0o755)  # root's: the dedicated agent uid can only read it
    result = dev(tmp_path, "--workdir", str(work), "--", "sh", "-c", "echo ran; echo made > by-agent")
    assert result.returncode == 125, result.stderr
    assert result.stdout == ""
    assert f"openshell-sandbox: --workdir={work}: the agent (uid " in result.stderr
    assert "cannot write it: owned by root (uid 0), group root (gid 0), mode 0755" in result.stderr
    assert list(work.iterdir()) == []


def test_workdir_read_only_lets_the_agent_only_read_its_workdir(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("dev mode runs the boundary in model R here (root)")
    work = tmp_path / "project"
    work.mkdir()
    work.chmod(0o755)
    (work / "script.sh").write_text("echo read\n")
    (work / "script.sh").chmod(0o644)
    result = dev(tmp_path, "--workdir", str(work), "--workdir-read-only", "--", "sh", "script.sh")
    assert (result.returncode, result.stdout) == (0, "read\n"), result.stderr
    work.chmod(0o700)  # now it cannot even read it
    result = dev(tmp_path, "--workdir", str(work), "--workdir-read-only", "--", "sh", "script.sh")
    assert result.returncode == 125 and "cannot read it: owned by root (uid 0), group root (gid 0), mode 0700" \
        in result.stderr, result.stderr  # fmt: skip


def test_a_normal_agent_exit_is_one_link_closed_line(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("dev mode runs the boundary in model R here (root)")
    result = dev(tmp_path, "--", "true")
    assert result.returncode == 0, result.stderr
    [events] = (tmp_path / "state").glob("openshell-sandbox/*/events.jsonl")
    links = [e for e in map(json.loads, events.read_text().splitlines())
             if e["component"] == "control" and e["event"] in ("link.closed", "link.failed")]  # fmt: skip
    assert [e["event"] for e in links] == ["link.closed"], links
    assert links[0]["reason"] == "the agent has terminated: reason exited (code 0); the boundary closed its links"


def test_the_init_processes_argv_in_the_agents_pid_namespace_names_no_host_path(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("dev mode runs the boundary in model R here (root)")
    script = 'for p in /proc/[0-9]*; do tr "\\0" " " < "$p/cmdline"; echo; done'
    result = dev(tmp_path, "--", "sh", "-c", script)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any("init_entry" in line for line in lines), lines  # the init is there to be read
    installation = Path(__file__).resolve().parents[2]  # the package and its interpreter's environment
    for secret_place in (str(installation), sys.prefix, sys.executable, str(tmp_path), "/tmp/openshell-dev-"):
        assert not [line for line in lines if secret_place in line], (secret_place, lines)
