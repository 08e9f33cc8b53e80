"""What dev runs leave behind, and how it goes: ``dev --rm`` removes its own state directory at exit;
``openshell-sandbox clean`` removes old ones, never a running sandbox's, never through a symlink."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.waiting import wait_until

CLI = [sys.executable, "-m", "supervisor.cli"]
DAY = 86400


def env_for(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_RUNTIME_DIR": str(tmp_path / "run")}


def sandboxes(tmp_path: Path) -> list[str]:
    root = tmp_path / "state" / "openshell-sandbox"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


@pytest.fixture(autouse=True)
def _root() -> None:
    if os.geteuid() != 0:
        pytest.skip("dev mode runs the boundary in model R here (root)")


def test_dev_rm_removes_the_runs_state_directory(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    kept = subprocess.run([*CLI, "dev", "--", "true"], capture_output=True, text=True, timeout=120, env=env)
    assert kept.returncode == 0, kept.stderr
    assert len(sandboxes(tmp_path)) == 1  # without --rm it stays, as before
    removed = subprocess.run([*CLI, "dev", "--rm", "--", "sh", "-c", "echo x > made"], capture_output=True, text=True,
                             timeout=120, env=env)  # fmt: skip
    assert removed.returncode == 0, removed.stderr
    kept_names(tmp_path, 1)  # the second run left nothing


def kept_names(tmp_path: Path, count: int) -> list[str]:
    names = sandboxes(tmp_path)
    assert len(names) == count, names
    return names


def test_clean_removes_old_runs_only_never_a_running_one_never_through_a_symlink(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    for _ in range(2):
        done = subprocess.run([*CLI, "dev", "--", "true"], capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr
    old, recent = [tmp_path / "state" / "openshell-sandbox" / name for name in sandboxes(tmp_path)]
    # the agent of the old run left a symlink to something of ours in its workdir
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep").write_text("mine")
    os.symlink(precious, old / "work" / "link")
    week_ago = time.time() - 8 * DAY
    for path in (old, old / "events.jsonl", old / "work"):
        os.utime(path, (week_ago, week_ago), follow_symlinks=False)
    # a running sandbox, made to look just as old
    running = subprocess.Popen([*CLI, "dev", "--", "sleep", "600"], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        live_dir = wait_until(
            lambda: [
                p
                for p in (tmp_path / "state" / "openshell-sandbox").iterdir()
                if p not in (old, recent) and (p / "events.jsonl").exists()
            ],
            "its state",
        )[0]
        for path in (live_dir, live_dir / "events.jsonl", live_dir / "work"):
            os.utime(path, (week_ago, week_ago), follow_symlinks=False)
        dry = subprocess.run([*CLI, "clean", "--dry-run"], capture_output=True, text=True, timeout=60, env=env)
        assert (dry.returncode, dry.stdout) == (0, f"would remove {old}\n"), dry
        assert old.exists()
        cleaned = subprocess.run([*CLI, "clean", "--older-than", "7d"], capture_output=True, text=True, timeout=60,
                                 env=env)  # fmt: skip
        assert (cleaned.returncode, cleaned.stdout) == (0, f"removed {old}\n"), cleaned
        assert "kept 1 running sandbox's" in cleaned.stderr
        assert not old.exists() and recent.exists() and live_dir.exists()
        assert (precious / "keep").read_text() == "mine", "clean followed the agent's symlink"
        assert running.poll() is None
        everything = subprocess.run([*CLI, "clean", "--older-than", "0"], capture_output=True, text=True,
                                    timeout=60, env=env)  # fmt: skip
        assert everything.returncode == 0 and not recent.exists() and live_dir.exists(), everything
    finally:
        running.terminate()
        running.wait(timeout=60)
