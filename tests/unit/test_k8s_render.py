"""``k8s render`` as pure functions: names, claims, objects per privilege model, Pod Security, fences, Secrets.

Every rendered object is also validated against the published Kubernetes OpenAPI schemas (strict: no unknown
field) of two minor versions, from the ``kubernetes-validate`` package (offline).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import os
import shutil
import stat
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from supervisor.cli import command_parser, daemon_parser
from supervisor.control.policy import load_policy_text
from supervisor.k8s.names import MAX_NAME, SandboxNames, is_dns_label
from supervisor.k8s.objects import BOOTSTRAP_DIR, COPY_DIR, MODEL_R_CAPABILITIES, SECRETS_MOUNT, TLS_DIR
from supervisor.k8s.render import claims_for, render, to_yaml
from supervisor.k8s.secrets import SecretMaterial, check_material, issue_material
from supervisor.k8s.spec import Model, Owner, RenderError, RenderSpec, Topology, parse_owner
from supervisor.protocol.certs import POLICY_DIGEST_FILE, load_bundle, read_policy_digest
from supervisor.protocol.claims import Role, parse_claims_json

try:
    import kubernetes_validate
except ImportError:  # only the schema checks need it (a test extra: pip install -e '.[test]')
    kubernetes_validate = None
needs_schemas = pytest.mark.skipif(kubernetes_validate is None, reason="kubernetes-validate is not installed")

Doc = dict[str, Any]
UID = "7c0e2d4a-5b6f-4e1d-9a3c-2f8b1e0d6c5a"
IMAGE = "registry.example/agents/review-bot@sha256:" + "2d" * 32
CONTROL_IMAGE = "registry.example/openshell/openshell-sandbox:0.1.0"
POLICY = """\
version: 1
network_policies:
  pypi:
    name: Python package index
    endpoints:
      - host: pypi.org
        port: 443
    binaries:
      - path: /usr/bin/python3*
"""
SCHEMA_VERSIONS = ("1.35.0", "1.37.0")
CLUSTER_CIDRS = ("10.244.0.0/16", "fd00:10:244::/56")
SERVICE_CIDRS = ("10.96.0.0/12",)
MODELS = tuple(Model)


def make_spec(model: Model = Model.R, **changes: Any) -> RenderSpec:
    fields: dict[str, Any] = dict(
        namespace="agents-team-a", sandbox="review-bot", sandbox_uid=UID, image=IMAGE, control_image=CONTROL_IMAGE,
        agent_argv=("python3", "/opt/review-bot/main.py"), policy_text=POLICY, model=model,
        cluster_cidrs=CLUSTER_CIDRS, service_cidrs=SERVICE_CIDRS,
        networkpolicy_enforced=model is Model.P or changes.get("topology") == Topology.PROXY_POD,
    )  # fmt: skip
    fields.update(changes)
    return RenderSpec(**fields)


_MATERIAL: dict[tuple[str, bool], SecretMaterial] = {}


def material_for(spec: RenderSpec) -> SecretMaterial:
    """Minting is cheap but not free: one bundle per claim set and credentials choice in this module."""
    claims = claims_for(spec, SandboxNames.of(spec.sandbox, spec.sandbox_uid))
    key = (repr(claims) + spec.policy_digest, spec.has_credentials)
    if key not in _MATERIAL:
        creds = b"API_KEY:\n  secret: sk-test-1234567890\n  hosts: [api.example.com]\n"
        creds = creds if spec.has_credentials else None
        _MATERIAL[key] = issue_material(claims, spec.policy_digest, credentials=creds)
    return _MATERIAL[key]


def objects(model: Model, **changes: Any) -> list[Doc]:
    spec = make_spec(model, **changes)
    rendered = render(spec, material_for(spec))
    return [*rendered.objects, *rendered.secrets]


def one(docs: list[Doc], kind: str, prefix: str = "") -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(prefix)]
    assert len(found) == 1, (kind, prefix, [d["metadata"]["name"] for d in found])
    return found[0]


def pod_spec(doc: Doc) -> Doc:
    spec: Doc = doc["spec"]["template"]["spec"] if doc["kind"] == "Deployment" else doc["spec"]
    return spec


def pod_labels(doc: Doc) -> dict[str, str]:
    meta = doc["spec"]["template"]["metadata"] if doc["kind"] == "Deployment" else doc["metadata"]
    out: dict[str, str] = meta["labels"]
    return out


def main_container(doc: Doc) -> Doc:
    (container,) = pod_spec(doc)["containers"]
    out: Doc = container
    return out


def daemon_args(container: Doc) -> argparse.Namespace:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            return daemon_parser().parse_args(container["args"])
        except SystemExit:
            pytest.fail(f"{container['name']}: daemon_parser rejects {container['args']}: {err.getvalue()}")


def mount_path(container: Doc, volume: str) -> str | None:
    for mount in container.get("volumeMounts", []):
        if mount["name"] == volume:
            path: str = mount["mountPath"]
            return path
    return None


# -- names ----------------------------------------------------------------------------------------------------


def test_names_are_deterministic_dns_labels_that_embed_the_uid_hash() -> None:
    a, b = SandboxNames.of("review-bot", UID), SandboxNames.of("review-bot", UID)
    assert a == b
    for name in a.all():
        assert len(name) <= MAX_NAME and is_dns_label(name) and name[0].isalpha(), name
        assert a.hash in name
    assert a.policy_resource == f"ConfigMap/{a.policy_configmap}"


def test_a_recreated_sandbox_gets_different_names_for_every_object() -> None:
    old, new = SandboxNames.of("review-bot", UID), SandboxNames.of("review-bot", str(uuid.uuid4()))
    assert not set(old.all()) & set(new.all())


def test_names_never_collide_across_many_sandboxes_even_with_long_shared_prefixes() -> None:
    seen: set[str] = set()
    long = "a" * 63
    for i in range(300):
        sandbox = long if i % 2 else f"{long[:50]}-{i}"
        names = SandboxNames.of(sandbox, str(uuid.uuid4())).all()
        assert len(set(names)) == len(names)
        assert not seen & set(names)
        seen.update(names)
        assert all(len(n) <= MAX_NAME and is_dns_label(n) for n in names)


def test_a_long_name_is_shortened_without_a_trailing_dash() -> None:
    names = SandboxNames.of("x" * 44 + "-" + "y" * 18, UID)
    for name in names.all():
        assert "--" not in name and len(name) <= MAX_NAME


# -- claims agree with the objects ------------------------------------------------------------------------------


def _secret_files(secret: Doc) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in secret["data"].items()}


def _write_role_dir(directory: Path, files: dict[str, bytes]) -> Path:
    directory.mkdir(mode=0o700)
    for name, content in files.items():
        fd = os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(content)
    return directory


@pytest.mark.parametrize("model", MODELS)
def test_the_bundles_claims_are_the_rendered_names_and_their_digest_is_the_configmaps(
    model: Model, tmp_path: Path
) -> None:
    import hashlib

    docs = objects(model)
    pod, dep = one(docs, "Pod"), one(docs, "Deployment")
    np = one(docs, "NetworkPolicy", "os-np-")
    cm = one(docs, "ConfigMap")
    for role, prefix in ((Role.BOUNDARY, "os-boot-"), (Role.CONTROL, "os-boot-")):
        secret = next(d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"].endswith(f"-{role}"))
        assert secret["metadata"]["name"].startswith(prefix)
        bundle = load_bundle(_write_role_dir(tmp_path / str(role), _secret_files(secret)), role)
        claims = bundle.claims
        assert claims.namespace == pod["metadata"]["namespace"] == dep["metadata"]["namespace"]
        assert claims.sandbox == pod_labels(pod)["openshell.ai/sandbox-name"]
        assert claims.sandbox_uid == pod_labels(pod)["openshell.ai/sandbox-id"] == UID
        assert claims.control_deployment == dep["metadata"]["name"]
        assert claims.network_policy == np["metadata"]["name"]
        assert claims.image == main_container(pod)["image"] == IMAGE
        assert claims.policy_resource == f"ConfigMap/{cm['metadata']['name']}"
        assert "@" not in claims.policy_resource, "no UID the API server assigns"
        digest = "sha256:" + hashlib.sha256(cm["data"]["policy.yaml"].encode()).hexdigest()
        annotated = cm["metadata"]["annotations"]["openshell.ai/policy-digest"]
        assert read_policy_digest(bundle.directory) == digest == annotated


def test_the_daemons_use_the_secrets_the_objects_reference(tmp_path: Path) -> None:
    docs = objects(Model.U)
    secrets = {d["metadata"]["name"] for d in docs if d["kind"] == "Secret"}
    referenced = set()
    for doc in (one(docs, "Pod"), one(docs, "Deployment")):
        for vol in pod_spec(doc)["volumes"]:
            if "secret" in vol:
                referenced.add(vol["secret"]["secretName"])
    assert referenced == secrets
    pod_secret = next(v for v in pod_spec(one(docs, "Pod"))["volumes"] if "secret" in v)
    assert pod_secret["secret"]["secretName"].endswith("-boundary")


# -- per model -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_workload_pod_runs_the_boundary_as_pid_1_with_the_agent_after_the_separator(model: Model) -> None:
    pod = one(objects(model), "Pod")
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert spec["shareProcessNamespace"] is False
    args = daemon_args(main_container(pod))
    assert args.mode == "boundary" and args.agent_argv == ["python3", "/opt/review-bot/main.py"]
    assert args.privilege_model == str(model)
    assert args.acknowledge_external_fence is (model is Model.P)
    assert args.listen == "[::]:7443" and str(args.bootstrap) == BOOTSTRAP_DIR
    assert [p["containerPort"] for p in main_container(pod)["ports"]] == [7443]
    # The boundary's state directory is a writable emptyDir; in P --tls-dir is on it.
    main = main_container(pod)
    state = next(v for v in spec["volumes"] if mount_path(main, v["name"]) == "/run/openshell-boundary")
    assert "emptyDir" in state
    if model is Model.P:
        assert str(args.tls_dir) == TLS_DIR and TLS_DIR.startswith("/run/openshell-boundary/")
    ws = next(v for v in spec["volumes"] if mount_path(main_container(pod), v["name"]) == args.workdir)
    assert "emptyDir" in ws and args.workdir != "/"


def test_model_r_boundary_is_root_with_exactly_its_capabilities_and_mounts_its_secret_0400() -> None:
    pod = one(objects(Model.R), "Pod")
    sc = main_container(pod)["securityContext"]
    assert sc["runAsUser"] == 0 and sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
    assert sc["capabilities"]["drop"] == ["ALL"] and set(sc["capabilities"]["add"]) == set(MODEL_R_CAPABILITIES)
    assert not any(cap.startswith("CAP_") for cap in sc["capabilities"]["add"])
    assert "fsGroup" not in pod["spec"]["securityContext"], "fsGroup makes the key 0440, which load_bundle refuses"
    (vol,) = [v for v in pod["spec"]["volumes"] if "secret" in v]
    assert vol["secret"]["defaultMode"] == 0o400
    assert mount_path(main_container(pod), vol["name"]) == BOOTSTRAP_DIR
    assert not pod["spec"].get("initContainers")


def test_model_u_asks_for_a_user_namespace_and_an_unmasked_proc() -> None:
    pod = one(objects(Model.U), "Pod")
    assert pod["spec"]["hostUsers"] is False
    sc = main_container(pod)["securityContext"]
    assert sc["procMount"] == "Unmasked" and sc["capabilities"] == {"drop": ["ALL"]}
    assert pod["spec"]["securityContext"]["runAsUser"] == 10001


@pytest.mark.parametrize(("model", "kind"), [(Model.U, "Pod"), (Model.P, "Pod"), (Model.R, "Deployment")])
def test_non_root_daemons_read_a_copy_of_their_secrets_made_by_an_init_container(model: Model, kind: str) -> None:
    doc = one(objects(model, has_credentials=True), kind)
    spec = pod_spec(doc)
    main = main_container(doc)
    (init,) = spec["initContainers"]
    for vol in spec["volumes"]:
        if "secret" in vol:
            assert mount_path(main, vol["name"]) is None, "a Secret volume must not reach the daemon's container"
            assert mount_path(init, vol["name"]) is not None
            assert vol["secret"]["defaultMode"] & 0o007 == 0
    run = next(v for v in spec["volumes"] if mount_path(main, v["name"]) == COPY_DIR)
    assert run["emptyDir"]["medium"] == "Memory" and mount_path(init, run["name"]) == COPY_DIR
    assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsUser"] != 0
    assert "umask 077" in init["args"][0]


def test_the_copy_script_gives_the_daemon_owner_only_copies_of_a_kubelet_laid_out_secret(tmp_path: Path) -> None:
    """Run the init container's script (paths moved under tmp) on a Secret volume laid out as kubelet does."""
    sh = shutil.which("sh")
    if sh is None:
        pytest.skip("no sh")
    init = pod_spec(one(objects(Model.P), "Pod"))["initContainers"][0]
    script = init["args"][0].replace(SECRETS_MOUNT, str(tmp_path / "secrets")).replace(COPY_DIR, str(tmp_path / "run"))
    volume = tmp_path / "secrets" / "bootstrap"
    data = volume / "..2026_12_01_00_00_00.123"
    data.mkdir(parents=True)
    for name in ("ca.pem", "key.pem"):
        (data / name).write_text(name)
        (data / name).chmod(0o440)
        (volume / name).symlink_to(f"..data/{name}")
    (volume / "..data").symlink_to(data.name)
    (tmp_path / "run").mkdir()
    subprocess.run([sh, "-c", script], check=True, timeout=30)
    copied = tmp_path / "run" / "bootstrap"
    assert sorted(p.name for p in copied.iterdir()) == ["ca.pem", "key.pem"]
    assert stat.S_IMODE(copied.stat().st_mode) == 0o700
    for p in copied.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600 and not p.is_symlink() and p.read_text() == p.name
    # An empty Secret volume fails the init container (the pod never starts) rather than copying nothing.
    shutil.rmtree(tmp_path / "run" / "bootstrap")
    for p in volume.iterdir():
        p.unlink() if p.is_symlink() else shutil.rmtree(p)
    assert subprocess.run([sh, "-c", script], capture_output=True, timeout=30).returncode != 0


@pytest.mark.parametrize("model", MODELS)
def test_control_is_non_root_read_only_tokenless_and_dials_the_boundary_service(model: Model) -> None:
    docs = objects(model)
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    spec, main = pod_spec(dep), main_container(dep)
    assert spec["automountServiceAccountToken"] is False
    sc = main["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"} and sc["allowPrivilegeEscalation"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod_labels(dep).items()
    args = daemon_args(main)
    svc = one(docs, "Service")
    assert args.boundary == f"{svc['metadata']['name']}:7443"
    assert args.capture_mode == ("proxy-env" if model is Model.P else "netns")
    assert args.acknowledge_external_fence is (model is Model.P)
    assert str(args.interception_ca).startswith(COPY_DIR + "/"), "the CA comes from its Secret, kept across restarts"
    cm = one(docs, "ConfigMap")
    policy_vol = next(v for v in spec["volumes"] if "configMap" in v)
    assert policy_vol["configMap"]["name"] == cm["metadata"]["name"]
    assert args.policy.parent == Path(mount_path(main, policy_vol["name"]) or "")
    assert not any("subPath" in m for m in main["volumeMounts"])
    load_policy_text(cm["data"][args.policy.name], "configmap")
    for probe in ("readinessProbe", "livenessProbe"):
        command = main[probe]["exec"]["command"]
        with contextlib.redirect_stderr(io.StringIO()):
            command_parser().parse_args(command[1:])


def test_credentials_go_to_control_only() -> None:
    docs = objects(Model.R, has_credentials=True)
    cred = one(docs, "Secret", "os-cred-")
    args = daemon_args(main_container(one(docs, "Deployment")))
    assert args.credentials is not None and str(args.credentials).startswith(COPY_DIR + "/credentials/")
    pod_secrets = {v["secret"]["secretName"] for v in pod_spec(one(docs, "Pod"))["volumes"] if "secret" in v}
    assert cred["metadata"]["name"] not in pod_secrets
    assert one(docs, "Secret", "os-ca-")["metadata"]["name"] not in pod_secrets
    assert one(objects(Model.R), "Deployment")  # and without credentials: no such Secret
    assert not [d for d in objects(Model.R) if d["metadata"]["name"].startswith("os-cred-")]


# -- Pod Security Standards, by rule --------------------------------------------------------------------------

_BASELINE_CAPS = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP",
    "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip
_RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
}  # fmt: skip


def _containers(spec: Doc) -> list[Doc]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def baseline_violations(doc: Doc) -> list[str]:
    """Pod Security "baseline" (Kubernetes 1.35): host namespaces, privileged, capabilities beyond the default
    set, hostPath, hostPorts, AppArmor, SELinux, /proc mount (Unmasked allowed with hostUsers: false), seccomp
    (Unconfined forbidden), sysctls."""
    spec = pod_spec(doc)
    out = [f for f in ("hostNetwork", "hostPID", "hostIPC") if spec.get(f)]
    out += [f"volume {v['name']}: hostPath" for v in spec.get("volumes", []) if "hostPath" in v]
    pod_sc = spec.get("securityContext", {})
    if pod_sc.get("seccompProfile", {}).get("type") == "Unconfined":
        out.append("pod seccomp Unconfined")
    if pod_sc.get("sysctls"):
        out.append("sysctls")
    for c in _containers(spec):
        sc = c.get("securityContext", {})
        if sc.get("privileged"):
            out.append(f"{c['name']}: privileged")
        extra = set(sc.get("capabilities", {}).get("add", [])) - _BASELINE_CAPS
        if extra:
            out.append(f"{c['name']}: capabilities {sorted(extra)}")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            out.append(f"{c['name']}: hostPort")
        if sc.get("appArmorProfile", {}).get("type") == "Unconfined":
            out.append(f"{c['name']}: AppArmor Unconfined")
        if sc.get("procMount", "Default") != "Default" and spec.get("hostUsers") is not False:
            out.append(f"{c['name']}: procMount without hostUsers: false")
        if sc.get("seccompProfile", {}).get("type") == "Unconfined":
            out.append(f"{c['name']}: seccomp Unconfined")
    return out


def restricted_violations(doc: Doc) -> list[str]:
    """Pod Security "restricted" = baseline plus: volume types, no privilege escalation, non-root, seccomp
    RuntimeDefault or Localhost, drop ALL (add only NET_BIND_SERVICE); procMount must be Default."""
    spec = pod_spec(doc)
    pod_sc = spec.get("securityContext", {})
    out = baseline_violations(doc)
    for v in spec.get("volumes", []):
        if next(k for k in v if k != "name") not in _RESTRICTED_VOLUMES:
            out.append(f"volume {v['name']}")
    for c in _containers(spec):
        sc, name = c.get("securityContext", {}), c["name"]
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []) or set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: capabilities")
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
            out.append(f"{name}: runAsNonRoot")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            out.append(f"{name}: runAsUser 0")
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccomp")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{name}: procMount")
    return out


@pytest.mark.parametrize("model", MODELS)
def test_control_meets_restricted_in_every_model(model: Model) -> None:
    assert restricted_violations(one(objects(model), "Deployment")) == []


def test_model_p_workload_meets_restricted() -> None:
    assert restricted_violations(one(objects(Model.P), "Pod")) == []


def test_model_u_can_use_a_localhost_seccomp_profile_and_still_meets_baseline() -> None:
    pod = one(objects(Model.U, seccomp_localhost="profiles/openshell-boundary.json"), "Pod")
    sc = main_container(pod)["securityContext"]
    assert sc["seccompProfile"] == {"type": "Localhost", "localhostProfile": "profiles/openshell-boundary.json"}
    assert baseline_violations(pod) == []
    for version in SCHEMA_VERSIONS if kubernetes_validate is not None else ():
        kubernetes_validate.validate(pod, version, strict=True)
    with pytest.raises(RenderError, match=r"^--seccomp-localhost: only for"):
        make_spec(Model.P, seccomp_localhost="x.json")
    with pytest.raises(RenderError, match=r"^--seccomp-localhost: "):
        make_spec(Model.U, seccomp_localhost="../etc/x")


def test_model_u_workload_meets_baseline_with_host_users_false_but_not_restricted() -> None:
    pod = one(objects(Model.U), "Pod")
    assert baseline_violations(pod) == []
    assert restricted_violations(pod) == ["agent: procMount"]  # the listed exception
    pod["spec"]["hostUsers"] = True
    assert baseline_violations(pod) == ["agent: procMount without hostUsers: false"]


def test_model_r_workload_meets_neither_for_the_listed_reasons() -> None:
    pod = one(objects(Model.R), "Pod")
    assert baseline_violations(pod) == [
        "agent: capabilities ['DAC_READ_SEARCH', 'NET_ADMIN', 'SYS_ADMIN', 'SYS_PTRACE']",
        "agent: AppArmor Unconfined",
    ]
    assert "agent: runAsUser 0" in restricted_violations(pod)


# -- fences ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_workload_network_policy_admits_only_its_control_on_the_boundary_port_and_no_egress(model: Model) -> None:
    docs = objects(model)
    spec = one(docs, "NetworkPolicy", "os-np-")["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"] and spec["egress"] == []
    assert spec["podSelector"]["matchLabels"].items() <= pod_labels(one(docs, "Pod")).items()
    assert not spec["podSelector"]["matchLabels"].items() <= pod_labels(one(docs, "Deployment")).items()
    (rule,) = spec["ingress"]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}, "no namespaceSelector or ipBlock: only this sandbox's control"
    assert peer["podSelector"]["matchLabels"].items() <= pod_labels(one(docs, "Deployment")).items()
    assert not peer["podSelector"]["matchLabels"].items() <= pod_labels(one(docs, "Pod")).items()
    assert rule["ports"] == [{"protocol": "TCP", "port": 7443}]
    svc = one(docs, "Service")["spec"]
    assert svc["clusterIP"] == "None" and svc["publishNotReadyAddresses"] is True
    assert svc["selector"].items() <= pod_labels(one(docs, "Pod")).items()


def test_control_network_policy_has_no_ingress_unless_the_api_listens() -> None:
    """Remote operators: the API port is admitted only when control serves it (--api-listen), and only that port."""
    docs = objects(Model.R)
    spec = one(docs, "NetworkPolicy", "os-npc-")["spec"]
    assert spec["ingress"] == []
    control = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert not [a for a in control["args"] if a.startswith("--api-listen")] and "ports" not in control
    docs = objects(Model.R, api_listen=True, api_port=7555)
    (rule,) = one(docs, "NetworkPolicy", "os-npc-")["spec"]["ingress"]
    assert rule == {"ports": [{"protocol": "TCP", "port": 7555}]}  # any source: the operator certificate admits
    control = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "--api-listen=*:7555" in control["args"]
    assert control["ports"] == [{"name": "operator-api", "containerPort": 7555, "protocol": "TCP"}]
    spec = one(objects(Model.R, api_listen=True, operator_namespace="openshell-ops"), "NetworkPolicy", "os-npc-")
    (rule,) = spec["spec"]["ingress"]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "openshell-ops"}}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": 7444}]


def test_every_object_is_labelled_and_owned() -> None:
    owner = Owner("agents.example/v1alpha1", "Sandbox", "review-bot", UID)
    for doc in objects(Model.R, owner=owner):
        meta = doc["metadata"]
        assert meta["labels"]["openshell.ai/sandbox-id"] == UID
        assert meta["labels"]["openshell.ai/sandbox-role"] in ("workload", "control")
        (ref,) = meta["ownerReferences"]
        assert ref == {**owner.reference(), "controller": True}


# -- schemas --------------------------------------------------------------------------------------------------


@needs_schemas
@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("model", MODELS)
def test_every_object_validates_against_the_kubernetes_schemas(model: Model, version: str) -> None:
    owner = Owner("agents.example/v1alpha1", "Sandbox", "review-bot", UID)
    docs = objects(model, owner=owner, has_credentials=True, operator_namespace="ops", api_listen=True)
    spec = make_spec(model)
    docs += render(spec, None).secrets  # the redacted form too
    assert {d["kind"] for d in docs} == {"ConfigMap", "NetworkPolicy", "Service", "Deployment", "Pod", "Secret"}
    for doc in docs:
        # Through YAML, as kubectl would read it (octal modes included).
        reread = yaml.safe_load(to_yaml([doc]))
        assert reread == doc
        kubernetes_validate.validate(reread, version, strict=True)


@needs_schemas
def test_the_schema_check_can_fail() -> None:
    pod = one(objects(Model.P), "Pod")
    pod["spec"]["containers"][0]["securityContext"]["runAsNonRot"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, SCHEMA_VERSIONS[0], strict=True)


# -- bad input ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"namespace": "Agents"}, "--namespace"),
        ({"sandbox": "review_bot"}, "--sandbox"),
        ({"sandbox": "x" * 64}, "--sandbox"),
        ({"sandbox_uid": "not a uid"}, "--sandbox-uid"),
        ({"image": "has space"}, "--image"),
        ({"agent_argv": ()}, "AGENT"),
        ({"generation": -1}, "--generation"),
        ({"workdir": "/"}, "--workdir"),
        ({"workdir": "rel"}, "--workdir"),
        ({"agent_user": "1000"}, "--agent-user"),
        ({"boundary_port": 0}, "--boundary-port"),
        ({"operator_namespace": "Ops!", "api_listen": True}, "--operator-namespace"),
        ({"operator_namespace": "ops"}, "--operator-namespace"),  # needs --api-listen
        ({"owner": Owner("v1", "Sandbox", "x", UID), "owner_namespace": "elsewhere"}, "--owner"),
        ({"owner_namespace": "agents-team-a"}, "--owner-namespace"),
        ({"proxy_port": 3128}, "--proxy-port"),  # proxy-pod only (tests/unit/test_k8s_render_proxy_pod.py)
    ],
)
def test_bad_input_is_refused_naming_the_flag(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(RenderError) as info:
        make_spec(Model.R, **changes)
    assert info.value.field == field and str(info.value).startswith(f"{field}: ")


@pytest.mark.parametrize(
    "text", ["Sandbox/x/" + UID, "v1/sandbox/x/" + UID, "v1/Sandbox/X_/" + UID, "v1/Sandbox/x/bad uid", "a/b/c/d/e/f"]
)
def test_a_malformed_owner_is_refused(text: str) -> None:
    with pytest.raises(RenderError, match=r"^--owner: "):
        parse_owner(text)


def test_owner_parses_core_and_grouped_api_versions() -> None:
    assert parse_owner(f"v1/ConfigMap/x/{UID}").api_version == "v1"
    assert parse_owner(f"agents.x-k8s.io/v1alpha1/Sandbox/review-bot/{UID}") == Owner(
        "agents.x-k8s.io/v1alpha1", "Sandbox", "review-bot", UID
    )


def test_reused_material_must_carry_this_renders_claims_and_policy(tmp_path: Path) -> None:
    spec = make_spec(Model.R)
    names = SandboxNames.of(spec.sandbox, spec.sandbox_uid)
    material = material_for(spec)
    check_material(material, claims_for(spec, names), spec.policy_digest, tmp_path)
    other = make_spec(Model.R, image=IMAGE.replace("2d", "3e"))
    with pytest.raises(RenderError, match="claim 'image'"):
        check_material(material, claims_for(other, names), other.policy_digest, tmp_path)
    with pytest.raises(RenderError, match="records policy sha256:"):
        check_material(material, claims_for(spec, names), "sha256:" + "0" * 64, tmp_path)
    swapped = SecretMaterial(
        boundary=material.boundary,
        control={**material.control, "key.pem": material.boundary["key.pem"]},
        interception_ca=material.interception_ca,
    )
    with pytest.raises(RenderError, match=r"key\.pem"):
        check_material(swapped, claims_for(spec, names), spec.policy_digest, tmp_path)


def test_bundle_policy_digest_file_is_read_strictly(tmp_path: Path) -> None:
    assert read_policy_digest(tmp_path) is None
    (tmp_path / POLICY_DIGEST_FILE).write_text("md5:abc\n")
    from supervisor.protocol.certs import BundleError

    with pytest.raises(BundleError, match=POLICY_DIGEST_FILE):
        read_policy_digest(tmp_path)


def test_redacted_secrets_show_claims_but_no_key_material() -> None:
    spec = make_spec(Model.R, has_credentials=True)
    rendered = render(spec, None)
    text = to_yaml(rendered.secrets)
    assert "BEGIN" not in text and "\ndata:" not in text
    boundary = next(d for d in rendered.secrets if d["metadata"]["name"].endswith("-boundary"))
    assert parse_claims_json(boundary["stringData"]["claims.json"].encode()) == rendered.claims
    assert boundary["stringData"]["key.pem"].startswith("<redacted: ")
