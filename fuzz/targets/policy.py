"""The policy loader: YAML (or JSON) text → validated model → compiled policy → decisions.

Oracles beyond "no crash":

* any text loads or raises ``PolicyInvalid``, nothing else; a loaded policy compiles;
* the policy is stable under re-serialisation: ``to_json`` dumped as YAML loads back to an equal policy with
  the same digest, and both compiled forms decide every probe request (the hosts, ports and binaries the policy
  names, instantiated, plus some it does not) identically, at L4 and at L7.
"""

from __future__ import annotations

import yaml

from supervisor.control.policy import (
    BinaryIdentity,
    CompiledPolicy,
    Decision,
    L4Request,
    Policy,
    PolicyInvalid,
    compile_policy,
    decide_l4,
    decide_l7,
    load_policy_text,
)

_HOSTS = ("api.example.com", "10.0.0.1", "evil.test")
_PORTS = (80, 443)
_EXES = ("/usr/bin/curl", "/bin/sh")
_L7 = (("GET", "/"), ("POST", "/repos/a/b?x=1"), ("DELETE", "/admin/%2e%2e/x"))


def _probes(policy: Policy) -> list[L4Request]:
    hosts = set(_HOSTS)
    ports = set(_PORTS)
    exes = set(_EXES)
    for rule in policy.network_policies:
        for ep in rule.endpoints:
            if ep.host:
                hosts.add(ep.host.replace("**", "a.b").replace("*", "x"))
            ports.update(ep.ports[:2])
        exes.update(b.path.replace("**", "a/b").replace("*", "x") for b in rule.binaries[:2])
    probes = []
    for host in sorted(hosts)[:6]:
        for port in sorted(ports)[:3]:
            for exe in sorted(exes)[:3]:
                probes.append(L4Request(host, port, BinaryIdentity(exe, None, ("/bin/sh",))))
    return probes


def _decisions(compiled: CompiledPolicy, probes: list[L4Request]) -> list[Decision]:
    out = []
    for req in probes:
        first = decide_l4(compiled, req)
        out.append(first)
        if first.l7:
            out += [decide_l7(compiled, first, method, target) for method, target in _L7]
    return out


def one_input(data: bytes) -> None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return
    try:
        policy = load_policy_text(text)
    except PolicyInvalid:
        return
    compiled = compile_policy(policy)
    again = load_policy_text(yaml.safe_dump(policy.to_json()))
    assert again == policy, (policy.to_json(), again.to_json())
    assert again.digest == policy.digest
    probes = _probes(policy)
    assert _decisions(compiled, probes) == _decisions(compile_policy(again), probes)
