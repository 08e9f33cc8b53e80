"""Every event as OCSF 1.7.0 (``--log-format ocsf``, ``logs --format ocsf``; docs/reference/policy.md §4.1).

One table, :data:`OCSF_MAP`, gives each :class:`EventName` its class, activity and severity, and says which events
also raise a Detection Finding; tests/unit/test_ocsf.py fails when a name has no entry and validates a rendering of
each entry against the OCSF 1.7.0 schema vendored in tests/ocsf/. :func:`ocsf_lines` is the rendering: the
primary object, then the finding when there is one — one JSON object per line.

Rules:

1. A rendering reads the event's own fields and nothing else, so it says no more than the JSON line does: the
   redaction rules of §4.1 hold for both formats once they hold for the fields (no secret, placeholder, credential
   name, body or query string — the ``http`` event carries ``injected: N``, its path is query-free and redacted).
2. ``actor.process.cmd_line`` is the binary's absolute path as control resolved it and the absolute paths among its
   arguments that the boundary reported (``cmdline_paths``), any placeholder shown as ``[CREDENTIAL]``, at most
   :data:`MAX_CMD_LINE` characters: never the agent's argv.
3. The decision fields decide the outcome: ``allow`` is Allowed, ``deny`` (or a refusal) Denied/Blocked at Medium,
   ``error`` a Failure. Fields the class has no attribute for go to ``unmapped``, with the sandbox and component.
"""

from __future__ import annotations

import enum
import functools
import ipaddress
import itertools
import json
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from supervisor.protocol.event_names import EventName
from supervisor.protocol.event_record import Event, FieldValue
from supervisor.protocol.responses import ErrorCode
from supervisor.protocol.upstream_reasons import UpstreamReason

__all__ = [
    "OCSF_MAP",
    "OCSF_VERSION",
    "Activity",
    "OcsfClass",
    "OcsfMapping",
    "Severity",
    "ocsf_lines",
    "placeholder_scrub",
    "shorthand",
]

OCSF_VERSION = "1.7.0"
PRODUCT = "openshell-sandbox"
MAX_CMD_LINE = 512
REDACTED = "[CREDENTIAL]"
# A placeholder's canonical spellings (control/credentials.py); control also rewrites custom ones at the source.
_PLACEHOLDER = re.compile(r"(?:openshell:resolve:env:|OPENSHELL-RESOLVE-ENV-)[A-Za-z0-9_.~:\-]*")


class OcsfClass(enum.IntEnum):
    PROCESS_ACTIVITY = 1007
    DETECTION_FINDING = 2004
    NETWORK_ACTIVITY = 4001
    HTTP_ACTIVITY = 4002
    CONFIG_STATE_CHANGE = 5019


_CLASS = {
    OcsfClass.PROCESS_ACTIVITY: ("Process Activity", "System Activity", "PROC"),
    OcsfClass.DETECTION_FINDING: ("Detection Finding", "Findings", "FINDING"),
    OcsfClass.NETWORK_ACTIVITY: ("Network Activity", "Network Activity", "NET"),
    OcsfClass.HTTP_ACTIVITY: ("HTTP Activity", "Network Activity", "HTTP"),
    OcsfClass.CONFIG_STATE_CHANGE: ("Device Config State Change", "Discovery", "CONFIG"),
}


class Activity(enum.Enum):
    """(class, activity_id, caption) of the activities used."""

    NET_OPEN = (OcsfClass.NETWORK_ACTIVITY, 1, "Open")
    NET_CLOSE = (OcsfClass.NETWORK_ACTIVITY, 2, "Close")
    NET_FAIL = (OcsfClass.NETWORK_ACTIVITY, 4, "Fail")
    NET_REFUSE = (OcsfClass.NETWORK_ACTIVITY, 5, "Refuse")
    NET_TRAFFIC = (OcsfClass.NETWORK_ACTIVITY, 6, "Traffic")
    NET_LISTEN = (OcsfClass.NETWORK_ACTIVITY, 7, "Listen")
    NET_OTHER = (OcsfClass.NETWORK_ACTIVITY, 99, "Other")
    HTTP_OTHER = (OcsfClass.HTTP_ACTIVITY, 99, "Other")
    CONFIG_LOG = (OcsfClass.CONFIG_STATE_CHANGE, 1, "Log")
    CONFIG_OTHER = (OcsfClass.CONFIG_STATE_CHANGE, 99, "Other")
    PROC_LAUNCH = (OcsfClass.PROCESS_ACTIVITY, 1, "Launch")
    PROC_TERMINATE = (OcsfClass.PROCESS_ACTIVITY, 2, "Terminate")
    PROC_OTHER = (OcsfClass.PROCESS_ACTIVITY, 99, "Other")
    FINDING_CREATE = (OcsfClass.DETECTION_FINDING, 1, "Create")

    @property
    def ocsf_class(self) -> OcsfClass:
        return self.value[0]

    @property
    def activity_id(self) -> int:
        return int(self.value[1])

    @property
    def caption(self) -> str:
        return str(self.value[2])


class Severity(enum.IntEnum):
    INFO = 1
    LOW = 2
    MEDIUM = 3
    HIGH = 4
    CRITICAL = 5


_SEVERITY_NAME = {1: "Informational", 2: "Low", 3: "Medium", 4: "High", 5: "Critical"}
SEVERITY_SHORT = {1: "INFO", 2: "LOW", 3: "MED", 4: "HIGH", 5: "CRIT"}


@dataclass(frozen=True, slots=True)
class OcsfMapping:
    """How one event name renders: its activity (so its class), its usual severity, and the Detection Finding it
    raises (``finding``: the finding's type; for a Detection Finding activity, the event is the finding itself)."""

    activity: Activity
    severity: Severity = Severity.INFO
    finding: str | None = None


_N, _H, _C, _P, _F = (Activity.NET_OPEN, Activity.HTTP_OTHER, Activity.CONFIG_LOG, Activity.PROC_OTHER,
                      Activity.FINDING_CREATE)  # fmt: skip
E = EventName
OCSF_MAP: dict[EventName, OcsfMapping] = {
    # the agent and its processes: Process Activity
    E.AGENT_EXIT_ACK_FAILED: OcsfMapping(_P, Severity.LOW),
    E.AGENT_EXITED: OcsfMapping(Activity.PROC_TERMINATE),
    E.AGENT_FILESYSTEM: OcsfMapping(_C),
    E.AGENT_LAUNCH_FAILED: OcsfMapping(Activity.PROC_LAUNCH, Severity.MEDIUM),
    E.PROCESS_END_ALL: OcsfMapping(Activity.PROC_TERMINATE),
    E.PROCESS_EXITED: OcsfMapping(Activity.PROC_TERMINATE),
    E.PROCESS_LEFTOVER: OcsfMapping(Activity.PROC_TERMINATE, Severity.MEDIUM),
    E.PROCESS_OUTPUT: OcsfMapping(_P),
    E.PROCESS_SIGNALLED: OcsfMapping(_P),
    E.PROCESS_START_FAILED: OcsfMapping(Activity.PROC_LAUNCH, Severity.LOW),
    E.PROCESS_STARTED: OcsfMapping(Activity.PROC_LAUNCH),
    E.PROCESS_TERMINATE: OcsfMapping(Activity.PROC_TERMINATE),
    E.PROCESS_UNOWNED_REAPED: OcsfMapping(Activity.PROC_TERMINATE),
    E.EXEC_STREAM_BROKEN: OcsfMapping(_P, Severity.LOW),
    E.EXEC_STREAM_ERROR: OcsfMapping(_P, Severity.LOW),
    # the operator API and listeners: Network Activity
    E.API_LISTENING: OcsfMapping(Activity.NET_LISTEN),
    E.METRICS_LISTENING: OcsfMapping(Activity.NET_LISTEN),
    E.API_OPERATOR: OcsfMapping(Activity.NET_OTHER),
    E.API_RATE_LIMITED: OcsfMapping(Activity.NET_REFUSE, Severity.MEDIUM),
    E.API_REFUSED: OcsfMapping(Activity.NET_REFUSE, Severity.MEDIUM),
    E.BOUNDARY_LISTENING: OcsfMapping(Activity.NET_LISTEN),
    E.FENCE_CANARY_LISTENING: OcsfMapping(Activity.NET_LISTEN),
    E.PROXY_LISTENING: OcsfMapping(Activity.NET_LISTEN),
    E.PROXY_ERROR: OcsfMapping(Activity.NET_FAIL, Severity.LOW),
    E.PROXY_REFUSED: OcsfMapping(Activity.NET_REFUSE, Severity.MEDIUM),
    E.FORWARD_CLOSED: OcsfMapping(Activity.NET_CLOSE),
    # the link between the daemons
    E.LINK_UP: OcsfMapping(_N),
    E.LINK_DOWN: OcsfMapping(Activity.NET_CLOSE),
    E.LINK_CLOSED: OcsfMapping(Activity.NET_CLOSE),
    E.LINK_FAILED: OcsfMapping(Activity.NET_FAIL, Severity.LOW),
    E.LINK_REFUSED: OcsfMapping(Activity.NET_REFUSE, Severity.HIGH, finding="openshell.link.claims_refused"),
    # the agent's traffic
    E.DNS: OcsfMapping(Activity.NET_TRAFFIC),
    E.EGRESS: OcsfMapping(_N),
    E.EGRESS_ERROR: OcsfMapping(Activity.NET_FAIL, Severity.LOW),
    E.EGRESS_REFUSED: OcsfMapping(Activity.NET_REFUSE, Severity.MEDIUM),
    E.EGRESS_REVOKED: OcsfMapping(Activity.NET_CLOSE, Severity.MEDIUM),
    E.HTTP: OcsfMapping(_H),
    E.INFERENCE: OcsfMapping(Activity.NET_TRAFFIC),  # a route, model and byte counts; no request of the agent named
    E.HTTP_TUNNEL: OcsfMapping(Activity.NET_OTHER),
    E.IDENTITY_CONNECT_TIMEOUT: OcsfMapping(Activity.NET_FAIL, Severity.LOW),
    E.IDENTITY_CONNECT_UNRECORDED: OcsfMapping(Activity.NET_FAIL, Severity.LOW),
    # policy: Config State Change
    E.BOOTSTRAP_POLICY_DIGEST_UNREADABLE: OcsfMapping(_C, Severity.MEDIUM),
    E.POLICY_ACK_FAILED: OcsfMapping(_C, Severity.MEDIUM),
    E.POLICY_ACKNOWLEDGED: OcsfMapping(_C),
    E.POLICY_APPLIED: OcsfMapping(_C),
    E.POLICY_GENERATION: OcsfMapping(_C),
    E.POLICY_IDENTITY_RELAXED: OcsfMapping(_C, Severity.MEDIUM),
    E.POLICY_WATCH: OcsfMapping(_C),
    E.INFERENCE_ROUTES: OcsfMapping(_C),
    # the daemons' own state: Config State Change
    E.BOUNDARY_END_ALL_FAILED: OcsfMapping(_C, Severity.HIGH),
    E.BOUNDARY_END_ALL_TIMEOUT: OcsfMapping(_C, Severity.MEDIUM),
    E.BOUNDARY_EXIT: OcsfMapping(_C),
    E.BOUNDARY_EXIT_LINGER_EXPIRED: OcsfMapping(_C, Severity.LOW),
    E.BOUNDARY_REFUSED: OcsfMapping(_C, Severity.HIGH),
    E.BOUNDARY_SIGNAL: OcsfMapping(_C),
    E.BOUNDARY_TEST_KNOB: OcsfMapping(_C, Severity.HIGH),
    E.CERTIFICATE_EXPIRING: OcsfMapping(_C, Severity.MEDIUM),
    E.CONTROL_EXIT: OcsfMapping(_C),
    E.CONTROL_FAILED: OcsfMapping(_C, Severity.HIGH),
    E.CONTROL_NETSTATE: OcsfMapping(_C),
    E.CONTROL_NETSTATE_FAILED: OcsfMapping(_C, Severity.LOW),
    E.CONTROL_SIGNAL: OcsfMapping(_C),
    E.CONTROL_WORKERS: OcsfMapping(_C),
    E.CONTROL_WORKER_EXITED: OcsfMapping(_C, Severity.HIGH),
    E.FENCE_CANARY_PROBE: OcsfMapping(_C),
    E.FENCE_CANARY_ROUND: OcsfMapping(_C),
    E.FENCE_CANARY_ROUND_FAILED: OcsfMapping(_C, Severity.MEDIUM),
    E.FENCE_CANARY_UNVERIFIED: OcsfMapping(_C, Severity.MEDIUM),
    E.FENCE_WATCH: OcsfMapping(_C),
    E.FENCE_WATCH_ERROR: OcsfMapping(_C, Severity.LOW),
    E.INTERCEPTION_CA_MISMATCH: OcsfMapping(_C, Severity.HIGH),
    E.LIFECYCLE_BOUND: OcsfMapping(_C),
    E.LIFECYCLE_FAILED: OcsfMapping(_C, Severity.HIGH),
    E.LIFECYCLE_READY: OcsfMapping(_C),
    E.LIFECYCLE_REFUSED: OcsfMapping(_C, Severity.HIGH),
    E.LIFECYCLE_RESUMED: OcsfMapping(_C),
    E.LIFECYCLE_RUNNING: OcsfMapping(_C),
    E.LIMITS_MEMORY: OcsfMapping(_C),
    E.LIMITS_MEMORY_CGROUP_LEFT: OcsfMapping(_C, Severity.LOW),
    E.LIMITS_PIDS: OcsfMapping(_C),
    E.BOUNDARY_CAPABILITIES: OcsfMapping(_C),
    E.LIMITS_PIDS_CGROUP_LEFT: OcsfMapping(_C, Severity.LOW),
    E.LIMITS_PIDS_CGROUP_STALE_REMOVED: OcsfMapping(_C),
    E.TOPOLOGY: OcsfMapping(_C),
    # findings of their own
    E.ENFORCEMENT_LOST: OcsfMapping(_F, Severity.CRITICAL, finding="openshell.fence.enforcement_lost"),
    E.FENCE_CANARY_CONNECTION: OcsfMapping(_F, Severity.CRITICAL, finding="openshell.fence.path_out"),
}
del E

# the methods OCSF's http_method enumerates; another one stays in ``unmapped``
HTTP_METHODS = frozenset({"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"})
_REFUSED = frozenset({"deny", "denied", "refused"})
_SSRF = frozenset({UpstreamReason.INTERNAL_ADDRESS, UpstreamReason.ALWAYS_BLOCKED, UpstreamReason.NOT_IN_ALLOWED_IPS,
                   UpstreamReason.CONTROL_PLANE_PORT, UpstreamReason.CONTROL_LOCAL})  # fmt: skip
_HTTP_ENGINE = {
    ErrorCode.REQUEST_AUTHORITY_MISMATCH: "request-authority",
    ErrorCode.CREDENTIAL_ENDPOINT_MISMATCH: "credential-binding",
    ErrorCode.CREDENTIAL_UNAVAILABLE: "credential-binding",
}
# fields the rendering places in OCSF attributes, by where (everything else goes to ``unmapped``, so nothing the JSON
# line says is lost): any class, a network class, an HTTP request, a DNS question, the process behind an actor
_MAPPED_ANY = frozenset({"reason", "finding"})
_MAPPED_NETWORK = frozenset({"decision", "rule", "destination", "bytes_in", "bytes_out", "bytes_up", "bytes_down",
                             "duration_ms"})  # fmt: skip
_MAPPED_HTTP = frozenset({"path", "status", "tls"})
_MAPPED_ACTOR = frozenset({"binary", "ancestors", "cmdline_paths", "pid"})


def _text(value: FieldValue) -> str | None:
    return None if value is None else str(value)


def _int(value: FieldValue) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def scrub(text: str) -> str:
    """``text`` with every canonically spelled placeholder shown as ``[CREDENTIAL]``."""
    return _PLACEHOLDER.sub(REDACTED, text) if "penshell" in text or "PENSHELL" in text else text


def placeholder_scrub(placeholders: Iterable[str]) -> Callable[[str], str]:
    """:func:`scrub` that also hides the given placeholders (custom spellings from a credentials file): the
    boundary's, which knows the agent's placeholders from ``attach`` but not the credentials behind them."""
    custom = sorted({p for p in placeholders if p and _PLACEHOLDER.fullmatch(p) is None}, key=len, reverse=True)

    def run(text: str) -> str:
        text = scrub(text)
        for placeholder in custom:
            if placeholder in text:
                text = text.replace(placeholder, REDACTED)
        return text

    return run


def _endpoint(destination: str | None, *, port: int | None = None) -> dict[str, Any] | None:
    if not destination:
        return None
    host, sep, tail = destination.rpartition(":")
    if sep and tail.isdigit() and host:
        port = int(tail)
    else:
        host = destination
    host = host.strip("[]")
    out: dict[str, Any] = {}
    if host[:1].isdigit() or ":" in host:  # only these can be IP literals: names skip the parse
        try:
            out["ip"] = str(ipaddress.ip_address(host))
        except ValueError:
            pass
    if not out:
        out["hostname"] = scrub(host)
    if port is not None and 0 <= port <= 65535:
        out["port"] = port
    return out


def _endpoints(event: Event) -> dict[str, Any]:
    """``dst_endpoint`` (the destination, a DNS name's server side, a listener's address) and ``src_endpoint`` (a
    peer or client of ours); Network Activity needs one of them, so a daemon's own event names the daemon."""
    fields = event.fields
    out: dict[str, Any] = {}
    if event.name is EventName.DNS:
        dst = _endpoint(_text(fields.get("name")), port=53)
    else:
        dst = _endpoint(_text(fields.get("destination")) or _text(fields.get("address")))
    src = _endpoint(_text(fields.get("peer")) or _text(fields.get("client")))
    if dst is not None:
        out["dst_endpoint"] = dst
    if src is not None:
        out["src_endpoint"] = src
    if not out:
        out["dst_endpoint"] = {"name": event.component}
    return out


def _cmd_line(binary: str, argv_paths: FieldValue) -> str:
    """Rule 2: the resolved binary, then the absolute paths among its arguments that control was given (never the
    argv itself), placeholders hidden, bounded."""
    parts = [binary]
    if isinstance(argv_paths, list):
        parts += [str(p) for p in argv_paths[:32] if str(p).startswith("/")]
    return scrub(" ".join(parts))[:MAX_CMD_LINE]


def _workload_process(fields: Mapping[str, FieldValue]) -> dict[str, Any]:
    """Process Activity's ``process``: the workload process by its handle (the boundary never names a pid in its
    operations), its kind as the name, and its exit code when it ended with one."""
    process: dict[str, Any] = {"uid": _text(fields.get("handle")) or "workload"}
    kind, pid = _text(fields.get("kind")), _int(fields.get("pid"))
    if kind is not None:
        process["name"] = kind
    if pid is not None:
        process["pid"] = pid
    out: dict[str, Any] = {"process": process}
    result = fields.get("result")
    code = _int(result.get("code")) if isinstance(result, dict) else _int(fields.get("code"))
    if code is not None:
        out["exit_code"] = code
    return out


def _actor(fields: Mapping[str, FieldValue]) -> dict[str, Any] | None:
    binary, pid = _text(fields.get("binary")), _int(fields.get("pid"))
    if binary is None and pid is None:
        return None
    process: dict[str, Any] = {}
    if binary is not None:
        path = scrub(binary)[:MAX_CMD_LINE]
        process["name"] = posixpath.basename(path) or path
        if path.startswith("/"):
            process["path"] = path
            process["cmd_line"] = _cmd_line(path, fields.get("cmdline_paths"))
    if pid is not None:
        process["pid"] = pid
    ancestors = fields.get("ancestors")
    if isinstance(ancestors, list) and ancestors:
        process["ancestry"] = [{"path": scrub(str(a))[:MAX_CMD_LINE]} for a in ancestors[:64]]
    return {"process": process} if ("pid" in process or "name" in process) else None


@dataclass(frozen=True, slots=True)
class _Outcome:
    activity: Activity
    severity: Severity
    action_id: int | None = None  # 1 Allowed, 2 Denied
    disposition_id: int | None = None  # 1 Allowed, 2 Blocked
    status_id: int | None = None  # 1 Success, 2 Failure


_ACTION = {1: "Allowed", 2: "Denied"}
_DISPOSITION = {1: "Allowed", 2: "Blocked"}
_STATUS = {1: "Success", 2: "Failure"}


def _outcome(event: Event, mapping: OcsfMapping) -> _Outcome:
    fields = event.fields
    decision = _text(fields.get("decision"))
    activity, severity = mapping.activity, mapping.severity
    if event.name is EventName.EGRESS_REFUSED or (
        event.name is EventName.HTTP_TUNNEL and fields.get("stage") == "refused"
    ):
        return _Outcome(Activity.NET_REFUSE, max(severity, Severity.MEDIUM), 2, 2, 2)
    if decision is None:
        return _Outcome(activity, severity)
    if decision in ("allow", "audit", "answered"):
        return _Outcome(activity, severity, 1, 1, 1)
    if decision in _REFUSED:
        finding = fields.get("finding") is not None
        refused = Activity.NET_REFUSE if event.name is EventName.DNS else activity
        return _Outcome(refused, max(severity, Severity.HIGH if finding else Severity.MEDIUM), 2, 2, 2)
    failed = Activity.NET_FAIL if activity.ocsf_class is OcsfClass.NETWORK_ACTIVITY else activity
    return _Outcome(failed, max(severity, Severity.LOW), status_id=2)


def _firewall_rule(event: Event) -> dict[str, Any] | None:
    fields = event.fields
    if event.name not in (EventName.EGRESS, EventName.HTTP) or fields.get("decision") is None:
        return None
    reason = _text(fields.get("reason")) or ""
    if event.name is EventName.HTTP:
        engine = next((e for code, e in _HTTP_ENGINE.items() if code == reason), "l7")
    elif reason in _SSRF:
        engine = "ssrf"
    elif reason.startswith(("identity-", "binary-")):
        engine = "identity"
    else:
        engine = "l4"
    return {"name": _text(fields.get("rule")) or "-", "type": engine}


def _http_request(event: Event) -> dict[str, Any] | None:
    fields = event.fields
    method = _text(fields.get("method"))
    if event.name is not EventName.HTTP:
        return None
    url: dict[str, Any] = {
        "scheme": "https" if fields.get("tls") else "http",
        "path": scrub(_text(fields.get("path")) or "/"),
    }
    endpoint = _endpoint(_text(fields.get("destination")))
    if endpoint is not None:
        url["hostname"] = endpoint.get("hostname") or endpoint.get("ip")
        if "port" in endpoint:
            url["port"] = endpoint["port"]
    return {"http_method": method, "url": url} if method in HTTP_METHODS else {"url": url}


def _message(event: Event) -> str:
    fields = event.fields
    decision = _text(fields.get("decision"))
    target = _text(fields.get("destination")) or _text(fields.get("name"))
    parts = [str(event.name)]
    if decision is not None:
        parts.append(decision)
    if event.name is EventName.HTTP and fields.get("method"):
        parts.append(f"{fields['method']} {target or '?'}{_text(fields.get('path')) or ''}")
    elif target is not None:
        parts.append(target)
    return scrub(" ".join(parts))


def _mapped(event: Event, cls: OcsfClass, with_actor: bool) -> frozenset[str]:
    """The fields this rendering placed in OCSF attributes."""
    mapped = _MAPPED_ANY
    if cls in (OcsfClass.NETWORK_ACTIVITY, OcsfClass.HTTP_ACTIVITY):
        mapped |= _MAPPED_NETWORK
        if event.name is EventName.DNS:
            mapped |= {"name"}
        if event.name is EventName.HTTP:
            mapped |= _MAPPED_HTTP | ({"method"} if event.fields.get("method") in HTTP_METHODS else set())
    if with_actor:
        mapped |= _MAPPED_ACTOR
    elif cls is OcsfClass.PROCESS_ACTIVITY:
        mapped |= {"pid"}
    return mapped


def _unmapped(event: Event, mapped: frozenset[str]) -> dict[str, FieldValue]:
    out: dict[str, FieldValue] = {"component": event.component}
    if event.sandbox is not None:
        out["sandbox"] = event.sandbox
    out.update({k: v for k, v in event.fields.items() if k not in mapped})
    return out


def _base(event: Event, activity: Activity, severity: Severity, time_ms: int) -> dict[str, Any]:
    return {**_head(activity, severity), "time": time_ms, **_context(event.name, event.component, event.sandbox)}


@functools.cache
def _head(activity: Activity, severity: Severity) -> dict[str, Any]:
    """The class, activity and severity attributes (a handful of combinations: built once each, never mutated)."""
    cls = activity.ocsf_class
    class_name, category_name, _ = _CLASS[cls]
    return {
        "class_uid": int(cls), "class_name": class_name,
        "category_uid": int(cls) // 1000, "category_name": category_name,
        "activity_id": activity.activity_id, "activity_name": activity.caption,
        "type_uid": int(cls) * 100 + activity.activity_id, "type_name": f"{class_name}: {activity.caption}",
        "severity_id": int(severity), "severity": _SEVERITY_NAME[int(severity)],
    }  # fmt: skip


@functools.lru_cache(maxsize=1024)
def _context(name: EventName, component: str, sandbox: str | None) -> dict[str, Any]:
    """``metadata`` and ``device``: the product, the event's own name and who wrote it (shared, never mutated)."""
    return {
        "metadata": {
            "version": OCSF_VERSION, "product": {"name": PRODUCT, "vendor_name": PRODUCT},
            "profiles": ["host", "security_control"], "event_code": str(name), "log_provider": component,
        },
        "device": {"type_id": 0, "name": sandbox or component},
    }  # fmt: skip


def _objects(event: Event) -> list[dict[str, Any]]:
    """The OCSF objects of one event: its own, then the Detection Finding it raises (if any)."""
    mapping = OCSF_MAP[event.name]
    fields = event.fields
    outcome = _outcome(event, mapping)
    time_ms = event.time_ms
    primary = _base(event, outcome.activity, outcome.severity, time_ms)
    if outcome.action_id is not None:
        primary["action_id"], primary["action"] = outcome.action_id, _ACTION[outcome.action_id]
    if outcome.disposition_id is not None:
        primary["disposition_id"], primary["disposition"] = outcome.disposition_id, _DISPOSITION[outcome.disposition_id]
    if outcome.status_id is not None:
        primary["status_id"], primary["status"] = outcome.status_id, _STATUS[outcome.status_id]
    reason = _text(fields.get("reason"))
    if reason is not None:
        primary["status_detail"] = scrub(reason)[:MAX_CMD_LINE]
    primary["message"] = _message(event)
    cls = outcome.activity.ocsf_class
    if cls in (OcsfClass.NETWORK_ACTIVITY, OcsfClass.HTTP_ACTIVITY):
        primary.update(_endpoints(event))
        rule = _firewall_rule(event)
        if rule is not None:
            primary["firewall_rule"] = rule
        sent = _int(fields.get("bytes_out", fields.get("bytes_up")))
        received = _int(fields.get("bytes_in", fields.get("bytes_down")))
        traffic = {k: v for k, v in (("bytes_out", sent), ("bytes_in", received)) if v is not None}
        if traffic:
            primary["traffic"] = traffic
        duration = fields.get("duration_ms")
        if isinstance(duration, int | float) and not isinstance(duration, bool):
            primary["duration"] = int(duration)
        request = _http_request(event)
        if request is not None:
            primary["http_request"] = request
            status = _int(fields.get("status"))
            if status is not None:
                primary["http_response"] = {"code": status}
    actor = _actor(fields)
    if cls is OcsfClass.PROCESS_ACTIVITY:
        primary["actor"] = {"app_name": event.component}  # the daemon that started or ended it
        primary.update(_workload_process(fields))
    elif actor is not None and cls is not OcsfClass.DETECTION_FINDING:
        primary["actor"] = actor
    finding_type = mapping.finding or _text(fields.get("finding"))
    if cls is OcsfClass.DETECTION_FINDING:
        primary["finding_info"] = _finding_info(event, finding_type or str(event.name), time_ms)
    primary["unmapped"] = _unmapped(
        event, _mapped(event, cls, "actor" in primary and cls is not OcsfClass.PROCESS_ACTIVITY)
    )
    objects = [primary]
    if finding_type is not None and cls is not OcsfClass.DETECTION_FINDING:
        objects.append(_finding(event, finding_type, primary, time_ms))
    return objects


def _finding_info(event: Event, finding_type: str, time_ms: int) -> dict[str, Any]:
    return {"uid": f"{event.sandbox or event.component}/{finding_type}/{time_ms}", "title": finding_type,
            "types": [finding_type]}  # fmt: skip


def _finding(event: Event, finding_type: str, primary: Mapping[str, Any], time_ms: int) -> dict[str, Any]:
    finding = _base(event, Activity.FINDING_CREATE, Severity(max(primary["severity_id"], Severity.HIGH)), time_ms)
    finding["finding_info"] = _finding_info(event, finding_type, time_ms)
    for key in ("action_id", "action", "disposition_id", "disposition", "status_detail", "message"):
        if key in primary:
            finding[key] = primary[key]
    finding["unmapped"] = {"component": event.component, **({"sandbox": event.sandbox} if event.sandbox else {}),
                           "related_class_uid": primary["class_uid"]}  # fmt: skip
    return finding


def ocsf_lines(event: Event) -> str:
    """The event's OCSF objects, one JSON line each (newlines included)."""
    return "".join(_line(event, obj) for obj in _objects(event))


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# An object starts with _head's attributes, "time", then _context's: those are the same for every event of a kind,
# so their JSON is written once per kind and the line is that text around the event's own part.
_HEAD_LEN = 10
_FIXED: dict[tuple[object, ...], tuple[str, str]] = {}


def _line(event: Event, obj: dict[str, Any]) -> str:
    key = (obj["class_uid"], obj["activity_id"], obj["severity_id"], event.name, event.component, event.sandbox)
    fixed = _FIXED.get(key)
    if fixed is None:
        items = list(obj.items())
        assert items[_HEAD_LEN][0] == "time" and [k for k, _ in items[_HEAD_LEN + 1 : _HEAD_LEN + 3]] == [
            "metadata", "device"]  # fmt: skip
        head = _dumps(dict(items[:_HEAD_LEN]))[:-1] + ',"time":'
        context = "," + _dumps(dict(items[_HEAD_LEN + 1 : _HEAD_LEN + 3]))[1:-1]
        if len(_FIXED) >= 4096:
            _FIXED.clear()
        fixed = _FIXED[key] = (head, context)
    rest = dict(itertools.islice(obj.items(), _HEAD_LEN + 3, None))
    return (
        f"{fixed[0]}{obj['time']}{fixed[1]},{_dumps(rest)[1:]}\n" if rest else f"{fixed[0]}{obj['time']}{fixed[1]}}}\n"
    )


_SHORT_ACTIVITY = {Activity.NET_TRAFFIC: "DNS"}
MAX_SHORTHAND_FIELDS = 200
_SHOWN = frozenset({"binary", "pid", "ancestors", "destination", "binary_sha256", "start_time"})


def shorthand(event: Event) -> str:
    """The one-line human form of §4.1: ``NET:OPEN [MED] DENIED python3(42) -> blocked.com:443 [reason:…]``.

    Not terminal-safe by itself: the caller escapes it (the agent names binaries and hosts)."""
    primary = _objects(event)[0]
    fields = event.fields
    activity = Activity((OcsfClass(primary["class_uid"]), primary["activity_id"], primary["activity_name"]))
    head = f"{_CLASS[activity.ocsf_class][2]}:{_SHORT_ACTIVITY.get(activity, activity.caption.upper())}"
    parts = [head, f"[{SEVERITY_SHORT[primary['severity_id']]}]"]
    if "action" in primary:
        parts.append(str(primary["action"]).upper())
    process = (primary.get("actor") or {}).get("process") or {}
    who = process.get("name")
    if who is not None and "pid" in process:
        who = f"{who}({process['pid']})"
    target = _text(fields.get("destination"))
    if event.name is EventName.DNS:
        target = f"{fields.get('name', '?')} {fields.get('qtype', '')}".rstrip()
    elif event.name is EventName.HTTP and fields.get("method"):
        target = f"{fields['method']} {target or '?'}{_text(fields.get('path')) or ''}"
    if who is not None and target is not None:
        parts.append(f"{who} -> {target}")
    elif target is not None:
        parts.append(f"-> {target}")
    elif who is not None:
        parts.append(str(who))
    if target is None or "action" not in primary:
        rest = " ".join(f"{k}={_compact(v)}" for k, v in fields.items() if k not in _SHOWN)
        text = f"{event.name} {rest}".rstrip()
        parts.append(text if len(text) <= MAX_SHORTHAND_FIELDS else text[: MAX_SHORTHAND_FIELDS - 1] + "\u2026")
    elif primary.get("status_detail"):
        parts.append(f"[reason:{primary['status_detail']}]")
    elif primary.get("firewall_rule", {}).get("name", "-") != "-":
        parts.append(f"[rule:{primary['firewall_rule']['name']}]")
    return scrub(" ".join(parts))


def _compact(value: FieldValue) -> str:
    if isinstance(value, str):
        return value if value and " " not in value else json.dumps(value, ensure_ascii=False)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
