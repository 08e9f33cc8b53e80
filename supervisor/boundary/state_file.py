"""The boundary's lifecycle state, published to a local file for the workload pod's readiness probe
(docs/kubernetes.md "Readiness and liveness").

Control's ``readyz`` asks control's API, in another pod; the workload pod's own probe needs something local. The
boundary writes its state (``idle``, ``bound``, ``ready``, ``running``, ``ended``) to ``--state-file`` at every
transition, and ``openshell-sandbox boundary-ready FILE`` exits 0 only for ``ready`` or ``running``.

Rules:

1. Written whole or not at all: a temporary file beside it, then ``rename`` (a probe never reads half a state).
2. Only the boundary writes it: render puts it in the boundary's own ``boundary-state`` emptyDir, which the agent
   never sees in R and U (its root shows only the trust files' subdirectory, read-only) and cannot write in P
   (Landlock grants it the workdir, ``/tmp`` and ``/dev/shm``). What the agent can do to it is what it can do to
   the boundary's other files there.
3. A write that fails leaves the last state, or none: the probe then fails (never ready by mistake once ended,
   since ``ended`` is written first thing at the end, and a missing file is not ready).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Final

READY_STATES: Final = frozenset({"ready", "running"})


def publish(path: Path, state: str) -> bool:
    """Write ``state`` to ``path`` (rule 1); False if it could not be written."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, f"{state}\n".encode())
        finally:
            os.close(fd)
        os.replace(tmp, path)
        return True
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return False


def read(path: Path) -> str | None:
    """The state in ``path``, or None if there is none to read."""
    try:
        return path.read_text(encoding="ascii").strip() or None
    except (OSError, UnicodeDecodeError):
        return None
