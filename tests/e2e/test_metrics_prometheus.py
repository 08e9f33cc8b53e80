"""A real Prometheus scrapes a dev sandbox's ``/metrics`` (docs/design.md "Metrics").

Debian's ``prometheus`` (scripts/install-test-deps.sh), the test's own instance: its own configuration and storage
directory, listening on ``127.0.0.1:<port>`` only (asserted from the kernel's socket table, not its flags), a 1 s
scrape of control's and the boundary's ``--metrics-listen``. The agent makes three allowed connections and two the
policy refuses, and tries to read control's ``/metrics`` itself — directly (its namespace's loopback is its own: the
connection is refused there) and through its proxy (no endpoint names 127.0.0.1: refused by control), which is a
third refusal. PromQL through Prometheus's HTTP API then returns exactly those counts, by decision and by §4.3 deny
group (all three plain-HTTP requests through the proxy: ``forward_policy``).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.egress_world import CLI, PORT, World, world  # noqa: F401  (the module-scoped fixture)
from tests.sandbox_api import api_env

PROMETHEUS = "/usr/bin/prometheus"
DEADLINE_S = 60.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listening(pid: int) -> list[str]:
    """``ADDR:PORT`` of every TCP socket ``pid`` listens on (``ss``, from the kernel's table)."""
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    return [line.split()[3] for line in out.splitlines() if f"pid={pid}," in line]


class Prometheus:
    def __init__(self, targets: dict[str, int]) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="osb-prom-"))
        self.port = _free_port()
        jobs = "".join(
            f"  - job_name: {job}\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
            for job, port in targets.items()
        )
        config = self.dir / "prometheus.yml"
        config.write_text(f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n{jobs}")
        self.log = (self.dir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=self.dir,
        )  # fmt: skip

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False

    def query(self, promql: str) -> float | None:
        """The one value of an instant query, ``None`` when it has none."""
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as reply:
            body: dict[str, Any] = json.load(reply)
        assert body["status"] == "success", body
        result = body["data"]["result"]
        return float(result[0]["value"][1]) if result else None

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _until(what: str, check: Any, deadline: float) -> Any:
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def targets() -> Iterator[dict[str, int]]:
    if not os.path.exists(PROMETHEUS):
        pytest.skip("Debian's prometheus is not installed (scripts/install-test-deps.sh)")
    yield {"control": _free_port(), "boundary": _free_port()}


def test_prometheus_counts_what_the_agent_did(world: World, targets: dict[str, int]) -> None:  # noqa: F811
    control, boundary = targets["control"], targets["boundary"]
    script = f"""
        for i in 1 2 3; do curl -sf -o /dev/null http://api.test:{PORT}/hello.txt && echo allowed; done
        for i in 1 2; do curl -s -o /dev/null http://other.test:{PORT}/ ; done
        curl -s -m 5 --noproxy '*' http://127.0.0.1:{control}/metrics | grep -q openshell_ && echo LEAK-direct
        curl -s -m 5 --noproxy '' -x "${{HTTP_PROXY:-$http_proxy}}" http://127.0.0.1:{control}/metrics \
          | grep -q openshell_ && echo LEAK-proxy
        echo ran
        exec sleep 300
    """
    stderr = tempfile.TemporaryFile()  # noqa: SIM115  (read after dev ends, in finally)
    dev = subprocess.Popen(
        [*CLI, "dev", "--log-format=json", f"--policy={world.policy}",
         f"--dns-server={world.dns.address[0]}:{world.dns.address[1]}",
         f"--metrics-listen=127.0.0.1:{control}", f"--boundary-metrics-listen=127.0.0.1:{boundary}",
         "--", "sh", "-c", script],
        stdout=subprocess.PIPE, stderr=stderr, text=True,
        env={**os.environ, "XDG_RUNTIME_DIR": world.runtime},
    )  # fmt: skip
    prometheus = Prometheus(targets)
    try:
        deadline = time.monotonic() + DEADLINE_S
        _until("prometheus ready", prometheus.ready, deadline)
        assert _listening(prometheus.proc.pid) == [f"127.0.0.1:{prometheus.port}"]
        said: list[str] = []
        assert dev.stdout is not None
        while "ran" not in said:
            ready, _, _ = select.select([dev.stdout], [], [], max(0.0, deadline - time.monotonic()))
            line = dev.stdout.readline() if ready else ""
            assert line, f"the agent did not finish its run; it said {said}"
            said.append(line.strip())
        assert said == ["allowed", "allowed", "allowed", "ran"]  # no LEAK line: the agent never read /metrics

        last: list[Any] = []

        def counts() -> tuple[float | None, ...] | None:
            now = (
                prometheus.query('sum(openshell_connections_total{job="control",decision="allow"})'),
                prometheus.query('sum(openshell_connections_total{job="control",decision="deny"})'),
                prometheus.query('sum(openshell_connections_total{job="control",deny_group="forward_policy"})'),
            )
            last[:] = [now, prometheus.query('count(openshell_connections_total{job="control"})')]
            if now != (3.0, 3.0, 3.0):
                return None
            return now

        try:
            _until("Prometheus to hold 3 allowed and 3 refused connections", counts, deadline)
        except AssertionError:
            page = urllib.request.urlopen(f"http://127.0.0.1:{control}/metrics", timeout=5).read().decode()
            raise AssertionError(
                f"last {last}; control's page:\n"
                + "\n".join(line for line in page.splitlines() if line.startswith("openshell_connections"))
            ) from None
        assert prometheus.query('openshell_activity_denied_total{job="control"}') == 3.0
        boundary_said = (
            'openshell_process_starts_total{job="boundary",kind="agent"}',
            'openshell_lifecycle_state{job="boundary",state="running"}',
            'min(up{job=~"control|boundary"})',
        )
        _until("the boundary's page in Prometheus", lambda: all(prometheus.query(q) == 1.0 for q in boundary_said),
               deadline)  # fmt: skip
        # the same counts at GET /v1/activity, through `status` (§4.3: the inspected connections count by their
        # requests; the three refusals are forward-proxy requests the L4 policy refused)
        env = api_env({**os.environ, "XDG_RUNTIME_DIR": world.runtime})
        status = subprocess.run([*CLI, "status", "--json"], capture_output=True, text=True, env=env, timeout=30)
        activity = json.loads(status.stdout)["activity"]
        assert activity["denied_action_count"] == 3
        assert activity["denials_by_group"]["forward_policy"] == 3
        assert activity["network_activity_count"] == 6
        human = subprocess.run([*CLI, "status"], capture_output=True, text=True, env=env, timeout=30).stdout
        assert "activity    6 connections and requests, 3 denied (forward_policy 3)" in human.splitlines()
        # nothing the agent named is a label: no series carries its hosts (the rule key is the policy's own)
        for label in ("rule", "reason", "deny_group", "decision"):
            assert prometheus.query(f'count({{job="control", {label}=~".*[.]test.*|.*127[.]0.*"}})') is None
    finally:
        prometheus.close()
        dev.send_signal(signal.SIGTERM)
        try:
            dev.wait(timeout=30)
        except subprocess.TimeoutExpired:
            dev.kill()
            dev.wait()
        stderr.seek(0)
        events = [json.loads(line) for line in stderr.read().decode().splitlines() if line.startswith("{")]
        stderr.close()
    listening = [e for e in events if e.get("event") == "metrics.listening"]
    assert sorted(e["address"] for e in listening) == sorted([f"127.0.0.1:{control}", f"127.0.0.1:{boundary}"])
