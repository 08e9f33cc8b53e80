"""What a policy decision is (docs/reference/policy.md §2): the request, the verdict, the reason and the decision
with its rule — the types ``decide.py`` produces and ``compiled.py`` remembers per generation (apart from both,
so that neither imports the other for a type)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from supervisor.protocol.json_value import JsonValue

from .identity import BinaryIdentity

__all__ = ["Decision", "DenyReason", "L4Request", "Verdict"]


class Verdict(enum.StrEnum):
    ALLOW = "allow"
    DENY = "deny"


class DenyReason(enum.StrEnum):
    POLICY_QUARANTINED = "policy-quarantined"
    NO_NETWORK_POLICIES = "no-network-policies"
    NO_MATCHING_ENDPOINT = "no-matching-endpoint"
    BINARY_NOT_ALLOWED = "binary-not-allowed"
    BINARY_DIGEST_CHANGED = "binary-digest-changed"
    BINARY_DIGEST_MISSING = "binary-digest-missing"
    IDENTITY_MISSING = "identity-missing"
    INVALID_HOST = "invalid-host"
    INVALID_PORT = "invalid-port"
    L4_DENIED = "l4-denied"
    L7_DENIED = "l7-denied"
    L7_NO_ALLOW_RULE = "l7-no-allow-rule"
    L7_NO_ENDPOINT_PATH = "l7-no-endpoint-path"
    PATH_NOT_CANONICAL = "path-not-canonical"
    ENCODED_SLASH = "encoded-slash"
    QUERY_INVALID = "query-invalid"
    METHOD_INVALID = "method-invalid"
    # the agent's own protocols (§3.10.5): decided on the request body
    L7_BODY_PENDING = "l7-body-pending"  # decide_l7's answer until the body is read: never forwarded on its own
    BODY_INVALID = "body-invalid"  # unparseable or ambiguous body: a hard deny, in audit too
    BODY_TOO_LARGE = "body-too-large"
    RESPONSE_FRAME = "response-frame"  # a JSON-RPC response sent client to server
    PERSISTED_QUERY_UNREGISTERED = "persisted-query-unregistered"


@dataclass(frozen=True, slots=True)
class L4Request:
    host: str  # as the client asked: name or IP literal, any case, maybe a trailing dot
    port: int
    identity: BinaryIdentity | None
    relaxed: bool = False  # endpoint-only identity: binaries and digest pins are not decided on


@dataclass(frozen=True, slots=True, init=False)  # the __init__ below is the generated one, only faster
class Decision:
    verdict: Verdict
    rule: str | None
    endpoint: str | None  # "github[0]" when an endpoint matched, else "host:port"
    reason: DenyReason | None
    audit: bool = False  # enforcement: audit turned this denial into an allow
    l7: bool = False  # the endpoint asks for L7 inspection: control must parse and call decide_l7
    detail: str = ""  # one human sentence, safe to log and to return in a 403 body
    host: str = ""  # normalised destination host
    port: int = 0
    rules: tuple[str, ...] = ()  # every rule key whose endpoint and binary matched (L7 unions over these)
    tls_skip: bool = False  # raw tunnel: no TLS termination, no L7, no credentials
    allowed_ips: tuple[str, ...] = ()  # SSRF allowlist from the governing endpoint
    exact_host: bool = False  # a matching rule names this host exactly (not by glob): §3.5 ExactDeclaredHost
    transparent: bool = False  # a ``protocol: tcp`` endpoint matched
    method: str | None = None  # L7 only
    path: str | None = None  # L7 only: the canonical path, which is what must be sent upstream
    query: str | None = None  # L7 only: verbatim query (never logged by to_json)
    l7_rule: str | None = field(default=None)  # L7 only: "rules[1]", "deny_rules[0]", "access:read-only"
    # JSON-RPC, MCP, GraphQL: what was called, bounded ("tools/call read_file", "query Viewer"); never arguments
    operation: str | None = None

    def __init__(
        self,
        verdict: Verdict,
        rule: str | None,
        endpoint: str | None,
        reason: DenyReason | None,
        audit: bool = False,
        l7: bool = False,
        detail: str = "",
        host: str = "",
        port: int = 0,
        rules: tuple[str, ...] = (),
        tls_skip: bool = False,
        allowed_ips: tuple[str, ...] = (),
        exact_host: bool = False,
        transparent: bool = False,
        method: str | None = None,
        path: str | None = None,
        query: str | None = None,
        l7_rule: str | None = None,
        operation: str | None = None,
    ) -> None:
        # The fields and defaults above, in order (tests/unit/test_policy_index.py compares the two). A frozen
        # dataclass's generated __init__ stores each field through object.__setattr__; the slots' own setters do
        # the same work in about half the time, and every decision (one per connection, one per L7 request)
        # builds one of these.
        _set_verdict(self, verdict)
        _set_rule(self, rule)
        _set_endpoint(self, endpoint)
        _set_reason(self, reason)
        _set_audit(self, audit)
        _set_l7(self, l7)
        _set_detail(self, detail)
        _set_host(self, host)
        _set_port(self, port)
        _set_rules(self, rules)
        _set_tls_skip(self, tls_skip)
        _set_allowed_ips(self, allowed_ips)
        _set_exact_host(self, exact_host)
        _set_transparent(self, transparent)
        _set_method(self, method)
        _set_path(self, path)
        _set_query(self, query)
        _set_l7_rule(self, l7_rule)
        _set_operation(self, operation)

    @property
    def allowed(self) -> bool:
        return self.verdict is Verdict.ALLOW

    def to_json(self) -> dict[str, JsonValue]:
        body: dict[str, JsonValue] = {
            "result": str(self.verdict),
            "rule": self.rule,
            "endpoint": self.endpoint,
            "reason": None if self.reason is None else str(self.reason),
            "audit": self.audit,
            "l7": self.l7,
            "detail": self.detail,
            "destination": f"{self.host}:{self.port}" if self.host else None,
        }
        if self.allowed and not self.method:
            body["tls"] = "skip" if self.tls_skip else "auto"
            if self.allowed_ips:
                body["allowed_ips"] = list(self.allowed_ips)
        if self.method is not None:
            body["method"] = self.method
            body["path"] = self.path  # query-free: query strings are never logged (§4.1)
            if self.l7_rule is not None:
                body["l7_rule"] = self.l7_rule
            if self.operation is not None:
                body["operation"] = self.operation
        return body

    def describe(self) -> str:
        """One line for people: ``allow github (github[0]) api.github.com:443`` / ``deny ...: reason: detail``."""
        where = f"{self.host}:{self.port}" if self.host else "-"
        if self.method is not None:
            where += f" {self.method}" + (f" {self.path}" if self.path is not None else "")
        if self.operation is not None:
            where += f" [{self.operation}]"
        if self.allowed and not self.audit:
            if self.l7_rule is not None:
                return f"allow {self.rule} ({self.endpoint}) {where} by {self.l7_rule}"
            return f"allow {self.rule} ({self.endpoint}) {where}" + (" [L7 inspected]" if self.l7 else "")
        if self.audit:
            return f"allow (audit; would deny: {self.reason}) {self.rule} ({self.endpoint}) {where}: {self.detail}"
        return f"deny {where}: {self.reason}: {self.detail}"


def _slot_setter(name: str) -> Callable[[Decision, Any], None]:
    setter: Callable[[Decision, Any], None] = Decision.__dict__[name].__set__
    return setter


_set_verdict = _slot_setter("verdict")
_set_rule = _slot_setter("rule")
_set_endpoint = _slot_setter("endpoint")
_set_reason = _slot_setter("reason")
_set_audit = _slot_setter("audit")
_set_l7 = _slot_setter("l7")
_set_detail = _slot_setter("detail")
_set_host = _slot_setter("host")
_set_port = _slot_setter("port")
_set_rules = _slot_setter("rules")
_set_tls_skip = _slot_setter("tls_skip")
_set_allowed_ips = _slot_setter("allowed_ips")
_set_exact_host = _slot_setter("exact_host")
_set_transparent = _slot_setter("transparent")
_set_method = _slot_setter("method")
_set_path = _slot_setter("path")
_set_query = _slot_setter("query")
_set_l7_rule = _slot_setter("l7_rule")
_set_operation = _slot_setter("operation")
