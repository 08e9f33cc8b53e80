"""Which paths may never be granted to the agent for writing (docs/reference/policy.md §1.2, docs/design.md
"Default filesystem"). Shared by control (policy validation), the boundary (``--workdir``) and dev mode.

Rules:

1. ``/`` is never writable: a ``read_write: [/]`` policy and a workdir of ``/`` are refused alike.
2. Nothing at or under ``/proc`` is writable: ``/proc/PID/mem`` of another workload process is a ptrace
   equivalent, and ``/proc/sys`` tunes the kernel.
3. The check is on the path as written, with repeated slashes and ``.`` components collapsed (``//proc/.``
   is ``/proc``); ``..`` is refused by the callers before this.
"""

from __future__ import annotations


def normalize(path: str) -> str:
    parts = [part for part in path.split("/") if part not in ("", ".")]
    return "/" + "/".join(parts)


def writable_problem(path: str) -> str | None:
    """Why ``path`` must not be writable by the agent, or None."""
    norm = normalize(path)
    if norm == "/":
        return "must not be the root directory"
    if norm == "/proc" or norm.startswith("/proc/"):
        return "must not be /proc or under it (a ptrace equivalent)"
    return None
