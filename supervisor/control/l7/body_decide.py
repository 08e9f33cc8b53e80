"""Which evaluator decides a body read whole on the inspected path: the agent's own protocols (JSON-RPC, MCP,
GraphQL), each in its module beside the shared reading rules of ``body``. A module of its own so that ``body`` and
the evaluators never import each other both ways."""

from __future__ import annotations

from collections.abc import Callable

from supervisor.control.l7 import graphql, jsonrpc, mcp
from supervisor.control.l7.body import BodyRequest, refused
from supervisor.control.policy import BodyRoute, Decision, Protocol

__all__ = ["evaluate"]

Evaluator = Callable[[BodyRoute, BodyRequest], Decision]
_EVALUATORS: dict[Protocol, Evaluator] = {
    Protocol.JSON_RPC: jsonrpc.decide,
    Protocol.MCP: mcp.decide,
    Protocol.GRAPHQL: graphql.decide,
}


def evaluate(route: BodyRoute, request: BodyRequest) -> Decision:
    """The decision for ``request`` on ``route``: its protocol's evaluator."""
    if request.encoded:
        return refused(route, "a Content-Encoding other than identity hides the body from inspection")
    return _EVALUATORS[route.protocol](route, request)
