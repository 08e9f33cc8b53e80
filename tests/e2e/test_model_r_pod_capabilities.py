"""Model R runs with exactly the workload pod's capabilities (docs/kubernetes.md "Model R").

The rendered pod drops ALL and adds nine capabilities; the first real pod (tests/k8s) showed the
agent's root failing with ``chown /run/user/1000: Operation not permitted`` because building it needed
CAP_CHOWN. Here the whole sandbox runs with the bounding set cut to those nine (what the container runtime
gives a root process in that pod), and the agent still starts as its own uid with its private runtime
directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from supervisor.k8s.objects import MODEL_R_CAPABILITIES

CLI = [sys.executable, "-m", "supervisor.cli"]
AGENT = 1000


@pytest.mark.skipif(os.geteuid() != 0, reason="model R needs root")
def test_the_agent_starts_with_only_the_model_r_pod_capabilities() -> None:
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to cut the bounding set")
    assert "CHOWN" not in MODEL_R_CAPABILITIES and "SYS_CHROOT" not in MODEL_R_CAPABILITIES
    bounding = ",".join(["-all", *(f"+{cap.lower()}" for cap in MODEL_R_CAPABILITIES)])
    workdir = Path(tempfile.mkdtemp(prefix="osb-rcaps-", dir="/tmp"))
    try:
        workdir.chmod(0o777)
        result = subprocess.run(
            ["setpriv", f"--bounding-set={bounding}", *CLI, "dev", "--privilege-model=R", f"--workdir={workdir}",
             f"--agent-user={AGENT}:{AGENT}", "--", "/bin/sh", "-c",
             'id -u; stat -c "%u %a" "/run/user/$(id -u)"; touch "/run/user/$(id -u)/x" && echo writable'],
            capture_output=True, text=True, timeout=120, cwd="/",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        lines = result.stdout.split("\n")
        assert lines[0] == str(AGENT), result.stdout
        assert lines[1] == f"{AGENT} 700" and lines[2] == "writable", result.stdout
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
