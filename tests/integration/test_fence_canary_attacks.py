"""Model P's canary from the agent's side (docs/reference/boundary.md §1.2): the agent shares the pod's network
namespace and uid with the boundary, so it can shape what the boundary's probe sees without any privilege.

- Every ephemeral port held by ``bind()`` (no capability needed: ~28k sockets over two processes): the
  boundary's probe cannot even pick a source port and its connect fails with ``EADDRNOTAVAIL``. That failure
  says nothing about the fence, yet it used to count as "the fence held": with the fence then removed, every
  30 s round kept passing while the agent dialled out from the ports it holds. A probe that fails for a local
  reason is inconclusive, and an inconclusive round after Ready is enforcement lost.

The sandbox is tests/integration/test_fence_canary.py's (a test host's namespace as the pod, the canary on the
veth's test side); nothing leaves the machine.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from supervisor.boundary.capture.canary import probe_canary
from tests import controls_daemon
from tests.controls import protection_off
from tests.integration.test_fence_canary import CLI, _events, _wait, exit_code, p_sandbox

# The agent's part: hold every port of the namespace's ephemeral range with bind() alone, in as many processes as
# the file-descriptor limit needs, then stay (and dial out from one of them, were the fence gone). Prints how
# many it holds.
HOLD_PORTS = r"""
import os, resource, socket, time
low, high = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
chunk = max(1, hard - 64)
ports = list(range(low, high + 1))
read_end, write_end = os.pipe()
children = 0
for start in range(0, len(ports), chunk):
    if os.fork() == 0:
        os.close(read_end)
        held = []
        missing = ports[start:start + chunk]
        deadline = time.monotonic() + 6  # a port in use for a moment (a probe's connect, 2 s) is taken once free
        while missing and time.monotonic() < deadline:
            busy = []
            for port in missing:
                s = socket.socket()
                try:
                    s.bind(("0.0.0.0", port))
                except OSError:
                    s.close()
                    busy.append(port)
                    continue
                held.append(s)
            missing = busy
            if missing:
                time.sleep(0.1)
        os.write(write_end, b"%d\n" % len(held))
        time.sleep(3600)
        os._exit(0)
    children += 1
os.close(write_end)
total = 0
with os.fdopen(read_end) as counts:
    for _ in range(children):
        total += int(counts.readline())
print(f"held {total} of {len(ports)}", flush=True)
time.sleep(3600)
"""


@pytest.fixture
def boundary_cli() -> list[str]:
    """How the boundary is started (a twin starts it with one protection off: tests/controls_daemon.py)."""
    return CLI


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_agent_holding_every_ephemeral_port_cannot_hide_a_removed_fence(
    tmp_path: Path, boundary_cli: list[str]
) -> None:
    with p_sandbox(tmp_path, fenced=True, interval_s=2, boundary_cli=boundary_cli) as sb:
        _wait("ready", lambda: sb.cli("readyz").returncode == 0, 60, sb.control_log)
        # The pod's ephemeral range is made small (a pod setting, not the agent's doing) so that the agent can hold
        # all of it at once and nothing else of the pod's happens to be in it (with the full range, a busy moment
        # left a port or two that the probe's connect could still use).
        sb.host.run(["sh", "-c", "echo 40000 40127 > /proc/sys/net/ipv4/ip_local_port_range"], check=True)
        # The agent (an exec runs as the agent in model P) holds every ephemeral port of the pod's namespace.
        agent = subprocess.Popen(
            [*CLI, "exec", f"--api={sb.api}", "--", "/usr/bin/python3", "-I", "-c", HOLD_PORTS],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert agent.stdout is not None
            line = agent.stdout.readline()
            assert line.startswith("held "), (line, agent.wait(30), agent.stderr.read() if agent.stderr else "")
            held, total = int(line.split()[1]), int(line.split()[3])
            assert held == total == 128, line

            # The fence goes away. The agent could now dial out from a port it holds; the repeated round must
            # still end the workload, whatever the probe's connect says.
            sb.host.run(["nft", "delete", "table", "inet", "podfence"], check=True)
            code = exit_code(sb.boundary, 30, sb.boundary_log)
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
        events = _events(sb.boundary_log)
        probes = [e for e in events if e["event"] == "fence.canary-probe"]
        assert probes and any("EADDRNOTAVAIL" in e["error"] for e in probes), probes
        lost = [e for e in events if e["event"] == "enforcement-lost"]
        assert lost and "failed inside the pod" in lost[0]["reason"], json.dumps(events[-10:], indent=1)
        exited = [e for e in events if e["event"] == "agent.exited"]
        assert exited and exited[0]["result"].get("reason") == "enforcement-lost", exited
        assert code != 0


@protection_off("the canary probe's rule 2 (a connect that failed for a local reason observed nothing)")
@pytest.mark.parametrize("boundary_cli", [controls_daemon.argv("canary-local-failure")], ids=["off"])
def test_agent_holding_every_ephemeral_port_cannot_hide_a_removed_fence_twin(
    tmp_path: Path, boundary_cli: list[str]
) -> None:
    test_agent_holding_every_ephemeral_port_cannot_hide_a_removed_fence(tmp_path, boundary_cli)


async def test_a_refused_probe_is_the_fences_and_conclusive() -> None:
    """Unit-level: a refused connect (a REJECT's RST) is how a fence fails a connect: conclusive."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))  # bound, not listening: a connect to it is refused
        refused = await probe_canary(1, "127.0.0.1", taken.getsockname()[1])
    assert not refused.connected and refused.conclusive and "ECONNREFUSED" in refused.error, refused
    assert refused.to_wire()["conclusive"] is True
