"""Load and validate a policy document (docs/reference/policy.md §1, with the §6 decisions).

The document's validation, section by section, each error naming its path; the large sections are apart: one
endpoint in ``schema_endpoint``, its L7 rules in ``schema_l7`` (the GraphQL, JSON-RPC and MCP rule shapes and
options in ``schema_rpc``), the static sections in ``schema_static``.

Rules:

1. The whole candidate is refused when anything is wrong, and *every* violation is reported with the YAML path
   of its field, what was expected, and the line (``PolicyInvalid``). Nothing is half-loaded.
2. Unknown keys are errors at every level (with a did-you-mean). ``version`` must be 1 (D1); the endpoint's own
   rules (D11-D15, V28) are ``schema_endpoint``'s.
3. Features this project has not built (middleware, SQL) are refused with a "not supported yet" error naming the
   field (D16), never silently ignored.
4. Warnings (accepted but suspicious) ride along on ``Policy.warnings``: L7 endpoints left in audit mode (D14),
   deprecated ``tls`` values, unknown HTTP methods, broad CIDRs, rules that can never match.
"""

from __future__ import annotations

import dataclasses
import re
from importlib import resources
from pathlib import Path

import yaml

from .ambiguity import Located, check_ambiguity
from .errors import PolicyError, PolicyInvalid
from .globs import GlobSyntaxError, compile_path_glob
from .model import Binary, Endpoint, NetworkRule, Policy
from .schema_endpoint import read_endpoint
from .schema_static import read_filesystem, read_landlock, read_process
from .yamlnodes import Reader, line_of

TOP_KEYS = ("version", "filesystem_policy", "landlock", "process", "network_policies", "network_middlewares")
RULE_KEYS = ("name", "endpoints", "binaries")
BINARY_KEYS = ("path", "harness", "allow_loader_env")
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
        endpoint = read_endpoint(self.r, base, node)
        if endpoint is not None:
            self.located.append(Located(base, line_of(node), endpoint))
        return endpoint
