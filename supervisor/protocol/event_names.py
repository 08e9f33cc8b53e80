"""Every event name either daemon writes, defined once (docs/design.md "Events").

An event is one JSON line whose ``event`` field is one of these values (``supervisor/jsonlog.py`` writes it;
``JsonLog.emit`` takes only an :class:`EventName`). Names are ``family.what`` in lower case with dashes; the
family is what ``openshell-sandbox logs --event FAMILY`` filters on. A few decision events are bare families
(``egress``, ``dns``, ``http``). The CLI's human rendering reads the same members, and docs/design.md
"Event names" lists them (a test keeps the list and this catalogue equal). No module outside this one spells
an event name as a string (tests/unit/test_catalogues.py).
"""

from __future__ import annotations

import enum

__all__ = ["EventName"]


class EventName(enum.StrEnum):
    """The ``event`` field of a daemon's JSON line; the value is exactly the string written."""

    # agent
    AGENT_EXIT_ACK_FAILED = "agent.exit-ack-failed"
    AGENT_EXITED = "agent.exited"
    AGENT_FILESYSTEM = "agent.filesystem"
    AGENT_LAUNCH_FAILED = "agent.launch-failed"
    # api
    API_LISTENING = "api.listening"
    API_OPERATOR = "api.operator"
    API_RATE_LIMITED = "api.rate-limited"
    API_REFUSED = "api.refused"
    # bootstrap
    BOOTSTRAP_POLICY_DIGEST_UNREADABLE = "bootstrap.policy-digest-unreadable"
    # boundary
    BOUNDARY_CAPABILITIES = "boundary.capabilities"
    BOUNDARY_END_ALL_FAILED = "boundary.end-all-failed"
    BOUNDARY_END_ALL_TIMEOUT = "boundary.end-all-timeout"
    BOUNDARY_EXIT = "boundary.exit"
    BOUNDARY_EXIT_LINGER_EXPIRED = "boundary.exit-linger-expired"
    BOUNDARY_LISTENING = "boundary.listening"
    BOUNDARY_REFUSED = "boundary.refused"
    BOUNDARY_SIGNAL = "boundary.signal"
    BOUNDARY_TEST_KNOB = "boundary.test-knob"
    # certificate
    CERTIFICATE_EXPIRING = "certificate.expiring"
    # control
    CONTROL_EXIT = "control.exit"
    CONTROL_FAILED = "control.failed"
    CONTROL_NETSTATE = "control.netstate"
    CONTROL_NETSTATE_FAILED = "control.netstate-failed"
    CONTROL_SIGNAL = "control.signal"
    CONTROL_WORKERS = "control.workers"
    CONTROL_WORKER_EXITED = "control.worker-exited"
    # dns
    DNS = "dns"
    # egress
    EGRESS = "egress"
    EGRESS_ERROR = "egress.error"
    EGRESS_REFUSED = "egress.refused"
    EGRESS_REVOKED = "egress.revoked"
    # enforcement-lost
    ENFORCEMENT_LOST = "enforcement-lost"
    # exec
    EXEC_STREAM_BROKEN = "exec.stream-broken"
    EXEC_STREAM_ERROR = "exec.stream-error"
    # fence
    FENCE_CANARY_CONNECTION = "fence.canary-connection"
    FENCE_CANARY_LISTENING = "fence.canary-listening"
    FENCE_CANARY_PROBE = "fence.canary-probe"
    FENCE_CANARY_ROUND = "fence.canary-round"
    FENCE_CANARY_ROUND_FAILED = "fence.canary-round-failed"
    FENCE_CANARY_UNVERIFIED = "fence.canary-unverified"
    FENCE_WATCH = "fence.watch"
    FENCE_WATCH_ERROR = "fence.watch-error"
    # forward
    FORWARD_CLOSED = "forward.closed"
    # http
    HTTP = "http"
    HTTP_TUNNEL = "http.tunnel"
    # identity
    IDENTITY_CONNECT_TIMEOUT = "identity.connect-timeout"
    IDENTITY_CONNECT_UNRECORDED = "identity.connect-unrecorded"
    # inference
    INFERENCE = "inference"
    INFERENCE_ROUTES = "inference.routes"
    # interception
    INTERCEPTION_CA_MISMATCH = "interception.ca-mismatch"
    # lifecycle
    LIFECYCLE_BOUND = "lifecycle.bound"
    LIFECYCLE_FAILED = "lifecycle.failed"
    LIFECYCLE_READY = "lifecycle.ready"
    LIFECYCLE_REFUSED = "lifecycle.refused"
    LIFECYCLE_RESUMED = "lifecycle.resumed"
    LIFECYCLE_RUNNING = "lifecycle.running"
    # limits
    LIMITS_PIDS = "limits.pids"
    LIMITS_PIDS_CGROUP_LEFT = "limits.pids-cgroup-left"
    LIMITS_PIDS_CGROUP_STALE_REMOVED = "limits.pids-cgroup-stale-removed"
    LIMITS_MEMORY = "limits.memory"
    LIMITS_MEMORY_CGROUP_LEFT = "limits.memory-cgroup-left"
    # link
    LINK_CLOSED = "link.closed"
    LINK_DOWN = "link.down"
    LINK_FAILED = "link.failed"
    LINK_REFUSED = "link.refused"
    LINK_UP = "link.up"
    # metrics
    METRICS_LISTENING = "metrics.listening"
    # policy
    POLICY_ACK_FAILED = "policy.ack-failed"
    POLICY_ACKNOWLEDGED = "policy.acknowledged"
    POLICY_APPLIED = "policy.applied"
    POLICY_GENERATION = "policy.generation"
    POLICY_IDENTITY_RELAXED = "policy.identity-relaxed"
    POLICY_WATCH = "policy.watch"
    # process
    PROCESS_END_ALL = "process.end-all"
    PROCESS_EXITED = "process.exited"
    PROCESS_LEFTOVER = "process.leftover"
    PROCESS_OUTPUT = "process.output"
    PROCESS_SIGNALLED = "process.signalled"
    PROCESS_START_FAILED = "process.start-failed"
    PROCESS_STARTED = "process.started"
    PROCESS_TERMINATE = "process.terminate"
    PROCESS_UNOWNED_REAPED = "process.unowned-reaped"
    # proxy
    PROXY_ERROR = "proxy.error"
    PROXY_LISTENING = "proxy.listening"
    PROXY_REFUSED = "proxy.refused"
    # topology
    TOPOLOGY = "topology"
