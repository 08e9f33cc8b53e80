"""Where dev mode keeps what outlives a sandbox: ``$XDG_STATE_HOME/openshell-sandbox/<sandbox>``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor.cli.state_dirs import StateDirError, ensure_sandbox_state_dir, events_path, sandbox_state_dir
from supervisor.jsonlog import JsonLog, open_log_file


def test_xdg_state_home_when_absolute_else_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert sandbox_state_dir("dev-1") == tmp_path / "openshell-sandbox" / "dev-1"
    assert events_path("dev-1") == tmp_path / "openshell-sandbox" / "dev-1" / "events.jsonl"
    monkeypatch.setenv("XDG_STATE_HOME", "relative/state")  # ignored, as the XDG spec says
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert sandbox_state_dir("dev-1") == tmp_path / "home" / ".local" / "state" / "openshell-sandbox" / "dev-1"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert sandbox_state_dir("dev-1") == tmp_path / "home" / ".local" / "state" / "openshell-sandbox" / "dev-1"


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../x", "a\0b"])
def test_a_sandbox_name_is_one_path_component(name: str) -> None:
    with pytest.raises(StateDirError, match="single path component"):
        sandbox_state_dir(name)


def test_created_with_private_parents_and_a_traversable_sandbox_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    path = ensure_sandbox_state_dir("dev-1")
    assert path.stat().st_mode & 0o777 == 0o711
    assert path.parent.stat().st_mode & 0o777 == 0o700
    assert ensure_sandbox_state_dir("dev-1") == path  # idempotent


def test_a_symlink_in_place_of_the_state_dir_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    (tmp_path / "openshell-sandbox").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "openshell-sandbox" / "dev-1").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(StateDirError, match="not a directory"):
        ensure_sandbox_state_dir("dev-1")


def test_the_log_file_is_private_appended_and_never_followed_through_a_symlink(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    for component in ("control", "boundary"):
        log = JsonLog(component, sandbox="dev-1", file=open_log_file(path), to_stream=False)
        log.emit("hello", n=1)
        assert log.file is not None
        assert not os.get_inheritable(log.file.fileno())
        log.file.close()
    assert path.stat().st_mode & 0o777 == 0o600
    assert [line.count('"event":"hello"') for line in path.read_text().splitlines()] == [1, 1]
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "target")
    with pytest.raises(OSError):
        open_log_file(tmp_path / "link.jsonl")
    assert not (tmp_path / "target").exists()
