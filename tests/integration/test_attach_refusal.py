"""A refused attach ends the boundary (docs/reference/boundary.md §1.2): it replies, exits non-zero, and control
reports it.

Real daemons by hand: control asks for proxy-env with the external-fence acknowledgement, the boundary was
not configured with it. Before, the boundary answered ``denied`` and stayed idle for ever; now it exits 125
and control's ``/readyz`` names the refusal (and its events carry ``boundary.refused``).
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from supervisor.protocol.certs import make_ca
from supervisor.protocol.claims import Role
from tests.certs_fixtures import leaf_bundle

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the boundary daemon runs in model R (root) here")

CLI = [sys.executable, "-m", "supervisor.cli"]


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def test_refused_attach_ends_the_boundary_and_control_reports_it(tmp_path: Path) -> None:
    ca = make_ca(validity=datetime.timedelta(days=1), now=datetime.datetime.now(datetime.UTC))
    leaf_bundle(tmp_path / "boundary", ca, Role.BOUNDARY)
    leaf_bundle(tmp_path / "control", ca, Role.CONTROL)
    port_file, api = tmp_path / "port", tmp_path / "api.sock"
    boundary_log, control_log = tmp_path / "boundary.log", tmp_path / "control.log"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with boundary_log.open("w") as out:
            procs.append(subprocess.Popen(
                [*CLI, "--mode=boundary", f"--bootstrap={tmp_path / 'boundary'}", "--listen=127.0.0.1:0",
                 f"--port-file={port_file}", "--privilege-model=R", "--agent-stdio=pipe", "--workdir=/tmp",
                 "--", "sleep", "1000"],
                stdout=out, stderr=subprocess.STDOUT,
            ))  # fmt: skip
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert procs[0].poll() is None, boundary_log.read_text()
            assert time.monotonic() < deadline, "boundary did not start listening"
            time.sleep(0.02)
        with control_log.open("w") as out:
            procs.append(subprocess.Popen(
                [*CLI, "--mode=control", f"--bootstrap={tmp_path / 'control'}",
                 f"--boundary=127.0.0.1:{port_file.read_text()}", f"--api={api}",
                 "--capture-mode=proxy-env", "--acknowledge-external-fence"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            ))  # fmt: skip
        code = procs[0].wait(timeout=30)
        assert code == 125, boundary_log.read_text()
        refused = [e for e in _events(boundary_log) if e["event"] == "lifecycle.refused"]
        assert refused and refused[0]["error"]["kind"] == "denied", boundary_log.read_text()
        assert refused[0]["error"]["field"] == "capture_mode"
        assert not any(e["event"] == "lifecycle.bound" for e in _events(boundary_log)), "nothing was prepared"

        deadline = time.monotonic() + 20
        while not any(e["event"] == "boundary.refused" for e in _events(control_log)):
            assert procs[1].poll() is None, control_log.read_text()
            assert time.monotonic() < deadline, control_log.read_text()
            time.sleep(0.05)
        ready = subprocess.run([*CLI, "readyz", f"--api={api}"], capture_output=True, text=True, timeout=30)
        assert ready.returncode == 1, ready
        assert "refused attach" in ready.stdout + ready.stderr and "capture_mode" in ready.stdout + ready.stderr
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
