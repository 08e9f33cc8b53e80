"""Per-certificate validity for ``certs issue``: ``--not-before`` / ``--not-after``, and the clock
the issuing function takes."""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

import pytest
from cryptography import x509

from supervisor.cli.certs import parse_bound, resolve_bounds
from supervisor.cli.main import main
from supervisor.protocol.certs import NOT_BEFORE_SKEW, issue_bundle
from tests.certs_fixtures import SAMPLE_CLAIMS

NOW = datetime.datetime(2026, 6, 1, 12, 0, 0, tzinfo=datetime.UTC)
DAY = datetime.timedelta(days=1)


def _dates(path: Path) -> tuple[datetime.datetime, datetime.datetime]:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    return cert.not_valid_before_utc, cert.not_valid_after_utc


@pytest.mark.parametrize(
    ("text", "subjects", "when"),
    [
        ("control=+30s", ("control",), datetime.timedelta(seconds=30)),
        ("boundary=-5m", ("boundary",), -datetime.timedelta(minutes=5)),
        ("ca=now", ("ca",), datetime.timedelta(0)),
        ("+2h", ("ca", "control", "boundary", "operator"), datetime.timedelta(hours=2)),
        ("operator=-1m", ("operator",), -datetime.timedelta(minutes=1)),
        ("control=2026-12-01T15:00:00Z", ("control",), datetime.datetime(2026, 12, 1, 15, tzinfo=datetime.UTC)),
        ("2026-12-01T15:00:00+00:00", ("ca", "control", "boundary", "operator"),
         datetime.datetime(2026, 12, 1, 15, tzinfo=datetime.UTC)),
    ],
)  # fmt: skip
def test_bounds_parse(text: str, subjects: tuple[str, ...], when: object) -> None:
    assert parse_bound(text) == (subjects, when)


@pytest.mark.parametrize(
    "text", ["admin=+1s", "control=", "control=tomorrow", "control=2026-12-01T15:00:00+02:00", "+1w", "5m"]
)
def test_bad_bounds_are_usage_errors(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_bound(text)


def test_later_flag_wins_and_offsets_are_from_now() -> None:
    bounds = [parse_bound("+1h"), parse_bound("control=-1m")]
    assert resolve_bounds(bounds, NOW) == {
        "ca": NOW + datetime.timedelta(hours=1),
        "control": NOW - datetime.timedelta(minutes=1),
        "boundary": NOW + datetime.timedelta(hours=1),
        "operator": NOW + datetime.timedelta(hours=1),
    }


def test_issue_with_a_clock_and_per_role_bounds(tmp_path: Path) -> None:
    later = NOW + datetime.timedelta(seconds=30)
    issue_bundle(tmp_path, SAMPLE_CLAIMS, now=NOW, validity=DAY, not_before={"control": later},
                 not_after={"boundary": NOW + datetime.timedelta(hours=1)})  # fmt: skip
    assert _dates(tmp_path / "control" / "cert.pem") == (later, NOW + DAY)
    assert _dates(tmp_path / "boundary" / "cert.pem") == (NOW - NOT_BEFORE_SKEW, NOW + datetime.timedelta(hours=1))
    assert _dates(tmp_path / "control" / "ca.pem") == (NOW - NOT_BEFORE_SKEW, NOW + DAY)


@pytest.mark.parametrize(
    ("not_before", "not_after", "message"),
    [
        ({"control": NOW + DAY}, {"control": NOW}, "not before"),
        ({}, {"boundary": NOW - datetime.timedelta(hours=1)}, "not before"),  # before the default not-before
        ({"operator": NOW}, {}, "operator"),
    ],
)
def test_empty_window_or_unknown_certificate_writes_nothing(
    tmp_path: Path, not_before: dict[str, datetime.datetime], not_after: dict[str, datetime.datetime], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        issue_bundle(tmp_path / "out", SAMPLE_CLAIMS, now=NOW, not_before=not_before, not_after=not_after)
    assert not (tmp_path / "out" / "control").exists() and not (tmp_path / "out" / "boundary").exists()


def _issue_argv(out: Path, *extra: str) -> list[str]:
    claims = SAMPLE_CLAIMS
    return ["certs", "issue", f"--out={out}", f"--namespace={claims.namespace}", f"--sandbox={claims.sandbox}",
            f"--sandbox-uid={claims.sandbox_uid}", f"--control-deployment={claims.control_deployment}",
            f"--network-policy={claims.network_policy}", f"--image={claims.image}",
            f"--generation={claims.generation}", f"--policy-resource={claims.policy_resource}", *extra]  # fmt: skip


def test_cli_not_yet_valid_control_leaf(tmp_path: Path) -> None:
    before = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    assert main(_issue_argv(tmp_path, "--not-before", "control=+1h")) == 0
    start, _ = _dates(tmp_path / "control" / "cert.pem")
    assert before + datetime.timedelta(hours=1) <= start <= before + datetime.timedelta(hours=1, seconds=5)
    boundary_start, _ = _dates(tmp_path / "boundary" / "cert.pem")
    assert boundary_start < before  # the other role keeps the default window


def test_cli_empty_window_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_issue_argv(tmp_path, "--not-before=control=+1h", "--not-after=control=+1m")) == 2
    assert "--not-before/--not-after" in capsys.readouterr().err
    assert not (tmp_path / "control").exists()
