"""The compiled policy (``supervisor/control/policy/compiled.py``): what compilation makes of each endpoint and
rule, and what the index answers, each policy compiled inside its test.

A policy built at import time is compiled before mutmut forks a mutant from the process that ran the tests once,
so none of these policies lives at module level (docs/design.md "Mutation testing")."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.control.policy import (
    BinaryIdentity,
    CompiledPolicy,
    Protocol,
    compile_policy,
)
from supervisor.control.policy.compiled import MCP_PROFILE_METHODS, CompiledEndpoint, CompiledL7Rule
from supervisor.control.policy.globs import compile_host_glob, compile_path_glob, compile_value_glob
from supervisor.control.policy.model import Binary, Endpoint, NetworkRule, Policy

from .policy_helpers import CURL, GIT, PY, compiled, load, rule

H = {"host": "api.example.com", "port": 443, "enforcement": "enforce"}


def only_endpoint(endpoint: dict[str, Any]) -> CompiledEndpoint:
    (cep,) = compiled({"r": rule(endpoint)}).endpoints
    return cep


def v(pattern: str) -> Any:
    return compile_value_glob(pattern)


# --- L7 rules: each rule shape compiled to exactly these fields ---------------------------------------------

# (case, endpoint, allows, denies)
L7_SHAPES: list[tuple[str, dict[str, Any], tuple[CompiledL7Rule, ...], tuple[CompiledL7Rule, ...]]] = [
    (
        "rest-path-query",
        {
            **H,
            "protocol": "rest",
            "rules": [
                {"allow": {"method": "get", "path": "/repos/*", "query": {"ref": {"any": ["a*", "b"]}, "x": "y"}}}
            ],
        },
        (
            CompiledL7Rule(
                "rules[0]", "GET", compile_path_glob("/repos/*"), (("ref", (v("a*"), v("b"))), ("x", (v("y"),)))
            ),
        ),
        (),
    ),
    (
        "rest-every-path",
        {
            **H,
            "protocol": "rest",
            "rules": [{"allow": {"method": "POST", "path": "**"}}, {"allow": {"method": "*", "path": "/a"}}],
            "deny_rules": [{"method": "DELETE", "path": "/x/**"}, {"method": "PUT", "path": "**"}],
        },
        (CompiledL7Rule("rules[0]", "POST", None, ()), CompiledL7Rule("rules[1]", "*", compile_path_glob("/a"), ())),
        (
            CompiledL7Rule("deny_rules[0]", "DELETE", compile_path_glob("/x/**"), ()),
            CompiledL7Rule("deny_rules[1]", "PUT", None, ()),
        ),
    ),
    (
        "graphql-name-fields",
        {
            **H,
            "protocol": "graphql",
            "path": "/graphql",
            "rules": [
                {"allow": {"operation_type": "query", "operation_name": "Get*", "fields": ["viewer", "repo*"]}},
                {"allow": {"operation_type": "mutation"}},
            ],
            "deny_rules": [{"operation_type": "*", "fields": ["admin"]}],
        },
        (
            CompiledL7Rule(
                "rules[0]",
                "",
                None,
                (),
                operation_type="query",
                operation_name=v("Get*"),
                fields=(v("viewer"), v("repo*")),
            ),
            CompiledL7Rule("rules[1]", "", None, (), operation_type="mutation"),
        ),
        (CompiledL7Rule("deny_rules[0]", "", None, (), operation_type="*", fields=(v("admin"),)),),
    ),
    (
        "jsonrpc",
        {
            **H,
            "protocol": "json-rpc",
            "rules": [{"allow": {"method": "eth_call"}}, {"allow": {"method": "*"}}],
            "deny_rules": [{"method": "eth_sendTransaction"}],
        },
        (CompiledL7Rule("rules[0]", "eth_call", None, ()), CompiledL7Rule("rules[1]", "*", None, ())),
        (CompiledL7Rule("deny_rules[0]", "eth_sendTransaction", None, ()),),
    ),
    (
        "mcp-tools",
        {
            **H,
            "protocol": "mcp",
            "path": "/mcp",
            "rules": [
                {"allow": {"method": "tools/call", "tool": {"any": ["read_*", "echo"]}}},
                {"allow": {"method": "initialize"}},
            ],
            "deny_rules": [{"method": "tools/*"}],
        },
        (
            CompiledL7Rule("rules[0]", "tools/call", None, (), tool=(v("read_*"), v("echo"))),
            CompiledL7Rule("rules[1]", "initialize", None, ()),
        ),
        (CompiledL7Rule("deny_rules[0]", "tools/*", None, (), method_glob=v("tools/*")),),
    ),
    (
        "mcp-method-glob",
        {**H, "protocol": "mcp", "path": "/mcp", "rules": [{"allow": {"method": "tools/*"}}]},
        (CompiledL7Rule("rules[0]", "tools/*", None, (), method_glob=v("tools/*")),),
        (),
    ),
    (
        "mcp-profile-alone",
        {
            **H,
            "protocol": "mcp",
            "path": "/mcp",
            "mcp": {"allow_all_known_mcp_methods": True},
            "deny_rules": [{"tool": "delete_*"}],
        },
        (CompiledL7Rule("mcp:profile", "*", None, ()),),
        (CompiledL7Rule("deny_rules[0]", "tools/call", None, (), tool=(v("delete_*"),)),),
    ),
    (
        "mcp-profile-beside-rules",
        {
            **H,
            "protocol": "mcp",
            "path": "/mcp",
            "mcp": {"allow_all_known_mcp_methods": True},
            "rules": [{"allow": {"tool": "get_*"}}],
        },
        (
            CompiledL7Rule("rules[0]", "tools/call", None, (), tool=(v("get_*"),)),
            *(CompiledL7Rule("mcp:profile", m, None, ()) for m in MCP_PROFILE_METHODS),
        ),
        (),
    ),
    ("l4", {"host": "api.example.com", "port": 443}, (), ()),
    ("tcp", {"host": "git.example.com", "port": 22, "protocol": "tcp"}, (), ()),
]


@pytest.mark.parametrize(("case", "endpoint", "allows", "denies"), L7_SHAPES, ids=[c[0] for c in L7_SHAPES])
def test_l7_rules_compile_to(
    case: str, endpoint: dict[str, Any], allows: tuple[CompiledL7Rule, ...], denies: tuple[CompiledL7Rule, ...]
) -> None:
    cep = only_endpoint(endpoint)
    assert cep.allows == allows
    assert cep.denies == denies


PRESETS: list[tuple[str, str, tuple[CompiledL7Rule, ...]]] = [
    ("rest", "read-only", tuple(CompiledL7Rule("access:read-only", m, None, ()) for m in ("GET", "HEAD", "OPTIONS"))),
    (
        "rest",
        "read-write",
        tuple(
            CompiledL7Rule("access:read-write", m, None, ()) for m in ("GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH")
        ),
    ),
    ("rest", "full", (CompiledL7Rule("access:full", "*", None, ()),)),
    ("websocket", "read-only", (CompiledL7Rule("access:read-only", "GET", None, ()),)),
    (
        "websocket",
        "read-write",
        tuple(CompiledL7Rule("access:read-write", m, None, ()) for m in ("GET", "WEBSOCKET_TEXT")),
    ),
    ("websocket", "full", (CompiledL7Rule("access:full", "*", None, ()),)),
    ("graphql", "read-only", (CompiledL7Rule("access:read-only", "", None, (), operation_type="query"),)),
    (
        "graphql",
        "read-write",
        tuple(CompiledL7Rule("access:read-write", "", None, (), operation_type=t) for t in ("query", "mutation")),
    ),
    ("graphql", "full", (CompiledL7Rule("access:full", "", None, (), operation_type="*"),)),
]


@pytest.mark.parametrize(("protocol", "access", "allows"), PRESETS, ids=[f"{c[0]}-{c[1]}" for c in PRESETS])
def test_access_presets_expand_to(protocol: str, access: str, allows: tuple[CompiledL7Rule, ...]) -> None:
    cep = only_endpoint({**H, "protocol": protocol, "access": access})
    assert cep.allows == allows
    assert cep.denies == ()


# --- endpoints: what a decision reads, computed once ---------------------------------------------------------


def test_what_each_endpoint_carries() -> None:
    policy = compiled(
        {
            "b": rule(
                {**H, "protocol": "rest", "access": "full", "path": "/api/**"},
                {"host": "*.example.org", "ports": [80, 443], "tls": "skip"},
                {"host": "git.example.com", "port": 22, "protocol": "tcp"},
            ),
            "a": rule({"port": 8443, "allowed_ips": ["10.0.0.0/24"]}, {"host": "plain.example.com", "port": 80}),
        }
    )
    assert [r.key for r in policy.rules] == ["a", "b"]
    assert [r.position for r in policy.rules] == [0, 1]
    assert policy.rule_count == 2 and policy.endpoint_count == 5
    rows = [
        (c.rule.key, c.index, c.label, c.order, c.exact_name, c.extended, c.inspected, c.transparent, c.rank)
        for c in policy.endpoints
    ]
    assert rows == [
        ("a", 0, "a[0]", (0, 0), None, True, False, False, 0),
        ("a", 1, "a[1]", (0, 1), "plain.example.com", False, False, False, 0),
        ("b", 0, "b[0]", (1, 0), "api.example.com", True, True, False, 5),
        ("b", 1, "b[1]", (1, 1), None, True, False, False, 0),
        ("b", 2, "b[2]", (1, 2), "git.example.com", False, False, True, 0),
    ]
    hostless, plain, api, glob, tcp = policy.endpoints
    assert [c.endpoint for c in policy.endpoints] == [
        *policy.rules[0].rule.endpoints,
        *policy.rules[1].rule.endpoints,
    ]
    assert all(c.rule is policy.rules[c.order[0]] for c in policy.endpoints)
    assert (hostless.host_glob, plain.host_glob, api.host_glob, tcp.host_glob) == (None, None, None, None)
    assert glob.host_glob == compile_host_glob("*.example.org")
    assert api.path_glob == compile_path_glob("/api/**")
    assert [c.path_glob for c in (hostless, plain, glob, tcp)] == [None] * 4
    assert policy.has_tcp is True
    assert policy.policy is not None and policy.digest == policy.policy.digest
    assert policy.l4_memo == {}


@pytest.mark.parametrize(
    ("path", "rank", "glob"),
    [("", 0, False), ("**", 0, False), ("/a/*/b", 5, True), ("/graphql", 8, True), ("/x/**", 3, True)],
)
def test_endpoint_path_rank_and_glob(path: str, rank: int, glob: bool) -> None:
    cep = only_endpoint({**H, "protocol": "rest", "access": "full", **({"path": path} if path else {})})
    assert cep.rank == rank
    assert cep.path_glob == (compile_path_glob(path) if glob else None)


def test_no_tcp_endpoint() -> None:
    assert compiled({"r": rule({"host": "a.example.com", "port": 443})}).has_tcp is False


# --- binaries --------------------------------------------------------------------------------------------------


def test_binary_sets_and_their_loader_subsets() -> None:
    policy = compile_policy(
        load(
            {
                "r": {
                    "endpoints": [H],
                    "binaries": [
                        {"path": GIT},
                        {"path": CURL, "allow_loader_env": True},
                        {"path": "/opt/**/node"},
                        {"path": "/usr/local/bin/*", "allow_loader_env": True},
                    ],
                }
            }
        ),
        binary_aliases={CURL: ["/usr/bin/curl.real"], GIT: ["/usr/libexec/git"]},
    )
    (crule,) = policy.rules
    assert crule.exact_binaries == {GIT, "/usr/libexec/git", CURL, "/usr/bin/curl.real"}
    assert crule.loader_exact == {CURL, "/usr/bin/curl.real"}
    assert crule.glob_binaries == (compile_path_glob("/opt/**/node"), compile_path_glob("/usr/local/bin/*"))
    assert crule.loader_globs == (compile_path_glob("/usr/local/bin/*"),)
    assert crule.rule is policy.policy.network_policies[0]


def test_rules_with_the_same_binaries_share_one_set() -> None:
    policy = compiled(
        {
            "a": rule({"host": "a.example.com", "port": 443}, binaries=(GIT, "/usr/bin/*")),
            "b": rule({"host": "b.example.com", "port": 443}, binaries=(GIT, "/usr/bin/*")),
            "c": rule({"host": "c.example.com", "port": 443}, binaries=(CURL,)),
        }
    )
    a, b, c = policy.rules
    assert a.exact_binaries is b.exact_binaries and a.glob_binaries is b.glob_binaries
    assert a.loader_exact is b.loader_exact is c.loader_exact and a.loader_globs is c.loader_globs
    assert a.exact_binaries is not c.exact_binaries


def ident(path: str, *ancestors: str, loader: bool = False) -> BinaryIdentity:
    return BinaryIdentity(path, None, tuple(ancestors), (), ("LD_PRELOAD",) if loader else ())


# (case, identity, matches the plain rule, matches the rule whose entries opt in to loader variables)
BINARY_MATCHES: list[tuple[str, BinaryIdentity, bool, bool]] = [
    ("exact", ident(GIT), True, True),
    ("alias", ident("/usr/libexec/git"), True, True),
    ("exact-ancestor", ident("/bin/sh", "/bin/bash", GIT), True, True),
    ("glob", ident("/opt/a/b/node"), True, True),
    ("glob-ancestor", ident("/bin/sh", "/opt/x/node", "/bin/bash"), True, True),
    ("second-glob", ident("/srv/bin/tool"), False, True),
    ("second-glob-ancestor", ident("/bin/sh", "/bin/bash", "/srv/bin/tool"), False, True),
    ("neither", ident("/bin/sh", "/bin/bash"), False, False),
    ("cmdline-never", BinaryIdentity("/bin/sh", None, (), (GIT,)), False, False),
    ("loader-exact", ident(GIT, loader=True), False, True),
    ("loader-alias", ident("/usr/libexec/git", loader=True), False, True),
    ("loader-exact-ancestor", ident("/bin/sh", "/bin/bash", GIT, loader=True), False, True),
    ("loader-glob", ident("/opt/a/node", loader=True), False, True),
    ("loader-glob-ancestor", ident("/bin/sh", "/bin/x", "/opt/a/node", loader=True), False, True),
    ("loader-not-opted", ident("/srv/bin/tool", "/bin/sh", loader=True), False, False),
    ("loader-neither", ident("/bin/sh", "/bin/bash", loader=True), False, False),
]


@pytest.mark.parametrize(("case", "identity", "plain", "opted"), BINARY_MATCHES, ids=[c[0] for c in BINARY_MATCHES])
def test_binary_matches(case: str, identity: BinaryIdentity, plain: bool, opted: bool) -> None:
    policy = compile_policy(
        load(
            {
                "plain": {"endpoints": [H], "binaries": [{"path": GIT}, {"path": "/opt/**/node"}]},
                "opted": {
                    "endpoints": [{"host": "b.example.com", "port": 443}],
                    "binaries": [
                        {"path": GIT, "allow_loader_env": True},
                        {"path": "/opt/**/node", "allow_loader_env": True},
                        {"path": "/srv/bin/*"},
                    ],
                },
            }
        ),
        binary_aliases={GIT: ["/usr/libexec/git"]},
    )
    opted_rule, plain_rule = policy.rules
    assert plain_rule.binary_matches(identity) is plain
    assert opted_rule.binary_matches(identity) is opted


# --- the index -------------------------------------------------------------------------------------------------


def index_policy() -> CompiledPolicy:
    """Every kind of selector on shared ports; a hostless endpoint overlaps everything on its port, so every
    endpoint on 443 and 80 has its ``allowed_ips`` (docs/reference/policy.md §1.11)."""
    ips = {"allowed_ips": ["10.0.0.0/24"]}
    return compiled(
        {
            "a": rule(
                {"host": "*.b.example.com", "port": 443, **ips}, {"host": "x.y.z.example.com", "port": 443, **ips}
            ),
            "b": rule({"host": "**.example.com", "port": 443, **ips}, {"host": "api.example.*", "port": 443, **ips}),
            "c": rule({"host": "a.b.example.com", "ports": [443, 80], **ips}, {"port": 443, **ips}),
            "d": rule(
                {"host": "*.*.example.com", "port": 80, **ips},
                {"host": "git.example.com", "port": 22, "protocol": "tcp"},
            ),
            "e": rule(
                {"host": "exact.example.net", "port": 443, **ips}, {"port": 8443, "allowed_ips": ["10.1.0.0/24"]}
            ),
        }
    )


# (host, port, labels of the endpoints found, in order)
LOOKUPS: list[tuple[str, int, list[str]]] = [
    ("a.b.example.com", 443, ["a[0]", "b[0]", "c[0]", "c[1]"]),  # two globs, an exact name and a hostless one
    ("a.b.example.com", 80, ["c[0]", "d[0]"]),
    ("x.b.example.com", 443, ["a[0]", "b[0]", "c[1]"]),
    ("b.example.com", 443, ["b[0]", "c[1]"]),  # too short for *.b.example.com
    ("q.r.b.example.com", 443, ["b[0]", "c[1]"]),  # too deep for *.b.example.com
    ("x.y.z.example.com", 443, ["a[1]", "b[0]", "c[1]"]),
    ("api.example.org", 443, ["b[1]", "c[1]"]),  # the glob whose literal suffix is empty
    ("example.com", 443, ["c[1]"]),  # '**.' needs a label in front
    ("com", 443, ["c[1]"]),  # shorter than every literal suffix
    ("x.example.com", 80, []),  # *.*.example.com needs two labels in front
    ("p.q.example.com", 80, ["d[0]"]),
    ("exact.example.net", 443, ["c[1]", "e[0]"]),  # an exact name from a later rule than the hostless one
    ("exact.example.net", 80, []),
    ("10.0.0.5", 443, ["c[1]"]),
    ("10.0.0.5", 8443, ["e[1]"]),
    ("git.example.com", 22, ["d[1]"]),
    ("git.example.com", 443, ["b[0]", "c[1]"]),
    ("nowhere.test", 9, []),
]


@pytest.mark.parametrize(("host", "port", "labels"), LOOKUPS, ids=[f"{c[0]}:{c[1]}" for c in LOOKUPS])
def test_endpoints_for(host: str, port: int, labels: list[str]) -> None:
    policy = index_policy()
    found = policy.endpoints_for(host, port)
    assert isinstance(found, list)
    assert [c.label for c in found] == labels
    scan = [
        c for c in policy.endpoints
        if port in c.endpoint.ports
        and (not c.endpoint.host or (c.host_glob.matches(host) if c.host_glob else c.endpoint.host == host))
    ]  # fmt: skip
    assert found == scan


def test_endpoints_for_orders_an_exact_name_after_an_earlier_rules_glob() -> None:
    policy = compiled(
        {"a": rule({"host": "*.example.com", "port": 443}), "b": rule({"host": "api.example.com", "port": 443})}
    )
    assert [c.label for c in policy.endpoints_for("api.example.com", 443)] == ["a[0]", "b[0]"]


def test_endpoints_for_returns_a_fresh_list() -> None:
    policy = compiled({"a": rule({"host": "api.example.com", "port": 443})})
    first = policy.endpoints_for("api.example.com", 443)
    first.clear()
    assert [c.label for c in policy.endpoints_for("api.example.com", 443)] == ["a[0]"]


def test_without_globs_the_index_never_splits_the_host() -> None:
    ips = {"allowed_ips": ["10.0.0.0/24"]}
    policy = compiled({"a": rule({"host": "api.example.com", "port": 443, **ips}), "b": rule({"port": 443, **ips})})
    assert [c.label for c in policy.endpoints_for("api.example.com", 443)] == ["a[0]", "b[0]"]
    assert [c.label for c in policy.endpoints_for("other.example.com", 443)] == ["b[0]"]


# (host, transparent_only, labels)
NAMES: list[tuple[str, bool, list[str]]] = [
    ("a.b.example.com", False, ["a[0]", "b[0]", "c[0]", "d[0]"]),
    ("a.b.example.com", True, []),
    ("git.example.com", False, ["b[0]", "d[1]"]),
    ("git.example.com", True, ["d[1]"]),
    ("api.example.org", False, ["b[1]"]),
    ("b.example.com", False, ["b[0]"]),
    ("com", False, []),
    ("exact.example.net", False, ["e[0]"]),
    ("10.0.0.5", False, []),  # hostless endpoints never name a host
]


@pytest.mark.parametrize(("host", "transparent", "labels"), NAMES, ids=[f"{c[0]}-{c[1]}" for c in NAMES])
def test_endpoints_for_name(host: str, transparent: bool, labels: list[str]) -> None:
    found = index_policy().endpoints_for_name(host, transparent_only=transparent)
    assert isinstance(found, list)
    assert [c.label for c in found] == labels


def test_endpoints_for_name_is_tcp_only_when_asked() -> None:
    policy = compiled(
        {
            "a": rule({"host": "git.example.com", "port": 443}),
            "b": rule({"host": "git.example.com", "port": 22, "protocol": "tcp"}),
        }
    )
    assert [c.label for c in policy.endpoints_for_name("git.example.com")] == ["a[0]", "b[0]"]
    assert [c.endpoint.protocol for c in policy.endpoints_for_name("git.example.com", transparent_only=True)] == [
        Protocol.TCP
    ]


def test_endpoints_for_name_orders_by_rule() -> None:
    policy = compiled(
        {
            "a": rule({"host": "*.example.com", "port": 443}),
            "b": rule({"host": "api.example.com", "port": 80}),
            "c": rule({"host": "*.api.example.com", "port": 80}),
        }
    )
    assert [c.label for c in policy.endpoints_for_name("api.example.com")] == ["a[0]", "b[0]"]
    assert [c.label for c in policy.endpoints_for_name("x.api.example.com")] == ["c[0]"]


def test_the_aliases_argument_defaults_to_none() -> None:
    policy = load({"r": rule(H, binaries=(PY,))})
    assert compile_policy(policy).rules[0].exact_binaries == {PY}
    assert CompiledPolicy(policy).rules[0].exact_binaries == {PY}


@pytest.mark.parametrize(
    "protocol", [Protocol.REST, Protocol.WEBSOCKET, Protocol.GRAPHQL, Protocol.JSON_RPC, Protocol.MCP]
)
def test_an_inspected_endpoint_without_rules_or_access_allows_nothing(protocol: Protocol) -> None:
    """The schema refuses such an endpoint; compiled by hand it still grants nothing it was not given."""
    endpoint = Endpoint("a.example.com", (443,), protocol=protocol)
    policy = Policy(version=1, network_policies=(NetworkRule("r", "r", (endpoint,), (Binary(GIT),)),))
    (cep,) = compile_policy(policy).endpoints
    assert (cep.allows, cep.denies, cep.inspected) == ((), (), True)
