"""The boundary's process side, run under trio: the launcher's handle on the zygote, the process table, exec
sessions, termination, the workload's environment and cgroups (docs/reference/boundary.md §2.2).

What runs between ``fork`` and ``exec`` (the zygote, the init, the workload's child) is the fork image,
``supervisor.boundary.forkimage``: this package imports it, never the other way round
(docs/design.md "The fork image").

The names below load their module on first use (PEP 562), so importing one of this package's small modules
does not pull in the launcher."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from .launcher import Launcher, LauncherError, Prepared, Spawned, SpawnError, detect_privilege_model

_EXPORTS: Final = {
    "Launcher": "launcher",
    "LauncherError": "launcher",
    "Prepared": "launcher",
    "Spawned": "launcher",
    "SpawnError": "launcher",
    "detect_privilege_model": "launcher",
}

__all__ = [
    "Launcher",
    "LauncherError",
    "Prepared",
    "SpawnError",
    "Spawned",
    "detect_privilege_model",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
