"""Request-target canonicalisation and query parsing for L7 decisions (docs/reference/policy.md §3.8.3, §3.8.4).

The canonical path is what policy sees *and what control sends upstream* (§5 bug 21: a parser differential
between the policy check and the upstream request is a bypass). Rules, in order:

1. Refuse spaces, bytes below 0x20, 0x7F and above 0x7F (non-ASCII must be percent-encoded) and any ``#``.
2. Split at the first ``?``; the query is kept verbatim.
3. Absolute-form (``scheme://authority/path``) contributes only its path; an origin-form path that merely
   contains ``://`` is not absolute-form.
4. Empty means ``/``; otherwise the path must start with ``/`` and be at most 4096 bytes.
5. Percent-decode each ``/``-separated segment: a malformed escape, a decoded control byte or 0x7F is refused;
   a decoded ``/`` is refused unless ``allow_encoded_slash``, in which case it stays inside its segment.
6. Strip ``;params`` from every segment *before* dot handling, so ``..;x`` is ``..`` (§5 bug 22).
7. Resolve dot segments (RFC 3986 §5.2.4): ``.`` goes, ``..`` pops, popping past the root is refused (no
   clamping), a trailing ``.``/``..`` leaves a trailing ``/``, empty segments collapse except a trailing one.
8. A ``.``/``..`` still hidden inside a segment (behind an allowed ``%2F``) is refused.
9. Re-encode: unreserved, sub-delims, ``:`` and ``@`` literal, everything else ``%XX`` in upper case.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_PATH = 4096
_ABSOLUTE = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
_LITERAL = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:@")
_HEX = frozenset(b"0123456789abcdefABCDEF")


class TargetError(ValueError):
    """The request target cannot be canonicalised; the request is refused before any policy rule."""


@dataclass(frozen=True, slots=True)
class CanonicalTarget:
    path: str
    query: str | None  # verbatim, without '?'; None when the target had no '?'

    @property
    def target(self) -> str:
        return self.path if self.query is None else f"{self.path}?{self.query}"


def _decode_segment(segment: str, allow_encoded_slash: bool) -> bytes:
    raw = segment.encode("ascii")
    if b"%" not in raw:
        return raw
    out = bytearray()
    i = 0
    while i < len(raw):
        byte = raw[i]
        if byte != 0x25:  # '%'
            out.append(byte)
            i += 1
            continue
        hexpair = raw[i + 1 : i + 3]
        if len(hexpair) != 2 or hexpair[0] not in _HEX or hexpair[1] not in _HEX:
            raise TargetError("malformed percent-encoding in path")
        value = int(hexpair, 16)
        if value < 0x20 or value == 0x7F:
            raise TargetError("percent-encoded control character in path")
        if value == 0x2F and not allow_encoded_slash:
            raise TargetError("encoded slash (%2F) in path; the endpoint does not set allow_encoded_slash")
        out.append(value)
        i += 3
    return bytes(out)


def _encode_segment(segment: bytes) -> str:
    return "".join(chr(b) if b in _LITERAL else f"%{b:02X}" for b in segment)


def canonicalize_target(raw: str, *, allow_encoded_slash: bool = False) -> CanonicalTarget:
    for char in raw:
        code = ord(char)
        if code <= 0x20 or code >= 0x7F:
            raise TargetError("request target contains a space, control or non-ASCII character")
    if "#" in raw:
        raise TargetError("request target contains a fragment ('#')")
    path, sep, query = raw.partition("?")
    if _ABSOLUTE.match(path):
        after = path.split("://", 1)[1]
        slash = after.find("/")
        path = "/" if slash < 0 else after[slash:]
    if path == "":
        path = "/"
    if not path.startswith("/"):
        raise TargetError("request path must start with '/'")
    if len(path) > MAX_PATH:
        raise TargetError(f"request path is longer than {MAX_PATH} bytes")

    stack: list[bytes] = []
    segments = path.split("/")[1:]
    trailing = False
    for position, segment in enumerate(segments):
        last = position == len(segments) - 1
        decoded = _decode_segment(segment, allow_encoded_slash).split(b";", 1)[0]
        if decoded in (b"", b"."):
            trailing = last
            continue
        if decoded == b"..":
            if not stack:
                raise TargetError("path climbs above the root ('..')")
            stack.pop()
            trailing = last
            continue
        if b"/" in decoded and any(part in (b".", b"..") for part in decoded.split(b"/")):
            raise TargetError("dot segment hidden behind an encoded slash")
        stack.append(decoded)
        trailing = False
    canonical = "/" + "/".join(_encode_segment(s) for s in stack)
    if trailing and stack:
        canonical += "/"
    return CanonicalTarget(canonical, query if sep else None)


def _decode_query_part(text: str) -> str:
    raw = text.replace("+", " ").encode("ascii", "surrogateescape")
    out = bytearray()
    i = 0
    while i < len(raw):
        if raw[i] == 0x25:
            hexpair = raw[i + 1 : i + 3]
            if len(hexpair) != 2 or hexpair[0] not in _HEX or hexpair[1] not in _HEX:
                raise TargetError("malformed percent-encoding in query")
            out.append(int(hexpair, 16))
            i += 3
        else:
            out.append(raw[i])
            i += 1
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TargetError("query parameter is not valid UTF-8") from exc


def parse_query(query: str | None) -> dict[str, list[str]]:
    """Multimap of decoded names to decoded values, in order (``+`` is a space, §5 bug 23)."""
    params: dict[str, list[str]] = {}
    if not query:
        return params
    for pair in query.split("&"):
        if not pair:
            continue
        name, _, value = pair.partition("=")
        params.setdefault(_decode_query_part(name), []).append(_decode_query_part(value))
    return params
