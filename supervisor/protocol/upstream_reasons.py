"""Why control made no upstream connection: one catalogue for both sides (docs/reference/policy.md §3.5, §3.17).

Control's dial (``supervisor/control/upstream.py``) raises these; the value travels in the egress reply's
``reason`` and in events, and the boundary's proxy listener renders a reason whose status is 403 as
``ssrf_denied`` (a refusal of the destination's address) rather than ``policy_denied``. Both read the status
and that distinction from here; neither keeps a list of its own.
"""

from __future__ import annotations

import enum

__all__ = ["UpstreamReason"]


class UpstreamReason(enum.StrEnum):
    """Why an upstream connection was not made; values are the strings used in events and egress replies."""

    INVALID_HOST = "invalid-host"
    INVALID_PORT = "invalid-port"
    NXDOMAIN = "nxdomain"
    NO_ADDRESSES = "no-addresses"
    RESOLVE_FAILED = "resolve-failed"
    RESOLVE_TIMEOUT = "resolve-timeout"
    INTERNAL_ADDRESS = "internal-address"
    ALWAYS_BLOCKED = "always-blocked"
    NOT_IN_ALLOWED_IPS = "allowed-ips-check-failed"
    INVALID_ALLOWED_IPS = "invalid-allowed-ips"
    CONTROL_PLANE_PORT = "control-plane-port"
    CONTROL_LOCAL = "control-local"
    CONNECT_REFUSED = "connect-refused"
    CONNECT_TIMEOUT = "connect-timeout"
    CONNECT_FAILED = "connect-failed"

    @property
    def status(self) -> int:
        """What a proxy answers: 400 for a host we refuse to parse, 403 for a destination refused for its address,
        502 for resolution and connection failures, 504 for timeouts."""
        return _STATUS[self]

    @property
    def ssrf(self) -> bool:
        """A destination refusal (answered ``403 ssrf_denied``), as opposed to a failure to get there."""
        return _STATUS[self] == 403


_STATUS = {
    UpstreamReason.INVALID_HOST: 400,
    UpstreamReason.INVALID_PORT: 400,
    UpstreamReason.NXDOMAIN: 502,
    UpstreamReason.NO_ADDRESSES: 502,
    UpstreamReason.RESOLVE_FAILED: 502,
    UpstreamReason.RESOLVE_TIMEOUT: 504,
    UpstreamReason.INTERNAL_ADDRESS: 403,
    UpstreamReason.ALWAYS_BLOCKED: 403,
    UpstreamReason.NOT_IN_ALLOWED_IPS: 403,
    UpstreamReason.INVALID_ALLOWED_IPS: 403,
    UpstreamReason.CONTROL_PLANE_PORT: 403,
    UpstreamReason.CONTROL_LOCAL: 403,
    UpstreamReason.CONNECT_REFUSED: 502,
    UpstreamReason.CONNECT_TIMEOUT: 504,
    UpstreamReason.CONNECT_FAILED: 502,
}
