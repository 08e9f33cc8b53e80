"""Which interpreter the sandbox's daemons run on, and what it is.

The product ships on Debian's ``/usr/bin/python3`` (the debootstrap image's interpreter, and the base of the
Makefile's ``.venv``), so that is what the bench measures by default: ``.venv/bin/python`` when it exists,
else the interpreter running the harness. ``--daemon-python PATH`` measures another (a development build, a
newer release). The daemons' dependencies must import in it; the answer names the interpreter, its version,
where it really lives and its build (a development build without PGO/LTO ran the daemons 1.4x slower on a
micro-loop than Debian's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_VENV_PYTHON = REPO / ".venv" / "bin" / "python"
NEEDED = ("trio", "h11", "h2", "cryptography", "dns", "pyroute2", "yaml")

_PROBE = """
import importlib, json, platform, sys
missing = []
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as exc:
        missing.append(f"{name} ({type(exc).__name__})")
print(json.dumps({
    "implementation": platform.python_implementation(), "version": platform.python_version(),
    "executable": sys.executable, "base_prefix": sys.base_prefix,
    "build": " ".join(platform.python_build()), "compiler": platform.python_compiler(), "missing": missing,
}))
"""


class InterpreterError(Exception):
    """The interpreter cannot run the daemons (absent, broken, or without their dependencies)."""


def default_daemon_python() -> str:
    """The Makefile's venv (built from Debian's python3) where it exists, else the harness's interpreter."""
    return str(DEFAULT_VENV_PYTHON) if DEFAULT_VENV_PYTHON.exists() else sys.executable


def describe(python: str) -> dict[str, object]:
    """Facts about ``python`` (raises :class:`InterpreterError` naming what is wrong with it)."""
    if not os.access(python, os.X_OK):
        raise InterpreterError(f"--daemon-python {python}: not an executable file")
    try:
        done = subprocess.run([python, "-c", _PROBE, *NEEDED], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise InterpreterError(f"--daemon-python {python}: cannot run it ({exc})") from None
    if done.returncode != 0:
        raise InterpreterError(f"--daemon-python {python}: exited {done.returncode}: {done.stderr.strip()[-300:]}")
    facts: dict[str, object] = json.loads(done.stdout)
    if facts["missing"]:
        missing = ", ".join(map(str, facts["missing"]))  # type: ignore[call-overload]
        raise InterpreterError(f"--daemon-python {python}: cannot import the daemons' {missing}")
    facts.pop("missing")
    facts["path"] = python
    facts["real_path"] = os.path.realpath(python)
    return facts


def label(facts: dict[str, object]) -> str:
    """One line for the table: ``.venv/bin/python → /usr/bin/python3.11 (CPython 3.11.2, base /usr)``."""
    path, real = str(facts["path"]), str(facts["real_path"])
    with_repo = path[len(str(REPO)) + 1 :] if path.startswith(f"{REPO}/") else path
    where = with_repo if real == path else f"{with_repo} → {real}"
    return f"{where} ({facts['implementation']} {facts['version']}, base {facts['base_prefix']})"
