"""``--workers N|auto``: how many control processes serve egress. ``auto`` is the CPUs control may run on (its
affinity), capped by its cgroup's CPU limit (``cpu.max``, rounded up), so a pod gets as many as its limit pays
for, and by its memory limit (``memory.max``, :data:`MEMORY_PER_WORKER` each), so the processes fit in it."""

from __future__ import annotations

import math
import os
from pathlib import Path

MAX_WORKERS = 64
MEMORY_PER_WORKER = 64 * 1024 * 1024  # one process's resident size at start (~65 MB RSS, much of it shared)
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
CGROUP_MEMORY_MAX = Path("/sys/fs/cgroup/memory.max")


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


def cgroup_memory_limit(path: Path = CGROUP_MEMORY_MAX) -> int | None:
    """The cgroup v2 memory limit in bytes, or ``None`` when there is none or it cannot be read."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text == "max" or not text.isdigit() else int(text)


def auto_workers(*, cpus: int | None = None, limit: int | None = None, memory: int | None = None) -> int:
    """``auto``: the CPUs available, capped by the cgroup's CPU and memory limits and :data:`MAX_WORKERS`."""
    count = cpus if cpus is not None else len(os.sched_getaffinity(0))
    if limit is not None:
        count = min(count, limit)
    if memory is not None:
        count = min(count, memory // MEMORY_PER_WORKER)
    return max(1, min(count, MAX_WORKERS))


def parse_workers(text: str) -> int:
    """``N`` (1..MAX_WORKERS) or ``auto``; ``ValueError`` naming what is wrong."""
    if text == "auto":
        return auto_workers(limit=cgroup_cpu_limit(), memory=cgroup_memory_limit())
    try:
        count = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is neither a number nor 'auto'") from None
    if not 1 <= count <= MAX_WORKERS:
        raise ValueError(f"{count} is not 1..{MAX_WORKERS}")
    return count
