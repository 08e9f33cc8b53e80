"""The bodies of the agent's own protocols on the inspected path: JSON-RPC, MCP and GraphQL (``control/l7/body.py``,
``jsonrpc.py``, ``mcp.py``, ``graphql.py``, chosen by ``body_decide.evaluate``).

The input's first byte picks the protocol and shape (a POST body, a GraphQL GET query string, a GraphQL message over
WebSocket); the rest is the body. Oracles beyond "no crash":

* every body gets a decision: a malformed one is refused (``body-invalid`` or a denial), never an exception;
* the decision is the same the second time (GraphQL's document cache warm) as the first;
* under enforcement nothing is allowed that the rules do not name: an allowed JSON-RPC body parses, and each of
  its calls is a response or the one allowed method.
"""

from __future__ import annotations

from typing import Any

from supervisor.control.l7 import graphql, jsonrpc
from supervisor.control.l7.body import BodyRefused, BodyRequest
from supervisor.control.l7.body_decide import evaluate
from supervisor.control.policy import (
    BinaryIdentity,
    BodyRoute,
    L4Request,
    compile_policy,
    decide_l4,
    load_policy_text,
)
from supervisor.control.policy.decide import body_route, graphql_ws_route

_POLICY = """
version: 1
network_policies:
  agent:
    binaries: [{path: /usr/bin/agent}]
    endpoints:
      - {host: rpc.test, port: 443, path: /rpc, protocol: json-rpc, enforcement: enforce,
         rules: [{allow: {method: eth_blockNumber}}]}
      - {host: mcp.test, port: 443, path: /mcp, protocol: mcp, enforcement: enforce,
         mcp: {allow_all_known_mcp_methods: true}, rules: [{allow: {tool: {any: [echo, "read_*"]}}}]}
      - {host: gql.test, port: 443, path: /graphql, protocol: graphql, enforcement: enforce,
         rules: [{allow: {operation_type: query, fields: [viewer]}}],
         deny_rules: [{operation_type: query, fields: [secrets]}]}
      - {host: ws.test, port: 443, path: /graphql, protocol: websocket, enforcement: enforce,
         rules: [{allow: {operation_type: subscription, fields: [ticks]}}]}
"""
_COMPILED = compile_policy(load_policy_text(_POLICY, "fuzz.yaml"))
_AGENT = BinaryIdentity("/usr/bin/agent", None)


def _route(host: str, method: str, target: str, ws: bool = False) -> BodyRoute:
    l4 = decide_l4(_COMPILED, L4Request(host, 443, _AGENT))
    route = graphql_ws_route(_COMPILED, l4, target) if ws else body_route(_COMPILED, l4, method, target)
    assert route is not None, host
    return route


_RPC = _route("rpc.test", "POST", "/rpc")
_MCP = _route("mcp.test", "POST", "/mcp")
_GQL_POST = _route("gql.test", "POST", "/graphql")
_GQL_GET = _route("gql.test", "GET", "/graphql")
_GQL_WS = _route("ws.test", "GET", "/graphql", ws=True)


def _rpc_allowed_only_what_is_named(body: bytes) -> None:
    calls, _ = jsonrpc.parse_messages(body)  # an allowed body parses
    assert all(call.response or call.method == "eth_blockNumber" for call in calls), calls


def one_input(data: bytes) -> None:
    if not data:
        return
    shape, body = data[0] % 5, data[1:]
    if shape == 4:
        first = graphql.decide_ws_message(_GQL_WS, body)
        graphql.clear_cache()
        assert graphql.decide_ws_message(_GQL_WS, body) == first
        assert graphql.decide_ws_message(_GQL_WS, body) == first
        return
    route, request = _request(shape, body)
    graphql.clear_cache()
    decision = evaluate(route, request)
    assert evaluate(route, request) == decision  # the same with GraphQL's cache warm
    if not decision.allowed or decision.audit:
        return
    if route is _RPC:
        try:
            _rpc_allowed_only_what_is_named(body)
        except BodyRefused as exc:  # pragma: no cover - the oracle failing
            raise AssertionError(f"an allowed JSON-RPC body does not parse: {exc}") from None


def _request(shape: int, body: bytes) -> tuple[BodyRoute, BodyRequest]:
    routes: dict[int, Any] = {0: _RPC, 1: _MCP, 2: _GQL_POST}
    if shape == 3:
        query = body.decode("latin-1")
        return _GQL_GET, BodyRequest("GET", query, None, False, b"")
    return routes[shape], BodyRequest("POST", None, "application/json", False, body)
