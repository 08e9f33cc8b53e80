"""The ranges control's own NetworkPolicy keeps it out of, and the warning a policy gets when it allows one
(docs/kubernetes.md "Control's egress").

``k8s render`` excludes the cluster, Service and metadata ranges from control's egress and admits, by an explicit
``ipBlock`` on its ports, each ``allowed_ips`` range of the policy it rendered that lies in one. It passes both to
control (``--egress-excluded CIDR``, ``--egress-admitted CIDR:PORT[,PORT]``), so that a later revision — a ConfigMap
edit, ``policy apply`` — whose ``allowed_ips`` reaches into an excluded range is warned about: the policy allows it,
the fence drops it, and the connection times out until the sandbox is rendered again and its NetworkPolicy
re-applied. ``policy check`` takes the same two flags. A warning never changes a decision.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import PolicyWarning
from .model import Policy

__all__ = ["EgressFence"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class EgressFence:
    excluded: tuple[Network, ...] = ()
    admitted: tuple[tuple[Network, frozenset[int]], ...] = ()

    @classmethod
    def parse(cls, excluded: Sequence[str], admitted: Sequence[str]) -> EgressFence:
        """From the flags; ``ValueError`` naming the flag and the value."""
        nets: list[Network] = []
        for text in excluded:
            try:
                nets.append(ipaddress.ip_network(text, strict=False))
            except ValueError:
                raise ValueError(f"--egress-excluded: {text!r} is not a CIDR") from None
        allows: list[tuple[Network, frozenset[int]]] = []
        for text in admitted:
            cidr, sep, ports = text.rpartition(":")
            try:
                if not sep:
                    raise ValueError
                numbers = frozenset(int(p) for p in ports.split(","))
                if not all(1 <= p <= 65535 for p in numbers):
                    raise ValueError
                allows.append((ipaddress.ip_network(cidr, strict=False), numbers))
            except ValueError:
                raise ValueError(f"--egress-admitted: {text!r} is not CIDR:PORT[,PORT]") from None
        return cls(tuple(nets), tuple(allows))

    def __bool__(self) -> bool:
        return bool(self.excluded)

    def _blocked_ports(self, net: Network, ports: Sequence[int]) -> list[int]:
        """The ports of ``net`` no admitted block covers (``ports`` empty: every port, reported as ``[0]``)."""
        wanted = list(ports) or [0]
        return [
            port
            for port in wanted
            if not any(
                net.version == block.version and net.subnet_of(block) and port in allowed  # type: ignore[arg-type]
                for block, allowed in self.admitted
            )
        ]

    def warnings(self, policy: Policy, source: str | None = None) -> list[PolicyWarning]:
        """One warning per ``allowed_ips`` entry that overlaps an excluded range on a port no admitted block
        covers."""
        out: list[PolicyWarning] = []
        if not self.excluded:
            return out
        for rule in policy.network_policies:
            for index, endpoint in enumerate(rule.endpoints):
                for cidr in endpoint.allowed_ips:
                    net = ipaddress.ip_network(cidr, strict=False)
                    inside = [e for e in self.excluded if e.version == net.version and net.overlaps(e)]
                    if not inside:
                        continue
                    blocked = self._blocked_ports(net, endpoint.ports)
                    if not blocked:
                        continue
                    on = "every port" if blocked == [0] else "port " + ", ".join(str(p) for p in blocked)
                    out.append(
                        PolicyWarning(
                            f"network_policies.{rule.key}.endpoints[{index}].allowed_ips",
                            f"{cidr} ({on}) lies in {inside[0]}, which control's NetworkPolicy excludes and was "
                            "not rendered to admit: connections time out at the fence until the sandbox is "
                            "rendered again with this policy and its NetworkPolicy re-applied",
                            None,
                            source,
                        )
                    )
        return out
