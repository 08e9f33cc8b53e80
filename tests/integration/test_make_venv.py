"""``scripts/venv.sh`` (what ``make`` runs): a Debian without python3-venv gets told what to install."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_python_without_venv_is_named_with_the_package_to_install(tmp_path: Path) -> None:
    fake = tmp_path / "python3"  # Debian's python3 without python3-venv: `import ensurepip` fails
    fake.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named ensurepip' >&2\nexit 1\n")
    fake.chmod(0o755)
    venv = tmp_path / "venv"
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "OPENSHELL_BASE_PYTHON": str(fake)}
    result = subprocess.run(["sh", str(REPO / "scripts" / "venv.sh"), str(venv), ""], env=env,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 1
    assert "apt-get install python3-venv" in result.stderr and str(fake) in result.stderr
    assert not venv.exists()


def test_the_makefile_runs_everything_in_its_venv() -> None:
    makefile = (REPO / "Makefile").read_text()
    recipes = {}
    current = None
    for line in makefile.splitlines():
        if line and not line.startswith(("\t", "#", " ")) and ":" in line and "=" not in line.split(":")[0]:
            current = line.split(":")[0]
            recipes[current] = []
        elif line.startswith("\t") and current is not None:
            recipes[current].append(line.strip())
    for target in ("demo", "test", "lint", "bench"):
        commands = [c for c in recipes[target] if not c.lstrip("@").startswith(("bash scripts/", "sh scripts/"))]
        assert commands and all("$(VENV)" in c or "$(PY)" in c for c in commands), (target, commands)
    assert ".venv" in (REPO / ".gitignore").read_text()
    assert os.access(REPO / "scripts" / "venv.sh", os.R_OK)
