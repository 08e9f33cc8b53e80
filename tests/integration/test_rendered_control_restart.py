"""The rendered Secrets drive the real daemons, and a control restart keeps (or reports losing) the interception CA.

What a pod would do, without a cluster: ``k8s render``'s Secret material is laid out as the init containers lay
it out (owner-only copies), the boundary runs from the boundary bundle and control from the control bundle with
``--interception-ca`` on the CA Secret's copy. Then control is restarted twice: with the same CA Secret it
resumes and the agent's trust still matches it; with another CA it resumes too, but logs
``interception.ca-mismatch``, shows it in status and is not ready.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from supervisor.k8s.names import SandboxNames
from supervisor.k8s.render import claims_for
from supervisor.k8s.secrets import issue_material
from supervisor.k8s.spec import Model, RenderSpec
from supervisor.protocol.certs import DEFAULT_VALIDITY
from supervisor.protocol.fingerprint import pem_fingerprint

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the boundary daemon runs in model R (root) here")

CLI = [sys.executable, "-m", "supervisor.cli"]


def _copy(directory: Path, files: dict[str, bytes]) -> Path:
    """What the init container's script makes of a Secret volume: a 0700 directory of 0600 files."""
    directory.mkdir(mode=0o700)
    for name, content in files.items():
        fd = os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(content)
    return directory


def _events(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def _wait(what: str, check: Any, timeout: float = 90) -> Any:
    """Poll ``check`` until it holds. Every wait here is for something that must happen (a daemon up, an event
    logged), so the deadline is only a budget: 90 s, as starting Python daemons on a loaded 2-core machine
    took more than 30."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class Sandbox:
    """One rendered sandbox's daemons run by hand (also used by tests/e2e/test_rendered_inspection_restart.py)."""

    def __init__(
        self,
        root: Path,
        policy: str | None = None,
        control_args: tuple[str, ...] = (),
        validity: datetime.timedelta = DEFAULT_VALIDITY,
    ) -> None:
        self.root = root
        self.control_args = control_args
        if policy is None:
            policy = resources.files("supervisor.control").joinpath("default_policy.yaml").read_text("utf-8")
        self.spec = RenderSpec(
            namespace="agents-team-a", sandbox="review-bot", sandbox_uid="0f9e8d7c-1111-4222-8333-944455556666",
            image="registry.example/agent@sha256:" + "ab" * 32, control_image="registry.example/os:1",
            agent_argv=("sleep", "1000"), policy_text=policy, model=Model.R, cluster_cidrs=(),
        )  # fmt: skip
        names = SandboxNames.of(self.spec.sandbox, self.spec.sandbox_uid)
        self.material = issue_material(claims_for(self.spec, names), self.spec.policy_digest, validity=validity)
        _copy(root / "boundary", self.material.boundary)
        _copy(root / "control", self.material.control)
        _copy(root / "ca", self.material.interception_ca)
        (root / "policy").mkdir(mode=0o755)
        (root / "policy" / "policy.yaml").write_text(policy)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.port = 0
        self.starts = 0

    def start_boundary(self) -> None:
        log = (self.root / "boundary.log").open("w")
        self.procs.append(subprocess.Popen(
            [*CLI, "--mode=boundary", f"--bootstrap={self.root / 'boundary'}", "--listen=127.0.0.1:0",
             f"--port-file={self.root / 'port'}", "--privilege-model=R", "--agent-stdio=pipe", "--exit-linger=1",
             "--workdir=/tmp", f"--tls-dir={self.root / 'tls'}", "--", *self.spec.agent_argv],
            stdout=log, stderr=subprocess.STDOUT,
        ))  # fmt: skip
        port_file, proc = self.root / "port", self.procs[-1]

        def port() -> str | None:
            assert proc.poll() is None, (self.root / "boundary.log").read_text()
            return port_file.read_text() if port_file.exists() else None

        self.port = int(_wait("the boundary's port", port))

    def start_control(self, ca_dir: Path) -> tuple[subprocess.Popen[bytes], Path]:
        self.starts += 1
        log = self.root / f"control{self.starts}.log"
        proc = subprocess.Popen(
            [*CLI, "--mode=control", f"--bootstrap={self.root / 'control'}", f"--boundary=127.0.0.1:{self.port}",
             f"--policy={self.root / 'policy' / 'policy.yaml'}", f"--interception-ca={ca_dir}",
             f"--api={self.root / 'api.sock'}", *self.control_args],
            stdout=log.open("w"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.procs.append(proc)
        return proc, log

    def status(self) -> dict[str, Any]:
        result = subprocess.run(
            [*CLI, "status", "--json", f"--api={self.root / 'api.sock'}"], capture_output=True, text=True, timeout=30
        )
        if result.returncode != 0:
            return {}
        out: dict[str, Any] = json.loads(result.stdout)
        return out

    def readyz(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, "readyz", f"--api={self.root / 'api.sock'}"], capture_output=True, text=True, timeout=30
        )

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)

    def close(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[Sandbox]:
    box = Sandbox(tmp_path)
    try:
        yield box
    finally:
        box.close()


def _running(box: Sandbox) -> dict[str, Any] | None:
    status = box.status()
    return status if status.get("boundary", {}).get("state") == "running" else None


def test_a_restarted_control_keeps_its_ca_and_a_replaced_ca_is_reported(sandbox: Sandbox) -> None:
    box = sandbox
    box.start_boundary()
    first, _ = box.start_control(box.root / "ca")
    status = _wait("attach and start", lambda: _running(box))
    ca = status["interception"]["ca_sha256"]
    assert ca == pem_fingerprint(box.material.interception_ca["interception-ca.pem"])
    assert status["interception"]["match"] is True
    certs = status["certificates"]
    assert certs["rendered_policy_digest"] == box.spec.policy_digest == certs["started_policy_digest"]
    assert certs["started_from_rendered_policy"] is True and certs["expiring"] == []
    assert pem_fingerprint((box.root / "tls" / "openshell-ca.pem").read_bytes()) == ca  # what the agent trusts

    # Restart with the same CA Secret: resume, same CA, the agent's trust still matches.
    box.stop(first)
    second, log = box.start_control(box.root / "ca")
    status = _wait("resume", lambda: _running(box) if any(
        e["event"] == "lifecycle.resumed" for e in _events(log)) else None)  # fmt: skip
    assert status["interception"] == {"ca_sha256": ca, "boundary_ca_sha256": ca, "match": True}
    _wait("ready after resume", lambda: box.readyz().returncode == 0)
    assert not [e for e in _events(log) if e["event"] == "interception.ca-mismatch"]
    assert pem_fingerprint((box.root / "tls" / "openshell-ca.pem").read_bytes()) == ca

    # Restart with another CA (the Secret lost or replaced): resumed, but reported and not ready.
    box.stop(second)
    _, log = box.start_control(box.root / "other-ca")
    event = _wait("the mismatch event", lambda: next(
        (e for e in _events(log) if e["event"] == "interception.ca-mismatch"), None))  # fmt: skip
    assert event["boundary"] == ca and event["ours"] != ca
    status = box.status()
    assert status["interception"]["match"] is False and status["interception"]["boundary_ca_sha256"] == ca
    ready = box.readyz()
    assert ready.returncode == 1 and "interception:" in ready.stdout + ready.stderr
    human = subprocess.run([*CLI, "status", f"--api={box.root / 'api.sock'}"], capture_output=True, text=True,
                           timeout=30)  # fmt: skip
    assert f"NOT the CA the agent trusts ({ca})" in human.stdout


def test_a_bundle_ending_within_seven_days_is_an_event_and_keeps_control_not_ready(tmp_path: Path) -> None:
    box = Sandbox(tmp_path, validity=datetime.timedelta(days=6))
    try:
        box.start_boundary()
        _, log = box.start_control(box.root / "ca")
        event = _wait("the expiry event", lambda: next(
            (e for e in _events(log) if e["event"] == "certificate.expiring"), None))  # fmt: skip
        assert event["certificate"] == "bootstrap certificate" and "(in 5 days)" in event["when"]
        _wait("attach and start", lambda: _running(box))
        ready = box.readyz()
        assert ready.returncode == 1
        assert "certificate: bootstrap certificate expires" in ready.stdout + ready.stderr
        status = box.status()
        assert status["certificates"]["expiring"] and status["interception"]["match"] is True
    finally:
        box.close()


def test_a_workload_gone_too_long_is_named_in_readyz_with_the_time_and_status_says_what_to_delete(
    sandbox: Sandbox,
) -> None:
    """The workload ends (its boundary exits) and control stays, redialling: past --workload-gone-after readyz
    names the time it went, and status the commands that remove the sandbox by its id label."""
    box = sandbox
    box.control_args = ("--workload-gone-after=2",)
    box.start_boundary()
    box.start_control(box.root / "ca")
    _wait("the agent running", lambda: _running(box))
    assert "workload: gone" not in box.readyz().stdout + box.readyz().stderr
    box.stop(box.procs[0])  # the workload pod is gone
    ready = _wait("readyz to name the gone workload", lambda: (r := box.readyz()).returncode == 1
                  and "workload: gone since " in r.stdout + r.stderr and r)  # fmt: skip
    assert re.search(r"workload: gone since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(0 min without a link\)",
                     ready.stdout + ready.stderr), ready  # fmt: skip
    gone = box.status()["link"]["workload_gone"]
    uid = box.spec.sandbox_uid
    assert gone["delete"] == [
        f"kubectl delete -n agents-team-a -l openshell.ai/sandbox-id={uid} pods,deployments --cascade=foreground "
        "--wait=true",
        f"kubectl delete -n agents-team-a -l openshell.ai/sandbox-id={uid} services,networkpolicies,configmaps,secrets",
    ]
    human = subprocess.run([*CLI, "status", f"--api={box.root / 'api.sock'}"], capture_output=True, text=True,
                           timeout=30)  # fmt: skip
    assert "workload    gone since" in human.stdout and gone["delete"][0] in human.stdout
