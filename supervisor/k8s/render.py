"""One sandbox's companion set from a ``RenderSpec``: the claims, the objects in apply order, the Secrets.

``render`` is pure apart from what it is given: the same spec and the same Secret material always give the
same objects and the same YAML. The claims are derived from the names (``SandboxNames``) and the spec, and the
bootstrap bundles are minted from exactly those claims (``secrets.issue_material``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import yaml

from supervisor.protocol.claims import Claims
from supervisor.protocol.json_value import JsonValue

from .fences import InternalAllow, internal_allows, network_policies
from .names import LABEL_ROLE, SandboxNames
from .objects import (
    PROXY_TOKEN_ENV,
    ROLE_CONTROL,
    FileMode,
    boundary_service,
    control_deployment,
    policy_configmap,
    proxy_service,
    workload_pod,
)
from .secrets import SecretMaterial, redacted_secrets, secret_objects
from .spec import RenderError, RenderSpec, Topology

if TYPE_CHECKING:
    from supervisor.control.credentials import Credentials

__all__ = ["Rendered", "check_policy", "check_routes", "claims_for", "policy_destinations", "render",
           "routes_destinations", "to_yaml"]  # fmt: skip

Doc = dict[str, JsonValue]

_COMMENTS = {
    "ConfigMap": "The sandbox's policy (docs/policy.md), mounted into control only; edits become policy generations.",
    "NetworkPolicy": "A fence of the sandbox; it needs a CNI that enforces NetworkPolicy.",
    "Service": "The name control dials: headless, publishing not-ready addresses (readiness comes from attach).",
    "Deployment": "Control: policy, DNS, credentials, the only path out; it dials the boundary.",
    "Pod": "The workload: the boundary is PID 1 and starts the agent once control has attached.",
    "Secret": "Immutable; renewal is new Secrets and new pods.",
}
_PROXY_POD_COMMENTS = {
    "Service": "The workload's proxy host: headless, resolving to control's pod address (the fences select it).",
    "Deployment": "Control: policy, DNS, credentials, the only path out; it serves the workload's proxy itself.",
    "Pod": "The workload: the agent's own image, non-root, no capabilities; its only way out is control's proxy.",
}


def _is_proxy_pod(doc: Doc) -> bool:
    """Whether ``doc`` is one of the objects that differ in the proxy-pod topology (for its comment)."""
    kind = doc.get("kind")
    if kind == "Service":
        return _at(doc, "metadata", "labels", LABEL_ROLE) == ROLE_CONTROL
    if kind == "Deployment":
        args = _at(doc, "spec", "template", "spec", "containers", 0, "args")
        return isinstance(args, list) and "--topology=proxy-pod" in args
    if kind == "Pod":
        env = _at(doc, "spec", "containers", 0, "env")
        return isinstance(env, list) and any(isinstance(e, dict) and e.get("name") == PROXY_TOKEN_ENV for e in env)
    return False


def _at(value: JsonValue, *path: str | int) -> JsonValue:
    """What ``path`` leads to in one of our own objects, or ``None`` where it leads nowhere."""
    for step in path:
        if isinstance(value, dict) and isinstance(step, str):
            value = value.get(step)
        elif isinstance(value, list) and isinstance(step, int) and step < len(value):
            value = value[step]
        else:
            return None
    return value


def _comment(doc: Doc) -> str:
    kind = str(doc.get("kind"))
    return _PROXY_POD_COMMENTS[kind] if _is_proxy_pod(doc) else _COMMENTS.get(kind, "")


@dataclass(frozen=True)
class Rendered:
    names: SandboxNames
    claims: Claims
    objects: list[Doc]  # apply order: policy, fences, Service (the boundary's or the proxy's), control, workload
    secrets: list[Doc]  # real (for --secrets-dir) or redacted
    internal_allows: tuple[InternalAllow, ...] = ()  # allowed_ips ranges control's egress admits inside the cluster


def claims_for(spec: RenderSpec, names: SandboxNames) -> Claims:
    """The claims both bundles carry: nothing in them depends on a UID the API server assigns."""
    return Claims(
        namespace=spec.namespace,
        sandbox=spec.sandbox,
        sandbox_uid=spec.sandbox_uid,
        control_deployment=names.control_deployment,
        network_policy=names.workload_network_policy,
        image=spec.image,
        generation=spec.generation,
        policy_resource=names.policy_resource,
    )


def check_policy(text: str, source: str) -> None:
    """The policy must load as control would load it; every error is listed, under ``--policy``."""
    from supervisor.control.policy import PolicyInvalid, load_policy_text

    try:
        load_policy_text(text, source)
    except PolicyInvalid as exc:
        raise RenderError("--policy", str(exc)) from None


def policy_destinations(text: str) -> list[InternalAllow]:
    """Every ``allowed_ips`` range of the policy with its endpoint's ports (the policy is valid: render checked)."""
    from supervisor.control.policy import load_policy_text

    out: list[InternalAllow] = []
    for rule in load_policy_text(text).network_policies:
        for endpoint in rule.endpoints:
            out += [(cidr, tuple(endpoint.ports)) for cidr in endpoint.allowed_ips]
    return out


def check_routes(text: str, source: str, credentials: Credentials | None) -> None:
    """The inference routes must load as control would load them, and every credential they name must be in the
    credentials Secret (the routes file names credentials, never holds them); every error under
    ``--inference-routes``."""
    from supervisor.control.inference.routes import RoutesInvalid, load_routes_text

    try:
        routes = load_routes_text(text, source)
    except RoutesInvalid as exc:
        raise RenderError("--inference-routes", str(exc)) from None
    named = sorted({r.credential for r in routes.routes})
    if named and credentials is None:
        raise RenderError("--inference-routes", f"{source}: the routes inject {', '.join(named)}: pass "
                          "--credentials with them (control's Secret holds them)")  # fmt: skip
    problems = routes.check_credentials(credentials) if credentials is not None else []
    if problems:
        raise RenderError("--inference-routes", f"{source}: " + "; ".join(problems))


def routes_destinations(text: str | None) -> list[InternalAllow]:
    """Every route's ``allowed_ips`` range with its backend's port (the routes are valid: render checked)."""
    from supervisor.control.inference.routes import load_routes_text

    if text is None:
        return []
    return [(cidr, (route.port,)) for route in load_routes_text(text, "routes").routes for cidr in route.allowed_ips]


def render(spec: RenderSpec, material: SecretMaterial | None) -> Rendered:
    """``material`` ``None`` renders redacted Secrets (documentation)."""
    names = SandboxNames.of(spec.sandbox, spec.sandbox_uid)
    claims = claims_for(spec, names)
    if material is not None and (material.credentials is not None) != spec.has_credentials:
        raise RenderError("--credentials", "the Secret material and the spec disagree on credentials")
    service = proxy_service if spec.topology is Topology.PROXY_POD else boundary_service
    destinations = policy_destinations(spec.policy_text) + routes_destinations(spec.inference_routes_text)
    allows = internal_allows(spec, destinations)
    objects = [
        policy_configmap(spec, names),
        *network_policies(spec, names, allows),  # the fence exists before the pod it fences
        service(spec, names),
        control_deployment(spec, names, allows),
        workload_pod(spec, names),
    ]
    secrets = redacted_secrets(spec, names, claims) if material is None else secret_objects(spec, names, material)
    return Rendered(names=names, claims=claims, objects=objects, secrets=secrets, internal_allows=tuple(allows))


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


def _mode(dumper: yaml.SafeDumper, value: FileMode) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:int", f"0{int(value):o}")


_Dumper.add_representer(str, _str)
_Dumper.add_representer(FileMode, _mode)


def to_yaml(docs: list[Doc], header: str = "") -> str:
    """Multi-document YAML for ``kubectl apply -f -``, each object preceded by a one-line comment."""
    parts = []
    for doc in docs:
        body = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)
        comment = _comment(doc)
        parts.append((f"# {comment}\n" if comment else "") + body)
    return header + "---\n".join(parts)
