"""One network endpoint of a policy (docs/reference/policy.md §1, with the §6 decisions), field family by family.

Each family's reader reports its own errors, every one naming the field's YAML path, and returns what the
``Endpoint`` holds; the cross-field rules run once every family is read, because each looks at several of them.
The protocol is read first: the host, the L7 rules and the cross-field rules depend on it.

Rules:

1. ``port`` with ``ports`` is always an error (D15), an unknown ``access`` preset is an error (D11),
   ``allowed_ips`` is checked here rather than per connection (D12), an L7 protocol with ``tls: skip`` is an
   error (D13: its rules would never be enforced), and so is ``rules``/``access`` on an endpoint without an L7
   protocol (it would silently allow everything).
2. SQL inspection and the gateway-internal fields are refused with a "not supported yet" error naming the field
   (D16). ``credential_signing`` (V28) needs ``signing_service``, excludes ``request_body_credential_rewrite`` and
   ``tls: skip`` (nothing would be signed); a host ``inference.local`` is refused (control's inference router
   serves that name, §3.16).
3. Warnings: L7 endpoints left in audit mode (D14), deprecated ``tls`` values, broad CIDRs, flags that have no
   effect with the endpoint's protocol.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Mapping

import yaml

from supervisor.control.addresses import blocked_in_network

from .globs import GlobSyntaxError, compile_path_glob
from .hosts import validate_policy_host
from .model import AccessPreset, Endpoint, Enforcement, L7Rule, Protocol, TlsMode
from .schema_l7 import check_websocket_graphql, read_l7_rules
from .schema_rpc import method_covers_call, read_options
from .yamlnodes import Reader

ENDPOINT_KEYS = (
    "host",
    "port",
    "ports",
    "path",
    "protocol",
    "tls",
    "enforcement",
    "access",
    "rules",
    "deny_rules",
    "allowed_ips",
    "allow_encoded_slash",
    "websocket_credential_rewrite",
    "request_body_credential_rewrite",
    "allow_uninspected_credentials",
    "credential_binding",
    "credential_signing",
    "signing_service",
    "signing_region",
    "persisted_queries",
    "graphql_persisted_queries",
    "graphql_max_body_bytes",
    "json_rpc",
    "mcp",
)
ENDPOINT_NOT_YET = {
    "provider_credentialed": "the gateway-internal field provider_credentialed",
    "advisor_proposed": "the gateway-internal field advisor_proposed",
}
PROTOCOL_NOT_YET = {"sql": "SQL inspection"}
TCP_FORBIDDEN = (
    "path",
    "enforcement",
    "access",
    "rules",
    "deny_rules",
    "allow_encoded_slash",
    "websocket_credential_rewrite",
    "request_body_credential_rewrite",
    "credential_binding",
    "credential_signing",
    "signing_service",
    "signing_region",
    "persisted_queries",
    "graphql_persisted_queries",
    "graphql_max_body_bytes",
    "json_rpc",
    "mcp",
)
FLAGS = (
    "allow_encoded_slash",
    "websocket_credential_rewrite",
    "request_body_credential_rewrite",
    "allow_uninspected_credentials",
)
SIGNING_MODES = ("sigv4", "sigv4:body", "sigv4:no_body")
# what a signing service or region may be: it goes into the signature's scope and the SigV4 string to sign
_SIGNING_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
# served by control's inference router (docs/reference/policy.md §3.16), never by a policy endpoint
INFERENCE_HOST = "inference.local"

Node = yaml.Node
Rules = tuple[L7Rule, ...] | None


@dataclasses.dataclass(frozen=True)
class _Fields:
    """One endpoint's mapping: its YAML path, its node and its keys."""

    base: str
    node: Node
    items: dict[str, tuple[Node, Node]]

    def field(self, key: str) -> Node | None:
        return self.items[key][1] if key in self.items else None

    def where(self, key: str) -> str:
        return f"{self.base}.{key}"


@dataclasses.dataclass(frozen=True)
class _Read:
    """What the families read that the cross-field rules look at."""

    protocol: Protocol
    tls: TlsMode | None
    enforcement_explicit: bool
    access: AccessPreset | None
    rules: Rules
    deny_rules: Rules
    profile: bool
    signing: str | None
    flags: Mapping[str, bool]


def read_endpoint(r: Reader, base: str, node: Node) -> Endpoint | None:
    """The endpoint at ``base``, or None after reporting every error in it."""
    items = r.mapping(node, base)
    if items is None:
        return None
    errors_before = len(r.errors)
    r.check_keys(items, base, ENDPOINT_KEYS, ENDPOINT_NOT_YET)
    ep = _Fields(base, node, items)
    protocol = _protocol(r, ep)
    allowed_ips = _allowed_ips(r, ep)
    host = _host(r, ep, protocol is Protocol.TCP, allowed_ips)
    ports = _ports(r, ep)
    tls = _tls(r, ep)
    enforcement, enforcement_explicit = _enforcement(r, ep)
    ep_path = _path(r, ep)
    access = _access(r, ep)
    options = read_options(r, base, items, protocol)
    profile = bool(options.get("mcp_allow_all_known_methods"))
    strict = options.get("mcp_strict_tool_names") is not False
    rules, deny_rules = _l7_rules(r, ep, protocol, profile=profile, strict=strict)
    flags = {flag: bool(r.boolean(items[flag][1], ep.where(flag))) if flag in items else False for flag in FLAGS}
    binding = _credential_binding(r, ep)
    signing, signing_service, signing_region = _signing(r, ep, flags)
    read = _Read(protocol, tls, enforcement_explicit, access, rules, deny_rules, profile, signing, flags)
    if protocol is Protocol.TCP:
        _check_tcp_fields(r, ep)
    else:
        _check_l7_fields(r, ep, read)
    if len(r.errors) > errors_before:
        return None
    return Endpoint(
        host=host,
        ports=tuple(ports),
        path=ep_path,
        protocol=protocol,
        tls=tls,
        enforcement=enforcement,
        enforcement_explicit=enforcement_explicit,
        access=access,
        rules=rules,
        deny_rules=deny_rules,
        allowed_ips=tuple(allowed_ips),
        allow_encoded_slash=flags["allow_encoded_slash"],
        websocket_credential_rewrite=flags["websocket_credential_rewrite"],
        request_body_credential_rewrite=flags["request_body_credential_rewrite"],
        allow_uninspected_credentials=flags["allow_uninspected_credentials"],
        credential_binding=binding,
        credential_signing=signing,
        signing_service=signing_service,
        signing_region=signing_region,
        **options,
    )


# --- address: protocol, allowed_ips, host, ports -------------------------------------------------------------


def _protocol(r: Reader, ep: _Fields) -> Protocol:
    """The endpoint's protocol; plain L4 when absent or wrong (the error is reported)."""
    if (p_node := ep.field("protocol")) is None:
        return Protocol.L4
    raw = r.string(p_node, ep.where("protocol"))
    if raw is None:
        return Protocol.L4
    lowered = raw.strip().lower()
    if lowered in PROTOCOL_NOT_YET:
        not_yet = PROTOCOL_NOT_YET[lowered]
        r.error(ep.where("protocol"), p_node, f"protocol {lowered!r} ({not_yet}) is not supported yet")
        return Protocol.L4
    try:
        return Protocol(lowered)
    except ValueError:
        r.error(
            ep.where("protocol"),
            p_node,
            f"unknown protocol {raw!r}",
            "tcp, rest, websocket, graphql, json-rpc or mcp (or no protocol for plain L4)",
        )
        return Protocol.L4


def _allowed_ips(r: Reader, ep: _Fields) -> list[str]:
    """V34: the normalised networks, each once, in the order written."""
    allowed_ips: list[str] = []
    if (ips_node := ep.field("allowed_ips")) is None:
        return allowed_ips
    for i, item in enumerate(r.sequence(ips_node, ep.where("allowed_ips")) or []):
        net = _allowed_ip(r, f"{ep.where('allowed_ips')}[{i}]", item)
        if net is not None and net not in allowed_ips:
            allowed_ips.append(net)
    if isinstance(ips_node, yaml.SequenceNode) and not ips_node.value:
        r.error(ep.where("allowed_ips"), ips_node, "allowed_ips list cannot be empty")
    return allowed_ips


def _allowed_ip(r: Reader, where: str, node: Node) -> str | None:
    raw = r.value(node) if isinstance(node, yaml.ScalarNode) else None
    if not isinstance(raw, str):
        r.error(where, node, f"expected a CIDR or IP address, got {raw!r}", "e.g. 10.0.0.0/8")
        return None
    try:
        net = ipaddress.ip_network(raw.strip(), strict=False)
    except ValueError:
        r.error(where, node, f"invalid allowed_ips entry {raw!r}", "a CIDR (10.0.0.0/8) or an IP address")
        return None
    if (blocked := blocked_in_network(net)) is not None:  # the dial asks the same function (docs/design.md)
        r.error(
            where,
            node,
            f"allowed_ips entry {raw!r} covers always-blocked {blocked.describe()}",
            "a network outside loopback, link-local, unspecified and metadata addresses, in any IPv6 form",
        )
        return None
    if (net.version == 4 and net.prefixlen < 16) or (net.version == 6 and net.prefixlen < 32):
        r.warn(where, node, f"allowed_ips entry {raw!r} is very broad (/{net.prefixlen})")
    return str(net)


def _host(r: Reader, ep: _Fields, tcp: bool, allowed_ips: list[str]) -> str:
    """V1-V4, V8-V11: the normalised host; empty only where allowed_ips constrains a non-TCP endpoint."""
    host, host_error = "", False
    if (h_node := ep.field("host")) is not None:
        raw_host = r.string(h_node, ep.where("host"))
        if raw_host is None:
            host_error = True
        elif raw_host:
            host, problem = validate_policy_host(raw_host, tcp=tcp)
            if problem:
                r.error(ep.where("host"), h_node, problem)
                host_error = True
            elif host == INFERENCE_HOST:
                r.error(ep.where("host"), h_node, f"{INFERENCE_HOST} is served by control's inference routes "
                        "(--inference-routes), never by a policy endpoint", "another host")  # fmt: skip
                host_error = True
    if not host and not host_error:
        at = h_node if h_node is not None else ep.node
        if tcp:
            r.error(ep.where("host"), at, "protocol tcp requires a DNS hostname")
        elif not allowed_ips and ep.field("allowed_ips") is None:
            r.error(
                ep.where("host"),
                at,
                "endpoint host must not be empty unless allowed_ips constrains a non-TCP proxy endpoint",
                "a host name, IP address or host glob",
            )
    return host


def _ports(r: Reader, ep: _Fields) -> list[int]:
    """V5-V7, D15: ``port`` or ``ports``, never both; each port once, in the order written."""
    items = ep.items
    ports: list[int] = []
    port_errors = len(r.errors)
    has_port, has_ports = "port" in items, "ports" in items
    if has_port and has_ports:
        r.error(ep.where("ports"), items["ports"][0], "port and ports are mutually exclusive", "one of them")
    if has_ports:
        for i, item in enumerate(r.sequence(items["ports"][1], ep.where("ports")) or []):
            port = _port(r, f"{ep.where('ports')}[{i}]", item)
            if port is not None and port not in ports:
                ports.append(port)
    elif has_port:
        port = _port(r, ep.where("port"), items["port"][1])
        if port is not None:
            ports.append(port)
    if not ports and len(r.errors) == port_errors:
        at = items["ports"][1] if has_ports else ep.node
        r.error(ep.where("ports"), at, "endpoint must declare at least one port", "port: N or ports: [N, ...]")
    return ports


def _port(r: Reader, where: str, node: Node) -> int | None:
    value = r.integer(node, where)
    if value is None:
        return None
    if not 1 <= value <= 65535:
        r.error(where, node, f"invalid port {value}", "1..=65535")
        return None
    return value


# --- modes: tls, enforcement ---------------------------------------------------------------------------------


def _tls(r: Reader, ep: _Fields) -> TlsMode | None:
    """D13: ``skip`` or ``auto``; the deprecated values are accepted with a warning and read as not written."""
    if (t_node := ep.field("tls")) is None:
        return None
    raw_tls = r.string(t_node, ep.where("tls"))
    if raw_tls in ("terminate", "passthrough"):
        r.warn(ep.where("tls"), t_node, f"tls: {raw_tls} is deprecated and has no effect")
    elif raw_tls is not None:
        try:
            return TlsMode(raw_tls)
        except ValueError:
            r.error(ep.where("tls"), t_node, f"unknown tls mode {raw_tls!r}", "skip or auto")
    return None


def _enforcement(r: Reader, ep: _Fields) -> tuple[Enforcement, bool]:
    """D14: the enforcement and whether it was written (audit when not)."""
    if (e_node := ep.field("enforcement")) is not None:
        raw_e = r.string(e_node, ep.where("enforcement"))
        if raw_e is not None:
            try:
                return Enforcement(raw_e), True
            except ValueError:
                r.error(ep.where("enforcement"), e_node, f"unknown enforcement {raw_e!r}", "enforce or audit")
    return Enforcement.AUDIT, False


# --- what L7 traffic is allowed: path, access, rules ---------------------------------------------------------


def _path(r: Reader, ep: _Fields) -> str:
    """V24: the endpoint's path glob, ``/``-rooted or ``**``; empty when not written."""
    if (path_node := ep.field("path")) is None:
        return ""
    raw_path = r.string(path_node, ep.where("path"))
    if raw_path is None or raw_path == "":
        return ""
    if not (raw_path.startswith("/") or raw_path == "**"):
        r.error(ep.where("path"), path_node, "endpoint path must start with '/' or be '**'")
        return ""
    try:
        compile_path_glob(raw_path)
    except GlobSyntaxError as exc:
        r.error(ep.where("path"), path_node, f"invalid path glob: {exc}")
        return ""
    return raw_path


def _access(r: Reader, ep: _Fields) -> AccessPreset | None:
    """D11, V13: an unknown preset is an error."""
    if (a_node := ep.field("access")) is None:
        return None
    raw_a = r.string(a_node, ep.where("access"))
    if raw_a is None:
        return None
    try:
        return AccessPreset(raw_a)
    except ValueError:
        r.error(ep.where("access"), a_node, f"unknown access preset {raw_a!r}", "read-only, read-write or full")
        return None


def _l7_rules(r: Reader, ep: _Fields, protocol: Protocol, *, profile: bool, strict: bool) -> tuple[Rules, Rules]:
    """The allow and deny rules, and on a websocket endpoint the GraphQL-over-WebSocket check (V32)."""
    rules = read_l7_rules(r, ep.base, ep.items, protocol, allow=True, profile=profile, strict=strict)
    deny_rules = read_l7_rules(r, ep.base, ep.items, protocol, allow=False, profile=profile, strict=strict)
    if protocol is Protocol.WEBSOCKET:
        check_websocket_graphql(r, ep.base, ep.items, rules, deny_rules)
    return rules, deny_rules


# --- credentials: binding, signing ---------------------------------------------------------------------------


def _credential_binding(r: Reader, ep: _Fields) -> str | None:
    """The provider whose credentials the endpoint's placeholders resolve to."""
    if (b_node := ep.field("credential_binding")) is None:
        return None
    b_items = r.mapping(b_node, ep.where("credential_binding"))
    if b_items is None:
        return None
    r.check_keys(b_items, ep.where("credential_binding"), ("provider",))
    if "provider" not in b_items:
        r.error(f"{ep.where('credential_binding')}.provider", b_node, "missing required key 'provider'")
        return None
    return r.string(b_items["provider"][1], f"{ep.where('credential_binding')}.provider", allow_empty=False)


def _signing(r: Reader, ep: _Fields, flags: Mapping[str, bool]) -> tuple[str | None, str | None, str | None]:
    """V28: ``credential_signing`` one of the modes, with ``signing_service``, without
    ``request_body_credential_rewrite``; service and region are lower-case names."""
    items, where, field = ep.items, ep.where, ep.field
    values: dict[str, str | None] = {}
    for key in ("credential_signing", "signing_service", "signing_region"):
        node = field(key)
        values[key] = None if node is None else r.string(node, where(key), allow_empty=False)
    mode = values["credential_signing"]
    if mode is not None and mode not in SIGNING_MODES:
        r.error(where("credential_signing"), field("credential_signing"), f"unknown credential_signing {mode!r}",
                ", ".join(SIGNING_MODES))  # fmt: skip
        mode = None
    for key in ("signing_service", "signing_region"):
        value = values[key]
        if value is not None and not _SIGNING_NAME.fullmatch(value):
            r.error(where(key), field(key), f"invalid {key} {value!r}", "a lower-case name such as s3 or us-east-1")
    if "credential_signing" in items:
        if "signing_service" not in items:
            r.error(where("signing_service"), field("credential_signing"),
                    "credential_signing requires signing_service", "e.g. signing_service: s3")  # fmt: skip
        if flags.get("request_body_credential_rewrite"):
            r.error(where("request_body_credential_rewrite"), field("request_body_credential_rewrite"),
                    "credential_signing and request_body_credential_rewrite are mutually exclusive: the body "
                    "is signed as the agent sent it", "one of them")  # fmt: skip
    else:
        for key in ("signing_service", "signing_region"):
            if key in items:
                r.warn(where(key), field(key), f"{key} has no effect without credential_signing")
    return mode, values["signing_service"], values["signing_region"]


# --- across the families -------------------------------------------------------------------------------------


def _check_tcp_fields(r: Reader, ep: _Fields) -> None:
    """A raw TCP endpoint carries none of the L7 fields."""
    bad = [key for key in TCP_FORBIDDEN if key in ep.items]
    if bad:
        r.error(ep.where("protocol"), ep.field("protocol"),
                "protocol tcp does not support L7-only fields: " + ", ".join(bad))  # fmt: skip


def _check_l7_fields(r: Reader, ep: _Fields, read: _Read) -> None:
    """Every non-TCP endpoint: its allow set, its protocol's needs, TLS and the flags' effect, in that order."""
    _check_allow_set(r, ep, read)
    _check_protocol_rules(r, ep, read)
    _check_tls_skip(r, ep, read)
    _warn_without_effect(r, ep, read)


def _check_allow_set(r: Reader, ep: _Fields, read: _Read) -> None:
    """``rules`` or ``access`` (not both) define the base allow set, only under an L7 protocol; ``deny_rules``
    narrow it and need both."""
    where, field, protocol, access = ep.where, ep.field, read.protocol, read.access
    if access is not None and read.rules is not None:
        r.error(where("rules"), field("rules"), "rules and access are mutually exclusive", "one of them")
    if protocol is Protocol.L4 and (access is not None or read.rules is not None):
        key = "access" if access is not None else "rules"
        r.error(
            where(key),
            field(key),
            f"{key} without an L7 protocol would never be enforced",
            "protocol: rest or protocol: websocket",
        )
    if read.deny_rules is not None and protocol is Protocol.L4:
        r.error(
            where("deny_rules"),
            field("deny_rules"),
            "deny_rules require protocol",
            "protocol: rest or protocol: websocket",
        )
    elif (
        read.deny_rules is not None
        and access is None
        and read.rules is None
        and not (protocol is Protocol.MCP and read.profile)
    ):
        r.error(
            where("deny_rules"),
            field("deny_rules"),
            "deny_rules require rules or access to define the base allow set",
        )


def _check_protocol_rules(r: Reader, ep: _Fields, read: _Read) -> None:
    """What each L7 protocol needs to define its allowed traffic (V14-V17, V31's broad tools/call)."""
    base, items, protocol, rules = ep.base, ep.items, read.protocol, read.rules
    p_node = ep.field("protocol")
    explicit = rules is not None or "rules" in items
    if protocol in (Protocol.JSON_RPC, Protocol.MCP):
        if read.access is not None:
            r.error(f"{base}.access", items["access"][1], f"protocol {protocol} does not support access presets",
                    "rules with allow.method")  # fmt: skip
        elif protocol is Protocol.JSON_RPC and not explicit:
            r.error(f"{base}.protocol", p_node, "protocol json-rpc requires explicit rules with allow.method")
        elif protocol is Protocol.MCP and not explicit and not read.profile:
            r.error(f"{base}.protocol", p_node,
                    "protocol mcp requires rules when mcp.allow_all_known_mcp_methods is false",
                    "rules, or mcp: {allow_all_known_mcp_methods: true}")  # fmt: skip
    elif protocol.inspected and read.access is None and not explicit:
        r.error(f"{base}.protocol", p_node,
                f"protocol {protocol} requires rules or access to define allowed traffic")  # fmt: skip
    if protocol is Protocol.MCP and rules:
        broad = any(rule.tool is None and method_covers_call(rule.method) for rule in rules)
        if broad and any(rule.tool is not None for rule in rules):
            r.error(f"{base}.rules", items["rules"][1], "an allow rule matching every tools/call (no tool "
                    "selector) cannot be combined with tool-specific allows: the tool selectors would not "
                    "limit anything", "tool selectors on every rule whose method matches tools/call")  # fmt: skip


def _check_tls_skip(r: Reader, ep: _Fields, read: _Read) -> None:
    """D13, V28: with ``tls: skip`` control never sees the requests, so it can neither sign nor inspect them."""
    if read.tls is not TlsMode.SKIP:
        return
    if read.signing is not None:
        r.error(ep.where("credential_signing"), ep.field("credential_signing"),
                "credential_signing with tls: skip would never sign: control does not see the requests",
                "no tls (auto)")  # fmt: skip
    if read.protocol.inspected:
        r.error(
            ep.where("tls"),
            ep.field("tls"),
            f"protocol {read.protocol} with tls: skip would never inspect traffic, so its rules would not be enforced",
            "no tls (auto), or no protocol for a raw tunnel",
        )


def _warn_without_effect(r: Reader, ep: _Fields, read: _Read) -> None:
    """D14's audit-mode warning, and the flags the endpoint's protocol never acts on."""
    if read.protocol.inspected and not read.enforcement_explicit:
        r.warn(
            ep.where("enforcement"),
            ep.node,
            "L7 endpoint without 'enforcement: enforce' runs in audit mode: violations are logged but allowed",
        )
    if not read.protocol.inspected:
        for flag in ("allow_encoded_slash", "websocket_credential_rewrite"):
            if read.flags[flag]:
                r.warn(ep.where(flag), ep.field(flag), f"{flag} has no effect without protocol rest/websocket")
    if read.flags["request_body_credential_rewrite"] and read.protocol is not Protocol.REST:
        r.warn(
            ep.where("request_body_credential_rewrite"),
            ep.field("request_body_credential_rewrite"),
            "request_body_credential_rewrite has no effect without protocol rest",
        )
