"""The anonymous activity counters of docs/reference/policy.md §4.3: what every connection and request counts as.

Control counts each connection attempt and each inspected request once, as allowed or denied, and a denial under
one of the §4.3 deny groups (``supervisor/control/metrics.py`` classifies its events). The groups are a closed set
and are the only thing a denial is counted by: never a host, a port, a binary or a path.

Rules:

1. A connection that is inspected is counted by its requests, not at L4 (§4.3): its ``egress`` allow is not a
   count of its own.
2. ``network_activity_count`` counts every attempt and request; ``denied_action_count`` the denied ones, each in
   exactly one group of ``denials_by_group`` (``unknown`` when none applies), so the groups add up to it.
"""

from __future__ import annotations

import enum
import threading
from typing import TypedDict

__all__ = ["ActivityCounters", "ActivityJson", "DenyGroup"]


class DenyGroup(enum.StrEnum):
    """§4.3's allow-list of deny groups; the value is the key in ``denials_by_group`` and the metric label."""

    CONNECT_POLICY = "connect_policy"  # the L4 policy refused a CONNECT or transparent connection
    FORWARD_POLICY = "forward_policy"  # the L4 policy refused a plain-HTTP forward-proxy request
    L7_POLICY = "l7_policy"  # an inspected request refused by its endpoint's rules or credential binding
    L7_PARSE_REJECTION = "l7_parse_rejection"  # an inspected request or tunnel refused before policy: malformed
    SSRF = "ssrf"  # the destination resolved to an address the policy does not name
    BYPASS = "bypass"  # a connection around the boundary's fence (never one of control's: see docs/design.md)
    POLICY_STALE = "policy_stale"  # no valid policy in force (quarantine)
    UNKNOWN = "unknown"


class ActivityJson(TypedDict):
    """``GET /v1/activity`` and ``status``'s ``activity``: §4.3's flush, as a JSON object."""

    network_activity_count: int
    denied_action_count: int
    denials_by_group: dict[str, int]


class ActivityCounters:
    """§4.3's three numbers, kept since the daemon started; safe to count from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.network_activity_count = 0
        self.denied_action_count = 0
        self.denials_by_group: dict[DenyGroup, int] = dict.fromkeys(DenyGroup, 0)

    def count(self, denied_group: DenyGroup | None) -> None:
        """One attempt or request; ``denied_group`` is its deny group when it was denied, else ``None``."""
        with self._lock:
            self.network_activity_count += 1
            if denied_group is not None:
                self.denied_action_count += 1
                self.denials_by_group[denied_group] += 1

    def to_json(self) -> ActivityJson:
        with self._lock:
            return {
                "network_activity_count": self.network_activity_count,
                "denied_action_count": self.denied_action_count,
                "denials_by_group": {str(group): n for group, n in self.denials_by_group.items()},
            }
