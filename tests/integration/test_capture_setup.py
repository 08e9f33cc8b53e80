"""Capture setup in a real network namespace, tested from the agent's side.

Each test forks a child that ``unshare(CLONE_NEWNET)``s (a namespace holding only a down ``lo``), runs the
scenario there and reports JSON through a pipe. Nothing can leave: the namespace has no link but ``lo``, and
every address dialled is TEST-NET, private or link-local *inside that namespace*.
"""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import json
import os
import select
import signal
import socket
import traceback
from collections.abc import Callable
from typing import Any

import pytest

CLONE_NEWNET = 0x40000000
SO_REUSEPORT = getattr(socket, "SO_REUSEPORT", 15)


def in_new_netns(scenario: Callable[[], Any], *, timeout: float = 30.0) -> Any:
    """Run ``scenario`` in a forked child inside a fresh network namespace; returns its JSON result."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        code = 0
        try:
            os.close(read_end)
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(CLONE_NEWNET) != 0:
                payload = {"skip": f"unshare(CLONE_NEWNET) failed: {os.strerror(ctypes.get_errno())}"}
            else:
                try:
                    payload = {"result": scenario()}
                except BaseException as exc:
                    payload = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
            with os.fdopen(write_end, "w") as pipe:
                json.dump(payload, pipe)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    chunks: list[bytes] = []
    try:
        while True:
            ready, _, _ = select.select([read_end], [], [], timeout)
            if not ready:
                os.kill(pid, signal.SIGKILL)
                raise AssertionError("netns scenario timed out")
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    payload = json.loads(b"".join(chunks) or b'{"error": "child died without a report"}')
    if "skip" in payload:
        pytest.skip(payload["skip"])
    if "error" in payload:
        raise AssertionError(f"scenario failed in the namespace: {payload['error']}\n{payload.get('trace', '')}")
    result = payload["result"]
    if isinstance(result, dict) and "skip" in result and len(result) == 1:
        pytest.skip(result["skip"])
    return result


def _sock(fd: int) -> socket.socket:
    return socket.socket(fileno=os.dup(fd))


def _norm(endpoint: Any) -> tuple[str, int]:
    ip = ipaddress.ip_address(endpoint[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), int(endpoint[1])


def _dial(address: str, port: int, fds: dict[str, int]) -> dict[str, Any]:
    """Connect as the agent would and report which of our listeners accepted it, with which addresses."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    client = socket.socket(family, socket.SOCK_STREAM)
    client.settimeout(2)
    try:
        code = client.connect_ex((address, port))
        if code != 0:
            return {"outcome": "error", "errno": errno.errorcode.get(code, str(code))}
        mine = client.getsockname()[:2]
        streams = {name: _sock(fd) for name, fd in fds.items()}
        for name in [n for n, s in streams.items() if s.type != socket.SOCK_STREAM]:
            streams.pop(name).close()
        try:
            ready, _, _ = select.select(list(streams.values()), [], [], 2)
            for name, listener in streams.items():
                if listener not in ready:
                    continue
                conn, peer = listener.accept()
                with conn:
                    return {
                        "outcome": "accepted",
                        "listener": name,
                        "local": list(conn.getsockname()[:2]),
                        "peer_is_client": _norm(peer) == _norm(mine),
                    }
        finally:
            for listener in streams.values():
                listener.close()
        return {"outcome": "connected-elsewhere"}
    finally:
        client.close()


def scenario_dial_anything() -> dict[str, Any]:
    from supervisor.boundary.capture.setup import prepare

    fds, report = prepare(capture_ports=[22, 80, 443])
    targets = [
        ("198.51.100.7", 443),
        ("2001:db8::1", 80),
        ("10.0.0.1", 22),
        ("169.254.169.254", 80),
        ("127.0.0.1", 443),  # the capture port itself, dialled directly: still just a captured connection
        ("::ffff:203.0.113.9", 443),  # IPv4 hidden in IPv6 reaches the IPv4 listener with the IPv4 address
        ("fd00::1", 22),
        ("10.0.0.1", 25),  # no listener on 25
        ("2001:db8::1", 8080),
        ("8.8.8.8", 53),  # TCP/53 reaches the DNS stub's TCP listener, locally
    ]
    results = {f"{a}|{p}": _dial(a, p, fds) for a, p in targets}
    return {"report": report, "results": results}


def test_every_destination_lands_on_our_listener_or_is_refused() -> None:
    out = in_new_netns(scenario_dial_anything)
    assert out["report"]["ok"], out["report"]["problems"]
    r = out["results"]
    expected_listener = {
        "198.51.100.7|443": ("tcp4:443", "198.51.100.7"),
        "2001:db8::1|80": ("tcp6:80", "2001:db8::1"),
        "10.0.0.1|22": ("tcp4:22", "10.0.0.1"),
        "169.254.169.254|80": ("tcp4:80", "169.254.169.254"),
        "127.0.0.1|443": ("tcp4:443", "127.0.0.1"),
        "::ffff:203.0.113.9|443": ("tcp4:443", "203.0.113.9"),
        "fd00::1|22": ("tcp6:22", "fd00::1"),
        "8.8.8.8|53": ("dns-tcp4", "8.8.8.8"),
    }
    for key, (listener, local) in expected_listener.items():
        got = r[key]
        assert got["outcome"] == "accepted", (key, got)
        assert got["listener"] == listener, (key, got)
        assert got["local"] == [local, int(key.split("|")[1])], (key, got)  # the original destination
        assert got["peer_is_client"], (key, got)
    for key in ("10.0.0.1|25", "2001:db8::1|8080"):
        assert r[key] == {"outcome": "error", "errno": "ECONNREFUSED"}, (key, r[key])
    assert not any(v["outcome"] == "connected-elsewhere" for v in r.values())


def scenario_udp() -> dict[str, Any]:
    from supervisor.boundary.capture.pktinfo import destination_from_ancdata, source_ancdata
    from supervisor.boundary.capture.setup import prepare

    fds, _ = prepare(capture_ports=[443])
    out: dict[str, Any] = {}
    # UDP to a port other than 53 goes nowhere: refused by this namespace's own stack
    for address in ("198.51.100.7", "2001:db8::1"):
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.settimeout(1)
            s.connect((address, 123))
            s.send(b"ntp?")
            try:
                s.recv(10)
                out[f"udp123 {address}"] = "answered"
            except ConnectionRefusedError:
                out[f"udp123 {address}"] = "refused"
            except OSError as exc:
                out[f"udp123 {address}"] = f"error {exc}"
    # UDP to 53 of any address reaches the stub, which answers from the address that was queried
    for address, name in (("192.0.2.53", "dns-udp4"), ("2001:db8::53", "dns-udp6")):
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        stub = _sock(fds[name])
        with stub, socket.socket(family, socket.SOCK_DGRAM) as client:
            client.settimeout(2)
            client.connect((address, 53))  # a connected socket drops datagrams from any other source
            client.send(b"query")
            select.select([stub], [], [], 2)
            data, anc, _flags, peer = stub.recvmsg(512, socket.CMSG_SPACE(64))
            queried = destination_from_ancdata(anc)
            stub.sendmsg([b"answer:" + data], source_ancdata(queried or "0.0.0.0"), 0, peer)
            out[f"dns {address}"] = {"queried": queried, "reply": client.recv(64).decode()}
    return out


def test_udp_other_than_dns_goes_nowhere_and_dns_replies_come_from_the_queried_address() -> None:
    out = in_new_netns(scenario_udp)
    assert out["udp123 198.51.100.7"] == "refused"
    assert out["udp123 2001:db8::1"] == "refused"
    assert out["dns 192.0.2.53"] == {"queried": "192.0.2.53", "reply": "answer:query"}
    assert out["dns 2001:db8::53"] == {"queried": "2001:db8::53", "reply": "answer:query"}


def scenario_listener_properties() -> dict[str, Any]:
    from supervisor.boundary.capture.setup import prepare

    fds, report = prepare(capture_ports=[443, 8443], proxy_port=3128)
    props: dict[str, Any] = {}
    diag = fds.pop("sock_diag")  # the identity resolver's netlink socket, not a listener
    with socket.socket(fileno=diag) as netlink:
        props_diag = {"family": int(netlink.family), "proto": netlink.proto}
    for name, fd in fds.items():
        s = _sock(fd)
        with s:
            entry = {
                "blocking": os.get_blocking(fd),
                "reuseport": s.getsockopt(socket.SOL_SOCKET, SO_REUSEPORT),
                "listening": s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN),
                "bound": list(s.getsockname()[:2]),
                "type": "udp" if s.type == socket.SOCK_DGRAM else "tcp",
            }
            if s.family == socket.AF_INET6:
                entry["v6only"] = s.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY)
            props[name] = entry
    return {"props": props, "report": report, "sock_diag": props_diag}


def test_listeners_are_bound_listening_nonblocking_and_never_reuseport() -> None:
    out = in_new_netns(scenario_listener_properties)
    props = out["props"]
    assert set(props) == {
        "tcp4:443", "tcp6:443", "tcp4:8443", "tcp6:8443", "proxy", "dns-udp4", "dns-udp6", "dns-tcp4", "dns-tcp6",
    }  # fmt: skip
    for name, p in props.items():
        assert p["blocking"] is False, name
        assert p["reuseport"] == 0, name
        assert p["listening"] == (1 if p["type"] == "tcp" else 0), name
        if "v6only" in p:
            assert p["v6only"] == 1, name
    assert props["proxy"]["bound"] == ["127.0.0.1", 3128]
    assert props["tcp4:443"]["bound"] == ["0.0.0.0", 443]
    assert props["tcp6:8443"]["bound"] == ["::", 8443]
    assert props["dns-udp4"]["bound"] == ["0.0.0.0", 53]
    report = out["report"]
    assert report["routes_installed"] == ["local 0.0.0.0/0 dev lo table local", "local ::/0 dev lo table local"]
    assert len(report["fingerprint"]) == 64 and report["ok"] and report["mode"] == "anyip"
    assert out["sock_diag"] == {"family": int(socket.AF_NETLINK), "proto": 4}  # NETLINK_SOCK_DIAG


def scenario_inspect_flags_tampering() -> dict[str, Any]:
    import socket as s

    from pyroute2 import IPRoute

    from supervisor.boundary.capture.setup import inspect, prepare, probe

    _, report = prepare(capture_ports=[443])
    out: dict[str, Any] = {"prepared": report["fingerprint"], "clean": inspect(expect_anyip=True)}
    out["again"] = inspect(expect_anyip=True)["fingerprint"]
    with IPRoute() as ipr:
        lo = ipr.link_lookup(ifname="lo")[0]
        ipr.route("add", dst="10.9.0.0/16", oif=lo)  # a unicast route, even via lo, is not ours
        out["route"] = inspect(expect_anyip=True)
        ipr.route("del", dst="10.9.0.0/16", oif=lo)
        ipr.rule("add", table=100, priority=100, src="10.1.0.0", src_len=16)
        out["rule"] = inspect(expect_anyip=True)
        ipr.rule("del", table=100, priority=100, src="10.1.0.0", src_len=16)
        ipr.route("del", dst="0.0.0.0/0", type="local", table=255, oif=lo, scope=254, family=s.AF_INET)
        out["no_anyip"] = inspect(expect_anyip=True)
        ipr.route("add", dst="0.0.0.0/0", type="local", table=255, oif=lo, scope=254, family=s.AF_INET)
        out["restored"] = inspect(expect_anyip=True)
        links: dict[str, Any] = {}
        for kind, args in (("dummy", {}), ("veth", {"peer": "veth-peer"})):
            name = f"{kind}-x"
            try:
                ipr.link("add", ifname=name, kind=kind, **args)
            except Exception as exc:  # the kernel may lack the module
                links[kind] = {"skipped": str(exc)}
                continue
            links[kind] = {"inspect": inspect(), "probe": probe(address="192.0.2.1", port=443)}
            ipr.link("del", index=ipr.link_lookup(ifname=name)[0])
        out["links"] = links
    return out


def test_inspect_is_stable_and_flags_every_kind_of_tampering() -> None:
    out = in_new_netns(scenario_inspect_flags_tampering)
    clean = out["clean"]
    assert clean["ok"] and clean["problems"] == []
    assert clean["anyip"] == {"ipv4": True, "ipv6": True}
    assert [link["name"] for link in clean["links"]] == ["lo"]
    assert out["prepared"] == clean["fingerprint"] == out["again"]
    assert not out["route"]["ok"] and any("10.9.0.0/16" in p for p in out["route"]["problems"])
    assert not out["rule"]["ok"] and any("unexpected rule" in p for p in out["rule"]["problems"])
    assert not out["no_anyip"]["ok"]
    assert "any-IP route local 0.0.0.0/0 is missing" in out["no_anyip"]["problems"]
    assert out["restored"]["ok"]
    fingerprints = {out[k]["fingerprint"] for k in ("route", "rule", "no_anyip")}
    assert clean["fingerprint"] not in fingerprints and len(fingerprints) == 3
    tested = 0
    for kind, result in out["links"].items():
        if "skipped" in result:
            continue
        tested += 1
        assert not result["inspect"]["ok"], kind
        assert any(p.startswith(f"unexpected link {kind}-x") for p in result["inspect"]["problems"]), kind
        assert result["inspect"]["fingerprint"] != clean["fingerprint"]
        # the probe refuses to send anything while a foreign link exists
        assert result["probe"]["ok"] is False and "links besides lo" in result["probe"]["error"]
    if tested == 0:
        pytest.skip(f"neither dummy nor veth links can be created here: {out['links']}")


def scenario_probe() -> dict[str, Any]:
    from supervisor.boundary.capture.setup import prepare, probe

    out: dict[str, Any] = {"before": probe(address="192.0.2.1", port=443)}
    fds, _ = prepare(capture_ports=[443])
    out["default"] = probe()
    out["v4"] = probe(address="198.51.100.7", port=443, expect_listener_port=443, listeners=fds)
    out["v6"] = probe(address="2001:db8::1", port=443, expect_listener_port=443, listeners=fds)
    out["wrong_expectation"] = probe(address="192.0.2.1", port=9, expect_listener_port=443)
    try:
        probe(address="8.8.8.8", port=443)
        out["public"] = "sent"
    except ValueError as exc:
        out["public"] = f"refused: {exc}"
    # the probe drained its own connection: nothing is left queued for the boundary
    queued = []
    for name, fd in fds.items():
        s = _sock(fd)
        with s:
            if s.type == socket.SOCK_STREAM and select.select([s], [], [], 0)[0]:
                queued.append(name)
    out["queued"] = queued
    return out


def test_probe_lands_on_our_listener_and_never_leaves() -> None:
    out = in_new_netns(scenario_probe)
    # before setup the namespace has no route at all: nothing captured, and not ok
    assert out["before"]["ok"] is False and out["before"]["captured"] is False
    assert out["before"]["error"] == "ENETUNREACH"
    assert out["default"]["ok"] and out["default"]["refused"] and out["default"]["udp"]["refused"]
    for key, local in (("v4", "198.51.100.7:443"), ("v6", "[2001:db8::1]:443")):
        assert out[key]["ok"] and out[key]["captured"], out[key]
        assert out[key]["local"] == local
        assert out[key]["accepted_by"] == ("tcp4:443" if key == "v4" else "tcp6:443")
    assert out["wrong_expectation"]["ok"] is False
    assert out["public"].startswith("refused")
    assert out["queued"] == []


def scenario_bad_arguments() -> dict[str, str]:
    from supervisor.boundary.capture.setup import CaptureSetupError, prepare

    out: dict[str, str] = {}
    cases: dict[str, dict[str, Any]] = {
        "dns clash": {"capture_ports": [53, 443]},
        "proxy clash": {"capture_ports": [3128]},
        "no ports": {"capture_ports": []},
        "port zero": {"capture_ports": [0]},
    }
    for name, kwargs in cases.items():
        try:
            prepare(**kwargs)
            out[name] = "accepted"
        except (ValueError, CaptureSetupError) as exc:
            out[name] = type(exc).__name__
    return out


def test_prepare_refuses_bad_arguments() -> None:
    out = in_new_netns(scenario_bad_arguments)
    for name in ("dns clash", "proxy clash", "no ports", "port zero"):
        assert out[name] == "ValueError", name
