"""Provider credentials that only control holds; the agent gets placeholders (docs/reference/policy.md §3.13).

Rules:

1. Secrets come from control's configuration only: a YAML/JSON file mapping an environment-variable name to
   ``{secret | secret_env, hosts: [...], placeholder?}``. ``secret_env`` names a variable of *control's*
   environment. Nothing here is ever passed to the boundary except :meth:`Credentials.placeholders`.
2. The agent's environment gets, under the same name, a placeholder: ``openshell:resolve:env:NAME`` unless
   the file sets one. Control substitutes the secret for the placeholder in a request it has admitted, and
   only when the request's endpoint is one the credential is bound to (``hosts``).
3. A credential with no binding (no ``hosts``) is never injected (docs/design.md "Settled details"); its placeholder
   is still issued so the agent's configuration is stable, and using it is a ``credential_endpoint_mismatch``.
4. Binding entries: ``host`` or host glob (§2.1), optionally ``:port`` (any port when omitted) and a path
   pattern (``/x/**`` covers ``/x`` and everything below; ``*`` crosses ``/``), as a string
   ``"api.example.com:443/v1/**"`` or a mapping ``{host, port | ports, path}``.
5. A secret is printable ASCII without leading or trailing whitespace and never contains a placeholder
   marker: it must be safe in a header value, and it must never need escaping that could carry it into an
   error message. A ``secret_env`` variable that is not set leaves the credential *unavailable* (using it is
   ``500 credential_unavailable``) with a warning, rather than failing control's start.
6. Secrets never appear in ``repr``, in errors or in events; errors name the credential, never its value.
7. An access key pair (AWS and compatibles: ``access_key_id[_env]``, ``secret_access_key[_env]``, optional
   ``session_token[_env]``, ``hosts``) gives the agent three placeholders, ``NAME_ACCESS_KEY_ID``,
   ``NAME_SECRET_ACCESS_KEY`` and ``NAME_SESSION_TOKEN`` (the last only with a token), so an SDK signs with them as
   with real keys. Control never places a key pair in a request: it re-signs requests to the endpoints that say
   ``credential_signing`` (``l7.signing``), choosing the pair by the key id the agent signed with. The key id, the
   secret key and the token are all scrubbed from responses of the hosts the pair is bound to.
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from supervisor.control.policy.globs import HostGlob, compile_host_glob
from supervisor.control.policy.hosts import normalize_request_host, validate_policy_host
from supervisor.protocol.process_ops import is_managed_env_key
from supervisor.protocol.responses import ErrorCode

__all__ = [
    "ALIAS_MARKER",
    "MARKER",
    "Binding",
    "Credential",
    "Credentials",
    "CredentialsError",
    "KeyPair",
    "Resolution",
]

MARKER = "openshell:resolve:env:"
ALIAS_MARKER = "OPENSHELL-RESOLVE-ENV-"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_CUSTOM_PLACEHOLDER = re.compile(r"[A-Za-z0-9_.~:\-]{12,256}")
_SECRET = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")
# Every spelling the agent could use for a placeholder: the canonical one and the provider-shaped alias (§3.13).
_GENERIC = r"openshell:resolve:env:[A-Za-z0-9_]+|[A-Za-z0-9_.~\-]*OPENSHELL-RESOLVE-ENV-[A-Za-z0-9_]+"
_ENTRY_KEYS = frozenset({"secret", "secret_env", "hosts", "placeholder"})
_PAIR_FIELDS = ("access_key_id", "secret_access_key", "session_token")
_PAIR_KEYS = frozenset({*_PAIR_FIELDS, *(f"{f}_env" for f in _PAIR_FIELDS), "hosts"})
_BINDING_KEYS = frozenset({"host", "port", "ports", "path"})


class CredentialsError(ValueError):
    """The credentials file is unusable; the message names the file and the field, never a secret."""


class Resolution(enum.StrEnum):
    RESOLVED = "resolved"
    ENDPOINT_MISMATCH = ErrorCode.CREDENTIAL_ENDPOINT_MISMATCH.value  # what the agent reads (one catalogue)
    UNAVAILABLE = ErrorCode.CREDENTIAL_UNAVAILABLE.value


def _path_regex(pattern: str) -> re.Pattern[str]:
    """Rule 4's path pattern: ``*`` crosses ``/``; a trailing ``/**`` also covers the prefix itself."""
    tail = ""
    if pattern.endswith("/**"):
        pattern, tail = pattern[:-3], "(?:/.*)?"
    body = "".join(".*" if c == "*" else "[^/]" if c == "?" else re.escape(c) for c in re.sub(r"\*+", "*", pattern))
    return re.compile(body + tail, re.S)


@dataclass(frozen=True)
class Binding:
    host: str  # normalised host or host glob
    ports: tuple[int, ...]  # empty: any port
    path: str | None = None
    host_glob: HostGlob | None = field(default=None, compare=False, repr=False)
    path_regex: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    def matches(self, host: str, port: int, path: str) -> bool:
        """``host`` normalised, ``path`` canonical and query-less."""
        if not self.matches_endpoint(host, port):
            return False
        return self.path_regex is None or self.path_regex.fullmatch(path) is not None

    def matches_endpoint(self, host: str, port: int) -> bool:
        if self.ports and port not in self.ports:
            return False
        return self.host_glob.matches(host) if self.host_glob is not None else self.host == host

    def describe(self) -> str:
        ports = "" if not self.ports else ":" + ",".join(map(str, self.ports))
        return f"{self.host}{ports}{self.path or ''}"


@dataclass(frozen=True)
class KeyPair:
    """Rule 7: what an access key pair adds to its :class:`Credential` (whose ``secret`` is the secret key)."""

    id_placeholder: str
    token_placeholder: str | None  # None: the pair has no session token
    access_key_id: str | None = field(default=None, repr=False)  # None: unavailable
    session_token: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Credential:
    name: str
    placeholder: str
    bindings: tuple[Binding, ...]
    secret: str | None = field(default=None, repr=False)  # None: unavailable (secret_env not set)
    source: str = ""  # "file" or "env:VAR", for status output
    key_pair: KeyPair | None = None

    def bound_to(self, host: str, port: int, path: str) -> bool:
        return any(b.matches(host, port, path) for b in self.bindings)

    @property
    def available(self) -> bool:
        if self.key_pair is not None and self.key_pair.access_key_id is None:
            return False
        if self.key_pair is not None and self.key_pair.token_placeholder and self.key_pair.session_token is None:
            return False
        return self.secret is not None

    def env(self) -> dict[str, str]:
        """Environment variable -> placeholder: what the agent gets for this credential (rules 2 and 7)."""
        pair = self.key_pair
        if pair is None:
            return {self.name: self.placeholder}
        out = {f"{self.name}_ACCESS_KEY_ID": pair.id_placeholder, f"{self.name}_SECRET_ACCESS_KEY": self.placeholder}
        if pair.token_placeholder is not None:
            out[f"{self.name}_SESSION_TOKEN"] = pair.token_placeholder
        return out

    def secret_pairs(self) -> list[tuple[str, str]]:
        """``(value, placeholder)`` of everything this credential must never hand back to the agent."""
        out = [(self.secret, self.placeholder)] if self.secret else []
        if self.key_pair is not None:
            pair = self.key_pair
            if pair.access_key_id:
                out.append((pair.access_key_id, pair.id_placeholder))
            if pair.session_token and pair.token_placeholder:
                out.append((pair.session_token, pair.token_placeholder))
        return out


def _port(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise CredentialsError(f"{where}: port must be an integer 1..65535")
    return value


def _binding(raw: Any, where: str) -> Binding:
    ports: tuple[int, ...] = ()
    path: str | None = None
    if isinstance(raw, str):
        text = raw.strip()
        slash = text.find("/")
        if slash >= 0:
            text, path = text[:slash], text[slash:]
        if text.startswith("["):
            end = text.find("]")
            host, rest = text[: end + 1], text[end + 1 :]
            if rest:
                if not rest.startswith(":") or not rest[1:].isdigit():
                    raise CredentialsError(f"{where}: expected [ipv6]:port")
                ports = (_port(int(rest[1:]), where),)
        elif text.count(":") == 1:
            host, port_text = text.split(":")
            if not port_text.isdigit():
                raise CredentialsError(f"{where}: port must be a number")
            ports = (_port(int(port_text), where),)
        else:
            host = text
    elif isinstance(raw, Mapping):
        unknown = set(raw) - _BINDING_KEYS
        if unknown:
            raise CredentialsError(f"{where}: unknown keys {sorted(unknown)}")
        named = raw.get("host")
        if not isinstance(named, str):
            raise CredentialsError(f"{where}.host: expected a host name or glob")
        host = named
        if "port" in raw and "ports" in raw:
            raise CredentialsError(f"{where}: port and ports are mutually exclusive")
        if "port" in raw:
            ports = (_port(raw["port"], f"{where}.port"),)
        elif "ports" in raw:
            if not isinstance(raw["ports"], list) or not raw["ports"]:
                raise CredentialsError(f"{where}.ports: expected a non-empty list")
            ports = tuple(_port(p, f"{where}.ports") for p in raw["ports"])
        if raw.get("path") is not None:
            if not isinstance(raw["path"], str):
                raise CredentialsError(f"{where}.path: expected a string")
            path = raw["path"]
    else:
        raise CredentialsError(f"{where}: expected 'host[:port][/path]' or a mapping")
    norm, error = validate_policy_host(host, tcp=False)
    if error is not None or not norm:
        raise CredentialsError(f"{where}: {error or 'empty host'}")
    if path is not None and (not path.startswith("/") or any(ord(c) <= 0x20 or ord(c) >= 0x7F for c in path)):
        raise CredentialsError(f"{where}: path must start with '/' and be printable ASCII")
    return Binding(
        host=norm,
        ports=ports,
        path=path,
        host_glob=compile_host_glob(norm) if "*" in norm else None,
        path_regex=None if path in (None, "/**", "**") else _path_regex(path),
    )


def _credential(name: Any, raw: Any, where: str, environ: Mapping[str, str], warnings: list[str]) -> Credential:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise CredentialsError(f"{where}: credential names are environment variable names ([A-Za-z_][A-Za-z0-9_]*)")
    if name.upper().startswith("OPENSHELL_") or is_managed_env_key(name) or re.fullmatch(r"v\d+_.*|s[0-9a-f]{64}_.*",
                                                                                        name):  # fmt: skip
        raise CredentialsError(f"{where}: {name!r} is reserved")
    if not isinstance(raw, Mapping):
        raise CredentialsError(f"{where}: expected a mapping with secret or secret_env, and hosts")
    if any(key.startswith(_PAIR_FIELDS) for key in raw if isinstance(key, str)):
        return _key_pair(name, raw, where, environ, warnings)
    unknown = set(raw) - _ENTRY_KEYS
    if unknown:
        raise CredentialsError(f"{where}: unknown keys {sorted(unknown)}")
    if ("secret" in raw) == ("secret_env" in raw):
        raise CredentialsError(f"{where}: exactly one of secret and secret_env")
    secret: str | None
    source = "file"
    if "secret" in raw:
        secret = raw["secret"]
        if not isinstance(secret, str):
            raise CredentialsError(f"{where}.secret: expected a string")
    else:
        var = raw["secret_env"]
        if not isinstance(var, str) or not _NAME.fullmatch(var):
            raise CredentialsError(f"{where}.secret_env: expected an environment variable name")
        source = f"env:{var}"
        secret = environ.get(var)
        if secret is None:
            warnings.append(f"{where}: {var} is not set in control's environment; the credential is unavailable")
    if secret is not None and (
        not _SECRET.fullmatch(secret) or MARKER in secret.lower() or ALIAS_MARKER.lower() in secret.lower()
    ):
        raise CredentialsError(f"{where}: the secret must be printable ASCII without surrounding whitespace "
                               "or placeholder markers")  # fmt: skip
    placeholder = raw.get("placeholder", f"{MARKER}{name}")
    if not isinstance(placeholder, str) or (
        placeholder != f"{MARKER}{name}" and not _CUSTOM_PLACEHOLDER.fullmatch(placeholder)
    ):
        raise CredentialsError(f"{where}.placeholder: 12..256 characters of [A-Za-z0-9_.~:-]")
    if secret is not None and (placeholder in secret or secret in placeholder):
        raise CredentialsError(f"{where}.placeholder: must not overlap the secret")
    bindings = _bindings(raw, where, warnings)
    return Credential(name=name, placeholder=placeholder, bindings=bindings, secret=secret, source=source)


def _bindings(raw: Mapping[str, Any], where: str, warnings: list[str]) -> tuple[Binding, ...]:
    hosts = raw.get("hosts", [])
    if hosts is None:
        hosts = []
    if not isinstance(hosts, list):
        raise CredentialsError(f"{where}.hosts: expected a list")
    bindings = tuple(_binding(h, f"{where}.hosts[{i}]") for i, h in enumerate(hosts))
    if not bindings:
        warnings.append(f"{where}: no hosts: the credential is bound to no endpoint and is never injected")
    return bindings


def _secret_value(raw: Mapping[str, Any], key: str, where: str, environ: Mapping[str, str],
                  warnings: list[str], *, required: bool) -> tuple[bool, str | None]:  # fmt: skip
    """``(present, value)`` of ``key`` or ``key_env`` (rules 1 and 5); ``value`` None when its variable is unset."""
    if key in raw and f"{key}_env" in raw:
        raise CredentialsError(f"{where}: {key} and {key}_env are mutually exclusive")
    if key not in raw and f"{key}_env" not in raw:
        if required:
            raise CredentialsError(f"{where}: missing {key} (or {key}_env)")
        return False, None
    if key in raw:
        value = raw[key]
        if not isinstance(value, str):
            raise CredentialsError(f"{where}.{key}: expected a string")
    else:
        var = raw[f"{key}_env"]
        if not isinstance(var, str) or not _NAME.fullmatch(var):
            raise CredentialsError(f"{where}.{key}_env: expected an environment variable name")
        value = environ.get(var)
        if value is None:
            warnings.append(f"{where}: {var} is not set in control's environment; the credential is unavailable")
            return True, None
    if not _SECRET.fullmatch(value) or MARKER in value.lower() or ALIAS_MARKER.lower() in value.lower():
        raise CredentialsError(f"{where}.{key}: must be printable ASCII without surrounding whitespace "
                               "or placeholder markers")  # fmt: skip
    return True, value


def _key_pair(name: str, raw: Mapping[str, Any], where: str, environ: Mapping[str, str],
              warnings: list[str]) -> Credential:  # fmt: skip
    """Rule 7."""
    unknown = set(raw) - _PAIR_KEYS
    if unknown:
        raise CredentialsError(f"{where}: unknown keys {sorted(unknown)} (an access key pair takes "
                               f"{', '.join(sorted(_PAIR_KEYS))})")  # fmt: skip
    _, key_id = _secret_value(raw, "access_key_id", where, environ, warnings, required=True)
    _, secret = _secret_value(raw, "secret_access_key", where, environ, warnings, required=True)
    has_token, token = _secret_value(raw, "session_token", where, environ, warnings, required=False)
    pair = KeyPair(
        id_placeholder=f"{MARKER}{name}_ACCESS_KEY_ID",
        token_placeholder=f"{MARKER}{name}_SESSION_TOKEN" if has_token else None,
        access_key_id=key_id,
        session_token=token,
    )
    values = [v for v in (key_id, secret, token) if v]
    placeholders = [pair.id_placeholder, f"{MARKER}{name}_SECRET_ACCESS_KEY", pair.token_placeholder or ""]
    if any(p and (p in v or v in p) for v in values for p in placeholders):
        raise CredentialsError(f"{where}: a value overlaps a placeholder")
    return Credential(name=name, placeholder=f"{MARKER}{name}_SECRET_ACCESS_KEY",
                      bindings=_bindings(raw, where, warnings), secret=secret, source="key-pair",
                      key_pair=pair)  # fmt: skip


class Credentials:
    """The credential table; immutable once loaded. ``repr`` lists names only."""

    def __init__(self, credentials: tuple[Credential, ...] = (), *, warnings: tuple[str, ...] = ()) -> None:
        self._by_name = {c.name: c for c in credentials}
        self._by_placeholder = {p: c for c in credentials for p in c.env().values()}
        if len(self._by_placeholder) != sum(len(c.env()) for c in credentials):
            raise CredentialsError("two credentials share a placeholder")
        self._env = {var: p for c in credentials for var, p in c.env().items()}
        if len(self._env) != sum(len(c.env()) for c in credentials):
            raise CredentialsError("two credentials give the agent the same environment variable")
        self.warnings = warnings
        custom = sorted((re.escape(p) for p in self._by_placeholder if not p.startswith(MARKER)), key=len,
                        reverse=True)  # fmt: skip
        self._token = re.compile("|".join([*custom, _GENERIC]))
        self._custom = tuple(p for p in self._by_placeholder if not p.startswith(MARKER))

    def __repr__(self) -> str:
        return f"Credentials({sorted(self._by_name)})"

    def __len__(self) -> int:
        return len(self._by_name)

    def __iter__(self) -> Iterator[Credential]:
        return iter(self._by_name.values())

    @classmethod
    def empty(cls) -> Credentials:
        return cls()

    @classmethod
    def from_mapping(cls, data: Any, *, source: str = "<credentials>",
                     environ: Mapping[str, str] | None = None) -> Credentials:  # fmt: skip
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise CredentialsError(f"{source}: expected a mapping of NAME -> {{secret | secret_env, hosts}}")
        env = os.environ if environ is None else environ
        warnings: list[str] = []
        creds = tuple(_credential(name, raw, f"{source}: {name}", env, warnings) for name, raw in data.items())
        variables = [var for c in creds for var in c.env()]
        if len(set(variables)) != len(variables):
            raise CredentialsError(f"{source}: two credentials give the agent the same environment variable")
        placeholders = [p for c in creds for p in c.env().values()]
        for i, a in enumerate(placeholders):
            for b in placeholders[i + 1 :]:
                if a in b or b in a:
                    raise CredentialsError(f"{source}: placeholders {a!r} and {b!r} overlap")
        return cls(creds, warnings=tuple(warnings))

    @classmethod
    def load(cls, path: Path | None, *, environ: Mapping[str, str] | None = None) -> Credentials:
        """Read the credentials file (YAML or JSON); ``None`` means no credentials at all."""
        if path is None:
            return cls()
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CredentialsError(f"{path}: cannot read: {exc.__class__.__name__}") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            raise CredentialsError(f"{path}: not valid YAML/JSON{where}") from None  # never echo the text
        return cls.from_mapping(data, source=str(path), environ=environ)

    # --- what the boundary gets ------------------------------------------------------------------------------
    def placeholders(self) -> dict[str, str]:
        """Environment variable name -> placeholder, for ``attach`` (rule 1: no secret in here)."""
        return dict(sorted(self._env.items()))

    def injects_at(self, host: str, port: int) -> bool:
        """Whether some available credential is bound to ``host:port`` (on some path): such a connection needs
        inspection even when its endpoint has no L7 rules (§3.7 passthrough-with-credentials)."""
        host = normalize_request_host(host) or host
        return any(c.available and any(b.matches_endpoint(host, port) for b in c.bindings) for c in self)

    def secrets_at(self, host: str, port: int) -> list[tuple[str, str]]:
        """``(secret, placeholder)`` of every available credential bound to ``host:port`` (on some path): what
        a response from there must never carry back to the agent (``l7.scrub``)."""
        host = normalize_request_host(host) or host
        return [pair for c in self if any(b.matches_endpoint(host, port) for b in c.bindings)
                for pair in c.secret_pairs()]  # fmt: skip

    # --- resolution ---------------------------------------------------------------------------------------------
    def tokens(self, text: str) -> Iterator[re.Match[str]]:
        """Every placeholder-shaped token in ``text``: issued placeholders and any marker spelling."""
        return self._token.finditer(text)

    def has_marker(self, text: str) -> bool:
        """Whether ``text`` holds anything placeholder-shaped (raw or percent-encoded): the fail-closed scan."""
        if self._token.search(text) is not None:
            return True
        lowered = text.lower()
        if "%" in text and ("openshell%3aresolve%3aenv%3a" in lowered or "openshell-resolve-env-" in lowered):
            return True
        return MARKER in lowered or ALIAS_MARKER.lower() in lowered

    def resolve(self, token: str, host: str, port: int, path: str) -> tuple[Resolution, Credential | None]:
        """What ``token`` (one match of :meth:`tokens`) becomes at ``host:port`` + ``path`` (normalised host,
        canonical query-less path). Only the placeholder actually issued resolves (§3.13): a hand-written
        canonical or alias spelling of a bound key does not."""
        cred = self._by_placeholder.get(token)
        if cred is None:
            return Resolution.UNAVAILABLE, self._named(token)
        host = normalize_request_host(host) or host
        if not cred.bound_to(host, port, path):
            return Resolution.ENDPOINT_MISMATCH, cred
        if cred.secret is None or cred.key_pair is not None:  # a key pair only signs (rule 7)
            return Resolution.UNAVAILABLE, cred
        return Resolution.RESOLVED, cred

    def key_pair_for(self, key_id: str, host: str, port: int, path: str) -> tuple[Resolution, Credential | None]:
        """The key pair whose key-id placeholder the agent signed with, for a request to ``host:port`` + ``path``
        (rule 7): ``ENDPOINT_MISMATCH`` when no pair of that id is bound there (the agent chose another
        credential, or none of ours), ``UNAVAILABLE`` when its values are not set."""
        cred = self._by_placeholder.get(key_id)
        if cred is None or cred.key_pair is None or cred.key_pair.id_placeholder != key_id:
            return Resolution.ENDPOINT_MISMATCH, None
        if not cred.bound_to(normalize_request_host(host) or host, port, path):
            return Resolution.ENDPOINT_MISMATCH, cred
        return (Resolution.RESOLVED if cred.available else Resolution.UNAVAILABLE), cred

    def _named(self, token: str) -> Credential | None:
        """The credential a non-issued spelling refers to, if any (for the refusal's wording only)."""
        if token.startswith(MARKER):
            return self._by_name.get(token[len(MARKER) :])
        if ALIAS_MARKER in token:
            return self._by_name.get(token.split(ALIAS_MARKER, 1)[1])
        return None
