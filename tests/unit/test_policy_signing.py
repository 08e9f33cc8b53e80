"""``credential_signing`` in the policy (docs/reference/policy.md §1.4, V28) and the inference.local host refusal."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.control.policy import PolicyInvalid
from supervisor.control.policy.model import Protocol

from .policy_helpers import load, rule

EP = "network_policies.r.endpoints[0]"
S3 = {"host": "s3.example.com", "port": 443}


def errors_for(endpoint: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(PolicyInvalid) as info:
        load({"r": rule(endpoint)})
    return [(e.path, e.message) for e in info.value.errors]


@pytest.mark.parametrize("mode", ["sigv4", "sigv4:body", "sigv4:no_body"])
def test_every_mode_loads_with_its_service_and_region(mode: str) -> None:
    policy = load({"r": rule({**S3, "credential_signing": mode, "signing_service": "s3",
                              "signing_region": "eu-west-1"})})  # fmt: skip
    ep = policy.network_policies[0].endpoints[0]
    assert (ep.credential_signing, ep.signing_service, ep.signing_region) == (mode, "s3", "eu-west-1")
    assert ep.protocol is Protocol.L4
    assert ep.to_json()["credential_signing"] == mode


def test_region_may_be_left_to_the_host_name() -> None:
    policy = load({"r": rule({**S3, "credential_signing": "sigv4", "signing_service": "s3"})})
    ep = policy.network_policies[0].endpoints[0]
    assert ep.signing_region is None


V28: list[tuple[str, dict[str, Any], str, str]] = [
    ("unknown-mode", {**S3, "credential_signing": "sigv2", "signing_service": "s3"}, f"{EP}.credential_signing",
     "unknown credential_signing 'sigv2'"),
    ("unknown-mode-case", {**S3, "credential_signing": "SIGV4", "signing_service": "s3"}, f"{EP}.credential_signing",
     "unknown credential_signing"),
    ("missing-service", {**S3, "credential_signing": "sigv4"}, f"{EP}.signing_service",
     "requires signing_service"),
    ("with-body-rewrite", {**S3, "protocol": "rest", "enforcement": "enforce", "access": "full",
                           "credential_signing": "sigv4", "signing_service": "s3",
                           "request_body_credential_rewrite": True}, f"{EP}.request_body_credential_rewrite",
     "mutually exclusive"),
    ("empty-service", {**S3, "credential_signing": "sigv4", "signing_service": ""}, f"{EP}.signing_service", ""),
    ("bad-service", {**S3, "credential_signing": "sigv4", "signing_service": "S3/x"}, f"{EP}.signing_service",
     "invalid signing_service"),
    ("bad-region", {**S3, "credential_signing": "sigv4", "signing_service": "s3", "signing_region": "us east"},
     f"{EP}.signing_region", "invalid signing_region"),
    ("tls-skip", {**S3, "tls": "skip", "credential_signing": "sigv4", "signing_service": "s3"},
     f"{EP}.credential_signing", "tls: skip would never sign"),
    ("tcp", {"host": "s3.example.com", "port": 443, "protocol": "tcp", "credential_signing": "sigv4",
             "signing_service": "s3"}, f"{EP}.protocol", "credential_signing"),
    ("not-a-string", {**S3, "credential_signing": ["sigv4"], "signing_service": "s3"}, f"{EP}.credential_signing",
     ""),
]  # fmt: skip


@pytest.mark.parametrize(("row", "endpoint", "path", "fragment"), V28, ids=[c[0] for c in V28])
def test_v28(row: str, endpoint: dict[str, Any], path: str, fragment: str) -> None:
    errors = errors_for(endpoint)
    assert any(p == path and fragment in m for p, m in errors), errors


def test_signing_fields_without_credential_signing_warn() -> None:
    policy = load({"r": rule({**S3, "signing_service": "s3", "signing_region": "us-east-1"})})
    assert sum("no effect without credential_signing" in w.message for w in policy.warnings) == 2


def test_overlapping_endpoints_must_agree_on_signing() -> None:
    with pytest.raises(PolicyInvalid) as info:
        load({
            "a": rule({**S3, "credential_signing": "sigv4", "signing_service": "s3"}),
            "b": rule({**S3, "credential_signing": "sigv4:no_body", "signing_service": "s3"}),
        })  # fmt: skip
    assert any("credential_signing" in e.message for e in info.value.errors), info.value.errors


@pytest.mark.parametrize("host", ["inference.local", "INFERENCE.local", "inference.local."])
def test_a_policy_endpoint_naming_inference_local_is_refused(host: str) -> None:
    errors = errors_for({"host": host, "port": 443})
    assert any(p == f"{EP}.host" and "inference routes" in m for p, m in errors), errors
