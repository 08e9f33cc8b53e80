"""The podman translation of ``make test-k8s`` (tests/k8s/podman_play.py) on a real render, without podman.

Podman 4.3 applies a pod's restart policy to its init containers: control's Deployment pod (``Always``) had its
``secrets-copy`` init container started again every time it exited 0, for the pod's whole life, rewriting the
bootstrap key under control, which then now and then read half a file at start and was restarted (the step
"workload removed ⇒ control not crash-looping" saw a restart count of 2). The translation must give such a pod a
policy that leaves an init container that succeeded alone, and keep the workload's ``Never``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from supervisor.k8s.names import SandboxNames
from supervisor.k8s.render import claims_for, render, to_yaml
from supervisor.k8s.secrets import issue_material
from supervisor.k8s.spec import RenderSpec
from tests.k8s.podman_play import Translation

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the translation writes the Secrets' files owned by root")

POLICY = """\
version: 1
network_policies:
  origin:
    name: an origin
    endpoints:
      - host: secure.test
        port: 443
"""


def _translation(tmp_path: Path, **changes: Any) -> Translation:
    spec = RenderSpec(**{
        "namespace": "ostk", "sandbox": "r-unit", "sandbox_uid": "0b7c5a52-3f64-4c47-9d0e-6b1e1c2d3e4f",
        "image": "localhost/openshell-sandbox:test-k8s", "control_image": "localhost/openshell-sandbox:test-k8s",
        "agent_argv": ("/usr/bin/sleep", "100000"), "policy_text": POLICY, "allow_mutable_image": True,
        "cluster_cidrs": (), "networkpolicy_enforced": True, **changes,
    })  # fmt: skip
    names = SandboxNames.of(spec.sandbox, spec.sandbox_uid)
    material = issue_material(claims_for(spec, names), spec.policy_digest, proxy_pod=spec.topology == "proxy-pod")
    rendered = render(spec, material)
    objects = list(yaml.safe_load_all(to_yaml(rendered.objects)))
    secrets = list(yaml.safe_load_all(to_yaml(rendered.secrets)))
    return Translation(objects, secrets, tmp_path / "pods")


def test_a_deployment_pod_with_init_containers_does_not_restart_them_after_success(tmp_path: Path) -> None:
    translation = _translation(tmp_path)
    assert translation.pod_doc("control")["spec"].get("restartPolicy", "Always") == "Always"  # what render writes
    control = translation.translate("control", service_address="203.0.113.2")
    played = yaml.safe_load(control.yaml_path.read_text())
    assert played["spec"]["initContainers"], "the render's control pod copies its Secrets in an init container"
    assert played["spec"]["restartPolicy"] == "OnFailure"
    assert control.init_containers == [f"{control.name}-{c['name']}" for c in played["spec"]["initContainers"]]
    assert control.containers == [f"{control.name}-{c['name']}" for c in played["spec"]["containers"]]


def test_the_workload_pod_keeps_never(tmp_path: Path) -> None:
    workload = _translation(tmp_path).translate("workload", service_address="203.0.113.2")
    assert yaml.safe_load(workload.yaml_path.read_text())["spec"]["restartPolicy"] == "Never"


def test_proxy_pod_workload_env_names_controls_address_with_the_token(tmp_path: Path) -> None:
    """podman 4.3 plays no Service and reads secretKeyRef only from podman secrets: the workload's proxy variables
    must name control's address, with the token's value where kubelet would expand ``$(OPENSHELL_PROXY_TOKEN)``."""
    translation = _translation(tmp_path, topology="proxy-pod", image="localhost/debian-agent:bookworm")
    service = translation.service_name()
    token = next(
        value.decode()
        for secret in translation.secrets.values()
        for key, value in _files(secret).items()
        if key == "token"
    )
    workload = translation.translate("workload", service_address="203.0.113.9")
    env = {v["name"]: v for v in yaml.safe_load(workload.yaml_path.read_text())["spec"]["containers"][0]["env"]}
    assert all(set(v) == {"name", "value"} for v in env.values()), "a valueFrom was left for podman"
    assert env["OPENSHELL_PROXY_TOKEN"]["value"] == token
    for name in ("HTTP_PROXY", "https_proxy", "ALL_PROXY"):
        assert env[name]["value"] == f"http://sandbox:{token}@203.0.113.9:3128", env[name]
    assert not [v for v in env.values() if service in v["value"]]
    control = yaml.safe_load(translation.translate("control", service_address="203.0.113.8").yaml_path.read_text())
    assert "--proxy-listen=*:3128" in control["spec"]["containers"][0]["args"]
    assert translation.pod_doc("control")["spec"]["containers"][0]["ports"], "render names the proxy's port"
    assert "ports" not in control["spec"]["containers"][0], "podman 4.3 would publish it on the host"


def _files(secret: dict[str, Any]) -> dict[str, bytes]:
    from tests.k8s.podman_play import _secret_files

    return _secret_files(secret)
