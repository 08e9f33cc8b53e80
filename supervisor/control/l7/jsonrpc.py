"""JSON-RPC 2.0 request bodies and their decision (docs/reference/policy.md §3.10.5; MCP rides on it, ``mcp``).

Rules:

1. The body is parsed as every server reads it alike (``body.strict_json``): duplicate keys, a BOM, NaN or bytes
   that are not UTF-8 are refused. A ``\\u002f`` in a method name is decoded first, as the server decodes it, so
   ``tools\\u002fcall`` is ``tools/call`` here too.
2. One message or a batch (a non-empty array of at most :data:`MAX_BATCH` messages). Every message is an object
   with ``"jsonrpc": "2.0"`` and either a string ``method`` (a call or a notification) or, without one, a
   ``result`` or ``error`` (a response frame). A message with both, a ``method`` that is not a string, or an
   ``id`` that is not a string, integer or null is refused.
3. Two calls of a batch with the same ``id`` are refused: their responses could not be told apart, and a server
   that answers the last one for both would let a denied call's result stand for an allowed one's.
4. Each call is decided by its method alone (``params`` never: they may hold secrets and no rule reads them); a
   call a deny rule matches, or no allow rule matches, denies the whole batch. On ``json-rpc`` a response frame
   from the client is a hard deny; ``mcp`` allows them (``mcp``). JSON-RPC is POSTed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from supervisor.control.l7.body import BodyRefused, BodyRequest, label, refused, strict_json
from supervisor.control.policy import BodyRoute, CompiledEndpoint, Decision, DenyReason, Protocol, Verdict
from supervisor.control.policy.compiled import CompiledL7Rule

__all__ = ["MAX_BATCH", "Call", "decide", "parse_messages"]

MAX_BATCH = 100


@dataclass(frozen=True, slots=True)
class Call:
    """One message of a body: a call (``method`` set) or a response frame (``method`` None)."""

    method: str | None
    params: Any = None  # read by mcp for tools/call's name; never logged
    id: Any = None

    @property
    def response(self) -> bool:
        return self.method is None


def parse_messages(data: bytes) -> tuple[list[Call], bool]:
    """The body's messages and whether it was a batch; raises :class:`BodyRefused`."""
    value = strict_json(data)
    batch = isinstance(value, list)
    items = value if batch else [value]
    if batch and not items:
        raise BodyRefused("empty batch")
    if len(items) > MAX_BATCH:
        raise BodyRefused(f"batch of {len(items)} messages is over the limit of {MAX_BATCH}")
    calls = [_message(item) for item in items]
    seen: set[tuple[type, Any]] = set()
    for call in calls:
        if call.method is not None and call.id is not None:
            key = (type(call.id), call.id)
            if key in seen:
                raise BodyRefused(f"duplicate id {label(str(call.id))!r} in a batch")
            seen.add(key)
    return calls, batch


def _message(item: Any) -> Call:
    if not isinstance(item, dict):
        raise BodyRefused("a JSON-RPC message is an object")
    if item.get("jsonrpc") != "2.0":
        raise BodyRefused('a JSON-RPC message needs "jsonrpc": "2.0"')
    msg_id = item.get("id")
    if "id" in item and not (msg_id is None or isinstance(msg_id, str) or
                             (isinstance(msg_id, int) and not isinstance(msg_id, bool))):  # fmt: skip
        raise BodyRefused("a JSON-RPC id is a string, an integer or null")
    if "method" in item:
        method = item["method"]
        if not isinstance(method, str):
            raise BodyRefused("method is not a string")
        if "result" in item or "error" in item:
            raise BodyRefused("a message is a call or a response, not both")
        return Call(method, item.get("params"), msg_id)
    if "result" in item or "error" in item:
        return Call(None, None, msg_id)
    raise BodyRefused("a JSON-RPC message without method")


def rule_matches(rule: CompiledL7Rule, method: str, tool: str | None) -> bool:
    """A JSON-RPC or MCP rule: its method (exact, ``*`` or a ``tools/`` glob) and, when it has one, its tool
    selector against ``params.name`` of a ``tools/call``."""
    if not (rule.method == "*" or rule.method == method or (rule.method_glob is not None
                                                             and rule.method_glob.matches(method))):  # fmt: skip
        return False
    if rule.tool is None:
        return True
    return method == "tools/call" and tool is not None and any(g.matches(tool) for g in rule.tool)


def judge(route: BodyRoute, calls: Iterable[tuple[str, str | None, str]]) -> Decision:
    """Every ``(method, tool, operation label)`` must be allowed and none denied; the first that is not decides."""
    configs = route.configs
    last: tuple[CompiledEndpoint, CompiledL7Rule, str] | None = None
    count = 0
    for method, tool, operation in calls:
        count += 1
        denied = _first(configs, method, tool, deny=True)
        if denied is not None:
            cep, rule = denied
            return route.decision(Verdict.DENY, DenyReason.L7_DENIED, f"{operation} blocked by deny rule", cep=cep,
                                  l7_rule=rule.label, operation=operation)  # fmt: skip
        allowed = _first(configs, method, tool, deny=False)
        if allowed is None:
            return route.decision(Verdict.DENY, DenyReason.L7_NO_ALLOW_RULE, f"{operation} not permitted by policy",
                                  operation=operation)  # fmt: skip
        last = (allowed[0], allowed[1], operation)
    assert last is not None
    cep, rule, operation = last
    shown = operation if count == 1 else label(f"batch of {count}, last {operation}")
    return route.decision(Verdict.ALLOW, None, f"{shown} allowed by policy '{cep.rule.key}' {rule.label}", cep=cep,
                          l7_rule=rule.label, operation=shown)  # fmt: skip


def _first(configs: Iterable[CompiledEndpoint], method: str, tool: str | None,
           *, deny: bool) -> tuple[CompiledEndpoint, CompiledL7Rule] | None:  # fmt: skip
    for cep in configs:
        for rule in cep.denies if deny else cep.allows:
            if rule_matches(rule, method, tool):
                return cep, rule
    return None


def decide(route: BodyRoute, request: BodyRequest) -> Decision:
    """A ``protocol: json-rpc`` request."""
    if request.method != "POST":
        return refused(route, f"JSON-RPC is POSTed, not sent with {label(request.method)}")
    try:
        calls, _ = parse_messages(request.body)
    except BodyRefused as exc:
        return refused(route, str(exc))
    if any(call.response for call in calls):
        assert route.protocol is Protocol.JSON_RPC
        return refused(route, "JSON-RPC response frames are not permitted from client to server",
                       reason=DenyReason.RESPONSE_FRAME)  # fmt: skip
    return judge(route, ((c.method or "", None, label(c.method or "")) for c in calls))
