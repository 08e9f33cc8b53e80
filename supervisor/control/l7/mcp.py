"""MCP over streamable HTTP (docs/reference/policy.md §3.10.5): which of the agent's requests reach the server.

Rules:

1. ``POST`` carries JSON-RPC (``jsonrpc.parse_messages``: one message or a batch, the same refusals). Each call is
   decided by its method; a ``tools/call`` also by its tool, ``params.name``, which must be a string and, with
   ``mcp.strict_tool_names`` (the default), match ``^[A-Za-z0-9_.-]{1,128}$`` before any rule is asked. Any
   denied call denies the whole body.
2. Response frames from the client are allowed: they answer the server's own requests (sampling, elicitation,
   roots), carry no method and call nothing.
3. ``GET`` opens the server-to-client SSE stream and ``DELETE`` ends the session: both are allowed once endpoint
   and binary matched (L4), but never with a body (a ``GET`` with a body is a smuggling shape).
4. Nothing is rewritten: the server's answers, ``tools/list`` included, pass as they are.
"""

from __future__ import annotations

import re

from supervisor.control.l7.body import BodyRefused, BodyRequest, label, refused
from supervisor.control.l7.jsonrpc import judge, parse_messages
from supervisor.control.policy import BodyRoute, Decision, Verdict

__all__ = ["STRICT_TOOL_NAME", "decide"]

STRICT_TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def decide(route: BodyRoute, request: BodyRequest) -> Decision:
    """A ``protocol: mcp`` request."""
    if request.method in ("GET", "DELETE"):
        if request.body:
            return refused(route, f"{request.method} with a body")
        what = "the server-to-client stream" if request.method == "GET" else "the end of the session"
        return route.decision(Verdict.ALLOW, None, f"MCP {what} allowed by policy '{route.selected.rule.key}'",
                              l7_rule="mcp:stream" if request.method == "GET" else "mcp:session",
                              operation=request.method)  # fmt: skip
    if request.method != "POST":
        return refused(route, f"MCP over streamable HTTP takes POST, GET and DELETE, not {label(request.method)}")
    try:
        calls, _ = parse_messages(request.body)
    except BodyRefused as exc:
        return refused(route, str(exc))
    strict = all(c.endpoint.strict_tool_names for c in route.configs)
    judged: list[tuple[str, str | None, str]] = []
    for call in calls:
        if call.method is None:
            continue  # a reply to the server's request (rule 2)
        tool: str | None = None
        if call.method == "tools/call":
            name = call.params.get("name") if isinstance(call.params, dict) else None
            if not isinstance(name, str):
                return refused(route, "tools/call without a string params.name", operation="tools/call")
            if strict and STRICT_TOOL_NAME.fullmatch(name) is None:
                return refused(route, f"tool name {label(name)!r} is not [A-Za-z0-9_.-]{{1,128}}",
                               operation="tools/call")  # fmt: skip
            tool = name
        judged.append((call.method, tool, label(call.method if tool is None else f"{call.method} {tool}")))
    if not judged:
        return route.decision(Verdict.ALLOW, None, "MCP responses to the server's requests", l7_rule="mcp:response",
                              operation="response")  # fmt: skip
    return judge(route, judged)
