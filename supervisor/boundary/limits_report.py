"""The workload's limits as status reports them (``limits``) and the scrape reads them (metrics.py).

Rules:

1. A limit is its value where it holds, ``"unenforced"`` with a ``*_reason`` where it does not, and ``None``
   before attach decided it (pids, memory) — limits.py decides which.
2. ``to_wire`` writes the object status always carried: the fixed sizes first, then what attach added in its
   order (pids, memory, the OOM score), then the cgroups' counters. A field that was never set is left out,
   except ``pids`` and ``memory``, which are ``null`` until attach; a counter is written (``null`` when it
   cannot be read) exactly when its cgroup exists.
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.protocol.json_value import JsonValue

__all__ = ["UNENFORCED", "LimitsReport"]

UNENFORCED = "unenforced"


@dataclass(frozen=True, slots=True)
class LimitsReport:
    workdir_size_reason: str
    tmp_size: str
    shm_size: str
    tmp_size_reason: str | None = None
    shm_size_reason: str | None = None
    pids: int | str | None = None
    pids_reason: str | None = None
    pids_cgroup: str | None = None
    memory: int | str | None = None
    memory_reason: str | None = None
    memory_cgroup: str | None = None
    memory_swap: str | None = None
    oom_score_adj: int | str | None = None
    oom_score_adj_reason: str | None = None
    oom_score_adj_floor: bool | None = None
    oom_score_adj_floor_reason: str | None = None
    pids_current: int | None = None  # the counters: read when status asks (WorkloadLimits.now)
    memory_current: int | None = None
    memory_oom_kills: int | None = None

    def pids_limit(self) -> int | None:
        """``pids.max`` where it is enforced, else ``None``."""
        return self.pids if isinstance(self.pids, int) and not isinstance(self.pids, bool) else None

    def to_wire(self) -> dict[str, JsonValue]:
        out: dict[str, JsonValue] = {
            "pids": self.pids,
            "memory": self.memory,
            "workdir_size": UNENFORCED,
            "workdir_size_reason": self.workdir_size_reason,
            "tmp_size": self.tmp_size,
        }
        _put(out, "tmp_size_reason", self.tmp_size_reason)
        out["shm_size"] = self.shm_size
        _put(out, "shm_size_reason", self.shm_size_reason)
        _put(out, "pids_reason", self.pids_reason)
        _put(out, "pids_cgroup", self.pids_cgroup)
        _put(out, "memory_reason", self.memory_reason)
        _put(out, "memory_cgroup", self.memory_cgroup)
        _put(out, "memory_swap", self.memory_swap)
        _put(out, "oom_score_adj", self.oom_score_adj)
        _put(out, "oom_score_adj_reason", self.oom_score_adj_reason)
        _put(out, "oom_score_adj_floor", self.oom_score_adj_floor)
        _put(out, "oom_score_adj_floor_reason", self.oom_score_adj_floor_reason)
        if self.pids_cgroup is not None:
            out["pids_current"] = self.pids_current
        if self.memory_cgroup is not None:
            out["memory_current"] = self.memory_current
            out["memory_oom_kills"] = self.memory_oom_kills
        return out


def _put(out: dict[str, JsonValue], name: str, value: JsonValue) -> None:
    if value is not None:
        out[name] = value
