"""``child._execve``'s PATH search: a candidate that is not there is skipped without an ``execve`` (each one is a
round trip to the boundary under the connect-notify filter), and every other outcome is what ``execve`` says."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from supervisor.boundary.forkimage import child


class Executed(Exception):
    pass


@pytest.fixture
def tried(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths ``execve`` is called on; it 'succeeds' (raises ``Executed``) on an executable regular file."""
    calls: list[str] = []

    def fake_execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        calls.append(path)
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        if not os.access(path, os.X_OK) or os.path.isdir(path):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        raise Executed(path)

    monkeypatch.setattr(child.os, "execve", fake_execve)
    return calls


def _tool(directory: Path, name: str, mode: int) -> Path:
    directory.mkdir(exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n")
    path.chmod(mode)
    return path


def test_missing_path_entries_are_never_executed(tmp_path: Path, tried: list[str]) -> None:
    good = _tool(tmp_path / "bin", "tool", 0o755)
    path = f"{tmp_path / 'nope'}:{tmp_path / 'also-missing'}:{good.parent}"
    with pytest.raises(Executed):
        child._execve(("tool",), {"PATH": path})
    assert tried == [str(good)]


def test_a_denied_candidate_is_still_tried_and_reported_when_nothing_runs(tmp_path: Path, tried: list[str]) -> None:
    denied = _tool(tmp_path / "a", "tool", 0o644)
    with pytest.raises(PermissionError):
        child._execve(("tool",), {"PATH": f"{tmp_path / 'missing'}:{denied.parent}"})
    assert tried == [str(denied)]
    good = _tool(tmp_path / "b", "tool", 0o755)
    tried.clear()
    with pytest.raises(Executed):
        child._execve(("tool",), {"PATH": f"{denied.parent}:{good.parent}"})
    assert tried == [str(denied), str(good)]


def test_not_found_anywhere_tries_nothing(tmp_path: Path, tried: list[str]) -> None:
    with pytest.raises(FileNotFoundError, match="not found in PATH"):
        child._execve(("tool",), {"PATH": f"{tmp_path / 'x'}:{tmp_path / 'y'}"})
    assert tried == []


def test_a_name_with_a_slash_goes_to_execve_as_it_is(tmp_path: Path, tried: list[str]) -> None:
    with pytest.raises(FileNotFoundError):
        child._execve((str(tmp_path / "missing"),), {"PATH": "/bin"})
    assert tried == [str(tmp_path / "missing")]
