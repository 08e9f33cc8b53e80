"""The workload's pids cgroup on a fake cgroupfs: v1 where writable, v2 where delegated."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor.boundary.process.cgroups import (
    CgroupError,
    create_pids_cgroup,
    locate,
    remove_stale_children,
    workload_cgroup_name,
)

V1_CGROUP = "12:pids:/kubepods/pod1\n4:memory:/kubepods/pod1\n0::/\n"
V2_CGROUP = "0::/user.slice/boundary\n"


def mountinfo(*lines: str) -> str:
    return "\n".join(lines) + "\n"


def v1_mount(point: Path, root: str = "/") -> str:
    return f"30 25 0:26 {root} {point} rw,nosuid - cgroup cgroup rw,pids"


def v2_mount(point: Path, root: str = "/") -> str:
    return f"31 25 0:27 {root} {point} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate"


def test_v1_child_is_made_under_our_cgroup_with_the_limit(tmp_path: Path) -> None:
    ours = tmp_path / "pids" / "kubepods" / "pod1"
    ours.mkdir(parents=True)
    info = mountinfo("22 1 8:1 / / rw - ext4 /dev/sda1 rw", v1_mount(tmp_path / "pids"))
    group = create_pids_cgroup("openshell-x", 64, self_cgroup=V1_CGROUP, mountinfo=info)
    assert group.version == 1 and group.directory == ours / "openshell-x"
    assert (ours / "openshell-x" / "pids.max").read_text() == "64"
    group.add(4242)
    assert (group.directory / "cgroup.procs").read_text() == "4242\n"
    for leftover in group.directory.iterdir():  # a real cgroupfs has no files to remove
        leftover.unlink()
    group.remove()
    assert not group.directory.exists()


def test_v1_inside_a_cgroup_namespace_uses_the_mount_root(tmp_path: Path) -> None:
    (tmp_path / "pids").mkdir()
    info = mountinfo(v1_mount(tmp_path / "pids", root="/kubepods/pod1"))
    assert locate(V1_CGROUP, info).directory == tmp_path / "pids"


def test_v1_mount_that_hides_our_cgroup_is_refused(tmp_path: Path) -> None:
    info = mountinfo(v1_mount(tmp_path / "pids", root="/other"))
    with pytest.raises(CgroupError, match="not mounted"):
        locate(V1_CGROUP, info)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes a 0555 directory anyway")
def test_unwritable_cgroup_is_unenforced_not_half_made(tmp_path: Path) -> None:
    ours = tmp_path / "pids" / "kubepods" / "pod1"
    ours.mkdir(parents=True)
    ours.chmod(0o555)
    try:
        with pytest.raises(CgroupError, match="not writable"):
            create_pids_cgroup("w", 10, self_cgroup=V1_CGROUP, mountinfo=mountinfo(v1_mount(tmp_path / "pids")))
        assert list(ours.iterdir()) == []
    finally:
        ours.chmod(0o755)


def test_v2_needs_pids_delegated(tmp_path: Path) -> None:
    ours = tmp_path / "unified" / "user.slice" / "boundary"
    ours.mkdir(parents=True)
    (ours / "cgroup.controllers").write_text("cpu memory\n")
    info = mountinfo(v2_mount(tmp_path / "unified"))
    with pytest.raises(CgroupError, match="not delegated"):
        create_pids_cgroup("w", 10, self_cgroup=V2_CGROUP, mountinfo=info)
    assert sorted(p.name for p in ours.iterdir()) == ["cgroup.controllers"], "nothing half-made"


def test_v2_delegated_enables_pids_and_makes_the_child(tmp_path: Path) -> None:
    ours = tmp_path / "unified" / "user.slice" / "boundary"
    ours.mkdir(parents=True)
    (ours / "cgroup.controllers").write_text("cpu pids memory\n")
    (ours / "cgroup.subtree_control").write_text("")
    group = create_pids_cgroup("w", 100, self_cgroup=V2_CGROUP, mountinfo=mountinfo(v2_mount(tmp_path / "unified")))
    assert group.version == 2 and group.directory == ours / "w"
    assert (ours / "cgroup.subtree_control").read_text() == "+pids"
    assert (ours / "w" / "pids.max").read_text() == "100"


def test_no_cgroup_at_all_is_reported() -> None:
    with pytest.raises(CgroupError, match="no pids cgroup"):
        locate("", "")


@pytest.mark.parametrize("limit", [0, -1])
def test_limit_must_be_positive(limit: int) -> None:
    with pytest.raises(CgroupError, match="at least 1"):
        create_pids_cgroup("w", limit, self_cgroup=V1_CGROUP, mountinfo="")


def test_escaped_mountpoint(tmp_path: Path) -> None:
    spaced = tmp_path / "a b"
    (spaced / "kubepods" / "pod1").mkdir(parents=True)
    line = v1_mount(spaced).replace(str(spaced), str(spaced).replace(" ", "\\040"))
    assert locate(V1_CGROUP, mountinfo(line)).directory == spaced / "kubepods" / "pod1"


def test_stale_children_of_dead_boundaries_are_removed_only_those(tmp_path: Path) -> None:
    """A SIGKILLed boundary leaves its empty child behind (rule 5): the next boundary removes it — and only
    children of our shape whose owner pid is gone and that are empty (a real cgroupfs refuses rmdir while a
    cgroup has members; here a file stands for them)."""
    ours = tmp_path / "pids" / "kubepods" / "pod1"
    dead, live = 4_194_305, os.getpid()  # above any pid_max: never alive
    stale = ours / workload_cgroup_name(dead, "0123abcd-ffff")
    stale_leaf = ours / f"{workload_cgroup_name(dead, '89abcdef')}-supervisor"
    alive_owner = ours / workload_cgroup_name(live, "0123abcd")
    busy = ours / workload_cgroup_name(dead, "feedf00d")
    foreign = [ours / "openshell-boundary-0123abcd-0000", ours / "system.slice", ours / f"other-{dead}-0123abcd"]
    for directory in (stale, stale_leaf, alive_owner, busy, *foreign):
        directory.mkdir(parents=True)
    (busy / "cgroup.procs").write_text("4242\n")
    assert stale.name == f"openshell-boundary-{dead}-0123abcd"

    info = mountinfo(v1_mount(tmp_path / "pids"))
    group = create_pids_cgroup(workload_cgroup_name(live, "aaaabbbb"), 64, self_cgroup=V1_CGROUP, mountinfo=info)
    assert sorted(group.stale_removed) == sorted([stale.name, stale_leaf.name])
    assert not stale.exists() and not stale_leaf.exists()
    assert alive_owner.is_dir() and busy.is_dir() and all(d.is_dir() for d in foreign)
    assert group.directory.is_dir()


def test_remove_stale_children_asks_about_each_owner(tmp_path: Path) -> None:
    (tmp_path / workload_cgroup_name(7, "deadbeef")).mkdir()
    (tmp_path / workload_cgroup_name(8, "deadbeef")).mkdir()
    asked: list[int] = []

    def alive(pid: int) -> bool:
        asked.append(pid)
        return pid == 8

    assert remove_stale_children(tmp_path, alive=alive) == [workload_cgroup_name(7, "deadbeef")]
    assert sorted(asked) == [7, 8]
    assert remove_stale_children(tmp_path / "missing") == []
