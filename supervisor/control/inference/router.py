"""``inference.local``: control answers the agent's model API calls itself and forwards them to the backend the
operator's routes name, with the backend's key injected (docs/reference/policy.md §3.16, docs/policy.md "Inference
routing").

Theory of operation
-------------------
A connection reaches the router instead of the network policy when the agent asks for ``inference.local:443``
(``CONNECT`` through its proxy) or dials :data:`SYNTHETIC_ADDRESS` on port 443 (the address control's DNS
answers ``inference.local`` with; transparent capture). No policy rule is evaluated: any process of the agent
reaches the router, and a route restricts its users only through its ``binaries`` (docs/design.md "Inference
routing").

1. **TLS** is terminated with a leaf for ``inference.local`` from the sandbox CA; a ClientHello naming another
   server is refused. Plain HTTP is refused (the SDKs speak ``https://``).
2. **Each request** (kept-alive, one at a time): the head read by the one reader every listener shares
   (``protocol/request_head``), its authority bound to ``inference.local``, its shape checked (``shapes``),
   ``models`` answered here, a body read whole (at most ``max_request``), its model looked up in the routes the
   caller may use, the backend dialled as any upstream (resolved once, vetted with the route's ``allowed_ips``,
   TLS verified), and the request sent with the caller's credentials and other headers stripped and the route's
   key injected.
3. **The response** streams back through the scrubber (the backend's key becomes its placeholder, in headers and
   body, SSE included), at most ``max_response`` bytes and never idle longer than ``idle_timeout``. A stream cut
   after its head went out ends, for an SSE response, with an ``error`` event both SDKs raise, and a clean end of
   the body; any other body is aborted. Before the head, the agent gets ``504``/``502``.
4. Every request is one ``inference`` event: route, model, shape, status, byte counts, duration; never a prompt,
   a completion or a header value.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

import h11
import trio

from supervisor.control.connection_result import ConnectionResult
from supervisor.control.credentials import Credentials
from supervisor.control.inference.routes import INFERENCE_HOST, InferenceRoutes, Route
from supervisor.control.inference.shapes import (
    BodyInvalid,
    Shape,
    ShapeMatch,
    backend_headers,
    error_body,
    match_shape,
    model_body,
    model_entry_body,
    models_body,
    read_body,
    sse_error,
)
from supervisor.control.inference.store import RoutesStore
from supervisor.control.l7.authority import AuthorityError, request_authority, same_authority
from supervisor.control.l7.ca import InterceptionCA, LeafError
from supervisor.control.l7.client_hello import ClientHelloError, Pending, server_name
from supervisor.control.l7.memory_tls import MemoryTLSStream
from supervisor.control.l7.scrub import Scrubber, unscrubbable, valid_name
from supervisor.control.l7.sniff import TunnelProtocol, sniff
from supervisor.control.l7.streams import PrefixedStream, abort_all
from supervisor.control.policy.identity import BinaryIdentity
from supervisor.control.upstream import UpstreamConfig, UpstreamError, UpstreamReason
from supervisor.control.upstream import dial as dial_upstream
from supervisor.jsonlog import JsonLog
from supervisor.link.h2link import LinkStream
from supervisor.protocol.egress import CaptureKind, EgressReply, EgressRequest, encode_reply_headers
from supervisor.protocol.event_names import EventName
from supervisor.protocol.json_value import JsonValue
from supervisor.protocol.outcome_reasons import OutcomeReason
from supervisor.protocol.request_head import MAX_HEAD_BYTES, HeadError, HeadReader, RequestHead
from supervisor.protocol.responses import ErrorCode

__all__ = ["SYNTHETIC_ADDRESS", "InferenceLimits", "InferenceRouter"]

# the address control's DNS answers inference.local with: link-local, so no policy can ever name it as an upstream
# (always blocked), and outside the random /30s dev's proxy-pod namespaces take (169.254.20.0 and up)
SYNTHETIC_ADDRESS = "169.254.7.80"
PORT = 443
_STREAM_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
_HOP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"upgrade",
                  b"proxy-connection", b"te", b"trailer"})  # fmt: skip


@dataclass(frozen=True)
class InferenceLimits:
    max_request: int = 10 << 20
    max_response: int = 32 << 20
    idle_timeout: float = 120.0  # no byte from the backend (or the agent not reading) for this long: cut
    head_timeout: float = 30.0
    handshake_timeout: float = 10.0
    keepalive_timeout: float = 300.0  # an idle agent connection between requests
    chunk: int = 65536


class _Cut(Exception):
    """The exchange cannot go on; ``status``/``code`` answer it when the agent has no response head yet."""

    def __init__(self, code: ErrorCode, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.reason = code.status, code, message, reason


class _Closed(Exception):
    """The agent's side ended or failed: nothing more can be said to it."""


class _Record:
    def __init__(self) -> None:
        self.started = trio.current_time()
        self.fields: dict[str, JsonValue] = {"decision": "allow"}
        self.bytes_up = 0
        self.bytes_down = 0

    def event(self) -> dict[str, JsonValue]:
        duration = round((trio.current_time() - self.started) * 1000, 1)
        return {**self.fields, "bytes_up": self.bytes_up, "bytes_down": self.bytes_down, "duration_ms": duration}


class InferenceRouter:
    def __init__(self, store: RoutesStore, *, credentials: Credentials, ca: InterceptionCA,
                 upstream_ssl: ssl.SSLContext, upstream: UpstreamConfig, log: JsonLog,
                 limits: InferenceLimits | None = None, relaxed: bool = False) -> None:  # fmt: skip
        self.store = store
        self.credentials = credentials
        self.ca = ca
        self.upstream_ssl = upstream_ssl
        self.upstream = upstream
        self.log = log
        self.limits = limits or InferenceLimits()
        self.relaxed = relaxed
        self.counters = {"requests": 0, "denied": 0, "failed": 0}

    def claims(self, request: EgressRequest) -> bool:
        """Whether this connection is for ``inference.local`` (by name through the proxy, or its address)."""
        host = request.host.lower().rstrip(".")
        if request.capture is CaptureKind.TRANSPARENT:
            return host == SYNTHETIC_ADDRESS
        return host == INFERENCE_HOST

    async def serve(self, stream: LinkStream, request: EgressRequest, result: ConnectionResult) -> None:
        """One agent connection to ``inference.local``; ``result`` is its ``egress`` event."""
        result.context(destination_kind="inference")
        if request.port != PORT or request.capture is CaptureKind.HTTP_FORWARD:
            detail = f"{INFERENCE_HOST} is served on port {PORT}, over TLS"
            result.deny(OutcomeReason.INFERENCE_NOT_SERVED, detail=detail)
            await stream.send_headers(
                encode_reply_headers(EgressReply(403, reason=OutcomeReason.INFERENCE_NOT_SERVED, detail=detail)),
                end_stream=True,
                now=True,
            )
            return
        result.allow(inference=True)
        await stream.send_headers(encode_reply_headers(EgressReply(200)), end_stream=False, now=True)
        session = _Session(self, stream, request)
        try:
            await session.run()
        finally:
            result.closed(closed_by=session.closed_by, bytes_out=session.bytes_up, bytes_in=session.bytes_down,
                          requests=session.requests)  # fmt: skip

    def status(self) -> dict[str, JsonValue]:
        return {**self.store.status(), "address": SYNTHETIC_ADDRESS, **self.counters}


class _Session:
    def __init__(self, router: InferenceRouter, raw: LinkStream, request: EgressRequest) -> None:
        self.router = router
        self.limits = router.limits
        self.raw = raw
        self.agent: trio.abc.Stream = raw
        self.request = request
        self.identity = BinaryIdentity.of(request.identity)
        self.buffer = bytearray()
        self.closed_by = "agent"
        self.bytes_up = 0
        self.bytes_down = 0
        self.requests = 0
        self.clean = True
        self._scrub: Scrubber | None = None

    # --- the connection ---------------------------------------------------------------------------------------
    async def run(self) -> None:
        try:
            if await self._terminate_tls():
                while await self._one_request():
                    pass
        except _Closed:
            self.clean = False
        finally:
            with trio.CancelScope(shield=True):
                if self.clean:
                    with trio.move_on_after(1.0):
                        try:
                            await self.agent.aclose()
                        except _STREAM_ERRORS:
                            pass
                await abort_all(self.agent)

    async def _recv(self, seconds: float) -> bytes | None:
        """Bytes from the agent, ``b""`` at its end, ``None`` when ``seconds`` passed first."""
        with trio.move_on_after(max(seconds, 0)):
            try:
                return bytes(await self.agent.receive_some(self.limits.chunk))
            except _STREAM_ERRORS:
                raise _Closed from None
        return None

    async def _send(self, data: bytes | None) -> None:
        if not data:
            return
        with trio.move_on_after(self.limits.idle_timeout) as scope:
            try:
                await self.agent.send_all(data)
            except _STREAM_ERRORS:
                raise _Closed from None
        if scope.cancelled_caught:
            self.closed_by = "agent-not-reading"
            raise _Closed

    def _tunnel(self, stage: str, **fields: JsonValue) -> None:
        binary = self.request.identity.binary_path if self.request.identity else None
        self.router.log.emit(EventName.HTTP_TUNNEL, destination=f"{INFERENCE_HOST}:{PORT}", stage=stage,
                             conn_id=self.request.conn_id, binary=binary, **fields)  # fmt: skip

    async def _terminate_tls(self) -> bool:
        deadline = trio.current_time() + self.limits.head_timeout
        while True:
            proto = sniff(bytes(self.buffer)) if self.buffer else None
            if proto is not None and proto is not TunnelProtocol.TLS:
                self._tunnel(
                    "refused", reason=OutcomeReason.INFERENCE_NEEDS_TLS, detail=f"{INFERENCE_HOST} speaks HTTPS only"
                )
                self.closed_by = "refused"
                return False
            if proto is TunnelProtocol.TLS:
                try:
                    sni = server_name(bytes(self.buffer))
                except ClientHelloError as exc:
                    self._tunnel("refused", reason=OutcomeReason.INVALID_CLIENT_HELLO, detail=str(exc))
                    self.closed_by = "refused"
                    return False
                if not isinstance(sni, Pending):
                    break
            more = await self._recv(deadline - trio.current_time())
            if not more:
                self.closed_by = "agent" if more == b"" else OutcomeReason.HEAD_TIMEOUT
                return False
            self.buffer += more
        if sni is not None and sni.lower().rstrip(".") != INFERENCE_HOST:
            self._tunnel("refused", reason=OutcomeReason.REQUEST_AUTHORITY_MISMATCH, server_name=sni[:255],
                         detail=f"TLS server name {sni[:255]!r} is not {INFERENCE_HOST}")  # fmt: skip
            self.closed_by = "refused"
            return False
        try:
            ctx = self.router.ca.leaf_context(INFERENCE_HOST)
        except LeafError as exc:
            self._tunnel("agent-tls-failed", reason=OutcomeReason.NO_LEAF, detail=str(exc))
            return False
        tls = MemoryTLSStream(PrefixedStream(self.raw, bytes(self.buffer)), ctx, server_side=True)
        self.buffer.clear()
        self.agent = tls
        try:
            with trio.fail_after(self.limits.handshake_timeout):
                await tls.do_handshake()
        except (trio.TooSlowError, *_STREAM_ERRORS) as exc:
            cause = exc.__cause__ or exc
            self._tunnel("agent-tls-failed", reason=OutcomeReason.AGENT_TLS_HANDSHAKE_FAILED,
                         detail=f"{type(cause).__name__}: {cause}"[:300])  # fmt: skip
            self.clean = False
            return False
        return True

    # --- one request ------------------------------------------------------------------------------------------
    async def _read_head(self) -> RequestHead | None:
        reader = HeadReader(MAX_HEAD_BYTES)
        reader.receive_data(self.buffer)
        self.buffer.clear()
        deadline = trio.current_time() + self.limits.keepalive_timeout
        started = False
        while True:
            head = reader.next_event()
            if isinstance(head, RequestHead):
                self.buffer += reader.trailing_data()
                return head
            if reader.buffered and not started:
                started, deadline = True, trio.current_time() + self.limits.head_timeout
            data = await self._recv(deadline - trio.current_time())
            if not data:
                self.closed_by = "agent" if data == b"" and not reader.buffered else "idle" if not started else (
                    "malformed")  # fmt: skip
                return None
            reader.receive_data(data)

    async def _one_request(self) -> bool:
        rec = _Record()
        try:
            head = await self._read_head()
        except HeadError as exc:
            rec.fields.update(decision="deny", reason=str(exc.problem), detail=exc.detail[:200])
            self._event(rec)
            self.closed_by = "malformed"
            return False
        if head is None:
            return False
        self.requests += 1
        self.router.counters["requests"] += 1
        rec.started = trio.current_time()
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES + 1)
        conn.receive_data(head.raw + bytes(self.buffer))
        self.buffer.clear()
        try:
            event: object = conn.next_event()
        except h11.RemoteProtocolError:
            event = None
        if not isinstance(event, h11.Request):
            rec.fields.update(decision="deny", reason=OutcomeReason.INVALID_REQUEST)
            self._event(rec)
            self.closed_by = "malformed"
            return False
        method = head.method.upper()
        rec.fields.update(method=method)
        try:
            keep = await self._handle(conn, rec, head, method)
        except _Cut as cut:
            rec.fields.update(status=cut.status, reason=cut.reason, detail=cut.message[:300])
            if rec.fields["decision"] == "allow":
                rec.fields["decision"] = "error"
            self.router.counters["denied" if rec.fields["decision"] == "deny" else "failed"] += 1
            await self._answer(conn, cut.status, error_body(_error_type(cut.status), str(cut.code), cut.message),
                               close=True)  # fmt: skip
            self._event(rec)
            self.closed_by = "refused" if rec.fields["decision"] == "deny" else "error"
            return False
        except _Closed:
            self._event(rec)
            raise
        self._event(rec)
        if not keep or conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
            return False
        self.buffer = bytearray(conn.trailing_data[0])
        return True

    def _event(self, rec: _Record) -> None:
        self.bytes_up += rec.bytes_up
        self.bytes_down += rec.bytes_down
        binary = self.request.identity.binary_path if self.request.identity else None
        self.router.log.emit(EventName.INFERENCE, conn_id=self.request.conn_id, binary=binary, **rec.event())

    async def _answer(self, conn: h11.Connection, status: int, body: bytes, *, close: bool = False) -> None:
        if conn.our_state is not h11.SEND_RESPONSE:
            return
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"cache-control", b"no-store")]  # fmt: skip
        if close:
            headers.append((b"connection", b"close"))
        out = conn.send(h11.Response(status_code=status, headers=headers)) or b""
        out += conn.send(h11.Data(data=body)) or b""
        out += conn.send(h11.EndOfMessage()) or b""
        await self._send(out)

    async def _handle(self, conn: h11.Connection, rec: _Record, head: RequestHead, method: str) -> bool:
        try:
            authority = request_authority(head.target, head.host, tls=True)
        except AuthorityError as exc:
            rec.fields["decision"] = "deny"
            raise _Cut(ErrorCode.INVALID_REQUEST, str(exc), reason=OutcomeReason.INVALID_AUTHORITY) from None
        if not same_authority(authority, INFERENCE_HOST, PORT):
            rec.fields["decision"] = "deny"
            raise _Cut(ErrorCode.REQUEST_AUTHORITY_MISMATCH, f"this connection serves {INFERENCE_HOST} only",
                       reason=OutcomeReason.REQUEST_AUTHORITY_MISMATCH)  # fmt: skip
        match = match_shape(method, head.target)
        if match is None:
            rec.fields.update(decision="deny", path=head.target.partition("?")[0][:200])
            raise _Cut(ErrorCode.INFERENCE_PATH_DENIED, f"{method} {head.target.partition('?')[0][:200]} is not an "
                       "inference request shape (chat/completions, completions, responses, embeddings, messages, "
                       "models)", reason=OutcomeReason.INFERENCE_PATH_DENIED)  # fmt: skip
        rec.fields.update(shape=str(match.shape))
        routes = self.router.store.current
        visible = routes.visible(self.identity, relaxed=self.router.relaxed)
        if match.shape in (Shape.MODELS, Shape.MODEL):
            return await self._models(conn, rec, head, match, visible)
        return await self._forward(conn, rec, head, match, routes)

    async def _models(self, conn: h11.Connection, rec: _Record, head: RequestHead, match: ShapeMatch,
                      visible: list[Route]) -> bool:  # fmt: skip
        if head.chunked or head.content_length:
            rec.fields["decision"] = "deny"
            raise _Cut(ErrorCode.INVALID_REQUEST, "a models request has no body", reason=OutcomeReason.INFERENCE_BODY)
        if match.shape is Shape.MODEL:
            assert match.model_id is not None
            rec.fields["model"] = match.model_id[:256]
            body = model_entry_body(visible, match.model_id)
            if body is None:
                rec.fields["decision"] = "deny"
                raise _Cut(ErrorCode.INFERENCE_MODEL_DENIED, f"model {match.model_id[:256]!r} is not served to this "
                           "caller", reason=OutcomeReason.INFERENCE_MODEL_DENIED)  # fmt: skip
        else:
            body = models_body(visible)
        rec.fields["status"] = 200
        rec.bytes_down = len(body)
        await self._answer(conn, 200, body)
        return True

    async def _read_body(self, conn: h11.Connection, rec: _Record, head: RequestHead) -> bytes:
        limit = self.limits.max_request
        if head.content_length is not None and head.content_length > limit:
            rec.fields["decision"] = "deny"
            raise _Cut(ErrorCode.REQUEST_TOO_LARGE, f"an inference request is at most {limit} bytes",
                       reason=OutcomeReason.INFERENCE_REQUEST_TOO_LARGE)  # fmt: skip
        if "100-continue" in head.tokens("expect") and conn.they_are_waiting_for_100_continue:
            await self._send(conn.send(h11.InformationalResponse(status_code=100, headers=[])))
        body = bytearray()
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                rec.fields["decision"] = "deny"
                raise _Cut(ErrorCode.INVALID_REQUEST, f"malformed request body: {exc}"[:200],
                           reason=OutcomeReason.INVALID_BODY) from None  # fmt: skip
            if event is h11.NEED_DATA:
                data = await self._recv(self.limits.idle_timeout)
                if not data:
                    raise _Closed
                conn.receive_data(data)
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > limit:
                    rec.fields["decision"] = "deny"
                    raise _Cut(ErrorCode.REQUEST_TOO_LARGE, f"an inference request is at most {limit} bytes",
                               reason=OutcomeReason.INFERENCE_REQUEST_TOO_LARGE)  # fmt: skip
            elif isinstance(event, h11.EndOfMessage):
                rec.bytes_up = len(body)
                return bytes(body)
            else:
                raise _Closed

    async def _forward(self, conn: h11.Connection, rec: _Record, head: RequestHead, match: ShapeMatch,
                       routes: InferenceRoutes) -> bool:  # fmt: skip
        data = await self._read_body(conn, rec, head)
        try:
            value = read_body(data)
        except BodyInvalid as exc:
            rec.fields["decision"] = "deny"
            raise _Cut(ErrorCode.INVALID_REQUEST, str(exc), reason=OutcomeReason.INFERENCE_BODY) from None
        model = value.model
        rec.fields["model"] = model[:256]
        kind = match.shape.kind
        assert kind is not None
        route = routes.route_for(kind, model)
        if route is None or not route.usable_by(self.identity, relaxed=self.router.relaxed):
            rec.fields["decision"] = "deny"
            why = "is served by no route" if route is None else "is not served to this program (the route's binaries)"
            raise _Cut(ErrorCode.INFERENCE_MODEL_DENIED, f"model {model[:256]!r} {why} for {match.path}",
                       reason=OutcomeReason.INFERENCE_MODEL_DENIED)  # fmt: skip
        rec.fields["route"] = route.name
        credential = next((c for c in self.router.credentials if c.name == route.credential), None)
        if credential is None or credential.secret is None:
            raise _Cut(ErrorCode.CREDENTIAL_UNAVAILABLE, f"route {route.name}: its credential is not available",
                       reason=OutcomeReason.CREDENTIAL_UNAVAILABLE)  # fmt: skip
        body = model_body(value, data, route)
        rec.fields["stream"] = body.stream
        if route.backend_model(model) != model:
            rec.fields["backend_model"] = route.backend_model(model)
        headers = backend_headers(route, credential.secret, head.headers, len(body.data))
        request = h11.Request(method=b"POST", target=route.backend_path(match.path).encode("ascii"), headers=headers)
        upstream = await self._dial(route)
        try:
            return await self._exchange(conn, rec, upstream, request, body.data,
                                        Scrubber([(credential.secret, credential.placeholder)]))  # fmt: skip
        finally:
            await abort_all(upstream)

    async def _dial(self, route: Route) -> trio.abc.Stream:
        cfg = self.router.upstream
        try:
            tcp, _address = await dial_upstream(
                route.host, route.port, cfg, deadline=trio.current_time() + cfg.connect_timeout,
                allowed_ips=route.allowed_ips, host_named_exactly=route.exact_host,
            )  # fmt: skip
        except UpstreamError as exc:
            code = {504: ErrorCode.UPSTREAM_TIMEOUT, 403: ErrorCode.SSRF_DENIED}.get(
                exc.status, ErrorCode.UPSTREAM_UNREACHABLE
            )
            raise _Cut(code,
                       f"route {route.name}: {exc.detail}"[:300], reason=str(exc.reason)) from None  # fmt: skip
        except OSError as exc:
            raise _Cut(ErrorCode.UPSTREAM_UNREACHABLE, f"route {route.name}: {exc}"[:300],
                       reason=str(UpstreamReason.CONNECT_FAILED)) from None  # fmt: skip
        tls = MemoryTLSStream(tcp, self.router.upstream_ssl, server_side=False, server_hostname=route.host)
        try:
            with trio.fail_after(self.limits.handshake_timeout):
                await tls.do_handshake()
            if tls.selected_alpn_protocol() not in (None, "http/1.1"):
                raise _Cut(ErrorCode.UPSTREAM_TLS_FAILED, f"route {route.name}: the backend chose another protocol",
                           reason=OutcomeReason.UPSTREAM_TLS_FAILED)  # fmt: skip
        except (trio.TooSlowError, *_STREAM_ERRORS) as exc:
            await abort_all(tls)
            cause = exc.__cause__ or exc
            what = (
                f"its certificate failed verification: {cause.verify_message or cause.reason}"
                if isinstance(cause, ssl.SSLCertVerificationError)
                else f"TLS failed: {type(cause).__name__}"
            )
            raise _Cut(ErrorCode.UPSTREAM_TLS_FAILED, f"route {route.name}: {what}"[:300],
                       reason=OutcomeReason.UPSTREAM_TLS_FAILED) from None  # fmt: skip
        return tls

    async def _exchange(self, conn: h11.Connection, rec: _Record, upstream: trio.abc.Stream,
                        request: h11.Request, data: bytes, scrub: Scrubber) -> bool:  # fmt: skip
        self._scrub = scrub
        up = h11.Connection(h11.CLIENT, max_incomplete_event_size=64 * 1024)
        out = (up.send(request) or b"") + (up.send(h11.Data(data=data)) or b"") + (up.send(h11.EndOfMessage()) or b"")
        try:
            with trio.fail_after(self.limits.idle_timeout):
                await upstream.send_all(out)
        except (trio.TooSlowError, *_STREAM_ERRORS):
            what = "the backend did not take the request"
            raise _Cut(ErrorCode.UPSTREAM_PROTOCOL_ERROR, what, reason=OutcomeReason.UPSTREAM_FAILED) from None
        sse = False
        started = False
        while True:
            try:
                event = up.next_event()
            except h11.RemoteProtocolError:
                event = None
            if event is None:
                return await self._cut(conn, rec, started, sse, ErrorCode.UPSTREAM_PROTOCOL_ERROR,
                                       "the backend's response is malformed",
                                       OutcomeReason.UPSTREAM_FAILED)  # fmt: skip
            if event is h11.NEED_DATA:
                got: bytes | None = None  # None: nothing came for the idle bound
                with trio.move_on_after(self.limits.idle_timeout):
                    try:
                        got = bytes(await upstream.receive_some(self.limits.chunk))
                    except _STREAM_ERRORS:
                        got = b""  # read as the backend's end: h11 says whether the response was complete
                if got is None:
                    return await self._cut(conn, rec, started, sse, ErrorCode.UPSTREAM_TIMEOUT,
                                           f"the backend sent nothing for {self.limits.idle_timeout:g} s",
                                           "upstream-idle")  # fmt: skip
                up.receive_data(got)
                continue
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                headers = []
                for name, value in event.headers.raw_items():
                    clean = scrub.name(name)
                    if clean != name and not valid_name(clean):
                        return await self._cut(conn, rec, False, False, ErrorCode.UPSTREAM_PROTOCOL_ERROR,
                                               "the backend's response cannot be passed on",
                                               "secret-in-header-name")  # fmt: skip
                    if name.lower() not in _HOP:
                        headers.append((clean, scrub.header(value)))
                if unscrubbable(event.status_code, headers, has_body=True) is not None:
                    return await self._cut(conn, rec, False, False, ErrorCode.UPSTREAM_PROTOCOL_ERROR,
                                           "the backend's response is compressed or partial",
                                           "response-not-scrubbable")  # fmt: skip
                sse = any(n.lower() == b"content-type" and v.lower().startswith(b"text/event-stream")
                          for n, v in headers)  # fmt: skip
                rec.fields["status"] = event.status_code
                if event.status_code >= 400:
                    rec.fields["decision"] = "error"
                started = True
                await self._send(conn.send(h11.Response(status_code=event.status_code, headers=headers,
                                                        reason=scrub.reason(event.reason))))  # fmt: skip
                continue
            if isinstance(event, h11.Data):
                rec.bytes_down += len(event.data)
                if rec.bytes_down > self.limits.max_response:
                    return await self._cut(conn, rec, started, sse, ErrorCode.UPSTREAM_PROTOCOL_ERROR,
                                           f"the backend's response is over {self.limits.max_response} bytes",
                                           "inference-response-too-large")  # fmt: skip
                passed = scrub.feed(event.data)
                if passed:
                    await self._send(conn.send(h11.Data(data=bytes(passed))))
                continue
            if isinstance(event, h11.EndOfMessage):
                tail = scrub.flush()
                out = (conn.send(h11.Data(data=tail)) or b"") if tail else b""
                await self._send(out + (conn.send(h11.EndOfMessage()) or b""))
                if scrub.replaced:
                    rec.fields["secrets_scrubbed"] = scrub.replaced
                return True
            return await self._cut(conn, rec, started, sse, ErrorCode.UPSTREAM_PROTOCOL_ERROR,
                                   "the backend closed inside its response", OutcomeReason.UPSTREAM_FAILED)  # fmt: skip

    async def _cut(self, conn: h11.Connection, rec: _Record, started: bool, sse: bool, code: ErrorCode,
                   message: str, reason: str) -> bool:  # fmt: skip
        """Rule 3's end of an exchange that cannot complete."""
        if not started:
            raise _Cut(code, message, reason=reason)
        rec.fields.update(decision="error", reason=reason, detail=message)
        self.router.counters["failed"] += 1
        self.closed_by = "upstream-cut"
        if not sse:
            self.clean = False
            raise _Closed
        held = self._scrub.flush() if self._scrub is not None else b""  # what the scrubber held back goes first
        await self._send((conn.send(h11.Data(data=held + sse_error(message))) or b"") + (conn.send(h11.EndOfMessage())
                                                                                     or b""))  # fmt: skip
        return False


def _error_type(status: int) -> str:
    return {400: "invalid_request_error", 403: "permission_error", 404: "not_found_error",
            413: ErrorCode.REQUEST_TOO_LARGE, 421: "invalid_request_error"}.get(status, "api_error")  # fmt: skip
