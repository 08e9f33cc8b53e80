"""A Kubernetes ConfigMap volume is safe to hot-reload, and its atomic ``..data`` swap is a revision.

The test builds the tree kubelet writes — a root-owned 0777 directory, a timestamped data directory, ``..data``
a symlink to it and ``policy.yaml`` a symlink through ``..data`` — and mounts it read-only (a bind mount
remounted ``ro`` in a private mount namespace made with ``unshare -m``, so nothing leaks to the host). Inside
that namespace a script checks the mount with ``watch_safety.check_watch`` on the real filesystem, runs control's
file watcher with its guard, and waits; the test then swaps ``..data`` to a new directory the way kubelet does
(a new symlink renamed over the old one) and the watcher must report generation 1. The same tree without the
read-only mount is refused: its directory is writable by everyone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.control.policy.watch_safety import check_watch

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for a mount namespace and root-owned files")

POLICY = "version: 1\nnetwork_policies: {}\n"
REVISION = """\
version: 1
network_policies:
  revised:
    endpoints: [{host: a.example.com, port: 443}]
    binaries: [{path: /usr/bin/curl}]
"""

SCRIPT = r"""
import json, subprocess, sys, time
import trio
from supervisor.control.policy import PolicyStore, compile_policy, load_policy_file
from supervisor.control.policy.store import PolicyFileWatcher
from supervisor.control.policy.watch_safety import check_watch

source, mount = sys.argv[1], sys.argv[2]
subprocess.run(["mount", "--bind", source, mount], check=True)
subprocess.run(["mount", "-o", "remount,bind,ro", mount], check=True)
path = mount + "/policy.yaml"
verdict = check_watch(path, agent_writable=("/tmp", "/dev/shm"), trusted_uids=(0,))
out = {"safe": verdict.safe, "reason": verdict.reason, "resolved": verdict.resolved}

def guard():
    v = check_watch(path, agent_writable=("/tmp", "/dev/shm"), trusted_uids=(0,))
    return None if v.safe else v.reason

async def main():
    store = PolicyStore(compile_policy(load_policy_file(path)), source=path)
    watcher = PolicyFileWatcher(path, store, guard=guard)
    await watcher.poll()
    out["before"] = store.generation
    print(json.dumps({"ready": True}), flush=True)
    await trio.to_thread.run_sync(sys.stdin.readline)
    with trio.move_on_after(20):
        while store.generation == 0 and watcher.unsafe is None:
            await watcher.poll()
            await trio.sleep(0.05)
    out["after"] = store.generation
    out["unsafe"] = watcher.unsafe

trio.run(main)
print(json.dumps(out), flush=True)
"""


def _configmap(root: Path, stamp: str, text: str) -> None:
    data = root / stamp
    data.mkdir(mode=0o755)
    (data / "policy.yaml").write_text(text)
    link = root / "..data_tmp"
    link.symlink_to(stamp)
    link.rename(root / "..data")  # atomic, as kubelet's AtomicWriter does
    if not (root / "policy.yaml").is_symlink():
        (root / "policy.yaml").symlink_to("..data/policy.yaml")


def test_configmap_mount_is_watched_and_its_data_swap_is_a_revision(tmp_path: Path) -> None:
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        pytest.skip("unshare and mount (util-linux) are needed")
    base = Path("/var/tmp") / f"configmap-{os.getpid()}"  # outside /tmp: the agent's
    source, mount = base / "volume", base / "mnt"
    try:
        base.mkdir(mode=0o755)
        source.mkdir()
        mount.mkdir()
        os.chmod(source, 0o777)  # kubelet's volume directory
        _configmap(source, "..2026_12_01_14_00_00.000000001", POLICY)

        writable = check_watch(str(source / "policy.yaml"), agent_writable=("/tmp",), trusted_uids=(0,))
        assert not writable.safe and "writable by others" in writable.reason

        proc = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", sys.executable, "-c", SCRIPT, str(source), str(mount)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert proc.stdout is not None and proc.stdin is not None
            ready = proc.stdout.readline()
            assert ready and json.loads(ready)["ready"], proc.stderr.read() if proc.stderr else ""
            _configmap(source, "..2026_12_01_14_05_00.000000002", REVISION)
            proc.stdin.write("swapped\n")
            proc.stdin.flush()
            out = json.loads(proc.stdout.readline())
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        assert out["safe"], out["reason"]
        assert out["resolved"].endswith("14_00_00.000000001/policy.yaml")
        assert out["before"] == 0 and out["after"] == 1 and out["unsafe"] is None, out
        assert not Path("/proc/self/mountinfo").read_text().count(str(mount)), "the bind mount leaked"
    finally:
        shutil.rmtree(base, ignore_errors=True)
