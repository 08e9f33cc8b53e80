"""Control's certificate facts: expiry within seven days is named, with when; the rendered policy is compared."""

from __future__ import annotations

import datetime

import pytest

from supervisor.control.certificates import EXPIRY_WARNING, CertificateFacts, expiring

NOW = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)


def facts(bootstrap: datetime.timedelta | None, ca: datetime.timedelta | None, **kw: str | None) -> CertificateFacts:
    return CertificateFacts(
        bootstrap_not_after=None if bootstrap is None else NOW + bootstrap,
        interception_not_after=None if ca is None else NOW + ca,
        interception_ca_sha256="sha256:" + "a" * 64,
        rendered_policy_digest=kw.get("rendered"),
        started_policy_digest=kw.get("started"),
    )


@pytest.mark.parametrize(
    ("bootstrap", "ca", "want"),
    [
        (datetime.timedelta(days=30), datetime.timedelta(days=365), []),
        (EXPIRY_WARNING + datetime.timedelta(seconds=1), None, []),
        (EXPIRY_WARNING, None, [("bootstrap certificate", "expires 2026-12-08T12:00:00Z (in 7 days)")]),
        (
            datetime.timedelta(days=1, hours=2),
            None,
            [("bootstrap certificate", "expires 2026-12-02T14:00:00Z (in 1 day)")],
        ),
        (datetime.timedelta(hours=5), None, [("bootstrap certificate", "expires 2026-12-01T17:00:00Z (in 5 h)")]),
        (None, datetime.timedelta(seconds=-1), [("interception CA", "expired 2026-12-01T11:59:59Z")]),
    ],
)
def test_expiry_is_named_within_seven_days(
    bootstrap: datetime.timedelta | None, ca: datetime.timedelta | None, want: list[tuple[str, str]]
) -> None:
    assert expiring(facts(bootstrap, ca), NOW) == want


def test_status_says_whether_control_started_from_the_rendered_policy() -> None:
    digest = "sha256:" + "1" * 64
    same = facts(None, None, rendered=digest, started=digest).to_json(NOW)
    assert same["started_from_rendered_policy"] is True
    other = facts(None, None, rendered=digest, started="sha256:" + "2" * 64).to_json(NOW)
    assert other["started_from_rendered_policy"] is False
    assert facts(None, None, started=digest).to_json(NOW)["started_from_rendered_policy"] is None
