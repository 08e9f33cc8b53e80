"""The boundary's process side: the single-threaded launcher that puts every control in force before a
workload process runs its first instruction (docs/reference/boundary.md §2.2).

The names below load their module on first use (PEP 562): the workload's init runs in a fresh interpreter that
imports ``zygote`` and ``child`` only, and must not pull in the launcher and with it trio (its image is what
every exec forks, zygote.py "The init's image")."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from .child import SpawnSpec, Stage
    from .landlock import LandlockSpec
    from .launcher import Launcher, LauncherError, Prepared, Spawned, SpawnError, detect_privilege_model
    from .zygote import NamespacePlan

_EXPORTS: Final = {
    "SpawnSpec": "child",
    "Stage": "child",
    "LandlockSpec": "landlock",
    "Launcher": "launcher",
    "LauncherError": "launcher",
    "Prepared": "launcher",
    "Spawned": "launcher",
    "SpawnError": "launcher",
    "detect_privilege_model": "launcher",
    "NamespacePlan": "zygote",
}

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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
