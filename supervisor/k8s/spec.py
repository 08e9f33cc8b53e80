"""What one render is asked for: a checked, immutable description of a sandbox's companion set.

A ``RenderSpec`` is always valid (its constructor checks every field), so the object builders never
re-validate. ``RenderError.field`` is the command-line flag at fault, and every message names it.
"""

from __future__ import annotations

import enum
import hashlib
import re
from dataclasses import dataclass

from .names import MAX_NAME, is_dns_label, is_label_value

__all__ = [
    "DEFAULT_API_PORT",
    "DEFAULT_BOUNDARY_PORT",
    "Model",
    "Owner",
    "RenderError",
    "RenderSpec",
    "Topology",
    "parse_owner",
]

DEFAULT_BOUNDARY_PORT = 7443
DEFAULT_API_PORT = 7444
_API_VERSION = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?v[0-9]+((alpha|beta)[0-9]+)?")
_KIND = re.compile(r"[A-Z][A-Za-z0-9]{0,62}")
_UID = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?")
_IMAGE = re.compile(r"[^\s\x00-\x1f\x7f]+")
_AGENT_USER = re.compile(r"([0-9]{1,10}):([0-9]{1,10})")
_WORKDIR = re.compile(r"/[^\x00-\x1f\x7f]*")


class RenderError(ValueError):
    """Bad input to render; ``field`` is the flag at fault and the message starts with it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class Model(enum.StrEnum):
    """The workload's privilege model (docs/spec/boundary.md §2.9)."""

    R = "R"
    U = "U"
    P = "P"


class Topology(enum.StrEnum):
    BOUNDARY = "boundary"
    PROXY_POD = "proxy-pod"


@dataclass(frozen=True)
class Owner:
    """The controlling owner of every object (a Sandbox custom resource, typically)."""

    api_version: str
    kind: str
    name: str
    uid: str

    def reference(self) -> dict[str, object]:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


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
    boundary_port: int = DEFAULT_BOUNDARY_PORT
    agent_user: str = "1000:1000"
    workdir: str = "/sandbox"
    has_credentials: bool = False
    # Model U on containerd: a Localhost seccomp profile (relative to the kubelet's seccomp root) permitting
    # unshare/setns/mount, since containerd's RuntimeDefault denies unshare(CLONE_NEWUSER) without SYS_ADMIN.
    seccomp_localhost: str | None = None

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
        Model(self.model)
        if Topology(self.topology) is not Topology.BOUNDARY:
            raise RenderError("--topology", f"{self.topology} is not rendered by this release (only boundary)")
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

    @property
    def policy_digest(self) -> str:
        """``sha256:<hex>`` of the policy exactly as the ConfigMap holds it (the bytes control reads)."""
        return "sha256:" + hashlib.sha256(self.policy_text.encode("utf-8")).hexdigest()
