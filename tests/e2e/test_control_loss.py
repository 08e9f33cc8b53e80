"""Control killed mid-transfer: the agent's connection fails, nothing goes
direct, new connections are refused while control is down, and once dev mode has restarted control (which
resumes the boundary) new connections work again — all within one agent process that never restarts.

The agent is one long-running script: it starts two endless downloads (the test host drips 1 KiB every
20 ms), one through a CONNECT tunnel (the origin speaks first: a raw relay) and one as an absolute-form request
(an HTTP answer whose body never ends), reports when bytes flow on both, then
loops, one attempt per line, each attempt both through the proxy (CONNECT) and transparently (fresh DNS
through the stub, then a direct dial). The test drives the outage: it freezes the dev process (SIGSTOP, so
that it cannot restart control before the agent has seen the outage), SIGKILLs control, waits for the agent
to report failures, lets dev run again, and waits for attempts to succeed again.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from tests.e2e.attack_world import AGENT_PYTHON, DRIP_PORT, ECHO_PORT, HTTP_DRIP_PORT, AttackWorld, DevRun, attack_world

__all__ = ["attack_world"]  # the module-scoped fixture

AGENT = """
def attempt(i):
    result = {}
    sock, answer = tunnel(f"api.test:{CONFIG['echo']}", timeout=5)
    result["connect"] = echo_check(sock, b"attempt %d" % i)["end"] if sock else f"status {answer['status']}"
    try:
        address = socket.getaddrinfo("api.test", CONFIG["echo"], socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except OSError as exc:
        result["transparent"] = f"dns: {exc}"
    else:
        sock = dial(address, CONFIG["echo"])
        result["transparent"] = sock if isinstance(sock, str) else echo_check(sock, b"attempt %d" % i)["end"]
    return result

downloads = {"connect": tunnel(f"api.test:{CONFIG['drip']}")[0], "forward": dial(*PROXY)}
downloads["forward"].sendall(get_head(f"api.test:{CONFIG['http_drip']}"))
got = {}
for kind, sock in downloads.items():
    got[kind] = 0
    while got[kind] < 32 * 1024:
        chunk = sock.recv(65536)
        if not chunk:  # fail now, with what came, rather than spin on EOF until the test's deadline
            sys.exit(f"the {kind} download ended after {got[kind]} bytes")
        got[kind] += len(chunk)
report("drip-flowing", bytes=got)
ends = {}
for kind, sock in downloads.items():
    sock.settimeout(20)
    data, ends[kind] = read_to_end(sock)
    got[kind] += len(data)
report("drip-ended", end=ends, bytes=got)

stop = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stop")
i = 0
while not os.path.exists(stop) and i < 400:
    i += 1
    report("attempt", i=i, t=time.time(), **attempt(i))
    time.sleep(0.1)
report("done", attempts=i)
"""


def _ok(attempt: dict[str, Any]) -> bool:
    return bool(attempt["connect"] == "eof" and attempt["transparent"] == "eof")


def down_attempts(attempts: list[dict[str, Any]], resumed_at: float) -> list[dict[str, Any]]:
    return [a for a in attempts if a["t"] < resumed_at]


def _wait_for(run: DevRun, name: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        probe = run.next_probe(left)
        if probe is None:
            break
        if probe["probe"] == name:
            return probe
    raise AssertionError(
        f"the agent never reported {name!r}; its output: {''.join(run.stdout)[-3000:]}\n"
        f"the sandbox's stderr: {run.stderr_text()[-6000:]}"
    )


def test_control_killed_mid_transfer(attack_world: AttackWorld) -> None:
    w = attack_world
    stop = w.agent_dir / "stop"
    stop.unlink(missing_ok=True)
    run = w.start([AGENT_PYTHON, w.script(AGENT)])
    attempts: list[dict[str, Any]] = []
    try:
        _wait_for(run, "drip-flowing", 60)
        old_control = run.child("control")
        os.kill(run.proc.pid, signal.SIGSTOP)  # dev cannot restart control until we let it
        try:
            killed_at = time.time()
            os.kill(old_control, signal.SIGKILL)
            ended = _wait_for(run, "drip-ended", 15)
            while sum(1 for a in attempts if not _ok(a)) < 3:
                attempts.append(_wait_for(run, "attempt", 15))
        finally:
            resumed_at = time.time()
            os.kill(run.proc.pid, signal.SIGCONT)
        recovered_at = None
        while recovered_at is None or sum(1 for a in attempts if a["t"] > recovered_at) < 3:
            attempt = _wait_for(run, "attempt", 30)
            attempts.append(attempt)
            if recovered_at is None and _ok(attempt):
                recovered_at = attempt["t"]
            elif recovered_at is not None:
                assert _ok(attempt), f"after recovery an attempt failed: {attempt}"
        new_control = run.child("control")
        stop.write_text("stop")
        _wait_for(run, "done", 30)
        agent = run.finish(60)
    finally:
        run.kill()
        stop.unlink(missing_ok=True)

    print(
        f"\ncontrol down {resumed_at - killed_at:.2f} s (dev frozen), {len(down_attempts(attempts, resumed_at))} "
        f"attempts refused meanwhile; working again {recovered_at - resumed_at:.2f} s after dev resumed; "
        f"downloads ended by {ended['end']} after {ended['bytes']} bytes"
    )
    # the in-flight downloads failed: no clean EOF that would pass for the end of the download
    assert ended["end"] == {"connect": "reset", "forward": "reset"}, ended
    # while control was down, every attempt failed, both ways, and promptly (no hang until a timeout)
    down = down_attempts(attempts, resumed_at)
    assert down and not any(a["connect"] == "eof" or a["transparent"] == "eof" for a in down), down
    assert all(a["connect"] == "status 503" for a in down), down  # the proxy says "no egress link"
    assert all(a["transparent"].startswith("dns:") for a in down), down  # the stub has no one to ask
    # ... and nothing reached the test host meanwhile: no direct path
    reached = [
        (t, p) for t, p in w.accepts() if killed_at < t < resumed_at and p in (ECHO_PORT, DRIP_PORT, HTTP_DRIP_PORT)
    ]
    assert reached == [], f"the test host was reached while control was down: {reached}"
    # dev restarted control (a new process) and the same agent works again
    assert new_control != old_control
    assert agent.result.returncode == 0, agent.explain()
    refused = [e for e in agent.events if e.get("event") == "egress.refused"]
    assert any(e["reason"] == "no-egress-link" for e in refused), agent.explain()
    assert any(e.get("event") == "lifecycle.resumed" for e in agent.events), agent.explain()
    after = [e for e in agent.egress() if e["decision"] == "allow" and e["destination"].endswith(f":{ECHO_PORT}")]
    assert len(after) >= 3 * 2, agent.explain()
