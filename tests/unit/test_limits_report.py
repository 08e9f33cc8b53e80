"""Status's ``limits`` object (boundary/limits_report.py): the keys, their order and their omissions are what
status always carried — fixed sizes, then what attach added (pids, memory, OOM score), then the counters."""

from __future__ import annotations

import json

from supervisor.boundary.limits_report import UNENFORCED, LimitsReport

_WHY = "no filesystem"


def test_before_attach_pids_and_memory_are_null_and_nothing_else_is_said() -> None:
    assert json.dumps(LimitsReport(_WHY, "64m", "32m").to_wire()) == (
        '{"pids": null, "memory": null, "workdir_size": "unenforced", "workdir_size_reason": "no filesystem", '
        '"tmp_size": "64m", "shm_size": "32m"}'
    )


def test_enforced_limits_say_their_cgroups_and_counters_last() -> None:
    report = LimitsReport(
        _WHY, "64m", "32m", pids=512, pids_cgroup="cgroup v2 /p", memory=1024, memory_cgroup="cgroup v2 /m",
        memory_swap="capped", oom_score_adj=1000, oom_score_adj_floor=True, pids_current=3, memory_current=None,
        memory_oom_kills=0,
    )  # fmt: skip
    assert list(report.to_wire()) == [
        "pids", "memory", "workdir_size", "workdir_size_reason", "tmp_size", "shm_size", "pids_cgroup",
        "memory_cgroup", "memory_swap", "oom_score_adj", "oom_score_adj_floor", "pids_current", "memory_current",
        "memory_oom_kills",
    ]  # fmt: skip
    assert report.to_wire()["memory_current"] is None  # its cgroup exists: the counter is said, unreadable
    assert report.pids_limit() == 512


def test_unenforced_limits_say_why_after_the_fixed_sizes() -> None:
    report = LimitsReport(
        _WHY, UNENFORCED, UNENFORCED, tmp_size_reason="shared", shm_size_reason="shared", pids=UNENFORCED,
        pids_reason="no cgroup", memory=UNENFORCED, memory_reason="no cgroup", oom_score_adj=UNENFORCED,
        oom_score_adj_reason="model P",
    )  # fmt: skip
    assert list(report.to_wire()) == [
        "pids", "memory", "workdir_size", "workdir_size_reason", "tmp_size", "tmp_size_reason", "shm_size",
        "shm_size_reason", "pids_reason", "memory_reason", "oom_score_adj", "oom_score_adj_reason",
    ]  # fmt: skip
    assert report.pids_limit() is None
