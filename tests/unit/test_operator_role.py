"""The operator role: its certificates, the handshake limiter of control's TCP API, the client's URL."""

from __future__ import annotations

import datetime
import stat
from pathlib import Path

import pytest
from cryptography import x509

from supervisor.cli.api_client import ApiError, TlsApi, find_api, parse_api_url
from supervisor.control.api_tls import HandshakeLimiter, operator_identity
from supervisor.protocol.certs import BUNDLE_FILES, BundleError, issue_bundle, issue_operator, load_bundle
from supervisor.protocol.claims import Role, decode_claims, encode_claims
from tests.certs_fixtures import SAMPLE_CLAIMS

NOW = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)


def test_role_claims_round_trip() -> None:
    assert decode_claims(encode_claims(SAMPLE_CLAIMS, Role.OPERATOR)) == (SAMPLE_CLAIMS, Role.OPERATOR)


def test_bundle_without_operator_is_unchanged(tmp_path: Path) -> None:
    issue_bundle(tmp_path / "b", SAMPLE_CLAIMS)
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["boundary", "control"]


def test_bundle_with_operator(tmp_path: Path) -> None:
    issue_bundle(tmp_path / "b", SAMPLE_CLAIMS, operator=True, now=NOW, not_after={"operator": NOW})
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["boundary", "control", "operator"]
    op = load_bundle(tmp_path / "b" / "operator", Role.OPERATOR)
    assert op.claims == SAMPLE_CLAIMS and op.not_after == NOW
    assert sorted(p.name for p in op.directory.iterdir()) == sorted(BUNDLE_FILES)
    assert stat.S_IMODE(op.key_path.stat().st_mode) == 0o600
    assert op.ca_path.read_bytes() == (tmp_path / "b" / "control" / "ca.pem").read_bytes()
    with pytest.raises(BundleError, match="holds the operator role's key"):
        load_bundle(tmp_path / "b" / "operator", Role.CONTROL)


def test_operator_bound_without_operator_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'operator'"):
        issue_bundle(tmp_path / "b", SAMPLE_CLAIMS, not_after={"operator": NOW})
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").iterdir())


def test_later_operator_with_the_kept_ca_key(tmp_path: Path) -> None:
    issue_bundle(tmp_path / "b", SAMPLE_CLAIMS, ca_key_out=tmp_path / "ca.key")
    issue_operator(tmp_path / "op", tmp_path / "b" / "control", tmp_path / "ca.key", now=NOW,
                   not_after=NOW + datetime.timedelta(hours=1))  # fmt: skip
    op = load_bundle(tmp_path / "op", Role.OPERATOR)
    assert op.claims == SAMPLE_CLAIMS and op.not_after == NOW + datetime.timedelta(hours=1)
    with pytest.raises(BundleError, match="not empty"):
        issue_operator(tmp_path / "op", tmp_path / "b" / "control", tmp_path / "ca.key")


def test_later_operator_with_another_ca_key_is_refused(tmp_path: Path) -> None:
    issue_bundle(tmp_path / "b", SAMPLE_CLAIMS)
    issue_bundle(tmp_path / "other", SAMPLE_CLAIMS, ca_key_out=tmp_path / "other.key")
    with pytest.raises(BundleError, match="is not the key of the CA"):
        issue_operator(tmp_path / "op", tmp_path / "b" / "control", tmp_path / "other.key")
    assert not (tmp_path / "op").exists()


def test_identity_names_the_certificate(tmp_path: Path) -> None:
    issue_bundle(tmp_path / "b", SAMPLE_CLAIMS, operator=True)
    cert = x509.load_pem_x509_certificate((tmp_path / "b" / "operator" / "cert.pem").read_bytes())
    from cryptography.hazmat.primitives import serialization

    identity = operator_identity(cert.public_bytes(serialization.Encoding.DER))
    assert identity["uri"] == "spiffe://openshell/ns/agents-team-a/sandbox/review-bot/operator"
    assert identity["serial"] == format(cert.serial_number, "x")
    assert identity["sha256"].startswith("sha256:") and len(identity["sha256"]) == 7 + 64


# --- the handshake limiter ---------------------------------------------------------------------------------------


def test_limiter_blocks_after_the_limit_and_forgets_after_the_window() -> None:
    limiter = HandshakeLimiter(limit=3, window_s=60)
    assert [limiter.failed("10.0.0.9", t) for t in (0, 1, 2)] == [False, False, True]
    assert limiter.blocked("10.0.0.9", 30)
    assert not limiter.blocked("10.0.0.8", 30)  # per source
    assert limiter.blocked("10.0.0.9", 59.5)
    assert not limiter.blocked("10.0.0.9", 60.5)  # the first failure aged out: two in the window
    assert limiter.failed("10.0.0.9", 60.8)  # with 1 and 2 still in the window: blocked again
    assert not limiter.blocked("10.0.0.9", 200)


def test_limiter_state_is_bounded() -> None:
    limiter = HandshakeLimiter(limit=2, window_s=60)
    for i in range(5000):
        limiter.failed(f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}", float(i) / 1000)
    assert len(limiter._failures) <= 4096 + 1


def test_a_spray_of_sources_never_unblocks_one() -> None:
    """Thousands of other sources failing cannot make the limiter forget a blocked one; sources past its bound
    are blocked together rather than not at all."""
    limiter = HandshakeLimiter(limit=2, window_s=60)
    assert [limiter.failed("192.0.2.1", t) for t in (0, 0.1)] == [False, True]
    for i in range(5000):
        limiter.failed(f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}", 1 + i / 1000)
    assert limiter.blocked("192.0.2.1", 7)
    assert limiter.blocked("198.51.100.7", 7)  # a source not tracked on its own, while the spray lasts
    assert not limiter.blocked("10.0.0.1", 7)  # a tracked source with one failure
    assert not limiter.blocked("192.0.2.1", 70) and not limiter.blocked("198.51.100.7", 70)  # windows over


# --- the client's API URL ----------------------------------------------------------------------------------------


def test_api_url_with_cert() -> None:
    assert parse_api_url("https://127.0.0.1:7444", "/c") == TlsApi("127.0.0.1", 7444, Path("/c"))
    assert parse_api_url("https://[::1]:7444/", "/c") == TlsApi("::1", 7444, Path("/c"))
    assert str(TlsApi("::1", 7444, Path("/c"))) == "https://[::1]:7444"


@pytest.mark.parametrize(
    "url", ["https://host", "https://host:99999", "http://host:1", "https://host:1/v1", "https://:1"]
)
def test_bad_api_urls(url: str) -> None:
    with pytest.raises(ApiError, match="https://HOST:PORT"):
        parse_api_url(url, "/c")


def test_https_api_needs_a_cert(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENSHELL_SANDBOX_CERT", raising=False)
    with pytest.raises(ApiError, match="--cert DIR"):
        find_api("https://127.0.0.1:7444")
    monkeypatch.setenv("OPENSHELL_SANDBOX_API", "https://127.0.0.1:7444")
    monkeypatch.setenv("OPENSHELL_SANDBOX_CERT", "/op")
    assert find_api(None) == TlsApi("127.0.0.1", 7444, Path("/op"))
    assert find_api("/run/x/api.sock") == Path("/run/x/api.sock")


def test_certs_issue_operator_bound_needs_operator(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from supervisor.cli.main import main

    claims = [f"--{k.replace('_', '-')}={v}" for k, v in SAMPLE_CLAIMS.to_dict().items()]
    assert main(["certs", "issue", f"--out={tmp_path / 'a'}", *claims, "--not-after=operator=+1h"]) == 2
    assert "no operator certificate without --operator" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
    assert main(["certs", "issue", f"--out={tmp_path / 'b'}", *claims, "--operator", "--not-after=operator=+1h"]) == 0
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["boundary", "control", "operator"]
    assert main(["certs", "issue", f"--out={tmp_path / 'c'}", *claims, "--not-after=+2h"]) == 0  # all issued ones
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["boundary", "control"]
