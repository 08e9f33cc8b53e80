"""L7 allow and deny rules of an endpoint (docs/reference/policy.md §1.5): method, path glob and query matchers.

Allow rules are wrapped (``rules: [{allow: {...}}]``), deny rules are flat (``deny_rules: [{...}]``); REST and
WebSocket rules require ``method`` and ``path``; the GraphQL, JSON-RPC and MCP rule shapes are read by
``schema_rpc``. A websocket endpoint may also hold GraphQL rules (GraphQL over WebSocket): they judge each
``subscribe``/``start`` message after the upgrade, while its method/path rules judge the upgrade; a rule mixing the
two shapes, or a ``WEBSOCKET_TEXT`` allow beside GraphQL rules, is refused (V32). SQL rule fields are refused as not
supported yet. Query matchers are a glob string, ``{glob: ...}`` or ``{any: [...]}`` (V33).
"""

from __future__ import annotations

import re

import yaml

from .globs import GlobSyntaxError, compile_path_glob, compile_value_glob
from .model import L7Rule, Protocol, QueryMatcher
from .schema_rpc import GRAPHQL_KEYS, read_graphql_rule, read_jsonrpc_rule, read_mcp_rule
from .yamlnodes import Reader

L7_RULE_KEYS = ("method", "path", "query")
L7_RULE_NOT_YET = {"command": "SQL rules (command)"}
L7_RULE_ELSEWHERE = {"operation_type": "graphql", "operation_name": "graphql", "fields": "graphql", "tool": "mcp",
                     "params": "mcp or json-rpc"}  # fmt: skip
KNOWN_METHODS = {
    Protocol.REST: {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "*"},
    Protocol.WEBSOCKET: {"GET", "WEBSOCKET_TEXT", "*"},
}
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")

Node = yaml.Node


def read_l7_rules(
    r: Reader,
    base: str,
    items: dict[str, tuple[Node, Node]],
    protocol: Protocol,
    *,
    allow: bool,
    profile: bool = False,
    strict: bool = True,
) -> tuple[L7Rule, ...] | None:
    key = "rules" if allow else "deny_rules"
    if key not in items:
        return None
    where = f"{base}.{key}"
    seq = r.sequence(items[key][1], where)
    if seq is None:
        return None
    if not seq:
        r.error(where, items[key][1], f"{key} list cannot be empty")
        return None
    out: list[L7Rule] = []
    lacking_allow = 0
    for i, entry in enumerate(seq):
        entry_path = f"{where}[{i}]"
        body_node: Node = entry
        if allow:
            wrapper = r.mapping(entry, entry_path)
            if wrapper is None:
                continue
            r.check_keys(wrapper, entry_path, ("allow",))
            if "allow" not in wrapper:
                lacking_allow += 1
                r.error(entry_path, entry, "rule has no allow clause", "{allow: {method: ..., path: ...}}")
                continue
            body_node = wrapper["allow"][1]
            entry_path = f"{entry_path}.allow"
        rule = read_rule(r, entry_path, body_node, protocol, allow=allow, profile=profile, strict=strict)
        if rule is not None:
            out.append(rule)
    if allow and lacking_allow == len(seq):
        r.error(where, items[key][1], "rules would deny all traffic: no entry has an allow clause")
    return tuple(out)


Rules = tuple[L7Rule, ...] | None


def check_websocket_graphql(r: Reader, base: str, items: dict[str, tuple[Node, Node]], rules: Rules,
                            deny_rules: Rules) -> None:  # fmt: skip
    """V32: on a websocket endpoint with GraphQL rules the GraphQL rules judge every message, so an allow of
    ``WEBSOCKET_TEXT`` (which would read as "every text message") contradicts them."""
    if not any(rule.operation_type is not None for rule in (*(rules or ()), *(deny_rules or ()))):
        return
    for i, rule in enumerate(rules or ()):
        if rule.operation_type is None and rule.method == "WEBSOCKET_TEXT":
            r.error(f"{base}.rules", items["rules"][1], f"rules[{i}] allows WEBSOCKET_TEXT on an endpoint with "
                    "GraphQL policy", "GraphQL rules decide its messages: allow GET for the upgrade only")  # fmt: skip


def read_rule(
    r: Reader, where: str, node: Node, protocol: Protocol, *, allow: bool, profile: bool, strict: bool
) -> L7Rule | None:
    """One rule body in the shape its endpoint's protocol takes."""
    if protocol is Protocol.GRAPHQL:
        return read_graphql_rule(r, where, node, allow=allow)
    if protocol is Protocol.JSON_RPC:
        return read_jsonrpc_rule(r, where, node)
    if protocol is Protocol.MCP:
        return read_mcp_rule(r, where, node, profile=profile, strict=strict)
    if protocol is Protocol.WEBSOCKET and isinstance(node, yaml.MappingNode):
        keys = {k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)}
        graphql = sorted(keys & set(GRAPHQL_KEYS))
        if graphql and keys & {"method", "path", "query"}:
            r.error(f"{where}.{graphql[0]}", node, "a websocket rule must not mix method/path/query with GraphQL "
                    "fields", "either method/path/query or operation_type/operation_name/fields")  # fmt: skip
            return None
        if graphql:
            return read_graphql_rule(r, where, node, allow=allow)
    return read_l7_rule(r, where, node, protocol)


def read_l7_rule(r: Reader, where: str, node: Node, protocol: Protocol) -> L7Rule | None:
    items = r.mapping(node, where)
    if items is None:
        return None
    for key, (key_node, _) in items.items():
        if key in L7_RULE_ELSEWHERE:
            r.error(f"{where}.{key}", key_node, f"{key!r} is a rule field of protocol {L7_RULE_ELSEWHERE[key]}, "
                    f"not {protocol or 'plain L4'}")  # fmt: skip
    r.check_keys({k: v for k, v in items.items() if k not in L7_RULE_ELSEWHERE}, where, L7_RULE_KEYS, L7_RULE_NOT_YET)
    method = path = None
    if "method" not in items:
        r.error(f"{where}.method", node, "missing required key 'method'", "an HTTP method or '*'")
    else:
        m_node = items["method"][1]
        raw = r.string(m_node, f"{where}.method", allow_empty=False)
        if raw is not None:
            if raw != "*" and _TOKEN.fullmatch(raw) is None:
                r.error(f"{where}.method", m_node, f"invalid HTTP method {raw!r}", "an HTTP token or '*'")
            else:
                method = raw.upper()
                known = KNOWN_METHODS.get(protocol, KNOWN_METHODS[Protocol.REST])
                if method not in known:
                    r.warn(f"{where}.method", m_node, f"unusual method {raw!r} (known: {', '.join(sorted(known))})")
    if "path" not in items:
        r.error(f"{where}.path", node, "missing required key 'path'", "a path glob such as /repos/** or **")
    else:
        p_node = items["path"][1]
        raw_path = r.string(p_node, f"{where}.path", allow_empty=False)
        if raw_path is not None:
            if not (raw_path.startswith("/") or raw_path.startswith("**")):
                r.error(f"{where}.path", p_node, f"rule path {raw_path!r} must start with '/' or '**'")
            else:
                try:
                    compile_path_glob(raw_path)
                    path = raw_path
                except GlobSyntaxError as exc:
                    r.error(f"{where}.path", p_node, f"invalid path glob: {exc}")
    query: list[tuple[str, QueryMatcher]] = []
    query_ok = True
    if "query" in items:
        q_items = r.mapping(items["query"][1], f"{where}.query")
        if q_items is None:
            query_ok = False
        else:
            for name, (_, value_node) in sorted(q_items.items()):
                matcher = read_query_matcher(r, f"{where}.query.{name}", value_node)
                if matcher is None:
                    query_ok = False
                else:
                    query.append((name, matcher))
    if method is None or path is None or not query_ok:
        return None
    return L7Rule(method, path, tuple(query))


def read_query_matcher(r: Reader, where: str, node: Node) -> QueryMatcher | None:
    globs: list[str] = []
    if isinstance(node, yaml.ScalarNode):
        value = r.string(node, where)
        if value is None:
            return None
        globs = [value]
    elif isinstance(node, yaml.MappingNode):
        items = r.mapping(node, where)
        if items is None:
            return None
        unknown = [k for k in items if k not in ("glob", "any")]
        if unknown:
            r.error(where, node, "unknown matcher keys; only `glob` or `any` are supported", "glob or any")
            return None
        if "glob" in items and "any" in items:
            r.error(where, node, "matcher cannot specify both `glob` and `any`")
            return None
        if "glob" in items:
            value = r.string(items["glob"][1], f"{where}.glob")
            if value is None:
                return None
            globs = [value]
        elif "any" in items:
            seq = r.sequence(items["any"][1], f"{where}.any")
            if seq is None:
                return None
            if not seq:
                r.error(f"{where}.any", items["any"][1], "any: list must not be empty")
                return None
            for i, item in enumerate(seq):
                value = r.string(item, f"{where}.any[{i}]")
                if value is None:
                    return None
                globs.append(value)
        else:
            r.error(where, node, "matcher needs `glob` or `any`")
            return None
    else:
        r.error(where, node, "expected a glob string, {glob: ...} or {any: [...]}")
        return None
    for glob in globs:
        try:
            compile_value_glob(glob)
        except GlobSyntaxError as exc:
            r.error(where, node, f"invalid glob {glob!r}: {exc}")
            return None
    return QueryMatcher(tuple(globs))
