"""Control run by hand decides at start whether its policy file may be hot-reloaded, and says so.

A policy under ``/tmp`` (the agent's) is loaded once; the same policy named by ``--policy-source`` in an
operator-owned directory under ``/var/tmp`` is watched; ``--no-policy-watch`` turns the watch off. Control
dials a boundary that is not there (it keeps retrying), which is all these checks need: the ``policy.watch``
event comes at start.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.certs_fixtures import issue_pair
from tests.e2e.safe_dirs import safe_dir

POLICY = "version: 1\nnetwork_policies: {}\n"


def _watch_event(tmp_path: Path, *flags: str) -> dict[str, Any]:
    issue_pair(tmp_path / "bundle")
    proc = subprocess.Popen(
        [sys.executable, "-m", "supervisor.cli", "--mode=control", f"--bootstrap={tmp_path / 'bundle' / 'control'}",
         "--boundary=127.0.0.1:9", f"--api={tmp_path / 'api.sock'}", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else "control exited"
            event: dict[str, Any] = json.loads(line)
            if event.get("event") == "policy.watch":
                return event
        raise AssertionError("no policy.watch event")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_policy_under_tmp_is_loaded_once(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    event = _watch_event(tmp_path, f"--policy={policy}")
    assert event["watching"] is False and "/tmp" in event["reason"] and "policy apply" in event["reason"]


@pytest.mark.parametrize(("extra", "watching"), [((), True), (("--no-policy-watch",), False)])
def test_policy_source_in_a_safe_directory_is_watched(tmp_path: Path, extra: tuple[str, ...], watching: bool) -> None:
    copy = tmp_path / "copy.yaml"
    copy.write_text(POLICY)
    with safe_dir() as directory:
        original = directory / "policy.yaml"
        original.write_text(POLICY)
        event = _watch_event(tmp_path, f"--policy={copy}", f"--policy-source={original}", *extra)
    assert event["watching"] is watching, event
    assert str(original) in event["reason"]


def test_policy_inside_an_agent_writable_path_is_loaded_once(tmp_path: Path) -> None:
    with safe_dir() as directory:
        original = directory / "policy.yaml"
        original.write_text(POLICY)
        event = _watch_event(tmp_path, f"--policy={original}", f"--agent-writable={directory}")
    assert event["watching"] is False and "which the agent can write" in event["reason"], event
