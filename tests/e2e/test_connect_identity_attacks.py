"""Identity fixed at connect (issue 16), attacked from the agent's side through dev mode and control's policy.

The policy lets only curl and sh (with their descendants) reach the test host's echo port; the agent is
python. Each attack makes python's connection look like curl's or sh's to an accept-time resolver; control must
decide every one of them as python's (denied), while curl itself and a real descendant of sh stay allowed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from typing import Any

import pytest

from supervisor.boundary.capture import connect_notify
from tests.e2e.attack_world import AttackWorld, attack_world

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


def _world(w: AttackWorld) -> AttackWorld:
    policy = w.policy.with_name("connect-identity-policy.yaml")
    policy.write_text(POLICY.format(p1=w.p1, address=w.host.address, sh=SH))
    return dataclasses.replace(w, policy=policy)


def test_every_borrowed_allowance_is_decided_as_the_connector(attack_world: AttackWorld) -> None:
    w = _world(attack_world)
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
