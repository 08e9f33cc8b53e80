"""``k8s render --topology proxy-pod``: the agent's own image as the workload, control serving its proxy.

What is checked here, by rule: the workload meets Pod Security *restricted* and holds nothing of ours but
environment variables and a CA certificate; the proxy token never appears in an object's text (only as a
``secretKeyRef`` and in the Secrets file), and the URL the agent's tools build from the rendered variables
authenticates to control's listener while another token does not; the CA bundle script keeps the image's own
system bundle; the fences admit exactly the proxy port and DNS; every object validates against the Kubernetes
schemas (strict).
"""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from supervisor.k8s.names import SandboxNames
from supervisor.k8s.objects import (
    COPY_DIR,
    PROXY_CA_FILE,
    PROXY_TOKEN_ENV,
    PROXY_TOKEN_KEY,
    TRUST_BUNDLE,
    TRUST_CA,
    TRUST_DIR,
)
from supervisor.k8s.render import claims_for, render, to_yaml
from supervisor.k8s.secrets import SecretMaterial, check_material, issue_material
from supervisor.k8s.spec import Affinity, DnsPeer, Model, RenderError, Topology, parse_dns_peer
from supervisor.protocol.proxy_head import ProxyTarget, parse_head, proxy_token_matches

from .test_k8s_render import (
    SCHEMA_VERSIONS,
    UID,
    Doc,
    daemon_args,
    kubernetes_validate,
    main_container,
    make_spec,
    mount_path,
    needs_schemas,
    one,
    pod_labels,
    pod_spec,
    restricted_violations,
)

PROXY_POD = Topology.PROXY_POD
_MATERIAL: dict[bool, SecretMaterial] = {}


def spec_of(**changes: Any) -> Any:
    return make_spec(Model.R, topology=PROXY_POD, **changes)


def material(credentials: bool = False) -> SecretMaterial:
    if credentials not in _MATERIAL:
        spec = spec_of(has_credentials=credentials)
        claims = claims_for(spec, SandboxNames.of(spec.sandbox, spec.sandbox_uid))
        creds = b"API_KEY:\n  secret: sk-test-1234567890\n  hosts: [api.example.com]\n" if credentials else None
        _MATERIAL[credentials] = issue_material(claims, spec.policy_digest, credentials=creds, proxy_pod=True)
    return _MATERIAL[credentials]


def rendered(**changes: Any) -> tuple[list[Doc], list[Doc]]:
    spec = spec_of(**changes)
    out = render(spec, material(spec.has_credentials))
    return out.objects, out.secrets


def objects(**changes: Any) -> list[Doc]:
    objs, secrets = rendered(**changes)
    return [*objs, *secrets]


def env_of(container: Doc) -> dict[str, Doc]:
    return {e["name"]: e for e in container["env"]}


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of an env value, from earlier variables."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), value)


# -- the set ----------------------------------------------------------------------------------------------------


def test_the_set_has_no_boundary_and_its_secrets_are_the_ones_the_objects_reference() -> None:
    objs, secrets = rendered(has_credentials=True)
    assert [d["kind"] for d in objs] == ["ConfigMap", "NetworkPolicy", "NetworkPolicy", "Service", "Deployment", "Pod"]
    names = SandboxNames.of("review-bot", UID)
    assert sorted(d["metadata"]["name"] for d in secrets) == sorted(
        [names.control_bootstrap_secret, names.interception_ca_secret, names.credentials_secret,
         names.proxy_token_secret, names.proxy_ca_secret]
    )  # fmt: skip
    assert names.boundary_bootstrap_secret not in {d["metadata"]["name"] for d in objs + secrets}
    referenced = set()
    for doc in (one(objs, "Pod"), one(objs, "Deployment")):
        spec = pod_spec(doc)
        referenced |= {v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
        for container in spec["containers"]:
            for e in container.get("env", []):
                if "valueFrom" in e:
                    referenced.add(e["valueFrom"]["secretKeyRef"]["name"])
    assert referenced == {d["metadata"]["name"] for d in secrets}


def test_the_control_bundle_carries_the_same_claims_as_in_the_boundary_topology() -> None:
    spec, boundary = spec_of(), make_spec(Model.R)
    names = SandboxNames.of(spec.sandbox, spec.sandbox_uid)
    assert claims_for(spec, names) == claims_for(boundary, names)
    objs = objects()
    claims = claims_for(spec, names)
    assert claims.control_deployment == one(objs, "Deployment")["metadata"]["name"]
    assert claims.network_policy == one(objs, "NetworkPolicy", "os-np-")["metadata"]["name"]
    assert claims.image == main_container(one(objs, "Pod"))["image"]
    check_material(material(), claims, spec.policy_digest, Path("secrets.yaml"))


# -- the workload -------------------------------------------------------------------------------------------------


def test_the_workload_runs_the_agents_own_image_and_argv_under_restricted() -> None:
    pod = one(objects(proxy_user="4242:4343"), "Pod")
    spec, agent = pod["spec"], main_container(pod)
    assert restricted_violations(pod) == []
    assert agent["image"] == spec_of().image and agent["command"] == ["python3", "/opt/review-bot/main.py"]
    assert "args" not in agent and "ports" not in agent, "nothing of ours runs in it, nothing listens"
    assert spec["securityContext"]["runAsUser"] == 4242 and spec["securityContext"]["runAsGroup"] == 4343
    assert "fsGroup" not in spec["securityContext"]
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert spec["restartPolicy"] == "Never" and "hostUsers" not in spec
    sc = agent["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is False  # unless --read-only-root
    assert agent["workingDir"] == "/sandbox" and "emptyDir" in next(
        v for v in spec["volumes"] if mount_path(agent, v["name"]) == "/sandbox"
    )


def test_read_only_root_gives_the_agent_a_writable_tmp_and_workdir() -> None:
    pod = one(objects(read_only_root=True, proxy_user="1234"), "Pod")
    agent = main_container(pod)
    assert agent["securityContext"]["readOnlyRootFilesystem"] is True
    for path in ("/tmp", "/sandbox"):
        volume = next(v for v in pod["spec"]["volumes"] if mount_path(agent, v["name"]) == path)
        assert "emptyDir" in volume
    assert pod["spec"]["securityContext"]["runAsGroup"] == 1234, "a bare uid is also the gid"
    assert restricted_violations(pod) == []


def test_the_workload_mounts_no_secret_and_its_init_container_sees_only_the_ca_certificate() -> None:
    objs, secrets = rendered()
    pod = one(objs, "Pod")
    agent, (init,) = main_container(pod), pod["spec"]["initContainers"]
    secret_volumes = [v for v in pod["spec"]["volumes"] if "secret" in v]
    for volume in secret_volumes:
        assert mount_path(agent, volume["name"]) is None
    (volume,) = secret_volumes
    assert mount_path(init, volume["name"]) is not None and init["image"] == agent["image"]
    assert restricted_violations(pod) == [] and init["securityContext"]["readOnlyRootFilesystem"] is True
    trust = one(secrets, "Secret", "os-trust-")
    assert volume["secret"]["secretName"] == trust["metadata"]["name"]
    (content,) = (base64.b64decode(v) for v in trust["data"].values())
    assert list(trust["data"]) == [PROXY_CA_FILE]
    assert content.startswith(b"-----BEGIN CERTIFICATE-----") and b"PRIVATE KEY" not in content
    assert content == material().interception_ca["interception-ca.pem"]
    assert mount_path(agent, "trust") == TRUST_DIR and mount_path(init, "trust") == TRUST_DIR
    assert next(m for m in agent["volumeMounts"] if m["name"] == "trust")["readOnly"] is True


def test_the_proxy_token_is_never_in_an_objects_text_only_in_the_secrets() -> None:
    objs, secrets = rendered()
    token = material().proxy_token
    assert token is not None and len(token) >= 32
    assert token.decode() not in to_yaml(objs)
    assert base64.b64encode(token).decode() not in to_yaml(objs)
    (secret,) = [s for s in secrets if s["metadata"]["name"].startswith("os-ptok-")]
    assert base64.b64decode(secret["data"][PROXY_TOKEN_KEY]) == token and secret["immutable"] is True


def test_the_agents_proxy_variables_authenticate_to_control_and_another_token_does_not() -> None:
    """Expand the rendered env as the kubelet does, then build the head curl would send from HTTPS_PROXY's
    userinfo: control's check accepts it; the same URL with another sandbox's token is refused."""
    objs, _ = rendered()
    env = env_of(main_container(one(objs, "Pod")))
    token_ref = env[PROXY_TOKEN_ENV]["valueFrom"]["secretKeyRef"]
    assert token_ref == {"name": SandboxNames.of("review-bot", UID).proxy_token_secret, "key": PROXY_TOKEN_KEY}
    assert next(iter(env)) == PROXY_TOKEN_ENV, "$(VAR) only expands variables defined earlier"
    token = (material().proxy_token or b"").decode()
    values = {PROXY_TOKEN_ENV: token}
    for name, entry in list(env.items())[1:]:
        values[name] = expand(entry["value"], values)
    service = one(objs, "Service")
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        url = urllib.parse.urlsplit(values[name])
        assert (url.scheme, url.hostname, url.port) == ("http", service["metadata"]["name"], 3128)
        assert url.username == "sandbox" and url.password == token
    assert values["NO_PROXY"] == values["no_proxy"] == "127.0.0.1,localhost,::1"

    def head(password: str) -> ProxyTarget:
        basic = base64.b64encode(f"sandbox:{password}".encode()).decode()
        text = f"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\nProxy-Authorization: Basic {basic}\r\n\r\n"
        parsed = parse_head(text.encode())
        assert isinstance(parsed, ProxyTarget)
        return parsed

    url = urllib.parse.urlsplit(values["HTTPS_PROXY"])
    assert proxy_token_matches(head(url.password or ""), token)
    other = spec_of(sandbox_uid="0b7f5a2e-1111-4e1d-9a3c-2f8b1e0d6c5a")
    other_material = issue_material(claims_for(other, SandboxNames.of("review-bot", other.sandbox_uid)),
                                    other.policy_digest, proxy_pod=True)  # fmt: skip
    assert not proxy_token_matches(head((other_material.proxy_token or b"").decode()), token)


def test_tools_that_replace_the_system_store_get_the_combined_bundle_node_and_deno_the_ca_alone() -> None:
    env = env_of(main_container(one(objects(), "Pod")))
    for name in (
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "GIT_SSL_CAINFO",
        "PIP_CERT",
        "npm_config_cafile",
    ):
        assert env[name]["value"] == TRUST_BUNDLE
    for name in ("NODE_EXTRA_CA_CERTS", "DENO_CERT"):
        assert env[name]["value"] == TRUST_CA


def _run_trust_script(root: Path, system: str | None, ca: bytes | None) -> subprocess.CompletedProcess[str]:
    sh = shutil.which("sh")
    if sh is None:
        pytest.skip("no sh")
    (init,) = pod_spec(one(objects(), "Pod"))["initContainers"]
    script = init["args"][0].replace("/etc/", f"{root}/etc/")
    assert f"{root}/etc/ssl/certs/ca-certificates.crt" in script
    (root / "etc/openshell/trust").mkdir(parents=True)
    secret = root / "etc/openshell/secrets/proxy-ca"
    secret.mkdir(parents=True)
    if ca is not None:
        (secret / PROXY_CA_FILE).write_bytes(ca)
    if system is not None:
        target = root / system.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("-----BEGIN CERTIFICATE-----\nSYSTEM\n-----END CERTIFICATE-----")  # no final newline
    return subprocess.run([sh, "-c", script], capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("system", ["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"])
def test_the_ca_script_keeps_the_images_own_system_bundle_and_adds_the_proxy_ca(tmp_path: Path, system: str) -> None:
    ca = material().interception_ca["interception-ca.pem"]
    result = _run_trust_script(tmp_path, system, ca)
    assert result.returncode == 0, result.stderr
    trust = tmp_path / "etc/openshell/trust"
    combined = (trust / "ca-bundle.pem").read_bytes()
    assert combined.startswith(b"-----BEGIN CERTIFICATE-----\nSYSTEM\n-----END CERTIFICATE-----\n")
    assert combined.endswith(ca) and (trust / "proxy-ca.pem").read_bytes() == ca


def test_the_ca_script_without_a_system_bundle_says_so_and_without_the_ca_fails(tmp_path: Path) -> None:
    ca = material().interception_ca["interception-ca.pem"]
    result = _run_trust_script(tmp_path / "a", None, ca)
    assert result.returncode == 0 and "no system CA bundle" in result.stderr
    assert (tmp_path / "a/etc/openshell/trust/ca-bundle.pem").read_bytes() == ca
    assert _run_trust_script(tmp_path / "b", "/etc/ssl/cert.pem", None).returncode != 0
    assert _run_trust_script(tmp_path / "c", "/etc/ssl/cert.pem", b"not a certificate\n").returncode != 0


# -- control --------------------------------------------------------------------------------------------------


def test_control_serves_the_proxy_with_relaxed_identity_and_the_token_from_the_same_secret() -> None:
    objs, _ = rendered(api_listen=True)
    dep = one(objs, "Deployment")
    assert restricted_violations(dep) == []
    main = main_container(dep)
    args = daemon_args(main)
    assert args.mode == "control" and args.topology == "proxy-pod" and args.boundary is None
    assert args.proxy_listen == "*:3128" and args.binary_identity == "relaxed"
    assert args.acknowledge_networkpolicy_enforcement is True and args.api_listen == "*:7444"
    assert str(args.proxy_token_file) == f"{COPY_DIR}/proxy-token/{PROXY_TOKEN_KEY}"
    (init,) = pod_spec(dep)["initContainers"]
    token_volume = next(
        v for v in pod_spec(dep)["volumes"] if v.get("secret", {}).get("secretName", "").startswith("os-ptok-")
    )
    assert mount_path(init, token_volume["name"]) is not None and mount_path(main, token_volume["name"]) is None
    assert "proxy-token" in init["args"][0]
    assert [p["containerPort"] for p in main["ports"]] == [3128, 7444]
    svc = one(objs, "Service")
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["selector"].items() <= pod_labels(dep).items()
    assert svc["spec"]["ports"] == [{"name": "proxy", "port": 3128, "targetPort": 3128, "protocol": "TCP"}]


def test_the_proxy_port_is_one_flag_for_listener_service_fences_and_variables() -> None:
    objs = objects(proxy_port=8080)
    assert daemon_args(main_container(one(objs, "Deployment"))).proxy_listen == "*:8080"
    assert one(objs, "Service")["spec"]["ports"][0]["port"] == 8080
    assert one(objs, "NetworkPolicy", "os-np-")["spec"]["egress"][0]["ports"] == [{"protocol": "TCP", "port": 8080}]
    assert one(objs, "NetworkPolicy", "os-npc-")["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 8080}]
    assert env_of(main_container(one(objs, "Pod")))["HTTPS_PROXY"]["value"].endswith(":8080")


# -- fences ---------------------------------------------------------------------------------------------------


def test_the_workload_fence_admits_nothing_in_and_only_the_proxy_and_dns_out() -> None:
    objs = objects()
    pod, dep = one(objs, "Pod"), one(objs, "Deployment")
    spec = one(objs, "NetworkPolicy", "os-np-")["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"] and spec["ingress"] == []
    assert spec["podSelector"]["matchLabels"].items() <= pod_labels(pod).items()
    proxy, dns = spec["egress"]
    (peer,) = proxy["to"]
    assert set(peer) == {"podSelector"} and peer["podSelector"]["matchLabels"].items() <= pod_labels(dep).items()
    assert not peer["podSelector"]["matchLabels"].items() <= pod_labels(pod).items()
    assert proxy["ports"] == [{"protocol": "TCP", "port": 3128}]
    assert dns["to"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }
    ]
    assert dns["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    assert all("ipBlock" not in p for rule in spec["egress"] for p in rule["to"])


def test_control_admits_the_proxy_port_from_its_workload_only() -> None:
    objs = objects()
    spec = one(objs, "NetworkPolicy", "os-npc-")["spec"]
    (rule,) = spec["ingress"]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}
    assert peer["podSelector"]["matchLabels"].items() <= pod_labels(one(objs, "Pod")).items()
    assert rule["ports"] == [{"protocol": "TCP", "port": 3128}]
    assert spec["egress"][0]["to"][0]["ipBlock"]["cidr"] == "0.0.0.0/0", "the internet, less the cluster"


def test_dns_peers_are_configurable_and_an_empty_list_is_refused_naming_the_flag() -> None:
    peers = (parse_dns_peer("dns-system/app.kubernetes.io/name=coredns,tier=node"), parse_dns_peer("kube-system/a=b"))
    assert peers[0] == DnsPeer("dns-system", (("app.kubernetes.io/name", "coredns"), ("tier", "node")))
    (_, dns) = one(objects(dns_peers=peers), "NetworkPolicy", "os-np-")["spec"]["egress"]
    assert [p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for p in dns["to"]] == [
        "dns-system", "kube-system",
    ]  # fmt: skip
    assert dns["to"][0]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "coredns", "tier": "node"}
    with pytest.raises(RenderError, match=r"^--dns-peer: an empty list"):
        spec_of(dns_peers=())
    for bad in ("", "kube-system", "kube-system/", "Kube/a=b", "kube-system/a", "kube-system/a=b c"):
        with pytest.raises(RenderError, match=r"^--dns-peer: "):
            parse_dns_peer(bad)


# -- scheduling -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("topology", list(Topology))
def test_affinity_puts_the_workload_beside_its_control_and_runtime_class_is_passed(topology: Topology) -> None:
    def pod(**changes: Any) -> Doc:
        spec = make_spec(Model.R, topology=topology, **changes)
        mat = material() if topology is PROXY_POD else None
        return one(render(spec, mat).objects, "Pod")

    plain = pod()
    assert "affinity" not in plain["spec"] and "runtimeClassName" not in plain["spec"]
    control_labels = {"openshell.ai/sandbox-id": UID, "openshell.ai/sandbox-role": "control"}
    required = pod(affinity=Affinity.REQUIRED, runtime_class="gvisor")
    (term,) = required["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term == {"labelSelector": {"matchLabels": control_labels}, "topologyKey": "kubernetes.io/hostname"}
    assert required["spec"]["runtimeClassName"] == "gvisor"
    preferred = pod(affinity="preferred")
    (weighted,) = preferred["spec"]["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert weighted == {"weight": 100, "podAffinityTerm": term}


# -- bad input ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("topology", "changes", "field"),
    [
        (Topology.BOUNDARY, {"proxy_port": 3128}, "--proxy-port"),
        (Topology.BOUNDARY, {"proxy_user": "1000"}, "--proxy-uid"),
        (Topology.BOUNDARY, {"read_only_root": True}, "--read-only-root"),
        (Topology.BOUNDARY, {"dns_peers": ()}, "--dns-peer"),
        (PROXY_POD, {"model": Model.P}, "--privilege-model"),
        (PROXY_POD, {"model": Model.U, "seccomp_localhost": "a.json"}, "--privilege-model"),
        (PROXY_POD, {"agent_user": "0:0"}, "--agent-user"),
        (PROXY_POD, {"proxy_user": "0"}, "--proxy-uid"),
        (PROXY_POD, {"proxy_user": "0:1000"}, "--proxy-uid"),
        (PROXY_POD, {"proxy_user": "root"}, "--proxy-uid"),
        (PROXY_POD, {"proxy_user": "1000:"}, "--proxy-uid"),
        (PROXY_POD, {"proxy_port": 0}, "--proxy-port"),
        (PROXY_POD, {"proxy_port": 7444, "api_listen": True}, "--proxy-port"),
        (PROXY_POD, {"dns_peers": ()}, "--dns-peer"),
        (PROXY_POD, {"runtime_class": "Bad Class"}, "--runtime-class"),
    ],
)
def test_bad_input_is_refused_naming_the_flag(topology: Topology, changes: dict[str, Any], field: str) -> None:
    changes = {"model": Model.R, **changes}
    model = changes.pop("model")
    with pytest.raises(RenderError) as info:
        make_spec(model, topology=topology, **changes)
    assert info.value.field == field and str(info.value).startswith(f"{field}: ")


def test_material_of_the_other_topology_is_refused() -> None:
    boundary = make_spec(Model.R)
    claims = claims_for(boundary, SandboxNames.of(boundary.sandbox, boundary.sandbox_uid))
    with pytest.raises(RenderError, match=r"^--topology: "):
        render(boundary, material())
    with pytest.raises(RenderError, match=r"^--topology: "):
        render(spec_of(), issue_material(claims, boundary.policy_digest))


# -- schemas --------------------------------------------------------------------------------------------------


@needs_schemas
@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_every_proxy_pod_object_validates_against_the_kubernetes_schemas(version: str) -> None:
    from supervisor.k8s.spec import Owner

    owner = Owner("agents.example/v1alpha1", "Sandbox", "review-bot", UID)
    docs = objects(owner=owner, has_credentials=True, api_listen=True, operator_namespace="ops",
                   read_only_root=True, affinity=Affinity.REQUIRED, runtime_class="gvisor")  # fmt: skip
    docs += render(spec_of(affinity=Affinity.PREFERRED), None).secrets  # the redacted form too
    docs.append(one(objects(affinity=Affinity.PREFERRED), "Pod"))
    assert {d["kind"] for d in docs} == {"ConfigMap", "NetworkPolicy", "Service", "Deployment", "Pod", "Secret"}
    for doc in docs:
        reread = yaml.safe_load(to_yaml([doc]))
        assert reread == doc
        kubernetes_validate.validate(reread, version, strict=True)


def test_redacted_proxy_pod_secrets_hold_no_token_or_key() -> None:
    secrets = render(spec_of(), None).secrets
    names = {d["metadata"]["name"] for d in secrets}
    assert SandboxNames.of("review-bot", UID).boundary_bootstrap_secret not in names
    text = to_yaml(secrets)
    assert "BEGIN" not in text and "\ndata:" not in text
    token = one(secrets, "Secret", "os-ptok-")
    assert token["stringData"][PROXY_TOKEN_KEY].startswith("<redacted: ")
