"""Name a dev sandbox's operator API explicitly, so a test's CLI call can only ever reach its own sandbox.

Dev mode puts control's socket at ``$XDG_RUNTIME_DIR/openshell-sandbox/dev-<random>/api.sock``. A client without
``--api`` or ``OPENSHELL_SANDBOX_API`` looks for "the running sandbox" by itself, and on a machine where another
sandbox runs it would ask that one. Tests run their dev sandboxes under an ``XDG_RUNTIME_DIR`` of their own; these
helpers find the one socket there and put it in the client's environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def dev_api(runtime: str | os.PathLike[str]) -> Path:
    """The API socket of the one dev sandbox under ``runtime`` (a test's own ``XDG_RUNTIME_DIR``). Before dev has
    made it, a path under ``runtime`` that does not exist: a client fails to connect, as it would to a sandbox
    not up yet, and never goes looking elsewhere."""
    found = sorted(Path(runtime, "openshell-sandbox").glob("*/api.sock"))
    assert len(found) <= 1, f"more than one sandbox under {runtime}: {found}"
    return found[0] if found else Path(runtime, "openshell-sandbox", "not-up-yet", "api.sock")


def api_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with ``OPENSHELL_SANDBOX_API`` naming the dev sandbox under env's own ``XDG_RUNTIME_DIR``."""
    runtime = env.get("XDG_RUNTIME_DIR")
    assert runtime, "a dev sandbox in a test runs under an XDG_RUNTIME_DIR of its own"
    return {**env, "OPENSHELL_SANDBOX_API": str(dev_api(runtime))}
