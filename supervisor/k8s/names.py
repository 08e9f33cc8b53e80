"""Object names and labels of one sandbox's companion set (docs/design.md "Settled details": Kubernetes objects).

Rules this module enforces:

1. Every name is known before anything is applied: it is built from the sandbox's name and a short hash of
   its UID, never from a UID the API server assigns. A sandbox deleted and recreated under the same name gets
   a new UID, hence new names, hence different claims.
2. Every name is a DNS-1035 label (lowercase alphanumerics and ``-``, starting with a letter, at most 63
   characters), which every kind here accepts, Services included. A long sandbox name is shortened, never the
   hash: two sandboxes whose names share a long prefix still differ by their hashes.
3. The hash is the first ``HASH_LENGTH`` hex digits of SHA-256 over the UID's bytes: 40 bits, so two sandboxes
   of one namespace collide by chance only past a million sandboxes (and a collision is refused at apply,
   because the objects already exist, never silently shared).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

__all__ = [
    "HASH_LENGTH",
    "LABEL_NAME",
    "LABEL_ROLE",
    "LABEL_SANDBOX_ID",
    "MAX_NAME",
    "SandboxNames",
    "delete_commands",
    "is_dns_label",
    "is_label_value",
    "sandbox_hash",
]

HASH_LENGTH = 10
MAX_NAME = 63
LABEL_SANDBOX_ID = "openshell.ai/sandbox-id"
LABEL_NAME = "openshell.ai/sandbox-name"
LABEL_ROLE = "openshell.ai/sandbox-role"

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def is_dns_label(text: str) -> bool:
    """RFC 1123 label as Kubernetes checks it (namespaces, sandbox names)."""
    return len(text) <= MAX_NAME and _DNS_LABEL.fullmatch(text) is not None


def is_label_value(text: str) -> bool:
    """A non-empty Kubernetes label value."""
    return 0 < len(text) <= MAX_NAME and _LABEL_VALUE.fullmatch(text) is not None


def delete_commands(namespace: str, sandbox_uid: str) -> list[str]:
    """Removing a sandbox by its id label: the pods first, waiting until they are gone, then the rest, so the
    fences and Secrets outlive every process of the sandbox."""
    where = f"-n {namespace} -l {LABEL_SANDBOX_ID}={sandbox_uid}"
    return [
        f"kubectl delete {where} pods,deployments --cascade=foreground --wait=true",
        f"kubectl delete {where} services,networkpolicies,configmaps,secrets",
    ]


def sandbox_hash(sandbox_uid: str) -> str:
    return hashlib.sha256(sandbox_uid.encode("utf-8")).hexdigest()[:HASH_LENGTH]


def _name(prefix: str, sandbox: str, digest: str, suffix: str = "") -> str:
    """``<prefix>-<sandbox, shortened>-<digest>[-<suffix>]`` in at most 63 characters."""
    tail = f"-{digest}" + (f"-{suffix}" if suffix else "")
    room = MAX_NAME - len(prefix) - 1 - len(tail)
    middle = sandbox[:room].rstrip("-")
    name = f"{prefix}-{middle}{tail}" if middle else f"{prefix}{tail}"
    assert len(name) <= MAX_NAME and _DNS_LABEL.fullmatch(name), name
    return name


@dataclass(frozen=True)
class SandboxNames:
    """The names of one sandbox's objects; ``policy_resource`` is the claim naming its policy ConfigMap."""

    hash: str
    workload_pod: str
    control_deployment: str
    boundary_service: str
    policy_configmap: str
    workload_network_policy: str
    control_network_policy: str
    boundary_bootstrap_secret: str
    control_bootstrap_secret: str
    interception_ca_secret: str
    credentials_secret: str
    # the proxy-pod topology: control's proxy Service, the proxy token, the interception CA's certificate alone
    proxy_service: str
    proxy_token_secret: str
    proxy_ca_secret: str

    @property
    def policy_resource(self) -> str:
        return f"ConfigMap/{self.policy_configmap}"

    @classmethod
    def of(cls, sandbox: str, sandbox_uid: str) -> SandboxNames:
        digest = sandbox_hash(sandbox_uid)
        return cls(
            hash=digest,
            workload_pod=_name("os-wl", sandbox, digest),
            control_deployment=_name("os-ctl", sandbox, digest),
            boundary_service=_name("os-bnd", sandbox, digest),
            policy_configmap=_name("os-pol", sandbox, digest),
            workload_network_policy=_name("os-np", sandbox, digest),
            control_network_policy=_name("os-npc", sandbox, digest),
            boundary_bootstrap_secret=_name("os-boot", sandbox, digest, "boundary"),
            control_bootstrap_secret=_name("os-boot", sandbox, digest, "control"),
            interception_ca_secret=_name("os-ca", sandbox, digest),
            credentials_secret=_name("os-cred", sandbox, digest),
            proxy_service=_name("os-prx", sandbox, digest),
            proxy_token_secret=_name("os-ptok", sandbox, digest),
            proxy_ca_secret=_name("os-trust", sandbox, digest),
        )

    def all(self) -> tuple[str, ...]:
        return (
            self.workload_pod, self.control_deployment, self.boundary_service, self.policy_configmap,
            self.workload_network_policy, self.control_network_policy, self.boundary_bootstrap_secret,
            self.control_bootstrap_secret, self.interception_ca_secret, self.credentials_secret, self.proxy_service,
            self.proxy_token_secret, self.proxy_ca_secret,
        )  # fmt: skip
