"""``--workers N|auto``: how many control processes serve egress. ``auto`` is the CPUs control may run on (its
affinity), capped by its cgroup's CPU limit (``cpu.max``, rounded up), so a pod gets as many as its limit pays for."""

from __future__ import annotations

import math
import os
from pathlib import Path

MAX_WORKERS = 64
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def cgroup_cpu_limit(path: Path = CGROUP_CPU_MAX) -> int | None:
    """The cgroup v2 CPU limit in whole CPUs (rounded up), or ``None`` when there is none or it cannot be read."""
    try:
        quota, period = path.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        return max(1, math.ceil(int(quota) / int(period)))
    except (ValueError, ZeroDivisionError):
        return None


def auto_workers(*, cpus: int | None = None, limit: int | None = None) -> int:
    """``auto``: the CPUs available, capped by the cgroup limit and :data:`MAX_WORKERS`."""
    available = cpus if cpus is not None else len(os.sched_getaffinity(0))
    capped = min(available, limit) if limit is not None else available
    return max(1, min(capped, MAX_WORKERS))


def parse_workers(text: str) -> int:
    """``N`` (1..MAX_WORKERS) or ``auto``; ``ValueError`` naming what is wrong."""
    if text == "auto":
        return auto_workers(limit=cgroup_cpu_limit())
    try:
        count = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is neither a number nor 'auto'") from None
    if not 1 <= count <= MAX_WORKERS:
        raise ValueError(f"{count} is not 1..{MAX_WORKERS}")
    return count
