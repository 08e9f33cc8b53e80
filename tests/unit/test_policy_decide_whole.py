"""Every field of each decision, branch by branch (docs/reference/policy.md §3.3, §3.10): the decision is what is
logged, returned in a 403 and acted on, so a field that is wrong in one branch (a rule key, the endpoint label, the
audit flag, the canonical path) is a defect even when the verdict is right."""

from __future__ import annotations

import pytest

from supervisor.control.policy import (
    BinaryIdentity,
    Decision,
    DenyReason,
    DigestPins,
    L4Request,
    Verdict,
    decide_l4,
    decide_l7,
    quarantine_decision,
)
from supervisor.control.policy.decide import BodyRoute, body_route, graphql_ws_route, has_graphql_rules, route_l7

from .policy_helpers import CURL, GIT, compiled, l4, rule, who

pytestmark = pytest.mark.usefixtures("cold_l4_memos")

ALLOW, DENY = Verdict.ALLOW, Verdict.DENY
API = "api.example.com"

POLICY = compiled(
    {
        "api": rule(
            {
                "host": API,
                "port": 443,
                "protocol": "rest",
                "enforcement": "enforce",
                "rules": [{"allow": {"method": "GET", "path": "/v1/**", "query": {"tag": "ok*"}}}],
                "deny_rules": [{"method": "GET", "path": "/v1/admin/**"}],
            },
            {
                "host": API,
                "port": 443,
                "path": "/rpc",
                "protocol": "json-rpc",
                "rules": [{"allow": {"method": "ping"}}],
            },
        ),
        "audit": rule({"host": "audit.example.com", "port": 443, "protocol": "rest", "access": "read-only"}),
        "slash": rule(
            {
                "host": "slash.example.com",
                "port": 443,
                "protocol": "rest",
                "access": "full",
                "allow_encoded_slash": True,
            },
            {"host": "slash.example.com", "port": 443, "path": "/strict/**", "protocol": "rest", "access": "full"},
        ),
        "plain": rule({"host": "plain.example.com", "port": 443}),
        "paths": rule(
            {"host": "paths.example.com", "port": 443, "path": "/only/**", "protocol": "rest", "access": "full"}
        ),
    }
)


def _l7(host: str, **fields: object) -> Decision:
    """A decision of ``route_l7`` on ``host``'s own endpoint (``<rule>[0]``), l7 and rules filled in."""
    key = host.split(".")[0]
    base: dict[str, object] = {"l7": True, "host": host, "port": 443, "rules": (key,)}
    verdict = fields.pop("verdict")
    return Decision(verdict, key, f"{key}[0]", fields.pop("reason", None), **{**base, **fields})  # type: ignore[arg-type]


L7_CASES = [
    ("allowed by a rule", API, "GET", "/v1/x?tag=okay",
     _l7(API, verdict=ALLOW, detail="GET /v1/x allowed by policy 'api' rules[0]", method="GET",
         path="/v1/x", query="tag=okay", l7_rule="rules[0]")),
    ("no allow rule: the query does not match", API, "GET", "/v1/x?tag=bad",
     _l7(API, verdict=DENY, reason=DenyReason.L7_NO_ALLOW_RULE, detail="GET /v1/x not permitted by policy",
         method="GET", path="/v1/x", query="tag=bad")),
    ("a deny rule wins", API, "GET", "/v1/admin/x",
     _l7(API, verdict=DENY, reason=DenyReason.L7_DENIED, detail="GET /v1/admin/x blocked by deny rule",
         method="GET", path="/v1/admin/x", l7_rule="deny_rules[0]")),
    ("the method is upper-cased before matching", API, "get", "/v1/x?tag=ok",
     _l7(API, verdict=ALLOW, detail="GET /v1/x allowed by policy 'api' rules[0]", method="GET", path="/v1/x",
         query="tag=ok", l7_rule="rules[0]")),
    ("an invalid method", API, "GE T", "/v1/x",
     _l7(API, verdict=DENY, reason=DenyReason.METHOD_INVALID, detail="invalid HTTP method 'GE T'")),
    ("an empty method", API, "", "/v1/x",
     _l7(API, verdict=DENY, reason=DenyReason.METHOD_INVALID, detail="invalid HTTP method ''")),
    ("the path is judged canonical", API, "GET", "/v1/../x",
     _l7(API, verdict=DENY, reason=DenyReason.L7_NO_ALLOW_RULE, detail="GET /x not permitted by policy",
         method="GET", path="/x")),
    ("an encoded slash where no endpoint allows one", API, "GET", "/v1/%2Fx",
     _l7(API, verdict=DENY, reason=DenyReason.PATH_NOT_CANONICAL,
         detail="encoded slash (%2F) in path; the endpoint does not set allow_encoded_slash", method="GET",
         path="/v1/%2Fx")),
    ("a malformed query", API, "GET", "/v1/x?a=%zz",
     _l7(API, verdict=DENY, reason=DenyReason.QUERY_INVALID, detail="malformed percent-encoding in query",
         method="GET", path="/v1/x", query="a=%zz")),
    ("audit: not permitted, passed and flagged", "audit.example.com", "POST", "/x",
     _l7("audit.example.com", verdict=ALLOW, reason=DenyReason.L7_NO_ALLOW_RULE, audit=True,
         detail="POST /x not permitted by policy", method="POST", path="/x")),
    ("an encoded slash where the endpoint allows it", "slash.example.com", "GET", "/a%2Fb",
     _l7("slash.example.com", verdict=ALLOW, detail="GET /a%2Fb allowed by policy 'slash' access:full",
         method="GET", path="/a%2Fb", l7_rule="access:full")),
    ("an encoded slash under the endpoint that does not allow it", "slash.example.com", "GET", "/strict/a%2Fb",
     Decision(DENY, "slash", "slash[1]", DenyReason.ENCODED_SLASH, l7=True,
              detail="encoded slash (%2F) in path; endpoint slash[1] does not set allow_encoded_slash",
              host="slash.example.com", port=443, rules=("slash",), method="GET", path="/strict/a%2Fb")),
    ("no endpoint path matched", "paths.example.com", "GET", "/elsewhere",
     _l7("paths.example.com", verdict=DENY, reason=DenyReason.L7_NO_ENDPOINT_PATH,
         detail="no L7 endpoint path matched request", method="GET", path="/elsewhere")),
    ("not inspected: allowed with the raw target", "plain.example.com", "get", "/x?q=1",
     Decision(ALLOW, "plain", "plain[0]", None, detail="endpoint is not L7-inspected", host="plain.example.com",
              port=443, rules=("plain",), method="GET", path="/x?q=1")),
]  # fmt: skip


@pytest.mark.parametrize(("case", "host", "method", "target", "expected"), L7_CASES, ids=[case[0] for case in L7_CASES])
def test_each_l7_branch_decides_every_field(case: str, host: str, method: str, target: str, expected: Decision) -> None:
    admitted = l4(POLICY, host)
    assert admitted.allowed
    assert route_l7(POLICY, admitted, method, target) == expected


def test_an_l4_denial_is_the_l7_decision_and_a_reasonless_one_becomes_l4_denied() -> None:
    refused = l4(POLICY, "nowhere.example")
    assert route_l7(POLICY, refused, "GET", "/") is refused
    bare = Decision(DENY, None, None, None, host="x.example", port=8443)
    assert route_l7(POLICY, bare, "GET", "/") == Decision(
        DENY, None, "x.example:8443", DenyReason.L4_DENIED, detail="connection not allowed", host="x.example",
        port=8443,
    )  # fmt: skip


def test_a_body_route_carries_the_request_and_the_endpoints_of_its_rank() -> None:
    admitted = l4(POLICY, API)
    routed = route_l7(POLICY, admitted, "post", "/rpc?x=1")
    assert isinstance(routed, BodyRoute)
    assert (routed.l4, routed.method, routed.path, routed.query) == (admitted, "POST", "/rpc", "x=1")
    assert routed.selected.label == "api[1]" and [c.label for c in routed.configs] == ["api[1]"]
    assert not routed.enforce  # json-rpc without enforcement: audit
    denied = routed.decision(DENY, DenyReason.L7_NO_ALLOW_RULE, "no", operation="eth_x")
    assert denied == Decision(
        ALLOW, "api", "api[1]", DenyReason.L7_NO_ALLOW_RULE, audit=True, l7=True, detail="no", host=API, port=443,
        rules=("api",), method="POST", path="/rpc", query="x=1", operation="eth_x",
    )  # fmt: skip
    hard = routed.decision(DENY, DenyReason.L7_BODY_PENDING, "body", hard=True, l7_rule="rules[0]")
    assert (hard.verdict, hard.audit, hard.l7_rule, hard.endpoint) == (DENY, False, "rules[0]", "api[1]")


# --- L4 ----------------------------------------------------------------------------------------------------------

L4_POLICY = compiled(
    {
        "one": rule({"host": "one.example.com", "port": 443}),
        "ips": rule({"host": "ips.example.com", "port": 443, "allowed_ips": ["10.0.0.0/8"], "tls": "skip"},
                    binaries=(GIT, CURL)),
        "tcp": rule({"host": "*.tcp.example.com", "port": 5432, "protocol": "tcp"}),
        "a": rule({"host": "shared.example.com", "port": 443}),
        "b": rule({"host": "shared.example.com", "port": 443, "protocol": "rest", "access": "read-only"}),
        "c": rule({"host": "shared.example.com", "port": 443}, binaries=(CURL,)),
    }
)  # fmt: skip


def _allow(rule_key: str, endpoint: str, host: str, port: int = 443, **fields: object) -> Decision:
    return Decision(ALLOW, rule_key, endpoint, None, detail=f"{host}:{port} allowed by policy '{rule_key}'",
                    host=host, port=port, **fields)  # type: ignore[arg-type]  # fmt: skip


L4_CASES = [
    ("one endpoint, named exactly", "One.Example.COM.", 443, who(GIT),
     _allow("one", "one[0]", "one.example.com", rules=("one",), exact_host=True)),
    ("the governing endpoint's allowed_ips and tls skip", "ips.example.com", 443, who(CURL),
     _allow("ips", "ips[0]", "ips.example.com", rules=("ips",), exact_host=True, tls_skip=True,
            allowed_ips=("10.0.0.0/8",))),
    ("a tcp endpoint by glob", "db.tcp.example.com", 5432, who(GIT),
     _allow("tcp", "tcp[0]", "db.tcp.example.com", 5432, rules=("tcp",), transparent=True)),
    ("two rules admit: the extended one governs, both are unioned", "shared.example.com", 443, who(GIT),
     _allow("b", "b[0]", "shared.example.com", rules=("a", "b"), exact_host=True, l7=True)),
    ("a rule whose binaries refuse is left out", "shared.example.com", 443, who(CURL),
     _allow("c", "c[0]", "shared.example.com", rules=("c",), exact_host=True)),
]  # fmt: skip


@pytest.mark.parametrize(("case", "host", "port", "identity", "expected"), L4_CASES, ids=[c[0] for c in L4_CASES])
def test_each_l4_allow_decides_every_field(
    case: str, host: str, port: int, identity: BinaryIdentity, expected: Decision
) -> None:
    assert decide_l4(L4_POLICY, L4Request(host, port, identity)) == expected
    assert decide_l4(L4_POLICY, L4Request(host, port, identity)) == expected  # and from the memo


def _deny(reason: DenyReason, detail: str, host: str, port: int, endpoint: str | None = "") -> Decision:
    where = f"{host}:{port}" if endpoint == "" else endpoint
    return Decision(DENY, None, where, reason, detail=detail, host=host, port=port)


def test_each_l4_denial_decides_every_field() -> None:
    ancestors = BinaryIdentity("/usr/bin/wget", None, ("/bin/sh", "/usr/bin/tmux"), ("/usr/bin/git",), ("LD_PRELOAD",))
    text = (
        "binary '/usr/bin/wget' (ancestors: [/bin/sh -> /usr/bin/tmux], cmdline: [/usr/bin/git], started with "
        "LD_PRELOAD: only binaries with allow_loader_env match)"
    )
    cases = [
        (L4Request("one.example.com", 443, ancestors),
         _deny(DenyReason.BINARY_NOT_ALLOWED, f"{text} not allowed in policy 'one'", "one.example.com", 443)),
        (L4Request("shared.example.com", 443, who("/usr/bin/nc")),
         _deny(DenyReason.BINARY_NOT_ALLOWED,
               "; ".join(f"binary '/usr/bin/nc' (ancestors: []) not allowed in policy '{k}'" for k in "abc"),
               "shared.example.com", 443)),
        (L4Request("one.example.com", 80, who()),
         _deny(DenyReason.NO_MATCHING_ENDPOINT, "endpoint one.example.com:80 is not allowed by any policy",
               "one.example.com", 80)),
        (L4Request("one.example.com", 443, None),
         _deny(DenyReason.IDENTITY_MISSING, "the initiating process could not be identified", "one.example.com", 443)),
        (L4Request("one.example.com", 443, who("")),
         _deny(DenyReason.IDENTITY_MISSING, "the initiating process could not be identified", "one.example.com", 443)),
        (L4Request("one.example.com", 0, who()),
         _deny(DenyReason.INVALID_PORT, "invalid port 0", "one.example.com", 0, endpoint=None)),
        (L4Request("one.example.com", 65536, who()),
         _deny(DenyReason.INVALID_PORT, "invalid port 65536", "one.example.com", 0, endpoint=None)),
        (L4Request("one.example.com", True, who()),  # type: ignore[arg-type]
         _deny(DenyReason.INVALID_PORT, "invalid port True", "one.example.com", 0, endpoint=None)),
        (L4Request(7, 443, who()),  # type: ignore[arg-type]
         _deny(DenyReason.INVALID_HOST, "invalid destination host 7", "", 443, endpoint=None)),
        (L4Request("bad host", 443, who()),
         _deny(DenyReason.INVALID_HOST, "invalid destination host 'bad host'", "", 443, endpoint=None)),
    ]  # fmt: skip
    for request, expected in cases:
        assert decide_l4(L4_POLICY, request) == expected, request
    assert decide_l4(L4_POLICY, L4Request("one.example.com", 65535, who())).reason is DenyReason.NO_MATCHING_ENDPOINT
    assert decide_l4(L4_POLICY, L4Request("one.example.com", 1, who())).reason is DenyReason.NO_MATCHING_ENDPOINT


def test_relaxed_identity_admits_every_rule_naming_the_endpoint() -> None:
    relaxed = L4Request("shared.example.com", 443, None, relaxed=True)
    assert decide_l4(L4_POLICY, relaxed) == _allow(
        "b", "b[0]", "shared.example.com", rules=("a", "b", "c"), exact_host=True, l7=True
    )


def test_no_network_policies_denies_everything() -> None:
    empty = compiled({})
    assert decide_l4(empty, L4Request("one.example.com", 443, who())) == _deny(
        DenyReason.NO_NETWORK_POLICIES, "network connections not allowed by policy", "one.example.com", 443
    )


def test_quarantine_names_the_normalised_host_and_why() -> None:
    assert quarantine_decision(L4Request("One.Example.com.", 443, None), "bad yaml") == _deny(
        DenyReason.POLICY_QUARANTINED,
        "policy validation failed; fail-closed quarantine is active: bad yaml",
        "one.example.com",
        443,
    )
    assert quarantine_decision(L4Request("bad host", 8080, None)) == _deny(
        DenyReason.POLICY_QUARANTINED, "policy validation failed; fail-closed quarantine is active", "bad host", 8080
    )


# --- GraphQL over WebSocket ---------------------------------------------------------------------------------------

WS = "ws.example.com"
WS_POLICY = compiled(
    {
        "ws": rule(
            {"host": WS, "port": 443, "protocol": "websocket", "enforcement": "enforce", "path": "/graphql",
             "rules": [{"allow": {"operation_type": "subscription", "fields": ["ticks"]}}]},
            {"host": WS, "port": 443, "protocol": "websocket", "path": "/plain/**",
             "rules": [{"allow": {"method": "GET", "path": "/plain/**"}}]},
        ),
        "other": rule({"host": WS, "port": 443, "protocol": "websocket", "enforcement": "enforce",
                "path": "/graphql",
                       "rules": [{"allow": {"operation_type": "query", "fields": ["me"]}}]}),
    }
)  # fmt: skip


def test_graphql_over_websocket_routes_to_the_endpoints_with_graphql_rules() -> None:
    admitted = l4(WS_POLICY, WS)
    route = graphql_ws_route(WS_POLICY, admitted, "/graphql?x=1")
    assert route is not None
    assert (route.protocol.value, route.method, route.path, route.query) == ("websocket", "WEBSOCKET_TEXT", "/graphql",
                                                                             "x=1")  # fmt: skip
    # rules are positioned by key: "other" before "ws", and the first of the same rank governs
    assert route.selected.label == "other[0]" and sorted(c.label for c in route.configs) == ["other[0]", "ws[0]"]
    assert route.enforce and has_graphql_rules(route.selected)
    assert graphql_ws_route(WS_POLICY, admitted, "/plain/feed") is None  # no GraphQL rules there
    assert not has_graphql_rules(next(c for c in WS_POLICY.endpoints_for(WS, 443) if c.label == "ws[1]"))
    assert graphql_ws_route(WS_POLICY, admitted, "/elsewhere") is None  # no endpoint path matched
    assert graphql_ws_route(WS_POLICY, admitted, "/graphql/%2F..") is None  # not canonical
    assert graphql_ws_route(WS_POLICY, l4(WS_POLICY, "nowhere.example"), "/graphql") is None


def test_a_body_routed_request_is_pending_its_body_whatever_the_enforcement() -> None:
    admitted = l4(POLICY, API)
    assert decide_l7(POLICY, admitted, "POST", "/rpc") == Decision(
        DENY, "api", "api[1]", DenyReason.L7_BODY_PENDING, l7=True,
        detail="POST /rpc: the json-rpc request body decides", host=API, port=443, rules=("api",), method="POST",
        path="/rpc",
    )  # fmt: skip
    assert body_route(POLICY, admitted, "GET", "/v1/x") is None  # REST: decided without a body


SAME_RANK = compiled(
    {
        "a": rule(
            {"host": "rank.example.com", "port": 443, "path": "/x/*", "protocol": "rest", "access": "read-only"},
            {"host": "rank.example.com", "port": 443, "path": "/*/y", "protocol": "rest", "access": "read-only"},
            {"host": "rank.example.com", "port": 443, "path": "/rpc", "protocol": "json-rpc",
             "rules": [{"allow": {"method": "a"}}]},
            {"host": "rank.example.com", "port": 443, "path": "/**", "protocol": "json-rpc",
             "rules": [{"allow": {"method": "b"}}]},
        ),
        "b": rule({"host": "rank.example.com", "port": 443, "path": "/x/*", "protocol": "rest", "access": "read-only"}),
    }
)  # fmt: skip


def test_of_endpoints_of_one_rank_the_first_rule_and_then_the_first_endpoint_governs() -> None:
    admitted = l4(SAME_RANK, "rank.example.com")
    assert admitted.rules == ("a", "b")
    denied = route_l7(SAME_RANK, admitted, "DELETE", "/x/y")  # /x/* and /*/y of a, /x/* of b: rank 3 each
    assert isinstance(denied, Decision)
    assert (denied.rule, denied.endpoint, denied.reason) == ("a", "a[0]", DenyReason.L7_NO_ALLOW_RULE)
    routed = route_l7(SAME_RANK, admitted, "POST", "/rpc")
    assert isinstance(routed, BodyRoute)
    assert [c.label for c in routed.configs] == ["a[2]"]  # not the broader json-rpc endpoint /** of rank 0


def test_a_changed_digest_is_denied_naming_the_destination() -> None:
    pins = DigestPins()
    first = BinaryIdentity(GIT, "a" * 64)
    assert decide_l4(L4_POLICY, L4Request("shared.example.com", 443, first), pins).allowed
    changed = decide_l4(L4_POLICY, L4Request("Shared.Example.com", 443, BinaryIdentity(GIT, "b" * 64)), pins)
    assert changed == Decision(
        DENY, None, "shared.example.com:443", DenyReason.BINARY_DIGEST_CHANGED,
        detail=f"binary integrity check failed: '{GIT}' hash changed (pinned: {'a' * 64}, current: {'b' * 64})",
        host="shared.example.com", port=443,
    )  # fmt: skip


def test_the_identity_text_lists_every_path_and_variable() -> None:
    two = BinaryIdentity("/usr/bin/wget", None, (), ("/a", "/b"), ("LD_PRELOAD", "LD_AUDIT"))
    detail = decide_l4(L4_POLICY, L4Request("one.example.com", 443, two)).detail
    assert detail == (
        "binary '/usr/bin/wget' (ancestors: [], cmdline: [/a, /b], started with LD_PRELOAD, LD_AUDIT: only binaries "
        "with allow_loader_env match) not allowed in policy 'one'"
    )


def test_a_quarantined_request_without_a_host_names_no_endpoint() -> None:
    assert quarantine_decision(L4Request("", 443, None)).endpoint is None


def _ws(path: str, field: str) -> dict[str, object]:
    """A websocket endpoint on ``WS`` whose GraphQL rules allow the query of ``field``."""
    return {"host": WS, "port": 443, "enforcement": "enforce", "allow_encoded_slash": True, "path": path,
            "protocol": "websocket", "rules": [{"allow": {"operation_type": "query", "fields": [field]}}]}  # fmt: skip


WS_RANKS = compiled(
    {
        "g": rule(_ws("/gql/*", "a"), _ws("/*/one", "b"), _ws("/**", "c")),  # ranks 5, 5, 0
        "other": rule(_ws("/gql/*", "d"), binaries=(CURL,)),
    }
)


def test_graphql_over_websocket_selects_the_first_endpoint_of_the_highest_rank_of_the_admitted_rules() -> None:
    admitted = l4(WS_RANKS, WS)  # git: rule "g" only
    assert admitted.rules == ("g",)
    route = graphql_ws_route(WS_RANKS, admitted, "/gql/one")
    assert route is not None and route.l4 is admitted
    assert route.selected.label == "g[0]"  # /gql/* and /*/one are both of rank 5: the first endpoint
    assert [c.label for c in route.configs] == ["g[0]", "g[1]"]  # not /** (rank 0), not "other" (not admitted)
    encoded = graphql_ws_route(WS_RANKS, admitted, "/gql/a%2Fb")  # the endpoints allow an encoded slash
    assert encoded is not None and encoded.path == "/gql/a%2Fb"
