"""The policy's static sections reach every workload process as Landlock confinement (dev mode, real launch)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from supervisor.boundary.forkimage.landlock import abi_version

CLI = [sys.executable, "-m", "supervisor.cli"]

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="dev mode runs the boundary in model R here (root)"),
    pytest.mark.skipif(abi_version() < 2, reason="Landlock ABI >= 2 is needed for filesystem rules"),
]

POLICY = """\
version: 1
filesystem_policy:
  include_workdir: false
  read_only: [/usr, /bin, /lib, /lib64, /etc]
  read_write: [{writable}]
landlock:
  compatibility: best_effort
network_policies: {{}}
"""


def test_filesystem_policy_confines_agent_and_exec(tmp_path: Path) -> None:
    writable = Path(tempfile.mkdtemp(prefix="osb-rw-", dir="/tmp"))
    forbidden = Path(tempfile.mkdtemp(prefix="osb-ro-", dir="/tmp"))
    try:
        for d in (writable, forbidden):
            d.chmod(0o777)  # DAC would allow both: only Landlock can tell them apart
        policy = tmp_path / "policy.yaml"
        policy.write_text(POLICY.format(writable=writable))
        tmp_path.chmod(0o755)
        script = (
            f"echo a > {writable}/ok && echo wrote-allowed; "
            f"echo b > {forbidden}/leak && echo LEAK; "
            "cat /etc/hostname >/dev/null && echo read-etc; "
            "ls /root >/dev/null 2>&1 && echo LEAK-root || echo no-root"
        )
        result = subprocess.run([*CLI, "dev", f"--policy={policy}", "--", "sh", "-c", script],
                                capture_output=True, text=True, timeout=90)  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.split() == ["wrote-allowed", "read-etc", "no-root"]
        assert (writable / "ok").exists() and not (forbidden / "leak").exists()
    finally:
        subprocess.run(["rm", "-rf", str(writable), str(forbidden)], check=False)
