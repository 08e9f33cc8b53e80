"""The stream headers of an ``openshell-egress/1`` link: one captured connection = one HTTP/2 CONNECT stream.

Rules this module enforces (everything that crosses the boundary→control hand-off is checked here):

1. The boundary is the HTTP/2 client. A hand-off is ``:method CONNECT`` + ``:authority host:port`` (RFC 9113
   §8.5: no ``:scheme``, no ``:path``) plus exactly the ``openshell-*`` headers below, each once.
2. The authority follows docs/reference/policy.md §3.1.1 tightened: IPv6 literals are bracketed, the port is present and
   1..65535 in plain decimal, no userinfo, the host is at most 255 characters of ``[a-z0-9._~-]`` (lower-cased)
   or a bracketed IPv6 address without a zone.
3. ``openshell-identity`` is the compact JSON of the boundary's resolved identity (docs/reference/boundary.md §4.2),
   validated field by field by :meth:`ConnectionIdentity.from_wire` (``protocol/identity.py``); unknown fields
   are refused so that both sides agree on what was decided.
4. Control answers ``:status`` 200 (allow, then bytes flow with END_STREAM as half-close) or an error status with
   ``openshell-reason`` (required) and optionally ``openshell-rule`` / ``openshell-detail``.
5. Decoding is strict: anything malformed, unknown or duplicated raises :class:`EgressHeaderError`. Encoding
   validates too, so a bug on the sending side fails where it happens.
6. DNS rides the same links as ``POST /v1/dns`` whose body is one DNS wire message; the reply body is one too.

Header values arrive from h2 as ``bytes`` or ``str`` depending on its configuration; both are accepted.
"""

from __future__ import annotations

import enum
import ipaddress
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

from supervisor.protocol.identity import ConnectionIdentity, IdentityError
from supervisor.protocol.upstream_reasons import UpstreamReason

ALPN_EGRESS = "openshell-egress/1"

H_CAPTURE = "openshell-capture"
H_IDENTITY = "openshell-identity"
H_CONN_ID = "openshell-conn-id"
H_SRC_PORT = "openshell-src-port"
H_REASON = "openshell-reason"
H_RULE = "openshell-rule"
H_DETAIL = "openshell-detail"

DNS_PATH = "/v1/dns"
DNS_CONTENT_TYPE = "application/dns-message"
DNS_AUTHORITY = "openshell.dns"

MAX_HOST_LEN = 255
MAX_TEXT_LEN = 1024  # reason, rule, detail
MAX_IDENTITY_LEN = 32 * 1024  # 64 ancestors of long paths still fit comfortably

REPLY_STATUSES = frozenset({200, 400, 403, 500, 502, 503, 504})


class CaptureKind(enum.StrEnum):
    """How the boundary came to hold the connection; the value is the header and event string."""

    TRANSPARENT = "transparent"  # any-IP / redirect capture: the destination is the original address
    CONNECT = "connect"  # proxy listener, CONNECT host:port
    HTTP_FORWARD = "http-forward"  # proxy listener, absolute-form plain HTTP request


class EgressHeaderError(ValueError):
    """The headers of an egress stream are malformed; the stream must be refused (RST or 400)."""


@dataclass(frozen=True, slots=True)
class EgressRequest:
    host: str
    port: int
    capture: CaptureKind
    # None only for control's own proxy listener (the proxy-pod topology): no process to identify behind it; a
    # hand-off on a link always carries one
    identity: ConnectionIdentity | None
    conn_id: str
    src_port: int

    @property
    def authority(self) -> str:
        return format_authority(self.host, self.port)


# Refusal reasons that are destination refusals (docs/reference/policy.md §3.17: ``ssrf_denied``), not policy ones: the
# boundary renders them with that code. They come from the one catalogue of upstream reasons.
SSRF_REASONS = frozenset(str(reason) for reason in UpstreamReason if reason.ssrf)


@dataclass(frozen=True, slots=True)
class EgressReply:
    status: int
    reason: str | None = None
    rule: str | None = None
    detail: str | None = None

    @property
    def allowed(self) -> bool:
        return self.status == 200

    @property
    def ssrf(self) -> bool:
        """A refusal of the destination's address (``ssrf_denied``) rather than of the request by policy."""
        return self.status == 403 and self.reason in SSRF_REASONS


# --- authority ------------------------------------------------------------------------------------------

_HOST_RE = re.compile(r"[a-z0-9._~-]+")
_PORT_RE = re.compile(r"[1-9][0-9]{0,4}")


def parse_authority(text: str, *, default_port: int | None = None) -> tuple[str, int]:
    """``host:port`` → (lower-cased host, port); IPv6 comes back unbracketed in compressed form.

    ``default_port`` makes the port optional (absolute-form ``http://host/``); CONNECT and the egress
    ``:authority`` always pass ``None``.
    """
    if not text or not text.isascii():
        raise EgressHeaderError("authority must be non-empty ASCII")
    if "@" in text:
        raise EgressHeaderError("authority must not carry userinfo")
    port_text: str | None
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise EgressHeaderError("unterminated IPv6 literal")
        inner, rest = text[1:end], text[end + 1 :]
        if "%" in inner:
            raise EgressHeaderError("IPv6 zone identifiers are not accepted")
        try:
            host = ipaddress.IPv6Address(inner).compressed
        except ValueError as exc:
            raise EgressHeaderError(f"invalid IPv6 literal: {inner!r}") from exc
        if rest == "":
            port_text = None
        elif rest.startswith(":"):
            port_text = rest[1:]
        else:
            raise EgressHeaderError("garbage after IPv6 literal")
    else:
        host, sep, tail = text.partition(":")
        if ":" in tail:
            raise EgressHeaderError("IPv6 literals must be bracketed")
        port_text = tail if sep else None
        host = host.lower()
        if not host:
            raise EgressHeaderError("empty host")
        if len(host) > MAX_HOST_LEN:
            raise EgressHeaderError(f"host longer than {MAX_HOST_LEN} characters")
        if not _HOST_RE.fullmatch(host):
            raise EgressHeaderError(f"invalid host: {host!r}")
    if port_text is None:
        if default_port is None:
            raise EgressHeaderError("port is required")
        return host, default_port
    return host, _parse_port(port_text)


def _parse_port(text: str) -> int:
    if not _PORT_RE.fullmatch(text) or int(text) > 65535:
        raise EgressHeaderError(f"invalid port: {text!r}")
    return int(text)


def format_authority(host: str, port: int) -> str:
    """Inverse of :func:`parse_authority`; validates, so a bad host or port never reaches the wire."""
    parsed_host, parsed_port = parse_authority(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return f"[{parsed_host}]:{parsed_port}" if ":" in parsed_host else f"{parsed_host}:{parsed_port}"


# --- request headers -------------------------------------------------------------------------------------

_CONN_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def encode_connect_headers(
    host: str,
    port: int,
    *,
    capture: CaptureKind | str,
    identity: ConnectionIdentity,
    conn_id: str,
    src_port: int,
) -> list[tuple[str, str]]:
    if not isinstance(identity, ConnectionIdentity):
        raise EgressHeaderError("a hand-off carries the connection's identity")
    wire = identity.to_wire()
    request = EgressRequest(
        host=host,
        port=port,
        capture=_capture_kind(str(capture)),
        identity=_identity(wire),  # the receiver's checks, here, so a bad identity fails where it is made
        conn_id=_check_conn_id(conn_id),
        src_port=_check_src_port(src_port),
    )
    identity_json = json.dumps(wire, separators=(",", ":"), sort_keys=True, ensure_ascii=True)
    if len(identity_json) > MAX_IDENTITY_LEN:
        raise EgressHeaderError("identity too large")
    return [
        (":method", "CONNECT"),
        (":authority", format_authority(host, port)),
        (H_CAPTURE, str(request.capture)),
        (H_IDENTITY, identity_json),
        (H_CONN_ID, request.conn_id),
        (H_SRC_PORT, str(request.src_port)),
    ]


def decode_connect_headers(headers: Iterable[tuple[str | bytes, str | bytes]]) -> EgressRequest:
    fields = _collect(headers, allowed={":method", ":authority", H_CAPTURE, H_IDENTITY, H_CONN_ID, H_SRC_PORT})
    missing = {":method", ":authority", H_CAPTURE, H_IDENTITY, H_CONN_ID, H_SRC_PORT} - set(fields)
    if missing:
        raise EgressHeaderError(f"missing headers: {sorted(missing)}")
    if fields[":method"] != "CONNECT":
        raise EgressHeaderError(f"method must be CONNECT, not {fields[':method']!r}")
    host, port = parse_authority(fields[":authority"])
    raw_identity = fields[H_IDENTITY]
    if len(raw_identity) > MAX_IDENTITY_LEN:
        raise EgressHeaderError("identity too large")
    try:
        identity = json.loads(raw_identity)
    except ValueError as exc:
        raise EgressHeaderError("identity is not valid JSON") from exc
    src_port = int(fields[H_SRC_PORT]) if _PORT_RE.fullmatch(fields[H_SRC_PORT]) else -1
    return EgressRequest(
        host=host,
        port=port,
        capture=_capture_kind(fields[H_CAPTURE]),
        identity=_identity(identity),
        conn_id=_check_conn_id(fields[H_CONN_ID]),
        src_port=_check_src_port(src_port),
    )


# --- reply headers ---------------------------------------------------------------------------------------


def encode_reply_headers(reply: EgressReply) -> list[tuple[str, str]]:
    _check_reply(reply)
    out = [(":status", str(reply.status))]
    for name, value in ((H_REASON, reply.reason), (H_RULE, reply.rule), (H_DETAIL, reply.detail)):
        if value is not None:
            out.append((name, value))
    return out


def decode_reply_headers(headers: Iterable[tuple[str | bytes, str | bytes]]) -> EgressReply:
    fields = _collect(headers, allowed={":status", H_REASON, H_RULE, H_DETAIL, "content-type"})
    status_text = fields.get(":status")
    if status_text is None or not re.fullmatch(r"[1-5][0-9]{2}", status_text):
        raise EgressHeaderError(f"invalid :status {status_text!r}")
    reply = EgressReply(
        status=int(status_text),
        reason=fields.get(H_REASON),
        rule=fields.get(H_RULE),
        detail=fields.get(H_DETAIL),
    )
    _check_reply(reply)
    return reply


def _check_reply(reply: EgressReply) -> None:
    if reply.status not in REPLY_STATUSES:
        raise EgressHeaderError(f"unexpected reply status {reply.status}")
    if reply.status != 200 and not reply.reason:
        raise EgressHeaderError("a refusal must carry openshell-reason")
    for value in (reply.reason, reply.rule, reply.detail):
        if value is not None:
            _check_text(value)


# --- DNS over the link -----------------------------------------------------------------------------------


def encode_dns_request_headers(length: int) -> list[tuple[str, str]]:
    if not 12 <= length <= 65535:
        raise EgressHeaderError("a DNS message is 12..65535 bytes")
    return [
        (":method", "POST"),
        (":scheme", "https"),
        (":authority", DNS_AUTHORITY),
        (":path", DNS_PATH),
        ("content-type", DNS_CONTENT_TYPE),
        ("content-length", str(length)),
    ]


def decode_dns_request_headers(headers: Iterable[tuple[str | bytes, str | bytes]]) -> int:
    """Validate a DNS request head; returns its declared content length."""
    fields = _collect(headers, allowed={":method", ":scheme", ":authority", ":path", "content-type", "content-length"})
    expected = {
        ":method": "POST",
        ":scheme": "https",
        ":authority": DNS_AUTHORITY,
        ":path": DNS_PATH,
        "content-type": DNS_CONTENT_TYPE,
    }
    for name, value in expected.items():
        if fields.get(name) != value:
            raise EgressHeaderError(f"DNS request: {name} must be {value!r}")
    length_text = fields.get("content-length", "")
    if not re.fullmatch(r"[0-9]{1,5}", length_text) or not 12 <= int(length_text) <= 65535:
        raise EgressHeaderError("DNS request: content-length must be 12..65535")
    return int(length_text)


def encode_dns_reply_headers(length: int) -> list[tuple[str, str]]:
    return [(":status", "200"), ("content-type", DNS_CONTENT_TYPE), ("content-length", str(length))]


# --- helpers ---------------------------------------------------------------------------------------------


def _collect(headers: Iterable[tuple[str | bytes, str | bytes]], *, allowed: set[str]) -> dict[str, str]:
    fields: dict[str, str] = {}
    for raw_name, raw_value in headers:
        name = _text(raw_name)
        value = _text(raw_value)
        if name != name.lower():
            raise EgressHeaderError(f"header names are lower-case in HTTP/2: {name!r}")
        if name not in allowed:
            raise EgressHeaderError(f"unexpected header {name!r}")
        if name in fields:
            raise EgressHeaderError(f"duplicate header {name!r}")
        if any(ch in value for ch in "\r\n\x00"):
            raise EgressHeaderError(f"control character in {name!r}")
        fields[name] = value
    return fields


def _text(value: str | bytes) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("ascii")
        except UnicodeDecodeError as exc:
            raise EgressHeaderError("header bytes must be ASCII") from exc
    if not value.isascii():
        raise EgressHeaderError("header text must be ASCII")
    return value


def _identity(obj: object) -> ConnectionIdentity:
    try:
        return ConnectionIdentity.from_wire(obj)
    except IdentityError as exc:
        raise EgressHeaderError(str(exc)) from exc


def _capture_kind(text: str) -> CaptureKind:
    try:
        return CaptureKind(text)
    except ValueError as exc:
        raise EgressHeaderError(f"unknown capture kind {text!r}") from exc


def _check_conn_id(conn_id: str) -> str:
    if not _CONN_ID_RE.fullmatch(conn_id):
        raise EgressHeaderError("conn-id must be 1..64 characters of [A-Za-z0-9_-]")
    return conn_id


def _check_src_port(port: int) -> int:
    if isinstance(port, bool) or not 1 <= port <= 65535:
        raise EgressHeaderError(f"invalid source port {port!r}")
    return port


def _check_text(value: str) -> None:
    if len(value) > MAX_TEXT_LEN or not value.isascii() or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        raise EgressHeaderError("reason/rule/detail must be printable ASCII of at most 1024 characters")
