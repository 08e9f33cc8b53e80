"""Hypothesis properties of the policy engine.

* a decision is a pure function of (policy, request): no hidden state, same answer every time;
* reordering the rules in the file (and the endpoints and binaries inside a rule) never changes a decision;
* the validator and the matcher agree: every accepted host glob compiles and matches its own instances;
* canonicalisation is idempotent and leaves no dot segment;
* any input text either loads or raises ``PolicyInvalid`` — never anything else.
"""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.control.policy import (
    BinaryIdentity,
    Decision,
    L4Request,
    PolicyInvalid,
    TargetError,
    canonicalize_target,
    compile_policy,
    decide_l4,
    decide_l7,
    load_policy_text,
)
from supervisor.control.policy.globs import compile_host_glob
from supervisor.control.policy.hosts import validate_policy_host

HOSTS = [
    "a.example.com",
    "b.example.com",
    "*.example.com",
    "**.example.com",
    "api.test.org",
    "10.0.0.1",
    "*-v1.svc.example.com",
]
PORTS = [80, 443, 8080]
BINARIES = ["/usr/bin/git", "/usr/bin/curl", "/usr/bin/*", "/opt/**/node", "/usr/bin/python3"]
TARGET_HOSTS = [
    "a.example.com",
    "B.example.com.",
    "x.y.example.com",
    "api.test.org",
    "10.0.0.1",
    "evil.com",
    "eu-v1.svc.example.com",
    "x.example.com",
]
EXES = ["/usr/bin/git", "/usr/bin/curl", "/usr/bin/python3", "/opt/x/y/node", "/bin/sh", "/usr/local/bin/git"]
METHODS = ["GET", "HEAD", "POST", "DELETE", "OPTIONS"]
TARGETS = ["/", "/repos/a", "/admin/x", "/repos/../admin/x", "/a%2Fb", "/x?ref=prod"]

endpoint_st = st.fixed_dictionaries(
    {"host": st.sampled_from(HOSTS), "ports": st.lists(st.sampled_from(PORTS), min_size=1, max_size=3, unique=True)},
    optional={
        "l7": st.sampled_from(["read-only", "read-write", "full"]),
        "deny": st.sampled_from(["/admin/**", "/repos/*"]),
    },
)
rule_st = st.fixed_dictionaries(
    {
        "endpoints": st.lists(endpoint_st, min_size=1, max_size=3),
        "binaries": st.lists(st.sampled_from(BINARIES), min_size=1, max_size=3, unique=True),
    }
)
rules_st = st.dictionaries(
    st.sampled_from(["alpha", "beta", "gamma", "delta", "eps", "zeta"]), rule_st, min_size=0, max_size=5
)
request_st = st.tuples(
    st.sampled_from(TARGET_HOSTS),
    st.sampled_from([*PORTS, 22]),
    st.sampled_from(EXES),
    st.lists(st.sampled_from(EXES), max_size=2),
    st.sampled_from(METHODS),
    st.sampled_from(TARGETS),
)


def render_endpoint(ep: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"host": ep["host"], "ports": ep["ports"]}
    if "l7" in ep:
        out.update(protocol="rest", enforcement="enforce", access=ep["l7"])
        if "deny" in ep:
            out["deny_rules"] = [{"method": "*", "path": ep["deny"]}]
    return out


def render(rules: dict[str, Any], order: list[str], shuffle_inner: bool = False) -> str:
    body: dict[str, Any] = {}
    for key in order:
        r = rules[key]
        endpoints = [render_endpoint(ep) for ep in r["endpoints"]]
        binaries = [{"path": b} for b in r["binaries"]]
        if shuffle_inner:
            endpoints.reverse()
            binaries.reverse()
        body[key] = {"endpoints": endpoints, "binaries": binaries}
    return yaml.safe_dump({"version": 1, "network_policies": body}, sort_keys=False)


def decide(text: str, req: tuple[str, int, str, list[str], str, str]) -> tuple[Decision, Decision]:
    policy = compile_policy(load_policy_text(text))
    host, port, exe, ancestors, method, target = req
    first = decide_l4(policy, L4Request(host, port, BinaryIdentity(exe, None, tuple(ancestors))))
    return first, decide_l7(policy, first, method, target)


def essence(d: Decision) -> tuple[Any, ...]:
    """What must not depend on where things sit inside a rule (endpoint labels may)."""
    return (d.verdict, d.rule, d.reason, d.audit, d.l7, d.rules, d.tls_skip, d.exact_host, d.path)


@settings(max_examples=150, deadline=None)
@given(rules=rules_st, requests=st.lists(request_st, min_size=1, max_size=6), data=st.data())
def test_reordering_rules_never_changes_a_decision(
    rules: dict[str, Any], requests: list[Any], data: st.DataObject
) -> None:
    keys = list(rules)
    shuffled = data.draw(st.permutations(keys))
    a, b = render(rules, keys), render(rules, list(shuffled))
    c = render(rules, list(shuffled), shuffle_inner=True)
    for req in requests:
        da, db, dc = decide(a, req), decide(b, req), decide(c, req)
        assert da == db
        assert tuple(map(essence, da)) == tuple(map(essence, dc))


@settings(max_examples=100, deadline=None)
@given(rules=rules_st, requests=st.lists(request_st, min_size=2, max_size=8))
def test_decision_is_a_pure_function(rules: dict[str, Any], requests: list[Any]) -> None:
    text = render(rules, list(rules))
    policy = compile_policy(load_policy_text(text))
    fresh = compile_policy(load_policy_text(text))

    def run(p: Any, req: Any) -> tuple[Decision, Decision]:
        host, port, exe, ancestors, method, target = req
        d = decide_l4(p, L4Request(host, port, BinaryIdentity(exe, None, tuple(ancestors))))
        return d, decide_l7(p, d, method, target)

    first = [run(policy, req) for req in requests]
    second = [run(policy, req) for req in reversed(requests)]
    second.reverse()
    assert first == second == [run(fresh, req) for req in requests]


label = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=8)
glob_label = st.one_of(
    label, st.just("*"), st.builds(lambda a, b: a + "*" + b, st.text("abc-", max_size=3), st.text("xyz-", max_size=3))
)


@settings(max_examples=300, deadline=None)
@given(
    first=st.one_of(glob_label, st.just("**")),
    middle=st.lists(st.one_of(label, st.just("*")), max_size=3),
    tail=st.lists(label, min_size=0, max_size=2),
    fill=label,
)
def test_validator_and_matcher_agree(first: str, middle: list[str], tail: list[str], fill: str) -> None:
    raw = ".".join([first, *middle, *tail])
    host, problem = validate_policy_host(raw, tcp=False)
    if problem is not None:
        return
    if "*" not in host:
        return
    glob = compile_host_glob(host)
    # instantiate every wildcard with a concrete label: the result must match
    parts = host.split(".")
    concrete = [fill if p in ("*", "**") else p.replace("*", fill) for p in parts]
    assert glob.matches(".".join(concrete)), (host, concrete)
    # one more label in front: only '**' reaches it ('*' never crosses a dot)
    assert glob.matches(fill + "." + ".".join(concrete)) is (parts[0] == "**")


path_text = st.text(alphabet="/abc.;%2fFe5B?&=+", max_size=24)


@settings(max_examples=400, deadline=None)
@given(raw=path_text, allow=st.booleans())
def test_canonicalisation_is_idempotent(raw: str, allow: bool) -> None:
    try:
        first = canonicalize_target(raw, allow_encoded_slash=allow)
    except TargetError:
        return
    again = canonicalize_target(first.path, allow_encoded_slash=allow)
    assert again.path == first.path
    segments = first.path.split("/")
    assert "." not in segments and ".." not in segments
    assert first.path.startswith("/")


yaml_value = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-5, 70000),
        st.text(max_size=12),
        st.sampled_from(["rest", "tcp", "*.example.com", "/usr/bin/git", "read-only", "enforce", "skip"]),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(
            st.sampled_from(
                [
                    "version",
                    "network_policies",
                    "endpoints",
                    "binaries",
                    "host",
                    "port",
                    "ports",
                    "protocol",
                    "access",
                    "rules",
                    "allow",
                    "method",
                    "path",
                    "query",
                    "tls",
                    "allowed_ips",
                    "x",
                ]
            ),
            children,
            max_size=4,
        ),
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(value=yaml_value)
def test_any_structure_loads_or_raises_policy_invalid(value: Any) -> None:
    text = yaml.safe_dump(value)
    try:
        load_policy_text(text)
    except PolicyInvalid as exc:
        assert exc.errors


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=200))
def test_any_text_loads_or_raises_policy_invalid(text: str) -> None:
    try:
        load_policy_text(text)
    except PolicyInvalid as exc:
        assert exc.errors
