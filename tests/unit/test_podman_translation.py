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


def _translation(tmp_path: Path) -> Translation:
    spec = RenderSpec(
        namespace="ostk", sandbox="r-unit", sandbox_uid="0b7c5a52-3f64-4c47-9d0e-6b1e1c2d3e4f",
        image="localhost/openshell-sandbox:test-k8s", control_image="localhost/openshell-sandbox:test-k8s",
        agent_argv=("/usr/bin/sleep", "100000"), policy_text=POLICY,
    )  # fmt: skip
    material = issue_material(claims_for(spec, SandboxNames.of(spec.sandbox, spec.sandbox_uid)), spec.policy_digest)
    rendered = render(spec, material)
    objects = list(yaml.safe_load_all(to_yaml(rendered.objects)))
    secrets = list(yaml.safe_load_all(to_yaml(rendered.secrets)))
    return Translation(objects, secrets, tmp_path / "pods")


def test_a_deployment_pod_with_init_containers_does_not_restart_them_after_success(tmp_path: Path) -> None:
    translation = _translation(tmp_path)
    assert translation.pod_doc("control")["spec"].get("restartPolicy", "Always") == "Always"  # what render writes
    control = translation.translate("control", boundary_address="203.0.113.2")
    played = yaml.safe_load(control.yaml_path.read_text())
    assert played["spec"]["initContainers"], "the render's control pod copies its Secrets in an init container"
    assert played["spec"]["restartPolicy"] == "OnFailure"
    assert control.init_containers == [f"{control.name}-{c['name']}" for c in played["spec"]["initContainers"]]
    assert control.containers == [f"{control.name}-{c['name']}" for c in played["spec"]["containers"]]


def test_the_workload_pod_keeps_never(tmp_path: Path) -> None:
    workload = _translation(tmp_path).translate("workload", boundary_address="203.0.113.2")
    assert yaml.safe_load(workload.yaml_path.read_text())["spec"]["restartPolicy"] == "Never"
