"""Attacks on the egress path from the agent's side (issue 4, "Bad input and attacks").

Every test runs real attack code as the agent (uid 1000, in its own network namespace) in dev mode and
asserts two things: the attack failed where the agent can see it, and the daemons' events say so. Where the
attack is "make control dial something it must not", a trap listens there and must stay empty.
Nothing leaves the machine: the only upstream is the test host, the only resolver the test's.
"""

from __future__ import annotations

from typing import Any

from tests.e2e.attack_world import (
    AFTER_EOF_PORT,
    ECHO_PORT,
    RESET_PORT,
    SERVER_FIRST_PORT,
    UDP_PORT,
    Agent,
    AttackWorld,
    attack_world,
)

__all__ = ["attack_world"]  # the module-scoped fixture

PYTHON = "/usr/bin/python3.11"  # the identity of the agent's interpreter (/usr/bin/python3 is a symlink)


def _decision(agent: Agent, destination: str, capture: str = "transparent") -> dict[str, Any]:
    found = agent.egress(destination, capture)
    assert len(found) == 1, f"expected one egress event for {destination}, got {found}\n{agent.explain()}"
    return found[0]


def test_direct_dials_are_captured_and_decided(attack_world: AttackWorld) -> None:
    """An agent ignoring the proxy env and dialling addresses: every TCP connection lands on a capture
    listener and is decided; the port of the proxy on a routable address has no listener at all."""
    w = attack_world
    before = len(w.accepts(ECHO_PORT))
    agent = w.run_agent("""
for name, host, port in [("ip-not-allowed", HOST, CONFIG["echo"]), ("ip-allowed", HOST, CONFIG["p1"]),
                         ("loopback-capture-port", "127.0.0.1", 8000), ("loopback-trap", "127.0.0.1", CONFIG["p1"]),
                         ("proxy-port-routable", HOST, 3128)]:
    sock = dial(host, port)
    if isinstance(sock, str):
        report(name, connect=sock)
    else:
        report(name, connect="ok", **(echo_check(sock) if name == "ip-allowed" else wait_end(sock)))
for name, authority in [("connect-proxy-itself", "127.0.0.1:3128"), ("connect-loopback-trap", f"127.0.0.1:{CONFIG['p1']}")]:
    sock, answer = tunnel(authority)
    report(name, **(answer or {"status": 200}))
    if sock:
        sock.close()
report("forward-proxy-itself", **proxy_raw(b"GET http://127.0.0.1:3128/ HTTP/1.1\\r\\nHost: 127.0.0.1:3128\\r\\n\\r\\n"))
""")
    p = agent.probes
    assert agent.result.returncode == 0, agent.explain()
    # captured, decided as the IP literal it is, denied, reset; the host never saw it
    assert p["ip-not-allowed"] == {"connect": "ok", "end": "reset", "data": ""}, agent.explain()
    denied = _decision(agent, f"{w.host.address}:{ECHO_PORT}")
    assert (denied["decision"], denied["reason"], denied["capture"]) == ("deny", "no-matching-endpoint", "transparent")
    assert denied["binary"] == PYTHON
    assert len(w.accepts(ECHO_PORT)) == before
    # the same path allows what the policy allows: proof that the denial above was a decision
    assert p["ip-allowed"]["end"] == "eof" and p["ip-allowed"]["data"] == "ping", agent.explain()
    allowed = _decision(agent, f"{w.host.address}:{w.p1}")
    assert (allowed["decision"], allowed["rule"], allowed["resolved"]) == ("allow", "hostless", w.host.address)
    # loopback of the agent's namespace is captured too (0.0.0.0 listeners) and decided
    assert p["loopback-capture-port"] == {"connect": "ok", "end": "reset", "data": ""}, agent.explain()
    assert _decision(agent, "127.0.0.1:8000")["decision"] == "deny"
    assert p["loopback-trap"] == {"connect": "ok", "end": "reset", "data": ""}, agent.explain()
    trap_event = _decision(agent, f"127.0.0.1:{w.p1}")
    assert (trap_event["decision"], trap_event["reason"]) == ("deny", "always-blocked"), trap_event
    assert p["proxy-port-routable"] == {"connect": "refused"}, agent.explain()
    # the proxy listener asked to reach itself or loopback
    assert p["connect-proxy-itself"]["status"] == 403, agent.explain()
    assert _decision(agent, "127.0.0.1:3128", "connect")["reason"] == "no-matching-endpoint"
    assert _decision(agent, "127.0.0.1:3128", "http-forward")["reason"] == "no-matching-endpoint"
    assert p["connect-loopback-trap"]["status"] == 403, agent.explain()
    assert p["connect-loopback-trap"]["body"]["reason"] == "always-blocked"
    assert _decision(agent, f"127.0.0.1:{w.p1}", "connect")["reason"] == "always-blocked"
    assert p["forward-proxy-itself"]["status"] == 403, agent.explain()
    assert w.trap_any_host.reached() == [] and w.trap_named.reached() == []
