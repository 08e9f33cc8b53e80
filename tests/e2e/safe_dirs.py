"""A directory control will hot-reload a policy from: outside ``/tmp`` (the agent's), owned by the operator.

``tmp_path`` lives under ``/tmp``, which the agent can write, so control loads a policy there once and never
watches it (``supervisor/control/policy/watch_safety.py``). Tests of hot reload keep their policy under
``/var/tmp`` instead (sticky, root's; the entry is ours) and remove it afterwards.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def safe_dir(prefix: str = "openshell-policy-", owner: int | None = None) -> Iterator[Path]:
    """A fresh 0755 directory under /var/tmp (chowned to ``owner`` when given), removed on exit."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    try:
        os.chmod(path, 0o755)
        if owner is not None:
            os.chown(path, owner, owner)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
