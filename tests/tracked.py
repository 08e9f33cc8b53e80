"""The files of the repository, as git tracks them: what tests that walk the tree walk.

A walk of the directories would also collect what happens to lie in the checkout — ``bench/.venv-peers`` after
``make bench`` (thousands of third-party modules), a scratch file — and the suite would change with the machine.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def tracked(*directories: str, suffix: str = ".py") -> list[Path]:
    """Tracked files under ``directories`` (relative to the repository) ending in ``suffix``, sorted."""
    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--", *directories],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    paths = (ROOT / name for name in out.decode().split("\0") if name.endswith(suffix))
    return sorted(p for p in paths if p.is_file())  # a tracked file deleted in the work tree is not there
