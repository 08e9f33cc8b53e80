"""The non-secret objects of one sandbox, as plain dicts (pure functions of a ``RenderSpec``).

Size (over ~500 lines on purpose): one pure function per object of a sandbox's companion set, rendered together from
one RenderSpec.

What each object is for, and why its fields are what they are, is docs/kubernetes.md; the rules that matter
for containment are repeated here next to the code:

- The workload pod has no egress at all (its NetworkPolicy lists Egress with no rule) and admits only its own
  control on the boundary port; control dials, the boundary only listens (docs/design.md "Trust and direction").
- No pod gets a service-account token, service links or a shared PID namespace; the boundary is PID 1.
- A non-root daemon cannot own a Secret volume's files (root-owned, or group-readable with ``fsGroup``, which
  ``load_bundle`` refuses), so an init container copies the Secrets into a memory-backed emptyDir under
  ``umask 077``; the daemon's container never mounts a Secret. Model R's root boundary mounts its Secret directly
  (0400, no ``fsGroup``).
- The boundary gets a writable emptyDir for its state at ``/run/openshell-boundary``, where its trust files go
  (docs/design.md "Settled details": trust files); model P names it with ``--tls-dir``.
- Control's interception CA and credentials come from Secrets, so a restarted control keeps the CA the agent
  already trusts.

The proxy-pod topology (docs/kubernetes.md "Choosing a topology"; docs/design.md "The proxy-pod topology"):

- The workload pod runs the agent's own image and argv directly, Pod Security *restricted*: non-root
  (``--proxy-uid``), no capabilities, no privilege escalation, RuntimeDefault seccomp, no token.
- Its only path out is control's proxy: the NetworkPolicy allows egress to control's proxy port and to the
  cluster DNS peers (the Service name must resolve) and nothing else, and admits no ingress.
- The proxy token reaches the agent's proxy variables only through ``secretKeyRef`` and ``$(VAR)`` expansion, so
  it is never in the Pod spec; control reads the same Secret as ``--proxy-token-file``.
- The init container runs the agent's image (its own system bundle) with the interception CA's certificate
  only (never its key, which stays in control's Secret) and writes the combined bundle to an emptyDir.
"""

from __future__ import annotations

from collections.abc import Sequence

from supervisor.protocol.json_value import JsonValue
from supervisor.protocol.process_ops import CA_ADDING_KEYS, CA_REPLACING_KEYS
from supervisor.protocol.proxy_head import proxy_environment, proxy_url

from .names import LABEL_NAME, LABEL_ROLE, LABEL_SANDBOX_ID, SandboxNames
from .quantity import CONTAINER_STORAGE_HEADROOM, Resources, format_bytes
from .spec import DEFAULT_ENTRYPOINT, DEFAULT_PROXY_PORT, Affinity, Model, RenderSpec, Topology

__all__ = [
    "BOOTSTRAP_DIR",
    "COPY_DIR",
    "CREDENTIALS_FILE",
    "INTERCEPTION_CA_DIR",
    "MODEL_R_CAPABILITIES",
    "POLICY_DIR",
    "POLICY_FILE",
    "PROXY_CA_FILE",
    "PROXY_TOKEN_ENV",
    "PROXY_TOKEN_KEY",
    "ROLE_CONTROL",
    "ROLE_WORKLOAD",
    "ROUTES_FILE",
    "SECRETS_MOUNT",
    "STATE_DIR",
    "STATE_FILE",
    "TLS_DIR",
    "TRUST_BUNDLE",
    "TRUST_CA",
    "TRUST_DIR",
    "FileMode",
    "boundary_service",
    "control_deployment",
    "labels",
    "metadata",
    "policy_configmap",
    "proxy_service",
    "workload_pod",
]

Doc = dict[str, JsonValue]

ROLE_WORKLOAD, ROLE_CONTROL = "workload", "control"
COPY_DIR = "/var/run/openshell"  # memory-backed emptyDir holding the daemons' private copies of their Secrets
BOOTSTRAP_DIR = f"{COPY_DIR}/bootstrap"
INTERCEPTION_CA_DIR = f"{COPY_DIR}/interception-ca"
CREDENTIALS_DIR = f"{COPY_DIR}/credentials"
CREDENTIALS_FILE = "credentials.yaml"
SECRETS_MOUNT = "/etc/openshell/secrets"  # where the init container (only) sees the Secret volumes
POLICY_DIR = "/etc/openshell/policy"
POLICY_FILE = "policy.yaml"
ROUTES_FILE = "inference-routes.yaml"  # beside the policy in control's ConfigMap: hot-reloaded the same way
STATE_DIR = "/run/openshell-boundary"
TLS_DIR = f"{STATE_DIR}/tls"
STATE_FILE = f"{STATE_DIR}/state"  # the boundary's lifecycle state, for the workload's readiness probe
API_DIR = "/run/openshell-sandbox"
NON_ROOT_UID = 10001
PROXY_TOKEN_KEY = "token"  # the proxy token Secret's key (no newline: it goes into a URL)
PROXY_TOKEN_ENV = "OPENSHELL_PROXY_TOKEN"
PROXY_TOKEN_DIR = f"{COPY_DIR}/proxy-token"
PROXY_CA_FILE = "ca.pem"  # the CA certificate Secret's key: the interception CA's certificate, no key
TRUST_DIR = "/etc/openshell/trust"  # the workload's emptyDir holding the bundles the init container built
TRUST_BUNDLE = f"{TRUST_DIR}/ca-bundle.pem"  # the image's system bundle plus the interception CA
TRUST_CA = f"{TRUST_DIR}/proxy-ca.pem"  # the interception CA alone
# Where images keep their system bundle: Debian/Ubuntu/Alpine, Fedora/RHEL, openSUSE, Alpine/macOS-style.
SYSTEM_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
)  # fmt: skip
# Replace the system store (so they get the combined bundle); the others add to it (the CA alone). The boundary
# topology's lists, so a tool trusts the sandbox the same way in both.
CA_REPLACING = CA_REPLACING_KEYS
CA_ADDING = CA_ADDING_KEYS

# Each needed by the root boundary of model R (docs/kubernetes.md "Model R" says what fails without which).
MODEL_R_CAPABILITIES = (
    "SETUID", "SETGID", "SETPCAP", "KILL", "SYS_PTRACE", "DAC_READ_SEARCH", "NET_BIND_SERVICE", "NET_ADMIN",
    "SYS_ADMIN",
)  # fmt: skip

_RUNTIME_DEFAULT = {"type": "RuntimeDefault"}
ANNOTATION_NETWORKPOLICY = "openshell.ai/networkpolicy-enforced"
CANARY_ADDRESS_ENV = "OPENSHELL_POD_IP"


class FileMode(int):
    """A file mode: an ``int`` everywhere, written in octal (``0440``) in YAML."""


def labels(spec: RenderSpec, role: str) -> Doc:
    """Ours (every selector uses the id and the role) and the recommended ``app.kubernetes.io`` ones, which
    selectors never use: tools group and show by them."""
    return {
        LABEL_SANDBOX_ID: spec.sandbox_uid,
        LABEL_NAME: spec.sandbox,
        LABEL_ROLE: role,
        "app.kubernetes.io/name": "openshell-sandbox",
        "app.kubernetes.io/instance": spec.sandbox,
        "app.kubernetes.io/component": role,
        "app.kubernetes.io/part-of": "openshell-sandbox",
        "app.kubernetes.io/managed-by": "openshell-sandbox-render",
    }


def selector(spec: RenderSpec, role: str) -> Doc:
    return {LABEL_SANDBOX_ID: spec.sandbox_uid, LABEL_ROLE: role}


def metadata(spec: RenderSpec, name: str, role: str, annotations: dict[str, str] | None = None) -> Doc:
    meta: Doc = {"name": name, "namespace": spec.namespace, "labels": labels(spec, role)}
    notes: Doc = dict(annotations or {})
    if spec.networkpolicy_enforced:
        # The operator's statement, on every object it vouches for: the fence holds only if the CNI enforces it.
        notes[ANNOTATION_NETWORKPOLICY] = "stated by the operator at render"
    if notes:
        meta["annotations"] = notes
    if spec.owner is not None:
        meta["ownerReferences"] = [spec.owner.reference(spec.block_owner_deletion)]
    return meta


def _copy_script(dirs: tuple[str, ...]) -> str:
    """Copy each Secret volume ``SECRETS_MOUNT/<d>/*`` to ``COPY_DIR/<d>/``, owner-only. The glob skips
    kubelet's ``..data`` entries; an empty Secret leaves the literal pattern, and ``cat`` fails the pod."""
    return (
        "set -eu; umask 077\n"
        f"for d in {' '.join(dirs)}; do\n"
        f'  mkdir -p "{COPY_DIR}/$d"\n'
        f'  for f in "{SECRETS_MOUNT}/$d"/*; do cat "$f" > "{COPY_DIR}/$d/${{f##*/}}"; done\n'
        "done\n"
    )


def _restricted_container_context(*, read_only_root: bool) -> Doc:
    return {
        "runAsNonRoot": True,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": read_only_root,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": dict(_RUNTIME_DEFAULT),
    }


def _non_root_pod_context(spec: RenderSpec) -> Doc:
    """With ``--assigned-uids`` the cluster picks the uid, gid and fsGroup (OpenShift restricted-v2 refuses a fixed
    id outside the namespace's range, and defaults all three from it)."""
    if spec.assigned_uids:
        return {"runAsNonRoot": True, "seccompProfile": dict(_RUNTIME_DEFAULT)}
    return {
        "runAsNonRoot": True,
        "runAsUser": NON_ROOT_UID,
        "runAsGroup": NON_ROOT_UID,
        # Only so that the init container (this uid) can read the Secret volumes: files 0440 root:10001.
        "fsGroup": NON_ROOT_UID,
        "seccompProfile": dict(_RUNTIME_DEFAULT),
    }


def _resources(res: Resources, storage: int | None = None) -> Doc:
    limits: Doc = {"memory": res.limit_memory}
    if storage is not None:
        limits["ephemeral-storage"] = format_bytes(storage)
    return {"requests": {"cpu": res.cpu, "memory": res.memory}, "limits": limits}


def _workspace(spec: RenderSpec) -> Doc:
    return {"name": "workspace", "emptyDir": {"sizeLimit": format_bytes(spec.workspace_size)}}


def _copy_init_container(image: str, secrets: list[tuple[str, str]]) -> Doc:
    """``secrets``: (volume name, directory name under SECRETS_MOUNT and COPY_DIR)."""
    mounts: list[JsonValue] = [
        {"name": vol, "mountPath": f"{SECRETS_MOUNT}/{d}", "readOnly": True} for vol, d in secrets
    ]
    mounts.append({"name": "openshell-run", "mountPath": COPY_DIR})
    return {
        "name": "secrets-copy",
        "image": image,
        "command": ["/bin/sh", "-c"],
        "args": [_copy_script(tuple(d for _, d in secrets))],
        "securityContext": _restricted_container_context(read_only_root=True),
        "volumeMounts": mounts,
    }


def _memory_dir(name: str, size: str) -> Doc:
    return {"name": name, "emptyDir": {"medium": "Memory", "sizeLimit": size}}


def _secret_volume(name: str, secret: str, mode: int) -> Doc:
    return {"name": name, "secret": {"secretName": secret, "defaultMode": FileMode(mode)}}


def boundary_args(spec: RenderSpec) -> list[str]:
    args = [
        "--mode=boundary",
        f"--bootstrap={BOOTSTRAP_DIR}",
        f"--listen=[::]:{spec.boundary_port}",
        f"--privilege-model={spec.model}",
        # The workload's memory cgroup; the container's limit is this plus the boundary's headroom, so the
        # container's OOM killer meets the workload's limit first.
        f"--memory-limit={spec.workload_memory_limit}",
        f"--state-file={STATE_FILE}",
    ]
    if spec.model is Model.P:
        # No mount namespace in P: the trust files live where the agent reads them, on a writable emptyDir.
        # The fence is the operator's statement; control's canary observes it unless --unprobed-fence.
        args += ["--acknowledge-external-fence", f"--tls-dir={TLS_DIR}"]
        if spec.unprobed_fence:
            args.append("--acknowledge-unprobed-fence")
    args += [f"--workdir={spec.workdir}", "--", *spec.agent_argv]
    return args


def _scheduling(spec: RenderSpec, pod: Doc) -> None:
    """``--runtime-class`` and ``--affinity``: the workload pod on control's node (preferred or required)."""
    if spec.runtime_class is not None:
        pod["runtimeClassName"] = spec.runtime_class
    if spec.affinity is Affinity.DISABLED:
        return
    term: Doc = {
        "labelSelector": {"matchLabels": selector(spec, ROLE_CONTROL)},
        "topologyKey": "kubernetes.io/hostname",
    }
    if spec.affinity is Affinity.REQUIRED:
        pod["affinity"] = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    else:
        weighted: Doc = {"weight": 100, "podAffinityTerm": term}
        pod["affinity"] = {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [weighted]}}


def workload_pod(spec: RenderSpec, names: SandboxNames) -> Doc:
    """The workload Pod: the boundary is the container's entrypoint and PID 1, the agent its child (in the
    proxy-pod topology: the agent's own image, nothing of ours)."""
    if spec.topology is Topology.PROXY_POD:
        return _proxy_workload_pod(spec, names)
    model = spec.model
    container: Doc = {
        "name": "agent",
        "image": spec.image,
        # Explicit: the agent's image, built FROM ours, may set an ENTRYPOINT of its own.
        "command": [spec.entrypoint],
        "args": list(boundary_args(spec)),
        # Readiness from the boundary's own state, read locally (a TCP probe would be a refused peer each period:
        # the boundary speaks only mTLS with its own control). Control's readyz says more, from its own pod.
        "readinessProbe": {
            "exec": {"command": [spec.entrypoint, "boundary-ready", STATE_FILE]},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "ports": [{"name": "boundary", "containerPort": spec.boundary_port, "protocol": "TCP"}],
        "resources": _resources(spec.workload_container_resources, spec.workspace_size + CONTAINER_STORAGE_HEADROOM),
    }
    volumes: list[JsonValue] = []
    mounts: list[JsonValue] = []
    pod: Doc = {
        "restartPolicy": "Never",  # the agent's exit is the sandbox's end
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "shareProcessNamespace": False,  # the boundary must be PID 1: the agent cannot outlive it
        "terminationGracePeriodSeconds": 30,
    }
    if model is Model.R:
        _root_workload(names, pod, container, volumes, mounts)
    else:
        _unprivileged_workload(spec, names, pod, container, volumes, mounts)
    volumes += [_memory_dir("boundary-state", "16Mi"), _workspace(spec)]
    mounts += [
        {"name": "boundary-state", "mountPath": STATE_DIR},
        {"name": "workspace", "mountPath": spec.workdir},
    ]
    container["volumeMounts"] = mounts
    pod["containers"] = [container]
    pod["volumes"] = volumes
    _scheduling(spec, pod)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata(spec, names.workload_pod, ROLE_WORKLOAD),
        "spec": pod,
    }


def _root_workload(
    names: SandboxNames, pod: Doc, container: Doc, volumes: list[JsonValue], mounts: list[JsonValue]
) -> None:
    """Model R: the boundary runs as root with the capabilities it needs, and reads its key straight from the
    Secret."""
    # No fsGroup: it would make the mounted key group-readable (0440), which the boundary refuses.
    pod["securityContext"] = {"seccompProfile": dict(_RUNTIME_DEFAULT)}
    container["securityContext"] = {
        "runAsUser": 0,
        "runAsGroup": 0,
        "runAsNonRoot": False,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": False,
        "capabilities": {"drop": ["ALL"], "add": list(MODEL_R_CAPABILITIES)},
        "seccompProfile": dict(_RUNTIME_DEFAULT),
        # The runtimes' default AppArmor profiles deny mount(2), which the boundary needs for the agent's
        # mount namespace: Unconfined, or a Localhost profile allowing those mounts.
        "appArmorProfile": {"type": "Unconfined"},
    }
    volumes.append(_secret_volume("bootstrap", names.boundary_bootstrap_secret, 0o400))
    mounts.append({"name": "bootstrap", "mountPath": BOOTSTRAP_DIR, "readOnly": True})


def _unprivileged_workload(
    spec: RenderSpec, names: SandboxNames, pod: Doc, container: Doc, volumes: list[JsonValue], mounts: list[JsonValue]
) -> None:
    """Models U and P: non-root under the restricted profile (U in a user namespace of its own); an init
    container copies the key to a directory only the boundary's uid reads."""
    if spec.model is Model.U:
        pod["hostUsers"] = False  # a user namespace for the pod; the boundary nests the agent's inside it
    pod["securityContext"] = _non_root_pod_context(spec)
    context = _restricted_container_context(read_only_root=False)
    if spec.model is Model.U:
        # A fresh /proc for the agent's PID namespace cannot be mounted over a masked one.
        context["procMount"] = "Unmasked"
        if spec.seccomp_localhost is not None:
            context["seccompProfile"] = {"type": "Localhost", "localhostProfile": spec.seccomp_localhost}
    container["securityContext"] = context
    pod["initContainers"] = [_copy_init_container(spec.image, [("bootstrap-secret", "bootstrap")])]
    volumes += [
        _secret_volume("bootstrap-secret", names.boundary_bootstrap_secret, 0o440),
        _memory_dir("openshell-run", "1Mi"),
    ]
    mounts.append({"name": "openshell-run", "mountPath": COPY_DIR})


def _trust_script() -> str:
    """Build ``TRUST_BUNDLE`` (the image's own system bundle, then the interception CA) and ``TRUST_CA``. An image
    without a system bundle gets the CA alone, and says so: it could verify nothing before either."""
    looked = " ".join(SYSTEM_BUNDLES)
    return (
        "set -eu; umask 022; system=\n"
        f"for f in {looked}; do\n"
        '  if [ -s "$f" ]; then system="$f"; break; fi\n'
        "done\n"
        f'cat "{SECRETS_MOUNT}/proxy-ca/{PROXY_CA_FILE}" > "{TRUST_CA}"\n'
        'if [ -n "$system" ]; then\n'
        f'  cat "$system" > "{TRUST_BUNDLE}"; echo >> "{TRUST_BUNDLE}"\n'
        "else\n"
        f'  echo "openshell: no system CA bundle in this image ({looked}): {TRUST_BUNDLE} holds the proxy CA '
        'alone" >&2\n'
        f'  : > "{TRUST_BUNDLE}"\n'
        "fi\n"
        f'cat "{TRUST_CA}" >> "{TRUST_BUNDLE}"\n'
        f'grep -q "BEGIN CERTIFICATE" "{TRUST_CA}"\n'
    )


def proxy_port(spec: RenderSpec) -> int:
    return spec.proxy_port if spec.proxy_port is not None else DEFAULT_PROXY_PORT


def workload_environment(spec: RenderSpec, names: SandboxNames) -> list[JsonValue]:
    """The proxy-pod agent's environment: the token from its Secret first, then the proxy variables that expand
    it (``$(VAR)``), upper and lower case, then the CA variables."""
    url = proxy_url(names.proxy_service, proxy_port(spec), f"$({PROXY_TOKEN_ENV})")
    token: Doc = {"secretKeyRef": {"name": names.proxy_token_secret, "key": PROXY_TOKEN_KEY}}
    env: list[JsonValue] = [{"name": PROXY_TOKEN_ENV, "valueFrom": token}]
    env += [{"name": k, "value": v} for k, v in proxy_environment(url).items()]
    env += [{"name": k, "value": TRUST_BUNDLE} for k in CA_REPLACING]
    env += [{"name": k, "value": TRUST_CA} for k in CA_ADDING]
    return env


def _proxy_workload_pod(spec: RenderSpec, names: SandboxNames) -> Doc:
    uid, gid = spec.proxy_ids
    mounts: list[JsonValue] = [
        {"name": "trust", "mountPath": TRUST_DIR, "readOnly": True},
        {"name": "workspace", "mountPath": spec.workdir},
    ]
    container: Doc = {
        "name": "agent",
        "image": spec.image,
        "command": list(spec.agent_argv),  # the agent's argv exactly: the image's entrypoint is not ours to wrap
        "workingDir": spec.workdir,
        "env": workload_environment(spec, names),
        "securityContext": _restricted_container_context(read_only_root=spec.read_only_root),
        "resources": _resources(spec.workload_container_resources, spec.workspace_size + CONTAINER_STORAGE_HEADROOM),
        "volumeMounts": mounts,
    }
    volumes: list[JsonValue] = [
        # 0444: a certificate, nothing secret; no fsGroup needed to read it
        _secret_volume("proxy-ca-secret", names.proxy_ca_secret, 0o444),
        _memory_dir("trust", "1Mi"),
        _workspace(spec),
    ]
    if spec.read_only_root:
        mounts.append({"name": "tmp", "mountPath": "/tmp"})
        volumes.append({"name": "tmp", "emptyDir": {}})
    init: Doc = {
        "name": "ca-bundle",
        "image": spec.image,  # the agent's own image: its own system bundle
        "command": ["/bin/sh", "-c"],
        "args": [_trust_script()],
        "securityContext": _restricted_container_context(read_only_root=True),
        "volumeMounts": [
            {"name": "proxy-ca-secret", "mountPath": f"{SECRETS_MOUNT}/proxy-ca", "readOnly": True},
            {"name": "trust", "mountPath": TRUST_DIR},
        ],
    }
    pod: Doc = {
        "restartPolicy": "Never",  # the agent's exit is the sandbox's end
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "shareProcessNamespace": False,
        "terminationGracePeriodSeconds": 30,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": uid,
            "runAsGroup": gid,
            "seccompProfile": dict(_RUNTIME_DEFAULT),
        },
        "initContainers": [init],
        "containers": [container],
        "volumes": volumes,
    }
    _scheduling(spec, pod)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata(spec, names.workload_pod, ROLE_WORKLOAD),
        "spec": pod,
    }


def control_args(
    spec: RenderSpec, names: SandboxNames, admitted: Sequence[tuple[str, Sequence[int]]] = ()
) -> list[str]:
    """``admitted``: the explicit allows of control's NetworkPolicy inside its excluded ranges (fences.py)."""
    args = ["--mode=control", f"--bootstrap={BOOTSTRAP_DIR}"]
    if spec.topology is Topology.PROXY_POD:
        args += [
            "--topology=proxy-pod",
            f"--proxy-listen=*:{proxy_port(spec)}",  # every address of the pod, IPv4 and IPv6
            f"--proxy-token-file={PROXY_TOKEN_DIR}/{PROXY_TOKEN_KEY}",
            "--binary-identity=relaxed",
            # the operator's --networkpolicy-enforced (RenderSpec refuses proxy-pod without it)
            "--acknowledge-networkpolicy-enforcement",
        ]
    else:
        args.append(f"--boundary={names.boundary_service}:{spec.boundary_port}")
    args += [f"--policy={POLICY_DIR}/{POLICY_FILE}", f"--interception-ca={INTERCEPTION_CA_DIR}"]
    args.append("--workers=auto")  # a process per CPU the pod may use, within its CPU and memory limits
    if spec.has_credentials:
        args.append(f"--credentials={CREDENTIALS_DIR}/{CREDENTIALS_FILE}")
    if spec.inference_routes_text is not None:
        args.append(f"--inference-routes={POLICY_DIR}/{ROUTES_FILE}")
    if spec.model is Model.R and spec.agent_user != "1000:1000":
        args.append(f"--agent-user={spec.agent_user}")
    if spec.model is Model.P:
        args += ["--capture-mode=proxy-env", "--acknowledge-external-fence"]
        if spec.unprobed_fence:
            args.append("--acknowledge-unprobed-fence")
        else:
            # control's own pod address (Downward API): the workload reaches it only if its fence is missing
            args.append(f"--fence-canary=$({CANARY_ADDRESS_ENV}):{spec.canary_port}")
    if spec.api_listen:
        args.append(f"--api-listen=*:{spec.api_port}")  # every address of the pod, IPv4 and IPv6
    if spec.metrics_port is not None:
        args.append(f"--metrics-listen=*:{spec.metrics_port}")  # the NetworkPolicy admits the scraper's namespace
    # What control's NetworkPolicy keeps it out of: a policy revision allowing one of them is warned about.
    args += [f"--egress-excluded={cidr}" for cidr in dict.fromkeys(spec.excluded_cidrs)]
    # CIDR:PORT[,PORT], as control's EgressFence.parse reads it (the ports follow the last colon)
    args += [f"--egress-admitted={cidr}:{','.join(str(p) for p in ports)}" for cidr, ports in admitted]
    return args


def control_deployment(
    spec: RenderSpec, names: SandboxNames, admitted: Sequence[tuple[str, Sequence[int]]] = ()
) -> Doc:
    """Control: one replica, never two at once, non-root, no capabilities, read-only root, no token."""
    secrets, volumes = _control_volumes(spec, names)
    container = _control_container(spec, names, admitted)
    pod: Doc = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 15,
        "securityContext": _non_root_pod_context(spec),
        "initContainers": [_copy_init_container(spec.control_image, secrets)],
        "containers": [container],
        "volumes": volumes,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(spec, names.control_deployment, ROLE_CONTROL),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},  # never two controls at once
            "selector": {"matchLabels": selector(spec, ROLE_CONTROL)},
            "template": {"metadata": {"labels": labels(spec, ROLE_CONTROL)}, "spec": pod},
        },
    }


def _control_volumes(spec: RenderSpec, names: SandboxNames) -> tuple[list[tuple[str, str]], list[JsonValue]]:
    """The Secrets the init container copies (volume, file name) and every volume of control's pod."""
    secrets = [
        ("bootstrap-secret", "bootstrap"),
        ("interception-ca-secret", "interception-ca"),
    ]
    volumes: list[JsonValue] = [
        _secret_volume("bootstrap-secret", names.control_bootstrap_secret, 0o440),
        _secret_volume("interception-ca-secret", names.interception_ca_secret, 0o440),
    ]
    if spec.has_credentials:
        secrets.append(("credentials-secret", "credentials"))
        volumes.append(_secret_volume("credentials-secret", names.credentials_secret, 0o440))
    if spec.topology is Topology.PROXY_POD:
        secrets.append(("proxy-token-secret", "proxy-token"))
        volumes.append(_secret_volume("proxy-token-secret", names.proxy_token_secret, 0o440))
    volumes += [
        _memory_dir("openshell-run", "1Mi"),
        _memory_dir("api", "1Mi"),
        {"name": "policy", "configMap": {"name": names.policy_configmap}},
    ]
    return secrets, volumes


def _control_container(spec: RenderSpec, names: SandboxNames, admitted: Sequence[tuple[str, Sequence[int]]]) -> Doc:
    """Control's container: its probes, its mounts, and the ports the topology and options open."""
    container: Doc = {
        "name": "control",
        "image": spec.control_image,
        "command": [DEFAULT_ENTRYPOINT],
        "args": list(control_args(spec, names, admitted)),
        # Semantic readiness (policy valid, boundary attached with matching claims, fence confirmed); the API
        # is a Unix socket, hence exec probes. Liveness only asks whether the API answers.
        "readinessProbe": {
            "exec": {"command": ["openshell-sandbox", "readyz"]},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "exec": {"command": ["openshell-sandbox", "status"]},
            "initialDelaySeconds": 10,
            "periodSeconds": 30,
            "timeoutSeconds": 10,
            "failureThreshold": 3,
        },
        "securityContext": _restricted_container_context(read_only_root=True),
        "resources": _resources(spec.control_resources),
        "volumeMounts": [
            {"name": "openshell-run", "mountPath": COPY_DIR, "readOnly": True},
            {"name": "api", "mountPath": API_DIR},
            # A directory mount, never subPath: a subPath mount does not see ConfigMap updates.
            {"name": "policy", "mountPath": POLICY_DIR, "readOnly": True},
        ],
    }
    _add_control_ports(spec, container)
    return container


def _add_control_ports(spec: RenderSpec, container: Doc) -> None:
    """The proxy, the operator API, metrics and model P's fence canary (whose address control reads from its env)."""
    ports: list[JsonValue] = []
    if spec.topology is Topology.PROXY_POD:
        ports.append({"name": "proxy", "containerPort": proxy_port(spec), "protocol": "TCP"})
    if spec.api_listen:
        ports.append({"name": "operator-api", "containerPort": spec.api_port, "protocol": "TCP"})
    if spec.metrics_port is not None:
        ports.append({"name": "metrics", "containerPort": spec.metrics_port, "protocol": "TCP"})
    if spec.model is Model.P and not spec.unprobed_fence and spec.topology is Topology.BOUNDARY:
        ports.append({"name": "fence-canary", "containerPort": spec.canary_port, "protocol": "TCP"})
        address: Doc = {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}
        container["env"] = [{"name": CANARY_ADDRESS_ENV, "valueFrom": address}]
    if ports:
        container["ports"] = ports


def boundary_service(spec: RenderSpec, names: SandboxNames) -> Doc:
    """The name control dials: headless, and publishing not-ready addresses because readiness comes from
    attach and confirm, which need the address first."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(spec, names.boundary_service, ROLE_WORKLOAD),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector(spec, ROLE_WORKLOAD),
            "ports": [
                {"name": "boundary", "port": spec.boundary_port, "targetPort": spec.boundary_port, "protocol": "TCP"}
            ],
        },
    }


def proxy_service(spec: RenderSpec, names: SandboxNames) -> Doc:
    """The proxy-pod workload's proxy host: headless, so the name resolves to control's pod address, which is what
    the NetworkPolicies select (no Service VIP in between); only a ready control is published."""
    port = proxy_port(spec)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(spec, names.proxy_service, ROLE_CONTROL),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": False,
            "selector": selector(spec, ROLE_CONTROL),
            "ports": [{"name": "proxy", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


def policy_configmap(spec: RenderSpec, names: SandboxNames) -> Doc:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(
            spec, names.policy_configmap, ROLE_CONTROL, {"openshell.ai/policy-digest": spec.policy_digest}
        ),
        "data": {
            POLICY_FILE: spec.policy_text,
            **({ROUTES_FILE: spec.inference_routes_text} if spec.inference_routes_text is not None else {}),
        },
    }
