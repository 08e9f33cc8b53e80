"""Control's metrics and §4.3 activity counters, derived from its events in one place (docs/design.md "Metrics").

:meth:`ControlMetrics.observe` is the sink on control's ``JsonLog``: every event control writes passes through it
once, so no call site counts anything itself (the ``egress`` event is written exactly once per connection by
``connection_result.py``; each inspected request is one ``http`` event). Gauges — live connections, links, the
policy generation, events dropped — are read from the daemon when Prometheus scrapes.

Rules:

1. Labels only from closed sets (``supervisor/metrics.py`` rule 1): ``decision``; ``reason`` from the catalogues
   (:data:`REASONS`: the policy's ``DenyReason``, ``UpstreamReason``, the agent-visible ``ErrorCode``, the request
   reader's ``HeadProblem`` and control's few own), else ``other``; ``deny_group`` (§4.3); ``rule`` only when it is
   a key of the policy in force, else ``-``; ``kind``, ``alpn``, ``outcome``, ``event`` from their catalogues.
2. :func:`classify` is the one reading of a decision event: the Prometheus counters and the activity counters
   both take it, so ``/metrics`` and ``GET /v1/activity`` never disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from supervisor.control.dns_answers import DnsAction
from supervisor.control.policy import PolicyStore
from supervisor.control.policy.decision import DenyReason
from supervisor.jsonlog import JsonLog
from supervisor.metrics import NONE_LABEL, closed
from supervisor.protocol.activity import ActivityCounters, DenyGroup
from supervisor.protocol.egress import CaptureKind
from supervisor.protocol.event_names import EventName
from supervisor.protocol.event_record import Event
from supervisor.protocol.outcome_reasons import OutcomeReason
from supervisor.protocol.request_head import HeadProblem
from supervisor.protocol.responses import ErrorCode
from supervisor.protocol.tls import ALPN_EGRESS, ALPN_OPS
from supervisor.protocol.upstream_reasons import UpstreamReason

__all__ = ["REASONS", "Classified", "ControlMetrics", "classify"]

DAEMON = "control"
NO_RULE = NONE_LABEL
NO_REASON = NONE_LABEL
DECISIONS = frozenset({"allow", "audit", "deny", "error"})
# control's own reasons beside the catalogues: an egress stream it could not read, a connection that ended before
# its decision, inspection required but not available, a tunnel's or request's reader problems, a revocation's
_OWN_REASONS = frozenset(str(r) for r in (
    OutcomeReason.MALFORMED_REQUEST, OutcomeReason.CANCELLED, OutcomeReason.INTERNAL_ERROR, OutcomeReason.DENIED,
    OutcomeReason.L7_INSPECTION_UNAVAILABLE, OutcomeReason.INFERENCE_NOT_SERVED,
    OutcomeReason.REQUEST_AUTHORITY_MISMATCH, OutcomeReason.UNSUPPORTED_L7_PROTOCOL,
    OutcomeReason.WEBSOCKET_UPGRADE_NOT_ALLOWED, OutcomeReason.HEAD_TIMEOUT,
    OutcomeReason.TRUNCATED_HEAD, OutcomeReason.INVALID_REQUEST, OutcomeReason.INVALID_AUTHORITY,
    OutcomeReason.INVALID_BODY, OutcomeReason.INVALID_CLIENT_HELLO, OutcomeReason.CLIENT_HELLO_INCOMPLETE,
    OutcomeReason.SNIFF_TIMEOUT, OutcomeReason.POLICY_REVISION, OutcomeReason.INSPECTION_REQUIRED,
))  # fmt: skip
REASONS = frozenset(
    {str(r) for r in DenyReason} | {str(r) for r in UpstreamReason} | {str(c) for c in ErrorCode}
    | {str(p) for p in HeadProblem} | _OWN_REASONS
)  # fmt: skip
_SSRF = frozenset(str(r) for r in UpstreamReason if r.ssrf) | {str(ErrorCode.SSRF_DENIED)}
_L4_POLICY = frozenset(str(r) for r in (
    DenyReason.NO_NETWORK_POLICIES, DenyReason.NO_MATCHING_ENDPOINT, DenyReason.BINARY_NOT_ALLOWED,
    DenyReason.BINARY_DIGEST_CHANGED, DenyReason.BINARY_DIGEST_MISSING, DenyReason.IDENTITY_MISSING,
    DenyReason.INVALID_HOST, DenyReason.INVALID_PORT, DenyReason.L4_DENIED, UpstreamReason.INVALID_HOST,
    UpstreamReason.INVALID_PORT, ErrorCode.POLICY_DENIED,
)) | {str(OutcomeReason.L7_INSPECTION_UNAVAILABLE), str(OutcomeReason.INFERENCE_NOT_SERVED)}  # fmt: skip
_PARSE = frozenset(str(r) for r in (
    DenyReason.PATH_NOT_CANONICAL, DenyReason.ENCODED_SLASH, DenyReason.QUERY_INVALID, DenyReason.METHOD_INVALID,
    DenyReason.BODY_INVALID, DenyReason.BODY_TOO_LARGE, DenyReason.RESPONSE_FRAME, ErrorCode.INVALID_REQUEST_TARGET,
    ErrorCode.INVALID_REQUEST, ErrorCode.INVALID_CREDENTIAL_PLACEHOLDER, ErrorCode.UNSUPPORTED_L7_PROTOCOL,
)) | {str(p) for p in HeadProblem} | {str(r) for r in (
    OutcomeReason.MALFORMED_REQUEST, OutcomeReason.UNSUPPORTED_L7_PROTOCOL, OutcomeReason.HEAD_TIMEOUT,
    OutcomeReason.TRUNCATED_HEAD, OutcomeReason.INVALID_REQUEST, OutcomeReason.INVALID_AUTHORITY,
    OutcomeReason.INVALID_BODY, OutcomeReason.INVALID_CLIENT_HELLO, OutcomeReason.CLIENT_HELLO_INCOMPLETE,
    OutcomeReason.SNIFF_TIMEOUT,
)}  # fmt: skip
_STALE = frozenset({str(DenyReason.POLICY_QUARANTINED)})
DNS_KINDS = frozenset({str(a) for a in DnsAction} | {"failed"})
ALPNS = frozenset({ALPN_OPS, ALPN_EGRESS})
OUTCOMES = frozenset({"loaded", "quarantined", "retained"})
EVENT_NAMES = frozenset(str(name) for name in EventName)


@dataclass(frozen=True, slots=True)
class Classified:
    """One decision event as the counters read it (rule 2)."""

    request: bool  # an inspected request (``http``), else a connection (``egress``)
    decision: str  # allow, audit, deny, error, or other
    reason: str  # a label of REASONS, ``other``, or ``-`` when the event gives none
    group: DenyGroup | None  # a denial's §4.3 group
    counted: bool  # counted in §4.3's activity (an inspected connection counts by its requests)


def _group(reason: str, *, request: bool, forward: bool) -> DenyGroup:
    if reason in _STALE:
        return DenyGroup.POLICY_STALE
    if reason in _SSRF:
        return DenyGroup.SSRF
    if reason in _PARSE:
        return DenyGroup.L7_PARSE_REJECTION
    if request:
        return DenyGroup.L7_POLICY
    if reason in _L4_POLICY:
        return DenyGroup.FORWARD_POLICY if forward else DenyGroup.CONNECT_POLICY
    return DenyGroup.UNKNOWN


def classify(event: Event) -> Classified | None:
    """A connection's or request's outcome, or ``None`` for any other event."""
    fields = event.fields
    if event.name is EventName.EGRESS:
        decision = closed(fields.get("decision"), DECISIONS)
        reason = closed(fields.get("reason"), REASONS) if fields.get("reason") is not None else NO_REASON
        forward = fields.get("capture") == str(CaptureKind.HTTP_FORWARD)
        group = _group(reason, request=False, forward=forward) if decision == "deny" else None
        counted = not (decision == "allow" and fields.get("inspected") is True)
        return Classified(False, decision, reason, group, counted)
    if event.name is EventName.HTTP:
        decision = closed(fields.get("decision"), DECISIONS)
        reason = closed(fields.get("reason"), REASONS) if fields.get("reason") is not None else NO_REASON
        group = _group(reason, request=True, forward=False) if decision == "deny" else None
        return Classified(True, decision, reason, group, True)
    if event.name is EventName.HTTP_TUNNEL and fields.get("stage") == "refused":  # refused before any request
        reason = closed(fields.get("reason"), REASONS)
        return Classified(True, "deny", reason, _group(reason, request=True, forward=False), True)
    return None


class ControlMetrics:
    """Control's registry, its event sink and the activity counters (served at ``GET /v1/activity``)."""

    def __init__(
        self, policy: PolicyStore, log: JsonLog, *, live: Callable[[], int] = lambda: 0,
        links: Callable[[], dict[str, int]] = dict,
    ) -> None:  # fmt: skip
        self.policy = policy
        self.log = log
        self.activity = ActivityCounters()
        self.registry = CollectorRegistry(auto_describe=True)
        self._keys: tuple[int, frozenset[str]] = (-1, frozenset())
        common = ["daemon"]
        self.connections = Counter("openshell_connections", "Egress connections by decision, reason, §4.3 deny "
                                   "group and rule", [*common, "decision", "reason", "deny_group", "rule"],
                                   registry=self.registry)  # fmt: skip
        self.bytes = Counter("openshell_connection_bytes", "Bytes relayed for closed connections (up: agent to "
                             "upstream)", [*common, "direction", "rule"], registry=self.registry)  # fmt: skip
        self.requests = Counter("openshell_l7_requests", "Requests inside inspected tunnels by decision, reason, "
                                "deny group and rule", [*common, "decision", "reason", "deny_group", "rule"],
                                registry=self.registry)  # fmt: skip
        self.dns = Counter("openshell_dns_answers", "DNS questions of the agent by how they were answered",
                           [*common, "kind"], registry=self.registry)  # fmt: skip
        self.redials = Counter("openshell_link_redials", "Link attempts that failed and are retried",
                               [*common, "alpn"], registry=self.registry)  # fmt: skip
        self.reloads = Counter("openshell_policy_reloads", "Policy generations by outcome (loaded, quarantined, "
                               "retained)", [*common, "outcome"], registry=self.registry)  # fmt: skip
        self.revoked = Counter("openshell_connections_revoked", "Live connections cut by a policy revision",
                               [*common, "reason"], registry=self.registry)  # fmt: skip
        self.events = Counter("openshell_events", "Events written, by name", [*common, "event"],
                              registry=self.registry)  # fmt: skip
        self.registry.register(_Gauges(self, live, links))

    def rule_label(self, value: object) -> str:
        """``value`` when it is a rule key of the policy in force, else ``-``."""
        snap = self.policy.snapshot()
        generation, keys = self._keys
        if generation != snap.generation:
            compiled = snap.policy
            keys = frozenset(r.key for r in compiled.policy.network_policies) if compiled is not None else frozenset()
            self._keys = (snap.generation, keys)
        return closed(value, keys, NO_RULE)

    def observe(self, event: Event) -> None:
        """The sink: every event control writes, once."""
        fields = event.fields
        self.events.labels(DAEMON, str(event.name)).inc()
        found = classify(event)
        if found is not None:
            rule = self.rule_label(fields.get("rule"))
            group = str(found.group) if found.group is not None else NO_REASON
            counter = self.requests if found.request else self.connections
            counter.labels(DAEMON, found.decision, found.reason, group, rule).inc()
            if found.counted:
                self.activity.count(found.group)
            if event.name is EventName.EGRESS and found.decision == "allow":
                for direction, key in (("up", "bytes_out"), ("down", "bytes_in")):
                    value = fields.get(key)
                    if isinstance(value, int) and value > 0:
                        self.bytes.labels(DAEMON, direction, rule).inc(value)
            return
        name = event.name
        if name is EventName.DNS:
            self.dns.labels(DAEMON, closed(fields.get("decision"), DNS_KINDS)).inc()
        elif name is EventName.LINK_FAILED:
            self.redials.labels(DAEMON, closed(fields.get("alpn"), ALPNS)).inc()
        elif name is EventName.POLICY_GENERATION:
            self.reloads.labels(DAEMON, closed(fields.get("status"), OUTCOMES)).inc()
        elif name is EventName.EGRESS_REVOKED:
            self.revoked.labels(DAEMON, closed(fields.get("reason"), REASONS)).inc()


class _Gauges(Collector):
    """What is read from the daemon when Prometheus scrapes."""

    def __init__(self, metrics: ControlMetrics, live: Callable[[], int], links: Callable[[], dict[str, int]]) -> None:
        self._metrics = metrics
        self._live = live
        self._links = links

    def collect(self) -> Iterable[Metric]:
        m = self._metrics
        snap = m.policy.snapshot()
        yield _gauge("openshell_active_connections", "Egress connections open now", self._live())
        yield _gauge("openshell_policy_generation", "The policy generation in force", snap.generation)
        status = GaugeMetricFamily("openshell_policy_status", "1 for the policy store's status now",
                                   labels=["daemon", "status"])  # fmt: skip
        for outcome in sorted(OUTCOMES):
            status.add_metric([DAEMON, outcome], 1 if snap.status == outcome else 0)
        yield status
        links = GaugeMetricFamily("openshell_links_up", "Links to the boundary up now, by ALPN",
                                  labels=["daemon", "alpn"])  # fmt: skip
        for alpn, count in sorted(self._links().items()):
            links.add_metric([DAEMON, closed(alpn, ALPNS)], count)
        yield links
        dropped = CounterMetricFamily("openshell_events_dropped", "Event lines a stream or file did not take",
                                      labels=["daemon"])  # fmt: skip
        dropped.add_metric([DAEMON], m.log.dropped)
        yield dropped
        activity = m.activity.to_json()
        yield _counter("openshell_activity_network", "§4.3 network_activity_count: attempts and requests",
                       activity["network_activity_count"])  # fmt: skip
        yield _counter("openshell_activity_denied", "§4.3 denied_action_count", activity["denied_action_count"])

    def describe(self) -> Iterable[Metric]:
        return []


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["daemon"])
    family.add_metric([DAEMON], value)
    return family


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=["daemon"])
    family.add_metric([DAEMON], value)
    return family
