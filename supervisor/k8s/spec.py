"""What one render is asked for: a checked, immutable description of a sandbox's companion set.

A ``RenderSpec`` is always valid (its constructor checks every field), so the object builders never
re-validate. ``RenderError.field`` is the command-line flag at fault, and every message names it.
"""

from __future__ import annotations

import enum
import hashlib
import ipaddress
import re
from dataclasses import dataclass

from ..protocol.json_value import JsonValue
from ..protocol.privilege_model import PrivilegeModel
from .names import MAX_NAME, is_dns_label, is_label_value
from .quantity import BOUNDARY_MEMORY_HEADROOM, Resources, format_bytes, parse_bytes

__all__ = [
    "DEFAULT_API_PORT",
    "DEFAULT_BOUNDARY_PORT",
    "DEFAULT_CANARY_PORT",
    "DEFAULT_CONTROL_RESOURCES",
    "DEFAULT_DNS_PEERS",
    "DEFAULT_ENTRYPOINT",
    "DEFAULT_PROXY_PORT",
    "DEFAULT_WORKLOAD_RESOURCES",
    "DEFAULT_WORKSPACE_SIZE",
    "METADATA_CIDRS",
    "Affinity",
    "DnsPeer",
    "Model",
    "Owner",
    "RenderError",
    "RenderSpec",
    "Topology",
    "parse_cidr",
    "parse_dns_peer",
    "parse_owner",
]

DEFAULT_BOUNDARY_PORT = 7443
DEFAULT_API_PORT = 7444
DEFAULT_PROXY_PORT = 3128
DEFAULT_CANARY_PORT = 7445  # model P: control's fence canary listener
DEFAULT_ENTRYPOINT = "/usr/local/bin/openshell-sandbox"  # images/Containerfile's ENTRYPOINT, by path
DEFAULT_WORKLOAD_RESOURCES = Resources(cpu="250m", memory="512Mi", limit_memory="2Gi")
DEFAULT_CONTROL_RESOURCES = Resources(cpu="100m", memory="128Mi", limit_memory="512Mi")
DEFAULT_WORKSPACE_SIZE = 10 * 2**30
# Cloud metadata services, excluded from control's egress in every cluster: link-local IPv4 (AWS, GCP, Azure,
# OpenStack), AWS's IPv6 one, Alibaba's.
METADATA_CIDRS = ("169.254.0.0/16", "100.100.100.200/32", "fd00:ec2::254/128")
_DIGEST = re.compile(r"[^@\s]+@sha256:[0-9a-f]{64}")
_API_VERSION = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?v[0-9]+((alpha|beta)[0-9]+)?")
_KIND = re.compile(r"[A-Z][A-Za-z0-9]{0,62}")
_UID = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?")
_IMAGE = re.compile(r"[^\s\x00-\x1f\x7f]+")
_AGENT_USER = re.compile(r"([0-9]{1,10}):([0-9]{1,10})")
_WORKDIR = re.compile(r"/[^\x00-\x1f\x7f]*")
_PROXY_USER = re.compile(r"([0-9]{1,10})(:([0-9]{1,10}))?")
# a label key: optional DNS-subdomain prefix and "/", then a name of at most 63 characters
_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


class RenderError(ValueError):
    """Bad input to render; ``field`` is the flag at fault and the message starts with it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


Model = PrivilegeModel  # the workload's privilege model: the boundary's own enum


class Topology(enum.StrEnum):
    BOUNDARY = "boundary"
    PROXY_POD = "proxy-pod"


class Affinity(enum.StrEnum):
    """Where the workload pod is scheduled relative to its control (``--affinity``)."""

    DISABLED = "disabled"
    PREFERRED = "preferred"
    REQUIRED = "required"


@dataclass(frozen=True)
class DnsPeer:
    """Pods the proxy-pod workload may send DNS to: a namespace and a label selector (``--dns-peer``)."""

    namespace: str
    labels: tuple[tuple[str, str], ...]
    port: int = 53  # the DNS pods' own port (OpenShift's listen on 5353 behind the Service's 53)

    def __str__(self) -> str:
        text = f"{self.namespace}/" + ",".join(f"{k}={v}" for k, v in self.labels)
        return text if self.port == 53 else f"{text}:{self.port}"


DEFAULT_DNS_PEERS = (DnsPeer("kube-system", (("k8s-app", "kube-dns"),)),)


def parse_dns_peer(text: str) -> DnsPeer:
    """``NAMESPACE/KEY=VALUE[,KEY=VALUE…][:PORT]``, e.g. ``kube-system/k8s-app=kube-dns`` or
    ``openshift-dns/dns.operator.openshift.io/daemonset-dns=default:5353`` (a label value holds no ``:``)."""
    port = 53
    head, colon, tail = text.rpartition(":")
    if colon:
        if not tail.isdigit() or not 1 <= int(tail) <= 65535:
            raise RenderError("--dns-peer", f"{text!r}: port {tail!r} is not 1..65535")
        text, port = head, int(tail)
    namespace, sep, selector = text.partition("/")
    if not sep or not is_dns_label(namespace):
        raise RenderError("--dns-peer", f"{text!r} is not NAMESPACE/KEY=VALUE[,KEY=VALUE...][:PORT]")
    labels = []
    for item in selector.split(","):
        key, eq, value = item.partition("=")
        # the key may hold a "/" of its own (example.com/app=dns), so split the selector after the namespace
        if not eq or not _LABEL_KEY.fullmatch(key) or not is_label_value(value):
            raise RenderError("--dns-peer", f"{text!r}: {item!r} is not KEY=VALUE (a label key and a label value)")
        labels.append((key, value))
    return DnsPeer(namespace, tuple(labels), port)


def parse_cidr(text: str, flag: str) -> str:
    """A network in canonical form (``10.244.0.0/16``); host bits set are refused, not masked."""
    try:
        return str(ipaddress.ip_network(text, strict=True))
    except ValueError as exc:
        raise RenderError(flag, f"{text!r} is not a CIDR ({exc})") from None


@dataclass(frozen=True)
class Owner:
    """The controlling owner of every object (a Sandbox custom resource, typically)."""

    api_version: str
    kind: str
    name: str
    uid: str

    def reference(self, block_owner_deletion: bool = False) -> dict[str, JsonValue]:
        """``blockOwnerDeletion`` needs the right to set finalizers on the owner, which many appliers lack."""
        ref: dict[str, JsonValue] = {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
        }
        if block_owner_deletion:
            ref["blockOwnerDeletion"] = True
        return ref


def parse_owner(text: str) -> Owner:
    """``APIVERSION/KIND/NAME/UID``; APIVERSION is ``v1`` or ``group/version``."""
    parts = text.split("/")
    if len(parts) not in (4, 5):
        raise RenderError("--owner", f"{text!r} is not APIVERSION/KIND/NAME/UID")
    api_version, kind, name, uid = "/".join(parts[:-3]), parts[-3], parts[-2], parts[-1]
    if not _API_VERSION.fullmatch(api_version):
        raise RenderError("--owner", f"apiVersion {api_version!r} is not v1 or GROUP/VERSION")
    if not _KIND.fullmatch(kind):
        raise RenderError("--owner", f"kind {kind!r} is not a Kubernetes kind (CamelCase)")
    if not (len(name) <= 253 and re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name)):
        raise RenderError("--owner", f"name {name!r} is not a Kubernetes object name")
    if not (len(uid) <= MAX_NAME and _UID.fullmatch(uid)):
        raise RenderError("--owner", f"uid {uid!r} is not a Kubernetes UID")
    return Owner(api_version=api_version, kind=kind, name=name, uid=uid)


@dataclass(frozen=True)
class RenderSpec:
    """One sandbox's companion set, as asked for. Construct it with keywords; it checks every field."""

    namespace: str
    sandbox: str
    sandbox_uid: str
    image: str  # the workload image (the agent's, built FROM openshell-sandbox); the `image` claim
    control_image: str
    agent_argv: tuple[str, ...]
    policy_text: str
    model: Model = Model.R
    topology: Topology = Topology.BOUNDARY
    generation: int = 1
    owner: Owner | None = None
    owner_namespace: str | None = None  # where the owner lives; None: this namespace or cluster-scoped
    operator_namespace: str | None = None  # the only namespace whose pods may reach control's API port
    api_port: int = DEFAULT_API_PORT
    api_listen: bool = False  # control serves the operator API on api_port with mTLS (--api-listen)
    metrics_port: int | None = None  # control serves /metrics on this port (--metrics-port); None: not at all
    metrics_namespace: str | None = None  # the only namespace whose pods may reach it (the scraper's)
    boundary_port: int = DEFAULT_BOUNDARY_PORT
    agent_user: str = "1000:1000"
    workdir: str = "/sandbox"
    has_credentials: bool = False
    # --inference-routes: the routes file as control's ConfigMap holds it (its credentials are in the Secret)
    inference_routes_text: str | None = None
    # Model U on containerd: a Localhost seccomp profile (relative to the kubelet's seccomp root) permitting
    # unshare/setns/mount, since containerd's RuntimeDefault denies unshare(CLONE_NEWUSER) without SYS_ADMIN.
    seccomp_localhost: str | None = None
    # Both topologies: the workload pod's RuntimeClass, and its scheduling beside control.
    runtime_class: str | None = None
    affinity: Affinity = Affinity.DISABLED
    # The proxy-pod topology only (docs/kubernetes.md "Choosing a topology"); None: the default.
    proxy_port: int | None = None  # control's proxy listener and headless Service port
    proxy_user: str | None = None  # UID[:GID] the agent's image runs as (--proxy-uid)
    read_only_root: bool = False  # the agent's image works on a read-only root filesystem
    dns_peers: tuple[DnsPeer, ...] | None = None  # the cluster DNS pods (control's egress; proxy-pod: the workload's)
    # Chart knobs: resources, the workload's memory limit (the boundary's --memory-limit), the workspace's size.
    workload_resources: Resources | None = None  # None: DEFAULT_WORKLOAD_RESOURCES, limit raised for memory_limit
    control_resources: Resources = DEFAULT_CONTROL_RESOURCES
    memory_limit: int | None = None  # bytes; None: the workload container's limit less BOUNDARY_MEMORY_HEADROOM
    workspace_size: int = DEFAULT_WORKSPACE_SIZE  # bytes: the workspace emptyDir's sizeLimit
    allow_mutable_image: bool = False  # --image may be a tag (the `image` claim then proves less)
    entrypoint: str = DEFAULT_ENTRYPOINT  # where the workload image keeps openshell-sandbox
    block_owner_deletion: bool = False
    # Control's egress fence: None means not stated (refused); () with --cluster-cidr none.
    cluster_cidrs: tuple[str, ...] | None = None
    service_cidrs: tuple[str, ...] = ()
    # What only the operator knows: the cluster's CNI enforces NetworkPolicy (required for proxy-pod and P).
    networkpolicy_enforced: bool = False
    unprobed_fence: bool = False  # model P without the canary
    canary_port: int = DEFAULT_CANARY_PORT
    assigned_uids: bool = False  # the cluster assigns pod uids (OpenShift restricted-v2): no fixed runAsUser

    def __post_init__(self) -> None:
        for flag, value in (("--namespace", self.namespace), ("--sandbox", self.sandbox)):
            if not is_dns_label(value):
                raise RenderError(flag, f"{value!r} is not a DNS label (a-z, 0-9 and '-', at most 63 characters)")
        if not is_label_value(self.sandbox_uid):
            raise RenderError("--sandbox-uid", f"{self.sandbox_uid!r} is not a Kubernetes UID (a label value)")
        for flag, value in (("--image", self.image), ("--control-image", self.control_image)):
            if not value or not _IMAGE.fullmatch(value) or len(value) > 512:
                raise RenderError(flag, f"{value!r} is not an image reference")
        if not self.agent_argv or not self.agent_argv[0]:
            raise RenderError("AGENT", "the agent's argv (after --) is empty")
        if any("\x00" in a for a in self.agent_argv):
            raise RenderError("AGENT", "an argument holds a NUL byte")
        object.__setattr__(self, "model", Model(self.model))
        object.__setattr__(self, "topology", Topology(self.topology))
        object.__setattr__(self, "affinity", Affinity(self.affinity))
        self._check_topology()
        if isinstance(self.generation, bool) or not 0 <= self.generation < 2**63:
            raise RenderError("--generation", f"{self.generation!r} must be an integer in [0, 2**63)")
        if self.owner_namespace is not None:
            if self.owner is None:
                raise RenderError("--owner-namespace", "given without --owner")
            if self.owner_namespace != self.namespace:
                raise RenderError(
                    "--owner",
                    f"the owner lives in namespace {self.owner_namespace!r}, not {self.namespace!r}: an "
                    "ownerReference must name an object of the same namespace (or a cluster-scoped one)",
                )
        if self.operator_namespace is not None and not is_dns_label(self.operator_namespace):
            raise RenderError("--operator-namespace", f"{self.operator_namespace!r} is not a namespace name")
        if self.operator_namespace is not None and not self.api_listen:
            raise RenderError("--operator-namespace", "needs --api-listen (without it control has no TCP API)")
        for flag, port in (("--api-port", self.api_port), ("--boundary-port", self.boundary_port)):
            if isinstance(port, bool) or not 1 <= port <= 65535:
                raise RenderError(flag, f"{port!r} is not a TCP port")
        self._check_metrics()
        if self.seccomp_localhost is not None:
            if self.model is not Model.U:
                raise RenderError("--seccomp-localhost", "only for --privilege-model U (the others use RuntimeDefault)")
            if not re.fullmatch(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*", self.seccomp_localhost) or ".." in (
                self.seccomp_localhost.split("/")
            ):
                raise RenderError("--seccomp-localhost", f"{self.seccomp_localhost!r} is not a relative profile path")
        if not _AGENT_USER.fullmatch(self.agent_user):
            raise RenderError("--agent-user", f"{self.agent_user!r} is not UID:GID")
        if not _WORKDIR.fullmatch(self.workdir) or self.workdir.rstrip("/") == "" or ".." in self.workdir.split("/"):
            raise RenderError("--workdir", f"{self.workdir!r} must be an absolute path other than /")
        self._check_knobs()
        self._check_fences()

    def _check_knobs(self) -> None:
        if not self.allow_mutable_image and not _DIGEST.fullmatch(self.image):
            raise RenderError(
                "--image",
                f"{self.image!r} is not pinned by digest (NAME@sha256:<64 hex>): the `image` claim names what was "
                "admitted only if the reference cannot move (or pass --allow-mutable-image)",
            )
        if not _WORKDIR.fullmatch(self.entrypoint) or ".." in self.entrypoint.split("/"):
            raise RenderError("--entrypoint", f"{self.entrypoint!r} is not an absolute path")
        if self.block_owner_deletion and self.owner is None:
            raise RenderError("--block-owner-deletion", "given without --owner")
        if self.workspace_size < 2**20:
            raise RenderError("--workspace-size", f"{format_bytes(self.workspace_size)} is below 1Mi")
        if self.topology is Topology.PROXY_POD:
            if self.memory_limit is not None:
                raise RenderError("--memory-limit", "the proxy-pod workload runs no boundary: use --resources")
            return
        if self.memory_limit is not None and self.memory_limit < 16 * 2**20:
            raise RenderError("--memory-limit", f"{format_bytes(self.memory_limit)} is below 16Mi")
        container = parse_bytes(self.workload_container_resources.limit_memory, "--resources")
        if container - self.workload_memory_limit < BOUNDARY_MEMORY_HEADROOM or self.workload_memory_limit <= 0:
            raise RenderError(
                "--resources",
                f"workload limit-memory={format_bytes(container)} leaves the boundary less than "
                f"{format_bytes(BOUNDARY_MEMORY_HEADROOM)} above the workload's --memory-limit "
                f"{format_bytes(self.workload_memory_limit)}",
            )

    def _check_fences(self) -> None:
        if self.cluster_cidrs is None:
            raise RenderError(
                "--cluster-cidr",
                "required: the cluster's pod and node CIDRs (--cluster-cidr, repeatable) and its Service CIDRs "
                "(--service-cidr), which control's egress excludes with the metadata addresses; render does not "
                "guess them. --cluster-cidr none renders control's egress without that exclusion",
            )
        if self.service_cidrs and not self.cluster_cidrs:
            raise RenderError("--service-cidr", "given with --cluster-cidr none")
        needs_statement = self.topology is Topology.PROXY_POD or self.model is Model.P
        if needs_statement and not self.networkpolicy_enforced:
            what = "the proxy-pod topology" if self.topology is Topology.PROXY_POD else "model P"
            raise RenderError(
                "--networkpolicy-enforced",
                f"required for {what}: its only fence is the workload's NetworkPolicy, so you must state that this "
                "cluster's CNI enforces NetworkPolicy (egress and ingress) for the namespace; render cannot know",
            )
        if self.unprobed_fence and self.model is not Model.P:
            raise RenderError("--unprobed-fence", "only for model P (the only model with a canary)")
        if isinstance(self.canary_port, bool) or not 1 <= self.canary_port <= 65535:
            raise RenderError("--canary-port", f"{self.canary_port!r} is not a TCP port")
        if (
            self.model is Model.P
            and not self.unprobed_fence
            and self.canary_port in (self.api_port, self.boundary_port)
        ):
            raise RenderError("--canary-port", f"{self.canary_port} is also another port of the sandbox")

    def _check_metrics(self) -> None:
        """/metrics is plain HTTP without authentication: only the scraper's namespace may reach it."""
        port = self.metrics_port
        if port is None:
            if self.metrics_namespace is not None:
                raise RenderError("--metrics-namespace", "needs --metrics-port (without it control serves no metrics)")
            return
        if isinstance(port, bool) or not 1 <= port <= 65535:
            raise RenderError("--metrics-port", f"{port!r} is not a TCP port")
        if self.metrics_namespace is None or not is_dns_label(self.metrics_namespace):
            got = self.metrics_namespace
            raise RenderError("--metrics-namespace", "--metrics-port needs the namespace of the Prometheus that "
                              f"scrapes it (the only pods admitted to the port), got {got!r}")  # fmt: skip
        proxy = (self.proxy_port or DEFAULT_PROXY_PORT) if self.topology is Topology.PROXY_POD else None
        others = {self.boundary_port, proxy, *([self.api_port] if self.api_listen else []),
                  *([self.canary_port] if self.model is Model.P else [])}  # fmt: skip
        if port in others:
            raise RenderError("--metrics-port", f"{port} is also another port of the sandbox")

    def _check_topology(self) -> None:
        if self.runtime_class is not None and not (
            len(self.runtime_class) <= 253 and re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", self.runtime_class)
        ):
            raise RenderError("--runtime-class", f"{self.runtime_class!r} is not a RuntimeClass name")
        proxy_only = (
            ("--proxy-port", self.proxy_port is not None), ("--proxy-uid", self.proxy_user is not None),
            ("--read-only-root", self.read_only_root),
        )  # fmt: skip
        if self.dns_peers is not None and not self.dns_peers:
            raise RenderError(
                "--dns-peer",
                "an empty list: control resolves through the cluster DNS, and the proxy-pod workload resolves its "
                f"proxy's Service name there (default {DEFAULT_DNS_PEERS[0]})",
            )
        if self.topology is Topology.BOUNDARY:
            for flag, given in proxy_only:
                if given:
                    raise RenderError(flag, "only applies to --topology proxy-pod")
            return
        if self.model is not Model.R:
            raise RenderError("--privilege-model", "the proxy-pod workload runs no boundary, hence no privilege model")
        if self.seccomp_localhost is not None:
            raise RenderError("--seccomp-localhost", "only for the boundary topology's model U")
        if self.agent_user != "1000:1000":
            raise RenderError("--agent-user", "the proxy-pod workload runs as --proxy-uid")
        port = self.proxy_port
        if port is not None and (isinstance(port, bool) or not 1 <= port <= 65535):
            raise RenderError("--proxy-port", f"{port!r} is not a TCP port")
        if port is not None and self.api_listen and port == self.api_port:
            raise RenderError("--proxy-port", f"{port} is also --api-port")
        user = self.proxy_user
        if user is not None:
            match = _PROXY_USER.fullmatch(user)
            if match is None:
                raise RenderError("--proxy-uid", f"{user!r} is not UID or UID:GID")
            if int(match.group(1)) == 0 or int(match.group(1)) >= 2**31 or int(match.group(3) or 1) >= 2**31:
                raise RenderError("--proxy-uid", f"{user!r}: the uid must be non-zero (Pod Security restricted)")

    @property
    def workload_container_resources(self) -> Resources:
        """The workload container's resources: its memory limit holds the workload's and the boundary's headroom."""
        if self.workload_resources is not None:
            return self.workload_resources
        if self.memory_limit is None or self.topology is Topology.PROXY_POD:
            return DEFAULT_WORKLOAD_RESOURCES
        limit = format_bytes(self.memory_limit + BOUNDARY_MEMORY_HEADROOM)
        return Resources(DEFAULT_WORKLOAD_RESOURCES.cpu, DEFAULT_WORKLOAD_RESOURCES.memory, limit)

    @property
    def workload_memory_limit(self) -> int:
        """The boundary's ``--memory-limit``: given, or the container's limit less the boundary's headroom."""
        if self.memory_limit is not None:
            return self.memory_limit
        limit = parse_bytes(self.workload_container_resources.limit_memory, "--resources")
        return limit - BOUNDARY_MEMORY_HEADROOM

    @property
    def excluded_cidrs(self) -> tuple[str, ...]:
        """What control's egress may not reach, in every cluster: its own ranges and the metadata addresses."""
        return (*(self.cluster_cidrs or ()), *self.service_cidrs, *METADATA_CIDRS)

    @property
    def proxy_ids(self) -> tuple[int, int]:
        """The proxy-pod agent's uid and gid (``--proxy-uid``, default 1000:1000; a bare UID is also the GID)."""
        match = _PROXY_USER.fullmatch(self.proxy_user or "1000")
        assert match is not None
        uid = int(match.group(1))
        return uid, int(match.group(3) or uid)

    @property
    def policy_digest(self) -> str:
        """``sha256:<hex>`` of the policy exactly as the ConfigMap holds it (the bytes control reads)."""
        return "sha256:" + hashlib.sha256(self.policy_text.encode("utf-8")).hexdigest()
