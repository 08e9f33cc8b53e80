"""A copy of the package and its dependencies that any uid can import with Debian's ``/usr/bin/python3``.

The test interpreter is pyenv under /root (mode 0700), unreadable to other uids (docs/design.md "Tests under another
uid"); both are CPython 3.11, so the installed wheels (compiled ones included) work from a 0755 copy.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import supervisor

SYSTEM_PYTHON = "/usr/bin/python3"
RUNTIME_MODULES = (
    "trio", "outcome", "sniffio", "sortedcontainers", "idna", "attr", "attrs", "h11", "h2", "hpack", "hyperframe",
    "cryptography", "cffi", "_cffi_backend", "dns", "pyroute2", "yaml", "graphql", "prometheus_client",
)  # fmt: skip


def portable_tree(prefix: str, modules: tuple[str, ...] = RUNTIME_MODULES) -> Path:
    """Copy ``supervisor`` and ``modules`` into a fresh 0755 directory; returns it (caller removes it)."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(Path(supervisor.__file__).parent, root / "supervisor", ignore=ignore)
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        origin = Path(module.__file__ or "")
        if origin.name == "__init__.py":
            shutil.copytree(origin.parent, root / name, ignore=ignore)
        else:
            shutil.copy2(origin, root / origin.name)
    subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
    root.chmod(0o755)
    return root
