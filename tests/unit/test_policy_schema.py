"""Validation: every row of docs/reference/policy.md §1.10 (and the §6 decisions) rejects with the field's YAML path."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.control.policy import (
    AccessPreset,
    Enforcement,
    PolicyError,
    PolicyInvalid,
    Protocol,
    TlsMode,
    load_default_policy,
    load_policy_text,
)

from .policy_helpers import doc, load, rule

EP = "network_policies.r.endpoints[0]"
REST = {"protocol": "rest", "enforcement": "enforce"}


def errors_for(endpoint: dict[str, Any]) -> list[PolicyError]:
    with pytest.raises(PolicyInvalid) as info:
        load({"r": rule(endpoint)})
    return info.value.errors


# (row, endpoint, expected path, expected message fragment)
ENDPOINT_ERRORS: list[tuple[str, dict[str, Any], str, str]] = [
    ("V1", {"port": 443}, f"{EP}.host", "must not be empty unless allowed_ips"),
    ("V1-empty", {"host": "", "port": 443}, f"{EP}.host", "must not be empty"),
    ("V2", {"protocol": "tcp", "port": 22, "allowed_ips": ["10.0.0.0/8"]}, f"{EP}.host", "requires a DNS hostname"),
    ("V3", {"host": "10.1.2.3", "protocol": "tcp", "port": 22}, f"{EP}.host", "not an IP literal"),
    ("V4-dot", {"host": "git.example.com.", "protocol": "tcp", "port": 22}, f"{EP}.host", "trailing dot"),
    ("V4-space", {"host": "git .example.com", "protocol": "tcp", "port": 22}, f"{EP}.host", "whitespace"),
    ("V4-label", {"host": "git..example.com", "protocol": "tcp", "port": 22}, f"{EP}.host", "invalid host"),
    ("V5-none", {"host": "a.example.com"}, f"{EP}.ports", "at least one port"),
    ("V5-empty", {"host": "a.example.com", "ports": []}, f"{EP}.ports", "at least one port"),
    ("V6-zero", {"host": "a.example.com", "port": 0}, f"{EP}.port", "invalid port 0"),
    ("V6-high", {"host": "a.example.com", "ports": [443, 65536]}, f"{EP}.ports[1]", "invalid port 65536"),
    ("V6-type", {"host": "a.example.com", "port": "443"}, f"{EP}.port", "expected an integer"),
    ("V6-bool", {"host": "a.example.com", "port": True}, f"{EP}.port", "expected an integer"),
    ("V7", {"host": "a.example.com", "port": 443, "ports": [443]}, f"{EP}.ports", "mutually exclusive"),
    ("V8-star", {"host": "*", "port": 443}, f"{EP}.host", "matches all hosts"),
    ("V8-double", {"host": "**", "port": 443}, f"{EP}.host", "matches all hosts"),
    ("V9-com", {"host": "*.com", "port": 443}, f"{EP}.host", "TLD wildcard"),
    ("V9-org", {"host": "**.org", "port": 443}, f"{EP}.host", "TLD wildcard"),
    ("V9-two-stars", {"host": "*.*.com", "port": 443}, f"{EP}.host", "TLD wildcard"),
    ("V10-infix", {"host": "foo**.x.com", "port": 443}, f"{EP}.host", "'**' is only allowed"),
    ("V10-middle", {"host": "foo.**.x.com", "port": 443}, f"{EP}.host", "'**' is only allowed"),
    ("V11", {"host": "foo.us-*.x.com", "port": 443}, f"{EP}.host", "must be the entire label"),
    ("V12", {"host": "a.example.com", "port": 21, "protocol": "ftp"}, f"{EP}.protocol", "unknown protocol"),
    (
        "V13",
        {
            "host": "a.example.com",
            "port": 443,
            **REST,
            "access": "full",
            "rules": [{"allow": {"method": "GET", "path": "**"}}],
        },
        f"{EP}.rules",
        "mutually exclusive",
    ),
    ("V16", {"host": "a.example.com", "port": 443, **REST}, f"{EP}.protocol", "requires rules or access"),
    (
        "V16-ws",
        {"host": "a.example.com", "port": 443, "protocol": "websocket"},
        f"{EP}.protocol",
        "requires rules or access",
    ),
    ("V18", {"host": "a.example.com", "port": 443, **REST, "rules": [{}]}, f"{EP}.rules", "would deny all traffic"),
    (
        "V19",
        {"host": "a.example.com", "port": 443, "deny_rules": [{"method": "GET", "path": "**"}]},
        f"{EP}.deny_rules",
        "require protocol",
    ),
    (
        "V20",
        {"host": "a.example.com", "port": 443, **REST, "deny_rules": [{"method": "GET", "path": "**"}]},
        f"{EP}.deny_rules",
        "require rules or access",
    ),
    ("V21", {"host": "a.example.com", "port": 443, **REST, "rules": []}, f"{EP}.rules", "cannot be empty"),
    (
        "V22",
        {"host": "a.example.com", "port": 443, **REST, "access": "full", "deny_rules": []},
        f"{EP}.deny_rules",
        "cannot be empty",
    ),
    (
        "V23",
        {"host": "git.example.com", "port": 22, "protocol": "tcp", "path": "/x", "access": "full"},
        f"{EP}.protocol",
        "does not support L7-only fields: path, access",
    ),
    (
        "V24",
        {"host": "a.example.com", "port": 443, **REST, "access": "full", "path": "api/**"},
        f"{EP}.path",
        "must start with '/'",
    ),
    (
        "V33-keys",
        {
            "host": "a.example.com",
            "port": 443,
            **REST,
            "rules": [{"allow": {"method": "GET", "path": "**", "query": {"q": {"regex": "x"}}}}],
        },
        f"{EP}.rules[0].allow.query.q",
        "only `glob` or `any`",
    ),
    (
        "V33-both",
        {
            "host": "a.example.com",
            "port": 443,
            **REST,
            "rules": [{"allow": {"method": "GET", "path": "**", "query": {"q": {"glob": "a", "any": ["b"]}}}}],
        },
        f"{EP}.rules[0].allow.query.q",
        "both",
    ),
    (
        "V33-empty-any",
        {
            "host": "a.example.com",
            "port": 443,
            **REST,
            "rules": [{"allow": {"method": "GET", "path": "**", "query": {"q": {"any": []}}}}],
        },
        f"{EP}.rules[0].allow.query.q.any",
        "must not be empty",
    ),
    (
        "V33-type",
        {
            "host": "a.example.com",
            "port": 443,
            **REST,
            "rules": [{"allow": {"method": "GET", "path": "**", "query": {"q": 5}}}],
        },
        f"{EP}.rules[0].allow.query.q",
        "expected a string",
    ),
    ("V34-bad", {"port": 443, "allowed_ips": ["10.0.0.0/33"]}, f"{EP}.allowed_ips[0]", "invalid allowed_ips"),
    (
        "V34-loopback",
        {"host": "a.example.com", "port": 443, "allowed_ips": ["127.0.0.1"]},
        f"{EP}.allowed_ips[0]",
        "always-blocked",
    ),
    (
        "V34-linklocal",
        {"host": "a.example.com", "port": 443, "allowed_ips": ["169.254.169.254/32"]},
        f"{EP}.allowed_ips[0]",
        "always-blocked",
    ),
    (
        "V34-all",
        {"host": "a.example.com", "port": 443, "allowed_ips": ["0.0.0.0/0"]},
        f"{EP}.allowed_ips[0]",
        "always-blocked",
    ),
    (
        "V34-v6",
        {"host": "a.example.com", "port": 443, "allowed_ips": ["fe80::/64"]},
        f"{EP}.allowed_ips[0]",
        "always-blocked",
    ),
    (
        "V34-v6-all",
        {"host": "a.example.com", "port": 443, "allowed_ips": ["::/0"]},
        f"{EP}.allowed_ips[0]",
        "always-blocked",
    ),
    (
        "V34-mapped",
        {"host": "a.example.com", "port": 443, "allowed_ips": ["::ffff:127.0.0.1"]},
        f"{EP}.allowed_ips[0]",
        "always-blocked",
    ),
    (
        "D11-preset",
        {"host": "a.example.com", "port": 443, **REST, "access": "read-mostly"},
        f"{EP}.access",
        "unknown access preset",
    ),
    (
        "D13-tls-skip",
        {"host": "a.example.com", "port": 443, **REST, "access": "full", "tls": "skip"},
        f"{EP}.tls",
        "never inspect",
    ),
    (
        "L4-access",
        {"host": "a.example.com", "port": 443, "access": "read-only"},
        f"{EP}.access",
        "without an L7 protocol",
    ),
    ("unknown-key", {"host": "a.example.com", "port": 443, "hots": "x"}, f"{EP}.hots", "did you mean 'host'"),
    ("tls-unknown", {"host": "a.example.com", "port": 443, "tls": "strict"}, f"{EP}.tls", "unknown tls"),
    (
        "enforcement-unknown",
        {"host": "a.example.com", "port": 443, **REST, "access": "full", "enforcement": "block"},
        f"{EP}.enforcement",
        "unknown enforcement",
    ),
    ("host-port", {"host": "api.github.com:443", "port": 443}, f"{EP}.host", "must not include a port"),
    ("host-url", {"host": "https://api.github.com", "port": 443}, f"{EP}.host", "not a URL"),
    (
        "rule-method-missing",
        {"host": "a.example.com", "port": 443, **REST, "rules": [{"allow": {"path": "**"}}]},
        f"{EP}.rules[0].allow.method",
        "missing required key 'method'",
    ),
    (
        "rule-path-missing",
        {"host": "a.example.com", "port": 443, **REST, "rules": [{"allow": {"method": "GET"}}]},
        f"{EP}.rules[0].allow.path",
        "missing required key 'path'",
    ),
    (
        "rule-glob-unbalanced",
        {"host": "a.example.com", "port": 443, **REST, "rules": [{"allow": {"method": "GET", "path": "/a/[b"}}]},
        f"{EP}.rules[0].allow.path",
        "unbalanced '['",
    ),
    (
        "rule-brace-unbalanced",
        {"host": "a.example.com", "port": 443, **REST, "rules": [{"allow": {"method": "GET", "path": "/a/{b,c"}}]},
        f"{EP}.rules[0].allow.path",
        "unbalanced '{'",
    ),
    (
        "rule-method-token",
        {"host": "a.example.com", "port": 443, **REST, "rules": [{"allow": {"method": "GE T", "path": "**"}}]},
        f"{EP}.rules[0].allow.method",
        "invalid HTTP method",
    ),
]


@pytest.mark.parametrize(("row", "endpoint", "path", "fragment"), ENDPOINT_ERRORS, ids=[c[0] for c in ENDPOINT_ERRORS])
def test_endpoint_rule_rejected(row: str, endpoint: dict[str, Any], path: str, fragment: str) -> None:
    errors = errors_for(endpoint)
    assert any(e.path == path and fragment in e.message for e in errors), [str(e) for e in errors]
    assert all(e.source == "test.yaml" and e.line is not None for e in errors)


# D16 and the V35, V38, V39 rows: features not built yet are refused by name (the GraphQL, JSON-RPC and MCP
# rows are in test_policy_protocols.py).
NOT_YET: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "V35-sql",
        {"host": "db.example.com", "port": 5432, "protocol": "sql", "enforcement": "enforce"},
        f"{EP}.protocol",
        "SQL",
    ),
    (
        "V38-internal",
        {"host": "a.example.com", "port": 443, "provider_credentialed": True},
        f"{EP}.provider_credentialed",
        "gateway-internal",
    ),
]


@pytest.mark.parametrize(("row", "endpoint", "path", "fragment"), NOT_YET, ids=[c[0] for c in NOT_YET])
def test_unbuilt_feature_refused_by_name(row: str, endpoint: dict[str, Any], path: str, fragment: str) -> None:
    errors = errors_for(endpoint)
    assert any(e.path == path and fragment in e.message and "not supported yet" in e.message for e in errors), [
        str(e) for e in errors
    ]


def test_v39_middleware_refused() -> None:
    text = doc({}, network_middlewares={"m": {"middleware": "x", "endpoints": {"include": ["a.example.com"]}}})
    with pytest.raises(PolicyInvalid) as info:
        load_policy_text(text)
    assert [e.path for e in info.value.errors] == ["network_middlewares"]
    assert "not supported yet" in info.value.errors[0].message


TOP_ERRORS: list[tuple[str, str, str, str]] = [
    ("D1-missing", "network_policies: {}\n", "version", "missing required key 'version'"),
    ("D1-two", "version: 2\n", "version", "unsupported policy version 2"),
    ("D1-string", "version: '1'\n", "version", "expected an integer"),
    ("unknown-top", "version: 1\nnetwork_policy: {}\n", "network_policy", "did you mean 'network_policies'"),
    ("not-mapping", "- a\n- b\n", "", "expected a mapping"),
    ("empty", "", "", "policy is empty"),
    ("syntax", "version: 1\nnetwork_policies: {a: [}\n", "", "YAML syntax error"),
    ("duplicate", "version: 1\nversion: 1\n", "version", "duplicate key"),
    (
        "merge-key",
        "version: 1\nnetwork_policies:\n  a: &x {endpoints: []}\n  b:\n    <<: *x\n",
        "network_policies.b",
        "merge keys",
    ),
    (
        "V37",
        "version: 1\nnetwork_policies:\n  _provider_x: {endpoints: [], binaries: []}\n",
        "network_policies._provider_x",
        "reserved",
    ),
    (
        "rule-key",
        "version: 1\nnetwork_policies:\n  'a b': {endpoints: [], binaries: []}\n",
        "network_policies.a b",
        "invalid rule key",
    ),
    (
        "rule-unknown",
        "version: 1\nnetwork_policies:\n  a: {endpoint: [], binaries: []}\n",
        "network_policies.a.endpoint",
        "did you mean 'endpoints'",
    ),
    (
        "binary-relative",
        "version: 1\nnetwork_policies:\n  a: {endpoints: [], binaries: [{path: git}]}\n",
        "network_policies.a.binaries[0].path",
        "not absolute",
    ),
    (
        "binary-missing",
        "version: 1\nnetwork_policies:\n  a: {endpoints: [], binaries: [{harness: true}]}\n",
        "network_policies.a.binaries[0].path",
        "missing required key 'path'",
    ),
    (
        "fs-relative",
        "version: 1\nfilesystem_policy: {read_only: [usr]}\n",
        "filesystem_policy.read_only[0]",
        "not absolute",
    ),
    (
        "fs-dotdot",
        "version: 1\nfilesystem_policy: {read_write: [/tmp/../etc]}\n",
        "filesystem_policy.read_write[0]",
        "'..'",
    ),
    (
        "fs-root-rw",
        "version: 1\nfilesystem_policy: {read_write: [//]}\n",
        "filesystem_policy.read_write[0]",
        "root directory",
    ),
    (
        "fs-proc-rw",
        "version: 1\nfilesystem_policy: {read_write: [/proc]}\n",
        "filesystem_policy.read_write[0]",
        "/proc",
    ),
    (
        "fs-proc-pid-rw",
        "version: 1\nfilesystem_policy: {read_write: [/tmp, //proc/./1/mem]}\n",
        "filesystem_policy.read_write[1]",
        "/proc",
    ),
    (
        "fs-bool",
        "version: 1\nfilesystem_policy: {include_workdir: 'yes please'}\n",
        "filesystem_policy.include_workdir",
        "expected a boolean",
    ),
    ("landlock", "version: 1\nlandlock: {compatibility: strict}\n", "landlock.compatibility", "unknown compatibility"),
    ("process-root", "version: 1\nprocess: {run_as_user: 0}\n", "process.run_as_user", "invalid id"),
    ("process-max", "version: 1\nprocess: {run_as_group: 4294967295}\n", "process.run_as_group", "invalid id"),
    ("process-name", "version: 1\nprocess: {run_as_user: nobody}\n", "process.run_as_user", "invalid id"),
]


@pytest.mark.parametrize(("row", "text", "path", "fragment"), TOP_ERRORS, ids=[c[0] for c in TOP_ERRORS])
def test_document_rule_rejected(row: str, text: str, path: str, fragment: str) -> None:
    with pytest.raises(PolicyInvalid) as info:
        load_policy_text(text, "t.yaml")
    assert any(e.path == path and fragment in e.message for e in info.value.errors), [str(e) for e in info.value.errors]


def test_too_many_filesystem_paths() -> None:
    paths = [f"/p{i}" for i in range(257)]
    with pytest.raises(PolicyInvalid) as info:
        load_policy_text(doc({}, filesystem_policy={"read_only": paths}))
    assert any(e.path == "filesystem_policy" and "at most 256" in e.message for e in info.value.errors)


def test_every_error_listed_with_line_numbers() -> None:
    text = """version: 1
network_policies:
  gh:
    endpoints:
      - host: api.github.com
        ports: [443, 70000]
      - host: "*.com"
        port: 443
    binaries:
      - path: git
"""
    with pytest.raises(PolicyInvalid) as info:
        load_policy_text(text, "p.yaml")
    rendered = [str(e) for e in info.value.errors]
    assert rendered == [
        "p.yaml:6: network_policies.gh.endpoints[0].ports[1]: invalid port 70000 (expected 1..=65535)",
        "p.yaml:7: network_policies.gh.endpoints[1].host: TLD wildcard '*.com' is not allowed "
        "(a host glob needs three or more labels: *.example.com)",
        "p.yaml:10: network_policies.gh.binaries[0].path: binary path 'git' is not absolute "
        "(expected an absolute path such as /usr/bin/git)",
    ]
    assert "3 errors" in str(info.value)


def test_errors_across_rules_are_all_reported() -> None:
    bad = {"host": "*", "port": 443}
    with pytest.raises(PolicyInvalid) as info:
        load(
            {
                "a": {"endpoints": [bad], "binaries": [{"path": "/x"}]},
                "b": {"endpoints": [bad], "binaries": [{"path": "/x"}]},
            }
        )
    assert sorted(e.path for e in info.value.errors) == [
        "network_policies.a.endpoints[0].host",
        "network_policies.b.endpoints[0].host",
    ]


# --- what is accepted, and how it is normalised ---------------------------------------------------------


def test_normalisation() -> None:
    policy = load(
        {
            "gh": rule(
                {
                    "host": "API.GitHub.COM.",
                    "port": 443,
                    "protocol": "REST",
                    "access": "read-only",
                    "enforcement": "enforce",
                    "tls": "auto",
                },
                {"host": "[2001:DB8::1]", "ports": [80, 80, 8080]},
                {"host": "bücher.example", "port": 443},
            )
        }
    )
    ep0, ep1, ep2 = policy.network_policies[0].endpoints
    assert (ep0.host, ep0.ports, ep0.protocol, ep0.access, ep0.enforcement, ep0.tls) == (
        "api.github.com",
        (443,),
        Protocol.REST,
        AccessPreset.READ_ONLY,
        Enforcement.ENFORCE,
        TlsMode.AUTO,
    )
    assert (ep1.host, ep1.ports) == ("2001:db8::1", (80, 8080))
    assert ep2.host == "xn--bcher-kva.example"
    assert policy.network_policies[0].name == "gh"


def test_hostless_endpoint_with_allowed_ips_is_valid() -> None:
    policy = load({"lan": rule({"port": 443, "allowed_ips": ["10.0.0.0/8", "10.1.2.3"]})})
    ep = policy.network_policies[0].endpoints[0]
    assert ep.host == "" and ep.allowed_ips == ("10.0.0.0/8", "10.1.2.3/32")


WARNINGS: list[tuple[str, dict[str, Any], str]] = [
    ("D14-audit", {"host": "a.example.com", "port": 443, "protocol": "rest", "access": "full"}, "audit mode"),
    ("tls-deprecated", {"host": "a.example.com", "port": 443, "tls": "terminate"}, "deprecated"),
    ("broad-cidr", {"host": "a.example.com", "port": 443, "allowed_ips": ["10.0.0.0/8"]}, "very broad"),
    (
        "method",
        {"host": "a.example.com", "port": 443, **REST, "rules": [{"allow": {"method": "PROPFIND", "path": "**"}}]},
        "unusual",
    ),
    ("slash-on-l4", {"host": "a.example.com", "port": 443, "allow_encoded_slash": True}, "no effect"),
]


@pytest.mark.parametrize(("row", "endpoint", "fragment"), WARNINGS, ids=[c[0] for c in WARNINGS])
def test_warnings(row: str, endpoint: dict[str, Any], fragment: str) -> None:
    policy = load({"r": rule(endpoint)})
    assert any(fragment in w.message for w in policy.warnings), policy.warnings


def test_rule_without_binaries_warns() -> None:
    policy = load({"r": {"endpoints": [{"host": "a.example.com", "port": 443}]}})
    assert any("never matches" in w.message for w in policy.warnings)


def test_harness_flag_accepted_and_ignored() -> None:
    policy = load(
        {
            "r": {
                "endpoints": [{"host": "a.example.com", "port": 443}],
                "binaries": [{"path": "/bin/x", "harness": True}],
            }
        }
    )
    assert policy.network_policies[0].binaries[0].path == "/bin/x"


def test_static_sections() -> None:
    policy = load(
        {},
        filesystem_policy={"include_workdir": True, "read_only": ["/usr"], "read_write": ["/tmp"]},
        landlock={"compatibility": "hard_requirement"},
        process={"run_as_user": "sandbox", "run_as_group": "1000"},
    )
    assert policy.static_json() == {
        "filesystem_policy": {"include_workdir": True, "read_only": ["/usr"], "read_write": ["/tmp"]},
        "landlock": {"compatibility": "hard_requirement"},
        "process": {"run_as_user": "sandbox", "run_as_group": "1000"},
    }


def test_round_trip_through_to_json() -> None:
    import yaml

    policy = load(
        {
            "gh": rule(
                {
                    "host": "api.github.com",
                    "port": 443,
                    **REST,
                    "rules": [
                        {
                            "allow": {
                                "method": "get",
                                "path": "/repos/**",
                                "query": {"ref": {"any": ["a", "b"]}, "x": "y*"},
                            }
                        }
                    ],
                    "deny_rules": [{"method": "POST", "path": "/admin/**"}],
                },
                {"host": "*.example.com", "ports": [80, 443], "tls": "skip", "allowed_ips": ["10.0.0.0/24"]},
            ),
            "dns": rule(
                {"host": "git.example.org", "port": 22, "protocol": "tcp"}, binaries=("/usr/bin/ssh",), name="ssh"
            ),
        },
        process={"run_as_user": 1000},
    )
    again = load_policy_text(yaml.safe_dump(policy.to_json()))
    assert again == policy
    assert again.digest == policy.digest


def test_digest_ignores_formatting_and_rule_order() -> None:
    a = load_policy_text(
        "version: 1\nnetwork_policies:\n  a: {endpoints: [{host: x.example.com, port: 1}], "
        "binaries: [{path: /x}]}\n  b: {endpoints: [{host: y.example.com, port: 2}], "
        "binaries: [{path: /y}]}\n"
    )
    b = load_policy_text(
        "# comment\nversion: 1\nnetwork_policies:\n  b:\n    endpoints:\n      - host: Y.example.com\n"
        "        ports: [2]\n    binaries: [{path: /y}]\n  a:\n    endpoints: [{host: x.example.com, "
        "port: 1}]\n    binaries: [{path: /x}]\n"
    )
    assert a.digest == b.digest


def test_json_is_accepted() -> None:
    policy = load_policy_text(
        '{"version": 1, "network_policies": {"a": {"endpoints": [{"host": "a.example.com", '
        '"port": 443}], "binaries": [{"path": "/x"}]}}}'
    )
    assert policy.rule_count == 1


def test_default_policy_denies_everything_and_loads_from_package_data() -> None:
    policy = load_default_policy()
    assert policy.version == 1 and policy.network_policies == ()
    assert policy.static_json()["landlock"] == {"compatibility": "best_effort"}


# --- ambiguity (V36, §1.11) -----------------------------------------------------------------------------

AMBIGUOUS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("exact-tls", {"host": "a.example.com", "port": 443, "tls": "skip"}, {"host": "a.example.com", "port": 443}),
    ("glob-tls", {"host": "*.example.com", "port": 443, "tls": "skip"}, {"host": "api.example.com", "port": 443}),
    (
        "glob-glob-ips",
        {"host": "**.example.com", "port": 443, "allowed_ips": ["10.0.0.0/24"]},
        {"host": "*.example.com", "port": 443},
    ),
    (
        "tcp-vs-proxy",
        {"host": "git.example.com", "port": 22, "protocol": "tcp"},
        {"host": "git.example.com", "ports": [22, 443]},
    ),
    ("hostless", {"port": 443, "allowed_ips": ["10.0.0.0/24"]}, {"host": "x.example.org", "port": 443}),
    (
        "enforcement",
        {"host": "a.example.com", "port": 443, **REST, "access": "full"},
        {"host": "a.example.com", "port": 443, "protocol": "rest", "enforcement": "audit", "access": "full"},
    ),
    (
        "encoded-slash",
        {"host": "a.example.com", "port": 443, **REST, "access": "full", "path": "/api/**"},
        {
            "host": "a.example.com",
            "port": 443,
            **REST,
            "access": "full",
            "path": "/api/**",
            "allow_encoded_slash": True,
        },
    ),
]


@pytest.mark.parametrize(("row", "first", "second"), AMBIGUOUS, ids=[c[0] for c in AMBIGUOUS])
def test_ambiguous_overlaps_rejected(row: str, first: dict[str, Any], second: dict[str, Any]) -> None:
    with pytest.raises(PolicyInvalid) as info:
        load({"a": rule(first), "b": rule(second, binaries=("/usr/bin/other",))})
    errors = info.value.errors
    assert len(errors) == 1 and "ambiguity" in errors[0].message, [str(e) for e in errors]
    assert errors[0].path == "network_policies.b.endpoints[0]"
    assert "network_policies.a.endpoints[0]" in errors[0].message


NOT_AMBIGUOUS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("other-port", {"host": "a.example.com", "port": 443, "tls": "skip"}, {"host": "a.example.com", "port": 80}),
    ("other-host", {"host": "*.example.com", "port": 443, "tls": "skip"}, {"host": "example.com", "port": 443}),
    ("deeper-host", {"host": "*.example.com", "port": 443, "tls": "skip"}, {"host": "a.b.example.com", "port": 443}),
    (
        "disjoint-globs",
        {"host": "api-*.example.com", "port": 443, "tls": "skip"},
        {"host": "web*.example.com", "port": 443},
    ),
    (
        "l4-over-l7",
        {"host": "a.example.com", "port": 443},
        {"host": "a.example.com", "port": 443, **REST, "access": "full"},
    ),
    (
        "rules-differ",
        {"host": "a.example.com", "port": 443, **REST, "access": "read-only"},
        {"host": "a.example.com", "port": 443, **REST, "access": "full"},
    ),
    (
        "path-specificity",
        {"host": "a.example.com", "port": 443, **REST, "access": "full"},
        {"host": "a.example.com", "port": 443, "protocol": "rest", "access": "full", "path": "/graphql"},
    ),
    (
        "disjoint-paths",
        {"host": "a.example.com", "port": 443, **REST, "access": "full", "path": "/repos/**"},
        {"host": "a.example.com", "port": 443, "protocol": "rest", "access": "full", "path": "/gists/**"},
    ),
]


@pytest.mark.parametrize(("row", "first", "second"), NOT_AMBIGUOUS, ids=[c[0] for c in NOT_AMBIGUOUS])
def test_allowed_overlaps(row: str, first: dict[str, Any], second: dict[str, Any]) -> None:
    load({"a": rule(first), "b": rule(second, binaries=("/usr/bin/other",))})


def test_ambiguity_check_is_linear_for_uniform_metadata() -> None:
    import time

    rules = {
        f"r{i}": rule({"host": f"h{i}.example.com", "port": 443}, {"host": f"*.s{i}.example.com", "port": 443})
        for i in range(2000)
    }
    started = time.perf_counter()
    policy = load(rules)
    assert policy.endpoint_count == 4000
    assert time.perf_counter() - started < 30  # generous: only guards against a quadratic blow-up
