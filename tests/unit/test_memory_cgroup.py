"""The workload's memory cgroup on a fake cgroupfs: v1 child with memsw where swap is accounted, v2 shared with
the pids child where memory is delegated, nothing half-made, the OOM-kill counter, sizes, oom_score_adj."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from supervisor.boundary.process import memory_cgroup
from supervisor.boundary.process.cgroups import CgroupError, create_pids_cgroup
from supervisor.boundary.process.memory_cgroup import (
    DEFAULT_CAP_BYTES,
    MemoryCgroup,
    create_memory_cgroup,
    default_memory_limit,
    parse_size,
    set_oom_score_adj,
)
from supervisor.cli.human import format_size

V1_CGROUP = "12:pids:/kubepods/pod1\n4:memory:/kubepods/pod1\n0::/\n"
V2_CGROUP = "0::/user.slice/boundary\n"
PAGE = os.sysconf("SC_PAGE_SIZE")


def v1_info(base: Path) -> str:
    return (
        f"30 25 0:26 / {base / 'pids'} rw - cgroup cgroup rw,pids\n"
        f"31 25 0:28 / {base / 'memory'} rw - cgroup cgroup rw,memory\n"
    )


def v2_info(base: Path) -> str:
    return f"31 25 0:27 / {base / 'unified'} rw - cgroup2 cgroup2 rw,nsdelegate\n"


def v1_tree(base: Path, *, memsw: bool) -> Path:
    ours = base / "memory" / "kubepods" / "pod1"
    ours.mkdir(parents=True)
    (ours / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    if memsw:
        (ours / "memory.memsw.limit_in_bytes").write_text("9223372036854771712\n")
    return ours


def test_v1_child_gets_the_limit_and_memsw_at_the_same_value(tmp_path: Path) -> None:
    ours = v1_tree(tmp_path, memsw=True)
    group = create_memory_cgroup("openshell-x", 256 << 20, self_cgroup=V1_CGROUP, mountinfo=v1_info(tmp_path))
    assert (group.version, group.directory, group.limit, group.swap) == (1, ours / "openshell-x", 256 << 20, "capped")
    assert (group.directory / "memory.limit_in_bytes").read_text() == str(256 << 20)
    assert (group.directory / "memory.memsw.limit_in_bytes").read_text() == str(256 << 20)
    assert not (tmp_path / "memory" / "openshell-x").exists()  # under ours, never beside it
    group.add(4242)
    assert (group.directory / "cgroup.procs").read_text() == "4242\n"


def test_v1_without_swap_accounting_says_swap_is_uncapped(tmp_path: Path) -> None:
    v1_tree(tmp_path, memsw=False)
    group = create_memory_cgroup("w", 64 << 20, self_cgroup=V1_CGROUP, mountinfo=v1_info(tmp_path))
    assert group.swap.startswith("uncapped") and not (group.directory / "memory.memsw.limit_in_bytes").exists()


def test_limit_is_a_whole_number_of_pages(tmp_path: Path) -> None:
    v1_tree(tmp_path, memsw=False)
    group = create_memory_cgroup("w", (64 << 20) + 123, self_cgroup=V1_CGROUP, mountinfo=v1_info(tmp_path))
    assert group.limit == 64 << 20 and (group.directory / "memory.limit_in_bytes").read_text() == str(64 << 20)
    with pytest.raises(CgroupError, match="at least one page"):
        create_memory_cgroup("v", PAGE - 1, self_cgroup=V1_CGROUP, mountinfo=v1_info(tmp_path))


def test_v1_limit_that_does_not_take_leaves_no_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ours = v1_tree(tmp_path, memsw=True)
    (ours / "w").mkdir()  # a name already taken: the child cannot be made
    with pytest.raises(CgroupError, match="cannot create"):
        create_memory_cgroup("w", 64 << 20, self_cgroup=V1_CGROUP, mountinfo=v1_info(tmp_path))

    def refuse(path: Path, text: str) -> None:
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(memory_cgroup, "write", refuse)  # the kernel refuses the value
    with pytest.raises(CgroupError, match="cannot set the memory limit"):
        create_memory_cgroup("x", 64 << 20, self_cgroup=V1_CGROUP, mountinfo=v1_info(tmp_path))
    assert not (ours / "x").exists()


def test_no_memory_hierarchy_is_unenforced_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(CgroupError, match=r"memory hierarchy .* not mounted"):
        create_memory_cgroup("w", 64 << 20, self_cgroup=V1_CGROUP, mountinfo=v1_info(tmp_path).splitlines()[0])
    with pytest.raises(CgroupError, match="no memory cgroup"):
        create_memory_cgroup("w", 64 << 20, self_cgroup="12:pids:/\n", mountinfo="")


def test_v2_shares_the_pids_child_and_caps_swap(tmp_path: Path) -> None:
    ours = tmp_path / "unified" / "user.slice" / "boundary"
    ours.mkdir(parents=True)
    (ours / "cgroup.controllers").write_text("cpu memory pids\n")
    (ours / "cgroup.subtree_control").write_text("")
    (ours / "memory.swap.max").write_text("max\n")
    pids = create_pids_cgroup("w", 64, self_cgroup=V2_CGROUP, mountinfo=v2_info(tmp_path))
    group = create_memory_cgroup("w", 128 << 20, self_cgroup=V2_CGROUP, mountinfo=v2_info(tmp_path))
    assert group.directory == pids.directory and group.shares_pids_child and group.swap == "capped"
    assert (group.directory / "memory.max").read_text() == str(128 << 20)
    assert (group.directory / "memory.swap.max").read_text() == "0"
    assert (ours / "cgroup.subtree_control").read_text() == "+memory"  # the fake keeps the last write
    assert group.remove() and group.directory.exists()  # the pids side removes the shared child


def test_v2_without_memory_delegated_is_unenforced(tmp_path: Path) -> None:
    ours = tmp_path / "unified" / "user.slice" / "boundary"
    ours.mkdir(parents=True)
    (ours / "cgroup.controllers").write_text("cpu pids\n")
    with pytest.raises(CgroupError, match="memory is not delegated"):
        create_memory_cgroup("w", 64 << 20, self_cgroup=V2_CGROUP, mountinfo=v2_info(tmp_path))
    assert list(ours.iterdir()) == [ours / "cgroup.controllers"]


def test_oom_kill_counter_v1_v2_and_the_old_kernels_failcnt(tmp_path: Path) -> None:
    v1 = MemoryCgroup(1, tmp_path / "v1", 1 << 20, "capped")
    v1.directory.mkdir()
    assert v1.oom_kills() is None
    (v1.directory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert v1.oom_kills() == 2
    (v1.directory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\n")
    (v1.directory / "memory.failcnt").write_text("7\n")
    assert v1.oom_kills() == 7
    v2 = MemoryCgroup(2, tmp_path / "v2", 1 << 20, "capped")
    v2.directory.mkdir()
    (v2.directory / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 1\noom_kill 1\noom_group_kill 0\n")
    assert v2.oom_kills() == 1
    (v2.directory / "memory.current").write_text("12345\n")
    assert v2.current() == 12345


def test_sizes() -> None:
    assert [parse_size(t) for t in ("256M", "256m", "256MiB", "4G", "1024", "8k", "1T")] == [
        256 << 20, 256 << 20, 256 << 20, 4 << 30, 1024, 8 << 10, 1 << 40,
    ]  # fmt: skip
    for bad in ("", "-1", "1.5G", "M", "256 X", "0x10"):
        with pytest.raises(ValueError):
            parse_size(bad)
    assert default_memory_limit(physical=24 << 30) == DEFAULT_CAP_BYTES
    assert default_memory_limit(physical=2 << 30) == 1 << 30
    assert [format_size(n) for n in (256 << 20, 4 << 30, 25856 << 10, 1_000_000_000)] == [
        "256 MiB", "4 GiB", "25856 KiB", "953.7 MiB",
    ]  # fmt: skip


def test_oom_score_adj_is_written_and_read_back(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "oom_score_adj").write_text("0\n")
    set_oom_score_adj(42, 1000, proc=tmp_path)
    assert (tmp_path / "42" / "oom_score_adj").read_text() == "1000"
    with pytest.raises(OSError):
        set_oom_score_adj(43, 1000, proc=tmp_path)
