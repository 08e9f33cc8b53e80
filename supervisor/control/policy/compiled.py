"""The compiled policy: an index so that a decision costs about the same at 10 rules and at 10,000.

Theory of operation. A decision first needs the endpoints that match (host, port):

* exact hosts (and IP literals) live in one dictionary keyed by ``(host, port)``;
* host globs are bucketed by ``(port, literal suffix)`` where the literal suffix is the run of trailing labels
  without wildcards (``*.s3.*.amazonaws.com`` → ``amazonaws.com``); a lookup probes only the suffix lengths
  that occur in the policy, then checks the label count and the glob's regular expression — or not even that
  when every label in front of the suffix is a whole ``*`` (``*.api.example.com``, ``**.cdn.example.org``:
  ``HostGlob.suffix_decides``), since the bucket and the label count already decided;
* hostless (``allowed_ips``-only) endpoints are keyed by port.

Binaries are checked per rule, exact paths (plus symlink aliases the boundary resolved) by set membership first,
then the rule's globs; rules naming the same binaries share one set. What a decision reads of an endpoint (its
label, order, exact name, extended/inspected/tcp flags) is computed here once per policy generation, so an L4
decision is a few dictionary probes and one pass over the candidates at 10 rules as at 10,000
(``tests/unit/test_policy_index.py`` holds it equal to the straightforward scan). Rules are kept sorted by key
and every candidate list is in (rule key, endpoint index) order, so nothing a decision returns depends on the
order of rules in the file.

Access presets are expanded here (§1.6), after validation, into ordinary allow rules, and so is the MCP method
profile: with ``mcp.allow_all_known_mcp_methods`` and no rules, every method; with rules, the known MCP methods
other than ``tools/call`` (which the rules' tool selectors keep deciding) beside those rules.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar, cast

from .decision import Decision
from .globs import Glob, HostGlob, compile_host_glob, compile_path_glob, compile_value_glob, has_glob_chars
from .identity import BinaryIdentity
from .model import AccessPreset, Endpoint, L7Rule, NetworkRule, Policy, Protocol

_T = TypeVar("_T")

_PRESETS: dict[tuple[Protocol, AccessPreset], tuple[str, ...]] = {
    (Protocol.REST, AccessPreset.READ_ONLY): ("GET", "HEAD", "OPTIONS"),
    (Protocol.REST, AccessPreset.READ_WRITE): ("GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH"),
    (Protocol.REST, AccessPreset.FULL): ("*",),
    (Protocol.WEBSOCKET, AccessPreset.READ_ONLY): ("GET",),
    (Protocol.WEBSOCKET, AccessPreset.READ_WRITE): ("GET", "WEBSOCKET_TEXT"),
    (Protocol.WEBSOCKET, AccessPreset.FULL): ("*",),
}
_GRAPHQL_PRESETS: dict[AccessPreset, tuple[str, ...]] = {
    AccessPreset.READ_ONLY: ("query",),
    AccessPreset.READ_WRITE: ("query", "mutation"),
    AccessPreset.FULL: ("*",),
}
#: the client-to-server methods of MCP (2025-06-18) but ``tools/call``: what the method profile adds beside rules
MCP_PROFILE_METHODS = (
    "initialize",
    "ping",
    "notifications/initialized",
    "notifications/cancelled",
    "notifications/progress",
    "notifications/roots/list_changed",
    "tools/list",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "prompts/list",
    "prompts/get",
    "completion/complete",
    "logging/setLevel",
)


@dataclass(frozen=True, slots=True)
class CompiledL7Rule:
    label: str  # "rules[2]", "deny_rules[0]" or "access:read-only"
    method: str  # upper-case or "*" (REST); the RPC method, exact or "*" (JSON-RPC, MCP); "" (GraphQL)
    path: Glob | None  # None: "**", every path
    query: tuple[tuple[str, tuple[Glob, ...]], ...]
    method_glob: Glob | None = None  # MCP: a tools/ glob such as tools/*
    tool: tuple[Glob, ...] | None = None  # MCP: params.name of tools/call
    operation_type: str | None = None  # GraphQL: query, mutation, subscription or "*"
    operation_name: Glob | None = None
    fields: tuple[Glob, ...] | None = None

    def method_matches(self, method: str) -> bool:
        # HEAD is implied by GET, in allows and in denies (§3.10.3)
        return self.method == "*" or self.method == method or (method == "HEAD" and self.method == "GET")

    def path_matches(self, path: str) -> bool:
        return self.path is None or self.path.matches(path)

    def query_allows(self, params: Mapping[str, list[str]]) -> bool:
        for name, globs in self.query:
            values = params.get(name)
            if not values:
                return False
            if not all(any(g.matches(v) for g in globs) for v in values):
                return False
        return True

    def query_denies(self, params: Mapping[str, list[str]]) -> bool:
        for name, globs in self.query:
            values = params.get(name)
            if not values:
                return False
            if not any(g.matches(v) for g in globs for v in values):
                return False
        return True


@dataclass(frozen=True, slots=True)
class CompiledRule:
    key: str
    position: int  # in key order
    rule: NetworkRule
    exact_binaries: frozenset[str]
    glob_binaries: tuple[Glob, ...]
    loader_exact: frozenset[str] = frozenset()  # the entries with allow_loader_env
    loader_globs: tuple[Glob, ...] = ()

    def binary_matches(self, identity: BinaryIdentity) -> bool:
        """Executable path or any ancestor path; never ``cmdline_paths``. A process started with loader
        variables (``identity.loader_env``) matches only entries that allow them."""
        exact, globs = (self.loader_exact, self.loader_globs) if identity.loader_env else (
            self.exact_binaries, self.glob_binaries)  # fmt: skip
        if identity.path in exact:
            return True
        for ancestor in identity.ancestors:
            if ancestor in exact:
                return True
        for glob in globs:
            if glob.matches(identity.path):
                return True
            for ancestor in identity.ancestors:
                if glob.matches(ancestor):
                    return True
        return False


@dataclass(frozen=True, slots=True)
class CompiledEndpoint:
    rule: CompiledRule
    index: int
    endpoint: Endpoint
    host_glob: HostGlob | None
    path_glob: Glob | None  # endpoint ``path`` selector; None = every path
    rank: int  # path specificity: non-'*' characters in ``path``
    allows: tuple[CompiledL7Rule, ...]
    denies: tuple[CompiledL7Rule, ...]
    # Derived once here (see CompiledPolicy) so a decision reads flat fields instead of properties and chains
    label: str  # "github[0]"
    order: tuple[int, int]  # (rule position, endpoint index): the order of every candidate list
    exact_name: str | None  # the endpoint's host when it is named exactly (not by glob, not hostless)
    extended: bool  # Endpoint.extended: the endpoint supplies connection metadata (§3.3)
    inspected: bool  # protocol rest/websocket: L7 decisions apply
    transparent: bool  # protocol tcp


def _compile_rule(rule: L7Rule, label: str) -> CompiledL7Rule:
    if rule.operation_type is not None:
        return CompiledL7Rule(
            label, "", None, (), operation_type=rule.operation_type,
            operation_name=None if rule.operation_name is None else compile_value_glob(rule.operation_name),
            fields=None if rule.fields is None else tuple(compile_value_glob(f) for f in rule.fields),
        )  # fmt: skip
    if not rule.path:  # JSON-RPC, MCP
        glob = compile_value_glob(rule.method) if rule.method != "*" and has_glob_chars(rule.method) else None
        tool = None if rule.tool is None else tuple(compile_value_glob(g) for g in rule.tool.globs)
        return CompiledL7Rule(label, rule.method, None, (), method_glob=glob, tool=tool)
    query = tuple((name, tuple(compile_value_glob(g) for g in m.globs)) for name, m in rule.query)
    path = None if rule.path == "**" else compile_path_glob(rule.path)
    return CompiledL7Rule(label, rule.method, path, query)


def _compile_l7(rules: Iterable[L7Rule], prefix: str) -> tuple[CompiledL7Rule, ...]:
    return tuple(_compile_rule(rule, f"{prefix}[{i}]") for i, rule in enumerate(rules))


def _allows(ep: Endpoint) -> tuple[CompiledL7Rule, ...]:
    profile: tuple[CompiledL7Rule, ...] = ()
    if ep.protocol is Protocol.MCP and ep.mcp_allow_all_known_methods:
        if ep.rules is None:
            return (CompiledL7Rule("mcp:profile", "*", None, ()),)
        profile = tuple(CompiledL7Rule("mcp:profile", m, None, ()) for m in MCP_PROFILE_METHODS)
    if ep.rules is not None:
        return _compile_l7(ep.rules, "rules") + profile
    if ep.access is not None and ep.protocol is Protocol.GRAPHQL:
        label = f"access:{ep.access}"
        return tuple(CompiledL7Rule(label, "", None, (), operation_type=t) for t in _GRAPHQL_PRESETS[ep.access])
    if ep.access is not None and ep.protocol.inspected:
        methods = _PRESETS[(ep.protocol, ep.access)]
        return tuple(CompiledL7Rule(f"access:{ep.access}", m, None, ()) for m in methods)
    return ()


class CompiledPolicy:
    """Immutable once built; share it freely between tasks."""

    def __init__(self, policy: Policy, binary_aliases: Mapping[str, Iterable[str]] | None = None) -> None:
        self.policy = policy
        self.digest = policy.digest
        aliases = {path: tuple(targets) for path, targets in (binary_aliases or {}).items()}
        ordered = sorted(policy.network_policies, key=lambda r: r.key)
        shared: dict[object, object] = {}  # one object per distinct binary set, however many rules repeat it
        self.rules: tuple[CompiledRule, ...] = tuple(
            self._compile_rule(position, rule, aliases, shared) for position, rule in enumerate(ordered)
        )
        exact: dict[tuple[str, int], list[CompiledEndpoint]] = defaultdict(list)
        globs: dict[tuple[int, tuple[str, ...]], list[CompiledEndpoint]] = defaultdict(list)
        hostless: dict[int, list[CompiledEndpoint]] = defaultdict(list)
        suffix_lengths: set[int] = set()
        self.endpoints: list[CompiledEndpoint] = []
        for crule in self.rules:
            for index, ep in enumerate(crule.rule.endpoints):
                host_glob = compile_host_glob(ep.host) if "*" in ep.host else None
                path_glob = None if ep.path in ("", "**") else compile_path_glob(ep.path)
                cep = CompiledEndpoint(
                    rule=crule,
                    index=index,
                    endpoint=ep,
                    host_glob=host_glob,
                    path_glob=path_glob,
                    rank=sum(1 for c in ep.path if c != "*"),
                    allows=_allows(ep),
                    denies=_compile_l7(ep.deny_rules or (), "deny_rules"),
                    label=f"{crule.key}[{index}]",
                    order=(crule.position, index),
                    exact_name=ep.host if ep.host and host_glob is None else None,
                    extended=ep.extended,
                    inspected=ep.protocol.inspected,
                    transparent=ep.protocol is Protocol.TCP,
                )
                self.endpoints.append(cep)
                for port in ep.ports:
                    if not ep.host:
                        hostless[port].append(cep)
                    elif host_glob is None:
                        exact[(ep.host, port)].append(cep)
                    else:
                        globs[(port, host_glob.literal_suffix)].append(cep)
                        suffix_lengths.add(len(host_glob.literal_suffix))
        by_name: dict[str, list[CompiledEndpoint]] = defaultdict(list)
        globs_by_suffix: dict[tuple[str, ...], list[CompiledEndpoint]] = defaultdict(list)
        for cep in self.endpoints:
            if cep.host_glob is not None:
                globs_by_suffix[cep.host_glob.literal_suffix].append(cep)
            elif cep.endpoint.host:
                by_name[cep.endpoint.host].append(cep)
        self._by_name = {k: tuple(v) for k, v in by_name.items()}
        self._globs_by_suffix = {k: tuple(v) for k, v in globs_by_suffix.items()}
        self._exact = {k: tuple(v) for k, v in exact.items()}
        self._globs = {k: tuple(v) for k, v in globs.items()}
        self._hostless = {k: tuple(v) for k, v in hostless.items()}
        self._suffix_lengths = tuple(sorted(suffix_lengths))
        self.has_tcp = policy.has_tcp_endpoints()
        #: decide.decide_l4's memo of this generation's L4 decisions (pure functions of the request, the digest
        #: pins aside); bounded there. The only thing that changes after compilation, and only by decide.py.
        self.l4_memo: dict[tuple[str, int, BinaryIdentity | None, bool], tuple[Decision | None, Decision]] = {}

    @staticmethod
    def _compile_rule(
        position: int, rule: NetworkRule, aliases: Mapping[str, tuple[str, ...]], shared: dict[object, object]
    ) -> CompiledRule:
        """``shared`` interns the binary sets: rules naming the same binaries share one set, which a decision at
        10,000 rules then finds in the CPU cache rather than in a set object of its own."""
        exact: set[str] = set()
        patterns: list[Glob] = []
        loader_exact: set[str] = set()
        loader_patterns: list[Glob] = []
        for binary in rule.binaries:
            if "*" in binary.path:
                patterns.append(compile_path_glob(binary.path))
                if binary.allow_loader_env:
                    loader_patterns.append(patterns[-1])
            else:
                names = {binary.path, *aliases.get(binary.path, ())}
                exact.update(names)
                if binary.allow_loader_env:
                    loader_exact.update(names)

        def intern(value: _T) -> _T:
            return cast(_T, shared.setdefault(value, value))

        return CompiledRule(rule.key, position, rule, intern(frozenset(exact)), intern(tuple(patterns)),
                            intern(frozenset(loader_exact)), intern(tuple(loader_patterns)))  # fmt: skip

    @property
    def rule_count(self) -> int:
        return len(self.rules)

    @property
    def endpoint_count(self) -> int:
        return len(self.endpoints)

    def endpoints_for(self, host: str, port: int) -> list[CompiledEndpoint]:
        """Every endpoint whose host selector and ports match; ``host`` must already be normalised."""
        found: list[CompiledEndpoint] = list(self._exact.get((host, port), ()))
        sources = 1 if found else 0
        if self._suffix_lengths:
            labels = host.split(".")
            count = len(labels)
            for length in self._suffix_lengths:
                if length > count:
                    break
                bucket = self._globs.get((port, tuple(labels[count - length :]) if length else ()))
                if not bucket:
                    continue
                hit = False
                for cep in bucket:
                    glob = cep.host_glob
                    assert glob is not None
                    # the bucket fixed the literal suffix; the labels of a normalised host are never empty
                    if (count > glob.labels - 1 if glob.recursive else count == glob.labels) and (
                        glob.suffix_decides or glob.matches(host)
                    ):
                        found.append(cep)
                        hit = True
                sources += hit
        hostless = self._hostless.get(port)
        if hostless:
            found.extend(hostless)
            sources += 1
        if sources > 1:
            found.sort(key=lambda c: c.order)
        return found

    def endpoints_for_name(self, host: str, *, transparent_only: bool = False) -> list[CompiledEndpoint]:
        """Endpoints whose host selector names ``host`` on any port, ignoring binaries and hostless endpoints.

        For the DNS side (docs/design.md "DNS and transparent capture"): a name no endpoint could allow is REFUSED and
        never forwarded; with ``transparent_only`` only ``protocol: tcp`` endpoints count (§3.5.1 eligibility).
        ``host`` must already be normalised.
        """
        found = list(self._by_name.get(host, ()))
        labels = host.split(".")
        for length in self._suffix_lengths:
            if length > len(labels):
                break
            suffix = tuple(labels[len(labels) - length :]) if length else ()
            for cep in self._globs_by_suffix.get(suffix, ()):
                glob = cep.host_glob
                assert glob is not None
                if glob.matches(host):
                    found.append(cep)
        result = sorted(found, key=lambda c: c.order)
        if transparent_only:
            result = [c for c in result if c.endpoint.protocol is Protocol.TCP]
        return result


def compile_policy(policy: Policy, *, binary_aliases: Mapping[str, Iterable[str]] | None = None) -> CompiledPolicy:
    """Build the decision index. ``binary_aliases`` maps policy binary paths to the symlink targets the boundary
    resolved inside the workload (§1.7), so ``/usr/bin/python3`` also matches ``/usr/bin/python3.11``."""
    return CompiledPolicy(policy, binary_aliases)
