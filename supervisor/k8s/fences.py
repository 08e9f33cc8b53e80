"""The two NetworkPolicies of one sandbox: the workload's fence and control's (pure functions of a ``RenderSpec``).

- Boundary topology: the workload admits only its own control on the boundary port and has no egress at all,
  not even DNS. Proxy-pod: no ingress; egress only to its control's proxy port and the cluster DNS peers.
- Control's egress is the internet, not the cluster: ``0.0.0.0/0`` and ``::/0`` except the operator's cluster
  and Service CIDRs and the metadata addresses of both families, so a gap in control's own SSRF guard still
  meets a second layer. What control must reach inside is allowed by name: the cluster DNS peers, its own
  workload on the boundary port, and each ``allowed_ips`` range of the policy that lies in an excluded one
  (an explicit ``ipBlock``; a policy that adds one later needs a re-render for it to be reachable).
- Control's ingress: the operator API port only with ``--api-listen`` (from ``--operator-namespace`` if named),
  the proxy port from its workload in proxy-pod, and model P's canary port from its workload (the workload's
  own egress never admits it: a canary that connects means the fence is gone).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from supervisor.protocol.json_value import JsonValue

from .names import SandboxNames
from .objects import ROLE_CONTROL, ROLE_WORKLOAD, metadata, proxy_port, selector
from .spec import DEFAULT_DNS_PEERS, Model, RenderSpec, Topology

__all__ = ["InternalAllow", "internal_allows", "network_policies"]

Doc = dict[str, JsonValue]
InternalAllow = tuple[str, tuple[int, ...]]  # (CIDR, TCP ports) control must reach inside an excluded range


def internal_allows(spec: RenderSpec, destinations: Sequence[InternalAllow]) -> list[InternalAllow]:
    """The policy's ``allowed_ips`` destinations that an excluded range would hide, each once, in order."""
    excluded = [ipaddress.ip_network(c) for c in spec.excluded_cidrs]
    out: list[InternalAllow] = []
    for cidr, ports in destinations:
        net = ipaddress.ip_network(cidr)
        if any(net.version == e.version and net.overlaps(e) for e in excluded) and (cidr, ports) not in out:
            out.append((cidr, ports))
    return out


def _dns_rules(spec: RenderSpec) -> list[JsonValue]:
    """One rule per DNS port: the peers (namespace and labels) on UDP and TCP."""
    rules: dict[int, list[JsonValue]] = {}
    for peer in spec.dns_peers if spec.dns_peers is not None else DEFAULT_DNS_PEERS:
        rules.setdefault(peer.port, []).append(
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": peer.namespace}},
                "podSelector": {"matchLabels": dict(peer.labels)},
            }
        )
    return [
        {"to": peers, "ports": [{"protocol": "UDP", "port": port}, {"protocol": "TCP", "port": port}]}
        for port, peers in rules.items()
    ]


def _control_egress(spec: RenderSpec, allows: Sequence[InternalAllow]) -> list[JsonValue]:
    blocks: list[JsonValue] = []
    for everything, version in (("0.0.0.0/0", 4), ("::/0", 6)):
        excepts: list[JsonValue] = list(
            dict.fromkeys(c for c in spec.excluded_cidrs if ipaddress.ip_network(c).version == version)
        )
        block: Doc = {"cidr": everything, "except": excepts} if excepts else {"cidr": everything}
        blocks.append({"ipBlock": block})
    egress: list[JsonValue] = [{"to": blocks}, *_dns_rules(spec)]
    if spec.topology is Topology.BOUNDARY:
        to_workload: list[JsonValue] = [{"podSelector": {"matchLabels": selector(spec, ROLE_WORKLOAD)}}]
        egress.append({"to": to_workload, "ports": [{"protocol": "TCP", "port": spec.boundary_port}]})
    for cidr, ports in allows:
        egress.append({"to": [{"ipBlock": {"cidr": cidr}}], "ports": [{"protocol": "TCP", "port": p} for p in ports]})
    return egress


def network_policies(spec: RenderSpec, names: SandboxNames, allows: Sequence[InternalAllow] = ()) -> list[Doc]:
    """The workload's fence, then control's (module docstring); ``allows`` from ``internal_allows``."""
    from_control: list[JsonValue] = [{"podSelector": {"matchLabels": selector(spec, ROLE_CONTROL)}}]
    from_workload: list[JsonValue] = [{"podSelector": {"matchLabels": selector(spec, ROLE_WORKLOAD)}}]
    ingress: list[JsonValue] = []
    if spec.topology is Topology.PROXY_POD:
        workload_ingress: list[JsonValue] = []
        workload_egress: list[JsonValue] = [
            {"to": from_control, "ports": [{"protocol": "TCP", "port": proxy_port(spec)}]},
            *_dns_rules(spec),
        ]
        ingress.append({"from": from_workload, "ports": [{"protocol": "TCP", "port": proxy_port(spec)}]})
    else:
        workload_ingress = [{"from": from_control, "ports": [{"protocol": "TCP", "port": spec.boundary_port}]}]
        workload_egress = []
        if spec.model is Model.P and not spec.unprobed_fence:
            ingress.append({"from": from_workload, "ports": [{"protocol": "TCP", "port": spec.canary_port}]})
    workload: Doc = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(spec, names.workload_network_policy, ROLE_WORKLOAD),
        "spec": {
            "podSelector": {"matchLabels": selector(spec, ROLE_WORKLOAD)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": workload_ingress,
            "egress": workload_egress,
        },
    }
    if spec.api_listen:
        rule: Doc = {"ports": [{"protocol": "TCP", "port": spec.api_port}]}
        if spec.operator_namespace is not None:
            namespace: Doc = {"matchLabels": {"kubernetes.io/metadata.name": spec.operator_namespace}}
            rule = {"from": [{"namespaceSelector": namespace}], **rule}
        ingress.append(rule)
    if spec.metrics_port is not None and spec.metrics_namespace is not None:  # the scraper's namespace, that port
        scraper: Doc = {"matchLabels": {"kubernetes.io/metadata.name": spec.metrics_namespace}}
        ingress.append({"from": [{"namespaceSelector": scraper}],
                        "ports": [{"protocol": "TCP", "port": spec.metrics_port}]})  # fmt: skip
    control: Doc = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(spec, names.control_network_policy, ROLE_CONTROL),
        "spec": {
            "podSelector": {"matchLabels": selector(spec, ROLE_CONTROL)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": ingress,
            "egress": _control_egress(spec, allows),
        },
    }
    return [workload, control]
