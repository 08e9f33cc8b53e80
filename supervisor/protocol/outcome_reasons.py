"""Why a connection, tunnel or request ended without being relayed: the one catalogue of the ``reason`` both
daemons put in their events and refusals beside the policy's own (``DenyReason``), control's dial
(``UpstreamReason``) and the request reader's (``HeadProblem``).

The values are what operators grep and what ``/metrics`` labels carry (``supervisor/control/metrics.py`` takes
its list from here); a new reason is added here first, and no module spells one as a string literal
(``tests/unit/test_catalogues.py``).
"""

from __future__ import annotations

import enum

__all__ = ["OutcomeReason"]


class OutcomeReason(enum.StrEnum):
    """An outcome's reason; the value is the string in events, egress replies and metric labels."""

    # the boundary's egress: the link to control, the sandbox's state, the connection's owner
    NO_EGRESS_LINK = "no-egress-link"
    LINK_FAILED = "link-failed"
    SANDBOX_ENDED = "sandbox-ended"
    IDENTITY_UNRESOLVED = "identity-unresolved"
    DENIED = "denied"  # a refusal whose reply named no reason

    # control's egress streams
    UNKNOWN_EGRESS_REQUEST = "unknown-egress-request"
    MALFORMED_REQUEST = "malformed-request"
    MALFORMED_DNS_REQUEST = "malformed-dns-request"
    L7_INSPECTION_UNAVAILABLE = "l7-inspection-unavailable"
    INSPECTION_REQUIRED = "inspection-required"
    CANCELLED = "cancelled"
    INTERNAL_ERROR = "internal-error"

    # an inspected tunnel: the agent's TLS, the origin's, the policy in force
    POLICY_REVISION = "policy-revision"
    ORIGIN_ANSWERED_FIRST = "origin-answered-first"
    SNIFF_TIMEOUT = "sniff-timeout"
    INVALID_CLIENT_HELLO = "invalid-client-hello"
    CLIENT_HELLO_INCOMPLETE = "client-hello-incomplete"
    NO_LEAF = "no-leaf"
    AGENT_TLS_HANDSHAKE_FAILED = "agent-tls-handshake-failed"
    UPSTREAM_TLS_FAILED = "upstream-tls-failed"
    UPSTREAM_FAILED = "upstream-failed"
    UPSTREAM_TIMEOUT = "upstream-timeout"

    # one request inside a tunnel
    REQUEST_AUTHORITY_MISMATCH = "request-authority-mismatch"
    UNSUPPORTED_L7_PROTOCOL = "unsupported-l7-protocol"
    WEBSOCKET_UPGRADE_NOT_ALLOWED = "websocket-upgrade-not-allowed"
    HEAD_TIMEOUT = "head-timeout"
    TRUNCATED_HEAD = "truncated-head"
    INVALID_REQUEST = "invalid-request"
    INVALID_AUTHORITY = "invalid-authority"
    INVALID_BODY = "invalid-body"

    # inference.local
    INFERENCE_NOT_SERVED = "inference-not-served"
    INFERENCE_NEEDS_TLS = "inference-needs-tls"
    INFERENCE_PATH_DENIED = "inference-path-denied"
    INFERENCE_BODY = "inference-body"
    INFERENCE_MODEL_DENIED = "inference-model-denied"
    INFERENCE_REQUEST_TOO_LARGE = "inference-request-too-large"
    CREDENTIAL_UNAVAILABLE = "credential-unavailable"
