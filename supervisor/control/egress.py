"""Control's egress pipeline: decide, resolve, connect, relay — one CONNECT stream per captured connection.

On ``openshell-egress/1`` links the boundary is the HTTP/2 client: every connection the agent makes arrives
here as a CONNECT stream whose headers carry the destination, how it was captured and the initiating
binary's identity (``supervisor.protocol.egress``). For each one, in order:

1. headers parsed strictly (malformed → 400, nothing dialled);
2. decided against the policy snapshot of this moment (deny by default; the decision names its rule or the
   reason), with binary-digest pinning kept here in control;
3. resolved once and vetted (internal addresses dropped unless the policy names them), then exactly the vetted
   address is dialled — there is no second resolution to rebind (endpoints with L7 rules or a bound
   credential dial lazily, for their first admitted request);
4. answered ``200``; then every endpoint but ``tls: skip`` is inspected (``supervisor.control.l7``): TLS
   terminated, every HTTP request bound to the tunnel's host:port, L7 rules and credentials applied where
   configured, and only bytes that are neither TLS nor HTTP relayed raw (docs/reference/policy.md §3.7, §3.9);
   ``tls: skip`` is relayed both ways with half-close. A refusal is a status and a reason the boundary turns
   into a 403/502 for proxy-aware clients or a reset for transparent ones.

Every decision is one JSON event; an allowed connection's event is written when it closes, with bytes and
duration. Connections admitted under an older policy generation are re-decided when a new generation loads
and cut if it denies them (docs/reference/policy.md §3.15); an inspected one judges its next request under the new
generation.
"""

from __future__ import annotations

import dataclasses
import enum
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address, ip_address
from typing import Protocol

import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
import trio

from supervisor.control.connection_result import ConnectionResult
from supervisor.control.credentials import Credentials
from supervisor.control.dns_answers import DnsAction, plan_answer, read_query
from supervisor.control.dns_answers import reply as dns_reply
from supervisor.control.inference.router import SYNTHETIC_ADDRESS, InferenceRouter
from supervisor.control.l7 import InterceptionCA, inspect
from supervisor.control.l7.record import InspectStats
from supervisor.control.policy import BinaryIdentity, Decision, DigestPins, L4Request, PolicySnapshot, PolicyStore
from supervisor.control.upstream import (
    UpstreamConfig,
    UpstreamError,
    UpstreamReason,
    connect_within,
    resolve,
    vet_addresses,
)
from supervisor.control.upstream import dial as dial_upstream
from supervisor.jsonlog import JsonLog
from supervisor.link.h2link import LinkStream
from supervisor.link.relay import relay
from supervisor.protocol.egress import (
    DNS_PATH,
    CaptureKind,
    EgressHeaderError,
    EgressReply,
    EgressRequest,
    decode_connect_headers,
    decode_dns_request_headers,
    encode_dns_reply_headers,
    encode_reply_headers,
)
from supervisor.protocol.event_names import EventName
from supervisor.protocol.json_value import JsonValue
from supervisor.protocol.outcome_reasons import OutcomeReason

DNS_MAX = 65535
DNS_TTL = 30


@dataclass(slots=True)
class _Live:
    request: EgressRequest
    host: str  # the name it was decided as (a transparent capture's issued name, else the request's host)
    identity: BinaryIdentity | None
    generation: int
    scope: trio.CancelScope
    inspected: bool


@dataclass(slots=True)
class _Target:
    """Where an inspected connection goes: the name it was decided as and that decision (a transparent capture's
    ClientHello may choose another issued name before the upstream is dialled)."""

    name: str | None
    decision: Decision


@dataclass(frozen=True)
class Interception:
    """What HTTP inspection needs: the per-sandbox CA, the credentials, and how upstream TLS is verified."""

    ca: InterceptionCA
    credentials: Credentials
    upstream_ssl: ssl.SSLContext


def _stats_json(stats: InspectStats) -> dict[str, JsonValue]:
    """An inspected connection's counters, as its ``egress`` event carries them."""
    return {k: (str(v) if isinstance(v, enum.Enum) else v) for k, v in dataclasses.asdict(stats).items()}


class SharedState(Protocol):
    """What a worker process asks control's primary (control/workers): the one owner of the TOFU pins and of
    the addresses its DNS answers issued, so that no worker decides looser than one control would."""

    async def ensure_pin(self, identity: BinaryIdentity) -> None:
        """Have the primary's pin for ``identity``'s path in this worker's pins (recorded there if new)."""

    async def issued_names(self, address: str) -> list[str]:
        """The names the primary issued ``address`` for, within their TTL, newest first."""

    async def answer_dns(self, wire: bytes) -> bytes:
        """The primary's answer to one DNS query of the agent (it records what it issues)."""


class EgressService:
    def __init__(
        self,
        store: PolicyStore,
        upstream: UpstreamConfig,
        log: JsonLog,
        *,
        interception: Interception | None = None,
        relaxed: bool = False,
        inference: InferenceRouter | None = None,
        shared: SharedState | None = None,
        pins: DigestPins | None = None,
    ) -> None:
        self.store = store
        self.shared = shared  # set in a worker process: pins and issued names are the primary's
        # inference.local, served without policy evaluation (docs/reference/policy.md §3.16; control/inference)
        self.inference = inference
        # endpoint-only identity (the proxy-pod topology, or --binary-identity=relaxed): identity is logged, never
        # decided on (docs/design.md "The proxy-pod topology")
        self.relaxed = relaxed
        self.upstream = upstream
        self.log = log
        self.interception = interception
        self.pins = pins if pins is not None else DigestPins()
        self._live: dict[int, _Live] = {}
        # Addresses this control handed to the agent's DNS stub, mapped back to the name they answer for: a
        # transparent connection to one of them is decided as that name (docs/design.md "DNS and transparent capture").
        # Several names may share an address (a CDN): each keeps its own expiry, and a TLS connection to the
        # address is served as the one its ClientHello names (``_choose_name``).
        self._issued: dict[str, dict[str, float]] = {}
        self.counters = {"allowed": 0, "denied": 0, "failed": 0, "dns": 0}
        store.subscribe(self._policy_changed)

    # -- the link handler -------------------------------------------------------------------------------------
    def handle(self, stream: LinkStream) -> Awaitable[None]:
        """The link's handler. Not itself a coroutine: it returns the one that serves ``stream``, so a live
        tunnel holds no dispatching frame for its whole life."""
        method = stream.header(":method")
        if method == "CONNECT":
            return self._connect(stream)
        if method == "POST" and stream.header(":path") == DNS_PATH:
            return self._dns(stream)
        return self._reply(stream, EgressReply(400, reason=OutcomeReason.UNKNOWN_EGRESS_REQUEST))

    def _l4(self, host: str, port: int, identity: BinaryIdentity | None) -> L4Request:
        return L4Request(host, port, identity, relaxed=self.relaxed)

    async def _reply(self, stream: LinkStream, reply: EgressReply) -> None:
        await stream.send_headers(encode_reply_headers(reply), end_stream=reply.status != 200, now=True)

    async def _connect(self, stream: LinkStream) -> None:
        with ConnectionResult(self.log, self.counters, None, relaxed=self.relaxed) as result:
            try:
                request = decode_connect_headers(stream.headers)
            except EgressHeaderError as exc:
                result.deny(OutcomeReason.MALFORMED_REQUEST, detail=str(exc))
                await self._reply(
                    stream, EgressReply(400, reason=OutcomeReason.MALFORMED_REQUEST, detail=str(exc)[:200])
                )
                return
            result.request = request
            # Decoded into ``request``: the raw header list (~1.5 KB of strings) is not kept for the tunnel's life.
            stream.headers = []
            await self._serve(stream, request, result)

    async def serve(self, stream: LinkStream, request: EgressRequest) -> None:
        """Decide, resolve, connect and relay one connection. ``stream`` is an egress link's CONNECT stream, or
        control's own proxy listener's client behind the same interface (``control/proxy_listener.py``)."""
        with ConnectionResult(self.log, self.counters, request, relaxed=self.relaxed) as result:
            await self._serve(stream, request, result)

    async def _serve(self, stream: LinkStream, request: EgressRequest, result: ConnectionResult) -> None:
        """Every exit sets ``result``'s outcome; the caller's ``with`` records it (connection_result.py)."""
        if self.inference is not None and self.inference.claims(request):
            await self.inference.serve(stream, request, result)
            return
        identity = BinaryIdentity.of(request.identity)
        names = await self._shared_names(request, identity) if self.shared is not None else None
        snap = self.store.snapshot()
        name = self._issued_name(request, names)
        decision = snap.decide_l4(self._l4(name or request.host, request.port, identity), self.pins)
        result.context(policy_generation=snap.generation, rule=decision.rule, endpoint=decision.endpoint, name=name)
        if not decision.allowed:
            reason = str(decision.reason) if decision.reason else OutcomeReason.DENIED
            result.deny(reason, detail=decision.detail)
            await self._reply(stream, EgressReply(403, reason=reason, rule=decision.rule, detail=decision.detail))
            return
        if decision.l7 or self._needs_credentials(name or request.host, request.port, decision):
            await self._inspect(stream, request, name, decision, snap, result, names=names)
            return
        terminate = self.interception is not None and not decision.tls_skip
        try:
            upstream, address = await self._dial(request, name, decision)
        except OSError as exc:  # before any address is tried (no socket to be had)
            result.fail(UpstreamReason.CONNECT_FAILED, detail=str(exc))
            await self._reply(stream, EgressReply(502, reason=UpstreamReason.CONNECT_FAILED, detail=str(exc)[:500]))
            return
        except UpstreamError as exc:
            # 400 (a host spelling we refuse, such as 2130706433) and 403 (SSRF) refuse what the agent asked
            # for: that is a denial to whoever reads the events, not a failure to get there.
            if exc.status in (400, 403):
                result.deny(str(exc.reason), detail=exc.detail)
            else:
                result.fail(str(exc.reason), detail=exc.detail)
            await self._reply(stream, EgressReply(exc.status, reason=str(exc.reason), detail=exc.detail[:500]))
            return
        if terminate:  # TLS terminated and HTTP bound to this host:port by default (spec §3.7, §3.9)
            await self._inspect(stream, request, name, decision, snap, result, early_upstream=upstream, names=names)
            return
        result.allow(resolved=str(address))
        await self._reply(stream, EgressReply(200, rule=decision.rule))
        key = id(stream)
        with trio.CancelScope() as scope:
            self._live[key] = _Live(request, name or request.host, identity, snap.generation, scope, inspected=False)
            try:
                stats = await relay(stream, upstream, idle_timeout=self.upstream.idle_timeout)
            finally:
                self._live.pop(key, None)
        if scope.cancelled_caught:
            result.closed(closed_by=OutcomeReason.POLICY_REVISION)
            await trio.aclose_forcefully(upstream)
            await stream.reset()
            return
        result.closed(
            bytes_out=stats.bytes_a_to_b, bytes_in=stats.bytes_b_to_a, closed_by=str(stats.closed_by),
            error=stats.error,  # a reset or failure, not a clean close
        )  # fmt: skip

    async def _shared_names(self, request: EgressRequest, identity: BinaryIdentity | None) -> list[str]:
        """In a worker: the primary's pin for the caller's binary (before anything is decided on it), and the
        names the primary issued a transparent connection's address for."""
        assert self.shared is not None
        if identity is not None and not self.relaxed:
            await self.shared.ensure_pin(identity)
        if str(request.capture) != "transparent":
            return []
        return await self.shared.issued_names(request.host)

    def issued_for(self, address: str) -> list[str]:
        """The names this control issued ``address`` for, still within their TTL, newest first."""
        entry = self._issued.get(address)
        if entry is None:
            return []
        now = trio.current_time()
        for name in [n for n, expiry in entry.items() if expiry < now]:
            del entry[name]
        if not entry:
            del self._issued[address]
        return sorted(entry, key=lambda n: entry[n], reverse=True)

    def _issued_names(self, request: EgressRequest) -> list[str]:
        if str(request.capture) != "transparent":
            return []
        return self.issued_for(request.host)

    def _issued_name(self, request: EgressRequest, names: list[str] | None = None) -> str | None:
        """The name a transparent connection is first decided as: the only name issued for its address, or —
        when several share it — the newest the policy allows (the ClientHello may then choose another).
        ``names``: what a worker was told by the primary (``None``: this process issued them)."""
        if names is None:
            names = self._issued_names(request)
        if len(names) <= 1:
            return names[0] if names else None
        snap = self.store.snapshot()
        identity = BinaryIdentity.of(request.identity)
        for name in names:
            if snap.decide_l4(self._l4(name, request.port, identity), self.pins).allowed:
                return name
        return names[0]

    def _chooser(
        self, request: EgressRequest, target: _Target, names: list[str] | None
    ) -> Callable[[str], Decision | None] | None:
        """For a transparent capture: the L4 decision for the name a ClientHello asks for, when this control
        issued that name for the address within its TTL and the policy allows it (``None`` refuses)."""
        if str(request.capture) != "transparent":
            return None
        identity = BinaryIdentity.of(request.identity)

        def choose(sni: str) -> Decision | None:
            if sni not in (names if names is not None else self._issued_names(request)):
                return None
            decision = self.store.snapshot().decide_l4(self._l4(sni, request.port, identity), self.pins)
            if not decision.allowed or decision.tls_skip:
                return None
            target.name, target.decision = sni, decision
            return decision

        return choose

    def _needs_credentials(self, host: str, port: int, decision: Decision) -> bool:
        """A connection to where a credential is bound is inspected even without L7 rules, or the agent's
        placeholder would leave unresolved (spec §3.7); never for ``tls: skip`` endpoints (raw by request)."""
        return (
            self.interception is not None
            and not decision.tls_skip
            and self.interception.credentials.injects_at(host, port)
        )

    async def _dial(
        self, request: EgressRequest, name: str | None, decision: Decision
    ) -> tuple[trio.SocketStream, IPv4Address | IPv6Address]:
        """Resolve once, vet, connect to exactly the vetted address (or to the one we issued for ``name``).

        The one deadline of the attempt is set here, ``connect_timeout`` from now (upstream.py rule 6); running
        out of it is ``connect-timeout`` (504), naming the step it ran out in."""
        deadline = trio.current_time() + self.upstream.connect_timeout
        if name is not None:  # the agent dials an address we issued: that address, vetted, and no other
            vetted = vet_addresses(name, [ip_address(request.host)], allowed_ips=decision.allowed_ips,
                                   host_named_exactly=decision.exact_host, port=request.port,
                                   is_local=self.upstream.is_local)  # fmt: skip
            return await connect_within(name, vetted, request.port, deadline=deadline)
        return await dial_upstream(
            request.host, request.port, self.upstream, deadline=deadline,
            allowed_ips=decision.allowed_ips, host_named_exactly=decision.exact_host,
        )  # fmt: skip

    async def _inspect(
        self, stream: LinkStream, request: EgressRequest, name: str | None, decision: Decision,
        snap: PolicySnapshot, result: ConnectionResult, *, early_upstream: trio.SocketStream | None = None,
        names: list[str] | None = None,
    ) -> None:  # fmt: skip
        """Every endpoint but ``tls: skip``: TLS terminated, every HTTP request bound to the tunnel's authority
        and decided (spec §3.7-§3.13). Endpoints without L7 rules or credentials come with ``early_upstream``
        (dialled already, so a refused destination is answered before the tunnel opens): what is neither TLS
        nor HTTP is relayed raw to it."""
        if self.interception is None:
            reason = OutcomeReason.L7_INSPECTION_UNAVAILABLE
            result.deny(reason)
            if early_upstream is not None:
                await trio.aclose_forcefully(early_upstream)
            detail = "this control was started without HTTP inspection"
            await self._reply(stream, EgressReply(403, reason=reason, rule=decision.rule, detail=detail))
            return
        result.allow(inspected=True)
        await self._reply(stream, EgressReply(200, rule=decision.rule))

        resolved: list[str] = [str(early_upstream.socket.getpeername()[0])] if early_upstream is not None else []

        target = _Target(name, decision)

        async def connect_upstream() -> trio.abc.HalfCloseableStream:
            upstream, address = await self._dial(request, target.name, target.decision)
            resolved.append(str(address))
            return upstream

        identity = BinaryIdentity.of(request.identity)

        def current(host: str, port: int) -> tuple[PolicySnapshot, Decision]:
            now = self.store.snapshot()
            return now, now.decide_l4(self._l4(host, port, identity), self.pins)

        # An absolute-form request is HTTP by construction (the boundary parsed its head): decided as HTTP, never
        # by which of the agent's and the origin's first bytes arrive first (that race would make a non-HTTP
        # origin's bytes sometimes a raw answer, sometimes a 502).
        tls = False if request.capture is CaptureKind.HTTP_FORWARD else None
        key = id(stream)
        fields = {"conn_id": request.conn_id, "binary": request.identity.binary_path if request.identity else None}
        with trio.CancelScope() as scope:
            self._live[key] = _Live(request, name or request.host, identity, snap.generation, scope, inspected=True)
            try:
                stats = await inspect(
                    stream, host=name or request.host, port=request.port, tls=tls, snapshot=snap, l4=decision,
                    connect_upstream=connect_upstream, ca=self.interception.ca,
                    credentials=self.interception.credentials, upstream_ssl=self.interception.upstream_ssl,
                    log=self.log, event_fields=fields,
                    is_current=self.store.is_current, current=current,
                    raw_fallback=early_upstream is not None, early_upstream=early_upstream,
                    choose_name=self._chooser(request, target, names),
                )  # fmt: skip
            finally:
                self._live.pop(key, None)
                result.closed(resolved=resolved[0] if resolved else None)
        if scope.cancelled_caught:
            result.closed(closed_by=OutcomeReason.POLICY_REVISION)
            return
        result.closed(closed_by=stats.closed_by, bytes_out=stats.bytes_up, bytes_in=stats.bytes_down,
                      error=stats.error, stats=_stats_json(stats))  # fmt: skip

    # -- policy revisions -------------------------------------------------------------------------------------
    def _policy_changed(self, snap: PolicySnapshot) -> None:
        """Re-decide every live connection under the new generation; cut the ones it no longer allows."""
        for live in list(self._live.values()):
            decision: Decision = snap.decide_l4(self._l4(live.host, live.request.port, live.identity))
            # an inspected session re-decides each next request itself (it adopts the new generation); a raw
            # relay is cut when the new policy wants the connection inspected
            wants_inspection = decision.l7 or (self.interception is not None and not decision.tls_skip)
            if decision.allowed and (live.inspected or not wants_inspection):
                live.generation = snap.generation
                continue
            if decision.allowed:
                reason: str = OutcomeReason.INSPECTION_REQUIRED
            else:
                reason = str(decision.reason) if decision.reason else OutcomeReason.DENIED
            self.log.emit(
                EventName.EGRESS_REVOKED, destination=live.request.authority, conn_id=live.request.conn_id,
                admitted_generation=live.generation, policy_generation=snap.generation, reason=reason,
            )  # fmt: skip
            live.scope.cancel()

    @property
    def live_connections(self) -> int:
        return len(self._live)

    # -- DNS ----------------------------------------------------------------------------------------------------
    async def _dns(self, stream: LinkStream) -> None:
        self.counters["dns"] += 1
        try:
            length = decode_dns_request_headers(stream.headers)
        except EgressHeaderError as exc:
            await self._reply(
                stream, EgressReply(400, reason=OutcomeReason.MALFORMED_DNS_REQUEST, detail=str(exc)[:200])
            )
            return
        wire = await stream.read_all(min(length, DNS_MAX))
        if self.shared is not None:  # a worker: the primary answers, and records what it issues
            await self._dns_answer(stream, await self.shared.answer_dns(wire))
            return
        await self._dns_answer(stream, await self.answer_wire(wire))

    async def answer_wire(self, wire: bytes) -> bytes:
        """One DNS query's answer, as bytes (FORMERR for a query that cannot be read)."""
        query = read_query(wire)
        if query is None:
            return wire[:2] + b"\x81\x01" + b"\x00" * 8 if len(wire) >= 2 else b""
        response = await self.answer(query)
        return bytes(response.to_wire())

    async def _dns_answer(self, stream: LinkStream, wire: bytes) -> None:
        await stream.send_headers(encode_dns_reply_headers(len(wire)))
        await stream.send_all(wire)
        await stream.send_eof()

    async def answer(self, query: dns.message.Message) -> dns.message.Message:
        """Answer only names some endpoint of the current policy could allow; never forward the others
        (``dns_answers`` has the table: REFUSED, NOTIMP, NODATA for AAAA without IPv6 egress)."""
        snap = self.store.snapshot()
        plan = plan_answer(
            query, eligible=lambda n: snap.policy is not None and bool(snap.policy.endpoints_for_name(n)),
            ipv6_egress=self.upstream.ipv6_egress(), inference=self.inference is not None,
        )  # fmt: skip
        response = dns_reply(query, plan.rcode)
        if plan.action is DnsAction.SYNTHETIC:  # inference.local: the router's fixed address, nothing resolved
            question = query.question[0]
            response.answer.append(dns.rrset.from_text_list(question.name, DNS_TTL, "IN", question.rdtype,
                                                            [SYNTHETIC_ADDRESS]))  # fmt: skip
            self.log.emit(EventName.DNS, name=plan.name, qtype=plan.qtype, decision=str(plan.action),
                          addresses=[SYNTHETIC_ADDRESS])  # fmt: skip
            return response
        if plan.action is not DnsAction.RESOLVE:
            self.log.emit(
                EventName.DNS, name=plan.name, qtype=plan.qtype, decision=str(plan.action), reason=plan.reason
            )
            return response
        question = query.question[0]
        name = plan.name
        assert name is not None
        endpoints = snap.policy.endpoints_for_name(name) if snap.policy is not None else []
        allowed_ips = [ip for cep in endpoints for ip in cep.endpoint.allowed_ips]
        exact = any(cep.host_glob is None for cep in endpoints)
        try:
            addresses = vet_addresses(
                name,
                await resolve(name, self.upstream),
                allowed_ips=allowed_ips,
                host_named_exactly=exact,
                strict=False,
                is_local=self.upstream.is_local,
            )
        except UpstreamError as exc:
            response.set_rcode(dns.rcode.NXDOMAIN if exc.reason is UpstreamReason.NXDOMAIN else dns.rcode.SERVFAIL)
            self.log.emit(EventName.DNS, name=name, decision="failed", reason=str(exc.reason))
            return response
        version = 4 if question.rdtype == dns.rdatatype.A else 6
        texts = [str(a) for a in addresses if a.version == version]
        expiry = trio.current_time() + DNS_TTL * 4
        for text in texts:
            self._issued.setdefault(text, {})[name] = expiry
        if texts:
            response.answer.append(dns.rrset.from_text_list(question.name, DNS_TTL, "IN", question.rdtype, texts))
        self.log.emit(EventName.DNS, name=name, qtype=dns.rdatatype.to_text(question.rdtype), decision="answered",
                      addresses=texts)  # fmt: skip
        return response
