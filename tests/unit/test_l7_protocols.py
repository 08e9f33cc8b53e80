"""The body evaluators of the agent's own protocols (supervisor/control/l7/jsonrpc.py, mcp.py, graphql.py), from the
attacker's side: each smuggling shape is refused or judged as the server will execute it."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from supervisor.control.l7 import graphql
from supervisor.control.l7.body import BodyRequest
from supervisor.control.l7.body_decide import evaluate
from supervisor.control.policy import BodyRoute, Decision, DenyReason, body_route, decide_l7

from .policy_helpers import compiled, l4, rule

pytestmark = pytest.mark.usefixtures("cold_l4_memos")

H = {"host": "api.example.com", "port": 443}


def route_for(endpoint: dict[str, Any], method: str = "POST", target: str = "/rpc") -> BodyRoute:
    policy = compiled({"r": rule({**H, **endpoint})})
    admitted = l4(policy, "api.example.com")
    assert decide_l7(policy, admitted, method, target).reason is DenyReason.L7_BODY_PENDING
    route = body_route(policy, admitted, method, target)
    assert route is not None
    return route


def post(route: BodyRoute, body: Any, *, raw: bytes | None = None, ctype: str | None = "application/json",
         method: str = "POST", query: str | None = None, encoded: bool = False) -> Decision:  # fmt: skip
    data = raw if raw is not None else json.dumps(body).encode()
    return evaluate(route, BodyRequest(method, query, ctype, encoded, data))


def call(method: str, i: int = 1, **params: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": i, "method": method}
    if params:
        body["params"] = params
    return body


# --- JSON-RPC --------------------------------------------------------------------------------------------------------

RPC = {"protocol": "json-rpc", "enforcement": "enforce", "rules": [{"allow": {"method": "eth_blockNumber"}},
                                                                  {"allow": {"method": "eth_getBalance"}}]}  # fmt: skip


def test_jsonrpc_allowed_and_denied() -> None:
    route = route_for(RPC)
    ok = post(route, call("eth_blockNumber"))
    assert ok.allowed and ok.operation == "eth_blockNumber" and ok.l7_rule == "rules[0]"
    no = post(route, call("eth_sendTransaction", secret="0xdead"))
    assert not no.allowed and no.reason is DenyReason.L7_NO_ALLOW_RULE and no.operation == "eth_sendTransaction"
    assert "0xdead" not in json.dumps(no.to_json())  # params are never reported


def test_jsonrpc_mixed_batch_denied_whole() -> None:
    route = route_for(RPC)
    assert post(route, [call("eth_blockNumber", 1), call("eth_getBalance", 2)]).allowed
    mixed = post(route, [call("eth_blockNumber", 1), call("eth_sendTransaction", 2)])
    assert not mixed.allowed and mixed.operation == "eth_sendTransaction"


def test_jsonrpc_deny_rule_wins_in_audit_too() -> None:
    route = route_for({"protocol": "json-rpc", "rules": [{"allow": {"method": "*"}}],
                       "deny_rules": [{"method": "eth_sendTransaction"}]})  # fmt: skip
    decision = post(route, call("eth_sendTransaction"))
    assert decision.allowed and decision.audit and decision.reason is DenyReason.L7_DENIED  # audit: logged, passed


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("duplicate-method", b'{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","method":"eth_sendTransaction"}'),
        ("duplicate-nested", b'{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":{"a":1,"a":2}}'),
        ("not-json", b"method=eth_sendTransaction"),
        ("no-method", b'{"jsonrpc":"2.0","id":1}'),
        ("method-not-string", b'{"jsonrpc":"2.0","id":1,"method":["eth_blockNumber"]}'),
        ("no-version", b'{"id":1,"method":"eth_blockNumber"}'),
        ("empty-batch", b"[]"),
        ("bom", b'\xef\xbb\xbf{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber"}'),
        ("utf16", json.dumps(call("eth_blockNumber")).encode("utf-16")),
        ("nan", b'{"jsonrpc":"2.0","id":NaN,"method":"eth_blockNumber"}'),
        ("deep", b"[" * 5000 + b"]" * 5000),
        ("call-and-result", b'{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","result":1}'),
        ("duplicate-ids", json.dumps([call("eth_blockNumber", 7), call("eth_getBalance", 7)]).encode()),
        ("batch-over-limit", json.dumps([call("eth_blockNumber", i) for i in range(101)]).encode()),
    ],
)
def test_jsonrpc_smuggling_shapes_refused(name: str, raw: bytes) -> None:
    decision = post(route_for({**RPC, "enforcement": "audit"}), None, raw=raw)
    assert not decision.allowed and decision.reason is DenyReason.BODY_INVALID, decision  # hard: in audit too


def test_jsonrpc_escaped_name_is_judged_decoded() -> None:
    route = route_for(RPC)
    raw = b'{"jsonrpc":"2.0","id":1,"method":"eth_send\\u0054ransaction"}'
    decision = post(route, None, raw=raw)
    assert not decision.allowed and decision.operation == "eth_sendTransaction"  # what the server executes


def test_jsonrpc_response_frames_and_other_methods_refused() -> None:
    route = route_for({**RPC, "enforcement": "audit"})
    frame = post(route, {"jsonrpc": "2.0", "id": 1, "result": "0x1"})
    assert not frame.allowed and frame.reason is DenyReason.RESPONSE_FRAME
    assert not post(route, call("eth_blockNumber"), method="GET").allowed
    assert not post(route, call("eth_blockNumber"), encoded=True).allowed  # gzip would hide the body


# --- MCP ---------------------------------------------------------------------------------------------------------

MCP = {"protocol": "mcp", "enforcement": "enforce", "path": "/mcp", "mcp": {"allow_all_known_mcp_methods": True},
       "rules": [{"allow": {"tool": {"any": ["echo", "read_*"]}}}]}  # fmt: skip


def mcp_route(endpoint: dict[str, Any] = MCP, method: str = "POST") -> BodyRoute:
    return route_for(endpoint, method, "/mcp")


def test_mcp_tools() -> None:
    route = mcp_route()
    assert post(route, call("initialize", protocolVersion="2025-06-18")).allowed
    assert post(route, {"jsonrpc": "2.0", "method": "notifications/initialized"}).allowed
    assert post(route, call("tools/list")).allowed
    ok = post(route, call("tools/call", name="read_file", arguments={"path": "/etc/passwd"}))
    assert ok.allowed and ok.operation == "tools/call read_file"
    no = post(route, call("tools/call", name="delete_everything"))
    assert not no.allowed and no.operation == "tools/call delete_everything"
    assert not post(route, call("sampling/unknownMethod")).allowed  # outside the profile, no rule


def test_mcp_batch_mixing_allowed_and_denied_is_denied() -> None:
    body = [call("tools/call", 1, name="echo"), call("tools/call", 2, name="delete_everything")]
    assert not post(mcp_route(), body).allowed


def test_mcp_client_responses_and_stream() -> None:
    route = mcp_route()
    reply = post(route, {"jsonrpc": "2.0", "id": 0, "result": {"content": {"type": "text", "text": "hi"}}})
    assert reply.allowed and reply.l7_rule == "mcp:response"
    stream = evaluate(mcp_route(method="GET"), BodyRequest("GET", None, None, False, b""))
    assert stream.allowed and stream.l7_rule == "mcp:stream"
    hidden = json.dumps(call("tools/call", name="rm")).encode()
    smuggled = evaluate(mcp_route(method="GET"), BodyRequest("GET", None, "application/json", False, hidden))
    assert not smuggled.allowed and smuggled.reason is DenyReason.BODY_INVALID


@pytest.mark.parametrize(
    "raw",
    [
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","name":"delete_everything"}}',
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","method":"tools/list","params":{"name":"x"}}',
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo\\u0000"}}',
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_x/../rm"}}',
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":["echo"]}}',
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":["echo"]}',
    ],
)
def test_mcp_tool_smuggling_refused(raw: bytes) -> None:
    decision = post(mcp_route(), None, raw=raw)
    assert not decision.allowed and decision.reason is DenyReason.BODY_INVALID, decision


def test_mcp_escaped_method_judged_as_decoded() -> None:
    raw = b'{"jsonrpc":"2.0","id":1,"method":"tools\\u002fcall","params":{"name":"delete_everything"}}'
    decision = post(mcp_route(), None, raw=raw)
    assert not decision.allowed and decision.operation == "tools/call delete_everything"


# --- GraphQL -----------------------------------------------------------------------------------------------------

DOC = "query Viewer { viewer { login } }"
GQL = {"protocol": "graphql", "enforcement": "enforce", "path": "/graphql",
       "rules": [{"allow": {"operation_type": "query", "fields": ["viewer", "repository"]}}],
       "deny_rules": [{"operation_type": "query", "fields": ["secrets"]}],
       "persisted_queries": "allow_registered",
       "graphql_persisted_queries": {hashlib.sha256(DOC.encode()).hexdigest(): {
           "operation_type": "query", "operation_name": "Viewer", "fields": ["viewer"]}}}  # fmt: skip


def gql_route(method: str = "POST") -> BodyRoute:
    return route_for(GQL, method, "/graphql")


def gq(query: str, **extra: Any) -> Decision:
    return post(gql_route(), {"query": query, **extra})


def test_graphql_query_allowed_mutation_denied() -> None:
    ok = gq(DOC)
    assert ok.allowed and ok.operation == "query Viewer"
    no = gq("mutation { deleteRepository(id: 1) { id } }")
    assert not no.allowed and no.operation == "mutation (anonymous)"
    assert not gq("{ viewer { login } organization { id } }").allowed  # every root field must be allowed
    assert not gq("{ viewer { login } secrets { value } }").allowed  # a deny field fires on any


@pytest.mark.parametrize(
    "query",
    [
        "{ viewer: secrets { value } }",  # an alias hiding a denied field
        "{ ...F } fragment F on Query { secrets { value } }",  # a root fragment
        "{ ... on Query { organization { id } } }",  # an inline fragment
        "{ viewer { login } # comment\n organization { id } }",  # a comment in between
        "query A { viewer { login } } mutation B { deleteRepository(id: 1) { id } }",  # the other operation
        "{ viewer { login } } { organization { id } }",  # two anonymous operations
        "query A { viewer { id } } query A { organization { id } }",  # duplicate names
        "{ ...F } fragment F on Query { ...F }",  # a cycle
        "{ ...Missing }",
        "type Query { x: Int }",  # no executable definition
        "{ viewer { login }",  # syntax
    ],
)
def test_graphql_hiding_shapes(query: str) -> None:
    assert not gq(query).allowed


def test_graphql_operation_name_games() -> None:
    two = "query A { viewer { login } } mutation B { deleteRepository(id: 1) { id } }"
    assert not gq(two, operationName="A").allowed  # every operation of the document is judged
    unknown = gq("query A { viewer { login } }", operationName="B")
    assert not unknown.allowed and unknown.reason is DenyReason.BODY_INVALID


def test_graphql_get_and_transport_games() -> None:
    get = gql_route("GET")
    assert evaluate(get, BodyRequest("GET", "query=%7Bviewer%7Blogin%7D%7D", None, False, b"")).allowed
    dup = evaluate(get, BodyRequest("GET", "query=%7Bviewer%7Bid%7D%7D&query=mutation%7Bx%7D", None, False, b""))
    assert not dup.allowed and dup.reason is DenyReason.BODY_INVALID
    body = evaluate(get, BodyRequest("GET", "query=%7Bviewer%7Bid%7D%7D", "application/json", False,
                                     b'{"query":"mutation{x}"}'))  # fmt: skip
    assert not body.allowed
    route = gql_route()
    assert not post(route, None, raw=b"query=mutation{x}", ctype="application/x-www-form-urlencoded").allowed
    assert not post(route, None, raw=b"--b\r\n", ctype="multipart/form-data").allowed
    assert not post(route, {"query": DOC}, query="query=mutation%7Bx%7D").allowed
    assert post(route, None, raw=DOC.encode(), ctype="application/graphql").allowed
    assert not post(route, None, raw=b'{"query":"{viewer{id}}","query":"mutation{x}"}').allowed


def test_graphql_batches() -> None:
    route = gql_route()
    assert post(route, [{"query": DOC}, {"query": "{ repository { id } }"}]).allowed
    assert not post(route, [{"query": DOC}, {"query": "mutation { x }"}]).allowed
    assert not post(route, [{"query": DOC}] * 33).allowed


def test_graphql_persisted_queries() -> None:
    digest = hashlib.sha256(DOC.encode()).hexdigest()
    ext = {"persistedQuery": {"version": 1, "sha256Hash": digest}}
    registered = post(gql_route(), {"extensions": ext})
    assert registered.allowed and registered.operation == "query Viewer"
    unknown = post(gql_route(), {"extensions": {"persistedQuery": {"version": 1, "sha256Hash": "0" * 64}}})
    assert not unknown.allowed and unknown.reason is DenyReason.PERSISTED_QUERY_UNREGISTERED
    liar = post(gql_route(), {"query": "mutation { x }", "extensions": ext})
    assert not liar.allowed and liar.reason is DenyReason.BODY_INVALID
    assert not post(gql_route(), {"id": digest, "extensions": {"persistedQuery": {"sha256Hash": "1" * 64}}}).allowed


def test_graphql_cache_keyed_by_exact_bytes() -> None:
    graphql.clear_cache()
    first = graphql.parse_document(DOC)
    assert graphql.parse_document(DOC) is first
    assert graphql.parse_document(DOC + " ") is not first
