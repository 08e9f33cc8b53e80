"""Load and validate a policy document (docs/reference/policy.md §1, with the §6 decisions).

Size (over ~500 lines on purpose): the document's validation, section by section, each error naming its path; the
large sections are already apart (schema_l7, schema_static).

Rules:

1. The whole candidate is refused when anything is wrong, and *every* violation is reported with the YAML path
   of its field, what was expected, and the line (``PolicyInvalid``). Nothing is half-loaded.
2. Unknown keys are errors at every level (with a did-you-mean). ``version`` must be 1 (D1), ``port`` with
   ``ports`` is always an error (D15), an unknown ``access`` preset is an error (D11), ``allowed_ips`` is checked
   here rather than per connection (D12), an L7 protocol with ``tls: skip`` is an error (D13: its rules would
   never be enforced), and so is ``rules``/``access`` on an endpoint without an L7 protocol (it would silently
   allow everything).
3. Features this project has not built (middleware, GraphQL over WebSocket, SQL) are refused with a "not
   supported yet" error naming the field (D16), never silently ignored. The GraphQL, JSON-RPC and MCP rule shapes
   and options are read by ``schema_rpc``. ``credential_signing`` (V28) needs ``signing_service``, excludes
   ``request_body_credential_rewrite`` and ``tls: skip`` (nothing would be signed); a host ``inference.local`` is
   refused (control's inference router serves that name, §3.16).
4. Warnings (accepted but suspicious) ride along on ``Policy.warnings``: L7 endpoints left in audit mode (D14),
   deprecated ``tls`` values, unknown HTTP methods, broad CIDRs, rules that can never match.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import yaml

from supervisor.control.addresses import blocked_in_network

from .ambiguity import Located, check_ambiguity
from .errors import PolicyError, PolicyInvalid
from .globs import GlobSyntaxError, compile_path_glob
from .hosts import validate_policy_host
from .model import (
    AccessPreset,
    Binary,
    Endpoint,
    Enforcement,
    L7Rule,
    NetworkRule,
    Policy,
    Protocol,
    TlsMode,
)
from .schema_l7 import check_websocket_graphql, read_l7_rules
from .schema_rpc import method_covers_call, read_options
from .schema_static import read_filesystem, read_landlock, read_process
from .yamlnodes import Reader, line_of

TOP_KEYS = ("version", "filesystem_policy", "landlock", "process", "network_policies", "network_middlewares")
RULE_KEYS = ("name", "endpoints", "binaries")
BINARY_KEYS = ("path", "harness", "allow_loader_env")
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
SIGNING_MODES = ("sigv4", "sigv4:body", "sigv4:no_body")
# what a signing service or region may be: it goes into the signature's scope and the SigV4 string to sign
_SIGNING_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
# served by control's inference router (docs/reference/policy.md §3.16), never by a policy endpoint
INFERENCE_HOST = "inference.local"
_RULE_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}")
Node = yaml.Node


def load_policy_text(text: str, source: str = "<string>") -> Policy:
    """Parse and validate; raises ``PolicyInvalid`` listing every error."""
    reader = Reader(text, source)
    root = reader.compose()
    policy = _Schema(reader).policy(root) if not reader.errors else None
    if reader.errors or policy is None:
        raise PolicyInvalid(sorted(reader.errors, key=lambda e: e.line or 0))
    return policy


def load_policy_file(path: Path) -> Policy:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyInvalid([PolicyError("", f"cannot read policy file: {exc}", source=str(path))]) from exc
    return load_policy_text(text, str(path))


def load_default_policy() -> Policy:
    """The embedded dev-mode policy: version 1, static sections empty, no network rules (deny all egress)."""
    text = resources.files("supervisor.control").joinpath("default_policy.yaml").read_text(encoding="utf-8")
    return load_policy_text(text, "default_policy.yaml")


class _Schema:
    def __init__(self, reader: Reader) -> None:
        self.r = reader
        self.located: list[Located] = []

    # --- top level ------------------------------------------------------------------------------------

    def policy(self, root: Node | None) -> Policy | None:
        r = self.r
        if root is None:
            r.error("", None, "policy is empty", "a mapping with version: 1")
            return None
        top = r.mapping(root, "")
        if top is None:
            return None
        r.check_keys(top, "", TOP_KEYS)
        version = None
        if "version" not in top:
            r.error("version", root, "missing required key 'version'", "version: 1")
        else:
            version = r.integer(top["version"][1], "version")
            if version is not None and version != 1:
                r.error("version", top["version"][1], f"unsupported policy version {version}", "1")
        fs = read_filesystem(self.r, top["filesystem_policy"][1]) if "filesystem_policy" in top else None
        landlock = read_landlock(self.r, top["landlock"][1]) if "landlock" in top else None
        process = read_process(self.r, top["process"][1]) if "process" in top else None
        rules: list[NetworkRule] = []
        if "network_policies" in top:
            rules = self.network_policies(top["network_policies"][1])
        if "network_middlewares" in top:
            self.middlewares(top["network_middlewares"][1])
        for err in check_ambiguity(self.located):
            r.errors.append(dataclasses.replace(err, source=r.source))
        if r.errors:
            return None
        return Policy(
            version=1,
            network_policies=tuple(sorted(rules, key=lambda rule: rule.key)),
            filesystem_policy=fs,
            landlock=landlock,
            process=process,
            warnings=tuple(r.warnings),
            source=r.source,
        )

    def middlewares(self, node: Node) -> None:
        items = self.r.mapping(node, "network_middlewares")
        if items:
            self.r.error("network_middlewares", node, "network middleware is not supported yet")

    # --- static sections ------------------------------------------------------------------------------

    # --- network --------------------------------------------------------------------------------------

    def network_policies(self, node: Node) -> list[NetworkRule]:
        r = self.r
        if isinstance(node, yaml.ScalarNode) and r.value(node) is None:
            return []
        items = r.mapping(node, "network_policies")
        if items is None:
            return []
        rules = []
        for key, (key_node, value_node) in items.items():
            rule = self.rule(key, key_node, value_node)
            if rule is not None:
                rules.append(rule)
        return rules

    def rule(self, key: str, key_node: Node, node: Node) -> NetworkRule | None:
        r = self.r
        base = f"network_policies.{key}"
        ok = True
        if key.startswith("_provider_"):
            r.error(base, key_node, "rule keys starting with '_provider_' are reserved for provider rules")
            ok = False
        elif _RULE_KEY.fullmatch(key) is None:
            r.error(
                base,
                key_node,
                f"invalid rule key {key!r}",
                "letters, digits and _.:@- (starting with a letter or digit), at most 128 characters",
            )
            ok = False
        items = r.mapping(node, base)
        if items is None:
            return None
        r.check_keys(items, base, RULE_KEYS)
        name = key
        if "name" in items:
            name = r.string(items["name"][1], f"{base}.name") or key
        endpoints: list[Endpoint] = []
        if "endpoints" in items:
            seq = r.sequence(items["endpoints"][1], f"{base}.endpoints")
            for i, ep_node in enumerate(seq or []):
                ep = self.endpoint(f"{base}.endpoints[{i}]", ep_node)
                ok = ok and ep is not None
                if ep is not None:
                    endpoints.append(ep)
        binaries: list[Binary] = []
        if "binaries" in items:
            seq = r.sequence(items["binaries"][1], f"{base}.binaries")
            for i, b_node in enumerate(seq or []):
                binary = self.binary(f"{base}.binaries[{i}]", b_node)
                ok = ok and binary is not None
                if binary is not None:
                    binaries.append(binary)
        if not endpoints and ok:
            r.warn(f"{base}.endpoints", node, "rule has no endpoints and never matches")
        if not binaries and ok:
            r.warn(f"{base}.binaries", node, "rule has no binaries and never matches")
        if not ok:
            return None
        return NetworkRule(key, name, tuple(endpoints), tuple(binaries))

    def binary(self, base: str, node: Node) -> Binary | None:
        r = self.r
        items = r.mapping(node, base)
        if items is None:
            return None
        r.check_keys(items, base, BINARY_KEYS)
        if "harness" in items:
            r.boolean(items["harness"][1], f"{base}.harness")  # accepted and ignored (backward compatibility)
        allow_loader_env = False
        if "allow_loader_env" in items:
            flag = r.boolean(items["allow_loader_env"][1], f"{base}.allow_loader_env")
            if flag is None:
                return None
            allow_loader_env = flag
        if "path" not in items:
            r.error(f"{base}.path", node, "missing required key 'path'", "an absolute executable path or glob")
            return None
        path_node = items["path"][1]
        path = r.string(path_node, f"{base}.path", allow_empty=False)
        if path is None:
            return None
        if not path.startswith("/") and not path.startswith("**"):
            r.error(
                f"{base}.path",
                path_node,
                f"binary path {path!r} is not absolute",
                "an absolute path such as /usr/bin/git",
            )
            return None
        if "*" in path:
            try:
                compile_path_glob(path)
            except GlobSyntaxError as exc:
                r.error(f"{base}.path", path_node, f"invalid binary glob: {exc}")
                return None
        return Binary(path, allow_loader_env)

    def endpoint(self, base: str, node: Node) -> Endpoint | None:
        r = self.r
        items = r.mapping(node, base)
        if items is None:
            return None
        errors_before = len(r.errors)
        r.check_keys(items, base, ENDPOINT_KEYS, ENDPOINT_NOT_YET)

        def field(key: str) -> Node | None:
            return items[key][1] if key in items else None

        def where(key: str) -> str:
            return f"{base}.{key}"

        # protocol first: several checks depend on it
        protocol = Protocol.L4
        if (p_node := field("protocol")) is not None:
            raw = r.string(p_node, where("protocol"))
            if raw is not None:
                lowered = raw.strip().lower()
                if lowered in PROTOCOL_NOT_YET:
                    r.error(
                        where("protocol"),
                        p_node,
                        f"protocol {lowered!r} ({PROTOCOL_NOT_YET[lowered]}) is not supported yet",
                    )
                else:
                    try:
                        protocol = Protocol(lowered)
                    except ValueError:
                        r.error(
                            where("protocol"),
                            p_node,
                            f"unknown protocol {raw!r}",
                            "tcp, rest, websocket, graphql, json-rpc or mcp (or no protocol for plain L4)",
                        )
        tcp = protocol is Protocol.TCP

        # allowed_ips (V34)
        allowed_ips: list[str] = []
        if (ips_node := field("allowed_ips")) is not None:
            for i, item in enumerate(r.sequence(ips_node, where("allowed_ips")) or []):
                net = self.allowed_ip(f"{where('allowed_ips')}[{i}]", item)
                if net is not None and net not in allowed_ips:
                    allowed_ips.append(net)
            if isinstance(ips_node, yaml.SequenceNode) and not ips_node.value:
                r.error(where("allowed_ips"), ips_node, "allowed_ips list cannot be empty")

        # host (V1-V4, V8-V11)
        host, host_error = "", False
        if (h_node := field("host")) is not None:
            raw_host = r.string(h_node, where("host"))
            if raw_host is None:
                host_error = True
            elif raw_host:
                host, problem = validate_policy_host(raw_host, tcp=tcp)
                if problem:
                    r.error(where("host"), h_node, problem)
                    host_error = True
                elif host == INFERENCE_HOST:
                    r.error(where("host"), h_node, f"{INFERENCE_HOST} is served by control's inference routes "
                            "(--inference-routes), never by a policy endpoint", "another host")  # fmt: skip
                    host_error = True
        if not host and not host_error:
            at = h_node if h_node is not None else node
            if tcp:
                r.error(where("host"), at, "protocol tcp requires a DNS hostname")
            elif not allowed_ips and ips_node is None:
                r.error(
                    where("host"),
                    at,
                    "endpoint host must not be empty unless allowed_ips constrains a non-TCP proxy endpoint",
                    "a host name, IP address or host glob",
                )

        # ports (V5-V7, D15)
        ports: list[int] = []
        port_errors = len(r.errors)
        has_port, has_ports = "port" in items, "ports" in items
        if has_port and has_ports:
            r.error(where("ports"), items["ports"][0], "port and ports are mutually exclusive", "one of them")
        if has_ports:
            for i, item in enumerate(r.sequence(items["ports"][1], where("ports")) or []):
                port = self.port(f"{where('ports')}[{i}]", item)
                if port is not None and port not in ports:
                    ports.append(port)
        elif has_port:
            port = self.port(where("port"), items["port"][1])
            if port is not None:
                ports.append(port)
        if not ports and len(r.errors) == port_errors:
            at = items["ports"][1] if has_ports else node
            r.error(where("ports"), at, "endpoint must declare at least one port", "port: N or ports: [N, ...]")

        # tls (D13)
        tls: TlsMode | None = None
        if (t_node := field("tls")) is not None:
            raw_tls = r.string(t_node, where("tls"))
            if raw_tls in ("terminate", "passthrough"):
                r.warn(where("tls"), t_node, f"tls: {raw_tls} is deprecated and has no effect")
            elif raw_tls is not None:
                try:
                    tls = TlsMode(raw_tls)
                except ValueError:
                    r.error(where("tls"), t_node, f"unknown tls mode {raw_tls!r}", "skip or auto")

        # enforcement (D14)
        enforcement, enforcement_explicit = Enforcement.AUDIT, False
        if (e_node := field("enforcement")) is not None:
            raw_e = r.string(e_node, where("enforcement"))
            if raw_e is not None:
                try:
                    enforcement, enforcement_explicit = Enforcement(raw_e), True
                except ValueError:
                    r.error(where("enforcement"), e_node, f"unknown enforcement {raw_e!r}", "enforce or audit")

        # endpoint path (V24)
        ep_path = ""
        if (path_node := field("path")) is not None:
            raw_path = r.string(path_node, where("path"))
            if raw_path is not None and raw_path != "":
                if not (raw_path.startswith("/") or raw_path == "**"):
                    r.error(where("path"), path_node, "endpoint path must start with '/' or be '**'")
                else:
                    try:
                        compile_path_glob(raw_path)
                        ep_path = raw_path
                    except GlobSyntaxError as exc:
                        r.error(where("path"), path_node, f"invalid path glob: {exc}")

        # access preset (D11, V13)
        access: AccessPreset | None = None
        if (a_node := field("access")) is not None:
            raw_a = r.string(a_node, where("access"))
            if raw_a is not None:
                try:
                    access = AccessPreset(raw_a)
                except ValueError:
                    r.error(
                        where("access"), a_node, f"unknown access preset {raw_a!r}", "read-only, read-write or full"
                    )

        options = read_options(self.r, base, items, protocol)
        profile = bool(options.get("mcp_allow_all_known_methods"))
        strict = options.get("mcp_strict_tool_names") is not False
        rules = read_l7_rules(self.r, base, items, protocol, allow=True, profile=profile, strict=strict)
        deny_rules = read_l7_rules(self.r, base, items, protocol, allow=False, profile=profile, strict=strict)
        if protocol is Protocol.WEBSOCKET:
            check_websocket_graphql(self.r, base, items, rules, deny_rules)

        flags: dict[str, bool] = {}
        for flag in (
            "allow_encoded_slash",
            "websocket_credential_rewrite",
            "request_body_credential_rewrite",
            "allow_uninspected_credentials",
        ):
            flags[flag] = bool(r.boolean(items[flag][1], where(flag))) if flag in items else False

        binding: str | None = None
        if (b_node := field("credential_binding")) is not None:
            b_items = r.mapping(b_node, where("credential_binding"))
            if b_items is not None:
                r.check_keys(b_items, where("credential_binding"), ("provider",))
                if "provider" in b_items:
                    binding = r.string(
                        b_items["provider"][1], f"{where('credential_binding')}.provider", allow_empty=False
                    )
                else:
                    r.error(f"{where('credential_binding')}.provider", b_node, "missing required key 'provider'")

        signing, signing_service, signing_region = self.signing(items, where, field, flags)

        # cross-field rules
        inspected = protocol.inspected
        if tcp:
            bad = [key for key in TCP_FORBIDDEN if key in items]
            if bad:
                r.error(
                    where("protocol"),
                    field("protocol"),
                    "protocol tcp does not support L7-only fields: " + ", ".join(bad),
                )
        else:
            if access is not None and rules is not None:
                r.error(where("rules"), field("rules"), "rules and access are mutually exclusive", "one of them")
            if protocol is Protocol.L4 and (access is not None or rules is not None):
                key = "access" if access is not None else "rules"
                r.error(
                    where(key),
                    field(key),
                    f"{key} without an L7 protocol would never be enforced",
                    "protocol: rest or protocol: websocket",
                )
            if deny_rules is not None and protocol is Protocol.L4:
                r.error(
                    where("deny_rules"),
                    field("deny_rules"),
                    "deny_rules require protocol",
                    "protocol: rest or protocol: websocket",
                )
            elif (
                deny_rules is not None
                and access is None
                and rules is None
                and not (protocol is Protocol.MCP and profile)
            ):
                r.error(
                    where("deny_rules"),
                    field("deny_rules"),
                    "deny_rules require rules or access to define the base allow set",
                )
            self.protocol_rules(base, items, node, protocol, access, rules, profile)
            if signing is not None and tls is TlsMode.SKIP:
                r.error(where("credential_signing"), field("credential_signing"),
                        "credential_signing with tls: skip would never sign: control does not see the requests",
                        "no tls (auto)")  # fmt: skip
            if inspected and tls is TlsMode.SKIP:
                r.error(
                    where("tls"),
                    field("tls"),
                    f"protocol {protocol} with tls: skip would never inspect traffic, so its rules would not "
                    "be enforced",
                    "no tls (auto), or no protocol for a raw tunnel",
                )
            if inspected and not enforcement_explicit:
                r.warn(
                    where("enforcement"),
                    node,
                    "L7 endpoint without 'enforcement: enforce' runs in audit mode: violations are logged but allowed",
                )
            if not inspected:
                for flag in ("allow_encoded_slash", "websocket_credential_rewrite"):
                    if flags[flag]:
                        r.warn(where(flag), field(flag), f"{flag} has no effect without protocol rest/websocket")
            if flags["request_body_credential_rewrite"] and protocol is not Protocol.REST:
                r.warn(
                    where("request_body_credential_rewrite"),
                    field("request_body_credential_rewrite"),
                    "request_body_credential_rewrite has no effect without protocol rest",
                )

        if len(r.errors) > errors_before:
            return None
        endpoint = Endpoint(
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
        self.located.append(Located(base, line_of(node), endpoint))
        return endpoint

    def signing(self, items: dict[str, tuple[Node, Node]], where: Callable[[str], str],
                field: Callable[[str], Node | None], flags: dict[str, bool]) -> tuple[str | None, str | None,
                                                                                      str | None]:  # fmt: skip
        """V28: ``credential_signing`` one of the modes, with ``signing_service``, without
        ``request_body_credential_rewrite``; service and region are lower-case names."""
        r = self.r
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

    def protocol_rules(
        self,
        base: str,
        items: dict[str, tuple[Node, Node]],
        node: Node,
        protocol: Protocol,
        access: AccessPreset | None,
        rules: tuple[L7Rule, ...] | None,
        profile: bool,
    ) -> None:
        """What each L7 protocol needs to define its allowed traffic (V14-V17, V31's broad tools/call)."""
        r = self.r
        p_node = items["protocol"][1] if "protocol" in items else None
        explicit = rules is not None or "rules" in items
        if protocol in (Protocol.JSON_RPC, Protocol.MCP):
            if access is not None:
                r.error(f"{base}.access", items["access"][1], f"protocol {protocol} does not support access presets",
                        "rules with allow.method")  # fmt: skip
            elif protocol is Protocol.JSON_RPC and not explicit:
                r.error(f"{base}.protocol", p_node, "protocol json-rpc requires explicit rules with allow.method")
            elif protocol is Protocol.MCP and not explicit and not profile:
                r.error(f"{base}.protocol", p_node,
                        "protocol mcp requires rules when mcp.allow_all_known_mcp_methods is false",
                        "rules, or mcp: {allow_all_known_mcp_methods: true}")  # fmt: skip
        elif protocol.inspected and access is None and not explicit:
            r.error(f"{base}.protocol", p_node,
                    f"protocol {protocol} requires rules or access to define allowed traffic")  # fmt: skip
        if protocol is Protocol.MCP and rules:
            broad = any(rule.tool is None and method_covers_call(rule.method) for rule in rules)
            if broad and any(rule.tool is not None for rule in rules):
                r.error(f"{base}.rules", items["rules"][1], "an allow rule matching every tools/call (no tool "
                        "selector) cannot be combined with tool-specific allows: the tool selectors would not "
                        "limit anything", "tool selectors on every rule whose method matches tools/call")  # fmt: skip

    def port(self, where: str, node: Node) -> int | None:
        value = self.r.integer(node, where)
        if value is None:
            return None
        if not 1 <= value <= 65535:
            self.r.error(where, node, f"invalid port {value}", "1..=65535")
            return None
        return value

    def allowed_ip(self, where: str, node: Node) -> str | None:
        r = self.r
        value_node = node
        raw = r.value(node) if isinstance(node, yaml.ScalarNode) else None
        if not isinstance(raw, str):
            r.error(where, value_node, f"expected a CIDR or IP address, got {raw!r}", "e.g. 10.0.0.0/8")
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

    # --- L7 rules -------------------------------------------------------------------------------------
