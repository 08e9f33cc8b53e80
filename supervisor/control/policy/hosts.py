"""Host names as policy sees them: one normalisation for requests and for policy hosts (docs/design.md "Decision").

Rules:

1. A request host is lower-cased, loses one trailing dot (docs/design.md settles spec D5 this way), has Unicode
   labels converted to IDNA A-labels, and an IPv6 literal loses its brackets and is written in compressed form.
   Anything else that is not a plain DNS name (empty labels, control bytes, NUL, spaces, ``%``, ``/``, ports)
   is refused: ``normalize_request_host`` returns ``None`` and the decision is a denial.
2. Policy hosts go through the same normalisation, so ``API.Example.COM.`` in a file and ``api.example.com``
   on the wire are the same key. Numeric spellings such as ``2130706433`` or ``0x7f.1`` are not interpreted
   here; the SSRF destination classifier owns them.
3. Host globs (§2.1) are validated by shape: ``**`` only as the whole first label (V10), ``*`` in a later label
   only as the whole label (V11), never ``*``/``**`` alone (V8) nor on a TLD (V9).
"""

from __future__ import annotations

import ipaddress
import re

_NAME = re.compile(r"[a-z0-9_-]{1,63}(?:\.[a-z0-9_-]{1,63})*")
_LABEL = re.compile(r"[a-z0-9_-]{1,63}")
_GLOB_FIRST_LABEL = re.compile(r"[a-z0-9_\-*?\[\]!^]+")
_MAX_NAME = 253


def _ipv6(text: str) -> str | None:
    if "%" in text:
        return None  # zone ids are meaningless off-host
    try:
        return str(ipaddress.IPv6Address(text))
    except ValueError:
        return None


def _idna(host: str) -> str | None:
    labels: list[str] = []
    for label in host.split("."):
        if label.isascii():
            labels.append(label)
            continue
        try:
            labels.append(label.encode("idna").decode("ascii"))
        except UnicodeError:
            return None
    return ".".join(labels).lower()


def normalize_request_host(host: str) -> str | None:
    """The canonical form used for matching, or ``None`` when ``host`` is not a valid host."""
    if ":" in host or host.startswith("["):
        inner = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        return _ipv6(inner)
    if host.endswith("."):
        host = host[:-1]
    if not host.isascii():
        converted = _idna(host)
        if converted is None:
            return None
        host = converted
    host = host.lower()
    if len(host) > _MAX_NAME or _NAME.fullmatch(host) is None:
        return None
    return host


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def validate_policy_host(raw: str, *, tcp: bool) -> tuple[str, str | None]:
    """Normalise a policy ``host``; returns (normalised, error or None). Globs keep their wildcard characters."""
    if raw != raw.strip() or any(c.isspace() for c in raw):
        return raw, "host must not contain whitespace"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in raw):
        return raw, "host must not contain control characters"
    if "/" in raw or "@" in raw:
        return raw, "host must be a DNS name, an IP address or a host glob, not a URL"
    if tcp and raw.endswith("."):
        return raw, "invalid DNS host selector: trailing dot (protocol tcp)"
    if "*" not in raw:
        if ":" in raw or raw.startswith("["):
            inner = raw[1:-1] if raw.startswith("[") and raw.endswith("]") else raw
            if _ipv6(inner) is None:
                if re.fullmatch(r"[^:]+:\d+", raw):
                    return raw, "host must not include a port; use port or ports"
                return raw, "host is not a valid IPv6 literal"
        if tcp and is_ip_literal(raw.strip("[]")):
            return raw, "protocol tcp must use a DNS hostname, not an IP literal"
        norm = normalize_request_host(raw)
        if norm is None:
            return raw, "invalid host name"
        return norm, None
    return _validate_host_glob(raw)


def _validate_host_glob(raw: str) -> tuple[str, str | None]:
    host = raw[:-1] if raw.endswith(".") else raw
    host = host.lower()
    if host in ("*", "**"):
        return host, f"host {raw!r} matches all hosts"
    labels = host.split(".")
    if any(label == "" for label in labels):
        return host, "host glob has an empty label"
    if len(labels) <= 2:
        return host, f"TLD wildcard {raw!r} is not allowed (a host glob needs three or more labels: *.example.com)"
    for index, label in enumerate(labels):
        if "**" in label and (index != 0 or label != "**"):
            return host, "recursive host wildcard '**' is only allowed as the entire first DNS label"
        if index == 0:
            if not label.isascii() or _GLOB_FIRST_LABEL.fullmatch(label) is None:
                return host, f"invalid characters in host glob label {label!r}"
            if label.count("[") != label.count("]"):
                return host, f"unbalanced '[' in host glob label {label!r}"
            continue
        if "*" in label and label != "*":
            return host, "middle DNS label wildcard must be the entire label '*'"
        if label != "*" and _LABEL.fullmatch(label) is None:
            return host, f"invalid host label {label!r}"
    if all(label in ("*", "**") for label in labels[:-1]):
        return host, f"TLD wildcard {raw!r} is not allowed"
    return host, None
