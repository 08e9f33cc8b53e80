"""The inference routes file (``--inference-routes FILE``, docs/policy.md "Inference routing"). Pure: text in,
an immutable :class:`InferenceRoutes` out, or :class:`RoutesInvalid` naming every problem by its YAML path.

Rules:

1. The file is ``{version: 1, routes: {NAME: ROUTE}}``. A route says its backend ``kind`` (``openai``: an
   OpenAI-compatible API; ``anthropic``: the Messages API), its ``base_url`` (``https`` only: the backend's TLS is
   verified as any upstream's; it stands for the agent's ``/v1``, so ``/v1/chat/completions`` goes to
   ``base_url + /chat/completions``), the ``credential`` it injects (a name in control's credentials file: the
   secret never appears here), the ``models`` it serves (exact names), and optionally ``model_rewrite`` (the
   agent's name to the backend's), ``allowed_ips`` (the policy's rules for a backend on a private address) and
   ``binaries`` (which programs may use it: without them every process of the agent can spend the key).
2. A model is served by one route per kind: two routes of one kind naming one model are refused (which backend
   the agent's request reaches must never depend on an order).
3. The backend is never ``inference.local`` itself or a name below it (control's own name, never resolved).
4. The credential must name a plain secret (an access key pair only signs); whether it exists is checked
   against the credentials when control loads the file (:meth:`InferenceRoutes.check_credentials`).
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv6Address
from typing import Any
from urllib.parse import urlsplit

import yaml

from supervisor.control.addresses import parse_host_literal
from supervisor.control.credentials import Credentials
from supervisor.control.policy.compiled import CompiledPolicy, CompiledRule
from supervisor.control.policy.globs import GlobSyntaxError, compile_path_glob
from supervisor.control.policy.hosts import validate_policy_host
from supervisor.control.policy.identity import BinaryIdentity
from supervisor.control.policy.model import Binary, NetworkRule
from supervisor.control.policy.schema_endpoint import INFERENCE_HOST
from supervisor.control.upstream import UpstreamError, check_allowed_ips
from supervisor.protocol.json_value import JsonValue

__all__ = ["INFERENCE_HOST", "BackendKind", "InferenceRoutes", "Route", "RoutesInvalid", "load_routes_text"]

_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
_MODEL = re.compile(r"[\x21-\x7e]{1,256}")
_ROUTE_KEYS = frozenset({"kind", "base_url", "credential", "models", "model_rewrite", "allowed_ips", "binaries"})
_BINARY_KEYS = frozenset({"path", "allow_loader_env"})


class BackendKind(enum.StrEnum):
    OPENAI = "openai"
    ANTHROPIC = "anthropic"


class RoutesInvalid(ValueError):
    """Every problem of a routes file, each ``where: what``; never a secret (the file holds none)."""

    def __init__(self, source: str, errors: list[str]) -> None:
        super().__init__(f"{source}: " + "; ".join(errors))
        self.source = source
        self.errors = tuple(errors)


@dataclass(frozen=True)
class Route:
    name: str
    kind: BackendKind
    host: str  # normalised
    port: int
    prefix: str  # the base URL's path, no trailing slash ("" for the root)
    credential: str
    models: tuple[str, ...]
    model_rewrite: Mapping[str, str] = field(default_factory=dict)
    allowed_ips: tuple[str, ...] = ()
    binaries: tuple[Binary, ...] = ()
    _binary_rule: CompiledRule | None = field(default=None, compare=False, repr=False)

    @property
    def base_url(self) -> str:
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return f"https://{shown}{'' if self.port == 443 else f':{self.port}'}{self.prefix}"

    @property
    def exact_host(self) -> bool:
        return not isinstance(parse_host_literal(self.host), IPv4Address | IPv6Address)

    def backend_model(self, model: str) -> str:
        return self.model_rewrite.get(model, model)

    def backend_path(self, path: str) -> str:
        """The agent's ``/v1/...`` path on this backend (rule 1)."""
        return self.prefix + path[len("/v1") :]

    def usable_by(self, identity: BinaryIdentity | None, *, relaxed: bool) -> bool:
        """Whether the process behind a connection may use this route: any without ``binaries``; with them, only
        a matching binary — never an unidentified one, nor any under relaxed identity (fail closed)."""
        if self._binary_rule is None:
            return True
        if relaxed or identity is None:
            return False
        return self._binary_rule.binary_matches(identity)

    def to_json(self) -> dict[str, JsonValue]:
        out: dict[str, JsonValue] = {"kind": str(self.kind), "base_url": self.base_url, "credential": self.credential,
                               "models": list(self.models)}  # fmt: skip
        if self.model_rewrite:
            out["model_rewrite"] = dict(self.model_rewrite)
        if self.allowed_ips:
            out["allowed_ips"] = list(self.allowed_ips)
        if self.binaries:
            out["binaries"] = [{"path": b.path, **({"allow_loader_env": True} if b.allow_loader_env else {})}
                               for b in self.binaries]  # fmt: skip
        return out


@dataclass(frozen=True)
class InferenceRoutes:
    routes: tuple[Route, ...] = ()
    digest: str = ""
    source: str = ""

    def route_for(self, kind: BackendKind, model: str) -> Route | None:
        for route in self.routes:
            if route.kind is kind and model in route.models:
                return route
        return None

    def visible(self, identity: BinaryIdentity | None, *, relaxed: bool) -> list[Route]:
        return [r for r in self.routes if r.usable_by(identity, relaxed=relaxed)]

    def check_credentials(self, credentials: Credentials) -> list[str]:
        """Rule 4: problems with the credentials the routes name (an empty list when there are none)."""
        by_name = {c.name: c for c in credentials}
        problems = []
        for route in self.routes:
            cred = by_name.get(route.credential)
            if cred is None:
                problems.append(f"routes.{route.name}.credential: {route.credential!r} is not in the credentials file")
            elif cred.key_pair is not None:
                problems.append(f"routes.{route.name}.credential: {route.credential!r} is an access key pair, "
                                "which only signs; a route injects a secret")  # fmt: skip
        return problems

    def to_json(self) -> dict[str, JsonValue]:
        return {"routes": {r.name: r.to_json() for r in self.routes}, "digest": self.digest, "source": self.source}


class _Reader:
    def __init__(self) -> None:
        self.errors: list[str] = []

    def error(self, where: str, what: str) -> None:
        self.errors.append(f"{where}: {what}")

    def strings(self, raw: Any, where: str, pattern: re.Pattern[str], what: str) -> list[str]:
        if not isinstance(raw, list) or not raw:
            self.error(where, "expected a non-empty list")
            return []
        out = []
        for i, item in enumerate(raw):
            if not isinstance(item, str) or not pattern.fullmatch(item):
                self.error(f"{where}[{i}]", f"expected {what}")
            elif item in out:
                self.error(f"{where}[{i}]", f"{item!r} is listed twice")
            else:
                out.append(item)
        return out


def _base_url(r: _Reader, raw: Any, where: str) -> tuple[str, int, str] | None:
    if not isinstance(raw, str):
        r.error(where, "expected an https:// URL")
        return None
    try:
        parts = urlsplit(raw)
        port = parts.port or 443
    except ValueError as exc:
        r.error(where, f"not a URL: {exc}")
        return None
    if parts.scheme != "https":
        r.error(where, "must be https://: the backend's TLS is verified as any upstream's")
        return None
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment or "#" in raw:
        r.error(where, "no user, query or fragment: the backend's key is the route's credential")
        return None
    host, problem = validate_policy_host(parts.hostname or "", tcp=False)
    if problem is not None or not host or "*" in host:
        r.error(where, problem or "expected one exact host")
        return None
    if host == INFERENCE_HOST or host.endswith("." + INFERENCE_HOST):
        r.error(where, f"{host} is never an upstream: {INFERENCE_HOST} is control's own name")
        return None
    path = parts.path.rstrip("/")
    if any(ord(c) <= 0x20 or ord(c) >= 0x7F or c in "%\\" for c in path) or "/../" in f"{path}/" \
            or "/./" in f"{path}/":  # fmt: skip
        r.error(where, "the path must be plain printable ASCII without dot segments or escapes")
        return None
    return host, port, path


def _binaries(r: _Reader, raw: Any, where: str) -> tuple[Binary, ...]:
    if not isinstance(raw, list) or not raw:
        r.error(where, "expected a non-empty list of {path, allow_loader_env?}")
        return ()
    out = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(item, Mapping) or not isinstance(item.get("path"), str):
            r.error(at, "expected {path: /absolute/path-or-glob}")
            continue
        if set(item) - _BINARY_KEYS:
            r.error(at, f"unknown keys {sorted(set(item) - _BINARY_KEYS)}")
            continue
        path, loader = item["path"], item.get("allow_loader_env", False)
        if not isinstance(loader, bool):
            r.error(f"{at}.allow_loader_env", "expected true or false")
            continue
        if not path.startswith("/") and not path.startswith("**"):
            r.error(f"{at}.path", f"binary path {path!r} is not absolute")
            continue
        if "*" in path:
            try:
                compile_path_glob(path)
            except GlobSyntaxError as exc:
                r.error(f"{at}.path", f"invalid binary glob: {exc}")
                continue
        out.append(Binary(path, loader))
    return tuple(out)


def _route(r: _Reader, name: Any, raw: Any) -> Route | None:
    where = f"routes.{name}"
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        r.error(where, "route names are [a-z0-9][a-z0-9._-]*, at most 63 characters")
        return None
    if not isinstance(raw, Mapping):
        r.error(where, "expected a mapping with kind, base_url, credential and models")
        return None
    before = len(r.errors)
    unknown = set(raw) - _ROUTE_KEYS
    if unknown:
        r.error(where, f"unknown keys {sorted(map(str, unknown))}")
    for key in ("kind", "base_url", "credential", "models"):
        if key not in raw:
            r.error(where, f"missing required key {key!r}")
    try:
        kind = BackendKind(str(raw.get("kind")))
    except ValueError:
        r.error(f"{where}.kind", "expected openai or anthropic")
        kind = BackendKind.OPENAI
    base = _base_url(r, raw.get("base_url"), f"{where}.base_url") if "base_url" in raw else None
    credential = raw.get("credential")
    if "credential" in raw and (not isinstance(credential, str) or not credential):
        r.error(f"{where}.credential", "expected the name of a credential in control's credentials file")
    models = r.strings(raw.get("models"), f"{where}.models", _MODEL, "a model name (printable ASCII, no spaces)")
    rewrite: dict[str, str] = {}
    if raw.get("model_rewrite") is not None:
        given = raw["model_rewrite"]
        if not isinstance(given, Mapping):
            r.error(f"{where}.model_rewrite", "expected a mapping of the agent's model name to the backend's")
        else:
            for key, value in given.items():
                if key not in models:
                    r.error(f"{where}.model_rewrite.{key}", "rewrites a model the route does not serve")
                elif not isinstance(value, str) or not _MODEL.fullmatch(value):
                    r.error(f"{where}.model_rewrite.{key}", "expected a model name (printable ASCII, no spaces)")
                else:
                    rewrite[key] = value
    allowed: tuple[str, ...] = ()
    if raw.get("allowed_ips") is not None:
        given = raw["allowed_ips"]
        if not isinstance(given, list) or not all(isinstance(x, str) for x in given) or not given:
            r.error(f"{where}.allowed_ips", "expected a non-empty list of addresses or CIDRs")
        else:
            try:
                check_allowed_ips(given)
                allowed = tuple(given)
            except UpstreamError as exc:
                r.error(f"{where}.allowed_ips", exc.detail)
    binaries = _binaries(r, raw["binaries"], f"{where}.binaries") if raw.get("binaries") is not None else ()
    if len(r.errors) != before or base is None or not isinstance(credential, str):
        return None
    rule = None
    if binaries:
        rule = CompiledPolicy._compile_rule(0, NetworkRule(name, name, (), binaries), {}, {})
    host, port, prefix = base
    return Route(name, kind, host, port, prefix, credential, tuple(models), rewrite, allowed, binaries, rule)


def load_routes_text(text: str, source: str) -> InferenceRoutes:
    """Parse and validate a routes file; raises :class:`RoutesInvalid` with every problem."""
    r = _Reader()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise RoutesInvalid(source, [f"not valid YAML{f' at line {mark.line + 1}' if mark else ''}"]) from None
    if data is None:
        data = {"version": 1, "routes": {}}
    if not isinstance(data, Mapping):
        raise RoutesInvalid(source, ["expected a mapping with version and routes"])
    if data.get("version") != 1:
        r.error("version", "expected 1")
    if set(data) - {"version", "routes"}:
        r.error("", f"unknown keys {sorted(map(str, set(data) - {'version', 'routes'}))}")
    raw_routes = data.get("routes") or {}
    if not isinstance(raw_routes, Mapping):
        r.error("routes", "expected a mapping of route name to route")
        raw_routes = {}
    routes = [route for name, raw in raw_routes.items() if (route := _route(r, name, raw)) is not None]
    served: dict[tuple[BackendKind, str], str] = {}
    for route in routes:
        for model in route.models:
            other = served.setdefault((route.kind, model), route.name)
            if other != route.name:
                r.error(f"routes.{route.name}.models", f"{model!r} is served by route {other!r} too ({route.kind})")
    if r.errors:
        raise RoutesInvalid(source, r.errors)
    digest = "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()
    return InferenceRoutes(tuple(routes), digest, source)
