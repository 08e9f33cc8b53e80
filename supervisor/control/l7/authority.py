"""Authority binding: every request inside a tunnel must name the tunnel's own host:port
(docs/reference/policy.md §3.9).

Why: the policy decision, the upstream connection and the credentials bound to an endpoint are all chosen
from the CONNECT authority. A request inside that tunnel whose ``Host`` (or absolute URI) names another host
— domain fronting — would be judged as one host while being meant for another, and a credential bound to the
tunnel's host could be sent on a request the agent addressed elsewhere. So:

1. The request's authority is the absolute-form target's authority (default port by its scheme: ``http`` 80,
   ``https`` 443) when the target is absolute, else the ``Host`` header, whose default port is the transport's
   (443 after TLS termination, 80 in plaintext).
2. An absolute-form target and the ``Host`` header must agree (host case-insensitively, ports after the
   scheme default) — a disagreement is a malformed request (§3.8.1), as is an authority that does not parse
   or any other scheme.
3. Hosts are compared after :func:`normalize_request_host` (case, one trailing dot, brackets, IDNA); ports
   exactly. A mismatch is ``403 request_authority_mismatch`` and the tunnel closes.
4. HTTP/1.0 without ``Host`` has no authority: it is allowed, but no credential is resolved for it.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from supervisor.control.policy import normalize_request_host
from supervisor.protocol.egress import EgressHeaderError, parse_authority

__all__ = ["AuthorityError", "AuthoritySource", "RequestAuthority", "request_authority", "same_authority"]

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://")
_SCHEME_PORTS = {"http": 80, "https": 443}


class AuthorityError(ValueError):
    """The request's authority is malformed or self-contradictory: close without a response (§3.8.1)."""


class AuthoritySource(enum.StrEnum):
    ABSOLUTE = "absolute-uri"
    HOST = "host-header"
    NONE = "none"  # HTTP/1.0 without Host


@dataclass(frozen=True)
class RequestAuthority:
    host: str  # normalised; "" when source is NONE
    port: int
    source: AuthoritySource


def _parse(text: str, default_port: int) -> tuple[str, int]:
    try:
        host, port = parse_authority(text, default_port=default_port)
    except EgressHeaderError as exc:
        raise AuthorityError(f"authority does not parse: {exc}") from None
    norm = normalize_request_host(host)
    if norm is None:
        raise AuthorityError("authority names an invalid host")
    return norm, port


def request_authority(target: str, host_header: str | None, *, tls: bool) -> RequestAuthority:
    """Rules 1, 2 and 4: the authority a request names, or :class:`AuthorityError`."""
    scheme = _SCHEME.match(target)
    host_part: tuple[str, int] | None = None
    if scheme is not None:
        name = scheme.group(1).lower()
        if name not in _SCHEME_PORTS:
            raise AuthorityError(f"absolute-form target with scheme {name!r}")
        rest = target[scheme.end() :]
        cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
        absolute = _parse(rest[:cut], _SCHEME_PORTS[name])
        if host_header is not None:
            host_part = _parse(host_header, _SCHEME_PORTS[name])
            if host_part != absolute:
                raise AuthorityError("absolute-form target and Host header name different authorities")
        return RequestAuthority(absolute[0], absolute[1], AuthoritySource.ABSOLUTE)
    if host_header is None:
        return RequestAuthority("", 0, AuthoritySource.NONE)
    host, port = _parse(host_header, 443 if tls else 80)
    return RequestAuthority(host, port, AuthoritySource.HOST)


def same_authority(authority: RequestAuthority, tunnel_host: str, tunnel_port: int) -> bool:
    """Rule 3. ``tunnel_host`` may be given as the client spelled it; it is normalised here."""
    if authority.source is AuthoritySource.NONE:
        return True
    return authority.host == normalize_request_host(tunnel_host) and authority.port == tunnel_port
