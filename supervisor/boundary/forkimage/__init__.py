"""The fork image: the single-threaded code that runs between ``fork`` and ``exec`` — the zygote, the workload
PID namespace's init, the exec-inits and the workload's child with its stages (docs/reference/boundary.md §2.2,
docs/design.md "The fork image").

Its modules import no ``trio``, ``threading``, ``subprocess``, ``asyncio`` or ``concurrent``, and nothing of
``supervisor.boundary.process``, ``supervisor.boundary.capture``, ``supervisor.control`` or ``supervisor.link``
(tests/unit/test_fork_image_imports.py): the init runs in a fresh interpreter that imports ``zygote`` and what
it imports, and every exec forks that image.

The names below load their module on first use (PEP 562), so importing this package loads nothing else."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from .child import SpawnSpec, Stage
    from .landlock import LandlockSpec
    from .messages import NamespacePlan

_EXPORTS: Final = {
    "SpawnSpec": "child",
    "Stage": "child",
    "LandlockSpec": "landlock",
    "NamespacePlan": "messages",
}

__all__ = ["LandlockSpec", "NamespacePlan", "SpawnSpec", "Stage"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
