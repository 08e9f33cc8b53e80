"""The workload's limits: its pids and memory cgroups, its OOM score, and the sizes the configuration fixes.

Each limit is reported enforced or not, with the reason (status's ``limits``, the ``limits.*`` events). The
cgroups are made at attach, before the launcher forks anything, and removed after the launcher when the daemon
ends (process/cgroups.py, process/memory_cgroup.py).
"""

from __future__ import annotations

import os
from dataclasses import replace

from supervisor.boundary.config import BoundaryConfig
from supervisor.boundary.limits_report import UNENFORCED, LimitsReport
from supervisor.boundary.process import Launcher
from supervisor.boundary.process.cgroups import CgroupError, PidsCgroup, create_pids_cgroup, workload_cgroup_name
from supervisor.boundary.process.memory_cgroup import (
    LAUNCHER_OOM_SCORE_ADJ,
    WORKLOAD_OOM_SCORE_ADJ,
    MemoryCgroup,
    create_memory_cgroup,
    privileged_for_oom_score,
    set_oom_score_adj,
)
from supervisor.boundary.process.table import ProcessTable
from supervisor.jsonlog import JsonLog
from supervisor.protocol.event_names import EventName
from supervisor.protocol.privilege_model import PrivilegeModel


class WorkloadLimits:
    """Every limit of one workload and the cgroups that enforce them."""

    def __init__(self, cfg: BoundaryConfig, log: JsonLog) -> None:
        self.cfg = cfg
        self.log = log
        self.pids_cgroup: PidsCgroup | None = None
        self.memory_cgroup: MemoryCgroup | None = None
        self.limits = _fixed_limits(cfg)  # what attach decides is added to it

    def pids_limit(self) -> int | None:
        """The workload's ``pids.max`` where it is enforced (the exec log's bound on live processes), else None."""
        return self.limits.pids_limit()

    def limit_pids(self, launcher: Launcher, instance: str) -> None:
        """The launcher joins the workload's pids cgroup before it forks anything (cgroups.py rule 4); where no
        cgroup can be made the limit is reported unenforced (inside a pod: the cluster's podPidsLimit)."""
        limit = self.cfg.pids_limit
        try:
            if limit <= 0:
                raise CgroupError("disabled by --pids-limit=0")
            group = create_pids_cgroup(workload_cgroup_name(os.getpid(), instance), limit)
            try:
                group.add(launcher.pid)
            except OSError as exc:
                group.remove()
                raise CgroupError(f"cannot move the launcher into {group.directory}: {exc.strerror}") from None
        except CgroupError as exc:
            self.limits = replace(self.limits, pids=UNENFORCED, pids_reason=str(exc))
            self.log.emit(EventName.LIMITS_PIDS, enforced=False, limit=None, reason=str(exc))
            return
        self.pids_cgroup = group
        if group.stale_removed:  # a SIGKILLed boundary's leftovers (cgroups.py rule 5)
            self.log.emit(EventName.LIMITS_PIDS_CGROUP_STALE_REMOVED, cgroups=list(group.stale_removed))
        self.limits = replace(self.limits, pids=limit, pids_cgroup=group.describe())
        self.log.emit(EventName.LIMITS_PIDS, enforced=True, limit=limit, cgroup=group.describe())

    def limit_memory(self, launcher: Launcher, instance: str, table: ProcessTable) -> None:
        """The launcher joins the workload's memory cgroup before it forks anything, as the pids one
        (memory_cgroup.py rule 1); where none can be made the limit is reported unenforced (inside a pod: the
        container's limit). ``table`` reads the cgroup's OOM kills from then on."""
        limit = self.cfg.memory_limit
        try:
            if limit <= 0:
                raise CgroupError("disabled by --memory-limit=0")
            group = create_memory_cgroup(workload_cgroup_name(os.getpid(), instance), limit)
            if not group.shares_pids_child:
                try:
                    group.add(launcher.pid)
                except OSError as exc:
                    group.remove()
                    raise CgroupError(f"cannot move the launcher into {group.directory}: {exc.strerror}") from None
        except CgroupError as exc:
            self.limits = replace(self.limits, memory=UNENFORCED, memory_reason=str(exc))
            self.log.emit(EventName.LIMITS_MEMORY, enforced=False, limit=None, reason=str(exc))
            return
        self.memory_cgroup = group
        table.oom_kills = group.oom_kills
        self.limits = replace(self.limits, memory=group.limit, memory_cgroup=group.describe(), memory_swap=group.swap)
        self.log.emit(
            EventName.LIMITS_MEMORY, enforced=True, limit=group.limit, cgroup=group.describe(), swap=group.swap,
            stale_removed=list(group.stale_removed),
        )  # fmt: skip

    def oom_score(self, launcher: Launcher, pidns: bool) -> None:
        """The workload's init — and so every workload process, forked below it — at oom_score_adj 1000, so any
        OOM kill, the memory cgroup's or the host's, picks a workload process before the launcher (raising needs
        no capability). Where we hold CAP_SYS_RESOURCE the kernel also makes 1000 their floor, and the launcher
        goes to -1000: never picked (memory_cgroup.py rule 5). Without a workload init (model P) the launcher
        forks the workload itself and is left alone."""
        init_pid = launcher.init_pid
        why = None if pidns else "model P: the workload has no init of its own to set it on"
        if why is None and init_pid is None:
            why = "the launcher did not name the workload's init"
        if why is None:
            assert init_pid is not None
            try:
                set_oom_score_adj(init_pid, WORKLOAD_OOM_SCORE_ADJ)
            except OSError as exc:
                why = f"cannot set the workload's oom_score_adj: {exc.strerror or exc}"
        if why is not None:
            self.limits = replace(self.limits, oom_score_adj=UNENFORCED, oom_score_adj_reason=why)
            return
        no_floor = privileged_for_oom_score()
        if no_floor is None:
            try:
                set_oom_score_adj(launcher.pid, LAUNCHER_OOM_SCORE_ADJ)
            except OSError as exc:
                no_floor = f"cannot set the launcher's oom_score_adj: {exc.strerror or exc}"
        # R and U mount the agent's /proc read-only: it cannot write it there either
        self.limits = replace(
            self.limits, oom_score_adj=WORKLOAD_OOM_SCORE_ADJ, oom_score_adj_floor=no_floor is None,
            oom_score_adj_floor_reason=no_floor,
        )  # fmt: skip

    def now(self) -> LimitsReport:
        """Every limit, whether it is enforced (and why not), and the cgroups' counters now."""
        now = self.limits
        if self.pids_cgroup is not None:
            now = replace(now, pids_current=self.pids_cgroup.current())
        if self.memory_cgroup is not None:
            now = replace(
                now, memory_current=self.memory_cgroup.current(), memory_oom_kills=self.memory_cgroup.oom_kills()
            )
        return now

    def release(self, launcher: Launcher, wait_s: float) -> None:
        """At the daemon's end: the launcher is the cgroups' last member, so stop it, then remove them (a cgroup
        left behind is said)."""
        if self.pids_cgroup is not None or self.memory_cgroup is not None:
            launcher.close()
        if self.memory_cgroup is not None and not self.memory_cgroup.remove(wait_s=wait_s):
            self.log.emit(EventName.LIMITS_MEMORY_CGROUP_LEFT, cgroup=self.memory_cgroup.describe())
        if self.pids_cgroup is not None and not self.pids_cgroup.remove(wait_s=wait_s):
            self.log.emit(EventName.LIMITS_PIDS_CGROUP_LEFT, cgroup=self.pids_cgroup.describe())


_WORKDIR_UNCAPPED = (
    "the workdir is a host directory (dev mode) or the pod's volume, given to the agent as it is: it has no "
    "filesystem of its own whose size could be capped"
)


def _fixed_limits(cfg: BoundaryConfig) -> LimitsReport:
    """The limits the configuration alone decides: the workdir's size (never enforced) and the private /tmp and
    /dev/shm."""
    if cfg.privilege_model == PrivilegeModel.P:
        shared = "model P: the agent shares the pod's own, sized by the pod"
        return LimitsReport(_WORKDIR_UNCAPPED, UNENFORCED, UNENFORCED, tmp_size_reason=shared, shm_size_reason=shared)
    return LimitsReport(_WORKDIR_UNCAPPED, cfg.tmp_size, cfg.shm_size)  # tmpfs size= (rootfs.py)
