"""Strict validation of one request head inside an inspected connection (docs/reference/policy.md §3.1, §3.8.1, §3.8.2).

h11 parses heads well but is lenient where a proxy must not be: it accepts bare LF line ends, obs-fold
continuation lines, ``Content-Length`` together with ``Transfer-Encoding`` and ``Transfer-Encoding`` on
HTTP/1.0. Each of these is a request-smuggling shape (two parsers disagreeing about where a request ends), so
every head is checked here, on its raw bytes, *before* h11 sees it. Rules:

1. The head is at most :data:`MAX_HEAD_BYTES` and ends at the first CRLFCRLF; line ends are CRLF only (a bare
   LF or a bare CR anywhere in the head is refused as soon as it is seen, not after a timeout).
2. Request line: exactly ``METHOD SP target SP HTTP/1.0|HTTP/1.1``; the method a token; the target visible
   ASCII (no spaces, control bytes, DEL or bytes above it).
3. Header lines: no leading whitespace (obs-fold), ``name:`` with a token name and nothing between name and
   colon; values valid UTF-8 without control bytes other than HTAB.
4. Framing: every ``Content-Length`` a plain decimal, all equal; ``Transfer-Encoding`` only once, exactly
   ``chunked``, never together with ``Content-Length`` and never on HTTP/1.0.
5. ``Host``: at most one; exactly one on HTTP/1.1. ``Connection`` lists tokens and never nominates ``host``,
   ``content-length`` or ``transfer-encoding`` (a hop-by-hop strip of those would change the framing).

A violation raises :class:`HeadError` whose ``problem`` value is the string logged; inside a tunnel the
connection is then closed without a response (§3.8.1).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

__all__ = ["MAX_HEAD_BYTES", "HeadError", "HeadProblem", "RequestHead", "check_head", "find_head_end"]

MAX_HEAD_BYTES = 16 * 1024  # in-tunnel request heads (the proxy's own head limit is 8 KiB)

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_REQUEST_LINE = re.compile(rb"([^ ]+) ([^ ]+) HTTP/(1\.[01])")
_VERSION_LIKE = re.compile(rb"[^ ]+ [^ ]+ HTTP/\d+\.\d+")
_TARGET_BAD = re.compile(rb"[\x00-\x20\x7f-\xff]")  # ASCII only, as h11 (RFC 9112 §3.2)
_VALUE_BAD = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_DIGITS = re.compile(rb"[0-9]{1,15}")
_FRAMING = frozenset({b"host", b"content-length", b"transfer-encoding"})


class HeadProblem(enum.StrEnum):
    TOO_LARGE = "head-too-large"
    BARE_LF = "bare-lf"
    BARE_CR = "bare-cr"
    OBS_FOLD = "obs-fold"
    REQUEST_LINE = "invalid-request-line"
    VERSION = "unsupported-http-version"
    HEADER_LINE = "invalid-header-line"
    HEADER_VALUE = "invalid-header-value"
    CONTENT_LENGTH = "invalid-content-length"
    CONTENT_LENGTH_CONFLICT = "conflicting-content-length"
    TRANSFER_ENCODING = "invalid-transfer-encoding"
    LENGTH_AND_CHUNKED = "content-length-with-transfer-encoding"
    CHUNKED_ON_HTTP10 = "transfer-encoding-on-http10"
    DUPLICATE_HOST = "duplicate-host"
    MISSING_HOST = "missing-host"
    CONNECTION_TOKEN = "invalid-connection-token"


class HeadError(ValueError):
    def __init__(self, problem: HeadProblem, detail: str) -> None:
        super().__init__(f"{problem}: {detail}")
        self.problem = problem
        self.detail = detail


@dataclass(frozen=True)
class RequestHead:
    method: str
    target: str
    version: str  # "1.0" or "1.1"
    headers: tuple[tuple[str, str], ...]  # names as sent, values trimmed
    host: str | None
    content_length: int | None
    chunked: bool

    def values(self, name: str) -> list[str]:
        lower = name.lower()
        return [v for n, v in self.headers if n.lower() == lower]

    def tokens(self, name: str) -> set[str]:
        """Lower-cased comma-separated tokens of every ``name`` header (``Connection``, ``Upgrade``)."""
        return {t.strip().lower() for v in self.values(name) for t in v.split(",") if t.strip()}


def _line_end_problem(region: bytes) -> HeadError | None:
    lf = region.find(b"\n")
    while lf >= 0:
        if lf == 0 or region[lf - 1] != 0x0D:
            return HeadError(HeadProblem.BARE_LF, "line ends must be CRLF")
        lf = region.find(b"\n", lf + 1)
    cr = region.find(b"\r")
    while cr >= 0:
        if cr + 1 < len(region) and region[cr + 1] != 0x0A:
            return HeadError(HeadProblem.BARE_CR, "a CR not followed by LF")
        cr = region.find(b"\r", cr + 1)
    return None


def find_head_end(buffer: bytes | bytearray, limit: int = MAX_HEAD_BYTES) -> int | None:
    """Index just past the head's CRLFCRLF, or ``None`` while more bytes are needed.

    Raises :class:`HeadError` as soon as the buffered prefix can no longer become a valid head: too long, or a
    bare LF / bare CR before the end (an attacker cannot make us wait for a terminator that will never come).
    """
    end = buffer.find(b"\r\n\r\n", 0, limit + 4)
    region = bytes(buffer[: end + 4] if end >= 0 else buffer[:limit])
    problem = _line_end_problem(region)
    if problem is not None:
        raise problem
    if end >= 0 and end + 4 <= limit:
        return end + 4
    if len(buffer) >= limit:
        raise HeadError(HeadProblem.TOO_LARGE, f"request head longer than {limit} bytes")
    return None


def _framing(version: str, headers: list[tuple[bytes, bytes]]) -> tuple[int | None, bool]:
    lengths = [v for n, v in headers if n.lower() == b"content-length"]
    encodings = [v for n, v in headers if n.lower() == b"transfer-encoding"]
    for value in lengths:
        if not _DIGITS.fullmatch(value):
            raise HeadError(HeadProblem.CONTENT_LENGTH, "Content-Length must be one plain decimal number")
    if len({int(v) for v in lengths}) > 1:
        raise HeadError(HeadProblem.CONTENT_LENGTH_CONFLICT, "Content-Length headers disagree")
    if encodings:
        if len(encodings) > 1 or encodings[0].lower() != b"chunked":
            raise HeadError(HeadProblem.TRANSFER_ENCODING, "Transfer-Encoding must be exactly 'chunked', once")
        if lengths:
            raise HeadError(HeadProblem.LENGTH_AND_CHUNKED, "Content-Length and Transfer-Encoding together")
        if version == "1.0":
            raise HeadError(HeadProblem.CHUNKED_ON_HTTP10, "Transfer-Encoding on an HTTP/1.0 request")
    return (int(lengths[0]) if lengths else None), bool(encodings)


def check_head(raw: bytes) -> RequestHead:
    """Validate a complete head (as delimited by :func:`find_head_end`, CRLFCRLF included)."""
    if len(raw) > MAX_HEAD_BYTES:
        raise HeadError(HeadProblem.TOO_LARGE, f"request head longer than {MAX_HEAD_BYTES} bytes")
    if not raw.endswith(b"\r\n\r\n"):
        raise HeadError(HeadProblem.REQUEST_LINE, "head does not end with CRLFCRLF")
    problem = _line_end_problem(raw)
    if problem is not None:
        raise problem
    lines = raw[:-4].split(b"\r\n")
    request_line = _REQUEST_LINE.fullmatch(lines[0])
    if request_line is None:
        if _VERSION_LIKE.fullmatch(lines[0]):
            raise HeadError(HeadProblem.VERSION, "only HTTP/1.0 and HTTP/1.1 are accepted")
        raise HeadError(HeadProblem.REQUEST_LINE, "request line must be 'METHOD SP target SP HTTP/1.x'")
    method, target, version_b = request_line.groups()
    if not _TOKEN.fullmatch(method) or _TARGET_BAD.search(target):
        raise HeadError(HeadProblem.REQUEST_LINE, "invalid method or request target")
    version = version_b.decode()

    raw_headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        if line[:1] in (b" ", b"\t"):
            raise HeadError(HeadProblem.OBS_FOLD, "obsolete line folding (a header line starting with whitespace)")
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            raise HeadError(HeadProblem.HEADER_LINE, "header line must be 'name: value' with a token name")
        raw_headers.append((name, value.strip(b" \t")))
    headers: list[tuple[str, str]] = []
    for name, value in raw_headers:
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            raise HeadError(HeadProblem.HEADER_VALUE, "header value is not valid UTF-8") from None
        if _VALUE_BAD.search(text):
            raise HeadError(HeadProblem.HEADER_VALUE, "control character in a header value")
        headers.append((name.decode("ascii"), text))

    content_length, chunked = _framing(version, raw_headers)
    hosts = [v for n, v in headers if n.lower() == "host"]
    if len(hosts) > 1:
        raise HeadError(HeadProblem.DUPLICATE_HOST, "more than one Host header")
    if version == "1.1" and not hosts:
        raise HeadError(HeadProblem.MISSING_HOST, "HTTP/1.1 requires a Host header")
    for name, value in raw_headers:
        if name.lower() != b"connection":
            continue
        for token in (t.strip(b" \t").lower() for t in value.split(b",")):
            if token and (not _TOKEN.fullmatch(token) or token in _FRAMING):
                raise HeadError(HeadProblem.CONNECTION_TOKEN, "Connection must list tokens other than framing headers")
    return RequestHead(
        method=method.decode("ascii"),
        target=target.decode("ascii"),
        version=version,
        headers=tuple(headers),
        host=hosts[0] if hosts else None,
        content_length=content_length,
        chunked=chunked,
    )
