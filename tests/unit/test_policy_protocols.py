"""The agent's own protocols in a policy (docs/reference/policy.md §1.4-1.6, §1.10): one valid policy for every rule
shape of GraphQL, JSON-RPC and MCP, and one refused policy for every one of V14-V27 and V29-V32, with our message."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.control.policy import PolicyInvalid, Protocol, compile_policy, load_policy_text

from .policy_helpers import doc, load, rule

EP = "network_policies.r.endpoints[0]"
H = {"host": "api.example.com", "port": 443, "enforcement": "enforce"}
GQL = {**H, "protocol": "graphql", "path": "/graphql"}
RPC = {**H, "protocol": "json-rpc"}
MCP = {**H, "protocol": "mcp", "path": "/mcp"}
PROFILE = {"allow_all_known_mcp_methods": True}

VALID: list[tuple[str, dict[str, Any]]] = [
    (
        "websocket-graphql",
        {
            **H,
            "protocol": "websocket",
            "path": "/graphql",
            "rules": [
                {"allow": {"method": "GET", "path": "/graphql"}},
                {"allow": {"operation_type": "subscription"}},
                {"allow": {"operation_type": "query", "fields": ["viewer"]}},
            ],
            "deny_rules": [{"operation_type": "subscription", "fields": ["secret*"]}],
        },
    ),
    ("graphql-allow", {**GQL, "rules": [{"allow": {"operation_type": "query"}}]}),
    (
        "graphql-allow-name-fields",
        {
            **GQL,
            "rules": [
                {"allow": {"operation_type": "query", "operation_name": "Get*", "fields": ["viewer", "repository"]}}
            ],
        },
    ),
    (
        "graphql-deny",
        {**GQL, "access": "read-write", "deny_rules": [{"operation_type": "mutation", "fields": ["delete*"]}]},
    ),
    ("graphql-deny-any-type", {**GQL, "access": "full", "deny_rules": [{"operation_type": "*", "fields": ["admin"]}]}),
    ("graphql-read-only", {**GQL, "access": "read-only"}),
    ("graphql-read-write", {**GQL, "access": "read-write"}),
    ("graphql-full", {**GQL, "access": "full"}),
    (
        "graphql-persisted",
        {
            **GQL,
            "access": "read-only",
            "persisted_queries": "allow_registered",
            "graphql_persisted_queries": {
                "abc123": {"operation_type": "query", "operation_name": "Viewer", "fields": ["viewer"]}
            },
        },
    ),
    ("graphql-persisted-deny", {**GQL, "access": "read-only", "persisted_queries": "deny"}),
    ("graphql-body-limit", {**GQL, "access": "read-only", "graphql_max_body_bytes": 4096}),
    ("jsonrpc-allow", {**RPC, "rules": [{"allow": {"method": "eth_blockNumber"}}]}),
    ("jsonrpc-star", {**RPC, "rules": [{"allow": {"method": "*"}}], "deny_rules": [{"method": "eth_sendTransaction"}]}),
    ("jsonrpc-limit", {**RPC, "rules": [{"allow": {"method": "a"}}], "json_rpc": {"max_body_bytes": 1024}}),
    ("mcp-method", {**MCP, "rules": [{"allow": {"method": "initialize"}}, {"allow": {"method": "tools/list"}}]}),
    ("mcp-tools-glob", {**MCP, "rules": [{"allow": {"method": "tools/*"}}]}),
    ("mcp-tool-glob", {**MCP, "rules": [{"allow": {"method": "tools/call", "tool": "read_*"}}]}),
    ("mcp-tool-any", {**MCP, "rules": [{"allow": {"method": "tools/call", "tool": {"any": ["a", "b"]}}}]}),
    ("mcp-params-name", {**MCP, "rules": [{"allow": {"method": "tools/call", "params": {"name": "a"}}}]}),
    ("mcp-profile", {**MCP, "mcp": PROFILE}),
    ("mcp-profile-tool", {**MCP, "mcp": PROFILE, "rules": [{"allow": {"tool": {"any": ["get_weather", "echo"]}}}]}),
    ("mcp-profile-deny", {**MCP, "mcp": PROFILE, "deny_rules": [{"tool": "delete_*"}]}),
    (
        "mcp-options",
        {
            **MCP,
            "rules": [{"allow": {"method": "tools/call", "tool": "a"}}],
            "mcp": {"max_body_bytes": 2048, "strict_tool_names": False},
        },
    ),
    (
        "mcp-deny-tool",
        {**MCP, "rules": [{"allow": {"method": "*"}}], "deny_rules": [{"method": "tools/call", "tool": "rm"}]},
    ),
]


@pytest.mark.parametrize(("name", "endpoint"), VALID, ids=[v[0] for v in VALID])
def test_valid_rule_shape(name: str, endpoint: dict[str, Any]) -> None:
    policy = load({"r": rule(endpoint)})
    ep = policy.network_policies[0].endpoints[0]
    assert ep.protocol in (Protocol.GRAPHQL, Protocol.JSON_RPC, Protocol.MCP, Protocol.WEBSOCKET)
    compiled = compile_policy(policy)
    assert compiled.endpoints[0].allows, "every valid shape allows something"
    again = load_policy_text(doc({"r": policy.network_policies[0].to_json()}))
    assert again == policy  # to_json gives back what the author meant


def _refused(endpoint: dict[str, Any]) -> list[str]:
    with pytest.raises(PolicyInvalid) as info:
        load({"r": rule(endpoint)})
    assert all(e.source == "test.yaml" and e.line is not None for e in info.value.errors)
    return [f"{e.path}: {e.message}" for e in info.value.errors]


REFUSED: list[tuple[str, dict[str, Any], str, str]] = [
    ("V14-jsonrpc", {**RPC, "access": "full"}, f"{EP}.access", "protocol json-rpc does not support access presets"),
    ("V14-mcp", {**MCP, "access": "read-only"}, f"{EP}.access", "protocol mcp does not support access presets"),
    ("V15", dict(RPC), f"{EP}.protocol", "protocol json-rpc requires explicit rules with allow.method"),
    ("V16-graphql", dict(GQL), f"{EP}.protocol", "protocol graphql requires rules or access"),
    ("V17", dict(MCP), f"{EP}.protocol", "protocol mcp requires rules when mcp.allow_all_known_mcp_methods is false"),
    ("V18", {**GQL, "rules": [{"deny": {}}]}, f"{EP}.rules", "rules would deny all traffic"),
    (
        "V19",
        {"host": "a.example.com", "port": 443, "deny_rules": [{"method": "x"}]},
        f"{EP}.deny_rules",
        "deny_rules require protocol",
    ),
    ("V20", {**RPC, "deny_rules": [{"method": "x"}]}, f"{EP}.deny_rules", "deny_rules require rules or access"),
    ("V21", {**MCP, "rules": []}, f"{EP}.rules", "rules list cannot be empty"),
    ("V22", {**GQL, "access": "full", "deny_rules": []}, f"{EP}.deny_rules", "deny_rules list cannot be empty"),
    (
        "V23-mcp",
        {"host": "a.example.com", "port": 22, "protocol": "tcp", "mcp": PROFILE},
        f"{EP}.protocol",
        "protocol tcp does not support L7-only fields: mcp",
    ),
    (
        "V23-graphql",
        {"host": "a.example.com", "port": 22, "protocol": "tcp", "persisted_queries": "deny"},
        f"{EP}.protocol",
        "L7-only fields: persisted_queries",
    ),
    ("V24", {**GQL, "path": "graphql", "access": "full"}, f"{EP}.path", "endpoint path must start with '/'"),
    (
        "V25",
        {**GQL, "access": "full", "persisted_queries": "allow"},
        f"{EP}.persisted_queries",
        "unknown persisted_queries mode 'allow'",
    ),
    (
        "V26-graphql",
        {**GQL, "access": "full", "graphql_max_body_bytes": 0},
        f"{EP}.graphql_max_body_bytes",
        "0 is not a positive body limit",
    ),
    (
        "V26-jsonrpc",
        {**RPC, "rules": [{"allow": {"method": "a"}}], "json_rpc": {"max_body_bytes": "big"}},
        f"{EP}.json_rpc.max_body_bytes",
        "expected an integer",
    ),
    (
        "V26-mcp",
        {**MCP, "mcp": {**PROFILE, "max_body_bytes": -1}},
        f"{EP}.mcp.max_body_bytes",
        "-1 is not a positive body limit",
    ),
    (
        "V27-allow",
        {**GQL, "rules": [{"allow": {"operation_type": "*"}}]},
        f"{EP}.rules[0].allow.operation_type",
        "unknown GraphQL operation_type '*'",
    ),
    (
        "V27-deny",
        {**GQL, "access": "full", "deny_rules": [{"operation_type": "fragment"}]},
        f"{EP}.deny_rules[0].operation_type",
        "unknown GraphQL operation_type 'fragment'",
    ),
    (
        "V27-registry",
        {
            **GQL,
            "access": "full",
            "persisted_queries": "allow_registered",
            "graphql_persisted_queries": {"h": {"operation_type": "subscribe"}},
        },
        f"{EP}.graphql_persisted_queries.h.operation_type",
        "unknown GraphQL operation_type 'subscribe'",
    ),
    ("V29-wrong-protocol", {**GQL, "access": "full", "mcp": PROFILE}, f"{EP}.mcp", "mcp options need protocol mcp"),
    (
        "V29-bool",
        {**MCP, "mcp": {"allow_all_known_mcp_methods": "yes"}},
        f"{EP}.mcp.allow_all_known_mcp_methods",
        "expected a boolean",
    ),
    (
        "V29-jsonrpc-options",
        {**MCP, "mcp": PROFILE, "json_rpc": {"max_body_bytes": 9}},
        f"{EP}.json_rpc",
        "json_rpc options need protocol json-rpc",
    ),
    (
        "V30-glob",
        {**RPC, "rules": [{"allow": {"method": "eth_*"}}]},
        f"{EP}.rules[0].allow.method",
        "JSON-RPC method 'eth_*' is a glob",
    ),
    (
        "V30-params",
        {**RPC, "rules": [{"allow": {"method": "a", "params": {"x": "y"}}}]},
        f"{EP}.rules[0].allow.params",
        "JSON-RPC rules match the method only",
    ),
    (
        "V30-tool",
        {**RPC, "rules": [{"allow": {"method": "a", "tool": "t"}}]},
        f"{EP}.rules[0].allow.tool",
        "JSON-RPC rules match the method only",
    ),
    (
        "V30-path",
        {**RPC, "rules": [{"allow": {"method": "a", "path": "/x"}}]},
        f"{EP}.rules[0].allow.path",
        "JSON-RPC rules match the method only",
    ),
    (
        "V31-method-glob",
        {**MCP, "rules": [{"allow": {"method": "resources/*"}}]},
        f"{EP}.rules[0].allow.method",
        "outside the tools/ family",
    ),
    (
        "V31-tool-method",
        {**MCP, "rules": [{"allow": {"method": "tools/list", "tool": "a"}}]},
        f"{EP}.rules[0].allow.tool",
        "a tool selector needs method tools/call",
    ),
    (
        "V31-both",
        {**MCP, "rules": [{"allow": {"method": "tools/call", "tool": "a", "params": {"name": "a"}}}]},
        f"{EP}.rules[0].allow.params",
        "tool and params.name are the same selector",
    ),
    (
        "V31-params-other",
        {**MCP, "rules": [{"allow": {"method": "tools/call", "params": {"arguments": "x"}}}]},
        f"{EP}.rules[0].allow.params.arguments",
        "MCP rules match params.name only",
    ),
    (
        "V31-wildcard-lax",
        {**MCP, "mcp": {"strict_tool_names": False}, "rules": [{"allow": {"method": "tools/call", "tool": "read_*"}}]},
        f"{EP}.rules[0].allow.tool",
        "a wildcard tool selector needs mcp.strict_tool_names: true",
    ),
    (
        "V31-broad-and-tool",
        {**MCP, "rules": [{"allow": {"method": "tools/*"}}, {"allow": {"method": "tools/call", "tool": "a"}}]},
        f"{EP}.rules",
        "cannot be combined with tool-specific allows",
    ),
    (
        "V31-no-method",
        {**MCP, "rules": [{"allow": {"tool": "a"}}]},
        f"{EP}.rules[0].allow.method",
        "missing required key 'method'",
    ),
    (
        "V32-mix",
        {**H, "protocol": "websocket", "rules": [{"allow": {"method": "GET", "path": "/", "operation_type": "query"}}]},
        f"{EP}.rules[0].allow.operation_type",
        "must not mix method/path/query with GraphQL fields",
    ),
    (
        "graphql-rest-fields",
        {**GQL, "rules": [{"allow": {"operation_type": "query", "method": "POST"}}]},
        f"{EP}.rules[0].allow.method",
        "GraphQL rules do not take 'method'",
    ),
    (
        "rest-graphql-fields",
        {**H, "protocol": "rest", "rules": [{"allow": {"method": "GET", "path": "**", "fields": ["a"]}}]},
        f"{EP}.rules[0].allow.fields",
        "is a rule field of protocol graphql",
    ),
    (
        "V32-ws-text-beside-graphql",
        {
            **H,
            "protocol": "websocket",
            "rules": [{"allow": {"method": "WEBSOCKET_TEXT", "path": "**"}}, {"allow": {"operation_type": "query"}}],
        },
        f"{EP}.rules",
        "allows WEBSOCKET_TEXT on an endpoint with GraphQL policy",
    ),
    (
        "sql-still-refused",
        {**H, "host": "db.example.com", "port": 5432, "protocol": "sql"},
        f"{EP}.protocol",
        "not supported yet",
    ),
]


@pytest.mark.parametrize(("row", "endpoint", "path", "fragment"), REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_with_our_message(row: str, endpoint: dict[str, Any], path: str, fragment: str) -> None:
    errors = _refused(endpoint)
    assert any(e.startswith(f"{path}: ") and fragment in e for e in errors), errors


@pytest.mark.parametrize("protocol", ["graphql", "json-rpc", "mcp"])
def test_audit_mode_warned(protocol: str) -> None:
    endpoint = {"host": "a.example.com", "port": 443, "protocol": protocol, "rules": [{"allow": {"method": "x"}}]}
    if protocol == "graphql":
        endpoint["rules"] = [{"allow": {"operation_type": "query"}}]
    policy = load({"r": rule(endpoint)})
    assert any("enforcement: enforce" in w.message and w.path == f"{EP}.enforcement" for w in policy.warnings)


def test_mcp_profile_expands_beside_rules() -> None:
    """With rules, the profile adds the known methods but tools/call: the tool selectors keep deciding it."""
    policy = compile_policy(load({"r": rule({**MCP, "mcp": PROFILE, "rules": [{"allow": {"tool": "echo"}}]})}))
    allows = policy.endpoints[0].allows
    assert [(a.label, a.method) for a in allows if a.label == "rules[0]"] == [("rules[0]", "tools/call")]
    profile = {a.method for a in allows if a.label == "mcp:profile"}
    assert "tools/list" in profile and "initialize" in profile and "tools/call" not in profile
    alone = compile_policy(load({"r": rule({**MCP, "mcp": PROFILE})}))
    assert [(a.label, a.method) for a in alone.endpoints[0].allows] == [("mcp:profile", "*")]
