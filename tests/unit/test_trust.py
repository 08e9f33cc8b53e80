"""The CA files the boundary gives the agent: written atomically, readable, the bundle ends with our CA."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import trustme

from supervisor.boundary.trust import TrustError, install_trust


def test_writes_ca_and_bundle(tmp_path: Path) -> None:
    ca = trustme.CA()
    pem = ca.cert_pem.bytes().decode()
    ca_path, bundle_path = install_trust(tmp_path / "tls", pem)
    assert ca_path.read_text().strip() == pem.strip()
    bundle = bundle_path.read_text()
    assert bundle.endswith(pem if pem.endswith("\n") else pem + "\n")
    for path in (ca_path, bundle_path):
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "tls").stat().st_mode) == 0o755
    again, _ = install_trust(tmp_path / "tls", pem)  # replaced in place
    assert again.read_text().strip() == pem.strip()


def test_refuses_a_leaf_as_ca(tmp_path: Path) -> None:
    leaf = trustme.CA().issue_cert("example.test").cert_chain_pems[0].bytes().decode()
    with pytest.raises(TrustError, match="not a CA"):
        install_trust(tmp_path, leaf)
    assert not (tmp_path / "openshell-ca.pem").exists()


@pytest.mark.parametrize(
    "garbage", ["", "not a certificate", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"]
)
def test_refuses_garbage(tmp_path: Path, garbage: str) -> None:
    with pytest.raises(TrustError):
        install_trust(tmp_path, garbage)
