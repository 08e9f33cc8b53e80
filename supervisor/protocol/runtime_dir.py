"""Where a sandbox's operator socket lives: one choice for dev mode, control and every client (docs/design.md
"Finding the API").

Rules, first match wins:

1. ``$XDG_RUNTIME_DIR/openshell-sandbox`` when ``XDG_RUNTIME_DIR`` is an absolute path (a relative one is
   ignored, as the XDG base-directory spec says).
2. As root, ``/run/openshell-sandbox``.
3. Otherwise ``/run/openshell-sandbox`` when it is a directory we may write (the image's sticky 1777 one, an
   emptyDir in a pod).
4. Otherwise a private directory of the user's, ``/tmp/openshell-sandbox-<uid>`` (a login without logind — ``su
   -``, ssh, most containers — has no ``XDG_RUNTIME_DIR``, and ``/run`` is root's). :func:`ensure_runtime_base`
   makes it 0700 and checks it is a real directory owned by us, never a symlink: ``/tmp`` is shared, and whoever
   owned it could swap the sockets below it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

__all__ = ["RuntimeDirError", "ensure_runtime_base", "runtime_base"]

SYSTEM_BASE = Path("/run/openshell-sandbox")


class RuntimeDirError(Exception):
    """The runtime directory cannot be used; the message names the path at fault."""


def runtime_base(environ: Mapping[str, str] | None = None, euid: int | None = None) -> Path:
    """The directory holding one subdirectory per sandbox (not created; see :func:`ensure_runtime_base`)."""
    env = os.environ if environ is None else environ
    uid = os.geteuid() if euid is None else euid
    xdg = env.get("XDG_RUNTIME_DIR", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "openshell-sandbox"
    if uid == 0 or (SYSTEM_BASE.is_dir() and os.access(SYSTEM_BASE, os.W_OK | os.X_OK)):
        return SYSTEM_BASE
    return Path(f"/tmp/openshell-sandbox-{uid}")


def ensure_runtime_base(environ: Mapping[str, str] | None = None) -> Path:
    """Create the runtime directory where it is missing and check it (rule 4's is private); return it."""
    base = runtime_base(environ)
    private = base.parent == Path("/tmp")
    try:
        base.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            base.mkdir(mode=0o700 if private else 0o755)
        except FileExistsError:
            pass
        info = base.lstat()
    except OSError as exc:
        raise RuntimeDirError(f"runtime directory {base}: {exc.strerror or exc} (set XDG_RUNTIME_DIR to a "
                              "directory of yours)") from exc  # fmt: skip
    if not stat.S_ISDIR(info.st_mode):
        raise RuntimeDirError(f"runtime directory {base} is not a directory (a symlink or file is in its place)")
    if private:
        if info.st_uid != os.geteuid():
            raise RuntimeDirError(f"runtime directory {base} is owned by uid {info.st_uid}, not by us ({os.geteuid()})")
        os.chmod(base, 0o700)
    return base
