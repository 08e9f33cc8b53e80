"""``k8s render --api-listen --operator-cert-out DIR`` (remote operators): an operator bundle of the rendered sandbox,
from the same CA as the rendered control Secret, written beside the Secrets and never into them."""

from __future__ import annotations

import base64
import os
import stat
import subprocess
import sys
from pathlib import Path

import yaml

from supervisor.protocol.certs import load_bundle
from supervisor.protocol.claims import Role, parse_claims_json

UID = "7c0e2d4a-5b6f-4e1d-9a3c-2f8b1e0d6c5a"
BASE = [
    "k8s", "render", "--namespace", "agents-team-a", "--sandbox", "review-bot", "--sandbox-uid", UID,
    "--image", "registry.example/agents/review-bot@sha256:" + "2d" * 32,
    "--control-image", "registry.example/openshell/openshell-sandbox:0.1.0",
    "--cluster-cidr", "10.244.0.0/16", "--service-cidr", "10.96.0.0/12", "--networkpolicy-enforced",
]  # fmt: skip
AGENT = ["--", "python3", "/opt/review-bot/main.py"]


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_operator_cert_out_matches_the_rendered_control(tmp_path: Path) -> None:
    out = tmp_path / "operator"
    result = run(*BASE, "--api-listen", "--secrets-dir", str(tmp_path / "sec"), "--operator-cert-out", str(out),
                 *AGENT, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"--cert {out}" in result.stderr
    bundle = load_bundle(out, Role.OPERATOR)
    assert stat.S_IMODE(out.stat().st_mode) == 0o700 and stat.S_IMODE(bundle.key_path.stat().st_mode) == 0o600
    secrets = [d for d in yaml.safe_load_all((tmp_path / "sec" / "secrets.yaml").read_text()) if d]
    (control,) = [d for d in secrets if d["metadata"]["name"].startswith("os-boot-") and "control" in
                  d["metadata"]["name"]]  # fmt: skip
    assert base64.b64decode(control["data"]["ca.pem"]) == bundle.ca_path.read_bytes()
    assert parse_claims_json(base64.b64decode(control["data"]["claims.json"])) == bundle.claims
    key = bundle.key_path.read_bytes()
    assert all(base64.b64decode(v) != key for d in secrets for v in d["data"].values())  # never a Secret
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert "--api-listen=*:7444" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def test_operator_cert_out_refusals_name_the_flag(tmp_path: Path) -> None:
    result = run(*BASE, "--secrets-dir", str(tmp_path / "a"), "--operator-cert-out", str(tmp_path / "op"), *AGENT,
                 cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2 and "--operator-cert-out: needs --api-listen" in result.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "op").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "cert.pem").write_text("x")
    result = run(*BASE, "--api-listen", "--secrets-dir", str(tmp_path / "b"), "--operator-cert-out",
                 str(tmp_path / "full"), *AGENT, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2 and "not empty" in result.stderr
    assert not (tmp_path / "b").exists()
    result = run(*BASE, "--operator-namespace", "ops", "--secrets-dir", str(tmp_path / "c"), *AGENT, cwd=tmp_path)
    assert result.returncode == 2 and "--operator-namespace: needs --api-listen" in result.stderr
    assert os.listdir(tmp_path) == ["full"]
