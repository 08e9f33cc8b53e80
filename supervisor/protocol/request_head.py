"""The one front door for HTTP/1.x request heads: read, check and refuse, sans-I/O (h11 style).

Every request head the agent's bytes can make is read here: the boundary's proxy listener, control's proxy-pod
listener (both through :mod:`supervisor.protocol.proxy_head`) and each request of an inspected connection
(``supervisor/control/l7/session/request.py``). :class:`HeadReader` keeps the buffer: ``receive_data(bytes)``, then
``next_event()`` gives a :class:`RequestHead`, :data:`NEED_DATA`, or raises :class:`HeadError`; bytes after a head
stay buffered for the next one (keep-alive) or are taken with :meth:`HeadReader.trailing_data`.

h11 parses heads well but is lenient where a proxy must not be: it accepts bare LF line ends, obs-fold
continuation lines, ``Content-Length`` together with ``Transfer-Encoding`` and ``Transfer-Encoding`` on
HTTP/1.0. Each of these is a request-smuggling shape (two parsers disagreeing about where a request ends), so
every head is checked here, on its raw bytes, before anything else reads it. Rules (docs/reference/policy.md
§3.1, §3.8.1, §3.8.2; docs/design.md "Request heads"):

1. The head is at most ``limit`` bytes (the reader's) and ends at the first CRLFCRLF; line ends are CRLF only.
   What can never become a valid head is refused as soon as it is seen, not after a timeout: a first byte that
   cannot start a method (a TLS ClientHello), a bare LF or CR, a control byte other than HTAB, too many bytes.
2. Request line: exactly ``METHOD SP target SP HTTP/1.0|HTTP/1.1``; the method a token; the target visible
   ASCII (no spaces, control bytes or DEL).
3. Header lines: no leading whitespace (obs-fold), ``name:`` with a token name and nothing between name and
   colon; values valid UTF-8 without control bytes other than HTAB.
4. Framing: every ``Content-Length`` a plain decimal of at most 15 digits, all of them spelled identically
   (``5`` and ``05`` together are refused: a hop that compares them as text, or forwards both, would see two
   lengths); ``Transfer-Encoding`` only once, exactly ``chunked``, never together with ``Content-Length`` and
   never on HTTP/1.0 (RFC 9112 §6.1: such framing is faulty).
5. ``Host``: at most one; exactly one on HTTP/1.1. ``Connection`` lists tokens (empty elements ignored) and
   never nominates ``host``, ``content-length`` or ``transfer-encoding`` (a hop-by-hop strip of those would
   change the framing).

A violation raises :class:`HeadError` whose ``problem`` value is the string logged; inside a tunnel the
connection is then closed without a response (§3.8.1), a proxy listener answers ``400`` (``431`` when too large).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

__all__ = [
    "MAX_HEAD_BYTES",
    "NEED_DATA",
    "HeadError",
    "HeadProblem",
    "HeadReader",
    "RequestHead",
    "check_head",
    "find_head_end",
]

MAX_HEAD_BYTES = 16 * 1024  # in-tunnel request heads (the proxy listeners' limit is 8 KiB: proxy_head)

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_REQUEST_LINE = re.compile(rb"([^ ]+) ([^ ]+) HTTP/(1\.[01])")
_VERSION_LIKE = re.compile(rb"[^ ]+ [^ ]+ HTTP/\d+\.\d+")
_TARGET_BAD = re.compile(rb"[^\x21-\x7e]")
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
    raw_headers: tuple[tuple[bytes, bytes], ...] = ()  # names as sent, values trimmed, in order
    raw: bytes = b""  # the head's bytes, CRLFCRLF included

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
    """Index just past the first head's CRLFCRLF, or ``None`` while more bytes are needed; what
    :class:`HeadReader` would refuse raises :class:`HeadError` here too (it is that reader, once)."""
    reader = HeadReader(limit)
    reader.receive_data(buffer)
    if reader.next_event() is NEED_DATA:
        return None
    return len(buffer) - reader.buffered


def _framing(version: str, headers: list[tuple[bytes, bytes]]) -> tuple[int | None, bool]:
    lengths = [v for n, v in headers if n.lower() == b"content-length"]
    encodings = [v for n, v in headers if n.lower() == b"transfer-encoding"]
    for value in lengths:
        if not _DIGITS.fullmatch(value):
            raise HeadError(HeadProblem.CONTENT_LENGTH, "Content-Length must be one plain decimal number")
    if len(set(lengths)) > 1:  # identical spellings only: rule 4
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
        raw_headers=tuple(raw_headers),
        raw=raw,
    )


class _NeedData:
    """What :meth:`HeadReader.next_event` returns while the head is incomplete (h11's ``NEED_DATA``)."""

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA = _NeedData()

_HEAD_START = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]")
# in a partial head: a bare LF, a CR followed by anything but LF, or a control byte other than HTAB
_EARLY_BAD = re.compile(rb"(?<!\r)\n|\r(?!\n|\Z)|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


class HeadReader:
    """One connection's request heads, read from the bytes fed to it (buffer inside, as in h11).

    ``limit`` bounds each head (CRLFCRLF included). A head is checked by :func:`check_head` once it is whole;
    while it is partial, each new byte is looked at once (no re-scan of what was seen), and a prefix that can no
    longer become a valid head raises :class:`HeadError` at once (rule 1).
    """

    __slots__ = ("_buffer", "_limit", "_seen", "received")

    def __init__(self, limit: int = MAX_HEAD_BYTES) -> None:
        self._buffer = bytearray()
        self._limit = limit
        self._seen = 0  # bytes of the current partial head already looked at
        self.received = False  # any byte at all arrived (a proxy answers 408 then, 400 for nothing)

    def receive_data(self, data: bytes | bytearray) -> None:
        if data:
            self._buffer += data
            self.received = True

    def trailing_data(self) -> bytes:
        """Take the bytes buffered after the last head (a tunnel's first bytes, a body's start)."""
        data = bytes(self._buffer)
        self._buffer.clear()
        self._seen = 0
        return data

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def next_event(self) -> RequestHead | _NeedData:
        buffer = self._buffer
        if not buffer:
            return NEED_DATA
        start = max(self._seen - 3, 0)
        end = buffer.find(b"\r\n\r\n", start, self._limit)
        if end >= 0:
            raw = bytes(buffer[: end + 4])
            del buffer[: end + 4]
            self._seen = 0
            return check_head(raw)
        if not _HEAD_START.match(buffer):
            raise HeadError(HeadProblem.REQUEST_LINE, "not the start of a request line")
        bad = _EARLY_BAD.search(buffer, max(self._seen - 1, 0))
        if bad is not None:
            raise _early_problem(bytes(buffer), bad.start())
        if len(buffer) >= self._limit:
            raise HeadError(HeadProblem.TOO_LARGE, f"request head longer than {self._limit} bytes")
        self._seen = len(buffer)
        return NEED_DATA


def _early_problem(partial: bytes, at: int) -> HeadError:
    """Name what is wrong at ``at`` in a partial head as :func:`check_head` would for the whole one."""
    byte = partial[at]
    if byte == 0x0A:
        return HeadError(HeadProblem.BARE_LF, "line ends must be CRLF")
    if byte == 0x0D:
        return HeadError(HeadProblem.BARE_CR, "a CR not followed by LF")
    line_start = partial.rfind(b"\r\n", 0, at)
    if line_start < 0:
        return HeadError(HeadProblem.REQUEST_LINE, "control character in the request line")
    line = partial[line_start + 2 : at]
    if line[:1] in (b" ", b"\t"):
        return HeadError(HeadProblem.OBS_FOLD, "obsolete line folding (a header line starting with whitespace)")
    if b":" in line:
        return HeadError(HeadProblem.HEADER_VALUE, "control character in a header value")
    return HeadError(HeadProblem.HEADER_LINE, "header line must be 'name: value' with a token name")
