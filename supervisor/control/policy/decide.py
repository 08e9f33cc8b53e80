"""Decisions: pure functions of (compiled policy, request). No I/O, no clocks, no logging.

Rules:

1. Deny by default. Every decision carries the rule key that matched (or none), the endpoint (``key[index]``),
   and, for a denial, a machine-readable ``DenyReason`` whose value is the exact string logged.
2. L4 (§3.3): a connection is allowed iff **one single rule** matches both the destination (some endpoint) and
   the caller (some binary: executable or an ancestor, never argv). Binaries and endpoints are never unioned
   across rules (§5 bug 33).
3. L7 (§3.10): allow rules are the union over every rule that matched at L4; a deny rule in any of them wins;
   a request that is not allowed is denied under ``enforcement: enforce`` and allowed-but-flagged (``audit``)
   otherwise. Requests whose target cannot be canonicalised are refused whatever the enforcement.
4. Identity failures deny: no identity, no executable path, or a digest that differs from the pinned one.
   Digest pins are the only state a decision touches (trust on first use records the first digest per path).
   With ``relaxed`` binary identity (the proxy-pod topology, or ``--binary-identity=relaxed``) the identity is
   not decided on: ``binaries`` lists and pins are ignored and only the destination matters.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .compiled import CompiledEndpoint, CompiledL7Rule, CompiledPolicy
from .decision import Decision, DenyReason, L4Request, Verdict
from .hosts import normalize_request_host
from .identity import BinaryIdentity, DigestPins
from .model import Enforcement, Protocol
from .paths import TargetError, canonicalize_target, parse_query

_METHOD = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def _deny(reason: DenyReason, detail: str, host: str, port: int, **extra: Any) -> Decision:
    endpoint = extra.pop("endpoint", f"{host}:{port}" if host else None)
    return Decision(
        Verdict.DENY, extra.pop("rule", None), endpoint, reason, detail=detail, host=host, port=port, **extra
    )


def quarantine_decision(req: L4Request, why: str = "") -> Decision:
    """What every decision is while control is in fail-closed quarantine (§3.15)."""
    host = normalize_request_host(req.host) or req.host
    detail = "policy validation failed; fail-closed quarantine is active" + (f": {why}" if why else "")
    return _deny(DenyReason.POLICY_QUARANTINED, detail, host, req.port)


def _identity_text(identity: BinaryIdentity) -> str:
    ancestors = " -> ".join(identity.ancestors)
    text = f"binary '{identity.path}' (ancestors: [{ancestors}]"
    if identity.cmdline_paths:
        text += f", cmdline: [{', '.join(identity.cmdline_paths)}]"
    if identity.loader_env:
        text += f", started with {', '.join(identity.loader_env)}: only binaries with allow_loader_env match"
    return text + ")"


L4_MEMO_LIMIT = 4096  # decisions remembered per policy generation; the memo starts afresh when full


def decide_l4(policy: CompiledPolicy, req: L4Request, pins: DigestPins | None = None) -> Decision:
    """Decide a connection to (host, port) by the process ``req.identity``.

    Everything but the digest pins is a pure function of the compiled policy and the request, so it is
    remembered per policy generation (``policy.l4_memo``, at most :data:`L4_MEMO_LIMIT` entries): a repeated
    request costs a dictionary lookup instead of the index walk, whatever the number of rules. The pins (trust on
    first use, state) are checked on every call, in the same place of the order as before.
    """
    port = req.port
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        return _deny(DenyReason.INVALID_PORT, f"invalid port {port!r}", req.host, 0, endpoint=None)
    if not isinstance(req.host, str):
        return _deny(DenyReason.INVALID_HOST, f"invalid destination host {req.host!r}", "", port, endpoint=None)
    key = (req.host, port, req.identity, req.relaxed)
    memo = policy.l4_memo
    found = memo.get(key)
    if found is None:
        if len(memo) >= L4_MEMO_LIMIT:
            memo.clear()
        found = memo[key] = _decide_l4(policy, req, port)
    early, decision = found
    if early is not None:  # decided before the pins are consulted
        return early
    identity = None if req.relaxed else req.identity
    if pins is not None and identity is not None:
        violation = pins.verify(identity)
        if violation is not None:
            reason = DenyReason.BINARY_DIGEST_MISSING if violation.missing else DenyReason.BINARY_DIGEST_CHANGED
            return _deny(reason, violation.describe(), decision.host, port)
    return decision


def _decide_l4(policy: CompiledPolicy, req: L4Request, port: int) -> tuple[Decision | None, Decision]:
    """``(denial decided before the digest pins or None, the decision once the pins passed)``."""
    host = normalize_request_host(req.host)
    if host is None:
        denial = _deny(DenyReason.INVALID_HOST, f"invalid destination host {req.host!r}", "", port, endpoint=None)
        return denial, denial
    if not policy.rules:
        denial = _deny(DenyReason.NO_NETWORK_POLICIES, "network connections not allowed by policy", host, port)
        return denial, denial
    identity = req.identity
    if req.relaxed:
        identity = None
    elif identity is None or not identity.path:
        denial = _deny(DenyReason.IDENTITY_MISSING, "the initiating process could not be identified", host, port)
        return denial, denial
    return None, _decide_l4_endpoints(policy, host, port, identity)


def _decide_l4_endpoints(policy: CompiledPolicy, host: str, port: int, identity: BinaryIdentity | None) -> Decision:
    candidates = policy.endpoints_for(host, port)
    if not candidates:
        return _deny(
            DenyReason.NO_MATCHING_ENDPOINT, f"endpoint {host}:{port} is not allowed by any policy", host, port
        )
    if identity is None:  # relaxed: every rule naming the endpoint matches
        return _allow(candidates, host, port)
    if len(candidates) == 1:  # the common case: one endpoint of one rule
        rule = candidates[0].rule
        if rule.binary_matches(identity):
            return _allow(candidates, host, port)
        return _binary_denial(identity, (rule.key,), host, port)
    matching: list[CompiledEndpoint] = []
    refused: list[str] = []
    verdicts: dict[int, bool] = {}  # rule position -> its binaries match; a rule may name (host, port) twice
    for cep in candidates:
        rule = cep.rule
        ok = verdicts.get(rule.position)
        if ok is None:
            ok = verdicts[rule.position] = rule.binary_matches(identity)
            if not ok:
                refused.append(rule.key)
        if ok:
            matching.append(cep)
    if not matching:
        return _binary_denial(identity, refused, host, port)
    return _allow(matching, host, port)


def _binary_denial(identity: BinaryIdentity, refused: Sequence[str], host: str, port: int) -> Decision:
    who = _identity_text(identity)
    detail = "; ".join(f"{who} not allowed in policy '{key}'" for key in refused)
    return _deny(DenyReason.BINARY_NOT_ALLOWED, detail, host, port, rule=None)


def _allow(matching: Sequence[CompiledEndpoint], host: str, port: int) -> Decision:
    """The allow decision of the endpoints (in candidate order) whose rule admitted the caller.

    The first endpoint with extended config governs (its TLS mode and ``allowed_ips``), else the first one; L7
    applies when an extended endpoint is inspected. One pass over precompiled fields (compiled.CompiledEndpoint).
    """
    first = matching[0]
    governing: CompiledEndpoint | None = None
    l7 = exact_host = transparent = False
    if len(matching) == 1:
        if first.extended:
            governing = first
            l7 = first.inspected
        exact_host = first.exact_name == host
        transparent = first.transparent
        rules: tuple[str, ...] = (first.rule.key,)
    else:
        keys: dict[str, None] = {}
        for cep in matching:
            if cep.extended:
                if governing is None:
                    governing = cep
                if cep.inspected:
                    l7 = True
            if cep.exact_name == host:
                exact_host = True
            if cep.transparent:
                transparent = True
            keys[cep.rule.key] = None
        rules = tuple(keys)
    allowed_ips: tuple[str, ...]
    if governing is None:  # no extended config: the first endpoint names the decision, defaults apply
        governing, tls_skip, allowed_ips = first, False, ()
    else:
        tls_skip, allowed_ips = governing.endpoint.tls_skip, governing.endpoint.allowed_ips
    key = governing.rule.key
    return Decision(
        Verdict.ALLOW,
        key,
        governing.label,
        None,
        l7=l7,
        detail=f"{host}:{port} allowed by policy '{key}'",
        host=host,
        port=port,
        rules=rules,
        tls_skip=tls_skip,
        allowed_ips=allowed_ips,
        exact_host=exact_host,
        transparent=transparent,
    )


def _first(
    configs: list[CompiledEndpoint], method: str, path: str, params: dict[str, list[str]], *, deny: bool
) -> tuple[CompiledEndpoint, CompiledL7Rule] | None:
    for cep in configs:
        for rule in cep.denies if deny else cep.allows:
            if not rule.method_matches(method) or not rule.path_matches(path):
                continue
            if rule.query_denies(params) if deny else rule.query_allows(params):
                return cep, rule
    return None


@dataclass(frozen=True, slots=True)
class BodyRoute:
    """A request routed to a JSON-RPC, MCP or GraphQL endpoint: its body decides (``supervisor/control/l7``'s
    ``jsonrpc``, ``mcp`` and ``graphql``). ``configs`` are the routed endpoints of the selected one's protocol and
    path rank: a GraphQL (or RPC) endpoint whose path matched is authoritative over broader REST rules (§3.10.5),
    and its allows are the union over every rule that admitted the connection."""

    l4: Decision
    protocol: Protocol
    selected: CompiledEndpoint
    configs: tuple[CompiledEndpoint, ...]
    method: str
    path: str
    query: str | None

    @property
    def limit(self) -> int:
        return min(c.endpoint.body_limit for c in self.configs)

    @property
    def enforce(self) -> bool:
        return self.selected.endpoint.enforcement is Enforcement.ENFORCE

    def decision(self, verdict: Verdict, reason: DenyReason | None, detail: str, *, hard: bool = False,
                 cep: CompiledEndpoint | None = None, l7_rule: str | None = None,
                 operation: str | None = None) -> Decision:  # fmt: skip
        """The request's decision: a denial that is not ``hard`` is allowed-but-flagged under ``audit``."""
        where = cep or self.selected
        audit = verdict is Verdict.DENY and not hard and not self.enforce
        return Decision(
            Verdict.ALLOW if audit else verdict, where.rule.key, where.label, reason, audit=audit, l7=True,
            detail=detail, host=self.l4.host, port=self.l4.port, rules=self.l4.rules, method=self.method,
            path=self.path, query=self.query, l7_rule=l7_rule, operation=operation,
        )  # fmt: skip


def decide_l7(policy: CompiledPolicy, l4: Decision, method: str, raw_target: str) -> Decision:
    """Decide one HTTP request inside a connection that ``l4`` admitted (same policy generation).

    A request to a JSON-RPC, MCP or GraphQL endpoint is denied ``l7-body-pending`` here, whatever the
    enforcement: only its body decides it (:func:`body_route`)."""
    routed = route_l7(policy, l4, method, raw_target)
    if isinstance(routed, Decision):
        return routed
    detail = f"{routed.method} {routed.path}: the {routed.protocol} request body decides"
    return routed.decision(Verdict.DENY, DenyReason.L7_BODY_PENDING, detail, hard=True)


def body_route(policy: CompiledPolicy, l4: Decision, method: str, raw_target: str) -> BodyRoute | None:
    """Where a request whose body decides goes; ``None`` when :func:`decide_l7` decides it alone."""
    routed = route_l7(policy, l4, method, raw_target)
    return None if isinstance(routed, Decision) else routed


def has_graphql_rules(cep: CompiledEndpoint) -> bool:
    """A websocket endpoint with GraphQL policy: its GraphQL rules judge the messages after the upgrade."""
    return any(rule.operation_type is not None for rule in (*cep.allows, *cep.denies))


def graphql_ws_route(policy: CompiledPolicy, l4: Decision, raw_target: str) -> BodyRoute | None:
    """GraphQL over WebSocket: the route whose GraphQL rules judge every ``subscribe``/``start`` message of an
    upgrade to ``raw_target`` (its method/path rules judged the upgrade itself); ``None`` when the endpoint that
    governs the upgrade has no GraphQL rules."""
    if not l4.allowed:
        return None
    admitted = set(l4.rules)
    configs = [cep for cep in policy.endpoints_for(l4.host, l4.port) if cep.rule.key in admitted and cep.inspected]
    try:
        target = canonicalize_target(raw_target, allow_encoded_slash=any(c.endpoint.allow_encoded_slash
                                                                         for c in configs))  # fmt: skip
    except TargetError:
        return None
    routed = [c for c in configs if c.path_glob is None or c.path_glob.matches(target.path)]
    if not routed:
        return None
    selected = max(routed, key=lambda c: (c.rank, -c.rule.position, -c.index))
    if selected.endpoint.protocol is not Protocol.WEBSOCKET or not has_graphql_rules(selected):
        return None
    same = tuple(c for c in routed if c.endpoint.protocol is Protocol.WEBSOCKET and c.rank == selected.rank
                 and has_graphql_rules(c))  # fmt: skip
    return BodyRoute(l4, Protocol.WEBSOCKET, selected, same, "WEBSOCKET_TEXT", target.path, target.query)


def route_l7(policy: CompiledPolicy, l4: Decision, method: str, raw_target: str) -> Decision | BodyRoute:
    """The request's decision, or the body route of the agent's own protocols."""
    if not l4.allowed:
        return l4 if l4.reason is not None else _deny(DenyReason.L4_DENIED, "connection not allowed", l4.host, l4.port)
    admitted = set(l4.rules)
    configs = [cep for cep in policy.endpoints_for(l4.host, l4.port) if cep.rule.key in admitted and cep.inspected]
    if not _METHOD.fullmatch(method or ""):
        return _deny(
            DenyReason.METHOD_INVALID,
            f"invalid HTTP method {method!r}",
            l4.host,
            l4.port,
            rule=l4.rule,
            endpoint=l4.endpoint,
            rules=l4.rules,
            l7=bool(configs),
        )
    method = method.upper()
    if not configs:
        # not an inspected endpoint: nothing to decide per request
        return Decision(
            Verdict.ALLOW,
            l4.rule,
            l4.endpoint,
            None,
            detail="endpoint is not L7-inspected",
            host=l4.host,
            port=l4.port,
            rules=l4.rules,
            method=method,
            path=raw_target,
        )
    return _route_inspected(l4, configs, method, raw_target)


def _route_inspected(
    l4: Decision, configs: list[CompiledEndpoint], method: str, raw_target: str
) -> Decision | BodyRoute:
    """An inspected endpoint's request: its canonical target, the endpoint whose path it falls under, the body
    route of the agent's own protocols, or the REST rules' answer (``_decide_rules``)."""
    try:
        target = canonicalize_target(
            raw_target, allow_encoded_slash=any(c.endpoint.allow_encoded_slash for c in configs)
        )
    except TargetError as exc:
        return _deny(
            DenyReason.PATH_NOT_CANONICAL,
            str(exc),
            l4.host,
            l4.port,
            rule=l4.rule,
            endpoint=l4.endpoint,
            rules=l4.rules,
            l7=True,
            method=method,
            path=raw_target,
        )
    path = target.path
    routed = [c for c in configs if c.path_glob is None or c.path_glob.matches(path)]
    if not routed:
        return _deny(
            DenyReason.L7_NO_ENDPOINT_PATH,
            "no L7 endpoint path matched request",
            l4.host,
            l4.port,
            rule=l4.rule,
            endpoint=l4.endpoint,
            rules=l4.rules,
            l7=True,
            method=method,
            path=path,
        )
    selected = max(routed, key=lambda c: (c.rank, -c.rule.position, -c.index))
    where = {
        "rule": selected.rule.key,
        "endpoint": selected.label,
        "rules": l4.rules,
        "l7": True,
        "method": method,
        "path": path,
        "query": target.query,
    }
    if "%2F" in path and not selected.endpoint.allow_encoded_slash:
        return _deny(
            DenyReason.ENCODED_SLASH,
            f"encoded slash (%2F) in path; endpoint {selected.label} does not set allow_encoded_slash",
            l4.host,
            l4.port,
            **where,
        )
    protocol = selected.endpoint.protocol
    if protocol.reads_body:
        same = tuple(c for c in routed if c.endpoint.protocol is protocol and c.rank == selected.rank)
        return BodyRoute(l4, protocol, selected, same, method, path, target.query)
    routed = [c for c in routed if not c.endpoint.protocol.reads_body]  # their rules say nothing of REST requests
    try:
        params = parse_query(target.query)
    except TargetError as exc:
        return _deny(DenyReason.QUERY_INVALID, str(exc), l4.host, l4.port, **where)
    return _decide_rules(l4, routed, selected, method, path, target.query, params)


def _decide_rules(
    l4: Decision,
    routed: list[CompiledEndpoint],
    selected: CompiledEndpoint,
    method: str,
    path: str,
    query: str | None,
    params: dict[str, list[str]],
) -> Decision:
    """The REST rules of the endpoints the path routed to: a deny rule wins, then an allow rule; otherwise the
    selected endpoint's enforcement says whether the request is denied or allowed under audit."""
    denied = _first(routed, method, path, params, deny=True)
    allowed = None if denied else _first(routed, method, path, params, deny=False)
    if allowed is not None:
        cep, rule = allowed
        return Decision(
            Verdict.ALLOW,
            cep.rule.key,
            cep.label,
            None,
            l7=True,
            detail=f"{method} {path} allowed by policy '{cep.rule.key}' {rule.label}",
            host=l4.host,
            port=l4.port,
            rules=l4.rules,
            method=method,
            path=path,
            query=query,
            l7_rule=rule.label,
        )
    if denied is not None:
        cep, rule = denied
        reason, detail, rule_key, label, l7_rule = (
            DenyReason.L7_DENIED,
            f"{method} {path} blocked by deny rule",
            cep.rule.key,
            cep.label,
            rule.label,
        )
    else:
        reason, detail, rule_key, label, l7_rule = (
            DenyReason.L7_NO_ALLOW_RULE,
            f"{method} {path} not permitted by policy",
            selected.rule.key,
            selected.label,
            None,
        )
    audit = selected.endpoint.enforcement is not Enforcement.ENFORCE
    return Decision(
        Verdict.ALLOW if audit else Verdict.DENY,
        rule_key,
        label,
        reason,
        audit=audit,
        l7=True,
        detail=detail,
        host=l4.host,
        port=l4.port,
        rules=l4.rules,
        method=method,
        path=path,
        query=query,
        l7_rule=l7_rule,
    )
