"""Bootstrap bundles (supervisor/protocol/certs.py) and ``certs issue`` (supervisor/cli/certs.py). No sockets."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import re
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from supervisor.cli import certs as certs_cli
from supervisor.protocol import certs, tls
from supervisor.protocol.certs import (
    BUNDLE_FILES,
    BundleError,
    issue_bundle,
    load_bundle,
    make_ca,
    make_leaf,
    read_peer_certificate,
)
from supervisor.protocol.claims import CLAIMS_OID, LINK_ROLES, ClaimsError, Role, claims_json, encode_claims
from supervisor.protocol.errors import ErrorKind
from supervisor.protocol.tls import PeerRejected, verify_peer
from tests.certs_fixtures import SAMPLE_CLAIMS, differing, issue_pair, sample_claims

NOW = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)


def cert_of(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --- issue and load -----------------------------------------------------------------------------------------


def test_issue_then_load_both_roles(tmp_path: Path) -> None:
    control, boundary = issue_pair(tmp_path / "b")
    assert (control.role, boundary.role) == (Role.CONTROL, Role.BOUNDARY)
    assert control.claims == boundary.claims == SAMPLE_CLAIMS
    assert control.directory == tmp_path / "b" / "control"
    assert control.key_path == tmp_path / "b" / "control" / "key.pem"
    assert control.ca_path.read_bytes() == boundary.ca_path.read_bytes()
    assert control.not_after is not None


def test_layout_and_modes(tmp_path: Path) -> None:
    out = tmp_path / "b"
    issue_bundle(out, SAMPLE_CLAIMS)
    assert sorted(p.name for p in out.iterdir()) == ["boundary", "control"]
    for role in LINK_ROLES:
        d = out / str(role)
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
        assert sorted(p.name for p in d.iterdir()) == sorted(BUNDLE_FILES)
        assert stat.S_IMODE((d / "key.pem").stat().st_mode) == 0o600
        assert (d / "claims.json").read_bytes() == claims_json(SAMPLE_CLAIMS) + b"\n"


def test_modes_do_not_depend_on_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        issue_bundle(tmp_path / "b", SAMPLE_CLAIMS)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "b" / "boundary" / "key.pem").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "b" / "boundary").stat().st_mode) == 0o700


def test_certificate_contents(tmp_path: Path) -> None:
    out = tmp_path / "b"
    issue_bundle(out, SAMPLE_CLAIMS, now=NOW, validity=datetime.timedelta(hours=12))
    ca = cert_of(out / "control" / "ca.pem")
    bc = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and bc.value.ca and bc.value.path_length == 0
    assert ca.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    assert isinstance(ca.public_key(), ec.EllipticCurvePublicKey)
    assert ca.public_key().curve.name == "secp256r1"  # type: ignore[union-attr]
    for role in LINK_ROLES:
        leaf = cert_of(out / str(role) / "cert.pem")
        assert leaf.not_valid_before_utc == NOW - datetime.timedelta(minutes=5)
        assert leaf.not_valid_after_utc == NOW + datetime.timedelta(hours=12)
        assert leaf.public_key().curve.name == "secp256r1"  # type: ignore[union-attr]
        assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        ku = leaf.extensions.get_extension_for_class(x509.KeyUsage).value
        assert ku.digital_signature and not ku.key_cert_sign
        eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.UniformResourceIdentifier) == [
            f"spiffe://openshell/ns/agents-team-a/sandbox/review-bot/{role}"
        ]
        assert san.get_values_for_type(x509.DNSName) == [f"{role}.review-bot.agents-team-a.openshell.invalid"]
        ext = leaf.extensions.get_extension_for_oid(CLAIMS_OID)
        assert not ext.critical
        assert encode_claims(SAMPLE_CLAIMS, role) in ext.value.public_bytes()
        assert read_peer_certificate(leaf.public_bytes(serialization.Encoding.DER)) == (SAMPLE_CLAIMS, role)
        leaf.verify_directly_issued_by(ca)


def test_no_dns_san_for_names_that_are_not_dns_labels(tmp_path: Path) -> None:
    issue_bundle(tmp_path / "b", sample_claims(sandbox="Review Bot"))
    san = cert_of(tmp_path / "b" / "control" / "cert.pem").extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert san.value.get_values_for_type(x509.DNSName) == []
    assert san.value.get_values_for_type(x509.UniformResourceIdentifier) == [
        "spiffe://openshell/ns/agents-team-a/sandbox/Review%20Bot/control"
    ]


def test_each_issue_makes_a_new_ca(tmp_path: Path) -> None:
    a, _ = issue_pair(tmp_path / "a")
    b, _ = issue_pair(tmp_path / "b")
    assert cert_of(a.ca_path).public_key() != cert_of(b.ca_path).public_key()


def test_long_claims_issue_and_load(tmp_path: Path) -> None:
    claims = sample_claims(image="i" * 512, policy_resource="ü" * 512, generation=2**63 - 1)
    control, _ = issue_pair(tmp_path / "b", claims)
    assert control.claims == claims


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"validity": datetime.timedelta(0)}, "validity"),
        ({"validity": datetime.timedelta(seconds=-1)}, "validity"),
        ({"now": datetime.datetime(2030, 1, 1)}, "timezone"),
    ],
)
def test_issue_argument_errors(tmp_path: Path, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        issue_bundle(tmp_path / "b", SAMPLE_CLAIMS, **kwargs)  # type: ignore[arg-type]
    assert not (tmp_path / "b" / "control").exists()


# --- CA key -------------------------------------------------------------------------------------------------


def _public(key: object) -> bytes:
    return key.public_bytes(  # type: ignore[attr-defined, no-any-return]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def test_ca_key_not_written_by_default(tmp_path: Path) -> None:
    out = tmp_path / "b"
    issue_bundle(out, SAMPLE_CLAIMS)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert sorted(p.name for p in files) == sorted(BUNDLE_FILES * 2)
    ca_pub = _public(cert_of(out / "control" / "ca.pem").public_key())
    for path in files:
        if path.name == "key.pem":
            key = serialization.load_pem_private_key(path.read_bytes(), None)
            assert _public(key.public_key()) != ca_pub
        else:
            assert b"PRIVATE KEY" not in path.read_bytes()


def test_ca_key_out(tmp_path: Path) -> None:
    out, ca_key = tmp_path / "b", tmp_path / "ca-key.pem"
    issue_bundle(out, SAMPLE_CLAIMS, ca_key_out=ca_key)
    assert stat.S_IMODE(ca_key.stat().st_mode) == 0o600
    key = serialization.load_pem_private_key(ca_key.read_bytes(), None)
    assert _public(key.public_key()) == _public(cert_of(out / "boundary" / "ca.pem").public_key())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "ca-key.pem"]  # no temporary left behind


def test_existing_ca_key_out_refused_and_nothing_written(tmp_path: Path) -> None:
    ca_key = tmp_path / "ca-key.pem"
    ca_key.write_bytes(b"keep me")
    with pytest.raises(BundleError, match=re.escape("ca-key.pem")):
        issue_bundle(tmp_path / "b", SAMPLE_CLAIMS, ca_key_out=ca_key)
    assert ca_key.read_bytes() == b"keep me"
    assert not (tmp_path / "b" / "control").exists()


# --- overwrite and atomicity --------------------------------------------------------------------------------


@pytest.mark.parametrize("role", LINK_ROLES)
def test_overwrite_refused(tmp_path: Path, role: Role) -> None:
    out = tmp_path / "b"
    issue_bundle(out, SAMPLE_CLAIMS)
    if role is Role.CONTROL:  # either existing directory alone is enough to refuse
        shutil.rmtree(out / "boundary")
    else:
        shutil.rmtree(out / "control")
    before = snapshot(out)
    with pytest.raises(BundleError, match=str(role)):
        issue_bundle(out, sample_claims(generation=4))
    assert snapshot(out) == before
    assert sorted(p.name for p in out.iterdir()) == [str(role)]


def test_existing_empty_role_dirs_are_filled(tmp_path: Path) -> None:
    out = tmp_path / "b"
    (out / "control").mkdir(parents=True)
    (out / "boundary").mkdir()
    control, boundary = issue_pair(out)
    assert control.claims == boundary.claims == SAMPLE_CLAIMS


def test_role_path_that_is_a_file_refused(tmp_path: Path) -> None:
    out = tmp_path / "b"
    out.mkdir()
    (out / "boundary").write_text("x")
    with pytest.raises(BundleError, match="boundary"):
        issue_bundle(out, SAMPLE_CLAIMS)


def test_failure_while_minting_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = certs.make_leaf

    def flaky(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("boom")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(certs, "make_leaf", flaky)
    out = tmp_path / "b"
    with pytest.raises(RuntimeError, match="boom"):
        issue_bundle(out, SAMPLE_CLAIMS, ca_key_out=tmp_path / "ca.key")
    assert list(out.iterdir()) == []
    assert not (tmp_path / "ca.key").exists()


def test_race_on_second_rename_rolls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A non-empty boundary dir that appears after the checks: the control dir and CA key are removed."""
    out = tmp_path / "b"
    (out / "boundary").mkdir(parents=True)
    (out / "boundary" / "someone-elses").write_text("x")
    monkeypatch.setattr(certs, "_refuse_existing", lambda target: None)
    with pytest.raises(BundleError, match="boundary"):
        issue_bundle(out, SAMPLE_CLAIMS, ca_key_out=tmp_path / "ca.key")
    assert sorted(p.name for p in out.iterdir()) == ["boundary"]
    assert (out / "boundary" / "someone-elses").read_text() == "x"
    assert not (tmp_path / "ca.key").exists()


# --- load refusals ------------------------------------------------------------------------------------------


@pytest.fixture
def issued(tmp_path: Path) -> Iterator[Path]:
    out = tmp_path / "b"
    issue_bundle(out, SAMPLE_CLAIMS)
    yield out


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o610, 0o601])
def test_key_readable_by_others_refused(issued: Path, mode: int) -> None:
    key = issued / "boundary" / "key.pem"
    key.chmod(mode)
    with pytest.raises(BundleError) as info:
        load_bundle(issued / "boundary", Role.BOUNDARY)
    assert str(key) in str(info.value)
    assert f"{mode:04o}" in str(info.value)


def test_key_mode_0400_accepted(issued: Path) -> None:
    (issued / "control" / "key.pem").chmod(0o400)
    assert load_bundle(issued / "control", Role.CONTROL).claims == SAMPLE_CLAIMS


def test_key_through_symlink_checks_the_target(issued: Path) -> None:
    """Kubernetes Secret volumes present files as symlinks; the target's mode is what counts."""
    d = issued / "control"
    (d / "key.pem").rename(d / "real-key")
    (d / "key.pem").symlink_to(d / "real-key")
    assert load_bundle(d, Role.CONTROL).role is Role.CONTROL
    (d / "real-key").chmod(0o644)
    with pytest.raises(BundleError, match="0644"):
        load_bundle(d, Role.CONTROL)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_key_owned_by_another_uid_refused(issued: Path) -> None:
    key = issued / "control" / "key.pem"
    os.chown(key, 4242, -1)
    with pytest.raises(BundleError, match="uid 4242"):
        load_bundle(issued / "control", Role.CONTROL)


def test_key_that_is_not_a_regular_file_refused(issued: Path) -> None:
    key = issued / "control" / "key.pem"
    key.unlink()
    os.mkfifo(key, 0o600)
    with pytest.raises(BundleError, match="regular file"):
        load_bundle(issued / "control", Role.CONTROL)


@pytest.mark.parametrize("name", BUNDLE_FILES)
@pytest.mark.parametrize("role", LINK_ROLES)
def test_missing_file_named(issued: Path, name: str, role: Role) -> None:
    (issued / str(role) / name).unlink()
    with pytest.raises(BundleError) as info:
        load_bundle(issued / str(role), role)
    assert str(issued / str(role) / name) in str(info.value)
    assert "missing" in str(info.value)


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="not a directory"):
        load_bundle(tmp_path / "nope", Role.CONTROL)


@pytest.mark.parametrize("role", LINK_ROLES)
def test_other_roles_directory_refused(issued: Path, role: Role) -> None:
    with pytest.raises(BundleError, match=f"holds the {role.other()} role's key"):
        load_bundle(issued / str(role.other()), role)


def test_cert_from_another_ca_refused(issued: Path, tmp_path: Path) -> None:
    issue_bundle(tmp_path / "other", SAMPLE_CLAIMS)
    for name in ("cert.pem", "key.pem"):
        shutil.copy2(tmp_path / "other" / "control" / name, issued / "control" / name)
    with pytest.raises(BundleError, match="not issued by the CA"):
        load_bundle(issued / "control", Role.CONTROL)


def test_ca_file_holding_a_leaf_refused(issued: Path) -> None:
    shutil.copy2(issued / "control" / "cert.pem", issued / "control" / "ca.pem")
    with pytest.raises(BundleError, match=re.escape("ca.pem: not a CA")):
        load_bundle(issued / "control", Role.CONTROL)


@pytest.mark.parametrize("field", ["sandbox_uid", "generation"])
def test_claims_json_disagreeing_with_cert_refused(issued: Path, field: str) -> None:
    (issued / "boundary" / "claims.json").write_bytes(claims_json(differing(SAMPLE_CLAIMS, field)))
    with pytest.raises(BundleError, match=field):
        load_bundle(issued / "boundary", Role.BOUNDARY)


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"{", "not valid JSON"), (b'{"namespace": "x"}', "missing"), (b"", "JSON")],
)
def test_malformed_claims_json_refused(issued: Path, content: bytes, message: str) -> None:
    (issued / "boundary" / "claims.json").write_bytes(content)
    with pytest.raises(BundleError, match=message) as info:
        load_bundle(issued / "boundary", Role.BOUNDARY)
    assert "claims.json" in str(info.value)


def test_key_not_matching_cert_refused(issued: Path, tmp_path: Path) -> None:
    issue_bundle(tmp_path / "other", SAMPLE_CLAIMS)
    shutil.copy2(tmp_path / "other" / "control" / "key.pem", issued / "control" / "key.pem")
    with pytest.raises(BundleError, match=re.escape("key.pem: does not match")):
        load_bundle(issued / "control", Role.CONTROL)


@pytest.mark.parametrize("name", ["cert.pem", "ca.pem"])
def test_garbage_certificate_refused(issued: Path, name: str) -> None:
    (issued / "control" / name).write_bytes(b"not a certificate")
    with pytest.raises(BundleError, match=name):
        load_bundle(issued / "control", Role.CONTROL)


def test_garbage_key_refused(issued: Path) -> None:
    (issued / "control" / "key.pem").write_bytes(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    with pytest.raises(BundleError, match=re.escape("key.pem")):
        load_bundle(issued / "control", Role.CONTROL)


def test_cert_without_claims_refused(issued: Path, tmp_path: Path) -> None:
    ca = trustme.CA()
    leaf = ca.issue_cert("control.example")
    d = issued / "control"
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    leaf.cert_chain_pems[0].write_to_path(str(d / "cert.pem"))
    leaf.private_key_pem.write_to_path(str(d / "key.pem"))
    with pytest.raises(BundleError, match="no claims extension"):
        load_bundle(d, Role.CONTROL)


# --- read_peer_certificate and the DER wrapper --------------------------------------------------------------


def test_read_peer_certificate_refuses_certificates_without_claims() -> None:
    ca = trustme.CA()
    der = x509.load_pem_x509_certificate(ca.issue_cert("x.example").cert_chain_pems[0].bytes()).public_bytes(
        serialization.Encoding.DER
    )
    with pytest.raises(ClaimsError, match="no claims extension"):
        read_peer_certificate(der)
    ca_der = make_ca().certificate.public_bytes(serialization.Encoding.DER)
    with pytest.raises(ClaimsError):
        read_peer_certificate(ca_der)


@pytest.mark.parametrize("der", [b"", b"\x30\x03\x02\x01\x01", b"garbage" * 10])
def test_read_peer_certificate_refuses_garbage(der: bytes) -> None:
    with pytest.raises(ClaimsError):
        read_peer_certificate(der)


def test_read_peer_certificate_refuses_a_raw_json_extension() -> None:
    """Claims not wrapped in a DER UTF8String are refused (one encoding only)."""
    ca = make_ca()
    _, good = make_leaf(ca, SAMPLE_CLAIMS, Role.CONTROL)
    builder = (
        x509.CertificateBuilder()
        .subject_name(good.subject)
        .issuer_name(good.issuer)
        .public_key(good.public_key())
        .serial_number(1)
        .not_valid_before(good.not_valid_before_utc)
        .not_valid_after(good.not_valid_after_utc)
        .add_extension(x509.UnrecognizedExtension(CLAIMS_OID, encode_claims(SAMPLE_CLAIMS, Role.CONTROL)), False)
    )
    from cryptography.hazmat.primitives import hashes

    bad = builder.sign(ca.key, hashes.SHA256())
    with pytest.raises(ClaimsError, match="UTF8String"):
        read_peer_certificate(bad.public_bytes(serialization.Encoding.DER))


@pytest.mark.parametrize("size", [0, 1, 127, 128, 255, 256, 70000])
def test_der_utf8string_round_trip(size: int) -> None:
    data = b"x" * size
    assert certs._der_utf8string_content(certs._der_utf8string(data)) == data


@pytest.mark.parametrize(
    "der",
    [
        b"",
        b"\x0c",
        b"\x04\x01x",  # OCTET STRING, not UTF8String
        b"\x0c\x02x",  # short
        b"\x0c\x01xy",  # trailing
        b"\x0c\x81\x01x",  # long form for a short length
        b"\x0c\x82\x00\x80" + b"x" * 128,  # leading zero length byte
        b"\x0c\x80x",  # indefinite length
        b"\x0c\x85\x00\x00\x00\x00\x01x",  # too many length bytes
    ],
)
def test_der_utf8string_strict(der: bytes) -> None:
    with pytest.raises(ClaimsError):
        certs._der_utf8string_content(der)


# --- certs issue CLI ----------------------------------------------------------------------------------------


def cli_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="openshell-sandbox")
    add = parser.add_subparsers(dest="command", required=True)
    certs_cli.add_certs_parser(add)
    return parser


def run_cli(argv: list[str]) -> int:
    """What supervisor/cli/main.py does: parse, then dispatch; argparse usage errors exit 2."""
    try:
        args = cli_parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return certs_cli.run_certs(args)


def issue_argv(out: Path, **changes: str) -> list[str]:
    flags = {
        "--namespace": "agents-team-a",
        "--sandbox": "review-bot",
        "--sandbox-uid": SAMPLE_CLAIMS.sandbox_uid,
        "--control-deployment": "os-ctl-review-bot-1a2b",
        "--network-policy": "os-np-review-bot-1a2b",
        "--image": SAMPLE_CLAIMS.image,
        "--generation": "3",
        "--policy-resource": SAMPLE_CLAIMS.policy_resource,
    }
    flags.update(changes)
    argv = ["certs", "issue", "--out", str(out)]
    for flag, value in flags.items():
        if value is not None:
            argv += [flag, value]
    return argv


def test_cli_issue(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bundle"
    assert run_cli(issue_argv(out)) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert str(out / "control") in captured.err and "CA key discarded" in captured.err
    assert captured.err.count("\n") == 1
    assert load_bundle(out / "boundary", Role.BOUNDARY).claims == SAMPLE_CLAIMS
    assert not list(tmp_path.glob("*key*"))


def test_cli_dispatch_via_func(tmp_path: Path) -> None:
    args = cli_parser().parse_args(issue_argv(tmp_path / "b"))
    assert args.func is certs_cli.run_certs


@pytest.mark.parametrize(("text", "seconds"), [("30d", 30 * 86400), ("12h", 43200), ("90m", 5400), ("3600s", 3600)])
def test_cli_validity(tmp_path: Path, text: str, seconds: int) -> None:
    out = tmp_path / "b"
    before = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    assert run_cli([*issue_argv(out), "--validity", text]) == 0
    after = datetime.datetime.now(datetime.UTC)
    leaf = cert_of(out / "control" / "cert.pem")
    assert (
        before + datetime.timedelta(seconds=seconds)
        <= leaf.not_valid_after_utc
        <= after + datetime.timedelta(seconds=seconds)
    )


def test_cli_ca_key_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "ca.key"
    assert run_cli([*issue_argv(tmp_path / "b"), "--ca-key-out", str(key)]) == 0
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert str(key) in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "changes", "needle"),
    [
        ([], {"--namespace": ""}, "--namespace"),
        ([], {"--image": "a\x01b"}, "--image"),
        ([], {"--policy-resource": "p" * 513}, "--policy-resource"),
        ([], {"--generation": "-1"}, "--generation"),
        ([], {"--generation": "three"}, "--generation"),
        ([], {"--sandbox-uid": None}, "--sandbox-uid"),
        (["--validity", "30"], {}, "--validity"),
        (["--validity", "0s"], {}, "--validity"),
        (["--validity", "1w"], {}, "--validity"),
        (["--validity", "-3d"], {}, "--validity"),
        (["--bogus"], {}, "--bogus"),
    ],
)
def test_cli_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], changes: dict[str, str], needle: str
) -> None:
    out = tmp_path / "b"
    assert run_cli([*issue_argv(out, **changes), *extra]) == 2
    assert needle in capsys.readouterr().err
    assert not out.exists() or not any(out.iterdir())


def test_cli_existing_bundle_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "b"
    assert run_cli(issue_argv(out)) == 0
    before = snapshot(out)
    capsys.readouterr()
    assert run_cli(issue_argv(out, **{"--generation": "4"})) == 1
    err = capsys.readouterr().err
    assert str(out / "control") in err and "not empty" in err
    assert snapshot(out) == before


def test_cli_unwritable_out_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert run_cli(issue_argv(blocker / "b")) == 1
    assert str(blocker) in capsys.readouterr().err


def test_cli_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["certs", "issue", "--help"]) == 0
    text = capsys.readouterr().out
    for flag in ("--out", "--namespace", "--generation", "--validity", "--ca-key-out", "claims.json", "0600"):
        assert flag in text


# --- verify_peer without sockets: a fake completed handshake ------------------------------------------------


@dataclass
class FakeTLS:
    der: bytes | None
    tls_version: str | None = "TLSv1.3"
    alpn: str | None = "openshell-ops/1"

    def version(self) -> str | None:
        return self.tls_version

    def selected_alpn_protocol(self) -> str | None:
        return self.alpn

    def getpeercert(self, binary_form: Literal[True]) -> bytes | None:
        assert binary_form
        return self.der


def der_of(path: Path) -> bytes:
    return cert_of(path).public_bytes(serialization.Encoding.DER)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"tls_version": "TLSv1.2"}, "tls"),
        ({"tls_version": None}, "tls"),
        ({"alpn": None}, "alpn"),
        ({"alpn": "openshell-egress/1"}, "alpn"),
        ({"der": None}, "certificate"),
        ({"der": b""}, "certificate"),
        ({"der": b"\x30\x00"}, "certificate"),
    ],
)
def test_verify_peer_refusals(issued: Path, changes: dict[str, object], field: str) -> None:
    boundary = load_bundle(issued / "boundary", Role.BOUNDARY)
    conn = FakeTLS(der_of(issued / "control" / "cert.pem"))
    assert verify_peer(conn, boundary, expected_alpn="openshell-ops/1") == SAMPLE_CLAIMS
    for key, value in changes.items():
        setattr(conn, key, value)
    with pytest.raises(PeerRejected) as info:
        verify_peer(conn, boundary, expected_alpn="openshell-ops/1")
    assert info.value.field == field
    assert info.value.to_op_error().kind == ErrorKind.DENIED
    assert info.value.to_op_error().field == field


def test_verify_peer_cache_is_per_ca(issued: Path, tmp_path: Path) -> None:
    """A certificate accepted under one CA is still refused under another (the check is cached)."""
    control_der = der_of(issued / "control" / "cert.pem")
    good = load_bundle(issued / "boundary", Role.BOUNDARY)
    _, other = issue_pair(tmp_path / "other")  # same claims, other CA
    for _ in range(2):
        assert verify_peer(FakeTLS(control_der), good) == SAMPLE_CLAIMS
        with pytest.raises(PeerRejected, match="not issued by this sandbox's CA"):
            verify_peer(FakeTLS(control_der), other)


def test_verify_peer_rechecks_dates_every_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    control, boundary = issue_pair(tmp_path / "b", validity=datetime.timedelta(hours=1))
    conn = FakeTLS(der_of(control.cert_path))
    assert verify_peer(conn, boundary) == SAMPLE_CLAIMS  # now cached

    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=2)
    monkeypatch.setattr(tls, "_utc_now", lambda: later)
    with pytest.raises(PeerRejected, match="valid only from") as info:
        verify_peer(conn, boundary)
    assert info.value.field == "certificate"


def test_verify_peer_without_a_loaded_ca_reads_the_file(issued: Path) -> None:
    loaded = load_bundle(issued / "boundary", Role.BOUNDARY)
    bare = dataclasses.replace(loaded, ca_certificate=None)
    assert verify_peer(FakeTLS(der_of(issued / "control" / "cert.pem")), bare) == SAMPLE_CLAIMS
    with pytest.raises(PeerRejected, match="role"):
        verify_peer(FakeTLS(der_of(issued / "boundary" / "cert.pem")), bare)
