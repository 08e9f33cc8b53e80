"""Stale pids-cgroup removal (boundary/process/cgroups.py rule 5) from the attacker's side: whatever
an agent or another local user can put in the directory the boundary sweeps, only an empty directory of our
name shape is removed — never what a name or a symlink points at, never a directory with content."""

from __future__ import annotations

from pathlib import Path

from supervisor.boundary.process.cgroups import remove_stale_children, workload_cgroup_name

DEAD = 4_194_305  # above any pid_max: never alive


def test_a_symlink_named_like_a_dead_boundarys_cgroup_removes_nothing(tmp_path: Path) -> None:
    victim = tmp_path / "elsewhere" / "someone-elses-cgroup"
    victim.mkdir(parents=True)
    sweep = tmp_path / "ours"
    sweep.mkdir()
    link = sweep / workload_cgroup_name(DEAD, "0123abcd")
    link.symlink_to(victim, target_is_directory=True)
    assert remove_stale_children(sweep, alive=lambda _pid: False) == []
    assert victim.is_dir() and link.is_symlink()  # rmdir of a symlink is ENOTDIR: neither is touched


def test_names_that_only_resemble_ours_are_left(tmp_path: Path) -> None:
    names = [
        f"openshell-boundary-{DEAD}-0123abcd/../x",  # not a single path component anyway
        f"openshell-boundary-{DEAD}-0123ABCD",  # upper-case id: not a shape we write
        f"openshell-boundary-{DEAD}-0123abcd-other",
        f"openshell-boundary--{DEAD}-0123abcd",
        f" openshell-boundary-{DEAD}-0123abcd",
        f"openshell-boundary-{DEAD}-0123abcd\n",  # a trailing newline (``$`` matched before it)
        "openshell-boundary-\u0664\u0662-0123abcd",  # Arabic-Indic digits: int() reads them as 42
    ]
    made = []
    for name in names[1:]:
        (tmp_path / name).mkdir()
        made.append(tmp_path / name)
    assert remove_stale_children(tmp_path, alive=lambda _pid: False) == []
    assert all(p.is_dir() for p in made)


def test_a_cgroup_with_content_is_left_even_when_its_owner_is_gone(tmp_path: Path) -> None:
    busy = tmp_path / workload_cgroup_name(DEAD, "feedf00d")
    (busy / "child").mkdir(parents=True)  # a nested cgroup (on cgroupfs: members make rmdir EBUSY the same way)
    assert remove_stale_children(tmp_path, alive=lambda _pid: False) == []
    assert (busy / "child").is_dir()
