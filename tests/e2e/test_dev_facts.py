"""Facts that stay true in a running dev sandbox, asked through the real CLI from another process: which policy is
in force and from where, what runs in the workload and how to aim at it, and what an invalid policy file does.

One sandbox for the module: its policy is watched (kept under /var/tmp, tests/e2e/safe_dirs.py), it holds one
credential, and its agent sleeps. The tests run in file order; the policy test changes the policy.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.safe_dirs import safe_dir
from tests.sandbox_api import dev_api
from tests.waiting import wait_until

CLI = [sys.executable, "-m", "supervisor.cli"]
POLICY = """version: 1
network_policies:
  example:
    endpoints:
      - host: api.example.test
        port: 443
    binaries:
      - path: /usr/bin/curl
"""
PLACEHOLDER = "openshell:resolve:env:DEMO_TOKEN"


@dataclass
class Box:
    env: dict[str, str]
    policy: Path
    stderr: Path  # dev's own stderr: what the person at its terminal reads
    state: Path

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=self.env)

    def said(self) -> str:
        return self.stderr.read_text()

    def events(self) -> list[dict[str, object]]:
        [path] = self.state.glob("openshell-sandbox/*/events.jsonl")
        return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def box() -> Iterator[Box]:
    if os.geteuid() != 0:
        pytest.skip("dev mode runs the boundary in model R here (root)")
    root = Path(tempfile.mkdtemp(prefix="osf-", dir="/tmp"))
    runtime, state = root / "run", root / "state"
    for directory in (runtime, state):
        directory.mkdir(mode=0o700)
    (root / "creds.yaml").write_text("DEMO_TOKEN: {secret: s3cr3t-value, hosts: [api.example.test]}\n")
    with safe_dir() as policy_dir:
        policy = policy_dir / "agent-policy.yaml"
        policy.write_text(POLICY)
        policy.chmod(0o644)
        env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "XDG_STATE_HOME": str(state)}
        env.pop("OPENSHELL_SANDBOX_API", None)
        with (root / "dev.err").open("w") as err:
            dev = subprocess.Popen([*CLI, "dev", f"--policy={policy}", f"--credentials={root / 'creds.yaml'}", "--",
                                    "sleep", "600"], env=env, stdout=subprocess.DEVNULL, stderr=err)  # fmt: skip
        box = Box({**env, "OPENSHELL_SANDBOX_API": str(dev_api(runtime))}, policy, root / "dev.err", state)
        try:
            wait_until(lambda: dev.poll() is not None or "is ready" in box.said(), "the ready line", within_s=90)
            assert dev.poll() is None, box.said()
            box.env["OPENSHELL_SANDBOX_API"] = str(dev_api(runtime))
            yield box
        finally:
            dev.terminate()
            dev.wait(timeout=60)
            subprocess.run(["rm", "-rf", str(root)], check=False)


def test_status_names_the_users_policy_file_and_its_generation(box: Box) -> None:
    status = box.cli("status")
    assert status.returncode == 0, status.stderr
    [line] = [line for line in status.stdout.splitlines() if line.startswith("policy ")]
    assert line.split() == ["policy", "generation", "0", "loaded", f"({box.policy})", "acknowledged", "0"], line
    assert json.loads(box.cli("status", "--json").stdout)["policy"]["source"] == str(box.policy)


def test_policy_get_yaml_prints_the_policy_in_force(box: Box, tmp_path: Path) -> None:
    got = box.cli("policy", "get", "--yaml")
    assert got.returncode == 0, got.stderr
    assert got.stdout.startswith(f"# generation 0 from {box.policy}, the policy in force (normalised)\n")
    saved = tmp_path / "in-force.yaml"
    saved.write_text(got.stdout)
    assert box.cli("policy", "check", str(saved)).stdout == "ok: 1 rules, 1 endpoints\n"
    decided = box.cli("policy", "decide", "--generation", "0", "--host", "api.example.test", "--port", "443",
                      "--binary", "/usr/bin/curl")  # fmt: skip
    assert (decided.returncode, decided.stdout) == (0, "allow example (example[0]) api.example.test:443\n")
    stale = box.cli("policy", "decide", "--generation", "7", "--host", "api.example.test", "--port", "443")
    assert stale.returncode == 2 and "generation 7 is not the one in force (generation 0 is)" in stale.stderr


def test_an_invalid_policy_file_is_said_everywhere_and_the_why_hint_follows_the_policy_in_force(box: Box) -> None:
    # the agent tries a host no rule allows: the refusal line explains it against the user's file
    line = _refusal_explained(box)
    assert f"(why: openshell-sandbox policy decide --policy {box.policy} --host 192.0.2.10" in line, line
    # the file turns invalid: quarantine, with its errors in readyz, logs, dev's terminal and the event
    box.policy.write_text(POLICY.replace("port: 443", "port: 0"))
    error = f"{box.policy}:6: network_policies.example.endpoints[0].port: invalid port 0 (expected 1..=65535)"
    wait_until(lambda: error in box.said(), "the quarantine in dev's terminal")
    assert f"openshell-sandbox: {box.policy} is invalid; quarantined (generation 1): every new connection is " \
        "denied until it is fixed:\n  " + error in box.said()  # fmt: skip
    ready = box.cli("readyz")
    assert ready.returncode == 1 and f"policy error: {error}" in ready.stderr.splitlines(), ready.stderr
    assert error in box.cli("logs", "--event", "policy.generation").stdout
    [event] = [e for e in box.events() if e["event"] == "policy.generation" and e.get("status") == "quarantined"]
    assert event["errors"] == [{"path": "network_policies.example.endpoints[0].port", "message": "invalid port 0",
                                "expected": "1..=65535", "line": 6, "source": str(box.policy)}]  # fmt: skip
    # an operator applies another policy: the next refusal is explained by the generation that decided it
    applied = box.cli("policy", "apply", str(box.policy.with_name("x.yaml")))
    assert applied.returncode == 2  # no such file: nothing changed
    revised = box.policy.with_name("revised.yaml")
    revised.write_text(POLICY.replace("api.example.test", "other.example.test"))
    assert box.cli("policy", "apply", str(revised)).returncode == 0
    line = _refusal_explained(box)
    command = shlex.split(line.split("(why: ", 1)[1].removesuffix(")"))
    assert command[3:7] == ["--api", box.env["OPENSHELL_SANDBOX_API"], "--generation", "2"], line
    explained = box.cli(*command[1:])
    assert explained.returncode == 1 and explained.stdout.startswith("deny 192.0.2.10:443"), explained


def _refusal_explained(box: Box) -> str:
    """Have a workload process connect where no rule allows; the new refusal line, with its ``why:`` hint."""
    # it holds the socket open until refused: one closed at once is gone before the boundary can identify it
    probe = "import socket\ntry: socket.create_connection(('192.0.2.10', 443), 10).recv(1)\nexcept OSError: pass"
    before = len(box.said().splitlines())
    assert box.cli("exec", "--", "python3", "-c", probe).returncode == 0
    return wait_until(lambda: [x for x in box.said().splitlines()[before:] if "192.0.2.10:443" in x], "a refusal")[-1]


def test_exec_detach_returns_at_once_and_status_lists_what_runs(box: Box) -> None:
    started = time.monotonic()
    detached = box.cli("exec", "-d", "--", "sh", "-c", f"sleep 30; echo 'done {PLACEHOLDER}'")
    assert detached.returncode == 0, detached.stderr
    assert time.monotonic() - started < 20, "exec --detach must not wait for its command"
    handle = detached.stderr.strip()
    assert handle.startswith("p_") and detached.stdout == ""
    processes = {p["handle"]: p for p in json.loads(box.cli("status", "--json").stdout)["boundary"]["processes"]}
    assert processes[handle]["argv"] == ["sh", "-c", "sleep 30; echo 'done [CREDENTIAL]'"]  # redacted
    assert processes[handle]["state"] == "running" and processes[handle]["started_at"].endswith("Z")
    [agent] = [p for p in processes.values() if p["kind"] == "agent"]
    assert agent["argv"] == ["sleep", "600"]
    text = box.cli("status").stdout
    assert f"{handle}  exec  running  since {processes[handle]['started_at']}  sh -c" in text, text
    assert PLACEHOLDER not in text
    ended = box.cli("terminate", handle, "--grace", "0")
    assert ended.returncode == 0 and json.loads(ended.stdout)["handle"] == handle


def test_exec_of_a_program_that_cannot_run_names_it(box: Box) -> None:
    missing = box.cli("exec", "--", "no-such-tool", "--flag")
    assert missing.returncode == 127
    assert missing.stderr == "openshell-sandbox: cannot run no-such-tool: No such file or directory\n"
    denied = box.cli("exec", "--", "/etc/passwd")
    assert denied.returncode == 126
    assert denied.stderr == "openshell-sandbox: cannot run /etc/passwd: Permission denied\n"


SERVER = """import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8000))
s.listen()
open("server-ready", "w").close()
while True:
    c, _ = s.accept()
    with open("connections.log", "a") as log:
        log.write("accepted\\n")
    c.sendall(b"hi\\n")
    c.close()
"""


def test_forward_probes_without_touching_the_target_and_ends_with_its_sandbox(box: Box) -> None:
    """Last: it ends the sandbox."""
    [work] = box.state.glob("openshell-sandbox/*/work")
    assert box.cli("exec", "-d", "--", "python3", "-c", SERVER).returncode == 0
    wait_until(lambda: (work / "server-ready").exists(), "the workload's server")
    forward = subprocess.Popen([*CLI, "forward", "0:8000"], env=box.env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert forward.stderr is not None
        started = forward.stderr.readline()
        assert started.startswith("forwarding 127.0.0.1:") and started.endswith(" -> 127.0.0.1:8000 in the workload\n")
        assert not (work / "connections.log").exists(), "the start-up probe must not connect to the target"
        port = int(started.split()[1].rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            assert conn.makefile("rb").readline() == b"hi\n"
        assert (work / "connections.log").read_text() == "accepted\n"
        assert box.cli("terminate", "--grace", "1").returncode == 0  # the agent: the sandbox ends
        out, err = forward.communicate(timeout=60)
    finally:
        if forward.poll() is None:
            forward.kill()
            forward.wait()
    assert forward.returncode == 0, err
    assert (out, err.count("\n")) == ("", 1), err
    assert err.startswith("openshell-sandbox: forward stopped: the sandbox has ended"), err
