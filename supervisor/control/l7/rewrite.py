"""Placeholders in, secrets out: the credential rewrite of one admitted request (docs/reference/policy.md §3.13), pure.

Rules:

1. Policy and logs see the *redacted* request: every placeholder-shaped token becomes ``[CREDENTIAL]``
   (:func:`redact_path`, :func:`redact_query`).
2. :func:`rewrite_request` runs only after the request was admitted, and resolves every token against the
   request's own endpoint (normalised host, port, canonical query-less path, redacted). Any token bound
   elsewhere refuses the whole request with ``403 credential_endpoint_mismatch``; an unknown spelling or a
   credential without a secret with ``500 credential_unavailable``, and so is an access key pair's placeholder
   (a pair only signs: ``signing``). Nothing is partially rewritten: a refusal
   happens before a byte goes upstream, so the secret never leaves.
3. Where tokens are replaced: header values (anywhere in the value, and inside ``Basic base64(user:pass)``,
   decoded, substituted, re-encoded), path segments (the secret percent-encoded; a secret holding ``/``,
   ``\\``, ``?``, ``#`` or ``..`` is refused there) and query values (decoded, substituted, re-encoded).
   Query names and bodies are not rewritten.
4. Fail closed: after the rewrite, a marker still present anywhere in the outgoing head (raw, percent-encoded,
   or inside a Basic value) refuses the request with ``credential_unavailable``. With no credentials at all,
   any marker is refused the same way.
5. A request without an authority (HTTP/1.0 without ``Host``) resolves nothing: any marker refuses it.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from supervisor.control.credentials import Credential, Credentials, Resolution
from supervisor.protocol.responses import ErrorCode

__all__ = ["REDACTED", "CredentialRefusal", "Rewritten", "redact_path", "redact_query", "rewrite_request"]

REDACTED = "[CREDENTIAL]"
_BASIC = re.compile(r"([Bb][Aa][Ss][Ii][Cc])([ \t]+)([A-Za-z0-9+/=]+)")
_PATH_LITERAL = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:@")
_QUERY_LITERAL = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_HEX = frozenset("0123456789abcdefABCDEF")


class CredentialRefusal(Exception):
    """Rule 2/4/5: refuse the request; ``detail`` names credentials, never their values."""

    def __init__(self, resolution: Resolution, detail: str, names: Sequence[str] = ()) -> None:
        super().__init__(detail)
        self.resolution = resolution
        self.detail = detail
        self.names = tuple(names)

    @property
    def status(self) -> int:
        return self.code.status

    @property
    def logged_detail(self) -> str:
        """``detail`` for the event: the credentials' names are the agent's variables, and §4.1 keeps them out of
        the log (the agent's own answer may name them: it set them)."""
        text = self.detail
        for name in sorted(self.names, key=len, reverse=True):
            text = text.replace(name, REDACTED)
        return text

    @property
    def code(self) -> ErrorCode:
        if self.resolution is Resolution.ENDPOINT_MISMATCH:
            return ErrorCode.CREDENTIAL_ENDPOINT_MISMATCH
        return ErrorCode.CREDENTIAL_UNAVAILABLE


@dataclass(frozen=True)
class Rewritten:
    target: str  # origin-form: canonical path (secrets percent-encoded) + query
    headers: list[tuple[str, str]]
    used: tuple[str, ...]  # names of the credentials injected (for the event; never values)


# --- query helpers -------------------------------------------------------------------------------------------


def _decode_query_value(text: str) -> str | None:
    raw = text.replace("+", " ")
    out = bytearray()
    i = 0
    while i < len(raw):
        if raw[i] == "%":
            pair = raw[i + 1 : i + 3]
            if len(pair) != 2 or pair[0] not in _HEX or pair[1] not in _HEX:
                return None
            out.append(int(pair, 16))
            i += 3
        else:
            out += raw[i].encode("utf-8")
            i += 1
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _encode_query_value(text: str) -> str:
    return "".join(c if c in _QUERY_LITERAL else "".join(f"%{b:02X}" for b in c.encode("utf-8")) for c in text)


def _map_query_values(query: str, fn: Callable[[str], str]) -> str:
    """Apply ``fn`` to each decoded value; a value ``fn`` leaves unchanged keeps its original spelling."""
    pairs = []
    for pair in query.split("&"):
        name, eq, value = pair.partition("=")
        decoded = _decode_query_value(value) if eq else None
        if decoded is not None:
            changed = fn(decoded)
            if changed != decoded:
                value = _encode_query_value(changed)
        pairs.append(f"{name}{eq}{value}")
    return "&".join(pairs)


# --- redaction (rule 1) --------------------------------------------------------------------------------------


def redact_path(creds: Credentials, path: str) -> str:
    return "".join(_pieces(creds, path, lambda _m: REDACTED))


def redact_query(creds: Credentials, query: str | None) -> str | None:
    if query is None:
        return None
    return _map_query_values(query, lambda v: redact_path(creds, v))


def _pieces(creds: Credentials, text: str, replace: Callable[[re.Match[str]], str]) -> list[str]:
    out: list[str] = []
    last = 0
    for match in creds.tokens(text):
        out += [text[last : match.start()], replace(match)]
        last = match.end()
    out.append(text[last:])
    return out


# --- the rewrite (rules 2-5) ---------------------------------------------------------------------------------


def _basic_decoded(value: str) -> tuple[re.Match[str], str] | None:
    match = _BASIC.fullmatch(value)
    if match is None:
        return None
    try:
        decoded = base64.b64decode(match.group(3), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return match, decoded


class _Resolver:
    def __init__(self, creds: Credentials, host: str, port: int, path: str, enabled: bool) -> None:
        self.creds, self.host, self.port, self.path, self.enabled = creds, host, port, path, enabled
        self.mismatched: dict[str, None] = {}
        self.unbound: dict[str, None] = {}  # credentials bound to no endpoint at all: never injected
        self.no_host = False  # a placeholder in a request without Host (HTTP/1.0): no authority, no credential
        self.unavailable: dict[str, None] = {}
        self.signing_only: dict[str, None] = {}  # an access key pair: control signs with it, never places it
        self.used: dict[str, None] = {}
        self.secrets: dict[str, str] = {}

    def check(self, text: str) -> None:
        for match in self.creds.tokens(text):
            self._check_token(match.group(0))

    def checked(self, text: str) -> str:
        self.check(text)
        return text

    def _check_token(self, token: str) -> None:
        if not self.enabled:
            self.no_host = True
            return
        resolution, cred = self.creds.resolve(token, self.host, self.port, self.path)
        name = cred.name if cred is not None else "an unknown placeholder"
        if resolution is Resolution.ENDPOINT_MISMATCH and cred is not None and not cred.bindings:
            self.unbound[name] = None
        elif resolution is Resolution.ENDPOINT_MISMATCH:
            self.mismatched[name] = None
        elif cred is not None and cred.key_pair is not None:
            self.signing_only[name] = None
        elif resolution is Resolution.UNAVAILABLE or cred is None:
            self.unavailable[name] = None
        else:
            self._remember(token, cred)

    def _remember(self, token: str, cred: Credential) -> None:
        assert cred.secret is not None
        self.used[cred.name] = None
        self.secrets[token] = cred.secret

    def substitute(self, text: str, encode: Callable[[str], str] = str) -> str:
        return "".join(_pieces(self.creds, text, lambda m: encode(self.secrets[m.group(0)])))


def _path_secret(secret: str) -> str:
    if any(bad in secret for bad in ("/", "\\", "?", "#", "..")):
        raise CredentialRefusal(Resolution.UNAVAILABLE, "this credential cannot be placed in a URL path")
    return "".join(c if c in _PATH_LITERAL else f"%{ord(c):02X}" for c in secret)


def rewrite_request(
    creds: Credentials,
    *,
    host: str,
    port: int,
    path: str,
    query: str | None,
    headers: Sequence[tuple[str, str]],
    credentials_enabled: bool = True,
) -> Rewritten:
    """Resolve and substitute every placeholder of an admitted request, or raise :class:`CredentialRefusal`.

    ``host`` normalised, ``path`` canonical (with its placeholders, as the agent wrote them), ``query`` verbatim.
    """
    resolver = _Resolver(creds, host, port, redact_path(creds, path), credentials_enabled)
    resolver.check(path)
    if query is not None:
        _map_query_values(query, resolver.checked)
    for _name, value in headers:
        resolver.check(value)
        basic = _basic_decoded(value)
        if basic is not None:
            resolver.check(basic[1])
    if resolver.no_host:
        raise CredentialRefusal(
            Resolution.ENDPOINT_MISMATCH,
            "a request without a Host header gets no credentials: send Host naming the endpoint",
        )
    if resolver.mismatched:
        names = list(resolver.mismatched)
        raise CredentialRefusal(
            Resolution.ENDPOINT_MISMATCH,
            f"credential {', '.join(names)} is not authorized for {host}:{port}; it is bound to other endpoints",
            names,
        )
    if resolver.unbound:
        names = list(resolver.unbound)
        raise CredentialRefusal(
            Resolution.ENDPOINT_MISMATCH,
            f"credential {', '.join(names)} is bound to no endpoint, so it is never injected: ask the sandbox "
            "operator to bind it to the hosts it is meant for",
            names,
        )
    if resolver.signing_only:
        names = list(resolver.signing_only)
        raise CredentialRefusal(
            Resolution.UNAVAILABLE,
            f"credential {', '.join(names)} is an access key pair: control signs requests with it on endpoints with "
            "credential_signing and never places it in a request",
            names,
        )
    if resolver.unavailable:
        names = list(resolver.unavailable)
        raise CredentialRefusal(Resolution.UNAVAILABLE, f"placeholder could not be resolved: {', '.join(names)}", names)

    new_path = resolver.substitute(path, _path_secret)
    new_query = None if query is None else _map_query_values(query, resolver.substitute)
    new_headers: list[tuple[str, str]] = []
    for name, value in headers:
        basic = _basic_decoded(value)
        if basic is not None and next(creds.tokens(basic[1]), None) is not None:
            match, decoded = basic
            encoded = base64.b64encode(resolver.substitute(decoded).encode("utf-8")).decode("ascii")
            new_headers.append((name, f"{match.group(1)}{match.group(2)}{encoded}"))
        else:
            new_headers.append((name, resolver.substitute(value)))
    target = new_path if new_query is None else f"{new_path}?{new_query}"

    leftovers = [target, *(n for n, _ in new_headers), *(v for _, v in new_headers)]
    leftovers += [b[1] for b in map(_basic_decoded, (v for _, v in new_headers)) if b is not None]
    if any(creds.has_marker(text) for text in leftovers):
        raise CredentialRefusal(
            Resolution.UNAVAILABLE,
            "a credential placeholder is in a place control does not substitute (query names, header names, "
            "or a mangled spelling)",
        )
    return Rewritten(target, new_headers, tuple(resolver.used))
