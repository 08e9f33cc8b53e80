"""Control's proxy-pod listener before any policy work, in process over loopback sockets: the head
deadline, the total connection cap, ``--proxy-clients`` and malformed heads — each answered without a decision
and logged as ``proxy.refused``."""

from __future__ import annotations

import base64
import ipaddress
import json
from typing import Any

import trio

from supervisor.control.egress import EgressService
from supervisor.control.policy import PolicyStore, compile_policy, load_policy_text
from supervisor.control.proxy_listener import ProxyListenConfig, ProxyListener
from supervisor.control.upstream import UpstreamConfig
from supervisor.jsonlog import JsonLog

TOKEN = "limits-test-token-0123456789"
AUTH = b"Proxy-Authorization: Basic " + base64.b64encode(f"sandbox:{TOKEN}".encode()) + b"\r\n"


class _Log(JsonLog):
    def __init__(self) -> None:
        super().__init__("control", stream=None)
        self.events: list[dict[str, Any]] = []

    def emit(self, event: str, **fields: Any) -> None:  # type: ignore[override]
        self.events.append({"event": event, **fields})


def _listener(**overrides: Any) -> tuple[ProxyListener, _Log]:
    log = _Log()
    store = PolicyStore(compile_policy(load_policy_text("version: 1\nnetwork_policies: {}\n", "t.yaml")),
                        source="t.yaml")  # fmt: skip
    egress = EgressService(store, UpstreamConfig(dns_servers=[("127.0.0.1", 9)]), log, relaxed=True)
    cfg = ProxyListenConfig(host="127.0.0.1", port=0, token=TOKEN, **overrides)
    return ProxyListener(cfg, egress, log), log


async def _read_all(stream: trio.SocketStream) -> bytes:
    data = b""
    with trio.fail_after(10):
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data


async def _exchange(listener: ProxyListener, payload: bytes) -> bytes:
    assert listener.bound is not None
    stream = await trio.open_tcp_stream(*listener.bound)
    await stream.send_all(payload)
    return await _read_all(stream)


def _refusals(log: _Log) -> list[str]:
    return [e["reason"] for e in log.events if e["event"] == "proxy.refused"]


async def test_head_deadline_answers_408(nursery: trio.Nursery) -> None:
    listener, log = _listener(head_timeout=0.3)
    await nursery.start(listener.serve)
    assert listener.bound is not None
    stream = await trio.open_tcp_stream(*listener.bound)
    await stream.send_all(b"CONNECT api.test:443 HTTP/1.1\r\n")  # never finished
    answer = await _read_all(stream)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert _refusals(log) == ["head-timeout"]
    assert listener.active == 0


async def test_total_cap_answers_503_and_frees_its_slot(nursery: trio.Nursery) -> None:
    listener, log = _listener(max_connections=2)
    await nursery.start(listener.serve)
    assert listener.bound is not None
    held = [await trio.open_tcp_stream(*listener.bound) for _ in range(2)]
    with trio.fail_after(5):
        while listener.active < 2:  # noqa: ASYNC110 - polling the listener's counter
            await trio.sleep(0.01)
    answer = await _exchange(listener, b"CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\n" + AUTH + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 503 ")
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"] == "too_many_connections"
    for stream in held:
        await stream.aclose()
    with trio.fail_after(5):
        while listener.active:  # noqa: ASYNC110 - polling the listener's counter
            await trio.sleep(0.01)
    # a slot is free again: the next client reaches the decision (deny-all: 403), not the cap
    answer = await _exchange(listener, b"CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\n" + AUTH + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 403 ")
    assert _refusals(log).count("too-many-connections") == 1


async def test_clients_outside_the_allowed_networks_are_refused(nursery: trio.Nursery) -> None:
    listener, log = _listener(clients=(ipaddress.ip_network("10.0.0.0/8"),))
    await nursery.start(listener.serve)
    answer = await _exchange(listener, b"CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\n" + AUTH + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 403 ")
    assert _refusals(log) == ["client-not-allowed"]
    assert not [e for e in log.events if e["event"] == "egress"]  # no decision was made


async def test_malformed_head_and_token_checked_before_any_decision(nursery: trio.Nursery) -> None:
    listener, log = _listener()
    await nursery.start(listener.serve)
    assert (await _exchange(listener, b"\x16\x03\x01\x00\x05hello")).startswith(b"HTTP/1.1 400 ")
    answer = await _exchange(listener, b"CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 407 ") and b"Proxy-Authenticate: Basic" in answer
    assert _refusals(log) == ["malformed-head", "proxy-token-missing"]
    assert not [e for e in log.events if e["event"] == "egress"]


def _port_free_on_both_families() -> int:
    import socket

    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        probe.bind(("::", 0))
        port: int = probe.getsockname()[1]
    return port


async def test_star_listens_on_every_address_ipv4_and_ipv6(nursery: trio.Nursery) -> None:
    """``--proxy-listen *:PORT`` (what ``k8s render --topology proxy-pod`` passes): both families answer, and
    each still wants the token."""
    import socket

    if not socket.has_ipv6:
        import pytest

        pytest.skip("no IPv6 in this kernel")
    log = _Log()
    store = PolicyStore(compile_policy(load_policy_text("version: 1\nnetwork_policies: {}\n", "t.yaml")),
                        source="t.yaml")  # fmt: skip
    egress = EgressService(store, UpstreamConfig(dns_servers=[("127.0.0.1", 9)]), log, relaxed=True)
    port = _port_free_on_both_families()
    listener = ProxyListener(ProxyListenConfig(host="*", port=port, token=TOKEN), egress, log)
    await nursery.start(listener.serve)
    for address in ("127.0.0.1", "::1"):
        stream = await trio.open_tcp_stream(address, port)
        await stream.send_all(b"CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\n\r\n")
        assert (await _read_all(stream)).startswith(b"HTTP/1.1 407 "), address
    assert _refusals(log) == ["proxy-token-missing"] * 2
