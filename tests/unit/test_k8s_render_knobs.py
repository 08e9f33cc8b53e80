"""``k8s render``'s chart knobs and the operator's statements, by rule and against the strict Kubernetes schemas.

Resources, the workload's memory limit with the boundary's headroom, the workspace's size, the image pinned by
digest, the explicit command, the recommended labels, ``blockOwnerDeletion`` as an opt-in; control's egress
fence (the internet less the cluster and the metadata addresses, read here as a CNI would evaluate it); the
fence the operator states (``--networkpolicy-enforced``) and model P's canary; clusters that assign uids.
"""

from __future__ import annotations

import base64
import contextlib
import io
import ipaddress
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from supervisor.k8s.names import SandboxNames
from supervisor.k8s.objects import ANNOTATION_NETWORKPOLICY, CANARY_ADDRESS_ENV
from supervisor.k8s.quantity import BOUNDARY_MEMORY_HEADROOM, Resources, format_bytes, parse_bytes
from supervisor.k8s.render import claims_for, render
from supervisor.k8s.secrets import SecretMaterial, issue_material
from supervisor.k8s.spec import METADATA_CIDRS, Model, Owner, RenderError, Topology, parse_dns_peer
from supervisor.protocol.fence_canary import parse_canary

from .test_k8s_render import (
    IMAGE,
    MODELS,
    SCHEMA_VERSIONS,
    UID,
    Doc,
    daemon_args,
    kubernetes_validate,
    main_container,
    make_spec,
    needs_schemas,
    one,
    pod_spec,
    restricted_violations,
)

GiB, MiB = 2**30, 2**20
POLICY_INTERNAL = """\
version: 1
network_policies:
  internal:
    name: an internal service the agent may use
    endpoints:
      - host: registry.internal
        port: 5000
        allowed_ips: [10.244.7.0/24]
      - host: wiki.example
        port: 443
        allowed_ips: [203.0.113.0/24]
    binaries:
      - path: /usr/bin/curl
"""


_MATERIAL: dict[str, SecretMaterial] = {}


def objects(model: Model = Model.R, **changes: Any) -> list[Doc]:
    """Rendered with real Secret material of the spec's claims and topology (one mint per claim set)."""
    spec = make_spec(model, **changes)
    claims = claims_for(spec, SandboxNames.of(spec.sandbox, spec.sandbox_uid))
    key = repr(claims) + spec.policy_digest + str(spec.topology)
    if key not in _MATERIAL:
        proxy_pod = spec.topology is Topology.PROXY_POD
        _MATERIAL[key] = issue_material(claims, spec.policy_digest, proxy_pod=proxy_pod)
    rendered = render(spec, _MATERIAL[key])
    return [*rendered.objects, *rendered.secrets]


def validate(docs: list[Doc]) -> None:
    for version in SCHEMA_VERSIONS if kubernetes_validate is not None else ():
        for doc in docs:
            kubernetes_validate.validate(doc, version, strict=True)


def workload(docs: list[Doc]) -> Doc:
    return main_container(one(docs, "Pod"))


def control(docs: list[Doc]) -> Doc:
    return main_container(one(docs, "Deployment"))


# -- resources, memory, workspace ------------------------------------------------------------------------------


def test_quantities_read_and_write_exactly() -> None:
    assert parse_bytes("2Gi", "-") == 2 * GiB and parse_bytes("1G", "-") == 10**9 and parse_bytes("512", "-") == 512
    assert format_bytes(2 * GiB + BOUNDARY_MEMORY_HEADROOM) == "2304Mi" and format_bytes(10**9) == "1000000000"
    for bad in ("2 Gi", "2gb", "-1Gi", "1.5Gi", ""):
        with pytest.raises(ValueError, match=r"^--x: "):
            parse_bytes(bad, "--x")
    res = Resources("100m", "128Mi", "512Mi").with_text("cpu=2,limit-memory=1G", "--resources")
    assert res == Resources("2", "128Mi", "1000000000")
    for bad in ("cpu=fast", "disk=1Gi", "memory=1Gi", "cpu"):
        with pytest.raises(ValueError, match=r"^--resources: "):
            Resources("100m", "128Mi", "512Mi").with_text(bad, "--resources")


@pytest.mark.parametrize("model", MODELS)
def test_the_container_limit_holds_the_workloads_limit_plus_the_boundarys_headroom(model: Model) -> None:
    """Default: the boundary's --memory-limit is the container's 2Gi less the headroom; --memory-limit raises the
    container's limit to it plus the headroom, so the container's OOM meets the workload's cgroup first."""
    docs = objects(model)
    assert workload(docs)["resources"]["limits"]["memory"] == "2Gi"
    assert daemon_args(workload(docs)).memory_limit == 2 * GiB - BOUNDARY_MEMORY_HEADROOM
    docs = objects(model, memory_limit=4 * GiB)
    assert workload(docs)["resources"]["limits"]["memory"] == "4352Mi"
    assert daemon_args(workload(docs)).memory_limit == 4 * GiB
    validate(docs)


def test_resources_are_the_operators_and_a_limit_without_headroom_is_refused() -> None:
    docs = objects(
        Model.R,
        workload_resources=Resources("1", "1Gi", "8Gi"),
        control_resources=Resources("500m", "256Mi", "1Gi"),
        memory_limit=6 * GiB,
    )
    assert workload(docs)["resources"]["requests"] == {"cpu": "1", "memory": "1Gi"}
    assert workload(docs)["resources"]["limits"]["memory"] == "8Gi"
    assert control(docs)["resources"] == {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}
    assert daemon_args(workload(docs)).memory_limit == 6 * GiB
    validate(docs)
    with pytest.raises(
        RenderError, match=r"^--resources: workload limit-memory=4Gi leaves the boundary less than 256Mi"
    ):
        make_spec(Model.R, workload_resources=Resources("1", "1Gi", "4Gi"), memory_limit=4 * GiB)
    with pytest.raises(RenderError, match=r"^--resources: "):
        make_spec(Model.R, workload_resources=Resources("1", "64Mi", "128Mi"))
    with pytest.raises(RenderError, match=r"^--memory-limit: the proxy-pod workload runs no boundary"):
        make_spec(Model.R, topology=Topology.PROXY_POD, memory_limit=GiB)


@pytest.mark.parametrize("topology", list(Topology))
def test_the_workspace_is_size_limited_and_so_is_the_containers_ephemeral_storage(topology: Topology) -> None:
    for size, limit, storage in ((None, "10Gi", "11Gi"), (512 * MiB, "512Mi", "1536Mi")):
        changes: dict[str, Any] = {"topology": topology}
        if size is not None:
            changes["workspace_size"] = size
        docs = objects(Model.R, **changes)
        (ws,) = [v for v in pod_spec(one(docs, "Pod"))["volumes"] if v["name"] == "workspace"]
        assert ws["emptyDir"] == {"sizeLimit": limit}
        assert workload(docs)["resources"]["limits"]["ephemeral-storage"] == storage
        validate(docs)
    with pytest.raises(RenderError, match=r"^--workspace-size: "):
        make_spec(Model.R, workspace_size=1000)


# -- image, command, labels, owner -----------------------------------------------------------------------------


def test_the_image_must_be_a_digest_unless_the_operator_allows_a_tag() -> None:
    for tag in ("registry.example/agents/review-bot:1.0", "review-bot", IMAGE[:-1], IMAGE.replace("sha256", "sha512")):
        with pytest.raises(RenderError, match=r"^--image: .* is not pinned by digest .*--allow-mutable-image"):
            make_spec(Model.R, image=tag)
    docs = objects(Model.R, image="registry.example/agents/review-bot:1.0", allow_mutable_image=True)
    assert workload(docs)["image"] == "registry.example/agents/review-bot:1.0"


@pytest.mark.parametrize("model", MODELS)
def test_both_daemons_name_their_command_and_the_workloads_path_is_a_flag(model: Model) -> None:
    docs = objects(model)
    assert workload(docs)["command"] == control(docs)["command"] == ["/usr/local/bin/openshell-sandbox"]
    docs = objects(model, entrypoint="/opt/openshell-sandbox/bin/openshell-sandbox")
    assert workload(docs)["command"] == ["/opt/openshell-sandbox/bin/openshell-sandbox"]
    assert control(docs)["command"] == ["/usr/local/bin/openshell-sandbox"], "control's image is ours"
    validate(docs)
    with pytest.raises(RenderError, match=r"^--entrypoint: "):
        make_spec(model, entrypoint="openshell-sandbox")


@pytest.mark.parametrize("topology", list(Topology))
def test_every_object_and_pod_carries_the_recommended_labels_and_no_selector_uses_them(topology: Topology) -> None:
    docs = objects(Model.R, topology=topology)
    for doc in docs:
        metas = [doc["metadata"]] + ([doc["spec"]["template"]["metadata"]] if doc["kind"] == "Deployment" else [])
        for meta in metas:
            role = meta["labels"]["openshell.ai/sandbox-role"]
            app = {k: v for k, v in meta["labels"].items() if k.startswith("app.kubernetes.io/")}
            assert app == {
                "app.kubernetes.io/name": "openshell-sandbox", "app.kubernetes.io/instance": "review-bot",
                "app.kubernetes.io/component": role, "app.kubernetes.io/part-of": "openshell-sandbox",
                "app.kubernetes.io/managed-by": "openshell-sandbox-render",
            }  # fmt: skip
    text = repr([d.get("spec") for d in docs])
    for key in re.findall(r"'(?:matchLabels|selector)': \{[^}]*\}", text):
        assert "app.kubernetes.io" not in key or "coredns" in key, key


def test_block_owner_deletion_is_an_opt_in() -> None:
    owner = Owner("agents.example/v1alpha1", "Sandbox", "review-bot", UID)
    for doc in objects(Model.R, owner=owner):
        assert "blockOwnerDeletion" not in doc["metadata"]["ownerReferences"][0]
    docs = objects(Model.R, owner=owner, block_owner_deletion=True)
    for doc in docs:
        assert doc["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] is True
    validate(docs)
    with pytest.raises(RenderError, match=r"^--block-owner-deletion: given without --owner"):
        make_spec(Model.R, block_owner_deletion=True)


# -- control's egress: the internet, less the cluster ----------------------------------------------------------


def _peer_matches(peer: Doc, address: str) -> bool:
    if "ipBlock" not in peer:
        return False  # a pod or namespace selector: never an arbitrary address
    block = peer["ipBlock"]
    ip = ipaddress.ip_address(address)
    net = ipaddress.ip_network(block["cidr"])
    if ip.version != net.version or ip not in net:
        return False
    return not any(ip in ipaddress.ip_network(e) for e in block.get("except", []))


def admits(policy: Doc, address: str, port: int) -> bool:
    """Whether a NetworkPolicy's egress rules admit a TCP connection to an address outside any selected pod, as a
    CNI evaluates them: any rule whose peers and ports both match."""
    for rule in policy["spec"]["egress"]:
        peers_ok = "to" not in rule or any(_peer_matches(p, address) for p in rule["to"])
        ports_ok = "ports" not in rule or any(p["protocol"] == "TCP" and p["port"] == port for p in rule["ports"])
        if peers_ok and ports_ok:
            return True
    return False


@pytest.mark.parametrize("topology", list(Topology))
def test_control_reaches_the_internet_but_not_the_cluster_nor_the_metadata_service(topology: Topology) -> None:
    docs = objects(Model.R, topology=topology)
    npc = one(docs, "NetworkPolicy", "os-npc-")
    for address in ("93.184.216.34", "2606:2800:220:1::1"):
        assert admits(npc, address, 443) and admits(npc, address, 8080)
    # a pod (both families), a Service VIP, the metadata addresses of both families and Alibaba's
    for address in ("10.244.3.7", "fd00:10:244::7", "10.96.0.1", "169.254.169.254", "fd00:ec2::254", "100.100.100.200"):
        for port in (80, 443, 6443):
            assert not admits(npc, address, port), address
    validate(docs)


def test_what_control_must_reach_inside_is_named_dns_peers_its_boundary_and_internal_allowed_ips() -> None:
    peers = (parse_dns_peer("openshift-dns/dns.operator.openshift.io/daemonset-dns=default:5353"),)
    docs = objects(Model.R, dns_peers=peers, policy_text=POLICY_INTERNAL)
    egress = one(docs, "NetworkPolicy", "os-npc-")["spec"]["egress"]
    (dns,) = [r for r in egress if any("namespaceSelector" in p for p in r.get("to", []))]
    assert dns["ports"] == [{"protocol": "UDP", "port": 5353}, {"protocol": "TCP", "port": 5353}]
    assert dns["to"][0]["podSelector"]["matchLabels"] == {"dns.operator.openshift.io/daemonset-dns": "default"}
    (to_boundary,) = [r for r in egress if any(set(p) == {"podSelector"} for p in r.get("to", []))]
    assert to_boundary["ports"] == [{"protocol": "TCP", "port": 7443}]
    assert to_boundary["to"][0]["podSelector"]["matchLabels"]["openshell.ai/sandbox-role"] == "workload"
    # The internal allowed_ips range is admitted on its endpoint's port only; the public one needs no rule.
    npc = one(docs, "NetworkPolicy", "os-npc-")
    assert admits(npc, "10.244.7.9", 5000) and not admits(npc, "10.244.7.9", 443)
    assert not admits(npc, "10.244.8.9", 5000)
    assert [r for r in egress if r.get("to", [{}])[0].get("ipBlock", {}).get("cidr") == "10.244.7.0/24"]
    assert not [r for r in egress if r.get("to", [{}])[0].get("ipBlock", {}).get("cidr") == "203.0.113.0/24"]
    validate(docs)


def test_render_refuses_to_guess_the_cluster_and_none_still_excludes_the_metadata_addresses() -> None:
    with pytest.raises(RenderError, match=r"^--cluster-cidr: required: .*--service-cidr.*--cluster-cidr none"):
        make_spec(Model.R, cluster_cidrs=None)
    with pytest.raises(RenderError, match=r"^--service-cidr: given with --cluster-cidr none"):
        make_spec(Model.R, cluster_cidrs=(), service_cidrs=("10.96.0.0/12",))
    docs = objects(Model.R, cluster_cidrs=(), service_cidrs=())
    npc = one(docs, "NetworkPolicy", "os-npc-")
    assert admits(npc, "10.244.3.7", 443)  # the operator said: no cluster range to exclude
    for address in METADATA_CIDRS:
        assert not admits(npc, str(ipaddress.ip_network(address)[0]), 80)
    validate(docs)


# -- the fence the operator states ------------------------------------------------------------------------------


@pytest.mark.parametrize("changes", [{"model": Model.P}, {"model": Model.R, "topology": Topology.PROXY_POD}])
def test_the_fence_of_p_and_proxy_pod_must_be_stated_by_the_operator(changes: dict[str, Any]) -> None:
    with pytest.raises(RenderError, match=r"^--networkpolicy-enforced: required for .*CNI enforces NetworkPolicy"):
        make_spec(**changes, networkpolicy_enforced=False)
    docs = objects(**changes)
    for doc in docs:
        assert doc["metadata"]["annotations"][ANNOTATION_NETWORKPOLICY] == "stated by the operator at render"
    validate(docs)


def test_an_unstated_fence_leaves_no_annotation() -> None:
    for doc in objects(Model.R):
        assert ANNOTATION_NETWORKPOLICY not in doc["metadata"].get("annotations", {})


def test_model_p_renders_the_canary_on_controls_own_address_which_only_the_workload_may_try() -> None:
    docs = objects(Model.P)
    ctl, wl = control(docs), workload(docs)
    ctl_args, wl_args = daemon_args(ctl), daemon_args(wl)
    assert ctl_args.fence_canary == f"$({CANARY_ADDRESS_ENV}):7445"
    assert not ctl_args.acknowledge_unprobed_fence and not wl_args.acknowledge_unprobed_fence
    assert wl_args.acknowledge_external_fence
    (env,) = ctl["env"]
    assert env == {
        "name": CANARY_ADDRESS_ENV,
        "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}},
    }
    # kubelet expands $(VAR) from the container's env: both families parse as control's own literal address
    for pod_ip in ("10.244.1.5", "fd00:10:244::5"):
        assert parse_canary(ctl_args.fence_canary.replace(f"$({CANARY_ADDRESS_ENV})", pod_ip)) == (pod_ip, 7445)
    npc = one(docs, "NetworkPolicy", "os-npc-")["spec"]
    (rule,) = npc["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 7445}]
    assert rule["from"][0]["podSelector"]["matchLabels"]["openshell.ai/sandbox-role"] == "workload"
    assert one(docs, "NetworkPolicy", "os-np-")["spec"]["egress"] == [], "the workload's fence never admits it"
    assert {"name": "fence-canary", "containerPort": 7445, "protocol": "TCP"} in ctl["ports"]
    assert restricted_violations(one(docs, "Deployment")) == []
    validate(docs)


def test_model_p_without_the_canary_is_the_operators_choice() -> None:
    docs = objects(Model.P, unprobed_fence=True)
    assert (
        daemon_args(control(docs)).acknowledge_unprobed_fence and daemon_args(workload(docs)).acknowledge_unprobed_fence
    )
    assert daemon_args(control(docs)).fence_canary is None and "env" not in control(docs)
    assert one(docs, "NetworkPolicy", "os-npc-")["spec"]["ingress"] == []
    with pytest.raises(RenderError, match=r"^--unprobed-fence: only for model P"):
        make_spec(Model.R, unprobed_fence=True)
    with pytest.raises(RenderError, match=r"^--canary-port: "):
        make_spec(Model.P, canary_port=7443)


# -- clusters that assign ids -----------------------------------------------------------------------------------


@pytest.mark.parametrize("model", [Model.P, Model.U])
def test_assigned_uids_leave_the_non_root_pods_ids_to_the_cluster(model: Model) -> None:
    docs = objects(model, assigned_uids=True)
    for doc in (one(docs, "Deployment"), one(docs, "Pod")):
        ctx = pod_spec(doc)["securityContext"]
        assert ctx["runAsNonRoot"] is True and not {"runAsUser", "runAsGroup", "fsGroup"} & set(ctx)
        for container in pod_spec(doc)["containers"] + pod_spec(doc).get("initContainers", []):
            assert "runAsUser" not in container["securityContext"]
    assert restricted_violations(one(docs, "Deployment")) == []
    validate(docs)


@needs_schemas
def test_the_schema_check_sees_the_new_fields() -> None:
    pod = one(objects(Model.R), "Pod")
    pod["spec"]["volumes"][-1]["emptyDir"]["sizeLimt"] = "1Gi"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, SCHEMA_VERSIONS[0], strict=True)


# -- inference routes ----------------------------------------------------------------------------------------------

ROUTES = """\
version: 1
routes:
  local:
    kind: openai
    base_url: https://vllm.models.svc.cluster.local:8443/v1
    credential: LOCAL_KEY
    models: [qwen-coder]
    allowed_ips: [10.96.40.0/24]
  claude:
    kind: anthropic
    base_url: https://api.anthropic.com/v1
    credential: ANTHROPIC_KEY
    models: [claude-sonnet-4-5]
"""
ROUTE_SECRET = "sk-route-local-0d9e8f7a6b5c"
ROUTE_CREDENTIALS = (
    f"LOCAL_KEY: {{secret: {ROUTE_SECRET}, hosts: []}}\nANTHROPIC_KEY: {{secret_env: ANTHROPIC_API_KEY, hosts: []}}\n"
)


def _routed(topology: Topology) -> list[Doc]:
    spec = make_spec(Model.R, topology=topology, has_credentials=True, inference_routes_text=ROUTES)
    claims = claims_for(spec, SandboxNames.of(spec.sandbox, spec.sandbox_uid))
    material = issue_material(claims, spec.policy_digest, credentials=ROUTE_CREDENTIALS.encode(),
                              proxy_pod=topology is Topology.PROXY_POD)  # fmt: skip
    rendered = render(spec, material)
    return [*rendered.objects, *rendered.secrets]


@pytest.mark.parametrize("topology", list(Topology))
def test_inference_routes_go_in_controls_configmap_and_their_credentials_in_its_secret_only(topology: Topology) -> None:
    docs = _routed(topology)
    configmap = one(docs, "ConfigMap")
    assert configmap["data"]["inference-routes.yaml"] == ROUTES and "policy.yaml" in configmap["data"]
    args = daemon_args(control(docs))
    assert str(args.inference_routes) == "/etc/openshell/policy/inference-routes.yaml"
    # the file is read from the ConfigMap's directory mount (hot reload sees a ConfigMap edit)
    mounts = {m["mountPath"]: m["name"] for m in control(docs)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(one(docs, "Deployment"))["volumes"]}
    assert volumes[mounts["/etc/openshell/policy"]]["configMap"]["name"] == configmap["metadata"]["name"]
    # the route's key: in the credentials Secret, nowhere else; the workload sees neither the routes nor the key
    holders = [d["metadata"]["name"] for d in docs if ROUTE_SECRET in str(d) or any(
        ROUTE_SECRET in base64.b64decode(v).decode("utf-8", "replace") for v in d.get("data", {}).values()
        if d["kind"] == "Secret")]  # fmt: skip
    assert holders == [SandboxNames.of("review-bot", UID).credentials_secret]
    workload_pod = one(docs, "Pod")
    assert "inference" not in str(workload_pod) and configmap["metadata"]["name"] not in str(workload_pod)
    # a backend inside the cluster (the route's allowed_ips) is admitted by control's fence on its port only
    npc = one(docs, "NetworkPolicy", "os-npc-")
    assert admits(npc, "10.96.40.7", 8443) and not admits(npc, "10.96.40.7", 443)
    assert not admits(npc, "10.96.41.7", 8443)
    validate(docs)


def test_without_routes_control_gets_no_flag_and_the_configmap_only_the_policy() -> None:
    docs = objects(Model.R)
    assert list(one(docs, "ConfigMap")["data"]) == ["policy.yaml"]
    assert daemon_args(control(docs)).inference_routes is None


@pytest.mark.parametrize(
    ("routes", "credentials", "message"),
    [
        (ROUTES, None, r"the routes inject ANTHROPIC_KEY, LOCAL_KEY: pass --credentials"),
        (ROUTES, "LOCAL_KEY: {secret: x, hosts: []}\n", r"'ANTHROPIC_KEY' is not in the credentials file"),
        (
            ROUTES,
            "LOCAL_KEY: {secret: x, hosts: []}\n"
            "ANTHROPIC_KEY: {access_key_id: AKIAROUTE0000001, secret_access_key: route-secret-0001, hosts: []}\n",
            r"is an access key pair",
        ),
        (ROUTES.replace("https://api", "http://api"), ROUTE_CREDENTIALS, r"routes\.claude\.base_url"),
        (ROUTES + "    secret: sk-in-the-routes\n", ROUTE_CREDENTIALS, r"routes\.claude.*unknown"),
    ],
)
def test_render_refuses_routes_control_would_refuse(tmp_path: Path, routes: str, credentials: str | None,
                                                     message: str) -> None:  # fmt: skip
    from supervisor.cli.main import main

    (tmp_path / "routes.yaml").write_text(routes)
    extra = []
    if credentials is not None:
        (tmp_path / "credentials.yaml").write_text(credentials)
        extra = [f"--credentials={tmp_path / 'credentials.yaml'}"]
    argv = ["k8s", "render", "--namespace=agents-team-a", "--sandbox=review-bot", f"--sandbox-uid={UID}",
            f"--image={IMAGE}", "--control-image=registry.example/openshell/openshell-sandbox:0.1.0",
            "--cluster-cidr=10.244.0.0/16", "--redact-secrets", f"--inference-routes={tmp_path / 'routes.yaml'}",
            *extra, "--", "python3", "/opt/agent.py"]  # fmt: skip
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(argv) == 2
    assert err.getvalue().startswith("k8s render: --inference-routes: "), err.getvalue()
    assert re.search(message, err.getvalue()), err.getvalue()
    assert out.getvalue() == "" and "sk-in-the-routes" not in err.getvalue()


def test_render_with_routes_through_the_command_line(tmp_path: Path) -> None:
    from supervisor.cli.main import main

    (tmp_path / "routes.yaml").write_text(ROUTES)
    (tmp_path / "credentials.yaml").write_text(ROUTE_CREDENTIALS)
    argv = ["k8s", "render", "--namespace=agents-team-a", "--sandbox=review-bot", f"--sandbox-uid={UID}",
            f"--image={IMAGE}", "--control-image=registry.example/openshell/openshell-sandbox:0.1.0",
            "--cluster-cidr=10.244.0.0/16", "--service-cidr=10.96.0.0/12", f"--secrets-dir={tmp_path / 's'}",
            f"--credentials={tmp_path / 'credentials.yaml'}", f"--inference-routes={tmp_path / 'routes.yaml'}",
            "--", "python3", "/opt/agent.py"]  # fmt: skip
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(argv) == 0
    docs = [d for d in yaml.safe_load_all(out.getvalue()) if d]
    assert one(docs, "ConfigMap")["data"]["inference-routes.yaml"] == ROUTES
    assert ROUTE_SECRET not in out.getvalue()
    secrets = [d for d in yaml.safe_load_all((tmp_path / "s" / "secrets.yaml").read_text()) if d]
    holders = [
        d["metadata"]["name"]
        for d in secrets
        if any(ROUTE_SECRET in base64.b64decode(v).decode("utf-8", "replace") for v in d["data"].values())
    ]
    assert holders == [SandboxNames.of("review-bot", UID).credentials_secret]  # fmt: skip
    validate(docs)
