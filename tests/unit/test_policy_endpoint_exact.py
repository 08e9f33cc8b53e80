"""One endpoint of a policy (``supervisor/control/policy/schema_endpoint.py``), each refusal exactly as an operator
reads it (the field's path below the endpoint, message, what was expected, line), and what an accepted endpoint
holds and warns about, field by field. The documents come from ``policy_helpers.doc``, so lines count from its
rendering: the endpoint's mapping starts on line 5."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.control.policy import (
    AccessPreset,
    Enforcement,
    PolicyInvalid,
    Protocol,
    TlsMode,
    load_policy_text,
)
from supervisor.control.policy.model import Endpoint, L7Rule, QueryMatcher
from supervisor.control.policy.schema_endpoint import ENDPOINT_KEYS

from .policy_helpers import doc, rule

EP = "network_policies.r.endpoints[0]"
H = {"host": "a.example.com", "port": 443}
R = {**H, "protocol": "rest", "enforcement": "enforce", "access": "full"}

INFERENCE = "inference.local is served by control's inference routes (--inference-routes), never by a policy endpoint"
SIGNED_BODY = (
    "credential_signing and request_body_credential_rewrite are mutually exclusive: the body is signed as the agent "
    "sent it"
)
BROAD = (
    "an allow rule matching every tools/call (no tool selector) cannot be combined with tool-specific allows: the "
    "tool selectors would not limit anything"
)

# (case, endpoint, [(path below the endpoint, message, expected, line)])
REFUSED: list[tuple[str, Any, list[tuple[str, str, str | None, int]]]] = [
    ("protocol-int", {**H, "protocol": 5}, [(".protocol", "expected a string, got an integer", "a string", 7)]),
    (
        "protocol-sql",
        {**H, "protocol": " SQL "},
        [(".protocol", "protocol 'sql' (SQL inspection) is not supported yet", None, 7)],
    ),
    (
        "protocol-ftp",
        {**H, "protocol": "FTP"},
        [
            (
                ".protocol",
                "unknown protocol 'FTP'",
                "tcp, rest, websocket, graphql, json-rpc or mcp (or no protocol for plain L4)",
                7,
            )
        ],
    ),
    (
        "ips-scalar",
        {**H, "allowed_ips": "10.0.0.0/8"},
        [(".allowed_ips", "expected a list, got a string", "a list", 7)],
    ),
    ("ips-empty", {**H, "allowed_ips": []}, [(".allowed_ips", "allowed_ips list cannot be empty", None, 7)]),
    (
        "ips-int",
        {**H, "allowed_ips": [5]},
        [(".allowed_ips[0]", "expected a CIDR or IP address, got 5", "e.g. 10.0.0.0/8", 8)],
    ),
    (
        "ips-bad",
        {**H, "allowed_ips": ["10.0.0.0/33"]},
        [(".allowed_ips[0]", "invalid allowed_ips entry '10.0.0.0/33'", "a CIDR (10.0.0.0/8) or an IP address", 8)],
    ),
    (
        "ips-blocked",
        {**H, "allowed_ips": ["127.0.0.0/8"]},
        [
            (
                ".allowed_ips[0]",
                "allowed_ips entry '127.0.0.0/8' covers always-blocked loopback address 127.0.0.0",
                "a network outside loopback, link-local, unspecified and metadata addresses, in any IPv6 form",
                8,
            )
        ],
    ),
    ("host-int", {"host": 5, "port": 443}, [(".host", "expected a string, got an integer", "a string", 5)]),
    (
        "host-empty",
        {"host": "", "port": 443},
        [
            (
                ".host",
                "endpoint host must not be empty unless allowed_ips constrains a non-TCP proxy endpoint",
                "a host name, IP address or host glob",
                5,
            )
        ],
    ),
    (
        "host-missing",
        {"port": 443},
        [
            (
                ".host",
                "endpoint host must not be empty unless allowed_ips constrains a non-TCP proxy endpoint",
                "a host name, IP address or host glob",
                5,
            )
        ],
    ),
    ("host-missing-tcp", {"port": 22, "protocol": "tcp"}, [(".host", "protocol tcp requires a DNS hostname", None, 5)]),
    (
        "host-empty-tcp",
        {"host": "", "port": 22, "protocol": "tcp"},
        [(".host", "protocol tcp requires a DNS hostname", None, 5)],
    ),
    (
        "host-inference",
        {"host": "inference.local", "port": 443},
        [
            (
                ".host",
                INFERENCE,
                "another host",
                5,
            )
        ],
    ),
    (
        "host-inference-upper",
        {"host": "Inference.Local.", "port": 443},
        [
            (
                ".host",
                INFERENCE,
                "another host",
                5,
            )
        ],
    ),
    ("host-bad", {"host": "a b", "port": 443}, [(".host", "host must not contain whitespace", None, 5)]),
    (
        "host-bad-tcp-ip",
        {"host": "10.0.0.1", "port": 22, "protocol": "tcp"},
        [(".host", "protocol tcp must use a DNS hostname, not an IP literal", None, 5)],
    ),
    (
        "host-empty-ips-invalid",
        {"host": "", "port": 443, "allowed_ips": ["bad"]},
        [(".allowed_ips[0]", "invalid allowed_ips entry 'bad'", "a CIDR (10.0.0.0/8) or an IP address", 8)],
    ),
    (
        "host-missing-ips-empty",
        {"port": 443, "allowed_ips": []},
        [(".allowed_ips", "allowed_ips list cannot be empty", None, 6)],
    ),
    ("ports-both", {**H, "ports": [80]}, [(".ports", "port and ports are mutually exclusive", "one of them", 7)]),
    (
        "ports-map",
        {"host": "a.example.com", "ports": {"a": 1}},
        [(".ports", "expected a list, got a mapping", "a list", 7)],
    ),
    (
        "ports-empty",
        {"host": "a.example.com", "ports": []},
        [(".ports", "endpoint must declare at least one port", "port: N or ports: [N, ...]", 6)],
    ),
    (
        "ports-none",
        {"host": "a.example.com"},
        [(".ports", "endpoint must declare at least one port", "port: N or ports: [N, ...]", 5)],
    ),
    ("ports-bad-one", {"host": "a.example.com", "ports": [0]}, [(".ports[0]", "invalid port 0", "1..=65535", 7)]),
    ("port-65536", {"host": "a.example.com", "port": 65536}, [(".port", "invalid port 65536", "1..=65535", 6)]),
    ("port-neg", {"host": "a.example.com", "port": -1}, [(".port", "invalid port -1", "1..=65535", 6)]),
    (
        "port-str",
        {"host": "a.example.com", "port": "x"},
        [(".port", "expected an integer, got a string", "an integer", 6)],
    ),
    ("tls-int", {**H, "tls": 5}, [(".tls", "expected a string, got an integer", "a string", 7)]),
    ("tls-bad", {**H, "tls": "SKIP"}, [(".tls", "unknown tls mode 'SKIP'", "skip or auto", 7)]),
    (
        "enf-int",
        {**H, "protocol": "rest", "access": "full", "enforcement": 1},
        [(".enforcement", "expected a string, got an integer", "a string", 9)],
    ),
    (
        "enf-bad",
        {**H, "protocol": "rest", "access": "full", "enforcement": "Enforce"},
        [(".enforcement", "unknown enforcement 'Enforce'", "enforce or audit", 9)],
    ),
    ("path-int", {**R, "path": 5}, [(".path", "expected a string, got an integer", "a string", 10)]),
    ("path-rel", {**R, "path": "api"}, [(".path", "endpoint path must start with '/' or be '**'", None, 10)]),
    ("path-star", {**R, "path": "*"}, [(".path", "endpoint path must start with '/' or be '**'", None, 10)]),
    ("path-glob-bad", {**R, "path": "/a/[b"}, [(".path", "invalid path glob: unbalanced '[' at offset 3", None, 10)]),
    (
        "access-int",
        {**H, "protocol": "rest", "enforcement": "enforce", "access": 5},
        [
            (".protocol", "protocol rest requires rules or access to define allowed traffic", None, 7),
            (".access", "expected a string, got an integer", "a string", 9),
        ],
    ),
    (
        "access-bad",
        {**H, "protocol": "rest", "enforcement": "enforce", "access": "Full"},
        [
            (".protocol", "protocol rest requires rules or access to define allowed traffic", None, 7),
            (".access", "unknown access preset 'Full'", "read-only, read-write or full", 9),
        ],
    ),
    (
        "binding-list",
        {**R, "credential_binding": ["github"]},
        [(".credential_binding", "expected a mapping, got a list", "a mapping", 11)],
    ),
    (
        "binding-extra",
        {**R, "credential_binding": {"provider": "github", "x": 1}},
        [(".credential_binding.x", "unknown key 'x'", "one of provider", 12)],
    ),
    (
        "binding-missing",
        {**R, "credential_binding": {}},
        [(".credential_binding.provider", "missing required key 'provider'", None, 10)],
    ),
    (
        "binding-empty",
        {**R, "credential_binding": {"provider": ""}},
        [(".credential_binding.provider", "must not be empty", "a non-empty string", 11)],
    ),
    (
        "sign-bad",
        {**R, "credential_signing": "sigv5", "signing_service": "s3"},
        [(".credential_signing", "unknown credential_signing 'sigv5'", "sigv4, sigv4:body, sigv4:no_body", 10)],
    ),
    (
        "sign-noservice",
        {**R, "credential_signing": "sigv4"},
        [(".signing_service", "credential_signing requires signing_service", "e.g. signing_service: s3", 10)],
    ),
    (
        "sign-badservice",
        {**R, "credential_signing": "sigv4:body", "signing_service": "S3", "signing_region": "US"},
        [
            (".signing_service", "invalid signing_service 'S3'", "a lower-case name such as s3 or us-east-1", 11),
            (".signing_region", "invalid signing_region 'US'", "a lower-case name such as s3 or us-east-1", 12),
        ],
    ),
    (
        "sign-rewrite",
        {**R, "credential_signing": "sigv4:no_body", "signing_service": "s3", "request_body_credential_rewrite": True},
        [
            (
                ".request_body_credential_rewrite",
                SIGNED_BODY,
                "one of them",
                12,
            )
        ],
    ),
    (
        "sign-empty",
        {**R, "credential_signing": "", "signing_service": ""},
        [
            (".credential_signing", "must not be empty", "a non-empty string", 10),
            (".signing_service", "must not be empty", "a non-empty string", 11),
        ],
    ),
    (
        "sign-tls-skip",
        {**H, "credential_signing": "sigv4", "signing_service": "s3", "tls": "skip"},
        [
            (
                ".credential_signing",
                "credential_signing with tls: skip would never sign: control does not see the requests",
                "no tls (auto)",
                7,
            )
        ],
    ),
    (
        "tcp-fields",
        {"host": "git.example.com", "port": 22, "protocol": "tcp", "path": "/x", "mcp": {}, "enforcement": "enforce"},
        [
            (".protocol", "protocol tcp does not support L7-only fields: path, enforcement, mcp", None, 7),
            (".mcp", "mcp options need protocol mcp", None, 9),
        ],
    ),
    (
        "both-rules-access",
        {**R, "rules": [{"allow": {"method": "GET", "path": "**"}}]},
        [(".rules", "rules and access are mutually exclusive", "one of them", 11)],
    ),
    (
        "l4-rules",
        {**H, "rules": [{"allow": {"method": "GET", "path": "**"}}]},
        [
            (
                ".rules",
                "rules without an L7 protocol would never be enforced",
                "protocol: rest or protocol: websocket",
                8,
            )
        ],
    ),
    (
        "l4-access",
        {**H, "access": "full"},
        [
            (
                ".access",
                "access without an L7 protocol would never be enforced",
                "protocol: rest or protocol: websocket",
                7,
            )
        ],
    ),
    (
        "l4-access-rules",
        {**H, "access": "full", "rules": [{"allow": {"method": "GET", "path": "**"}}]},
        [
            (
                ".access",
                "access without an L7 protocol would never be enforced",
                "protocol: rest or protocol: websocket",
                7,
            ),
            (".rules", "rules and access are mutually exclusive", "one of them", 9),
        ],
    ),
    (
        "l4-deny",
        {**H, "deny_rules": [{"method": "GET", "path": "**"}]},
        [(".deny_rules", "deny_rules require protocol", "protocol: rest or protocol: websocket", 8)],
    ),
    (
        "l4-access-deny",
        {**H, "access": "full", "deny_rules": [{"method": "GET", "path": "**"}]},
        [
            (
                ".access",
                "access without an L7 protocol would never be enforced",
                "protocol: rest or protocol: websocket",
                7,
            ),
            (".deny_rules", "deny_rules require protocol", "protocol: rest or protocol: websocket", 9),
        ],
    ),
    (
        "rest-deny-only",
        {**H, "protocol": "rest", "deny_rules": [{"method": "GET", "path": "**"}]},
        [
            (".protocol", "protocol rest requires rules or access to define allowed traffic", None, 7),
            (".deny_rules", "deny_rules require rules or access to define the base allow set", None, 9),
        ],
    ),
    (
        "mcp-deny-only",
        {**H, "protocol": "mcp", "deny_rules": [{"tool": "x"}]},
        [
            (
                ".protocol",
                "protocol mcp requires rules when mcp.allow_all_known_mcp_methods is false",
                "rules, or mcp: {allow_all_known_mcp_methods: true}",
                7,
            ),
            (
                ".deny_rules[0].method",
                "missing required key 'method'",
                "an MCP method, or mcp.allow_all_known_mcp_methods: true",
                9,
            ),
            (".deny_rules[0].tool", "a tool selector needs method tools/call, not '(none)'", "method: tools/call", 9),
            (".deny_rules", "deny_rules require rules or access to define the base allow set", None, 9),
        ],
    ),
    (
        "jsonrpc-access",
        {**H, "protocol": "json-rpc", "access": "full"},
        [(".access", "protocol json-rpc does not support access presets", "rules with allow.method", 8)],
    ),
    (
        "mcp-access",
        {**H, "protocol": "mcp", "access": "full"},
        [(".access", "protocol mcp does not support access presets", "rules with allow.method", 8)],
    ),
    (
        "jsonrpc-none",
        {**H, "protocol": "json-rpc"},
        [(".protocol", "protocol json-rpc requires explicit rules with allow.method", None, 7)],
    ),
    (
        "jsonrpc-empty-rules",
        {**H, "protocol": "json-rpc", "rules": []},
        [(".rules", "rules list cannot be empty", None, 8)],
    ),
    (
        "mcp-none",
        {**H, "protocol": "mcp"},
        [
            (
                ".protocol",
                "protocol mcp requires rules when mcp.allow_all_known_mcp_methods is false",
                "rules, or mcp: {allow_all_known_mcp_methods: true}",
                7,
            )
        ],
    ),
    (
        "graphql-none",
        {**H, "protocol": "graphql"},
        [(".protocol", "protocol graphql requires rules or access to define allowed traffic", None, 7)],
    ),
    (
        "ws-none",
        {**H, "protocol": "websocket"},
        [(".protocol", "protocol websocket requires rules or access to define allowed traffic", None, 7)],
    ),
    (
        "mcp-broad",
        {
            **H,
            "protocol": "mcp",
            "rules": [{"allow": {"method": "tools/*"}}, {"allow": {"method": "tools/call", "tool": "a"}}],
        },
        [
            (
                ".rules",
                BROAD,
                "tool selectors on every rule whose method matches tools/call",
                9,
            )
        ],
    ),
    (
        "mcp-broad-star",
        {
            **H,
            "protocol": "mcp",
            "rules": [{"allow": {"method": "*"}}, {"allow": {"method": "tools/call", "tool": "a"}}],
        },
        [
            (
                ".rules",
                BROAD,
                "tool selectors on every rule whose method matches tools/call",
                9,
            )
        ],
    ),
    (
        "rest-tls-skip",
        {**R, "tls": "skip"},
        [
            (
                ".tls",
                "protocol rest with tls: skip would never inspect traffic, so its rules would not be enforced",
                "no tls (auto), or no protocol for a raw tunnel",
                10,
            )
        ],
    ),
    (
        "flag-int",
        {**H, "allow_encoded_slash": 1},
        [(".allow_encoded_slash", "expected a boolean, got an integer", "true or false", 7)],
    ),
    (
        "unknown",
        {**H, "protocl": "rest"},
        [
            (
                ".protocl",
                "unknown key 'protocl'; did you mean 'protocol'?",
                "one of " + ", ".join(ENDPOINT_KEYS),
                7,
            )
        ],
    ),
    (
        "advisor",
        {**H, "advisor_proposed": True},
        [(".advisor_proposed", "the gateway-internal field advisor_proposed is not supported yet", None, 7)],
    ),
    ("ep-list", ["a"], [("", "expected a mapping, got a list", "a mapping", 5)]),
    # a nested value is not read as a scalar
    (
        "ips-nested",
        {**H, "allowed_ips": [["10.0.0.0/8"]]},
        [(".allowed_ips[0]", "expected a CIDR or IP address, got None", "e.g. 10.0.0.0/8", 8)],
    ),
    # an empty host is reported on its own line, not the endpoint's
    (
        "host-empty-below",
        {"port": 443, "host": ""},
        [
            (
                ".host",
                "endpoint host must not be empty unless allowed_ips constrains a non-TCP proxy endpoint",
                "a host name, IP address or host glob",
                6,
            )
        ],
    ),
    (
        "host-empty-below-tcp",
        {"port": 22, "protocol": "tcp", "host": ""},
        [(".host", "protocol tcp requires a DNS hostname", None, 7)],
    ),
    # mcp.strict_tool_names governs the deny rules' tool selectors too
    (
        "mcp-lax-deny-glob",
        {
            **H,
            "protocol": "mcp",
            "enforcement": "enforce",
            "mcp": {"strict_tool_names": False},
            "rules": [{"allow": {"method": "tools/call", "tool": "read"}}],
            "deny_rules": [{"method": "tools/call", "tool": "delete_*"}],
        },
        [
            (
                ".deny_rules[0].tool",
                "a wildcard tool selector needs mcp.strict_tool_names: true",
                "exact tool names, or strict_tool_names left on",
                17,
            )
        ],
    ),
    # GraphQL deny rules alone make the endpoint's messages GraphQL's (V32)
    (
        "ws-text-graphql-deny",
        {
            **H,
            "protocol": "websocket",
            "enforcement": "enforce",
            "rules": [
                {"allow": {"method": "GET", "path": "/graphql"}},
                {"allow": {"method": "WEBSOCKET_TEXT", "path": "/graphql"}},
            ],
            "deny_rules": [{"operation_type": "mutation"}],
        },
        [
            (
                ".rules",
                "rules[1] allows WEBSOCKET_TEXT on an endpoint with GraphQL policy",
                "GraphQL rules decide its messages: allow GET for the upgrade only",
                10,
            )
        ],
    ),
    # an unknown signing mode is one error, not also one for signing under tls: skip
    (
        "sign-unknown-tls-skip",
        {**H, "credential_signing": "sigv5", "signing_service": "s3", "tls": "skip"},
        [(".credential_signing", "unknown credential_signing 'sigv5'", "sigv4, sigv4:body, sigv4:no_body", 7)],
    ),
]


@pytest.mark.parametrize(("case", "endpoint", "errors"), REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_exactly(case: str, endpoint: Any, errors: list[tuple[str, str, str | None, int]]) -> None:
    with pytest.raises(PolicyInvalid) as info:
        load_policy_text(doc({"r": rule(endpoint)}), "t.yaml")
    found = info.value.errors
    assert all(e.path.startswith(EP) and e.source == "t.yaml" for e in found)
    assert [(e.path.removeprefix(EP), e.message, e.expected, e.line) for e in found] == errors


# (case, endpoint, the Endpoint's fields that differ from Endpoint("a.example.com", (443,)), [(warning path, message,
# line)])
ACCEPTED: list[tuple[str, dict[str, Any], dict[str, Any], list[tuple[str, str, int]]]] = [
    (
        "protocol-upper",
        {**H, "protocol": "REST", "access": "full", "enforcement": "enforce"},
        {
            "protocol": Protocol.REST,
            "enforcement": Enforcement.ENFORCE,
            "enforcement_explicit": True,
            "access": AccessPreset.FULL,
        },
        [],
    ),
    (
        "ips-dup",
        {**H, "allowed_ips": ["10.0.0.0/24", "10.0.0.5/24", " 10.0.0.0/24 "]},
        {"allowed_ips": ("10.0.0.0/24",)},
        [],
    ),
    (
        "ips-broad4",
        {**H, "allowed_ips": ["10.0.0.0/15"]},
        {"allowed_ips": ("10.0.0.0/15",)},
        [(".allowed_ips[0]", "allowed_ips entry '10.0.0.0/15' is very broad (/15)", 8)],
    ),
    ("ips-16", {**H, "allowed_ips": ["10.0.0.0/16"]}, {"allowed_ips": ("10.0.0.0/16",)}, []),
    (
        "ips-broad6",
        {**H, "allowed_ips": ["2001:db8::/31"]},
        {"allowed_ips": ("2001:db8::/31",)},
        [(".allowed_ips[0]", "allowed_ips entry '2001:db8::/31' is very broad (/31)", 8)],
    ),
    ("ips-32", {**H, "allowed_ips": ["2001:db8::/32"]}, {"allowed_ips": ("2001:db8::/32",)}, []),
    (
        "host-empty-ips",
        {"host": "", "port": 443, "allowed_ips": ["10.0.0.0/24"]},
        {"host": "", "allowed_ips": ("10.0.0.0/24",)},
        [],
    ),
    ("ports-dup", {"host": "a.example.com", "ports": [443, 80, 443]}, {"ports": (443, 80)}, []),
    ("port-65535", {"host": "a.example.com", "port": 65535}, {"ports": (65535,)}, []),
    ("port-1", {"host": "a.example.com", "port": 1}, {"ports": (1,)}, []),
    (
        "tls-passthrough",
        {**H, "tls": "passthrough"},
        {},
        [(".tls", "tls: passthrough is deprecated and has no effect", 7)],
    ),
    ("tls-terminate", {**H, "tls": "terminate"}, {}, [(".tls", "tls: terminate is deprecated and has no effect", 7)]),
    ("tls-skip", {**H, "tls": "skip"}, {"tls": TlsMode.SKIP}, []),
    ("tls-auto", {**H, "tls": "auto"}, {"tls": TlsMode.AUTO}, []),
    (
        "enf-audit",
        {**H, "protocol": "rest", "access": "full", "enforcement": "audit"},
        {"protocol": Protocol.REST, "enforcement_explicit": True, "access": AccessPreset.FULL},
        [],
    ),
    (
        "path-empty",
        {**R, "path": ""},
        {
            "protocol": Protocol.REST,
            "enforcement": Enforcement.ENFORCE,
            "enforcement_explicit": True,
            "access": AccessPreset.FULL,
        },
        [],
    ),
    (
        "path-stars",
        {**R, "path": "**"},
        {
            "path": "**",
            "protocol": Protocol.REST,
            "enforcement": Enforcement.ENFORCE,
            "enforcement_explicit": True,
            "access": AccessPreset.FULL,
        },
        [],
    ),
    (
        "binding",
        {**R, "credential_binding": {"provider": "github"}},
        {
            "protocol": Protocol.REST,
            "enforcement": Enforcement.ENFORCE,
            "enforcement_explicit": True,
            "access": AccessPreset.FULL,
            "credential_binding": "github",
        },
        [],
    ),
    (
        "sign",
        {**R, "credential_signing": "sigv4", "signing_service": "s3", "signing_region": "us-east-1"},
        {
            "protocol": Protocol.REST,
            "enforcement": Enforcement.ENFORCE,
            "enforcement_explicit": True,
            "access": AccessPreset.FULL,
            "credential_signing": "sigv4",
            "signing_service": "s3",
            "signing_region": "us-east-1",
        },
        [],
    ),
    (
        "service-only",
        {**R, "signing_service": "s3", "signing_region": "eu-west-1"},
        {
            "protocol": Protocol.REST,
            "enforcement": Enforcement.ENFORCE,
            "enforcement_explicit": True,
            "access": AccessPreset.FULL,
            "signing_service": "s3",
            "signing_region": "eu-west-1",
        },
        [
            (".signing_service", "signing_service has no effect without credential_signing", 10),
            (".signing_region", "signing_region has no effect without credential_signing", 11),
        ],
    ),
    (
        "tcp-ok",
        {
            "host": "git.example.com",
            "port": 22,
            "protocol": "tcp",
            "allowed_ips": ["10.0.0.0/24"],
            "tls": "skip",
            "allow_uninspected_credentials": True,
        },
        {
            "host": "git.example.com",
            "ports": (22,),
            "protocol": Protocol.TCP,
            "tls": TlsMode.SKIP,
            "allowed_ips": ("10.0.0.0/24",),
            "allow_uninspected_credentials": True,
        },
        [],
    ),
    (
        "mcp-profile-deny",
        {**H, "protocol": "mcp", "mcp": {"allow_all_known_mcp_methods": True}, "deny_rules": [{"tool": "x"}]},
        {
            "protocol": Protocol.MCP,
            "deny_rules": (
                L7Rule(
                    method="tools/call",
                    path="",
                    query=(),
                    tool=QueryMatcher(globs=("x",)),
                    operation_type=None,
                    operation_name=None,
                    fields=None,
                ),
            ),
            "mcp_allow_all_known_methods": True,
        },
        [
            (
                ".enforcement",
                "L7 endpoint without 'enforcement: enforce' runs in audit mode: violations are logged but allowed",
                5,
            )
        ],
    ),
    (
        "mcp-profile",
        {**H, "protocol": "mcp", "mcp": {"allow_all_known_mcp_methods": True}},
        {"protocol": Protocol.MCP, "mcp_allow_all_known_methods": True},
        [
            (
                ".enforcement",
                "L7 endpoint without 'enforcement: enforce' runs in audit mode: violations are logged but allowed",
                5,
            )
        ],
    ),
    (
        "mcp-broad-alone",
        {**H, "protocol": "mcp", "rules": [{"allow": {"method": "tools/*"}}]},
        {
            "protocol": Protocol.MCP,
            "rules": (
                L7Rule(
                    method="tools/*",
                    path="",
                    query=(),
                    tool=None,
                    operation_type=None,
                    operation_name=None,
                    fields=None,
                ),
            ),
        },
        [
            (
                ".enforcement",
                "L7 endpoint without 'enforcement: enforce' runs in audit mode: violations are logged but allowed",
                5,
            )
        ],
    ),
    (
        "mcp-tools-only",
        {
            **H,
            "protocol": "mcp",
            "rules": [
                {"allow": {"method": "tools/call", "tool": "b"}},
                {"allow": {"method": "tools/call", "tool": "a"}},
            ],
        },
        {
            "protocol": Protocol.MCP,
            "rules": (
                L7Rule(
                    method="tools/call",
                    path="",
                    query=(),
                    tool=QueryMatcher(globs=("b",)),
                    operation_type=None,
                    operation_name=None,
                    fields=None,
                ),
                L7Rule(
                    method="tools/call",
                    path="",
                    query=(),
                    tool=QueryMatcher(globs=("a",)),
                    operation_type=None,
                    operation_name=None,
                    fields=None,
                ),
            ),
        },
        [
            (
                ".enforcement",
                "L7 endpoint without 'enforcement: enforce' runs in audit mode: violations are logged but allowed",
                5,
            )
        ],
    ),
    (
        "audit-warn",
        {**H, "protocol": "rest", "access": "full"},
        {"protocol": Protocol.REST, "access": AccessPreset.FULL},
        [
            (
                ".enforcement",
                "L7 endpoint without 'enforcement: enforce' runs in audit mode: violations are logged but allowed",
                5,
            )
        ],
    ),
    (
        "flags-l4",
        {
            **H,
            "allow_encoded_slash": True,
            "websocket_credential_rewrite": True,
            "request_body_credential_rewrite": True,
            "allow_uninspected_credentials": True,
        },
        {
            "allow_encoded_slash": True,
            "websocket_credential_rewrite": True,
            "request_body_credential_rewrite": True,
            "allow_uninspected_credentials": True,
        },
        [
            (".allow_encoded_slash", "allow_encoded_slash has no effect without protocol rest/websocket", 7),
            (
                ".websocket_credential_rewrite",
                "websocket_credential_rewrite has no effect without protocol rest/websocket",
                8,
            ),
            (
                ".request_body_credential_rewrite",
                "request_body_credential_rewrite has no effect without protocol rest",
                9,
            ),
        ],
    ),
    (
        "flags-l4-false",
        {
            **H,
            "allow_encoded_slash": False,
            "websocket_credential_rewrite": False,
            "request_body_credential_rewrite": False,
        },
        {},
        [],
    ),
    (
        "flags-ws",
        {
            **H,
            "protocol": "websocket",
            "access": "full",
            "enforcement": "enforce",
            "allow_encoded_slash": True,
            "websocket_credential_rewrite": True,
            "request_body_credential_rewrite": True,
        },
        {
            "protocol": Protocol.WEBSOCKET,
            "enforcement": Enforcement.ENFORCE,
            "enforcement_explicit": True,
            "access": AccessPreset.FULL,
            "allow_encoded_slash": True,
            "websocket_credential_rewrite": True,
            "request_body_credential_rewrite": True,
        },
        [
            (
                ".request_body_credential_rewrite",
                "request_body_credential_rewrite has no effect without protocol rest",
                12,
            )
        ],
    ),
    (
        "flags-rest",
        {
            **R,
            "allow_encoded_slash": True,
            "websocket_credential_rewrite": True,
            "request_body_credential_rewrite": True,
        },
        {
            "protocol": Protocol.REST,
            "enforcement": Enforcement.ENFORCE,
            "enforcement_explicit": True,
            "access": AccessPreset.FULL,
            "allow_encoded_slash": True,
            "websocket_credential_rewrite": True,
            "request_body_credential_rewrite": True,
        },
        [],
    ),
]


@pytest.mark.parametrize(("case", "endpoint", "fields", "warnings"), ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_accepted_exactly(
    case: str, endpoint: dict[str, Any], fields: dict[str, Any], warnings: list[tuple[str, str, int]]
) -> None:
    policy = load_policy_text(doc({"r": rule(endpoint)}), "t.yaml")
    (accepted,) = policy.network_policies[0].endpoints
    assert accepted == Endpoint(**{"host": "a.example.com", "ports": (443,), **fields})
    assert [(w.path.removeprefix(EP), w.message, w.line) for w in policy.warnings] == warnings
    assert all(w.path.startswith(EP) and w.source == "t.yaml" for w in policy.warnings)
