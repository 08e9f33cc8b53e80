"""``openshell-sandbox k8s render`` end to end, as a user runs it: the real entrypoint in a subprocess."""

from __future__ import annotations

import base64
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

UID = "7c0e2d4a-5b6f-4e1d-9a3c-2f8b1e0d6c5a"
CLUSTER = ["--cluster-cidr", "10.244.0.0/16", "--service-cidr", "10.96.0.0/12", "--networkpolicy-enforced"]
BASE = [
    "k8s", "render", "--namespace", "agents-team-a", "--sandbox", "review-bot", *CLUSTER,
    "--image", "registry.example/agents/review-bot@sha256:" + "2d" * 32,
    "--control-image", "registry.example/openshell/openshell-sandbox:0.1.0",
]  # fmt: skip
AGENT = ["--", "python3", "/opt/review-bot/main.py"]


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )  # fmt: skip


def secret_values(path: Path) -> list[str]:
    """Every secret Secret value (claims and the policy digest are public), base64 and decoded line by line (a
    PEM body line is enough to leak a key)."""
    out = []
    for doc in yaml.safe_load_all(path.read_text()):
        for key, value in (doc or {}).get("data", {}).items():
            if key in ("claims.json", "policy.sha256"):
                continue
            out.append(value)
            for line in base64.b64decode(value).decode().splitlines():
                if len(line) >= 24 and not line.startswith("-----") and not line.startswith("{"):
                    out.append(line)
    return out


@pytest.mark.parametrize("model", ["R", "U", "P"])
def test_render_writes_objects_to_stdout_and_secrets_only_to_a_private_file(tmp_path: Path, model: str) -> None:
    creds = tmp_path / "creds.yaml"
    creds.write_text("API_KEY:\n  secret: sk-live-abcdefghijklmnop\n  hosts: [api.example.com]\n")
    result = run(
        *BASE, "--sandbox-uid", UID, "--privilege-model", model, "--credentials", str(creds),
        "--secrets-dir", str(tmp_path / "sec"), *AGENT, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert [d["kind"] for d in docs] == ["ConfigMap", "NetworkPolicy", "NetworkPolicy", "Service", "Deployment", "Pod"]
    secrets_file = tmp_path / "sec" / "secrets.yaml"
    assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(secrets_file.parent.stat().st_mode) == 0o700
    secrets = [d for d in yaml.safe_load_all(secrets_file.read_text()) if d]
    assert {d["kind"] for d in secrets} == {"Secret"} and len(secrets) == 4
    assert all(d["immutable"] is True for d in secrets)
    printed = result.stdout + result.stderr
    assert "kind: Secret" not in printed and "PRIVATE KEY" not in printed and "sk-live" not in printed
    for value in secret_values(secrets_file):
        assert value not in printed


def test_reuse_secrets_renders_the_same_keys_and_objects_again(tmp_path: Path) -> None:
    first = run(*BASE, "--sandbox-uid", UID, "--secrets-dir", "sec", *AGENT, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    before = (tmp_path / "sec" / "secrets.yaml").read_bytes()
    # Without --reuse-secrets the file is never replaced (applied immutable Secrets could not follow).
    again = run(*BASE, "--sandbox-uid", UID, "--secrets-dir", "sec", *AGENT, cwd=tmp_path)
    assert again.returncode == 2 and again.stderr.startswith("k8s render: --secrets-dir: ")
    assert (tmp_path / "sec" / "secrets.yaml").read_bytes() == before
    second = run(*BASE, "--sandbox-uid", UID, "--secrets-dir", "sec", "--reuse-secrets", "sec", *AGENT, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert (tmp_path / "sec" / "secrets.yaml").read_bytes() == before
    assert second.stdout == first.stdout
    # Another image is another claim: the immutable bundle cannot follow, and the error names the claim.
    third = run(
        *BASE[:-2], "--control-image", "x/y:1", "--image", "registry.example/other@sha256:" + "3e" * 32,
        "--sandbox-uid", UID, "--secrets-dir", "sec2", "--reuse-secrets", "sec", *AGENT, cwd=tmp_path,
    )  # fmt: skip
    assert third.returncode == 2 and "--reuse-secrets: " in third.stderr and "claim 'image'" in third.stderr
    assert not (tmp_path / "sec2").exists()


def test_proxy_pod_render_keeps_the_token_in_the_secrets_file_and_reuses_it(tmp_path: Path) -> None:
    proxy = ["--topology", "proxy-pod", "--proxy-uid", "1000:1000", "--affinity", "preferred"]
    first = run(*BASE, "--sandbox-uid", UID, *proxy, "--secrets-dir", "sec", *AGENT, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    docs = [d for d in yaml.safe_load_all(first.stdout) if d]
    assert [d["kind"] for d in docs] == ["ConfigMap", "NetworkPolicy", "NetworkPolicy", "Service", "Deployment", "Pod"]
    pod = docs[-1]
    assert pod["spec"]["containers"][0]["command"] == ["python3", "/opt/review-bot/main.py"]
    assert "--topology=proxy-pod" in docs[-2]["spec"]["template"]["spec"]["containers"][0]["args"]
    secrets_file = tmp_path / "sec" / "secrets.yaml"
    assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600
    secrets = [d for d in yaml.safe_load_all(secrets_file.read_text()) if d]
    names = sorted(d["metadata"]["name"].split("-")[1] for d in secrets)
    assert names == ["boot", "ca", "ptok", "trust"], "no boundary bundle: there is no boundary"
    token = next(base64.b64decode(d["data"]["token"]).decode() for d in secrets if "token" in d["data"])
    assert token not in first.stdout + first.stderr
    for value in secret_values(secrets_file):
        assert value not in first.stdout + first.stderr
    before = secrets_file.read_bytes()
    second = run(*BASE, "--sandbox-uid", UID, *proxy, "--secrets-dir", "sec", "--reuse-secrets", "sec", *AGENT,
                 cwd=tmp_path)  # fmt: skip
    assert second.returncode == 0, second.stderr
    assert secrets_file.read_bytes() == before and second.stdout == first.stdout
    # A boundary render's Secrets hold no proxy token; this topology's hold no boundary bundle: both refused.
    boundary = run(*BASE, "--sandbox-uid", UID, "--secrets-dir", "bsec", *AGENT, cwd=tmp_path)
    assert boundary.returncode == 0, boundary.stderr
    for reused, args in (("bsec", proxy), ("sec", [])):
        result = run(*BASE, "--sandbox-uid", UID, *args, "--secrets-dir", "out", "--reuse-secrets", reused, *AGENT,
                     cwd=tmp_path)  # fmt: skip
        assert result.returncode == 2 and result.stderr.startswith("k8s render: --reuse-secrets: "), result.stderr
        assert not (tmp_path / "out").exists()


def test_owner_uid_is_the_default_sandbox_uid_and_out_dir_names_the_file(tmp_path: Path) -> None:
    result = run(
        *BASE, "--owner", f"agents.example/v1alpha1/Sandbox/review-bot/{UID}", "--redact-secrets",
        "--out", str(tmp_path), *AGENT, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all((tmp_path / "review-bot.yaml").read_text()) if d]
    assert {d["metadata"]["labels"]["openshell.ai/sandbox-id"] for d in docs} == {UID}
    assert all(d["metadata"]["ownerReferences"][0]["uid"] == UID for d in docs)
    assert [d for d in docs if d["kind"] == "Secret"], "redacted Secrets are printed with the objects"


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--sandbox-uid", UID], "--secrets-dir"),
        (["--redact-secrets"], "--sandbox-uid"),
        (["--sandbox-uid", UID, "--redact-secrets", "--namespace", "Bad_NS"], "--namespace"),
        (["--sandbox-uid", UID, "--redact-secrets", "--owner", "v1/Sandbox/x"], "--owner"),
        (["--redact-secrets", "--owner", f"v1/Sandbox/x/{UID}", "--owner-namespace", "other"], "--owner"),
        (["--sandbox-uid", UID, "--redact-secrets", "--policy", "bad.yaml"], "--policy"),
        (["--sandbox-uid", UID, "--redact-secrets", "--policy", "missing.yaml"], "--policy"),
        (["--sandbox-uid", UID, "--redact-secrets", "--credentials", "bad-creds.yaml"], "--credentials"),
        (["--sandbox-uid", UID, "--redact-secrets", "--secrets-dir", "s"], "--redact-secrets"),
        (["--sandbox-uid", UID, "--redact-secrets", "--read-only-root"], "--read-only-root"),
        (
            ["--sandbox-uid", UID, "--redact-secrets", "--topology", "proxy-pod", "--privilege-model", "P"],
            "--privilege-model",
        ),
        (["--sandbox-uid", UID, "--redact-secrets", "--topology", "proxy-pod", "--proxy-uid", "0"], "--proxy-uid"),
        (["--sandbox-uid", UID, "--redact-secrets", "--topology", "proxy-pod", "--dns-peer", ""], "--dns-peer"),
        (
            ["--sandbox-uid", UID, "--redact-secrets", "--topology", "proxy-pod", "--dns-peer", "kube-system"],
            "--dns-peer",
        ),
        (["--sandbox-uid", UID, "--redact-secrets", "--runtime-class", "Bad_Name"], "--runtime-class"),
    ],
)
def test_bad_input_exits_2_naming_the_flag_and_writes_nothing(tmp_path: Path, args: list[str], flag: str) -> None:
    (tmp_path / "bad.yaml").write_text(
        "version: 1\nnetwork_policies:\n  x:\n    endpoints:\n      - host: a.example\n        port: 99999\n"
    )
    (tmp_path / "bad-creds.yaml").write_text("API_KEY:\n  secret: 'sk with\ttab'\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    result = run(*BASE, *args, *AGENT, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"k8s render: {flag}: "), result.stderr
    assert result.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    if flag == "--policy" and "bad.yaml" in args:
        assert "bad.yaml" in result.stderr and "port" in result.stderr
