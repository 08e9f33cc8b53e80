"""Egress capture inside the agent's network namespace (docs/spec/boundary.md §4, §5.4).

- :mod:`.setup` runs in the launcher inside the agent's namespace: ``prepare`` (lo, any-IP routes, listeners
  as fds), ``inspect`` (fence read-back + fingerprint), ``probe``, ``open_sock_diag``; it pulls in pyroute2
  when called.
- :mod:`.identity` resolves the binary behind an accepted connection (the boundary, before reading a byte).
- The proxy listener's head parser and answers live in :mod:`supervisor.protocol.proxy_head` (shared with
  control's proxy-pod listener); they are re-exported here.
- :mod:`.dns_stub` decides which DNS queries may be forwarded and frames DNS over TCP.
"""

from supervisor.boundary.capture.dns_stub import StubAction, StubDecision, TcpFramer, decide
from supervisor.boundary.capture.identity import Identity, IdentityResolver, IdentityStage, IdentityUnresolved
from supervisor.boundary.capture.setup import CaptureSetupError, inspect, prepare, probe
from supervisor.protocol.proxy_head import (
    CONNECT_ESTABLISHED,
    HEAD_READ_DEADLINE_S,
    MAX_HEAD_BYTES,
    ForwardBody,
    ProxyReject,
    ProxyTarget,
    parse_head,
    render_denied,
    render_reply,
)

__all__ = [
    "CONNECT_ESTABLISHED",
    "HEAD_READ_DEADLINE_S",
    "MAX_HEAD_BYTES",
    "CaptureSetupError",
    "ForwardBody",
    "Identity",
    "IdentityResolver",
    "IdentityStage",
    "IdentityUnresolved",
    "ProxyReject",
    "ProxyTarget",
    "StubAction",
    "StubDecision",
    "TcpFramer",
    "decide",
    "inspect",
    "parse_head",
    "prepare",
    "probe",
    "render_denied",
    "render_reply",
]
