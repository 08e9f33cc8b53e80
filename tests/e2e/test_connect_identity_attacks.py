"""Identity fixed at connect (docs/design.md "Identity"), attacked from the agent's side through dev mode and
control's policy.

The policy lets only curl and sh (with their descendants) reach the test host's echo port; the agent is
python. Each attack makes python's connection look like curl's or sh's to an accept-time resolver; control must
decide every one of them as python's (denied), while curl itself and a real descendant of sh stay allowed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect
import os
import time
from pathlib import Path
from typing import Any

import pytest

from supervisor.boundary.capture import connect_notify
from tests import controls_dev
from tests.controls import protection_off
from tests.e2e.attack_world import AGENT_PYTHON, AttackWorld, attack_world
from tests.integration import connect_attacks

__all__ = ["attack_world"]

pytestmark = pytest.mark.skipif(not connect_notify.available(), reason="this kernel lacks SECCOMP_RET_USER_NOTIF")

PYTHON = os.path.realpath("/usr/bin/python3")
SH = os.path.realpath("/bin/sh")
CURL = "/usr/bin/curl"

POLICY = """\
version: 1
network_policies:
  curl-and-sh:
    endpoints:
      - ports: [{p1}]
        allowed_ips: ["{address}/32"]
    binaries:
      - path: /usr/bin/curl
      - path: {sh}
"""

AGENT = r'''
import subprocess, errno

def curl(name, env=None):
    out = subprocess.run(["/usr/bin/curl", "-s", "-m", "5", f"http://{HOST}:{CONFIG['p1']}/"],
                         capture_output=True, env={**os.environ, **(env or {})})
    report(name, curl_exit=out.returncode)

curl("plain-curl")

# python itself: not in the policy
sock = dial(HOST, CONFIG["p1"])
report("plain-python", **(echo_check(sock) if not isinstance(sock, str) else {"connect": sock}))

# a real descendant of sh: python under a shell that stays its parent
code = (f"import socket; s = socket.create_connection(({HOST!r}, {CONFIG['p1']}), 5); "
        "s.sendall(b'ping'); print(s.recv(4))")
out = subprocess.run(["/bin/sh", "-c", f"/usr/bin/python3 -c \"{code}\"; true"], capture_output=True, timeout=30)
report("descendant-of-sh", out=out.stdout.decode().strip())

# connect, hand the socket to a helper over SCM_RIGHTS, the helper execs sh holding it
ours, theirs = socket.socketpair()
helper = subprocess.Popen([sys.executable, "-c", """
import os, socket, sys
chan = socket.socket(fileno=int(sys.argv[1]))
_, fds, _, _ = socket.recv_fds(chan, 16, 1)
os.dup2(fds[0], 3)
os.execv("/bin/sh", ["sh", "-c", "sleep 3"])
""", str(theirs.fileno())], pass_fds=[theirs.fileno()])
theirs.close()
sock = dial(HOST, CONFIG["p1"])
if isinstance(sock, str):  # the denial's reset beat connect()'s return (a loaded machine): decided all the same
    helper.kill()
    helper.wait()
    report("scm-rights-then-exec", connect=sock)
else:
    socket.send_fds(ours, [b"s"], [sock.fileno()])
    sock.close()
    helper.wait(timeout=30)
    report("scm-rights-then-exec", helper_exit=helper.returncode)

# fork first; the parent then becomes sh; only then the child connects
fork_code = f"""
import os, socket, time
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    deadline = time.monotonic() + 20
    sh = {os.path.realpath('/bin/sh')!r}
    while os.path.realpath(f"/proc/{{os.getppid()}}/exe") != sh and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        s = socket.create_connection(({HOST!r}, {CONFIG['p1']}), 5)
        s.sendall(b"ping")
        s.settimeout(5)
        s.recv(4)
    except OSError:
        pass
    os._exit(0)
os.close(w)
os.dup2(r, 0)
os.execv("/bin/sh", ["sh", "-c", "cat >/dev/null"])
"""
out = subprocess.run([sys.executable, "-c", fork_code], capture_output=True, timeout=30)
report("fork-before-exec", exit=out.returncode)

curl("preloaded-curl", {"LD_PRELOAD": "/nonexistent/preload.so"})

s = socket.socket()
try:
    s.sendto(b"ping", socket.MSG_FASTOPEN, (HOST, CONFIG["p1"]))
    report("fastopen", send="sent")
except OSError as exc:
    report("fastopen", send=errno.errorcode.get(exc.errno, str(exc.errno)))
'''


def _by_start(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Decision events in the order the connections were made: an allowed one is written when it ends (with its
    duration), a denied one at once, so on a loaded machine the log's order is not the agent's."""

    def started(e: dict[str, Any]) -> float:
        at = dt.datetime.fromisoformat(str(e["time"]).replace("Z", "+00:00")).timestamp()
        return at - float(e.get("duration_ms", 0)) / 1000

    return sorted(events, key=started)


def _world(w: AttackWorld, protection: str | None = None) -> AttackWorld:
    """The world with this module's policy; with ``protection``, dev starts its daemons with that check off."""
    policy = w.policy.with_name("connect-identity-policy.yaml")
    policy.write_text(POLICY.format(p1=w.p1, address=w.host.address, sh=SH))
    cli = w.cli if protection is None else controls_dev.argv(protection)
    return dataclasses.replace(w, policy=policy, cli=cli)


def test_every_borrowed_allowance_is_decided_as_the_connector(attack_world: AttackWorld) -> None:
    _borrow_every_allowance(_world(attack_world))


@protection_off("the parent's image at the child's creation (the boundary's exec log)")
def test_every_borrowed_allowance_is_decided_as_the_connector_twin(attack_world: AttackWorld) -> None:
    _borrow_every_allowance(_world(attack_world, "exec-log-child"))


def _borrow_every_allowance(w: AttackWorld) -> None:
    before = len(w.accepts(w.p1))
    agent = w.run_agent(AGENT)
    assert agent.result.returncode == 0, agent.explain()
    assert any(e.get("identity_at") == "connect" for e in agent.events if e.get("event") == "lifecycle.bound")
    decisions = _by_start(agent.egress(f"{w.host.address}:{w.p1}"))
    summary = [(e["decision"], e.get("binary"), e.get("reason")) for e in decisions]
    expected: list[tuple[str, str, Any]] = [
        ("allow", CURL, None),  # plain curl
        ("deny", PYTHON, "binary-not-allowed"),  # python itself
        ("allow", PYTHON, None),  # python, a real descendant of sh
        ("deny", PYTHON, "binary-not-allowed"),  # SCM_RIGHTS then exec sh: still python's
        ("deny", PYTHON, "binary-not-allowed"),  # forked before its parent became sh
        ("deny", CURL, "binary-not-allowed"),  # curl under LD_PRELOAD
    ]
    assert summary == expected, agent.explain()
    assert "LD_PRELOAD" in decisions[-1]["detail"]
    assert agent.probes["fastopen"]["send"] in ("EOPNOTSUPP", "ENOTSUP"), agent.explain()
    # only the two allowed connections reached the test host
    assert len(w.accepts(w.p1)) - before == 2, agent.explain()


CHURN_ROUNDS = 100_000  # short-lived processes: far more than the 65,536 entries a count-bounded exec log kept
RSS_GROWTH_BOUND_KIB = 16 * 1024  # what the boundary may grow by while they come and go

CHURN_AGENT = (
    "import ctypes, subprocess\n"
    f"SH = {os.path.realpath('/bin/sh')!r}\n"
    f"CHURN = {connect_attacks.CHURN!r}\n"
    f"ROUNDS = {CHURN_ROUNDS}\n"
    + inspect.getsource(connect_attacks.scrub_environ)
    + inspect.getsource(connect_attacks.churn)
    + r"""
def probe():
    sock = dial(HOST, CONFIG["p1"])
    return echo_check(sock) if not isinstance(sock, str) else {"connect": sock}

if sys.argv[1:] == ["preloaded"]:  # python under sh, exec'd with LD_PRELOAD, which it erases
    print(json.dumps({"scrubbed": scrub_environ(), **probe()}), flush=True)
    sys.stdin.readline()
    print(json.dumps(probe()), flush=True)
    sys.exit(0)

read_end, write_end = os.pipe()
if os.fork() == 0:  # the victim's parent: it forks the victim, then becomes sh, an allowed binary
    if os.fork() == 0:
        os.close(read_end)
        deadline = time.monotonic() + 20
        while os.path.realpath(f"/proc/{os.getppid()}/exe") != SH and time.monotonic() < deadline:
            time.sleep(0.01)
        report("victim-before", parent=os.path.realpath(f"/proc/{os.getppid()}/exe"), **probe())
        code = f"LD_PRELOAD=/nonexistent/preload.so {sys.executable} {os.path.abspath(__file__)} preloaded; true"
        preloaded = subprocess.Popen([SH, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        report("preloaded-before", **json.loads(preloaded.stdout.readline()))
        report("churning")
        started = time.monotonic()
        churn(ROUNDS)
        report("churned", seconds=round(time.monotonic() - started, 1))
        preloaded.stdin.write(b"go\n")
        preloaded.stdin.flush()
        report("preloaded-after", **json.loads(preloaded.stdout.readline()))
        preloaded.wait(30)
        report("victim-after", **probe())
        os._exit(0)
    os.close(write_end)
    os.dup2(read_end, 0)
    os.execv(SH, ["sh", "-c", "cat >/dev/null"])
os.close(read_end)
os.close(write_end)
os.wait()
"""
)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def test_no_churn_of_short_lived_processes_makes_the_boundary_forget(attack_world: AttackWorld) -> None:
    """A child made before its parent became sh, and a python under sh exec'd with LD_PRELOAD (erased from its
    environment block since), are denied before and after 100,000 short-lived processes that each leave the
    boundary's exec log two entries; nothing reaches the host; the boundary's memory stays within a bound."""
    w = _world(attack_world)
    before = len(w.accepts(w.p1))
    run = w.start([AGENT_PYTHON, w.script(CHURN_AGENT)])
    try:
        boundary = run.child("boundary")
        seen: dict[str, dict[str, Any]] = {}
        rss: list[int] = []
        deadline = time.monotonic() + 200
        while "victim-after" not in seen and time.monotonic() < deadline:
            line = run.next_probe(timeout=0.5)
            if line is not None:
                seen[line.pop("probe")] = line
            elif run.proc.poll() is not None:
                break  # the sandbox ended: what the agent said is in ``finish``
            if "churning" in seen:
                rss.append(_rss_kib(boundary))  # from the churn's start, every half second or probe
        agent = run.finish(60)
    finally:
        run.kill()
    assert agent.result.returncode == 0 and "victim-after" in seen, (seen, agent.explain())
    assert seen["victim-before"]["parent"] == SH  # the attack happened: its parent is sh when it connects
    assert agent.probes["preloaded-before"]["scrubbed"] is True  # and /proc/PID/environ no longer shows it
    decisions = _by_start(agent.egress(f"{w.host.address}:{w.p1}"))
    summary = [(e["decision"], e.get("binary"), e.get("reason")) for e in decisions]
    assert summary == [("deny", PYTHON, "binary-not-allowed")] * 4, agent.explain()
    assert [e.get("ancestors", [])[:1] for e in (decisions[0], decisions[3])] == [[PYTHON]] * 2, agent.explain()
    assert all("LD_PRELOAD" in e["detail"] for e in decisions[1:3]), agent.explain()
    assert len(w.accepts(w.p1)) == before, agent.explain()  # nothing reached the host
    growth = max(rss) - rss[0]
    print(f"churn {seen['churned']['seconds']} s; boundary VmRSS {rss[0]} KiB, peak +{growth} KiB")
    assert growth < RSS_GROWTH_BOUND_KIB, (rss[0], max(rss))
