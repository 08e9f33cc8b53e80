"""The Kubernetes manifests in docs/manifests and the commands in the operator docs match the real program.

Every YAML file parses; every daemon command line in a manifest parses with ``supervisor.cli.daemon_parser()``
(so a renamed or removed flag fails here); the objects agree with each other (selectors, names, ports, mounts,
the proxy-env acknowledgement on both sides); the key handling is one ``load_bundle`` accepts; the model P
workload and control are admissible under the Pod Security "restricted" profile; and every ``openshell-sandbox``
command shown in docs/quickstart.md and docs/kubernetes.md parses with the CLI's own parsers.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from supervisor.cli import command_parser, daemon_parser
from supervisor.control.policy import load_policy_text
from supervisor.protocol.certs import BUNDLE_FILES
from supervisor.protocol.claims import Claims

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "docs" / "manifests"
DOCS_WITH_COMMANDS = (ROOT / "docs" / "quickstart.md", ROOT / "docs" / "kubernetes.md")

BOUNDARY_PORT = 7443
MODEL_R_CAPS = {
    "SETUID", "SETGID", "SETPCAP", "KILL", "SYS_PTRACE", "DAC_READ_SEARCH", "NET_BIND_SERVICE", "NET_ADMIN",
    "SYS_ADMIN",
}  # fmt: skip
RESTRICTED_VOLUME_TYPES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
}  # fmt: skip

Doc = dict[str, Any]


# -- loading ------------------------------------------------------------------------------------------------------


def _load_all() -> dict[str, list[Doc]]:
    return {
        p.name: [d for d in yaml.safe_load_all(p.read_text()) if d is not None]
        for p in sorted(MANIFESTS.glob("*.yaml"))
    }


DOCS = _load_all()


def _one(file: str, kind: str, name_suffix: str = "") -> Doc:
    found = [d for d in DOCS[file] if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"{file}: expected one {kind} *{name_suffix}, found {len(found)}"
    return found[0]


def _pod_spec(doc: Doc) -> Doc:
    spec: Doc = doc["spec"]["template"]["spec"] if doc["kind"] == "Deployment" else doc["spec"]
    return spec


def _pod_labels(doc: Doc) -> dict[str, str]:
    meta = doc["spec"]["template"]["metadata"] if doc["kind"] == "Deployment" else doc["metadata"]
    labels: dict[str, str] = meta["labels"]
    return labels


def _main(doc: Doc) -> Doc:
    containers = _pod_spec(doc)["containers"]
    assert len(containers) == 1
    container: Doc = containers[0]
    return container


def _daemon_args(container: Doc) -> argparse.Namespace:
    """Parse a container's args exactly as the entrypoint would; argparse errors become test failures."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            return daemon_parser().parse_args(container["args"])
        except SystemExit:
            pytest.fail(f"{container['name']}: daemon_parser rejects {container['args']}: {err.getvalue()}")


def _secret_volume(spec: Doc) -> Doc:
    vols = [v for v in spec["volumes"] if "secret" in v]
    assert len(vols) == 1
    vol: Doc = vols[0]
    return vol


def _mount_path(container: Doc, volume: str) -> str | None:
    for mount in container.get("volumeMounts", []):
        if mount["name"] == volume:
            path: str = mount["mountPath"]
            return path
    return None


WORKLOADS = {
    "R": "workload-pod-model-r.yaml",
    "U": "workload-pod-model-u.yaml",
    "P": "workload-pod-model-p.yaml",
}
CONTROLS = {"netns": "control-deployment.yaml", "proxy-env": "control-deployment-proxy-env.yaml"}


# -- every file ---------------------------------------------------------------------------------------------------


def test_every_manifest_file_parses_and_names_its_objects() -> None:
    assert len(DOCS) >= 8, sorted(DOCS)
    for name, docs in DOCS.items():
        assert docs, f"{name} holds no object"
        for doc in docs:
            assert {"apiVersion", "kind", "metadata"} <= doc.keys(), name
            assert doc["metadata"].get("name") and doc["metadata"].get("namespace") == "agents-team-a", name


def test_every_daemon_command_line_parses_with_the_real_flags() -> None:
    seen = 0
    for docs in DOCS.values():
        for doc in docs:
            if doc["kind"] not in ("Pod", "Deployment"):
                continue
            for container in _pod_spec(doc)["containers"]:
                args = _daemon_args(container)
                assert args.mode in ("boundary", "control")
                assert str(args.bootstrap) == "/var/run/openshell/bootstrap"
                seen += 1
    assert seen == len(WORKLOADS) + len(CONTROLS)


def test_a_misspelled_flag_would_be_caught() -> None:
    container = {"name": "x", "args": ["--mode=control", "--bootstrap=/b", "--bondary=h:7443"]}
    with pytest.raises(pytest.fail.Exception):
        _daemon_args(container)


# -- the workload pod ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", sorted(WORKLOADS))
def test_workload_pod_runs_the_boundary_as_pid_1_with_the_agent_after_the_separator(model: str) -> None:
    pod = _one(WORKLOADS[model], "Pod")
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert spec["shareProcessNamespace"] is False
    assert _pod_labels(pod)["openshell.ai/sandbox-role"] == "workload"
    args = _daemon_args(_main(pod))
    assert args.mode == "boundary" and args.agent_argv, "the agent's argv follows --"
    assert args.privilege_model == ("auto" if model == "R" else model)
    assert args.acknowledge_external_fence is (model == "P")
    ports = _main(pod)["ports"]
    assert [p["containerPort"] for p in ports] == [BOUNDARY_PORT]
    assert args.listen.endswith(f":{BOUNDARY_PORT}")


def test_model_r_boundary_is_root_with_exactly_the_capabilities_it_needs() -> None:
    pod = _one(WORKLOADS["R"], "Pod")
    sc = _main(pod)["securityContext"]
    assert sc["runAsUser"] == 0 and sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert set(sc["capabilities"]["add"]) == MODEL_R_CAPS
    # The API refuses allowPrivilegeEscalation=false with the spelling CAP_SYS_ADMIN.
    assert not any(cap.startswith("CAP_") for cap in sc["capabilities"]["add"])


def test_model_r_mounts_the_secret_directly_root_owned_and_owner_readable_only() -> None:
    pod = _one(WORKLOADS["R"], "Pod")
    spec = pod["spec"]
    assert "fsGroup" not in spec.get("securityContext", {}), "fsGroup makes the key 0440, which load_bundle refuses"
    vol = _secret_volume(spec)
    assert vol["secret"]["defaultMode"] & 0o077 == 0, oct(vol["secret"]["defaultMode"])
    assert _mount_path(_main(pod), vol["name"]) == str(_daemon_args(_main(pod)).bootstrap)
    assert not spec.get("initContainers")


@pytest.mark.parametrize("file", [WORKLOADS["U"], WORKLOADS["P"], *CONTROLS.values()])
def test_non_root_daemons_read_a_copy_of_the_bundle_made_by_an_init_container(file: str) -> None:
    """A non-root daemon cannot own a Secret volume's files, so the key it loads must be a copy it owns (0600)."""
    doc = next(d for d in DOCS[file] if d["kind"] in ("Pod", "Deployment"))
    spec = _pod_spec(doc)
    main = _main(doc)
    secret = _secret_volume(spec)
    assert _mount_path(main, secret["name"]) is None, "the Secret itself must not reach the daemon's container"
    (init,) = spec["initContainers"]
    source = _mount_path(init, secret["name"])
    assert source is not None
    script = " ".join(init["args"])
    bootstrap = str(_daemon_args(main).bootstrap)
    assert "umask 077" in script and f"mkdir -p {bootstrap}" in script
    for name in BUNDLE_FILES:
        assert name in script, f"{name} is not copied"
    assert f'"{source}/$f"' in script and f'"{bootstrap}/$f"' in script
    # The copy lives on a memory-backed emptyDir mounted in both containers at a parent of --bootstrap.
    run_vol = next(v for v in spec["volumes"] if v["name"] != secret["name"] and _mount_path(init, v["name"]))
    assert run_vol["emptyDir"]["medium"] == "Memory"
    parent = _mount_path(main, run_vol["name"])
    assert parent is not None and bootstrap.startswith(parent + "/")
    assert _mount_path(init, run_vol["name"]) == parent
    # The Secret is readable by the pod's group only for the copy; never by others.
    assert secret["secret"]["defaultMode"] & 0o007 == 0
    assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsUser"]


def _restricted_violations(doc: Doc) -> list[str]:
    """The Pod Security "restricted" rules that a manifest can break (v1.30+ profile)."""
    spec = _pod_spec(doc)
    pod_sc = spec.get("securityContext", {})
    problems = []
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            problems.append(field)
    for vol in spec.get("volumes", []):
        kind = next(k for k in vol if k != "name")
        if kind not in RESTRICTED_VOLUME_TYPES:
            problems.append(f"volume {vol['name']}: {kind}")
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        sc = container.get("securityContext", {})
        name = container["name"]
        if sc.get("privileged"):
            problems.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation must be false")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            problems.append(f"{name}: must drop ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: adds {caps['add']}")
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
            problems.append(f"{name}: runAsNonRoot")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            problems.append(f"{name}: runAsUser 0")
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile {seccomp}")
        if sc.get("procMount", "Default") != "Default":
            problems.append(f"{name}: procMount")
        if sc.get("appArmorProfile", {}).get("type") == "Unconfined":
            problems.append(f"{name}: AppArmor Unconfined")
    return problems


@pytest.mark.parametrize("file", [WORKLOADS["P"], *CONTROLS.values()])
def test_model_p_workload_and_control_are_admissible_under_pod_security_restricted(file: str) -> None:
    doc = next(d for d in DOCS[file] if d["kind"] in ("Pod", "Deployment"))
    assert _restricted_violations(doc) == []


def test_the_restricted_check_rejects_model_r() -> None:
    problems = _restricted_violations(_one(WORKLOADS["R"], "Pod"))
    assert any("adds" in p for p in problems) and any("runAsUser 0" in p for p in problems)


def test_model_u_asks_for_what_a_user_namespace_inside_a_pod_needs() -> None:
    pod = _one(WORKLOADS["U"], "Pod")
    assert pod["spec"]["hostUsers"] is False
    sc = _main(pod)["securityContext"]
    assert sc["procMount"] == "Unmasked" and sc["capabilities"] == {"drop": ["ALL"]}


# -- control ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("capture", sorted(CONTROLS))
def test_control_is_non_root_read_only_and_dials_the_boundary_service(capture: str) -> None:
    dep = _one(CONTROLS[capture], "Deployment")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    spec = _pod_spec(dep)
    main = _main(dep)
    sc = main["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"] == {"drop": ["ALL"]}
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
    assert dep["spec"]["selector"]["matchLabels"].items() <= _pod_labels(dep).items()
    args = _daemon_args(main)
    service = _one("boundary-service.yaml", "Service")
    assert args.boundary == f"{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    assert args.capture_mode == capture
    assert args.acknowledge_external_fence is (capture == "proxy-env")
    # The API socket directory is a writable emptyDir on the read-only root.
    api = next(v for v in spec["volumes"] if _mount_path(main, v["name"]) == "/run/openshell-sandbox")
    assert "emptyDir" in api
    assert main["readinessProbe"]["exec"]["command"] == ["openshell-sandbox", "readyz"]
    for probe in ("readinessProbe", "livenessProbe"):
        command = main[probe]["exec"]["command"]
        assert command[0] == "openshell-sandbox"
        with contextlib.redirect_stderr(io.StringIO()):
            command_parser().parse_args(command[1:])


def test_control_reads_the_policy_from_the_configmap_and_that_policy_is_valid() -> None:
    dep = _one(CONTROLS["netns"], "Deployment")
    spec = _pod_spec(dep)
    policy_path = _daemon_args(_main(dep)).policy
    vol = next(v for v in spec["volumes"] if "configMap" in v)
    mount = _mount_path(_main(dep), vol["name"])
    assert mount is not None and policy_path.parent == Path(mount)
    assert not any("subPath" in m for m in _main(dep)["volumeMounts"]), "subPath mounts never see updates"
    cm = _one("policy-configmap.yaml", "ConfigMap")
    assert vol["configMap"]["name"] == cm["metadata"]["name"]
    policy = load_policy_text(cm["data"][policy_path.name], "policy-configmap.yaml")
    assert policy.network_policies, "the example policy should allow something"


def test_proxy_env_is_acknowledged_on_both_sides_or_neither() -> None:
    p_args = _daemon_args(_main(_one(WORKLOADS["P"], "Pod")))
    c_args = _daemon_args(_main(_one(CONTROLS["proxy-env"], "Deployment")))
    assert p_args.privilege_model == "P" and p_args.acknowledge_external_fence
    assert c_args.capture_mode == "proxy-env" and c_args.acknowledge_external_fence
    for model in ("R", "U"):
        assert not _daemon_args(_main(_one(WORKLOADS[model], "Pod"))).acknowledge_external_fence
    assert not _daemon_args(_main(_one(CONTROLS["netns"], "Deployment"))).acknowledge_external_fence


# -- service, network policies, secrets, claims -------------------------------------------------------------------


def test_boundary_service_is_headless_publishes_not_ready_and_selects_only_the_workload() -> None:
    svc = _one("boundary-service.yaml", "Service")
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert [(p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [(BOUNDARY_PORT, BOUNDARY_PORT)]
    selector = svc["spec"]["selector"].items()
    for file in WORKLOADS.values():
        assert selector <= _pod_labels(_one(file, "Pod")).items()
    for file in CONTROLS.values():
        assert not selector <= _pod_labels(_one(file, "Deployment")).items()


def test_workload_network_policy_admits_only_its_control_on_7443_and_no_egress() -> None:
    np = next(d for d in DOCS["networkpolicies.yaml"] if d["metadata"]["name"].startswith("os-np-"))
    spec = np["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"] and spec["egress"] == []
    assert spec["podSelector"]["matchLabels"].items() <= _pod_labels(_one(WORKLOADS["R"], "Pod")).items()
    (rule,) = spec["ingress"]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}, "no namespaceSelector or ipBlock: only this sandbox's control"
    for file in CONTROLS.values():
        assert peer["podSelector"]["matchLabels"].items() <= _pod_labels(_one(file, "Deployment")).items()
    assert rule["ports"] == [{"protocol": "TCP", "port": BOUNDARY_PORT}]


def test_control_network_policy_allows_all_egress_and_no_ingress() -> None:
    np = next(d for d in DOCS["networkpolicies.yaml"] if d["metadata"]["name"].startswith("os-npc-"))
    spec = np["spec"]
    assert spec["egress"] == [{}] and spec["ingress"] == []
    assert spec["podSelector"]["matchLabels"].items() <= _pod_labels(_one(CONTROLS["netns"], "Deployment")).items()


def test_bootstrap_secrets_are_immutable_one_per_role_and_referenced_by_the_right_pods() -> None:
    secrets = {d["metadata"]["name"]: d for d in DOCS["bootstrap-secrets.yaml"]}
    assert all(s["kind"] == "Secret" and s["immutable"] is True for s in secrets.values())
    for secret in secrets.values():
        assert sorted(secret["stringData"]) == sorted(BUNDLE_FILES)
    boundary = next(n for n in secrets if n.endswith("-boundary"))
    control = next(n for n in secrets if n.endswith("-control"))
    for file in WORKLOADS.values():
        assert _secret_volume(_one(file, "Pod")["spec"])["secret"]["secretName"] == boundary
    for file in CONTROLS.values():
        assert _secret_volume(_pod_spec(_one(file, "Deployment")))["secret"]["secretName"] == control


def test_the_object_names_make_a_valid_claim_set() -> None:
    """The names the manifests use are the ones `certs issue` would be given, and they are valid claims."""
    pod = _one(WORKLOADS["R"], "Pod")
    labels = _pod_labels(pod)
    workload_np = next(d for d in DOCS["networkpolicies.yaml"] if d["metadata"]["name"].startswith("os-np-"))
    claims = Claims(
        namespace=pod["metadata"]["namespace"],
        sandbox=labels["openshell.ai/sandbox-name"],
        sandbox_uid=labels["openshell.ai/sandbox-id"],
        control_deployment=_one(CONTROLS["netns"], "Deployment")["metadata"]["name"],
        network_policy=workload_np["metadata"]["name"],
        image=_main(pod)["image"],
        generation=1,
        policy_resource="ConfigMap/{}@3f6b1c2e-9d4a-4c8e-b7f5-0a1e2d3c4b5a".format(
            _one("policy-configmap.yaml", "ConfigMap")["metadata"]["name"]
        ),
    )
    assert claims.control_deployment.startswith(f"os-ctl-{claims.sandbox}-")
    assert claims.network_policy == f"os-np-{claims.sandbox}-" + claims.control_deployment.rsplit("-", 1)[1]
    for file in WORKLOADS.values():
        assert _main(_one(file, "Pod"))["image"] == claims.image, "the image claim names the workload image"


# -- commands shown in the docs -----------------------------------------------------------------------------------


_OPERATOR = re.compile(r"^[|;&<>()]+$")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def _shell_words(text: str) -> list[str]:
    """The words of the first simple command in a shell line: stops at ``|``, ``;``, ``&&``, ``>``, ``#``…"""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words: list[str] = []
    for word in lexer:
        if _OPERATOR.match(word):
            if word[0] in "<>" and words and words[-1].isdigit():
                words.pop()  # the fd of 2>FILE
            break
        words.append(word)
    return words


def _doc_commands(path: Path) -> list[list[str]]:
    """``openshell-sandbox …`` commands in a Markdown file's code blocks, also after ``$``, ``VAR=…`` and
    ``kubectl … exec … --``; backslash continuations are joined."""
    commands = []
    in_block = False
    pending = ""
    for line in path.read_text().splitlines():
        if line.strip().startswith("```"):
            in_block = not in_block
            pending = ""
            continue
        if not in_block:
            continue
        text = pending + line.strip()
        if text.endswith("\\"):
            pending = text[:-1] + " "
            continue
        pending = ""
        words = _shell_words(text.removeprefix("$ "))
        while words and _ASSIGNMENT.match(words[0]):
            words.pop(0)
        if words[:1] == ["kubectl"] and "exec" in words and "--" in words:
            words = words[words.index("--") + 1 :]
        if words[:1] == ["openshell-sandbox"]:
            commands.append(words[1:])
    return commands


def test_doc_command_extraction_stops_at_shell_operators_outside_quotes() -> None:
    words = _shell_words("openshell-sandbox exec -- sh -c 'id; echo x >&2 | cat' >out 2>err")
    assert words == ["openshell-sandbox", "exec", "--", "sh", "-c", "id; echo x >&2 | cat"]


@pytest.mark.parametrize("path", DOCS_WITH_COMMANDS, ids=lambda p: p.name)
def test_every_command_in_the_docs_parses_with_the_cli(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{path.name} not written yet")
    commands = _doc_commands(path)
    assert commands, f"{path.name} shows no openshell-sandbox command"
    for argv in commands:
        head = argv[: argv.index("--")] if "--" in argv else argv
        parser = daemon_parser() if any(a.startswith("--mode") for a in head) else command_parser()
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                parser.parse_args(argv)
            except SystemExit as exc:
                if exc.code != 0:
                    pytest.fail(f"{path.name}: `openshell-sandbox {shlex.join(argv)}` does not parse: {err.getvalue()}")
