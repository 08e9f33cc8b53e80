"""``/metrics`` and the §4.3 activity counters, from the daemons' event sinks (control/metrics.py,
boundary/metrics.py, supervisor/metrics.py).

The attacker's side: the agent chooses hosts, ports, methods, paths, binaries, SNI names and the text of its
requests; none of it may become a label, or every new value would be a new series in the operator's Prometheus
(and the agent's traffic readable there). The flood sends 10,000 distinct ones of each through the same event
builder the daemons use and asserts the series count did not move and none of the values is on the page."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from prometheus_client import CollectorRegistry, generate_latest

from supervisor.boundary.limits_report import LimitsReport
from supervisor.boundary.metrics import BoundaryMetrics
from supervisor.control.metrics import ControlMetrics, classify
from supervisor.control.policy import PolicyStore, compile_policy, load_policy_text
from supervisor.jsonlog import JsonLog
from supervisor.metrics import MetricsServer
from supervisor.protocol.activity import DenyGroup
from supervisor.protocol.event_names import EventName
from supervisor.protocol.event_record import Event
from tests.unit.policy_helpers import CURL, doc, rule

FLOOD = 10_000
POLICY = doc({"api": rule({"host": "api.test", "port": 443}, binaries=(CURL,)),
              "pkgs": rule({"host": "pkgs.test", "port": 443}, binaries=(CURL,))})  # fmt: skip


def _store(text: str = POLICY) -> PolicyStore:
    return PolicyStore(compile_policy(load_policy_text(text, "test.yaml")), source="test.yaml")


class _Boundary:
    lifecycle_state = "running"
    policy_generation_acked = 0

    def limits_now(self) -> LimitsReport:
        return LimitsReport("", "64m", "64m", pids=512, pids_cgroup="cgroup v2 /sys/fs/cgroup/w", pids_current=3,
                            memory=1 << 30, memory_cgroup="cgroup v2 /sys/fs/cgroup/w", memory_current=1 << 20,
                            memory_oom_kills=0)  # fmt: skip


def _series(registry: CollectorRegistry) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {(s.name, tuple(sorted(s.labels.items()))) for m in registry.collect() for s in m.samples}


def _event(kind: EventName, component: str = "control", /, **fields: Any) -> Event:
    return Event.build(kind, component, "sb", **fields)


def _control_events(i: int) -> list[Event]:
    """One of each decision shape control writes, with the agent's choices all distinct per ``i``."""
    host, port, binary = f"h{i}.evil.test", 1024 + i % 60000, f"/tmp/w/bin{i}"
    method, path = f"M{i}", f"/p/{i}?q={i}"
    who = {"binary": binary, "ancestors": [f"/tmp/a{i}"], "cmdline_paths": [f"/tmp/c{i}"], "pid": i, "conn_id": str(i)}
    return [
        _event(
            EventName.EGRESS,
            decision="deny",
            destination=f"{host}:{port}",
            capture="connect",
            reason="no-matching-endpoint",
            detail=f"nothing for {host}:{port} by {binary}",
            **who,
        ),
        _event(
            EventName.EGRESS,
            decision="deny",
            destination=f"{host}:{port}",
            capture="http-forward",
            reason=f"made-up-{i}",
            **who,
        ),  # a reason outside every catalogue: "other", never itself
        _event(
            EventName.EGRESS,
            decision="deny",
            destination=f"{host}:{port}",
            capture="transparent",
            reason="internal-address",
            name=host,
            **who,
        ),
        _event(
            EventName.EGRESS,
            decision="allow",
            destination=f"api.test:{port}",
            rule=f"rule-{i}",
            bytes_out=i + 1,
            bytes_in=2 * i + 1,
            **who,
        ),  # a rule that is no key of the policy: "-"
        _event(
            EventName.EGRESS,
            decision="allow",
            destination="api.test:443",
            rule="api",
            inspected=True,
            bytes_out=1,
            bytes_in=1,
            **who,
        ),
        _event(
            EventName.HTTP,
            decision="deny",
            destination=f"{host}:{port}",
            method=method,
            path=path,
            reason="l7-no-allow-rule",
            rule="api",
            l7_rule=f"rules[{i}]",
            operation=f"tools/call t{i}",
            model=f"model-{i}",
            sni=host,
            **who,
        ),
        _event(
            EventName.HTTP,
            decision="allow",
            destination="api.test:443",
            method=method,
            path=path,
            rule="api",
            status=200 + i % 300,
            **who,
        ),
        _event(
            EventName.HTTP_TUNNEL,
            destination=f"{host}:{port}",
            stage="refused",
            reason="invalid-client-hello",
            detail=f"sni {host}",
        ),
        _event(EventName.DNS, name=host, qtype="A", decision="refused", reason=f"no endpoint for {host}"),
        _event(EventName.EGRESS_REVOKED, destination=f"{host}:{port}", reason="no-matching-endpoint", conn_id=str(i)),
        _event(EventName.LINK_FAILED, peer=f"{host}:{port}", alpn="openshell-egress/1", reason=f"r{i}"),
    ]


def _boundary_events(i: int) -> list[Event]:
    return [
        _event(
            EventName.EGRESS_REFUSED,
            "boundary",
            reason="identity-unresolved: no-record",
            destination=f"h{i}.test:{i % 65535}",
            detail=f"/tmp/w/bin{i}",
        ),
        _event(EventName.EGRESS_REFUSED, "boundary", reason=f"identity-unresolved: x{i}"),
        _event(EventName.EGRESS_REFUSED, "boundary", reason=f"link-failed {i}", destination=f"h{i}.test:1"),
        _event(
            EventName.PROCESS_STARTED,
            "boundary",
            handle=f"p_{i}",
            kind="exec",
            start_ms=i % 50,
            argv=[f"/tmp/w/bin{i}", f"--x={i}"],
        ),
        _event(EventName.PROCESS_START_FAILED, "boundary", stage=f"s{i}", reason=f"/tmp/w/bin{i}: not found"),
    ]


def test_a_flood_of_agent_chosen_values_adds_no_series() -> None:
    metrics = ControlMetrics(_store(), JsonLog("control", stream=None, to_stream=False))
    boundary = BoundaryMetrics(JsonLog("boundary", stream=None, to_stream=False), _Boundary())
    for event in _control_events(0):
        metrics.observe(event)
    for event in _boundary_events(0):
        boundary.observe(event)
    control_before, boundary_before = _series(metrics.registry), _series(boundary.registry)
    for i in range(1, FLOOD + 1):
        for event in _control_events(i):
            metrics.observe(event)
        for event in _boundary_events(i):
            boundary.observe(event)
    assert _series(metrics.registry) == control_before
    assert _series(boundary.registry) == boundary_before
    page = generate_latest(metrics.registry).decode() + generate_latest(boundary.registry).decode()
    for needle in (f"h{FLOOD}.evil.test", f"/tmp/w/bin{FLOOD}", f"M{FLOOD}", f"model-{FLOOD}", f"rule-{FLOOD}",
                   f"made-up-{FLOOD}", f"x{FLOOD}", f"s{FLOOD}", str(1024 + FLOOD % 60000)):  # fmt: skip
        assert needle not in page
    # the counts still add up: every connection and request counted, by the labels that are allowed
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for m in metrics.registry.collect()
               for s in m.samples}  # fmt: skip
    key = ("openshell_connections_total", (("daemon", "control"), ("decision", "deny"), ("deny_group", "ssrf"),
                                           ("reason", "internal-address"), ("rule", "-")))  # fmt: skip
    assert samples[key] == FLOOD + 1
    assert metrics.activity.to_json()["network_activity_count"] == 7 * (
        FLOOD + 1
    )  # 3 denials, 1 allow, 2 requests, 1 refused tunnel


@pytest.mark.parametrize(
    ("kind", "fields", "group", "counted"),
    [
        (EventName.EGRESS, {"decision": "deny", "reason": "binary-not-allowed", "capture": "connect"},
         DenyGroup.CONNECT_POLICY, True),
        (EventName.EGRESS, {"decision": "deny", "reason": "no-matching-endpoint", "capture": "http-forward"},
         DenyGroup.FORWARD_POLICY, True),
        (EventName.EGRESS, {"decision": "deny", "reason": "allowed-ips-check-failed", "capture": "transparent"},
         DenyGroup.SSRF, True),
        (EventName.EGRESS, {"decision": "deny", "reason": "policy-quarantined"}, DenyGroup.POLICY_STALE, True),
        (EventName.EGRESS, {"decision": "deny", "reason": "malformed-request"}, DenyGroup.L7_PARSE_REJECTION, True),
        (EventName.EGRESS, {"decision": "deny", "reason": "something new"}, DenyGroup.UNKNOWN, True),
        (EventName.EGRESS, {"decision": "allow", "inspected": True}, None, False),  # counted by its requests
        (EventName.EGRESS, {"decision": "allow"}, None, True),
        (EventName.EGRESS, {"decision": "error", "reason": "connect-refused"}, None, True),
        (EventName.HTTP, {"decision": "deny", "reason": "l7-denied"}, DenyGroup.L7_POLICY, True),
        (EventName.HTTP, {"decision": "deny", "reason": "credential_endpoint_mismatch"}, DenyGroup.L7_POLICY, True),
        (EventName.HTTP, {"decision": "deny", "reason": "conflicting-content-length"},
         DenyGroup.L7_PARSE_REJECTION, True),
        (EventName.HTTP, {"decision": "audit", "reason": "l7-denied"}, None, True),
        (EventName.HTTP_TUNNEL, {"stage": "refused", "reason": "unsupported_l7_protocol"},
         DenyGroup.L7_PARSE_REJECTION, True),
    ],
)  # fmt: skip
def test_each_decision_has_one_deny_group(
    kind: EventName, fields: dict[str, Any], group: DenyGroup | None, counted: bool
) -> None:
    found = classify(_event(kind, **fields))
    assert found is not None
    assert (found.group, found.counted) == (group, counted)


def test_activity_counts_add_up_and_a_closed_tunnel_is_no_request() -> None:
    metrics = ControlMetrics(_store(), JsonLog("control", stream=None, to_stream=False))
    for fields in ({"decision": "allow"}, {"decision": "deny", "reason": "internal-address"},
                   {"decision": "deny", "reason": "no-matching-endpoint", "capture": "connect"}):  # fmt: skip
        metrics.observe(_event(EventName.EGRESS, **fields))
    metrics.observe(_event(EventName.HTTP_TUNNEL, stage="closed", reason="policy-revision"))
    metrics.observe(_event(EventName.DNS, decision="answered", name="api.test"))
    activity = metrics.activity.to_json()
    assert activity["network_activity_count"] == 3
    assert activity["denied_action_count"] == 2
    assert activity["denials_by_group"]["ssrf"] == 1 and activity["denials_by_group"]["connect_policy"] == 1
    assert sum(activity["denials_by_group"].values()) == activity["denied_action_count"]
    assert set(activity["denials_by_group"]) == {str(g) for g in DenyGroup}


def test_a_rule_label_is_a_key_of_the_policy_in_force() -> None:
    store = _store()
    metrics = ControlMetrics(store, JsonLog("control", stream=None, to_stream=False))
    assert metrics.rule_label("api") == "api"
    store.apply_text(doc({"pkgs": rule({"host": "pkgs.test", "port": 443}, binaries=(CURL,))}), "revision")
    assert metrics.rule_label("api") == "-"  # no longer a key: an old rule name is not a label
    assert metrics.rule_label("pkgs") == "pkgs"


def test_the_boundary_exposes_limits_exec_latency_and_refusals() -> None:
    boundary = BoundaryMetrics(JsonLog("boundary", stream=None, to_stream=False), _Boundary())
    boundary.observe(_event(EventName.PROCESS_STARTED, "boundary", kind="exec", start_ms=3.5))
    boundary.observe(_event(EventName.LINK_UP, "boundary", alpn="openshell-egress/1"))
    boundary.observe(_event(EventName.EGRESS_REFUSED, "boundary", reason="identity-unresolved: no-record"))
    page = generate_latest(boundary.registry).decode()
    for line in (
        'openshell_process_starts_total{daemon="boundary",kind="exec"} 1.0',
        'openshell_process_start_seconds_bucket{daemon="boundary",kind="exec",le="0.005"} 1.0',
        'openshell_pids_limit{daemon="boundary"} 512.0',
        'openshell_memory_current_bytes{daemon="boundary"} 1.048576e+06',
        'openshell_limit_enforced{daemon="boundary",limit="pids"} 1.0',
        'openshell_links_up{alpn="openshell-egress/1",daemon="boundary"} 1.0',
        'openshell_egress_refused_total{daemon="boundary",reason="identity-unresolved",stage="no-record"} 1.0',
        'openshell_lifecycle_state{daemon="boundary",state="running"} 1.0',
    ):
        assert line in page.splitlines()


async def test_the_listener_serves_metrics_and_nothing_else() -> None:
    log = JsonLog("control", stream=None, to_stream=False)
    server = MetricsServer(ControlMetrics(_store(), log).registry, "127.0.0.1", 0)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        assert server.bound is not None and server.bound[0] == "127.0.0.1"

        async def ask(request: bytes) -> bytes:
            stream = await trio.open_tcp_stream("127.0.0.1", server.bound[1])  # type: ignore[index]
            await stream.send_all(request)
            data = b""
            while chunk := await stream.receive_some(65536):
                data += chunk
            return data

        page = await ask(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert page.startswith(b"HTTP/1.1 200") and b"openshell_policy_generation" in page
        assert (await ask(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n")).startswith(b"HTTP/1.1 404")
        assert (await ask(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")).startswith(
            b"HTTP/1.1 405"
        )
        assert (await ask(b"\x16\x03\x01garbage\r\n\r\n")) == b""  # not HTTP: closed, no answer
        nursery.cancel_scope.cancel()
