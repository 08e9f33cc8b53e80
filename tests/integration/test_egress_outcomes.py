"""Every way an egress connection can end writes exactly one ``egress`` decision event and moves exactly one
counter (control/connection_result.py), driven through ``EgressService`` in process: a fake link stream on the
agent's side, loopback sockets (or nothing) on the upstream side. Also: the dial's one deadline, set by the
caller, ends as ``connect-timeout`` naming the step it ran out in (control/upstream.py rule 6)."""

from __future__ import annotations

import functools
import socket
from collections.abc import Awaitable, Callable, Sequence
from ipaddress import IPv4Address, IPv6Address
from typing import Any

import pytest
import trio
import trio.testing

from supervisor.control.egress import EgressService
from supervisor.control.policy import Decision, PolicyStore, compile_policy, load_policy_text
from supervisor.control.upstream import UpstreamConfig
from supervisor.jsonlog import JsonLog
from supervisor.protocol.egress import CaptureKind, EgressRequest, decode_reply_headers, encode_connect_headers
from supervisor.protocol.identity import ConnectionIdentity
from tests.unit.policy_helpers import doc, rule

RELAYED = {"host": "relay.test", "port": 443, "tls": "skip"}
INSPECTED = {"host": "rules.test", "port": 443, "protocol": "rest", "enforcement": "enforce", "access": "read-only"}
RESOLVED = {"host": "dns.test", "port": 443, "tls": "skip"}
NAMED = {"host": "internal.test", "port": 443, "tls": "skip", "allowed_ips": ["10.0.0.0/8"]}


class _Log(JsonLog):
    def __init__(self) -> None:
        super().__init__("control", stream=None)
        self.events: list[dict[str, Any]] = []

    def emit(self, event: str, **fields: Any) -> None:  # type: ignore[override]
        self.events.append({"event": event, **{k: v for k, v in fields.items() if v is not None}})


class _AgentSide(trio.abc.HalfCloseableStream):
    """The CONNECT stream as the egress service sees it: headers in, a reply head out, then bytes both ways
    (one end of a memory stream pair; the test holds the other)."""

    def __init__(self, headers: list[tuple[str, str]], *, broken_reply: bool = False) -> None:
        self.headers = headers
        self.reply: list[tuple[str, str]] | None = None
        self.was_reset = False
        self._broken_reply = broken_reply
        self.inner, self.agent = trio.testing.memory_stream_pair()
        self.replied = trio.Event()

    def header(self, name: str, default: str | None = None) -> str | None:
        return next((v for k, v in self.headers if k == name), default)

    async def send_headers(
        self, headers: Sequence[tuple[str, str]], *, end_stream: bool = False, now: bool = False
    ) -> None:
        if self._broken_reply:
            raise trio.BrokenResourceError("the boundary reset the stream")
        self.reply = list(headers)
        self.replied.set()
        await trio.lowlevel.checkpoint()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def reset(self) -> None:
        self.was_reset = True
        await self.inner.aclose()

    @property
    def status(self) -> int:
        assert self.reply is not None
        return decode_reply_headers(self.reply).status


def _store(*endpoints: dict[str, Any]) -> PolicyStore:
    text = doc({f"r{i}": rule(endpoint) for i, endpoint in enumerate(endpoints)})
    return PolicyStore(compile_policy(load_policy_text(text, "t.yaml")), source="t.yaml")


def _request(host: str, port: int = 443) -> EgressRequest:
    return EgressRequest(host=host, port=port, capture=CaptureKind.CONNECT, identity=None, conn_id="c1", src_port=1)


Dial = Callable[[EgressRequest, "str | None", Decision], Awaitable[tuple[trio.SocketStream, Any]]]


class _Service(EgressService):
    """The service with its upstream dial replaced where a test needs a reachable (loopback) upstream, which
    the real vetting would refuse as always-blocked."""

    dial_to: Dial | None = None

    async def _dial(
        self, request: EgressRequest, name: str | None, decision: Decision
    ) -> tuple[trio.SocketStream, IPv4Address | IPv6Address]:
        if self.dial_to is not None:
            stream, _ = await self.dial_to(request, name, decision)
            return stream, IPv4Address("127.0.0.1")
        return await super()._dial(request, name, decision)


def _service(*endpoints: dict[str, Any], **upstream: Any) -> tuple[_Service, _Log]:
    log = _Log()
    cfg = UpstreamConfig(dns_servers=[("127.0.0.1", 9)], **upstream)
    return _Service(_store(RELAYED, INSPECTED, RESOLVED, NAMED, *endpoints), cfg, log, relaxed=True), log


def _decisions(log: _Log) -> list[dict[str, Any]]:
    return [e for e in log.events if e["event"] == "egress"]


def _one(log: _Log, service: EgressService) -> dict[str, Any]:
    events = _decisions(log)
    assert len(events) == 1, events
    counted = {k: v for k, v in service.counters.items() if k != "dns" and v}
    expected = {"allow": "allowed", "deny": "denied", "error": "failed"}[events[0]["decision"]]
    assert counted == {expected: 1}, (counted, events)
    return events[0]


async def _loopback_upstream(nursery: trio.Nursery, handler: Callable[[trio.SocketStream], Awaitable[None]]) -> Dial:
    listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]

    async def dial(request: EgressRequest, name: str | None, decision: Decision) -> tuple[trio.SocketStream, Any]:
        return await trio.open_tcp_stream("127.0.0.1", port), None

    return dial


# -- refusals before anything is dialled ----------------------------------------------------------------------


async def test_malformed_request() -> None:
    service, log = _service()
    stream = _AgentSide([(":method", "CONNECT"), (":authority", "relay.test:443")])  # no capture, identity…
    await service.handle(stream)  # type: ignore[arg-type]
    event = _one(log, service)
    assert (event["decision"], event["reason"], stream.status) == ("deny", "malformed-request", 400)


async def test_policy_denial() -> None:
    service, log = _service()
    stream = _AgentSide([])
    await service.serve(stream, _request("nowhere.test"))  # type: ignore[arg-type]
    event = _one(log, service)
    assert (event["decision"], event["destination"], stream.status) == ("deny", "nowhere.test:443", 403)


async def test_inspection_unavailable() -> None:
    service, log = _service()
    stream = _AgentSide([])
    await service.serve(stream, _request("rules.test"))  # type: ignore[arg-type]
    event = _one(log, service)
    assert (event["decision"], event["reason"], stream.status) == ("deny", "l7-inspection-unavailable", 403)


async def test_vetting_refusal_is_a_denial() -> None:
    service, log = _service()
    stream = _AgentSide([])
    await service.serve(stream, _request("127.0.0.1"))  # type: ignore[arg-type]  (not in the policy: denied)
    await service.serve(_AgentSide([]), _request("2130706433"))  # type: ignore[arg-type]
    events = _decisions(log)
    assert [e["decision"] for e in events] == ["deny", "deny"]
    assert service.counters["denied"] == 2 and service.counters["allowed"] == service.counters["failed"] == 0


async def test_resolution_failure_is_an_error() -> None:
    service, log = _service()  # DNS server 127.0.0.1:9: nothing listens
    stream = _AgentSide([])
    await service.serve(stream, _request("dns.test"))  # type: ignore[arg-type]
    event = _one(log, service)
    assert event["decision"] == "error" and event["reason"] in ("resolve-failed", "resolve-timeout")
    assert stream.status in (502, 504)


async def test_dial_deadline_names_the_step_it_ran_out_in() -> None:
    """One deadline, set by the egress service: a DNS server that never answers, a connect budget shorter than
    DNS's own; the answer is connect-timeout (504) and says it ran out while resolving."""
    with trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        await silent.bind(("127.0.0.1", 0))
        port = silent.getsockname()[1]
        log = _Log()
        cfg = UpstreamConfig(dns_servers=[("127.0.0.1", port)], connect_timeout=0.3, resolve_timeout=30)
        service = EgressService(_store(RESOLVED), cfg, log, relaxed=True)
        stream = _AgentSide([])
        started = trio.current_time()
        await service.serve(stream, _request("dns.test"))  # type: ignore[arg-type]
        assert trio.current_time() - started < 5
    event = _one(log, service)
    assert (event["decision"], event["reason"], stream.status) == ("error", "connect-timeout", 504)
    assert "0.3s budget" in event["detail"] and "resolving dns.test" in event["detail"], event["detail"]


# -- admitted connections -----------------------------------------------------------------------------------


async def test_allowed_connection_recorded_once_when_it_closes(nursery: trio.Nursery) -> None:
    async def echo_once(upstream: trio.SocketStream) -> None:
        data = await upstream.receive_some(100)
        await upstream.send_all(data.upper())
        await upstream.send_eof()

    service, log = _service()
    service.dial_to = await _loopback_upstream(nursery, echo_once)
    stream = _AgentSide([])
    async with trio.open_nursery() as inner:
        inner.start_soon(service.serve, stream, _request("relay.test"))
        await stream.replied.wait()
        assert stream.status == 200 and _decisions(log) == []  # written when it closes
        assert service.counters["allowed"] == 1  # counted when admitted
        await stream.agent.send_all(b"hello")
        await stream.agent.send_eof()
        got = b""
        while chunk := await stream.agent.receive_some():
            got += chunk
    assert got == b"HELLO"
    event = _one(log, service)
    assert event["decision"] == "allow" and event["bytes_out"] == 5 and event["bytes_in"] == 5
    assert "duration_ms" in event and event["closed_by"]


async def test_a_relayed_tunnel_keeps_its_decoded_request_not_the_raw_headers(nursery: trio.Nursery) -> None:
    """The CONNECT headers are decoded once; the raw list (~1.5 KB of strings) is not held while the tunnel
    lives (docs/performance.md "Where each target stands")."""

    async def echo_once(upstream: trio.SocketStream) -> None:
        await upstream.send_all(await upstream.receive_some(100))
        await upstream.send_eof()

    service, log = _service()
    service.dial_to = await _loopback_upstream(nursery, echo_once)
    identity = ConnectionIdentity("/usr/bin/curl", None, (), (), pid=7, start_time=1, uid=1000, owners=1,
                                  resolved_in_us=5)  # fmt: skip
    headers = encode_connect_headers("relay.test", 443, capture=CaptureKind.CONNECT, identity=identity,
                                     conn_id="c1", src_port=1)  # fmt: skip
    stream = _AgentSide(headers)
    async with trio.open_nursery() as inner:
        inner.start_soon(service.handle, stream)
        await stream.replied.wait()
        assert stream.status == 200
        assert stream.headers == []  # relaying now, from the decoded request alone
        await stream.agent.send_all(b"ping")
        await stream.agent.send_eof()
        assert await stream.agent.receive_some(100) == b"ping"
    assert _one(log, service)["binary"] == "/usr/bin/curl"


async def test_cancelled_while_relaying_is_recorded_as_allowed_and_cancelled(nursery: trio.Nursery) -> None:
    async def silent(upstream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    service, log = _service()
    service.dial_to = await _loopback_upstream(nursery, silent)
    stream = _AgentSide([])
    async with trio.open_nursery() as inner:
        inner.start_soon(service.serve, stream, _request("relay.test"))
        await stream.replied.wait()
        inner.cancel_scope.cancel()  # the link went away
    event = _one(log, service)
    assert (event["decision"], event["closed_by"]) == ("allow", "cancelled")


async def test_cancelled_before_the_decision_is_an_error() -> None:
    dialling = trio.Event()

    async def hang(request: EgressRequest, name: str | None, decision: Decision) -> tuple[trio.SocketStream, Any]:
        dialling.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    service, log = _service()
    service.dial_to = hang
    async with trio.open_nursery() as inner:
        inner.start_soon(service.serve, _AgentSide([]), _request("relay.test"))
        await dialling.wait()
        inner.cancel_scope.cancel()
    event = _one(log, service)
    assert (event["decision"], event["reason"]) == ("error", "cancelled")


async def test_reply_that_cannot_be_sent_still_records_once() -> None:
    service, log = _service()
    with pytest.raises(trio.BrokenResourceError):
        await service.serve(_AgentSide([], broken_reply=True), _request("nowhere.test"))  # type: ignore[arg-type]
    assert _one(log, service)["decision"] == "deny"


async def test_policy_revision_cut_is_recorded_once(nursery: trio.Nursery) -> None:
    async def silent(upstream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    service, log = _service()
    service.dial_to = await _loopback_upstream(nursery, silent)
    stream = _AgentSide([])
    async with trio.open_nursery() as inner:
        inner.start_soon(service.serve, stream, _request("relay.test"))
        await stream.replied.wait()
        await trio.testing.wait_all_tasks_blocked()  # relaying (the connection is live) before the revision
        assert service.live_connections == 1
        service.store.apply_text(doc({"other": rule(RESOLVED)}), "revision")  # relay.test no longer allowed
    event = _one(log, service)
    assert (event["decision"], event["closed_by"]) == ("allow", "policy-revision")
    assert stream.was_reset
