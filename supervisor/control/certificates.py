"""What control knows about its own certificates and where it started from, as status and readiness.

- **Expiry.** The bootstrap leaf (the link's mTLS identity) and the interception CA (what the agent trusts) both
  end; neither is renewed in place (the bootstrap Secret is immutable; a new CA would break every agent client).
  Within ``EXPIRY_WARNING`` of either end, control is not ready and says which, and when; a
  ``certificate.expiring`` event is logged once per certificate.
- **The interception CA the agent trusts.** On ``resume`` the boundary reports the fingerprint of the CA it
  was given at attach; a control that restarted with another CA (a lost or replaced Secret) cannot inspect
  anything the agent will accept, so the mismatch is logged, shown in status and makes control not ready.
- **The policy it was rendered with.** ``k8s render`` records the policy's digest in the bootstrap bundle;
  status shows it beside the digest of the policy control loaded at start, so an operator can tell whether
  control started from the rendered revision (later revisions are policy generations, as always).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from supervisor.protocol.json_value import JsonValue

__all__ = ["EXPIRY_WARNING", "CertificateFacts", "expiring"]

EXPIRY_WARNING = datetime.timedelta(days=7)


@dataclass(frozen=True)
class CertificateFacts:
    bootstrap_not_after: datetime.datetime | None
    interception_not_after: datetime.datetime | None
    interception_ca_sha256: str | None
    rendered_policy_digest: str | None  # from the bundle's policy.sha256; None when not rendered
    started_policy_digest: str | None  # the policy control loaded at start

    def named(self) -> dict[str, datetime.datetime | None]:
        return {"bootstrap certificate": self.bootstrap_not_after, "interception CA": self.interception_not_after}

    def to_json(self, now: datetime.datetime) -> dict[str, JsonValue]:
        return {
            "bootstrap_not_after": _iso(self.bootstrap_not_after),
            "interception_ca_not_after": _iso(self.interception_not_after),
            "interception_ca_sha256": self.interception_ca_sha256,
            "expiring": [f"{name} {when}" for name, when in expiring(self, now)],
            "rendered_policy_digest": self.rendered_policy_digest,
            "started_policy_digest": self.started_policy_digest,
            "started_from_rendered_policy": (
                None
                if self.rendered_policy_digest is None
                else self.rendered_policy_digest == self.started_policy_digest
            ),
        }


def _iso(when: datetime.datetime | None) -> str | None:
    return None if when is None else when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def expiring(facts: CertificateFacts, now: datetime.datetime) -> list[tuple[str, str]]:
    """``(certificate, "expires <when> (in N days)" | "expired <when>")`` for each one within the warning."""
    out = []
    for name, not_after in facts.named().items():
        if not_after is None or not_after - now > EXPIRY_WARNING:
            continue
        if not_after <= now:
            out.append((name, f"expired {_iso(not_after)}"))
        else:
            left = not_after - now
            days = left.days
            span = f"{days} day{'s' if days != 1 else ''}" if days else f"{int(left.total_seconds() // 3600)} h"
            out.append((name, f"expires {_iso(not_after)} (in {span})"))
    return out
