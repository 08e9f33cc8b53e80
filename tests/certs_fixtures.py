"""Shared helpers for tests that need claims, bootstrap bundles or mismatched certificates.

A plain module (not a conftest): ``from tests.certs_fixtures import issue_pair, SAMPLE_CLAIMS``.
Issuing a bundle costs ~10 ms, so tests may make their own freely.
"""

from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path

from supervisor.protocol.certs import (
    DEFAULT_VALIDITY,
    Bundle,
    CertificateAuthority,
    issue_bundle,
    load_bundle,
    make_leaf,
    write_role_dir,
)
from supervisor.protocol.claims import CLAIM_FIELDS, Claims, Role

SAMPLE_CLAIMS = Claims(
    namespace="agents-team-a",
    sandbox="review-bot",
    sandbox_uid="7c0e5d1a-6f0b-4c7e-9a51-2f1b3c4d5e6f",
    control_deployment="os-ctl-review-bot-1a2b",
    network_policy="os-np-review-bot-1a2b",
    image="registry.example/agent@sha256:" + "ab" * 32,
    generation=3,
    policy_resource="ConfigMap/review-bot-policy@0d1e2f3a",
)


def sample_claims(**overrides: str | int) -> Claims:
    return dataclasses.replace(SAMPLE_CLAIMS, **overrides)  # type: ignore[arg-type]


def differing(claims: Claims, field: str) -> Claims:
    """``claims`` with exactly ``field`` changed to another valid value."""
    assert field in CLAIM_FIELDS
    value = getattr(claims, field)
    new: str | int = value + 1 if field == "generation" else value + "-other"
    return dataclasses.replace(claims, **{field: new})  # type: ignore[arg-type]


def issue_pair(out_dir: Path, claims: Claims = SAMPLE_CLAIMS, **kwargs: object) -> tuple[Bundle, Bundle]:
    """``issue_bundle`` into ``out_dir`` and load both roles: ``(control, boundary)``."""
    issue_bundle(out_dir, claims, **kwargs)  # type: ignore[arg-type]
    return load_bundle(out_dir / "control", Role.CONTROL), load_bundle(out_dir / "boundary", Role.BOUNDARY)


def leaf_bundle(
    directory: Path,
    ca: CertificateAuthority,
    role: Role,
    *,
    cert_claims: Claims = SAMPLE_CLAIMS,
    cert_role: Role | None = None,
    expected: Claims | None = None,
    trust: CertificateAuthority | None = None,
    now: datetime.datetime | None = None,
    validity: datetime.timedelta = DEFAULT_VALIDITY,
) -> Bundle:
    """A ``Bundle`` for ``role`` whose certificate need not agree with it (what an attacker would hold).

    The leaf is signed by ``ca`` and carries ``cert_claims``/``cert_role`` (default: ``role``); the bundle
    trusts ``trust`` (default: ``ca``) and expects ``expected`` (default: ``cert_claims``). No
    consistency checks: this deliberately bypasses ``load_bundle``.
    """
    key, cert = make_leaf(ca, cert_claims, cert_role or role, validity=validity, now=now)
    trusted = trust or ca
    write_role_dir(directory, trusted.certificate, key, cert, expected or cert_claims)
    return Bundle(
        role=role,
        directory=directory,
        ca_path=directory / "ca.pem",
        cert_path=directory / "cert.pem",
        key_path=directory / "key.pem",
        claims=expected or cert_claims,
    )
