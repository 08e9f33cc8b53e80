"""GraphQL requests and their decision (docs/reference/policy.md §1.5, §3.10.5).

Rules:

1. Documents are parsed by graphql-core (the reference implementation's port), never by hand, with a token bound;
   parsed documents are remembered by their exact bytes (:data:`CACHE_ENTRIES` documents of at most
   :data:`CACHE_MAX_BYTES`), so a client repeating its queries pays the parse once.
2. A request is ``GET`` with ``query``/``operationName``/``extensions`` in the query string (each at most once; no
   body), or ``POST`` with ``application/json`` (one request object or a batch of at most :data:`MAX_BATCH`) or
   ``application/graphql`` (the document itself). Any other media type, a POST that also names GraphQL parameters in
   its query string, or a JSON-RPC-like shape the server might read differently is refused.
3. A document holds operations and fragments only. Each operation is ``{type, name, root fields}``: aliases
   resolved to the field they select, fragment spreads and inline fragments at the root expanded (unknown or
   cyclic fragments refused). ``__typename`` executes nothing and is not a field a rule must name.
4. **Every** operation of the document is decided, not only the one ``operationName`` picks: a name that picks a
   different operation than the one judged cannot happen. ``operationName`` must name an operation of the
   document; several operations need names, unique ones (anonymous duplicates are refused).
5. Hash-only (persisted) requests: refused unless the endpoint says ``persisted_queries: allow_registered`` and
   the hash (``extensions.persistedQuery.sha256Hash``) or id (``id``, ``documentId``, ``doc_id``) is in
   ``graphql_persisted_queries``; the registry entry's type, name and fields are what is decided. A request with
   both a document and a hash must agree (sha256 of the document); several ids that differ are refused.
6. Allow rules need the type, the name glob (when set) and — when set — *every* root field to match; a deny rule
   fires on the type and name with *any* root field matching. Every operation of every request of a batch must
   be allowed. Parse and shape errors are hard denies, whatever the enforcement.
7. GraphQL over WebSocket (a ``protocol: websocket`` endpoint with GraphQL rules): every whole client message is
   read (``websocket.MessageFilter`` reassembles fragments) and each ``subscribe``/``start`` decided as rule 6
   decides a request (:func:`decide_ws_message`).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from graphql import GraphQLError, parse
from graphql.language import (
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    InlineFragmentNode,
    OperationDefinitionNode,
    SelectionSetNode,
)

from supervisor.control.l7.body import BodyRefused, BodyRequest, label, refused, strict_json
from supervisor.control.policy import BodyRoute, CompiledEndpoint, Decision, DenyReason, Verdict
from supervisor.control.policy.compiled import CompiledL7Rule

__all__ = ["CACHE_ENTRIES", "MAX_BATCH", "Operation", "decide", "parse_document"]

MAX_BATCH = 32
MAX_TOKENS = 20000
CACHE_ENTRIES = 1024
CACHE_MAX_BYTES = 16 * 1024
_PARAMS = ("query", "operationName", "extensions", "variables", "id", "documentId", "doc_id")


@dataclass(frozen=True, slots=True)
class Operation:
    type: str  # query, mutation, subscription
    name: str | None
    fields: tuple[str, ...] | None  # root fields; None: unknown (a registry entry that lists none)

    @property
    def label(self) -> str:
        return label(f"{self.type} {self.name or '(anonymous)'}")


_cache: OrderedDict[bytes, tuple[Operation, ...] | str] = OrderedDict()


def parse_document(document: str) -> tuple[Operation, ...]:
    """The operations of a document (rule 3); raises :class:`BodyRefused`. Cached by exact bytes (rule 1)."""
    key = document.encode("utf-8", "surrogatepass")
    found = _cache.get(key)
    if found is None:
        try:
            found = _operations(document)
        except BodyRefused as exc:
            found = str(exc)
        if len(key) <= CACHE_MAX_BYTES:
            _cache[key] = found
            if len(_cache) > CACHE_ENTRIES:
                _cache.popitem(last=False)
    else:
        _cache.move_to_end(key)
    if isinstance(found, str):
        raise BodyRefused(found)
    return found


def _operations(document: str) -> tuple[Operation, ...]:
    try:
        tree: DocumentNode = parse(document, no_location=True, max_tokens=MAX_TOKENS)
    except GraphQLError as exc:
        raise BodyRefused(f"GraphQL syntax error: {exc.message}"[:200]) from None
    except RecursionError:
        raise BodyRefused("GraphQL document nested too deeply") from None
    fragments: dict[str, FragmentDefinitionNode] = {}
    ops: list[OperationDefinitionNode] = []
    for definition in tree.definitions:
        if isinstance(definition, OperationDefinitionNode):
            ops.append(definition)
        elif isinstance(definition, FragmentDefinitionNode):
            name = definition.name.value
            if name in fragments:
                raise BodyRefused(f"fragment {label(name)!r} defined twice")
            fragments[name] = definition
        else:
            raise BodyRefused("a request document holds operations and fragments only")
    if not ops:
        raise BodyRefused("the document has no operation")
    names = [op.name.value if op.name else None for op in ops]
    if len(ops) > 1 and None in names:
        raise BodyRefused("an anonymous operation must be the only one")
    if len(set(names)) != len(names):
        raise BodyRefused("operation names are not unique")
    out = []
    for op, op_name in zip(ops, names, strict=True):
        fields: list[str] = []
        _root_fields(op.selection_set, fragments, fields, ())
        out.append(Operation(op.operation.value, op_name, tuple(dict.fromkeys(fields))))
    return tuple(out)


def _root_fields(selections: SelectionSetNode | None, fragments: dict[str, FragmentDefinitionNode], out: list[str],
                 seen: tuple[str, ...]) -> None:  # fmt: skip
    for selection in selections.selections if selections is not None else ():
        if isinstance(selection, FieldNode):
            out.append(selection.name.value)  # the field, never its alias
        elif isinstance(selection, InlineFragmentNode):
            _root_fields(selection.selection_set, fragments, out, seen)
        elif isinstance(selection, FragmentSpreadNode):
            name = selection.name.value
            if name in seen:
                raise BodyRefused(f"fragment {label(name)!r} spreads itself")
            fragment = fragments.get(name)
            if fragment is None:
                raise BodyRefused(f"unknown fragment {label(name)!r}")
            _root_fields(fragment.selection_set, fragments, out, (*seen, name))


@dataclass(frozen=True, slots=True)
class _Request:
    query: str | None
    operation_name: str | None
    hash: str | None
    ids: tuple[str, ...]


def _requests(request: BodyRequest) -> list[_Request]:
    """Rule 2: what the server will read as GraphQL requests."""
    if request.method == "GET":
        if request.body:
            raise BodyRefused("GET with a body")
        return [_from_query(request.query or "")]
    if request.method != "POST":
        raise BodyRefused(f"GraphQL is sent with GET or POST, not {label(request.method)}")
    if request.query and any(name in _PARAMS for name, _ in _query_pairs(request.query)):
        raise BodyRefused("a POST with GraphQL parameters in its URL too")
    if request.content_type == "application/graphql":
        try:
            return [_Request(request.body.decode("utf-8"), None, None, ())]
        except UnicodeDecodeError:
            raise BodyRefused("body is not UTF-8") from None
    if request.content_type != "application/json":
        raise BodyRefused(f"Content-Type {label(request.content_type or '(none)')!r} is not application/json")
    value = strict_json(request.body)
    items = value if isinstance(value, list) else [value]
    if not items or len(items) > MAX_BATCH:
        raise BodyRefused(f"a batch holds 1 to {MAX_BATCH} requests")
    return [_from_json(item) for item in items]


def _query_pairs(query: str) -> list[tuple[str, str]]:
    try:
        return parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query), errors="strict")
    except (ValueError, UnicodeDecodeError):
        raise BodyRefused("malformed query string") from None


def _from_query(query: str) -> _Request:
    values: dict[str, str] = {}
    for name, value in _query_pairs(query):
        if name in values and name in _PARAMS:
            raise BodyRefused(f"duplicate {label(name)!r} parameter")
        values[name] = value
    extensions: Any = None
    if "extensions" in values:
        extensions = strict_json(values["extensions"].encode())
    return _build(values.get("query"), values.get("operationName"), extensions,
                  [values[k] for k in ("id", "documentId", "doc_id") if k in values])  # fmt: skip


def _from_json(item: Any) -> _Request:
    if not isinstance(item, dict):
        raise BodyRefused("a GraphQL request is a JSON object")
    query, name = item.get("query"), item.get("operationName")
    if query is not None and not isinstance(query, str):
        raise BodyRefused("query is not a string")
    if name is not None and not isinstance(name, str):
        raise BodyRefused("operationName is not a string")
    ids = [item[k] for k in ("id", "documentId", "doc_id") if item.get(k) is not None]
    if not all(isinstance(i, str) for i in ids):
        raise BodyRefused("a persisted query id is a string")
    return _build(query, name, item.get("extensions"), ids)


def _build(query: str | None, name: str | None, extensions: Any, ids: Sequence[str]) -> _Request:
    digest = None
    if extensions is not None:
        if not isinstance(extensions, dict):
            raise BodyRefused("extensions is not an object")
        persisted = extensions.get("persistedQuery")
        if persisted is not None:
            digest = persisted.get("sha256Hash") if isinstance(persisted, dict) else None
            if not isinstance(digest, str):
                raise BodyRefused("persistedQuery without a sha256Hash string")
    if len(set(ids)) > 1:
        raise BodyRefused("several persisted query ids that differ")
    if query is not None and digest is not None and hashlib.sha256(query.encode()).hexdigest() != digest.lower():
        raise BodyRefused("the document and its persisted query hash disagree")
    if query is None and digest is None and not ids:
        raise BodyRefused("no query")
    return _Request(query, name, digest, tuple(ids))


def _registered(route: BodyRoute, req: _Request) -> list[Operation] | None:
    """Rule 5: a hash-only request's registry entry, as an operation; None when not registered."""
    if route.selected.endpoint.persisted_queries != "allow_registered":
        return None
    registry = dict(route.selected.endpoint.graphql_persisted_queries)
    keys = [k for k in (req.hash, *req.ids) if k is not None]
    known = [k for k in keys if k in registry]
    if not known:
        return None
    if len(known) != len(keys) or len({registry[k] for k in known}) > 1:
        raise BodyRefused("a persisted query id and hash that name different entries")
    entry = registry[known[0]]
    assert entry.operation_type is not None
    return [Operation(entry.operation_type, entry.operation_name, entry.fields)]


def _operations_of(route: BodyRoute, req: _Request) -> list[Operation] | None:
    if req.query is None:
        return _registered(route, req)
    ops = parse_document(req.query)
    if req.operation_name is not None and req.operation_name not in {op.name for op in ops}:
        raise BodyRefused(f"operationName {label(req.operation_name)!r} names no operation of the document")
    return list(ops)


def _fields(op: Operation) -> tuple[str, ...] | None:
    return None if op.fields is None else tuple(f for f in op.fields if f != "__typename")


def _matches(rule: CompiledL7Rule, op: Operation, *, deny: bool) -> bool:
    if rule.operation_type is None or rule.operation_type not in ("*", op.type):
        return False
    if rule.operation_name is not None and (op.name is None or not rule.operation_name.matches(op.name)):
        return False
    if rule.fields is None:
        return True
    fields = _fields(op)
    if fields is None:  # a registry entry without fields: unknown, so a deny fires and an allow does not
        return deny
    if deny:
        return any(g.matches(f) for f in fields for g in rule.fields)
    return all(any(g.matches(f) for g in rule.fields) for f in fields)


def _first(configs: Iterable[CompiledEndpoint], op: Operation,
           *, deny: bool) -> tuple[CompiledEndpoint, CompiledL7Rule] | None:  # fmt: skip
    for cep in configs:
        for rule in cep.denies if deny else cep.allows:
            if _matches(rule, op, deny=deny):
                return cep, rule
    return None


def decide(route: BodyRoute, request: BodyRequest) -> Decision:
    """A ``protocol: graphql`` request."""
    try:
        requests = _requests(request)
        batches = [(_operations_of(route, req), req) for req in requests]
    except BodyRefused as exc:
        return refused(route, str(exc))
    return _judge(route, batches)


WS_PASSIVE = frozenset({"connection_init", "ping", "pong", "complete", "stop", "connection_terminate"})
WS_OPERATIONS = frozenset({"subscribe", "start"})


def decide_ws_message(route: BodyRoute, message: bytes) -> Decision | None:
    """Rule 7, GraphQL over WebSocket: one whole client message (graphql-transport-ws or the older
    subscriptions-transport-ws). ``subscribe``/``start`` carry a GraphQL request in ``payload``, decided as a POSTed
    one is; the protocol's other client messages execute nothing and pass (``None``); anything else, and a message
    that is not a JSON object with a string ``type``, is a hard deny."""
    try:
        value = strict_json(message)
        if not isinstance(value, dict) or not isinstance(value.get("type"), str):
            raise BodyRefused("a GraphQL over WebSocket message is a JSON object with a string type")
        kind = value["type"]
        if kind in WS_PASSIVE:
            return None
        if kind not in WS_OPERATIONS:
            raise BodyRefused(f"unknown GraphQL over WebSocket message type {label(kind)!r}")
        req = _from_json(value.get("payload"))
        batches = [(_operations_of(route, req), req)]
    except BodyRefused as exc:
        return refused(route, str(exc))
    return _judge(route, batches)


def _judge(route: BodyRoute, batches: list[tuple[list[Operation] | None, _Request]]) -> Decision:
    last: tuple[CompiledEndpoint, CompiledL7Rule, Operation] | None = None
    count = 0
    for ops, req in batches:
        if ops is None:
            return refused(route, "GraphQL persisted query is not registered",
                           reason=DenyReason.PERSISTED_QUERY_UNREGISTERED,
                           operation=label(f"persisted {req.hash or req.ids[0]}"))  # fmt: skip
        for op in ops:
            count += 1
            denied = _first(route.configs, op, deny=True)
            if denied is not None:
                return route.decision(Verdict.DENY, DenyReason.L7_DENIED,
                                      f"GraphQL operation blocked by endpoint policy: {op.label}", cep=denied[0],
                                      l7_rule=denied[1].label, operation=op.label)  # fmt: skip
            allowed = _first(route.configs, op, deny=False)
            if allowed is None:
                return route.decision(Verdict.DENY, DenyReason.L7_NO_ALLOW_RULE,
                                      f"GraphQL operation not permitted by policy: {op.label}",
                                      operation=op.label)  # fmt: skip
            last = (allowed[0], allowed[1], op)
    assert last is not None
    cep, rule, op = last
    shown = op.label if count == 1 else label(f"{count} operations, last {op.label}")
    return route.decision(Verdict.ALLOW, None, f"{shown} allowed by policy '{cep.rule.key}' {rule.label}", cep=cep,
                          l7_rule=rule.label, operation=shown)  # fmt: skip


def clear_cache() -> None:
    """Forget every parsed document (tests and benchmarks measure the cold parse)."""
    _cache.clear()
