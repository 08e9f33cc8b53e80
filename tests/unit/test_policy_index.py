"""The L4 index against the straightforward scan (docs/reference/policy.md §3.3), for random policies and requests.

``CompiledPolicy.endpoints_for`` finds candidates through an exact (host, port) dictionary, glob buckets keyed by
(port, literal suffix) with a label-count check that can stand in for the regular expression, and a per-port list
of hostless endpoints; ``decide_l4`` builds its decision from fields precomputed per endpoint. Here every endpoint
of every rule is scanned in (rule key, endpoint index) order with the reference predicate
(``globs.host_pattern_matches``: equality or the glob's regular expression), the decision is rebuilt from the
``Endpoint`` model as §3.3 states it, and both must agree exactly — first time and from ``decide_l4``'s memo.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from supervisor.control.policy import (
    BinaryIdentity,
    CompiledPolicy,
    Decision,
    DenyReason,
    L4Request,
    PolicyInvalid,
    Verdict,
    compile_policy,
    decide_l4,
    load_policy_text,
)
from supervisor.control.policy.compiled import CompiledEndpoint
from supervisor.control.policy.decide import _identity_text
from supervisor.control.policy.globs import host_pattern_matches
from supervisor.control.policy.hosts import normalize_request_host
from supervisor.control.policy.model import Protocol

pytestmark = pytest.mark.usefixtures("cold_l4_memos")

GLOB_HOSTS = [
    "*.example.com",
    "**.example.com",
    "**.b.example.com",
    "*.*.example.com",
    "api-*.example.com",
    "a?.example.com",
    "[ab]x.example.com",
    "*.s3.*.amazonaws.com",
    "*.s3.eu.amazonaws.com",
    "**.cdn.x",
    "*.a.x",
]
EXACT_HOSTS = ["a.example.com", "b.example.com", "api-1.example.com", "s3.eu.amazonaws.com", "cdn.x", "a.b.example.com"]
IP_HOSTS = ["10.0.0.1", "[2001:db8::1]"]
# Per port one connection-metadata family, so that overlapping endpoints agree (§1.11) and most drawn policies
# load; within a port, plain and extended endpoints mix, which is where "the first extended endpoint governs" shows.
PORT_KINDS: dict[int, list[dict[str, Any]]] = {
    80: [{}, {"tls": "auto"}],
    443: [{}, {"protocol": "rest", "enforcement": "enforce", "access": "read-only"}],
    8443: [{"tls": "skip"}],
    5432: [{"protocol": "tcp"}],
    8080: [{"allowed_ips": ["10.0.0.0/24"]}],
}
BINARIES = ["/usr/bin/git", "/usr/bin/curl", "/usr/bin/*", "/opt/**/node", "/usr/bin/python3"]
EXES = ["/usr/bin/git", "/usr/bin/curl", "/usr/bin/python3", "/opt/x/y/node", "/bin/sh", "/usr/bin/python3.11"]
LABELS = ["a", "b", "ax", "bx", "a1", "api-1", "api-x", "eu", "s3", "cdn", "x", "example", "amazonaws", "com"]
SPECIAL_HOSTS = ["10.0.0.1", "10.0.0.7", "[2001:db8::1]", "2001:DB8::1", "::ffff:10.0.0.1", "", "a..example.com"]
# names several selectors above match at once (exact, glob and hostless candidates to be merged in order)
INSTANCES = [
    "x.example.com",
    "a.b.example.com",
    "x.b.example.com",
    "api-2.example.com",
    "a1.example.com",
    "ax.example.com",
    "cx.example.com",
    "q.s3.eu.amazonaws.com",
    "q.s3.us.amazonaws.com",
    "a.cdn.x",
    "a.b.cdn.x",
    "b.a.x",
    "A.A.X.",
]


@st.composite
def endpoint_st(draw: st.DrawFn) -> dict[str, Any]:
    port = draw(st.sampled_from([443, 443, 443, 80, 80, 8443, 5432, 8080]))  # weighted: overlaps are the point
    out: dict[str, Any] = {"port": port, **draw(st.sampled_from(PORT_KINDS[port]))}
    if "protocol" in out and out["protocol"] == "tcp":
        hosts = EXACT_HOSTS + GLOB_HOSTS
    elif "allowed_ips" in out:
        hosts = ["", *EXACT_HOSTS, *GLOB_HOSTS, *IP_HOSTS]
    else:
        hosts = EXACT_HOSTS + GLOB_HOSTS + IP_HOSTS
    host = draw(st.sampled_from(hosts))
    if host:
        out["host"] = host
    if draw(st.booleans()):  # a second port of the same family
        out["ports"] = [port, port + 1] if port != 8080 else [8080, 8081]
        del out["port"]
    return out


rule_st = st.fixed_dictionaries(
    {
        "endpoints": st.lists(endpoint_st(), min_size=1, max_size=4),
        "binaries": st.lists(
            st.tuples(st.sampled_from(BINARIES), st.booleans()), min_size=1, max_size=3, unique_by=lambda b: b[0]
        ),
    }
)
rules_st = st.dictionaries(
    st.sampled_from(["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta"]), rule_st, min_size=1, max_size=6
)
host_st = st.one_of(
    st.sampled_from(EXACT_HOSTS + INSTANCES),
    st.sampled_from(EXACT_HOSTS + INSTANCES),
    st.sampled_from(EXACT_HOSTS + INSTANCES),
    st.sampled_from(SPECIAL_HOSTS),
    st.builds(
        lambda labels, tail, upper, dot: (
            (".".join(labels + tail).upper() if upper else ".".join(labels + tail)) + ("." if dot else "")
        ),
        st.lists(st.sampled_from(LABELS), min_size=0, max_size=4),
        st.sampled_from([[], ["example", "com"], ["amazonaws", "com"], ["x"], ["b", "example", "com"]]),
        st.booleans(),
        st.booleans(),
    ).filter(lambda h: h not in ("", ".")),
)
some_identity_st = st.builds(
    lambda path, ancestors, loader: BinaryIdentity(path, None, tuple(ancestors), loader_env=loader),
    st.sampled_from([*EXES, *EXES, ""]),
    st.lists(st.sampled_from(EXES), max_size=2),
    st.sampled_from([(), (), (), ("LD_PRELOAD",)]),
)
identity_st = st.one_of(st.none(), some_identity_st, some_identity_st, some_identity_st)
request_st = st.builds(
    L4Request,
    host_st,
    st.sampled_from([443, 443, 443, 80, 80, 81, 444, 8443, 5432, 5433, 8080, 8081, 22, 0]),
    identity_st,
    st.booleans(),
)


def render(rules: dict[str, Any]) -> str:
    body = {
        key: {
            "endpoints": r["endpoints"],
            "binaries": [{"path": p, **({"allow_loader_env": True} if env else {})} for p, env in r["binaries"]],
        }
        for key, r in rules.items()
    }
    return yaml.safe_dump({"version": 1, "network_policies": body}, sort_keys=False)


def scan(policy: CompiledPolicy, host: str, port: int) -> list[CompiledEndpoint]:
    """Every endpoint of every rule, in (rule key, endpoint index) order: no index."""
    ordered = sorted(policy.endpoints, key=lambda c: (c.rule.key, c.index))
    return [
        cep
        for cep in ordered
        if port in cep.endpoint.ports and (not cep.endpoint.host or host_pattern_matches(cep.endpoint.host, host))
    ]


def reference_l4(policy: CompiledPolicy, req: L4Request) -> Decision:
    """§3.3 decided the long way round (no memo, no index, no precomputed endpoint fields; no digest pins)."""
    port = req.port
    if not 1 <= port <= 65535:
        return Decision(Verdict.DENY, None, None, DenyReason.INVALID_PORT, detail=f"invalid port {port!r}",
                        host=req.host, port=0)  # fmt: skip
    host = normalize_request_host(req.host)
    if host is None:
        detail = f"invalid destination host {req.host!r}"
        return Decision(Verdict.DENY, None, None, DenyReason.INVALID_HOST, detail=detail, port=port)

    def deny(reason: DenyReason, detail: str) -> Decision:
        return Decision(Verdict.DENY, None, f"{host}:{port}", reason, detail=detail, host=host, port=port)

    if not policy.rules:
        return deny(DenyReason.NO_NETWORK_POLICIES, "network connections not allowed by policy")
    identity = None if req.relaxed else req.identity
    if not req.relaxed and (identity is None or not identity.path):
        return deny(DenyReason.IDENTITY_MISSING, "the initiating process could not be identified")
    candidates = scan(policy, host, port)
    if not candidates:
        return deny(DenyReason.NO_MATCHING_ENDPOINT, f"endpoint {host}:{port} is not allowed by any policy")
    matching = [c for c in candidates if identity is None or c.rule.binary_matches(identity)]
    if not matching:
        assert identity is not None
        refused = dict.fromkeys(c.rule.key for c in candidates)
        who = _identity_text(identity)
        return deny(DenyReason.BINARY_NOT_ALLOWED, "; ".join(f"{who} not allowed in policy '{k}'" for k in refused))
    configs = [c for c in matching if c.endpoint.extended]
    governing = configs[0] if configs else matching[0]
    first = configs[0].endpoint if configs else None
    return Decision(
        Verdict.ALLOW,
        governing.rule.key,
        f"{governing.rule.key}[{governing.index}]",
        None,
        l7=any(c.endpoint.protocol.inspected for c in configs),
        detail=f"{host}:{port} allowed by policy '{governing.rule.key}'",
        host=host,
        port=port,
        rules=tuple(dict.fromkeys(c.rule.key for c in matching)),
        tls_skip=first.tls_skip if first else False,
        allowed_ips=first.allowed_ips if first else (),
        exact_host=any("*" not in c.endpoint.host and c.endpoint.host == host for c in matching),
        transparent=any(c.endpoint.protocol is Protocol.TCP for c in matching),
    )


def compiled_or_reject(rules: dict[str, Any], aliases: bool) -> CompiledPolicy:
    try:
        policy = load_policy_text(render(rules), "random.yaml")
    except PolicyInvalid:
        assume(False)  # overlapping endpoints that disagree (§1.11): not this test's subject
        raise
    return compile_policy(policy, binary_aliases={"/usr/bin/python3": ["/usr/bin/python3.11"]} if aliases else None)


def destinations(policy: CompiledPolicy) -> list[tuple[str, int]]:
    """(host as a client may write it, port) pairs that some endpoint of ``policy`` names: most drawn requests
    should reach the binary check and the merge of candidates, not stop at "no matching endpoint"."""
    out = []
    for raw in EXACT_HOSTS + INSTANCES + SPECIAL_HOSTS:
        host = normalize_request_host(raw)
        for cep in policy.endpoints if host is not None else ():
            if not cep.endpoint.host or host_pattern_matches(cep.endpoint.host, host):
                out.extend((raw, port) for port in cep.endpoint.ports)
    return sorted(set(out))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(rules=rules_st, data=st.data(), aliases=st.booleans())
def test_indexed_decision_equals_the_scan(rules: dict[str, Any], data: st.DataObject, aliases: bool) -> None:
    policy = compiled_or_reject(rules, aliases)
    targeted = st.builds(
        lambda dest, identity, relaxed: L4Request(dest[0], dest[1], identity, relaxed),
        st.sampled_from(destinations(policy) or [("a.example.com", 443)]),
        identity_st,
        st.booleans(),
    )
    requests = data.draw(st.lists(st.one_of(targeted, targeted, request_st), min_size=1, max_size=12))
    for req in requests:
        expected = reference_l4(policy, req)
        assert decide_l4(policy, req) == expected, req
        assert decide_l4(policy, req) == expected, req  # from the memo
        host = normalize_request_host(req.host)
        if host is not None and 1 <= req.port <= 65535:
            assert policy.endpoints_for(host, req.port) == scan(policy, host, req.port), req


@settings(max_examples=200, deadline=None)
@given(
    labels=st.lists(st.sampled_from([*LABELS, "*"]), min_size=2, max_size=4),
    recursive=st.booleans(),
    hosts=st.lists(host_st, min_size=1, max_size=10),
)
def test_a_glob_the_suffix_decides_matches_like_its_regex(labels: list[str], recursive: bool, hosts: list[str]) -> None:
    """A glob whose labels in front of the literal suffix are all whole ``*`` is matched by bucket and label count
    alone; that must be the regular expression's answer for every normalised host."""
    pattern = ".".join((["**"] if recursive else []) + ["*", *labels])
    try:
        policy = load_policy_text(render({"g": {"endpoints": [{"host": pattern, "port": 443}],
                                                "binaries": [("/usr/bin/git", False)]}}))  # fmt: skip
    except PolicyInvalid:
        assume(False)
        raise
    compiled = compile_policy(policy)
    (cep,) = compiled.endpoints
    assert cep.host_glob is not None
    for raw in hosts:
        host = normalize_request_host(raw)
        if host is None:
            continue
        assert bool(compiled.endpoints_for(host, 443)) is cep.host_glob.matches(host), (pattern, host)


def test_decision_init_is_the_dataclass_init() -> None:
    """``Decision.__init__`` is written out (for speed); it must take exactly the declared fields, in order, with
    their defaults, and store each one where it belongs."""
    params = list(inspect.signature(Decision.__init__).parameters.values())[1:]
    fields = dataclasses.fields(Decision)
    assert [p.name for p in params] == [f.name for f in fields]
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)
    assert [p.default for p in params] == [
        inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default for f in fields
    ]
    values = [object() for _ in fields]
    names = [f.name for f in fields]
    by_position = Decision(*values)  # type: ignore[arg-type]
    by_name = Decision(**dict(zip(names, values, strict=True)))  # type: ignore[arg-type]
    for made in (by_position, by_name):
        assert [getattr(made, name) for name in names] == values
    made = by_position
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.host = "elsewhere"  # type: ignore[misc]
    assert dataclasses.replace(made, host="h").host == "h"
