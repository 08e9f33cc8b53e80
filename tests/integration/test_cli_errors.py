"""The entrypoint refuses bad invocations with a message that names the flag or file, and the right code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.certs_fixtures import issue_pair

CLI = [sys.executable, "-m", "supervisor.cli"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)


def test_unknown_mode_is_a_usage_error() -> None:
    result = run("--mode=sidecar", "--bootstrap=/nonexistent")
    assert result.returncode == 2
    assert "--mode" in result.stderr and "sidecar" in result.stderr


def test_missing_bootstrap_is_a_usage_error() -> None:
    result = run("--mode=control")
    assert result.returncode == 2
    assert "--bootstrap" in result.stderr


def test_help_explains_both_modes_and_the_commands() -> None:
    result = run("--help")
    assert result.returncode == 0
    for word in ("--mode=boundary", "--mode=control", "dev", "exec", "forward", "policy", "certs"):
        assert word in result.stdout


def test_bundle_with_world_readable_key_is_refused(tmp_path: Path) -> None:
    issue_pair(tmp_path / "bundle")
    key = tmp_path / "bundle" / "control" / "key.pem"
    os.chmod(key, 0o644)
    result = run("--mode=control", f"--bootstrap={tmp_path / 'bundle' / 'control'}", "--boundary=127.0.0.1:1")
    assert result.returncode == 125
    assert "key.pem" in result.stderr


def test_bundle_with_missing_key_is_refused(tmp_path: Path) -> None:
    issue_pair(tmp_path / "bundle")
    (tmp_path / "bundle" / "boundary" / "key.pem").unlink()
    result = run("--mode=boundary", f"--bootstrap={tmp_path / 'bundle' / 'boundary'}", "--", "true")
    assert result.returncode == 125
    assert "key.pem" in result.stderr


def test_the_other_roles_directory_is_refused(tmp_path: Path) -> None:
    issue_pair(tmp_path / "bundle")
    result = run("--mode=boundary", f"--bootstrap={tmp_path / 'bundle' / 'control'}", "--", "true")
    assert result.returncode == 125
    assert "control" in result.stderr


@pytest.mark.parametrize(
    ("flag", "word"),
    [
        (None, "required"),
        ("--workdir=/", "root directory"),
        ("--workdir=//proc/1", "/proc"),
        ("--workdir=work", "absolute"),
    ],
)
def test_boundary_workdir_is_required_and_never_root_or_proc(tmp_path: Path, flag: str | None, word: str) -> None:
    issue_pair(tmp_path / "bundle")
    flags = [flag] if flag else []
    result = run("--mode=boundary", f"--bootstrap={tmp_path / 'bundle' / 'boundary'}", "--privilege-model=P",
                 *flags, "--", "true")  # fmt: skip
    assert result.returncode == 2
    assert "--workdir" in result.stderr and word in result.stderr


def test_invalid_policy_file_names_the_field(tmp_path: Path) -> None:
    issue_pair(tmp_path / "bundle")
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\nnetwork_policies:\n  x:\n    endpoints: [{host: a.test, port: 0}]\n")
    result = run(
        "--mode=control", f"--bootstrap={tmp_path / 'bundle' / 'control'}", "--boundary=127.0.0.1:1",
        f"--policy={policy}",
    )  # fmt: skip
    assert result.returncode == 125
    assert "policy.yaml" in result.stderr and "network_policies.x" in result.stderr


def test_client_without_a_running_sandbox_says_so(tmp_path: Path) -> None:
    """The one test of looking for the sandbox in an empty runtime directory (its own, with no API named)."""
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}
    env.pop("OPENSHELL_SANDBOX_API", None)
    result = subprocess.run([*CLI, "status"], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 125
    assert "no running sandbox" in result.stderr
