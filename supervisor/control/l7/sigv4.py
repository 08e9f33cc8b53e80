"""AWS Signature Version 4 for requests control re-signs with a key the agent never holds; pure, no I/O.

Rules (the AWS SigV4 specification; tested against the AWS test suite in tests/unit/aws4_testsuite):

1. Canonical URI: S3 (``normalize=False``) signs the path exactly as sent; every other service signs it with dot
   segments resolved and empty segments collapsed, then URI-encoded again (``%`` becomes ``%25``).
2. Canonical query: each name and value percent-decoded then encoded with only the unreserved characters
   literal, pairs sorted by name then value. ``+`` is a literal plus, as AWS reads it.
3. Canonical headers: lower-case names, values trimmed with inner runs of whitespace made one space, repeated
   headers joined with ``,`` in the order sent, sorted by name; ``SignedHeaders`` names them in that order.
4. The key is derived per date, region and service (``AWS4`` + secret, then HMAC-SHA256 down the scope) and never
   leaves this module's callers in any form but the signature.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "ALGORITHM",
    "EMPTY_SHA256",
    "Signed",
    "authorization_key_id",
    "canonical_query",
    "canonical_request",
    "canonical_uri",
    "sign",
    "signature",
    "string_to_sign",
]

ALGORITHM = "AWS4-HMAC-SHA256"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.~")
_HEX = frozenset("0123456789abcdefABCDEF")
_SPACES = re.compile(r"\s+")
_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")


def _encode(data: bytes, *, keep_slash: bool = False) -> str:
    return "".join(chr(b) if b in _UNRESERVED or (keep_slash and b == 0x2F) else f"%{b:02X}" for b in data)


def _decode(text: str) -> bytes:
    """Percent-decode; a ``%`` not followed by two hex digits stays a literal ``%``."""
    out = bytearray()
    i = 0
    raw = text.encode("utf-8")
    while i < len(raw):
        if raw[i] == 0x25 and i + 2 < len(raw) and all(chr(c) in _HEX for c in raw[i + 1 : i + 3]):
            out.append(int(raw[i + 1 : i + 3], 16))
            i += 3
        else:
            out.append(raw[i])
            i += 1
    return bytes(out)


def _remove_dot_segments(path: str) -> str:
    out: list[str] = []
    for segment in path.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if out:
                out.pop()
            continue
        out.append(segment)
    trailing = "/" if path.endswith(("/", "/.", "/..")) and out else ""
    return "/" + "/".join(out) + trailing


def canonical_uri(path: str, *, normalize: bool) -> str:
    """Rule 1. ``path`` is the request target's path as it goes on the wire (percent-encoded)."""
    if not path:
        return "/"
    if not normalize:
        return path
    return _encode(_remove_dot_segments(path).encode("utf-8"), keep_slash=True)


def canonical_query(query: str | None) -> str:
    """Rule 2."""
    if not query:
        return ""
    pairs = []
    for item in query.split("&"):
        if not item:
            continue
        name, _eq, value = item.partition("=")
        pairs.append((_encode(_decode(name)), _encode(_decode(value))))
    return "&".join(f"{n}={v}" for n, v in sorted(pairs))


def _canonical_headers(headers: Sequence[tuple[str, str]], signed: Sequence[str]) -> tuple[str, str]:
    values: dict[str, list[str]] = {}
    for name, value in headers:
        values.setdefault(name.lower(), []).append(_SPACES.sub(" ", value.strip()))
    names = sorted({n.lower() for n in signed})
    missing = [n for n in names if n not in values]
    if missing:
        raise ValueError(f"signed headers not in the request: {', '.join(missing)}")
    lines = "".join(f"{n}:{','.join(values[n])}\n" for n in names)
    return lines, ";".join(names)


def canonical_request(method: str, path: str, query: str | None, headers: Sequence[tuple[str, str]],
                      signed: Sequence[str], payload_hash: str, *, normalize: bool = True) -> str:  # fmt: skip
    lines, names = _canonical_headers(headers, signed)
    return "\n".join([method.upper(), canonical_uri(path, normalize=normalize), canonical_query(query), lines, names,
                      payload_hash])  # fmt: skip


def string_to_sign(amz_date: str, scope: str, creq: str) -> str:
    return "\n".join([ALGORITHM, amz_date, scope, hashlib.sha256(creq.encode("utf-8")).hexdigest()])


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()


def signature(secret_key: str, date: str, region: str, service: str, sts: str) -> str:
    """Rule 4: ``date`` is ``YYYYMMDD``."""
    key = _hmac(("AWS4" + secret_key).encode("utf-8"), date)
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    return hmac.new(key, sts.encode("utf-8"), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Signed:
    authorization: str  # the Authorization header value
    canonical_request: str
    string_to_sign: str


def sign(*, method: str, path: str, query: str | None, headers: Sequence[tuple[str, str]], signed: Sequence[str],
         payload_hash: str, access_key_id: str, secret_key: str, region: str, service: str, amz_date: str,
         normalize: bool = True) -> Signed:  # fmt: skip
    """Sign a request whose ``headers`` already hold ``x-amz-date`` (``amz_date``, ``YYYYMMDDTHHMMSSZ``) and every
    name in ``signed``."""
    creq = canonical_request(method, path, query, headers, signed, payload_hash, normalize=normalize)
    scope = f"{amz_date[:8]}/{region}/{service}/aws4_request"
    sts = string_to_sign(amz_date, scope, creq)
    names = ";".join(sorted({n.lower() for n in signed}))
    sig = signature(secret_key, amz_date[:8], region, service, sts)
    auth = f"{ALGORITHM} Credential={access_key_id}/{scope}, SignedHeaders={names}, Signature={sig}"
    return Signed(auth, creq, sts)


def authorization_key_id(value: str) -> str | None:
    """The access key id an ``Authorization: AWS4-HMAC-SHA256 Credential=KEY/...`` value names, else ``None``."""
    if not value.strip().startswith(ALGORITHM):
        return None
    match = _CREDENTIAL.search(value)
    return match.group(1) if match else None
