"""The agent-facing HTTP proxy's head parser and response catalogue, sans-I/O.

Shared by the boundary's listener (``127.0.0.1:3128`` in the agent's namespace) and control's proxy-pod
listener (docs/design.md, "The proxy-pod topology"); neither side imports the other.

Rules (docs/reference/policy.md §3.1, §3.17; the listener parses only to learn the destination and to answer):

1. Nothing is decided here. A head becomes a :class:`ProxyTarget` (CONNECT or absolute-form plain HTTP) or a
   :class:`ProxyReject`; policy, DNS, L7 and credentials stay in control.
2. The head is read by the shared :class:`supervisor.protocol.request_head.HeadReader` (one set of rules for
   both listeners and the inspected path), at most :data:`MAX_HEAD_BYTES` (else ``431``), within
   :data:`HEAD_READ_DEADLINE_S` (``supervisor/link/head_read.py``: on expiry ``408``, or ``400`` when nothing
   came, after reading what had already arrived). Bytes that can never start a valid head (a TLS ClientHello, a
   bare LF) are refused as soon as they are seen.
3. Every refusal of that reader (line ends, obs-fold, control bytes, framing — identical ``Content-Length``
   spellings, ``Transfer-Encoding`` exactly ``chunked`` and never on HTTP/1.0 —, ``Host``, ``Connection``
   nominating a framing header) is a plain ``400``.
4. CONNECT authorities follow :func:`supervisor.protocol.egress.parse_authority`: bracketed IPv6, port
   required, no userinfo, at most 255 characters of host.
5. Absolute-form is rewritten to origin-form for upstream: every ``Host`` replaced by the target's authority,
   ``Proxy-*`` hop headers, ``Connection``/``Upgrade`` and everything ``Connection`` nominates dropped, then
   ``Connection: close`` and ``Via``. One request per client connection: :class:`ForwardBody` passes exactly
   the first request's body and drops whatever follows it.
6. Every byte of a response is rendered here, so the client-visible catalogue lives in one file.
7. ``Proxy-Authorization`` values are kept on the target (never forwarded) so that a listener that requires a
   proxy token (control's proxy-pod listener) can check them with :func:`proxy_token_matches`; a mismatch is
   answered ``407`` (:func:`render_proxy_auth_required`).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hmac
import json
import re
from dataclasses import dataclass, field

import h11

from supervisor.protocol.egress import CaptureKind, EgressHeaderError, EgressReply, parse_authority
from supervisor.protocol.json_value import JsonValue
from supervisor.protocol.outcome_reasons import OutcomeReason
from supervisor.protocol.request_head import HeadError, HeadProblem, HeadReader, RequestHead
from supervisor.protocol.responses import REASON_PHRASES, ErrorCode

MAX_HEAD_BYTES = 8192
HEAD_READ_DEADLINE_S = 10.0
PROXY_HOST = "127.0.0.1"
PROXY_PORT = 3128
VIA = "1.1 openshell-sandbox"

CONNECT_ESTABLISHED = b"HTTP/1.1 200 Connection Established\r\n\r\n"

_UPSTREAM_ERRORS = {
    502: ErrorCode.UPSTREAM_UNREACHABLE,
    503: ErrorCode.EGRESS_UNAVAILABLE,
    504: ErrorCode.UPSTREAM_TIMEOUT,
}

# headers that describe the hop between the agent and us, never forwarded (docs/reference/policy.md §3.1.2)
_HOP_HEADERS = frozenset(
    {b"host", b"connection", b"upgrade", b"proxy-connection", b"proxy-authorization", b"proxy-authenticate"}
)


@dataclass(frozen=True)
class ProxyTarget:
    """Where a proxy-aware client wants to go, and what must be sent upstream once control allows it."""

    host: str  # lower-cased; IPv6 without brackets
    port: int
    kind: CaptureKind  # CONNECT or HTTP_FORWARD
    request_head: bytes | None  # the origin-form head for HTTP_FORWARD; None for CONNECT
    method: str = "CONNECT"
    path: str | None = None  # origin-form target for HTTP_FORWARD
    leftover: bytes = b""  # bytes the client sent after its head (tunnel data or the body's start)
    chunked: bool = False  # HTTP_FORWARD body framing, for ForwardBody
    content_length: int = 0
    proxy_authorization: tuple[bytes, ...] = ()  # every Proxy-Authorization value the head carried

    def describe(self) -> str:
        """``CONNECT h:p`` or ``GET h:p/path`` (query removed) for details and events."""
        authority = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        if self.kind is CaptureKind.CONNECT:
            return f"CONNECT {authority}"
        return f"{self.method} {authority}{(self.path or '/').split('?', 1)[0]}"

    def body(self) -> ForwardBody:
        return ForwardBody(chunked=self.chunked, content_length=self.content_length)


@dataclass(frozen=True)
class ProxyReject:
    """A head refused before any policy work; ``render()`` is the complete response."""

    status: int
    error_code: ErrorCode | None = None  # JSON body {"error": code, "detail"?: ...}; None → no JSON
    detail: str | None = None
    text: str | None = None  # plain-text body instead of JSON (``Use CONNECT for HTTPS URLs``)

    def render(self) -> bytes:
        if self.error_code is not None:
            return render_response(self.status, Refusal(self.error_code, self.detail))
        return render_response(self.status, self.text)


@dataclass(frozen=True, slots=True)
class Refusal:
    """The JSON body of a refusal a proxy-aware client reads (docs/reference/policy.md §3.17); absent fields are left
    out."""

    error: ErrorCode  # the machine code (protocol/responses.py, the one catalogue)
    detail: str | None = None
    host: str | None = None
    port: int | None = None
    reason: str | None = None
    rule: str | None = None

    def to_wire(self) -> dict[str, JsonValue]:
        fields: tuple[tuple[str, JsonValue], ...] = (
            ("error", str(self.error)),
            ("detail", self.detail),
            ("host", self.host),
            ("port", self.port),
            ("reason", self.reason),
            ("rule", self.rule),
        )
        return {name: value for name, value in fields if value is not None}


def render_response(status: int, body: Refusal | str | None = None, *, extra_headers: tuple[bytes, ...] = ()) -> bytes:
    """A complete ``Connection: close`` response; JSON bodies carry ``application/json``."""
    reason = REASON_PHRASES.get(status, "Error")
    if isinstance(body, Refusal):
        payload = json.dumps(body.to_wire(), separators=(",", ":"), sort_keys=True).encode()
        content_type = b"application/json"
    elif body is not None:
        payload = body.encode()
        content_type = b"text/plain; charset=utf-8"
    else:
        payload, content_type = b"", b""
    lines = [f"HTTP/1.1 {status} {reason}".encode()]
    if content_type:
        lines.append(b"Content-Type: " + content_type)
    lines += list(extra_headers)
    lines += [b"Content-Length: %d" % len(payload), b"Connection: close"]
    return b"\r\n".join(lines) + b"\r\n\r\n" + payload


def render_denied(
    target: ProxyTarget,
    *,
    reason: str,
    rule: str | None = None,
    detail: str | None = None,
    error: ErrorCode = ErrorCode.POLICY_DENIED,
) -> bytes:
    """The ``403`` for a proxy-aware client (docs/reference/policy.md §3.17)."""
    body = Refusal(
        error=error,
        detail=detail or f"{target.describe()} not permitted by policy",
        host=target.host,
        port=target.port,
        reason=reason,
        rule=rule,
    )
    return render_response(403, body)


def render_upstream_failure(target: ProxyTarget, status: int, *, reason: str, detail: str | None = None) -> bytes:
    if status not in _UPSTREAM_ERRORS:
        raise ValueError(f"not an upstream failure status: {status}")
    body = Refusal(
        error=_UPSTREAM_ERRORS[status],
        detail=detail or f"{target.describe()} failed: {reason}",
        host=target.host,
        port=target.port,
        reason=reason,
    )
    return render_response(status, body)


def render_reply(target: ProxyTarget, reply: EgressReply) -> bytes:
    """What the client sees for control's answer. For an allowed forward request nothing is rendered: the
    caller sends ``target.request_head`` upstream and relays the upstream's own response."""
    if reply.status == 200:
        return CONNECT_ESTABLISHED if target.kind is CaptureKind.CONNECT else b""
    reason = reply.reason or OutcomeReason.DENIED
    if reply.status == 403:
        error = ErrorCode.SSRF_DENIED if reply.ssrf else ErrorCode.POLICY_DENIED
        return render_denied(target, reason=reason, rule=reply.rule, detail=reply.detail, error=error)
    if reply.status in _UPSTREAM_ERRORS:
        return render_upstream_failure(target, reply.status, reason=reason, detail=reply.detail)
    if reply.status == 400:
        return ProxyReject(400, ErrorCode.INVALID_REQUEST, reply.detail or reason).render()
    return render_response(500, Refusal(ErrorCode.INTERNAL_ERROR, reason))


def render_unavailable(target: ProxyTarget, reason: str = "no egress link") -> bytes:
    """No link to control (or no identity): refused at once, never a direct path."""
    return render_upstream_failure(target, 503, reason=reason)


PROXY_USER = "sandbox"
PROXY_REALM = "openshell-sandbox"


def proxy_token_matches(target: ProxyTarget, token: str) -> bool:
    """Exactly one ``Proxy-Authorization: Basic`` value whose credentials are ``sandbox:<token>`` (compared in
    constant time). Missing, repeated, another scheme, undecodable or another token: ``False``."""
    if len(target.proxy_authorization) != 1:
        return False
    scheme, _, encoded = target.proxy_authorization[0].strip().partition(b" ")
    if scheme.lower() != b"basic":
        return False
    try:
        given = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return False
    return hmac.compare_digest(given, f"{PROXY_USER}:{token}".encode())


def render_proxy_auth_required(detail: str = "a valid proxy token is required") -> bytes:
    """The ``407`` for a client without this sandbox's proxy token."""
    challenge = b'Proxy-Authenticate: Basic realm="' + PROXY_REALM.encode() + b'"'
    return render_response(407, Refusal(ErrorCode.PROXY_AUTH_REQUIRED, detail), extra_headers=(challenge,))


def proxy_url(host: str, port: int, token: str | None = None) -> str:
    """``http://sandbox:<token>@host:port`` (or without userinfo) for the agent's proxy variables."""
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"http://{PROXY_USER}:{token}@{authority}" if token else f"http://{authority}"


def proxy_environment(url: str = f"http://{PROXY_HOST}:{PROXY_PORT}") -> dict[str, str]:
    """The proxy variables set for the agent (docs/reference/boundary.md §6.5), upper and lower case."""
    env: dict[str, str] = {}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = url
    env["grpc_proxy"] = url
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost,::1"
    env["NODE_USE_ENV_PROXY"] = "1"
    return env


# --- head parsing ----------------------------------------------------------------------------------------


def proxy_event(reader: HeadReader) -> ProxyTarget | ProxyReject | None:
    """The proxy's reading of the head ``reader`` holds; ``None`` means "read more" (the head is incomplete,
    plausible so far and under the limit). The head's rules are the shared reader's (rule 3)."""
    try:
        head = reader.next_event()
    except HeadError as exc:
        return ProxyReject(431 if exc.problem is HeadProblem.TOO_LARGE else 400)
    if not isinstance(head, RequestHead):
        return None
    rest = reader.trailing_data()
    chunked, length = head.chunked, head.content_length or 0
    if head.method == "CONNECT":
        parsed = _connect(head, rest, has_body=chunked or length > 0)
    else:
        parsed = _forward(head, rest, chunked=chunked, length=length)
    auth = tuple(v for n, v in head.raw_headers if n.lower() == b"proxy-authorization")
    if isinstance(parsed, ProxyTarget) and auth:
        parsed = dataclasses.replace(parsed, proxy_authorization=auth)
    return parsed


def parse_head(buffer: bytes) -> ProxyTarget | ProxyReject | None:
    """:func:`proxy_event` for the bytes of one connection received so far."""
    reader = HeadReader(MAX_HEAD_BYTES)
    reader.receive_data(buffer)
    return proxy_event(reader)


def _connect(head: RequestHead, rest: bytes, *, has_body: bool) -> ProxyTarget | ProxyReject:
    try:
        host, port = parse_authority(head.target)
    except EgressHeaderError as exc:
        return ProxyReject(400, ErrorCode.INVALID_CONNECT_TARGET, str(exc))
    if has_body:
        return ProxyReject(400, ErrorCode.INVALID_CONNECT_TARGET, "CONNECT must not carry a body")
    return ProxyTarget(host=host, port=port, kind=CaptureKind.CONNECT, request_head=None, leftover=rest)


def _forward(head: RequestHead, rest: bytes, *, chunked: bool, length: int) -> ProxyTarget | ProxyReject:
    scheme, sep, after = head.target.partition("://")
    if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme):
        return ProxyReject(400)  # origin-form or asterisk-form: this is a proxy, not a server
    scheme = scheme.lower()
    if scheme == "https":
        return ProxyReject(400, text="Use CONNECT for HTTPS URLs")
    if scheme != "http":
        return ProxyReject(400, ErrorCode.UNSUPPORTED_PROXY_SCHEME, f"scheme {scheme!r} is not supported")
    if "#" in after:
        return ProxyReject(400, ErrorCode.INVALID_REQUEST_TARGET, "fragments are not allowed")
    split = min((i for i in (after.find("/"), after.find("?")) if i >= 0), default=len(after))
    authority, path = after[:split], after[split:]
    if not authority or authority.startswith(":"):
        return ProxyReject(400)
    try:
        host, port = parse_authority(authority, default_port=80)
    except EgressHeaderError as exc:
        return ProxyReject(400, ErrorCode.INVALID_REQUEST_TARGET, str(exc))
    if not path.startswith("/"):
        path = "/" + path
    origin = _origin_head(head.method, path, head.version.encode(), head.raw_headers, host, port)
    return ProxyTarget(
        host=host,
        port=port,
        kind=CaptureKind.HTTP_FORWARD,
        request_head=origin,
        method=head.method,
        path=path,
        leftover=rest,
        chunked=chunked,
        content_length=length,
    )


def _origin_head(
    method: str, path: str, version: bytes, headers: tuple[tuple[bytes, bytes], ...], host: str, port: int
) -> bytes:
    nominated: set[bytes] = set()
    for name, value in headers:
        if name.lower() in (b"connection", b"proxy-connection"):
            nominated.update(t.strip().lower() for t in value.split(b","))
    websocket = b"upgrade" in nominated and any(
        n.lower() == b"upgrade" and v.strip().lower() == b"websocket" for n, v in headers
    )
    drop = _HOP_HEADERS | nominated
    lines = [f"{method} {path} HTTP/".encode() + version]
    lines += [name + b": " + value for name, value in headers if name.lower() not in drop]
    authority = f"[{host}]" if ":" in host else host
    lines.append(b"Host: " + (authority if port == 80 else f"{authority}:{port}").encode())
    if websocket:
        lines += [b"Connection: Upgrade", b"Upgrade: websocket"]
    else:
        lines.append(b"Connection: close")
    if not any(name.lower() == b"via" for name, _ in headers):
        lines.append(b"Via: " + VIA.encode())
    return b"\r\n".join(lines) + b"\r\n\r\n"


@dataclass
class ForwardBody:
    """Passes exactly one request body through (re-framed identically) and drops anything after it.

    Feed it ``target.leftover`` first, then each read from the client; stop relaying client bytes once
    ``done``. Trailers of a chunked body are dropped.
    """

    chunked: bool
    content_length: int
    done: bool = False
    _conn: h11.Connection = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._conn = h11.Connection(h11.SERVER)
        framing = b"Transfer-Encoding: chunked" if self.chunked else b"Content-Length: %d" % self.content_length
        self._conn.receive_data(b"POST / HTTP/1.1\r\nHost: x\r\n" + framing + b"\r\n\r\n")
        self._conn.next_event()  # the synthetic Request
        self._advance()

    def feed(self, data: bytes) -> bytes:
        """Bytes to forward upstream for this chunk of client input (b"" once done)."""
        if self.done:
            return b""
        self._conn.receive_data(data)
        return self._advance()

    def _advance(self) -> bytes:
        out = bytearray()
        while not self.done:
            try:
                event = self._conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise ValueError(f"malformed request body: {exc}") from exc
            if event is h11.NEED_DATA or event is h11.PAUSED:
                break
            if isinstance(event, h11.Data) and event.data:
                out += b"%x\r\n%s\r\n" % (len(event.data), event.data) if self.chunked else event.data
            elif isinstance(event, h11.EndOfMessage):
                if self.chunked:
                    out += b"0\r\n\r\n"
                self.done = True
        return bytes(out)
