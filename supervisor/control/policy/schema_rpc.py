"""The agent's own protocols in a policy (docs/reference/policy.md §1.4-1.5, V25-V27, V29-V32): JSON-RPC, MCP and
GraphQL rules and the endpoint options that go with them.

Rules (V-numbers are §1.10's):

* JSON-RPC rules name ``method`` only: an exact method or ``*``. Globs, ``params``, ``tool``, ``path`` and
  ``query`` are refused (V30).
* MCP rules name ``method`` (exact or ``*``; globs only inside the ``tools/`` family) and may select tools with
  ``tool`` (a glob or ``{any: [...]}``) or its lower-level spelling ``params.name`` — never both, never another
  ``params`` key, and only with ``method: tools/call`` unless the method profile is on (V31). A tool glob needs
  ``strict_tool_names`` (a name outside ``[A-Za-z0-9_.-]`` could otherwise play games with the glob).
* GraphQL rules name ``operation_type`` (``query``, ``mutation``, ``subscription``; ``*`` only in deny rules),
  ``operation_name`` (a glob) and ``fields`` (root-field globs) (V27).
* ``persisted_queries`` is ``deny`` or ``allow_registered`` (V25); every ``*max_body_bytes`` is a positive
  integer (V26); ``mcp`` options only on an ``mcp`` endpoint and ``json_rpc`` only on a ``json-rpc`` one (V29).
"""

from __future__ import annotations

import re
from typing import TypedDict

import yaml

from .globs import GlobSyntaxError, compile_value_glob
from .model import L7Rule, Protocol, QueryMatcher
from .yamlnodes import Reader

Node = yaml.Node
Items = dict[str, tuple[Node, Node]]

GRAPHQL_KEYS = ("operation_type", "operation_name", "fields")
REST_KEYS = ("method", "path", "query")
OPERATION_TYPES = ("query", "mutation", "subscription")
PERSISTED_MODES = ("deny", "allow_registered")
MCP_OPTION_KEYS = ("max_body_bytes", "strict_tool_names", "allow_all_known_mcp_methods")
MAX_BODY_BYTES = 16 * 1024 * 1024  # far above any sane bound; the buffer is held in control's memory
_RPC_METHOD = re.compile(r"[^\x00-\x1f\x7f]{1,256}")


class EndpointOptions(TypedDict, total=False):
    """The protocol options of one endpoint, each an ``Endpoint`` field of the same name; a key is present only
    when the policy set it (the endpoint keeps its default otherwise)."""

    persisted_queries: str
    graphql_max_body_bytes: int
    graphql_persisted_queries: tuple[tuple[str, L7Rule], ...]
    json_rpc_max_body_bytes: int
    mcp_max_body_bytes: int
    mcp_strict_tool_names: bool
    mcp_allow_all_known_methods: bool


def positive_int(r: Reader, where: str, node: Node) -> int | None:
    """V26: a positive integer (at most 16 MiB: control holds the buffer)."""
    value = r.integer(node, where)
    if value is None:
        return None
    if not 0 < value <= MAX_BODY_BYTES:
        r.error(where, node, f"{value} is not a positive body limit", f"an integer in 1..{MAX_BODY_BYTES}")
        return None
    return value


def read_options(r: Reader, base: str, items: Items, protocol: Protocol) -> EndpointOptions:
    """The protocol options of one endpoint, as ``Endpoint`` keyword arguments (V25, V26, V27 registry, V29)."""
    out: EndpointOptions = {}

    def at(key: str) -> str:
        return f"{base}.{key}"

    if "persisted_queries" in items:
        node = items["persisted_queries"][1]
        mode = r.string(node, at("persisted_queries"))
        if mode is not None and mode not in PERSISTED_MODES:
            r.error(at("persisted_queries"), node, f"unknown persisted_queries mode {mode!r}",
                    "deny or allow_registered")  # fmt: skip
        elif mode is not None:
            out["persisted_queries"] = mode
    if "graphql_max_body_bytes" in items:
        value = positive_int(r, at("graphql_max_body_bytes"), items["graphql_max_body_bytes"][1])
        if value is not None:
            out["graphql_max_body_bytes"] = value
    if "graphql_persisted_queries" in items:
        out["graphql_persisted_queries"] = _registry(r, at("graphql_persisted_queries"),
                                                     items["graphql_persisted_queries"][1])  # fmt: skip
        if out.get("persisted_queries") != "allow_registered":
            r.warn(at("graphql_persisted_queries"), items["graphql_persisted_queries"][0],
                   "graphql_persisted_queries is used only with persisted_queries: allow_registered")  # fmt: skip
    for key in ("persisted_queries", "graphql_max_body_bytes", "graphql_persisted_queries"):
        if key in items and protocol is not Protocol.GRAPHQL:
            r.warn(at(key), items[key][0], f"{key} has no effect without protocol graphql")
    if "json_rpc" in items:
        node = items["json_rpc"][1]
        if protocol is not Protocol.JSON_RPC:
            r.error(at("json_rpc"), items["json_rpc"][0], "json_rpc options need protocol json-rpc")
        options = r.mapping(node, at("json_rpc"))
        if options is not None:
            r.check_keys(options, at("json_rpc"), ("max_body_bytes",))
            if "max_body_bytes" in options:
                value = positive_int(r, f"{at('json_rpc')}.max_body_bytes", options["max_body_bytes"][1])
                if value is not None:
                    out["json_rpc_max_body_bytes"] = value
    if "mcp" in items:
        node = items["mcp"][1]
        if protocol is not Protocol.MCP:
            r.error(at("mcp"), items["mcp"][0], "mcp options need protocol mcp")
        options = r.mapping(node, at("mcp"))
        if options is not None:
            r.check_keys(options, at("mcp"), MCP_OPTION_KEYS)
            if "max_body_bytes" in options:
                value = positive_int(r, f"{at('mcp')}.max_body_bytes", options["max_body_bytes"][1])
                if value is not None:
                    out["mcp_max_body_bytes"] = value
            if "strict_tool_names" in options:
                flag = r.boolean(options["strict_tool_names"][1], f"{at('mcp')}.strict_tool_names")
                if flag is not None:
                    out["mcp_strict_tool_names"] = flag
            if "allow_all_known_mcp_methods" in options:
                flag = r.boolean(options["allow_all_known_mcp_methods"][1], f"{at('mcp')}.allow_all_known_mcp_methods")
                if flag is not None:
                    out["mcp_allow_all_known_methods"] = flag
    return out


def _registry(r: Reader, where: str, node: Node) -> tuple[tuple[str, L7Rule], ...]:
    """``id -> {operation_type, operation_name?, fields?}``: what a hash-only request is matched as."""
    entries = r.mapping(node, where)
    if entries is None:
        return ()
    out = []
    for key, (_, entry) in sorted(entries.items()):
        if not key or len(key) > 256 or not key.isprintable():
            r.error(f"{where}.{key}", entry, "invalid persisted query id", "a printable id of at most 256 characters")
            continue
        rule = read_graphql_rule(r, f"{where}.{key}", entry, allow=True, registry=True)
        if rule is not None:
            out.append((key, rule))
    return tuple(out)


def _glob(r: Reader, where: str, node: Node) -> str | None:
    value = r.string(node, where, allow_empty=False)
    if value is None:
        return None
    try:
        compile_value_glob(value)
    except GlobSyntaxError as exc:
        r.error(where, node, f"invalid glob {value!r}: {exc}")
        return None
    return value


def read_graphql_rule(r: Reader, where: str, node: Node, *, allow: bool, registry: bool = False) -> L7Rule | None:
    """A GraphQL allow or deny rule, or a registry entry (V27)."""
    items = r.mapping(node, where)
    if items is None:
        return None
    for key in REST_KEYS:
        if key in items:
            r.error(f"{where}.{key}", items[key][0], f"GraphQL rules do not take {key!r}",
                    "operation_type, operation_name and fields")  # fmt: skip
    r.check_keys({k: v for k, v in items.items() if k not in REST_KEYS}, where, GRAPHQL_KEYS)
    ok = not any(key in items for key in REST_KEYS)
    op_type: str | None = None
    if "operation_type" not in items:
        r.error(f"{where}.operation_type", node, "missing required key 'operation_type'",
                "query, mutation or subscription")  # fmt: skip
        ok = False
    else:
        t_node = items["operation_type"][1]
        raw = r.string(t_node, f"{where}.operation_type")
        concrete = allow or registry
        if (raw is not None and raw.lower() in OPERATION_TYPES) or (raw == "*" and not concrete):
            op_type = raw.lower() if raw is not None else None
        else:
            if raw is not None:
                r.error(f"{where}.operation_type", t_node, f"unknown GraphQL operation_type {raw!r}",
                        "query, mutation or subscription" + ("" if concrete else " or '*'"))  # fmt: skip
            ok = False
    name: str | None = None
    if "operation_name" in items:
        name = _glob(r, f"{where}.operation_name", items["operation_name"][1])
        ok = ok and name is not None
    fields: tuple[str, ...] | None = None
    if "fields" in items:
        seq = r.sequence(items["fields"][1], f"{where}.fields")
        if seq is not None and not seq:
            r.error(f"{where}.fields", items["fields"][1], "fields list cannot be empty", "root-field globs")
        globs = [_glob(r, f"{where}.fields[{i}]", item) for i, item in enumerate(seq or [])]
        if seq and all(g is not None for g in globs):
            fields = tuple(g for g in globs if g is not None)
        else:
            ok = False
    if not ok or op_type is None:
        return None
    return L7Rule("", operation_type=op_type, operation_name=name, fields=fields)


def read_jsonrpc_rule(r: Reader, where: str, node: Node) -> L7Rule | None:
    """V30: ``method`` only, exact or ``*``."""
    items = r.mapping(node, where)
    if items is None:
        return None
    bad = False
    for key, (key_node, _) in items.items():
        if key != "method":
            bad = True
            known = key in ("params", "tool", "path", "query") or key in GRAPHQL_KEYS
            r.error(f"{where}.{key}", key_node,
                    f"JSON-RPC rules match the method only; {key!r} is not supported" if known else
                    f"unknown key {key!r}", "method")  # fmt: skip
    if "method" not in items:
        r.error(f"{where}.method", node, "missing required key 'method'", "a JSON-RPC method name or '*'")
        return None
    method = _rpc_method(r, f"{where}.method", items["method"][1])
    if method is None or bad:
        return None
    if method != "*" and any(c in method for c in "*?[{"):
        r.error(f"{where}.method", items["method"][1], f"JSON-RPC method {method!r} is a glob",
                "an exact method name or '*'")  # fmt: skip
        return None
    return L7Rule(method)


def _rpc_method(r: Reader, where: str, node: Node) -> str | None:
    method = r.string(node, where, allow_empty=False)
    if method is not None and _RPC_METHOD.fullmatch(method) is None:
        r.error(where, node, f"invalid method {method!r}", "at most 256 printable characters")
        return None
    return method


def read_mcp_rule(r: Reader, where: str, node: Node, *, profile: bool, strict: bool) -> L7Rule | None:
    """V31. With the method profile a rule may omit ``method``: ``tools/call`` when it selects a tool, else ``*``."""
    items = r.mapping(node, where)
    if items is None:
        return None
    ok = True
    for key, (key_node, _) in items.items():
        if key in ("path", "query") or key in GRAPHQL_KEYS:
            r.error(f"{where}.{key}", key_node, f"MCP rules do not take {key!r}", "method, tool or params.name")
            ok = False
        elif key not in ("method", "tool", "params"):
            r.error(f"{where}.{key}", key_node, f"unknown key {key!r}", "method, tool or params.name")
            ok = False
    method = ""
    if "method" in items:
        m_node = items["method"][1]
        got = _rpc_method(r, f"{where}.method", m_node)
        if got is None:
            ok = False
        elif got != "*" and any(c in got for c in "*?[{") and not got.startswith("tools/"):
            r.error(f"{where}.method", m_node, f"MCP method glob {got!r} is outside the tools/ family",
                    "an exact method, '*', or a tools/ glob such as tools/*")  # fmt: skip
            ok = False
        elif got != "*" and any(c in got for c in "*?[{"):
            try:
                compile_value_glob(got)
                method = got
            except GlobSyntaxError as exc:
                r.error(f"{where}.method", m_node, f"invalid glob {got!r}: {exc}")
                ok = False
        else:
            method = got
    elif not profile:
        r.error(f"{where}.method", node, "missing required key 'method'",
                "an MCP method, or mcp.allow_all_known_mcp_methods: true")  # fmt: skip
        ok = False
    tool: QueryMatcher | None = None
    tool_node: Node | None = None
    if "tool" in items:
        tool_node = items["tool"][1]
        tool = _tool_matcher(r, f"{where}.tool", tool_node)
        ok = ok and tool is not None
    if "params" in items:
        params = r.mapping(items["params"][1], f"{where}.params")
        if params is None:
            ok = False
        else:
            for key, (key_node, _) in params.items():
                if key != "name":
                    r.error(f"{where}.params.{key}", key_node, f"MCP rules match params.name only, not params.{key}",
                            "params.name (or tool)")  # fmt: skip
                    ok = False
            if "name" in params:
                if tool_node is not None:
                    r.error(f"{where}.params", items["params"][0], "tool and params.name are the same selector",
                            "one of them")  # fmt: skip
                    ok = False
                else:
                    tool_node = params["name"][1]
                    tool = _tool_matcher(r, f"{where}.params.name", tool_node)
                    ok = ok and tool is not None
    if tool is not None and tool_node is not None:
        if not method and profile:
            method = "tools/call"
        if method != "tools/call":
            r.error(f"{where}.tool", tool_node, f"a tool selector needs method tools/call, not {method or '(none)'!r}",
                    "method: tools/call")  # fmt: skip
            ok = False
        if not strict and any(any(c in g for c in "*?[{") for g in tool.globs):
            r.error(f"{where}.tool", tool_node, "a wildcard tool selector needs mcp.strict_tool_names: true",
                    "exact tool names, or strict_tool_names left on")  # fmt: skip
            ok = False
    if not method:
        method = "*"
    return L7Rule(method, tool=tool) if ok else None


def _tool_matcher(r: Reader, where: str, node: Node) -> QueryMatcher | None:
    if isinstance(node, yaml.ScalarNode):
        glob = _glob(r, where, node)
        return None if glob is None else QueryMatcher((glob,))
    items = r.mapping(node, where)
    if items is None:
        return None
    if set(items) != {"any"}:
        r.error(where, node, "a tool selector is a glob or {any: [...]}", "a glob string or {any: [globs]}")
        return None
    seq = r.sequence(items["any"][1], f"{where}.any")
    if seq is None:
        return None
    if not seq:
        r.error(f"{where}.any", items["any"][1], "any: list must not be empty")
        return None
    globs = [_glob(r, f"{where}.any[{i}]", item) for i, item in enumerate(seq)]
    if any(g is None for g in globs):
        return None
    return QueryMatcher(tuple(g for g in globs if g is not None))


def method_covers_call(method: str) -> bool:
    """Whether an MCP rule's method matches ``tools/call`` (``*``, ``tools/*``, ``tools/call``)."""
    if method == "*":
        return True
    try:
        return compile_value_glob(method).matches("tools/call")
    except GlobSyntaxError:
        return False
