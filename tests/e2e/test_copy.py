"""``openshell-sandbox cp`` through the real CLI against a running dev sandbox (model R, root): files in and out,
and the agent's attempts to turn a copy into a way out of the fence — links, FIFOs, hard links and set-id files in
what it hands over, a sparse terabyte, its own ``tar`` stopped mid-stream, names that would be shell text, a copy
in aimed where its Landlock rules forbid. Each asserts the attempt failed and that nothing changed on the host.
(The archive's own tricks, which need the agent to write the stream itself, are tests/unit/test_copy_archive.py.)
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.sandbox_api import api_env

CLI = [sys.executable, "-m", "supervisor.cli"]
# The agent prepares what it will hand over, then stops its own copies of tar whenever ./stall exists.
AGENT = """
set -e
mkdir -p tree/sub
echo one > tree/a
printf two > tree/sub/b
ln -s /etc/passwd tree/link
mkfifo tree/fifo
ln tree/a tree/hard
echo s > tree/suid && chmod 4755 tree/suid
truncate -s 1T big
printf 'named\\n' > '-x; $(touch pwned) n'
touch prepared
set +e
while :; do [ -e stall ] && pkill -STOP -x tar; sleep 0.05; done
"""


@dataclass
class Sandbox:
    env: dict[str, str]
    host: Path  # a host directory of the test's, never visible to the agent

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=self.env,
                              cwd=self.host)  # fmt: skip

    def agent(self, script: str) -> subprocess.CompletedProcess[str]:
        return self.cli("exec", "--", "sh", "-c", script)


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    if os.geteuid() != 0:
        pytest.skip("dev mode runs the boundary in model R here (root)")
    for tool in ("tar", "pkill", "truncate"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is needed in the agent's root")
    runtime = tempfile.mkdtemp(prefix="osr-", dir="/tmp")
    host = Path(tempfile.mkdtemp(prefix="osb-cp-host-"))
    env = {**os.environ, "XDG_RUNTIME_DIR": runtime}
    dev = subprocess.Popen([*CLI, "dev", "-q", "--", "sh", "-c", AGENT], env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    box = Sandbox(api_env(env), host)
    try:
        deadline = time.monotonic() + 90
        while box.cli("exec", "--", "test", "-e", "prepared").returncode != 0:
            box.env = api_env(env)  # the socket's directory exists once dev made it
            assert dev.poll() is None, dev.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the sandbox never became ready"
            time.sleep(0.2)
        yield box
    finally:
        dev.terminate()
        dev.wait(timeout=30)
        shutil.rmtree(runtime, ignore_errors=True)
        shutil.rmtree(host, ignore_errors=True)


def _leftovers(root: Path) -> list[str]:
    return [str(p) for p in root.rglob(".osb-cp-*")]


def test_copy_out_brings_files_and_directories_and_refuses_the_rest(sandbox: Sandbox) -> None:
    result = sandbox.cli("cp", ":tree", "out")
    assert result.returncode == 1, result.stderr
    for refused in ("a FIFO", "a symbolic link", "a hard link"):
        assert refused in result.stderr
    out = sandbox.host / "out"
    names = {str(p.relative_to(out)) for p in out.rglob("*")}
    # tar stores the first name of a linked file as the file, the second as a hard link: one of them arrives
    assert names in ({"sub", "sub/b", "suid", "a"}, {"sub", "sub/b", "suid", "hard"}), names
    assert (out / "sub" / "b").read_text() == "two"
    for path in [out, *out.rglob("*")]:
        info = os.lstat(path)
        assert stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)
        assert info.st_mode & (stat.S_ISUID | stat.S_ISGID) == 0
        assert (info.st_uid, info.st_gid) == (os.geteuid(), os.getegid())


def test_copy_in_and_back_out(sandbox: Sandbox) -> None:
    src = sandbox.host / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f").write_text("from the host\n")
    (src / "run").write_text("#!/bin/sh\n")
    os.chmod(src / "run", 0o4755)
    secret = sandbox.host / "host-secret"
    secret.write_text("never in the sandbox\n")
    (src / "secret-link").symlink_to(secret)
    os.mkfifo(src / "fifo")
    result = sandbox.cli("cp", "src", ":inbox")
    assert result.returncode == 1 and "a symbolic link" in result.stderr and "a FIFO" in result.stderr
    inside = sandbox.agent("cat inbox/d/f; ls -A inbox | sort | tr '\\n' ' '; echo; stat -c '%a %U' inbox/run")
    assert inside.stdout.splitlines() == ["from the host", "d run ", "755 sandbox"], inside.stderr
    back = sandbox.cli("cp", ":inbox/d/f", "back.txt")
    assert back.returncode == 0, back.stderr
    assert (sandbox.host / "back.txt").read_text() == "from the host\n"


def test_copy_in_runs_under_the_agents_landlock(sandbox: Sandbox) -> None:
    (sandbox.host / "payload").write_text("planted\n")
    result = sandbox.cli("cp", "payload", ":/etc/osb-cp-planted")
    assert result.returncode == 1 and "the workload's tar failed" in result.stderr
    assert not Path("/etc/osb-cp-planted").exists()


def test_names_are_never_shell_text(sandbox: Sandbox) -> None:
    result = sandbox.cli("cp", ":-x; $(touch pwned) n", "named.txt")
    assert result.returncode == 0, result.stderr
    assert (sandbox.host / "named.txt").read_text() == "named\n"
    assert sandbox.agent("test -e pwned").returncode == 1


def test_a_sparse_terabyte_stops_at_the_byte_bound(sandbox: Sandbox) -> None:
    result = sandbox.cli("cp", "--max-bytes=8000000", ":big", "big")
    assert result.returncode == 1 and "larger than 8000000 bytes" in result.stderr, result.stderr
    assert not (sandbox.host / "big").exists() and _leftovers(sandbox.host) == []


def test_a_stream_the_agent_stalls_ends_at_the_timeout(sandbox: Sandbox) -> None:
    assert sandbox.agent("touch stall").returncode == 0
    try:
        started = time.monotonic()
        result = sandbox.cli("cp", "--timeout=5", ":big", "stalled")
        assert result.returncode == 124, result.stderr
        assert "not done within 5 s" in result.stderr
        assert time.monotonic() - started < 60
    finally:
        sandbox.agent("rm -f stall")
    assert not (sandbox.host / "stalled").exists() and _leftovers(sandbox.host) == []
