"""The Landlock confinement of every workload process, from the policy's static sections (docs/spec/policy.md §1.2).

Every launch gets a Landlock domain, even when the policy says nothing about the filesystem: the domain's
scoping (ABI ≥ 6) is what stops a workload of the boundary's own uid (models U and P) from signalling the
boundary or its launcher. With a ``filesystem_policy`` the workload may read ``read_only`` and write
``read_write`` (plus the working directory with ``include_workdir``) and nothing else; a small baseline is
always added so that processes work at all and can read the CA files the boundary gives them. A policy that
names no path at all (the embedded default has empty sections) limits nothing on the filesystem.
"""

from __future__ import annotations

from typing import Any, Literal

from supervisor.boundary.process import LandlockSpec

BASELINE_READ_ONLY = ("/proc", "/run/openshell-boundary")
BASELINE_READ_WRITE = ("/dev",)


def landlock_for(static_policy: dict[str, Any], workdir: str) -> LandlockSpec:
    compatibility = (static_policy.get("landlock") or {}).get("compatibility", "best_effort")
    mode: Literal["best_effort", "hard_requirement"] = (
        "hard_requirement" if compatibility == "hard_requirement" else "best_effort"
    )
    fs = static_policy.get("filesystem_policy") or {}
    if not fs.get("read_only") and not fs.get("read_write"):
        return LandlockSpec(read_only=(), read_write=("/",), mode=mode)  # scoping only, no filesystem limits
    read_write = [*fs.get("read_write", ()), *BASELINE_READ_WRITE]
    if fs.get("include_workdir"):
        read_write.append(workdir)
    read_only = [*fs.get("read_only", ()), *BASELINE_READ_ONLY]
    return LandlockSpec(read_only=tuple(dict.fromkeys(read_only)), read_write=tuple(dict.fromkeys(read_write)),
                        mode=mode)  # fmt: skip
