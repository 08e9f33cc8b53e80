"""The policy advisor end to end (docs/policy.md "Suggesting a policy"): an agent refused on three hosts — one L4,
one L7 path, one SSRF — and through a copy of curl in its workdir; ``policy suggest`` against the running sandbox,
``policy apply`` of the suggestion, the same requests again: the two legitimate destinations pass, the SSRF one and
the workdir binary are still refused. Then ``policy suggest --events`` from the kept events file (dev's exit line
names the command) gives the same revision.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest
import yaml

from tests.netns_hosts import DnsServer, NetnsHost, open_test_host, require_netns
from tests.sandbox_api import dev_api

CLI = [sys.executable, "-m", "supervisor.cli"]
FILESERVER = Path(__file__).parent.parent / "http_fileserver.py"
PORT = 8000

POLICY = f"""\
version: 1
network_policies:
  api:
    endpoints:
      - host: api.test
        port: {PORT}
        protocol: rest
        enforcement: enforce
        rules:
          - allow: {{method: GET, path: /hello.txt}}
    binaries: [{{path: /usr/bin/curl}}]
  internal:
    name: every name under internal.test, by glob (so never an internal address)
    endpoints:
      - host: "*.internal.test"
        port: {PORT}
    binaries: [{{path: /usr/bin/curl}}]
"""

# Each probe prints "<name> <status>": 403 is the proxy's refusal, 200 the origin's file; no HTTP answer at all
# prints "000" with curl's exit code and error, so that a failure says how the exchange ended.
AGENT = f"""
probe() {{
  out=$("$2" -s -o /dev/null -w '%{{http_code}} exit=%{{exitcode}} %{{errormsg}}' --max-time 20 "$3")
  case $out in 000*) printf '%s %s\\n' "$1" "$out" ;; *) printf '%s %s\\n' "$1" "${{out%% *}}" ;; esac
}}
round() {{
  probe plain /usr/bin/curl http://plain.test:{PORT}/hello.txt
  probe path /usr/bin/curl http://api.test:{PORT}/work/README
  probe ssrf /usr/bin/curl http://db.internal.test:{PORT}/hello.txt
  probe copy "$PWD/curl" http://plain.test:{PORT}/hello.txt
}}
cp /usr/bin/curl ./curl
round; echo END1
read go
round; echo END2
"""


@dataclass
class Origin:
    host: NetnsHost
    dns: DnsServer
    policy: Path
    runtime: str


@pytest.fixture(scope="module")
def origin() -> Iterator[Origin]:
    require_netns()
    if shutil.which("curl") != "/usr/bin/curl":
        pytest.skip("the test's policy names /usr/bin/curl")
    root = Path(tempfile.mkdtemp(prefix="osb-suggest-"))
    runtime = tempfile.mkdtemp(prefix="osr-", dir="/tmp")
    try:
        (root / "www" / "work").mkdir(parents=True)
        (root / "www" / "hello.txt").write_text("hello\n")
        (root / "www" / "work" / "README").write_text("readme\n")
        subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
        policy = root / "policy.yaml"
        policy.write_text(POLICY)
        with open_test_host() as host:
            server = host.popen([sys.executable, str(FILESERVER), host.address, str(PORT), str(root / "www")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
            names = ("plain.test", "api.test", "db.internal.test")
            with DnsServer({name: [host.address] for name in names}) as dns:
                yield Origin(host, dns, policy, runtime)
            server.kill()
            server.wait()
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)


def _read_until(proc: subprocess.Popen[str], marker: str, pending: bytearray, within_s: float = 120) -> dict[str, str]:
    """The agent's "<name> <status>" lines up to ``marker``, waiting on its stdout (never a fixed sleep); what was read
    past the marker stays in ``pending``."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    found: dict[str, str] = {}
    deadline = time.monotonic() + within_s
    while True:
        while b"\n" in pending:
            line, _, rest = bytes(pending).partition(b"\n")
            pending[:] = rest
            text = line.decode().strip()
            if text == marker:
                return found
            name, _, status = text.partition(" ")
            found[name] = status
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(0.0, left))
        if not ready:
            raise AssertionError(f"no {marker} within {within_s}s: {found}")
        data = os.read(fd, 4096)
        if not data:
            raise AssertionError(f"the agent ended before {marker}: {found}")
        pending += data


def _tail(log: IO[str], lines: int = 80) -> str:
    """The end of dev's log, so that a wrong probe status says what the daemons logged for it."""
    log.flush()
    log.seek(0)
    text = "\n".join(log.read().splitlines()[-lines:])
    log.seek(0, os.SEEK_END)
    return text


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, env=env)


def test_suggest_apply_and_run_again(origin: Origin, tmp_path: Path) -> None:
    env = {**os.environ, "XDG_RUNTIME_DIR": origin.runtime}
    stderr = (tmp_path / "dev.stderr").open("w+")
    # the agent's workdir outside /tmp (which the agent can write anyway): the workdir itself must be refused
    work = Path(tempfile.mkdtemp(prefix="osb-suggest-work-", dir="/var/tmp"))
    work.chmod(0o777)
    proc = subprocess.Popen(
        [*CLI, "dev", "-T", f"--policy={origin.policy}", f"--workdir={work}",
         f"--dns-server={origin.dns.address[0]}:{origin.dns.address[1]}", "--", "sh", "-c", AGENT],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env,
    )  # fmt: skip
    try:
        pending = bytearray()
        first = _read_until(proc, "END1", pending)
        assert first == {"plain": "403", "path": "403", "ssrf": "403", "copy": "403"}, (first, _tail(stderr))

        api_env = {**env, "OPENSHELL_SANDBOX_API": str(dev_api(origin.runtime))}
        live = tmp_path / "live.yaml"
        suggested = _cli("policy", "suggest", "--out", str(live), env=api_env)
        assert suggested.returncode == 0, suggested.stderr
        revision = yaml.safe_load(live.read_text())["network_policies"]
        assert revision["suggested-plain-test-8000"] == {
            "endpoints": [{"host": "plain.test", "ports": [PORT]}],
            "binaries": [{"path": "/usr/bin/curl"}],
        }
        assert revision["api"]["endpoints"][0]["rules"] == [
            {"allow": {"method": "GET", "path": "/hello.txt"}},
            {"allow": {"method": "GET", "path": "/work/README"}},
        ]
        assert set(revision) == {"api", "internal", "suggested-plain-test-8000"}  # fmt: skip
        assert "+  suggested-plain-test-8000:" in suggested.stdout  # the diff against the policy in force
        assert _cli("policy", "check", str(live), env=env).returncode == 0

        applied = _cli("policy", "apply", str(live), env=api_env)
        assert applied.returncode == 0, applied.stderr

        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        second = _read_until(proc, "END2", pending)
        assert second == {"plain": "200", "path": "200", "ssrf": "403", "copy": "403"}, (second, _tail(stderr))
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
        notes = suggested.stderr
        assert re.search(r"not proposed: db\.internal\.test:8000 by /usr/bin/curl \(ssrf", notes), notes
        assert f"not proposed: plain.test:8000 by {work}/curl" in notes, notes
        assert f"lies in {work}, which the agent can write" in notes, notes
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)

    stderr.seek(0)
    said = stderr.read()
    hint = re.search(r"policy suggest --events (\S+) --policy (\S+)", said)
    assert hint is not None, said
    assert hint.group(2) == str(origin.policy)
    kept = tmp_path / "kept.yaml"
    from_file = _cli("policy", "suggest", "--events", hint.group(1), "--policy", hint.group(2), "--out", str(kept),
                     env=env)  # fmt: skip
    assert from_file.returncode == 0, from_file.stderr
    assert kept.read_text() == live.read_text()
