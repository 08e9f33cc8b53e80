"""The policy advisor: the next revision of a policy, allowing exactly what was denied (docs/policy.md "Suggesting a
policy"). Pure: denials (``denials.py``) and the policy in force in, a document and what was not proposed out.

Every string here is the agent's: it chose the host, the path, the tool, the binary's name. So:

1. Nothing the agent named becomes a pattern. A host, path, binary, tool or operation holding a glob character
   (``*?[]{}`` or ``\\``) is not proposed; a host must be a plain DNS name or an IP literal. The only patterns the
   advisor writes are its own: ``*`` for a path segment holding ``[CREDENTIAL]`` (a redacted placeholder) and for
   the last segment of at least ``GENERALISE_AT`` samples that share every other segment (never the first one),
   each said in ``generalised``. ``**`` is never written.
2. Never proposed, each listed in ``refused`` with the reason: a denial of the ``ssrf`` or ``bypass`` stage, any L4
   reason but "no endpoint" or "binary not allowed", an internal IP literal, a wildcard or unusual host, a binary on
   a path the agent can write (whatever it writes there later would inherit the grant), a process started with a
   loader variable (``allow_loader_env`` is never proposed), an explicit ``deny_rules`` refusal, an anonymous,
   batched, persisted or cut GraphQL operation, and anything the events cut short (``truncated``).
3. An L4 grant is a new rule of one endpoint (the denied host and port; an IP literal as ``allowed_ips: [IP/32]``,
   never ``host``) and the binaries seen there. Where an endpoint already covers that host and port (the binary was
   not allowed), the new endpoint copies its settings (protocol, rules, TLS, ``allowed_ips``) with the exact host:
   the binary gets what the others get there, no more. An L7 grant adds allow rules to the endpoint that judged the
   request (an ``access`` preset is first written out as the rules it stands for).
4. Each proposal is added and the document re-validated; one that makes it invalid is dropped into ``refused`` with
   the error. The document is written by ``yaml.safe_dump`` (``render``), so no string can become YAML structure.
"""

from __future__ import annotations

import copy
import ipaddress
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

import yaml

from supervisor.control.addresses import classify
from supervisor.control.denials import L7_PROPOSABLE, DenialEntry, L7Sample, Stage
from supervisor.control.policy import (
    AccessPreset,
    Policy,
    PolicyInvalid,
    Protocol,
    compile_policy,
    load_policy_text,
    normalize_request_host,
)
from supervisor.control.policy.compiled import _GRAPHQL_PRESETS, _PRESETS
from supervisor.protocol.json_value import JsonValue
from supervisor.protocol.writable_paths import normalize

__all__ = ["GENERALISE_AT", "Suggestion", "render", "suggest", "under_writable"]

GENERALISE_AT: Final = 3
REDACTED: Final = "[CREDENTIAL]"
_PATTERN_CHARS: Final = frozenset("*?[]{}\\")
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_DNS_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_METHOD = re.compile(r"[A-Z][A-Z_-]{0,31}")
_TOOL = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_RPC_METHOD = re.compile(r"[A-Za-z0-9_./:$-]{1,128}")
_GRAPHQL_NAME = re.compile(r"[_A-Za-z][_0-9A-Za-z]{0,127}")
_L4_PROPOSABLE: Final = frozenset({"no-matching-endpoint", "binary-not-allowed", "no-network-policies"})
_L4_STAGES: Final = frozenset({Stage.CONNECT, Stage.FORWARD, Stage.TRANSPARENT})


@dataclass
class Suggestion:
    document: dict[str, JsonValue]  # the revised policy, as the policy's own JSON shape
    proposed: list[str] = field(default_factory=list)  # one line per grant
    generalised: list[str] = field(default_factory=list)  # where a pattern stands for several samples
    refused: list[tuple[str, str]] = field(default_factory=list)  # (what was denied, why it is not proposed)

    @property
    def changed(self) -> bool:
        return bool(self.proposed)


def render(document: dict[str, JsonValue]) -> str:
    """The YAML of a policy document (rule 4): the serializer quotes whatever the agent named."""
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False, allow_unicode=False, width=1 << 16)


def under_writable(path: str, writable: Iterable[str]) -> str | None:
    """The writable directory ``path`` lies in (or is), or None."""
    norm = normalize(path)
    for root in writable:
        base = normalize(root)
        if norm == base or norm.startswith(base.rstrip("/") + "/"):
            return base
    return None


def _what(entry: DenialEntry) -> str:
    binary = entry.binary or "-"
    return f"{entry.host}:{entry.port} by {binary} ({entry.stage}, {entry.reason}, {entry.count}x)"


def _has_pattern(text: str) -> bool:
    return any(c in _PATTERN_CHARS for c in text)


def _object(value: JsonValue) -> dict[str, JsonValue]:
    """A member of the policy document that its JSON shape makes an object (``TypeError`` if it is not)."""
    if not isinstance(value, dict):
        raise TypeError(f"a policy document object, not {type(value).__name__}")
    return value


def _array(value: JsonValue) -> list[JsonValue]:
    """A member of the policy document that its JSON shape makes a list (``TypeError`` if it is not)."""
    if not isinstance(value, list):
        raise TypeError(f"a policy document list, not {type(value).__name__}")
    return value


def _endpoint_of(doc: dict[str, JsonValue], key: str, index: int) -> dict[str, JsonValue]:
    """``network_policies.KEY.endpoints[INDEX]`` of a policy document."""
    return _object(_array(_object(_object(doc["network_policies"])[key])["endpoints"])[index])


class _Builder:
    def __init__(self, policy: Policy, writable: Sequence[str]) -> None:
        self.doc = policy.to_json()
        self.doc.setdefault("network_policies", {})
        self.compiled = compile_policy(policy)
        self.writable = writable
        self.out = Suggestion(self.doc)

    # -- validation ---------------------------------------------------------------------------------------------
    def _try(self, change: Callable[[dict[str, JsonValue]], None], what: str) -> bool:
        """Apply ``change`` to a copy of the document; keep it when the result is a valid policy (rule 4)."""
        candidate = copy.deepcopy(self.doc)
        change(candidate)
        try:
            load_policy_text(render(candidate), "suggestion")
        except PolicyInvalid as exc:
            self.out.refused.append((what, f"the revision would not be a valid policy: {exc.errors[0].message}"))
            return False
        self.doc.clear()
        self.doc.update(candidate)
        return True

    # -- L4 -----------------------------------------------------------------------------------------------------
    def l4(self, entries: list[DenialEntry]) -> None:
        groups: dict[tuple[str, int], list[DenialEntry]] = defaultdict(list)
        for entry in entries:
            why = self._l4_refusal(entry)
            if why is not None:
                self.out.refused.append((_what(entry), why))
            else:
                groups[(entry.host, entry.port)].append(entry)
        for (host, port), group in groups.items():
            binaries = sorted({e.binary for e in group if e.binary is not None})
            endpoint = self._endpoint(host, port)
            key = self._rule_key(host, port)
            rule: dict[str, JsonValue] = {"endpoints": [endpoint], "binaries": [{"path": b} for b in binaries]}
            what = f"{host}:{port} for {', '.join(binaries)}"

            def add(doc: dict[str, JsonValue], key: str = key, rule: dict[str, JsonValue] = rule) -> None:
                _object(doc["network_policies"])[key] = rule

            if self._try(add, what):
                self.out.proposed.append(f"network_policies.{key}: {what}")

    def _l4_refusal(self, entry: DenialEntry) -> str | None:
        if entry.stage == Stage.SSRF:
            return "the SSRF guard refused its address: never proposed"
        if entry.stage == Stage.BYPASS:
            return "refused at the boundary before any policy (bypass stage): a policy cannot allow it"
        if entry.stage not in _L4_STAGES:
            return f"stage {entry.stage}: not a policy decision the advisor can change"
        if entry.truncated:
            return "the events cut its text short: not what the agent asked for"
        if entry.reason not in _L4_PROPOSABLE:
            return f"reason {entry.reason}: not something a new rule allows"
        if entry.loader_env:
            return f"started with {', '.join(entry.loader_env)}: allow_loader_env is never proposed"
        host_problem = self._host_problem(entry.host)
        if host_problem is not None:
            return host_problem
        binary = entry.binary
        if binary is None or binary == "-":
            return "no binary identity: a rule needs the binary"
        if (
            not binary.startswith("/")
            or _has_pattern(binary)
            or not all(c.isprintable() and not c.isspace() for c in binary)
        ):
            return "the binary's path is not a plain absolute path (it would read as a pattern)"
        if "/../" in binary + "/" or "/./" in binary + "/":
            return "the binary's path is not normalised"
        where = under_writable(binary, self.writable)
        if where is not None:
            return f"the binary lies in {where}, which the agent can write: what it puts there would inherit the grant"
        return None

    @staticmethod
    def _host_problem(host: str) -> str | None:
        if _has_pattern(host):
            return "a wildcard host: never proposed"
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            if normalize_request_host(host) != host or _DNS_NAME.fullmatch(host) is None or len(host) > 253:
                return "not a plain DNS name: never proposed"
            if "." not in host:
                return "a single-label name: never proposed"
            return None
        if classify(address).internal:
            return "an internal address: never proposed (name it in allowed_ips by hand if it is meant)"
        return None

    def _endpoint(self, host: str, port: int) -> dict[str, JsonValue]:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            address = None
        if address is not None:
            return {"ports": [port], "allowed_ips": [f"{address}/{address.max_prefixlen}"]}
        existing = self.compiled.endpoints_for(host, port)
        if not existing:
            return {"host": host, "ports": [port]}
        endpoint = existing[0].endpoint.to_json()
        endpoint["host"] = host
        endpoint["ports"] = [port]
        endpoint.pop("port", None)
        return {"host": host, **{k: v for k, v in endpoint.items() if k != "host"}}

    def _rule_key(self, host: str, port: int) -> str:
        base = "suggested-" + re.sub(r"[^a-z0-9]+", "-", host.lower()).strip("-")[:80] + f"-{port}"
        key, n = base, 2
        while key in _object(self.doc["network_policies"]):
            key, n = f"{base}-{n}", n + 1
        return key

    # -- L7 -----------------------------------------------------------------------------------------------------
    def l7(self, entries: list[DenialEntry]) -> None:
        by_endpoint: dict[tuple[str, int], list[DenialEntry]] = defaultdict(list)
        for entry in entries:
            why = self._l7_refusal(entry)
            if why is not None:
                self.out.refused.append((_what(entry), why))
                continue
            assert entry.endpoint is not None
            by_endpoint[_endpoint_ref(entry.endpoint) or ("", -1)].append(entry)
        for (key, index), group in by_endpoint.items():
            endpoint = _endpoint_of(self.doc, key, index)
            protocol = Protocol(str(endpoint.get("protocol", "")))
            rules: list[dict[str, JsonValue]] = []
            samples = [s for e in group for s in e.samples.values()]
            where = f"network_policies.{key}.endpoints[{index}]"
            if protocol in (Protocol.REST, Protocol.WEBSOCKET):
                rules = self._path_rules(samples, where, group)
            else:
                for sample in samples:
                    rule, why = _body_rule(protocol, sample.operation)
                    if rule is None:
                        self.out.refused.append((f"{group[0].host}:{group[0].port} {sample.method} {sample.path} "
                                                 f"[{sample.operation}]", why))  # fmt: skip
                    elif rule not in rules:
                        rules.append(rule)
            if not rules:
                continue

            def add(doc: dict[str, JsonValue], key: str = key, index: int = index,
                    new: list[dict[str, JsonValue]] = rules) -> None:  # fmt: skip
                ep = _endpoint_of(doc, key, index)
                current = ep.pop("access", None)
                preset = current if isinstance(current, str) else None
                written = ep.get("rules")
                existing = _array(written) if written else _preset_rules(Protocol(str(ep.get("protocol", ""))), preset)
                added: list[JsonValue] = [{"allow": r} for r in new if {"allow": r} not in existing]
                ep["rules"] = existing + added

            shown = "; ".join(_rule_text(r) for r in rules)
            if self._try(add, f"{where}: {shown}"):
                self.out.proposed.append(f"{where} rules += {shown}")

    def _l7_refusal(self, entry: DenialEntry) -> str | None:
        if entry.truncated:
            return "the events cut its text short: not what the agent asked for"
        if entry.stage != Stage.L7:
            return f"stage {entry.stage}: refused before the policy was asked"
        if entry.reason == "l7-denied":
            return "an explicit deny_rules entry refused it: never proposed"
        if entry.reason not in L7_PROPOSABLE:
            return f"reason {entry.reason}: not something an allow rule changes"
        ref = _endpoint_ref(entry.endpoint or "")
        rules = _object(self.doc["network_policies"])
        if ref is None or ref[0] not in rules or not 0 <= ref[1] < len(_array(_object(rules[ref[0]])["endpoints"])):
            return "no endpoint of the policy in force judged it"
        endpoint = _endpoint_of(self.doc, *ref)
        mcp = endpoint.get("mcp")
        if isinstance(mcp, dict) and mcp.get("allow_all_known_mcp_methods") and not endpoint.get("rules"):
            return "the endpoint's MCP method profile decides it: write its rules by hand"
        return None

    def _path_rules(self, samples: list[L7Sample], where: str, group: list[DenialEntry]) -> list[dict[str, JsonValue]]:
        exact: dict[str, list[list[str]]] = defaultdict(list)  # method -> the samples' segments
        for sample in samples:
            label = f"{group[0].host}:{group[0].port} {sample.method} {sample.path}"
            if _METHOD.fullmatch(sample.method) is None:
                self.out.refused.append((label, "not a plain HTTP method"))
                continue
            if sample.operation is not None:
                self.out.refused.append((label, "a body protocol's call on a path endpoint"))
                continue
            path = sample.path
            if not path.startswith("/") or "?" in path or any(c.isspace() or not c.isprintable() for c in path):
                self.out.refused.append((label, "not a plain query-free path"))
                continue
            segments = path.split("/")[1:]
            clean: list[str] = []
            for segment in segments:
                if REDACTED in segment:
                    clean.append("*")
                    continue
                if _has_pattern(segment) or segment in (".", ".."):
                    break
                clean.append(segment)
            else:
                if clean != segments:
                    self.out.generalised.append(f"{where}: {sample.method} {path}: a segment holding {REDACTED} "
                                                "is matched by *")  # fmt: skip
                if clean not in exact[sample.method]:
                    exact[sample.method].append(clean)
                continue
            self.out.refused.append((label, "the path holds glob characters: it would read as a pattern"))
        rules: list[dict[str, JsonValue]] = []
        for method, paths in exact.items():
            families: dict[tuple[str, ...], list[list[str]]] = defaultdict(list)
            for segs in paths:
                families[tuple(segs[:-1])].append(segs)
            for prefix, members in families.items():
                distinct = {m[-1] for m in members if m}
                if len(distinct) >= GENERALISE_AT and prefix and all(prefix) and "*" not in prefix:
                    pattern = "/" + "/".join((*prefix, "*"))
                    self.out.generalised.append(f"{where}: {method} {pattern} stands for {len(distinct)} samples "
                                                f"sharing /{'/'.join(prefix)}/")  # fmt: skip
                    rules.append({"method": method, "path": pattern})
                    continue
                for segs in members:
                    rules.append({"method": method, "path": "/" + "/".join(segs)})
        return rules


def _endpoint_ref(text: str) -> tuple[str, int] | None:
    match = re.fullmatch(r"(.+)\[(\d+)\]", text)
    return None if match is None else (match.group(1), int(match.group(2)))


def _preset_rules(protocol: Protocol, preset: str | None) -> list[JsonValue]:
    if preset is None:
        return []
    access = AccessPreset(preset)
    if protocol is Protocol.GRAPHQL:
        return [{"allow": {"operation_type": t}} for t in _GRAPHQL_PRESETS[access]]
    return [{"allow": {"method": m, "path": "**"}} for m in _PRESETS[(protocol, access)]]


def _body_rule(protocol: Protocol, operation: str | None) -> tuple[dict[str, JsonValue] | None, str]:
    """The allow rule for one JSON-RPC, MCP or GraphQL call the events name, or why there is none."""
    if operation is None:
        return None, "the event names no call"
    if protocol is Protocol.MCP:
        method, _, tool = operation.partition(" ")
        if method == "tools/call" and tool:
            if _TOOL.fullmatch(tool) is None:
                return None, "the tool name is not [A-Za-z0-9_.-]{1,128}: it would read as a pattern"
            return {"method": "tools/call", "tool": tool}, ""
        if tool or _RPC_METHOD.fullmatch(method) is None or method == "tools/call":
            return None, "not a plain MCP method"
        return {"method": method}, ""
    if protocol is Protocol.JSON_RPC:
        if _RPC_METHOD.fullmatch(operation) is None:
            return None, "not a plain JSON-RPC method name"
        return {"method": operation}, ""
    if protocol is Protocol.GRAPHQL:
        kind, _, name = operation.partition(" ")
        if kind not in ("query", "mutation", "subscription"):
            return None, "a batch or a persisted query: write its rule by hand"
        if name == "(anonymous)":
            return None, "an anonymous GraphQL operation: a rule could only name its type, which allows every one"
        if _GRAPHQL_NAME.fullmatch(name) is None:
            return None, "not a plain GraphQL operation name"
        return {"operation_type": kind, "operation_name": name}, ""
    return None, f"protocol {protocol or 'L4'}: no L7 rules to propose"


def _rule_text(rule: dict[str, JsonValue]) -> str:
    return " ".join(f"{k}={v}" for k, v in rule.items())


def suggest(policy: Policy, entries: Iterable[DenialEntry], writable: Sequence[str]) -> Suggestion:
    """The revision of ``policy`` that allows what ``entries`` were denied, within rules 1-4."""
    builder = _Builder(policy, writable)
    entries = list(entries)
    builder.l4([e for e in entries if e.stage != Stage.L7 and e.stage != Stage.L7_PARSE])
    builder.l7([e for e in entries if e.stage in (Stage.L7, Stage.L7_PARSE)])
    builder.out.document = builder.doc
    return builder.out
