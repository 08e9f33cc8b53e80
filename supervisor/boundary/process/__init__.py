"""The boundary's process side: the single-threaded launcher that puts every control in force before a
workload process runs its first instruction (docs/reference/boundary.md §2.2)."""

from .child import SpawnSpec, Stage
from .landlock import LandlockSpec
from .launcher import (
    Launcher,
    LauncherError,
    Prepared,
    Spawned,
    SpawnError,
    detect_privilege_model,
)
from .zygote import NamespacePlan

__all__ = [
    "LandlockSpec",
    "Launcher",
    "LauncherError",
    "NamespacePlan",
    "Prepared",
    "SpawnError",
    "SpawnSpec",
    "Spawned",
    "Stage",
    "detect_privilege_model",
]
