"""The boundary's metrics, derived from its events in one place (docs/design.md "Metrics").

:meth:`BoundaryMetrics.observe` is the sink on the boundary's ``JsonLog``: process starts and their latency
(``process.started``'s ``start_ms``), launch failures, connections refused before control's decision, links going
up and down. The limits and their current use, the lifecycle state, the acknowledged policy generation and the
events dropped are read from the daemon when Prometheus scrapes (:class:`BoundaryState`).

Labels only from closed sets (``supervisor/metrics.py`` rule 1): ``kind`` (agent, exec), ``reason`` and ``stage``
of a refusal from the boundary's catalogue (:data:`REFUSALS`, ``IdentityStage``), a launch's ``stage`` from the
launcher's ``Stage``, ``alpn``, ``state`` and ``event`` from theirs. Never a destination, a binary or an argv.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from supervisor.boundary.capture.identity import IdentityStage
from supervisor.boundary.forkimage.child import Stage
from supervisor.boundary.limits_report import LimitsReport
from supervisor.jsonlog import JsonLog
from supervisor.metrics import NONE_LABEL, closed
from supervisor.protocol.event_names import EventName
from supervisor.protocol.event_record import Event
from supervisor.protocol.lifecycle import State
from supervisor.protocol.outcome_reasons import OutcomeReason
from supervisor.protocol.tls import ALPN_EGRESS, ALPN_OPS

__all__ = ["BoundaryMetrics", "BoundaryState"]

DAEMON = "boundary"
IDENTITY_UNRESOLVED = OutcomeReason.IDENTITY_UNRESOLVED
REFUSALS = frozenset({IDENTITY_UNRESOLVED, OutcomeReason.NO_EGRESS_LINK, OutcomeReason.LINK_FAILED})
IDENTITY_STAGES = frozenset({str(s) for s in IdentityStage} | {"error"})
LAUNCH_STAGES = frozenset(str(s) for s in Stage)
KINDS = frozenset({"agent", "exec"})
ALPNS = frozenset({ALPN_OPS, ALPN_EGRESS})
# an exec's start, asked to exec'd: a few ms through a spare exec-init, tens without one, seconds when stuck
START_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class BoundaryState(Protocol):
    """What the scrape reads from the daemon (``state.DaemonState``)."""

    @property
    def lifecycle_state(self) -> str: ...
    @property
    def policy_generation_acked(self) -> int | None: ...
    def limits_now(self) -> LimitsReport: ...


class BoundaryMetrics:
    def __init__(self, log: JsonLog, state: BoundaryState) -> None:
        self.log = log
        self.registry = CollectorRegistry(auto_describe=True)
        self.links: dict[str, int] = dict.fromkeys(sorted(ALPNS), 0)
        common = ["daemon"]
        self.starts = Counter("openshell_process_starts", "Workload processes started (the agent, execs)",
                              [*common, "kind"], registry=self.registry)  # fmt: skip
        self.start_seconds = Histogram("openshell_process_start_seconds", "Asked to exec'd, per process start",
                                       [*common, "kind"], buckets=START_BUCKETS, registry=self.registry)  # fmt: skip
        self.start_failures = Counter("openshell_process_start_failures", "Workload launches that failed, by the "
                                      "launcher's stage", [*common, "stage"], registry=self.registry)  # fmt: skip
        self.refused = Counter("openshell_egress_refused", "Connections refused before control's decision (no "
                               "identity, no link)", [*common, "reason", "stage"], registry=self.registry)  # fmt: skip
        self.link_downs = Counter("openshell_link_downs", "Links from control that closed", [*common, "alpn"],
                                  registry=self.registry)  # fmt: skip
        self.events = Counter("openshell_events", "Events written, by name", [*common, "event"],
                              registry=self.registry)  # fmt: skip
        self.registry.register(_Gauges(self, state))

    def observe(self, event: Event) -> None:
        """The sink: every event the boundary writes, once."""
        fields = event.fields
        name = event.name
        self.events.labels(DAEMON, str(name)).inc()
        if name is EventName.PROCESS_STARTED:
            kind = closed(fields.get("kind"), KINDS)
            self.starts.labels(DAEMON, kind).inc()
            took = fields.get("start_ms")
            if isinstance(took, int | float) and not isinstance(took, bool):
                self.start_seconds.labels(DAEMON, kind).observe(took / 1000)
        elif name is EventName.PROCESS_START_FAILED:
            self.start_failures.labels(DAEMON, closed(fields.get("stage"), LAUNCH_STAGES)).inc()
        elif name is EventName.EGRESS_REFUSED:
            reason = fields.get("reason")
            text = reason if isinstance(reason, str) else ""
            head, _, stage = text.partition(": ")
            if head == IDENTITY_UNRESOLVED:
                self.refused.labels(DAEMON, IDENTITY_UNRESOLVED, closed(stage, IDENTITY_STAGES)).inc()
            else:
                self.refused.labels(DAEMON, closed(text, REFUSALS), NONE_LABEL).inc()
        elif name in (EventName.LINK_UP, EventName.LINK_DOWN):
            alpn = fields.get("alpn")
            if isinstance(alpn, str) and alpn in ALPNS:
                self.links[alpn] = max(0, self.links[alpn] + (1 if name is EventName.LINK_UP else -1))
                if name is EventName.LINK_DOWN:
                    self.link_downs.labels(DAEMON, alpn).inc()


class _Gauges(Collector):
    def __init__(self, metrics: BoundaryMetrics, state: BoundaryState) -> None:
        self._metrics = metrics
        self._state = state

    def collect(self) -> Iterable[Metric]:
        state = self._state
        lifecycle = GaugeMetricFamily("openshell_lifecycle_state", "1 for the boundary's lifecycle state now",
                                      labels=["daemon", "state"])  # fmt: skip
        for each in State:
            lifecycle.add_metric([DAEMON, str(each)], 1 if state.lifecycle_state == str(each) else 0)
        yield lifecycle
        links = GaugeMetricFamily("openshell_links_up", "Links from control up now, by ALPN", labels=["daemon", "alpn"])
        for alpn, count in sorted(self._metrics.links.items()):
            links.add_metric([DAEMON, alpn], count)
        yield links
        acked = state.policy_generation_acked
        if acked is not None:
            yield _gauge("openshell_policy_generation", "The policy generation the boundary acknowledged", acked)
        limits = state.limits_now()
        enforced = GaugeMetricFamily("openshell_limit_enforced", "1 when the limit holds (its cgroup), 0 when it is "
                                     "reported unenforced", labels=["daemon", "limit"])  # fmt: skip
        for limit, held in (("pids", limits.pids), ("memory", limits.memory)):
            enforced.add_metric([DAEMON, limit], 1 if _count(held) is not None else 0)
        yield enforced
        for name, doc, reading in (
            ("openshell_pids_limit", "The workload's pids.max", limits.pids),
            ("openshell_pids_current", "The workload's processes now (its cgroup)", limits.pids_current),
            ("openshell_memory_limit_bytes", "The workload's memory limit", limits.memory),
            ("openshell_memory_current_bytes", "The workload's memory use now (its cgroup)", limits.memory_current),
        ):
            value = _count(reading)
            if value is not None:
                yield _gauge(name, doc, value)
        kills = _count(limits.memory_oom_kills)
        if kills is not None:
            family = CounterMetricFamily("openshell_memory_oom_kills", "OOM kills in the workload's memory cgroup",
                                         labels=["daemon"])  # fmt: skip
            family.add_metric([DAEMON], kills)
            yield family
        dropped = CounterMetricFamily("openshell_events_dropped", "Event lines a stream or file did not take",
                                      labels=["daemon"])  # fmt: skip
        dropped.add_metric([DAEMON], self._metrics.log.dropped)
        yield dropped

    def describe(self) -> Iterable[Metric]:
        return []


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["daemon"])
    family.add_metric([DAEMON], value)
    return family
