"""Policy hot reload through a running dev sandbox: file revisions, quarantine, `policy apply`, readiness.

One long-running agent keeps asking for the same URL through the proxy and prints each HTTP status; the test
changes the policy underneath it and watches the answers change — without restarting anything.
"""

from __future__ import annotations

import os
import queue
import subprocess
import threading
import time
from pathlib import Path

from tests.e2e.egress_world import CLI, PORT, World, world
from tests.e2e.safe_dirs import safe_dir
from tests.sandbox_api import api_env

__all__ = ["world"]

DENY_ALL = "version: 1\nnetwork_policies: {}\n"


def _cli(world: World, *args: str) -> subprocess.CompletedProcess[str]:
    env = api_env({**os.environ, "XDG_RUNTIME_DIR": world.runtime})  # the world's one sandbox, by name
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=30, env=env)


def _wait_for(lines: queue.Queue[str], wanted: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            continue
        seen.append(line)
        if line == wanted:
            return
    raise AssertionError(f"agent never answered {wanted}; last answers {seen[-10:]}")


def _replace(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.rename(path)


def test_revisions_quarantine_and_apply(world: World, tmp_path: Path) -> None:
    with safe_dir() as directory:  # under /tmp the file would be loaded once, never watched
        _revisions_quarantine_and_apply(world, tmp_path, directory / "policy.yaml")


def _revisions_quarantine_and_apply(world: World, tmp_path: Path, policy: Path) -> None:
    policy.write_text(DENY_ALL)
    loop = f"while :; do curl -s -o /dev/null -w '%{{http_code}}\\n' http://api.test:{PORT}/hello.txt; sleep 0.2; done"
    env = {**os.environ, "XDG_RUNTIME_DIR": world.runtime}
    dev = subprocess.Popen(
        [*CLI, "dev", f"--policy={policy}", f"--dns-server={world.dns.address[0]}:{world.dns.address[1]}",
         "--", "sh", "-c", loop],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line.strip()) for line in dev.stdout or []], daemon=True).start()
    try:
        _wait_for(lines, "403", 30)  # generation 0: deny all
        assert '"generation": 0' in _cli(world, "policy", "get").stdout

        _replace(policy, world.policy.read_text())  # a valid revision on disk → generation 1
        _wait_for(lines, "200", 15)
        assert '"generation": 1' in _cli(world, "policy", "get").stdout
        assert _cli(world, "readyz").returncode == 0

        _replace(policy, "version: 1\nnetwork_policies: [this is not a mapping\n")  # invalid on disk
        _wait_for(lines, "403", 15)  # fail-closed quarantine: no new egress
        ready = _cli(world, "readyz")
        assert ready.returncode == 1 and "policy" in ready.stderr

        bad = tmp_path / "bad.yaml"
        bad.write_text("version: 1\nnetwork_policies:\n  x:\n    endpoints: [{host: a.test, port: 99999}]\n")
        refused = _cli(world, "policy", "apply", str(bad))
        assert refused.returncode == 1 and "nothing changed" in refused.stderr
        assert "ports" in refused.stderr or "port" in refused.stderr

        applied = _cli(world, "policy", "apply", str(world.policy))  # a valid revision through the API
        assert applied.returncode == 0, applied.stderr
        _wait_for(lines, "200", 15)
        assert _cli(world, "readyz").returncode == 0
        status = _cli(world, "status", "--json")
        assert '"status": "loaded"' in status.stdout
    finally:
        dev.terminate()
        dev.wait(timeout=30)
