"""Control needs no privilege: run as an unprivileged uid, every capability dropped, the root filesystem
read-only and only one directory writable (a control Deployment's securityContext), it still attaches."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor.protocol.certs import make_ca
from supervisor.protocol.claims import Role
from tests.certs_fixtures import leaf_bundle
from tests.portable import SYSTEM_PYTHON, portable_tree

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start the boundary and drop to uid 65534")


def test_control_attaches_unprivileged_with_read_only_root(tmp_path: Path) -> None:
    for tool in ("setpriv", "unshare", "mount"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} (util-linux) is needed")
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is needed for a process of another uid")
    root = portable_tree("osctl-")
    try:
        ca = make_ca(validity=datetime.timedelta(days=1), now=datetime.datetime.now(datetime.UTC))
        leaf_bundle(tmp_path / "boundary", ca, Role.BOUNDARY)
        control_dir = root / "control-bundle"
        leaf_bundle(control_dir, ca, Role.CONTROL)
        os.chmod(control_dir, 0o700)
        for item in (control_dir, *control_dir.iterdir()):
            os.chown(item, NOBODY, NOBODY)
        writable = root / "writable"
        writable.mkdir(mode=0o755)
        os.chown(writable, NOBODY, NOBODY)

        port_file = tmp_path / "port"
        boundary_log = (tmp_path / "boundary.log").open("w")
        boundary = subprocess.Popen(
            [sys.executable, "-m", "supervisor.cli", "--mode=boundary", f"--bootstrap={tmp_path / 'boundary'}",
             "--listen=127.0.0.1:0", f"--port-file={port_file}", "--privilege-model=R", "--agent-stdio=pipe",
             "--workdir=/tmp", "--", "sleep", "1000"],
            stdout=boundary_log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        control = None
        try:
            deadline = time.monotonic() + 30
            while not port_file.exists():
                assert time.monotonic() < deadline and boundary.poll() is None, "boundary did not start"
                time.sleep(0.02)
            port = int(port_file.read_text())
            # A mount namespace where / is read-only and only `writable` (a tmpfs) can be written.
            script = (
                f"mount -t tmpfs -o mode=0755,uid={NOBODY},gid={NOBODY} tmpfs {writable} && "
                "mount --bind / / && mount -o remount,bind,ro / && "
                f"exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups --inh-caps=-all "
                f"--bounding-set=-all --no-new-privs {SYSTEM_PYTHON} -m supervisor.cli --mode=control "
                f"--bootstrap={control_dir} --boundary=127.0.0.1:{port} --api={writable}/api.sock"
            )
            control = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, cwd="/",
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            deadline = time.monotonic() + 60
            running = False
            while time.monotonic() < deadline and not running:
                log = (tmp_path / "boundary.log").read_text()
                running = '"event":"lifecycle.running"' in log
                assert control.poll() is None, control.communicate()[1][-2000:]
                time.sleep(0.1)
            assert running, "control never drove the boundary to Running"
            control.terminate()
            out, err = control.communicate(timeout=20)
            events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            names = [e["event"] for e in events]
            assert "lifecycle.running" in names, err[-2000:]
            alpns = {e["alpn"] for e in events if e["event"] == "link.up"}
            assert alpns == {"openshell-ops/1", "openshell-egress/1"}
        finally:
            if control is not None and control.poll() is None:
                control.kill()
                control.wait()
            boundary.terminate()
            boundary.wait(timeout=15)
    finally:
        shutil.rmtree(root, ignore_errors=True)
