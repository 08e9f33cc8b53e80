"""The validated policy document (docs/reference/policy.md §1), as frozen values.

A ``Policy`` is what the schema accepted, normalised (lower-case protocol and hosts, ``ports`` always a list,
``name`` defaulting to the key) but not yet expanded: ``access`` presets stay presets until compilation, so
``to_json`` gives back what the author meant and loads again to an equal ``Policy``.
"""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import dataclass, field

from supervisor.protocol.json_value import JsonValue

from .errors import PolicyWarning


class Protocol(enum.StrEnum):
    L4 = ""  # plain L4 through the explicit proxy / egress stream
    TCP = "tcp"  # L4 through policy DNS and transparent capture
    REST = "rest"
    WEBSOCKET = "websocket"
    GRAPHQL = "graphql"
    JSON_RPC = "json-rpc"
    MCP = "mcp"

    @property
    def inspected(self) -> bool:
        return self is not Protocol.L4 and self is not Protocol.TCP

    @property
    def reads_body(self) -> bool:
        """The agent's own protocols: decided on the request body, which control buffers first (§3.10.5)."""
        return self in (Protocol.GRAPHQL, Protocol.JSON_RPC, Protocol.MCP)


class Enforcement(enum.StrEnum):
    AUDIT = "audit"  # the upstream default: L7 violations are logged and allowed
    ENFORCE = "enforce"


class TlsMode(enum.StrEnum):
    AUTO = "auto"
    SKIP = "skip"


class AccessPreset(enum.StrEnum):
    READ_ONLY = "read-only"
    READ_WRITE = "read-write"
    FULL = "full"


class Compatibility(enum.StrEnum):
    BEST_EFFORT = "best_effort"
    HARD_REQUIREMENT = "hard_requirement"


@dataclass(frozen=True)
class QueryMatcher:
    """Matches one query parameter: any of ``globs`` (a single string in YAML is a one-element list)."""

    globs: tuple[str, ...]

    def to_json(self) -> JsonValue:
        return self.globs[0] if len(self.globs) == 1 else {"any": list(self.globs)}


DEFAULT_BODY_LIMIT = 65536  # graphql_max_body_bytes, json_rpc.max_body_bytes, mcp.max_body_bytes (§1.4)


@dataclass(frozen=True)
class L7Rule:
    """One allow or deny rule. REST/WebSocket use ``method`` (upper-case or ``*``), ``path`` and ``query``;
    JSON-RPC and MCP use ``method`` (the RPC method, exact, or ``*``; MCP also ``tools/…`` globs) and, for MCP,
    ``tool`` (``params.name``); GraphQL uses ``operation_type`` (lower-case or ``*``), ``operation_name`` and
    ``fields`` (root-field globs). Fields a protocol does not use stay empty."""

    method: str
    path: str = ""
    query: tuple[tuple[str, QueryMatcher], ...] = ()
    tool: QueryMatcher | None = None
    operation_type: str | None = None
    operation_name: str | None = None
    fields: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, JsonValue]:
        body: dict[str, JsonValue] = {}
        if self.method:
            body["method"] = self.method
        if self.path:
            body["path"] = self.path
        if self.query:
            body["query"] = {name: matcher.to_json() for name, matcher in self.query}
        if self.tool is not None:
            body["tool"] = self.tool.to_json()
        if self.operation_type is not None:
            body["operation_type"] = self.operation_type
        if self.operation_name is not None:
            body["operation_name"] = self.operation_name
        if self.fields is not None:
            body["fields"] = list(self.fields)
        return body


@dataclass(frozen=True)
class Endpoint:
    host: str  # normalised; "" for a hostless (allowed_ips-only) endpoint
    ports: tuple[int, ...]
    path: str = ""
    protocol: Protocol = Protocol.L4
    tls: TlsMode | None = None  # None: not written (auto)
    enforcement: Enforcement = Enforcement.AUDIT
    enforcement_explicit: bool = False
    access: AccessPreset | None = None
    rules: tuple[L7Rule, ...] | None = None
    deny_rules: tuple[L7Rule, ...] | None = None
    allowed_ips: tuple[str, ...] = ()  # normalised networks, e.g. "10.0.0.0/8"
    allow_encoded_slash: bool = False
    websocket_credential_rewrite: bool = False
    request_body_credential_rewrite: bool = False
    allow_uninspected_credentials: bool = False
    credential_binding: str | None = None  # provider name
    credential_signing: str | None = None  # sigv4, sigv4:body, sigv4:no_body (l7/signing.py)
    signing_service: str | None = None
    signing_region: str | None = None  # None: from the host name
    persisted_queries: str | None = None  # graphql: "deny" (the default) or "allow_registered"
    graphql_persisted_queries: tuple[tuple[str, L7Rule], ...] = ()  # registry id -> what the stored query is
    graphql_max_body_bytes: int | None = None
    json_rpc_max_body_bytes: int | None = None
    mcp_max_body_bytes: int | None = None
    mcp_strict_tool_names: bool | None = None  # None: not written (true)
    mcp_allow_all_known_methods: bool = False

    @property
    def body_limit(self) -> int:
        """How many request-body bytes control buffers to decide a request of this endpoint's protocol."""
        value = {
            Protocol.GRAPHQL: self.graphql_max_body_bytes,
            Protocol.JSON_RPC: self.json_rpc_max_body_bytes,
            Protocol.MCP: self.mcp_max_body_bytes,
        }.get(self.protocol)
        return DEFAULT_BODY_LIMIT if value is None else value

    @property
    def strict_tool_names(self) -> bool:
        return self.mcp_strict_tool_names is not False

    @property
    def tls_skip(self) -> bool:
        return self.tls is TlsMode.SKIP

    @property
    def extended(self) -> bool:
        """Whether the endpoint supplies connection metadata (§3.3 "extended config")."""
        return (self.protocol not in (Protocol.L4, Protocol.TCP)) or bool(self.allowed_ips) or self.tls is not None

    def to_json(self) -> dict[str, JsonValue]:
        body: dict[str, JsonValue] = {}
        if self.host:
            body["host"] = self.host
        body["ports"] = list(self.ports)
        if self.path:
            body["path"] = self.path
        if self.protocol is not Protocol.L4:
            body["protocol"] = str(self.protocol)
        if self.tls is not None:
            body["tls"] = str(self.tls)
        if self.enforcement_explicit:
            body["enforcement"] = str(self.enforcement)
        if self.access is not None:
            body["access"] = str(self.access)
        if self.rules is not None:
            body["rules"] = [{"allow": rule.to_json()} for rule in self.rules]
        if self.deny_rules is not None:
            body["deny_rules"] = [rule.to_json() for rule in self.deny_rules]
        if self.allowed_ips:
            body["allowed_ips"] = list(self.allowed_ips)
        for flag in (
            "allow_encoded_slash",
            "websocket_credential_rewrite",
            "request_body_credential_rewrite",
            "allow_uninspected_credentials",
        ):
            if getattr(self, flag):
                body[flag] = True
        if self.credential_binding is not None:
            body["credential_binding"] = {"provider": self.credential_binding}
        for key in ("credential_signing", "signing_service", "signing_region"):
            if getattr(self, key) is not None:
                body[key] = getattr(self, key)
        if self.persisted_queries is not None:
            body["persisted_queries"] = self.persisted_queries
        if self.graphql_persisted_queries:
            body["graphql_persisted_queries"] = {key: entry.to_json() for key, entry in self.graphql_persisted_queries}
        if self.graphql_max_body_bytes is not None:
            body["graphql_max_body_bytes"] = self.graphql_max_body_bytes
        if self.json_rpc_max_body_bytes is not None:
            body["json_rpc"] = {"max_body_bytes": self.json_rpc_max_body_bytes}
        mcp: dict[str, JsonValue] = {}
        if self.mcp_max_body_bytes is not None:
            mcp["max_body_bytes"] = self.mcp_max_body_bytes
        if self.mcp_strict_tool_names is not None:
            mcp["strict_tool_names"] = self.mcp_strict_tool_names
        if self.mcp_allow_all_known_methods:
            mcp["allow_all_known_mcp_methods"] = True
        if mcp:
            body["mcp"] = mcp
        return body


@dataclass(frozen=True)
class Binary:
    path: str  # absolute path or path glob (§2.3)
    # the process may still match with LD_PRELOAD/LD_AUDIT (or LD_LIBRARY_PATH naming a workload-writable
    # directory) in its initial environment (docs/policy.md "Loader injection")
    allow_loader_env: bool = False


@dataclass(frozen=True)
class NetworkRule:
    key: str  # decisions, logs and deny reasons use the key, never ``name``
    name: str
    endpoints: tuple[Endpoint, ...]
    binaries: tuple[Binary, ...]

    def to_json(self) -> dict[str, JsonValue]:
        body: dict[str, JsonValue] = {}
        if self.name != self.key:
            body["name"] = self.name
        body["endpoints"] = [ep.to_json() for ep in self.endpoints]
        body["binaries"] = [{"path": b.path, **({"allow_loader_env": True} if b.allow_loader_env else {})}
                            for b in self.binaries]  # fmt: skip
        return body


@dataclass(frozen=True)
class FilesystemPolicy:
    include_workdir: bool = False
    read_only: tuple[str, ...] = ()
    read_write: tuple[str, ...] = ()

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "include_workdir": self.include_workdir,
            "read_only": list(self.read_only),
            "read_write": list(self.read_write),
        }


@dataclass(frozen=True)
class LandlockPolicy:
    compatibility: Compatibility = Compatibility.BEST_EFFORT

    def to_json(self) -> dict[str, JsonValue]:
        return {"compatibility": str(self.compatibility)}


@dataclass(frozen=True)
class ProcessPolicy:
    run_as_user: str | None = None  # "sandbox" or a decimal id
    run_as_group: str | None = None

    def to_json(self) -> dict[str, JsonValue]:
        body: dict[str, JsonValue] = {}
        if self.run_as_user is not None:
            body["run_as_user"] = self.run_as_user
        if self.run_as_group is not None:
            body["run_as_group"] = self.run_as_group
        return body


@dataclass(frozen=True)
class Policy:
    version: int
    network_policies: tuple[NetworkRule, ...] = ()  # sorted by key: file order never matters
    filesystem_policy: FilesystemPolicy | None = None
    landlock: LandlockPolicy | None = None
    process: ProcessPolicy | None = None
    warnings: tuple[PolicyWarning, ...] = field(default=(), compare=False)
    source: str | None = field(default=None, compare=False)

    @property
    def rule_count(self) -> int:
        return len(self.network_policies)

    @property
    def endpoint_count(self) -> int:
        return sum(len(rule.endpoints) for rule in self.network_policies)

    def rule(self, key: str) -> NetworkRule | None:
        for rule in self.network_policies:
            if rule.key == key:
                return rule
        return None

    def has_tcp_endpoints(self) -> bool:
        return any(ep.protocol is Protocol.TCP for rule in self.network_policies for ep in rule.endpoints)

    def binary_paths(self) -> tuple[str, ...]:
        """Non-glob binary paths: the boundary resolves these for symlink aliases (§1.7)."""
        paths = {b.path for rule in self.network_policies for b in rule.binaries if "*" not in b.path}
        return tuple(sorted(paths))

    def static_json(self) -> dict[str, JsonValue]:
        """The static sections, as the boundary receives them at ``attach``."""
        body: dict[str, JsonValue] = {}
        if self.filesystem_policy is not None:
            body["filesystem_policy"] = self.filesystem_policy.to_json()
        if self.landlock is not None:
            body["landlock"] = self.landlock.to_json()
        if self.process is not None:
            body["process"] = self.process.to_json()
        return body

    def to_json(self) -> dict[str, JsonValue]:
        body: dict[str, JsonValue] = {"version": self.version}
        body.update(self.static_json())
        body["network_policies"] = {rule.key: rule.to_json() for rule in self.network_policies}
        return body

    @property
    def digest(self) -> str:
        """sha256 of the canonical JSON of the normalised policy; formatting and comments do not change it.

        Rule order in the file does not change it either (keys are sorted), matching the guarantee that
        reordering rules never changes a decision.
        """
        canonical = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode()).hexdigest()
