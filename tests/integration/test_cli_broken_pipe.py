"""A client command whose reader goes away (``openshell-sandbox … | head``) ends quietly: exit 128+SIGPIPE and
no traceback on stderr."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

POLICY = """\
version: 1
network_policies:
  pypi:
    endpoints:
      - host: pypi.org
        port: 443
    binaries:
      - path: /usr/bin/curl
"""


def test_a_closed_stdout_is_not_a_traceback(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command writes a byte
    try:
        argv = ["policy", "decide", "--policy", str(policy), "--json", "--host", "pypi.org", "--port", "443"]
        done = subprocess.run(
            [sys.executable, "-m", "supervisor.cli", *argv, "--binary", "/usr/bin/curl"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 128 + signal.SIGPIPE, done.stderr
