"""The control daemon: holds the policy, dials the boundary, drives its lifecycle, serves the operator API.

Size (over ~500 lines on purpose): the lifecycle driver, the links, the policy acknowledgements and status share the
daemon's state; the API, the egress pipeline and the policy store are modules of their own.

Control always dials; the boundary only listens. The ops link is redialled with capped exponential backoff
whenever it drops. On a fresh boundary control runs ``attach → confirm → start``; on a boundary that is
already bound (control restarted, or the link dropped) it calls ``resume`` instead — never a second attach.
While the agent runs, control keeps a long ``wait`` on it; the result is logged and acknowledged, which lets
the boundary exit with the agent's code. Control keeps that result and answers later operations from it
(``api.py``, ``protocol/agent_ended.py``) until it attaches a fresh boundary.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import signal
import ssl
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from supervisor.control.api import ApiServer
from supervisor.control.canary import FenceCanary
from supervisor.control.certificates import CertificateFacts, expiring
from supervisor.control.denials import DenialTable
from supervisor.control.dialer import Backoff, BackoffGroup
from supervisor.control.egress import EgressService, Interception
from supervisor.control.events import EventBuffer
from supervisor.control.inference.router import SYNTHETIC_ADDRESS, InferenceLimits, InferenceRouter
from supervisor.control.inference.routes import InferenceRoutes
from supervisor.control.inference.store import RoutesStore, watch_routes_file
from supervisor.control.l7.rewrite import redact_path
from supervisor.control.local_net import LocalNetwork
from supervisor.control.metrics import ControlMetrics
from supervisor.control.policy import PolicyStore
from supervisor.control.proxy_listener import ProxyListenConfig, ProxyListener
from supervisor.control.upstream import UpstreamConfig
from supervisor.control.workload_gone import DEFAULT_GONE_AFTER_S, WorkloadGone
from supervisor.jsonlog import JsonLog
from supervisor.link.h2link import Link
from supervisor.link.rpc import call
from supervisor.link.socket_tls import SocketTLSStream
from supervisor.link.tls_link import Refused, dial_link
from supervisor.protocol.agent_ended import why_ended
from supervisor.protocol.attach import AttachRequest, CaptureMode, StaticPolicy
from supervisor.protocol.certs import Bundle, BundleError, read_policy_digest
from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.event_names import EventName
from supervisor.protocol.event_record import Event
from supervisor.protocol.exit_codes import ExitCode
from supervisor.protocol.exit_result import ExitResult, ExitResultError
from supervisor.protocol.fence_canary import REPEAT_S
from supervisor.protocol.fingerprint import certificate_fingerprint
from supervisor.protocol.lifecycle import State
from supervisor.protocol.tls import ALPN_EGRESS, ALPN_OPS, client_context

EGRESS_LINKS = 2  # a few long-lived links; HTTP/2 multiplexes every captured connection over them
CONFIRM_RETRY_S = 15.0
AGENT_END_REDIAL_S = 1.0  # the first redial after the agent ended and the boundary closed its links
DEFAULT_CAPTURE_PORTS = (80, 443, 8080, 8443)
MAX_CAPTURE_PORTS = 256


@dataclass
class LinkFailure:
    """Why one link attempt ended: the step it reached, the field a refusal named (never a value), the reason."""

    step: str = "dial"
    field: str | None = None
    reason: str = "link ended"

    def describe(self) -> str:
        where = f" field={self.field}" if self.field else ""
        return f"{self.step}:{where} {self.reason}"


def _describe(exc: BaseException) -> str:
    """An unexpected exception for a log line: the one inside a nursery's group, type and message."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


@dataclass
class ControlConfig:
    bundle: Bundle
    boundary_host: str
    boundary_port: int
    policy: PolicyStore
    api_path: Path
    api_listen: tuple[str, int] | None = None  # the operator API on TCP + mTLS too (--api-listen; api_tls.py)
    metrics_listen: tuple[str, int] | None = None  # /metrics for Prometheus (--metrics-listen; supervisor/metrics.py)
    agent_uid: int = 1000
    agent_gid: int = 1000
    capture_mode: CaptureMode = CaptureMode.NETNS
    acknowledge_external_fence: bool = False
    # proxy-env: control's fence canary (--fence-canary; protocol/fence_canary.py), or the acknowledgement that
    # there is none (--acknowledge-unprobed-fence); the canary round repeats every canary_interval_s
    fence_canary: tuple[str, int] | None = None
    acknowledge_unprobed_fence: bool = False
    canary_interval_s: float = REPEAT_S
    policy_file: Path | None = None  # watched for revisions (None: the policy is loaded once)
    policy_watch_reason: str = ""  # why it is watched or not, for the policy.watch event
    agent_writable: tuple[str, ...] = ()  # resolved paths the agent can write (the watch re-checks against them)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    interception: Interception | None = None
    policy_digest: str | None = None  # sha256:<hex> of the policy loaded at start (status: rendered or not)
    egress_links: int = EGRESS_LINKS
    # control's own addresses and IPv6 egress, watched (None: not watched; tests that drive the daemon directly)
    local_net: LocalNetwork | None = None
    # the proxy-pod topology (docs/design.md "The proxy-pod topology"): control serves the workload's proxy
    # itself; no boundary is dialled. ``relaxed``: endpoint-only identity (required by proxy-pod)
    proxy: ProxyListenConfig | None = None
    relaxed_identity: bool = False
    networkpolicy_acknowledged: bool = False
    workload_gone_after_s: float = DEFAULT_GONE_AFTER_S  # --workload-gone-after: readyz and status say so
    # inference.local (--inference-routes; control/inference): the routes at start, the file watched for revisions
    # (None: not watched) and why, and the router's bounds
    inference_routes: InferenceRoutes | None = None
    inference_file: Path | None = None
    inference_watch_reason: str = ""
    inference_limits: InferenceLimits = field(default_factory=InferenceLimits)
    log: JsonLog = field(default_factory=lambda: JsonLog("control"))


class ControlDaemon:
    def __init__(self, cfg: ControlConfig) -> None:
        self.cfg = cfg
        self.log = cfg.log
        self.events = EventBuffer()  # every event control logs, recent ones served by GET /v1/events
        self.denials = DenialTable()  # what the policy advisor reads (GET /v1/denials, control/denials.py)
        self.log.tap = self._tap
        # every event also moves the metrics and §4.3 activity counters (control/metrics.py), served or not
        self.metrics = ControlMetrics(cfg.policy, self.log, live=lambda: self.egress.live_connections,
                                      links=self._links_up)  # fmt: skip
        self.log.sink = self.metrics.observe
        if cfg.interception is not None:  # placeholders the agent spells in a binary's name or a host: [CREDENTIAL]
            self.log.scrub = functools.partial(redact_path, cfg.interception.credentials)
        self.policy = cfg.policy
        self.ops: Link | None = None
        self.ops_ready = trio.Event()
        self.boundary: dict[str, Any] = {}  # last status the boundary reported
        self.peer_claims_ok = False
        self.agent_result: ExitResult | None = None
        self._closed_said = False  # link.closed was logged for this agent's end
        self.last_link_error: str | None = None
        self.boundary_refused: str | None = None  # the boundary refused our attach (and exits): why
        claims = cfg.bundle.claims
        self.workload_gone = WorkloadGone(cfg.workload_gone_after_s, claims.namespace, claims.sandbox_uid)
        self.inference = self._inference_router(cfg)
        self.egress = EgressService(
            cfg.policy,
            cfg.upstream,
            self.log,
            interception=cfg.interception,
            relaxed=cfg.relaxed_identity,
            inference=self.inference,
        )
        self.proxy = ProxyListener(cfg.proxy, self.egress, self.log) if cfg.proxy is not None else None
        self.egress_up = 0
        self._egress_came_up = trio.Event()  # set (and replaced) whenever one of our egress links comes up
        self._egress_started = False
        self._nursery: trio.Nursery | None = None
        self._acks, self._ack_queue = trio.open_memory_channel[int](16)
        self._backoffs = BackoffGroup()
        self.policy.subscribe(self._policy_changed)
        self.certificates = certificate_facts(cfg)
        self.boundary_ca_sha256: str | None = None  # the interception CA the boundary (the agent) trusts
        self.canary = FenceCanary(*cfg.fence_canary, log=self.log) if cfg.fence_canary is not None else None

    def _inference_router(self, cfg: ControlConfig) -> InferenceRouter | None:
        if cfg.inference_routes is None or cfg.interception is None:
            return None
        store = RoutesStore(cfg.inference_routes, cfg.interception.credentials, self.log)
        store.watching = cfg.inference_watch_reason
        return InferenceRouter(store, credentials=cfg.interception.credentials, ca=cfg.interception.ca,
                               upstream_ssl=cfg.interception.upstream_ssl, upstream=cfg.upstream, log=self.log,
                               limits=cfg.inference_limits, relaxed=cfg.relaxed_identity)  # fmt: skip

    @property
    def topology(self) -> str:
        return "proxy-pod" if self.cfg.proxy is not None else "boundary"

    @property
    def sandbox(self) -> str:
        return self.cfg.bundle.claims.sandbox

    async def serve(self) -> int:
        self.events.bind()
        api = ApiServer(self, self.cfg.api_path, log=self.log)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self.cfg.local_net is not None:  # read before any upstream dial: never dial ourselves
                await nursery.start(self.cfg.local_net.watch)
            await nursery.start(api.serve)
            if self.cfg.api_listen is not None:
                from supervisor.control.api_tls import TlsApiListener

                host, port = self.cfg.api_listen
                await nursery.start(TlsApiListener(api, host, port, self.cfg.bundle, log=self.log).serve)
            if self.cfg.metrics_listen is not None:
                from supervisor.metrics import PATH as METRICS_PATH
                from supervisor.metrics import MetricsServer

                host, port = self.cfg.metrics_listen
                address = await nursery.start(MetricsServer(self.metrics.registry, host, port).serve)
                self.log.emit(EventName.METRICS_LISTENING, address=address, path=METRICS_PATH)
            nursery.start_soon(self._signals, nursery)
            self._log_topology()
            if self.proxy is not None:  # proxy-pod: no boundary to dial, the workload connects to us
                await nursery.start(self.proxy.serve)
            else:
                if self.canary is not None:  # listening before any descriptor names it
                    await nursery.start(self.canary.serve)
                nursery.start_soon(self._acknowledge_policy)
                nursery.start_soon(self._maintain_ops_link)
            nursery.start_soon(self._watch_certificates)
            self.log.emit(EventName.POLICY_WATCH, watching=self.cfg.policy_file is not None,
                          reason=self.cfg.policy_watch_reason)  # fmt: skip
            if self.cfg.policy_file is not None:
                from supervisor.control.policy import watch_policy_file
                from supervisor.control.policy.watch_safety import watch_guard

                def unsafe(reason: str) -> None:
                    self.log.emit(EventName.POLICY_WATCH, watching=False, reason=f"stopped: {reason}")

                nursery.start_soon(functools.partial(
                    watch_policy_file, self.cfg.policy_file, self.policy,
                    guard=watch_guard(self.cfg.policy_file, self.cfg.agent_writable), on_unsafe=unsafe,
                ))  # fmt: skip
            if self.inference is not None:
                routes = self.inference.store.current
                self.log.emit(EventName.INFERENCE_ROUTES, generation=0, status="loaded", source=routes.source,
                              routes=sorted(r.name for r in routes.routes), address=SYNTHETIC_ADDRESS,
                              watching=self.cfg.inference_file is not None,
                              watch=self.cfg.inference_watch_reason)  # fmt: skip
                if self.cfg.inference_file is not None:
                    from supervisor.control.policy.watch_safety import watch_guard

                    nursery.start_soon(functools.partial(
                        watch_routes_file, self.inference.store, self.cfg.inference_file,
                        guard=watch_guard(self.cfg.inference_file, self.cfg.agent_writable),
                    ))  # fmt: skip
        self.log.emit(EventName.CONTROL_EXIT)
        return 0

    def _log_topology(self) -> None:
        fields: dict[str, Any] = {"topology": self.topology, "identity": "relaxed" if self.cfg.relaxed_identity
                                  else "binary"}  # fmt: skip
        if self.proxy is not None:
            fields["networkpolicy_enforcement"] = "acknowledged" if self.cfg.networkpolicy_acknowledged else None
        self.log.emit(EventName.TOPOLOGY, **fields)
        policy = self.policy.snapshot().last_valid.policy
        if self.cfg.relaxed_identity and any(rule.binaries for rule in policy.network_policies):
            self.log.emit(EventName.POLICY_IDENTITY_RELAXED, level="warning",
                          reason=f"binary identity is relaxed ({self.topology} topology): the policy's binaries "
                          "lists are ignored; only destinations are decided")  # fmt: skip

    async def _signals(self, nursery: trio.Nursery) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                self.log.emit(EventName.CONTROL_SIGNAL, signal=signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                return

    # -- the ops link ---------------------------------------------------------------------------------------
    @property
    def _peer(self) -> str:
        return f"{self.cfg.boundary_host}:{self.cfg.boundary_port}"

    def _link_failed(self, alpn: str, backoff: Backoff, failure: LinkFailure, **extra: Any) -> float:
        """The one log line of one failed link (docs/quickstart.md "When the link fails"); returns the delay to wait.

        Once the agent's result is in, the boundary closing its links is how a sandbox ends, not a failure: one
        ``link.closed`` line says so for all of them, and the first redial waits ``AGENT_END_REDIAL_S`` (dev mode
        stops control meanwhile; a pod's control redials a boundary that may come back, failures logged again).
        """
        if self.agent_result is not None and failure.step in ("agent-exited", "serving"):
            if not self._closed_said:
                self._closed_said = True
                self.log.emit(EventName.LINK_CLOSED, peer=self._peer, reason=f"{why_ended(self.agent_result)}; the "
                              "boundary closed its links")  # fmt: skip
            return AGENT_END_REDIAL_S
        delay = backoff.advance()
        self.log.emit(
            EventName.LINK_FAILED, peer=self._peer, alpn=alpn, step=failure.step, field=failure.field,
            reason=failure.reason, retry_in_s=round(delay, 3), **extra,
        )  # fmt: skip
        return delay

    async def _dial(self, alpn: str, failure: LinkFailure) -> SocketTLSStream | None:
        """One dial; a refusal (connect, handshake, claims: ours of the boundary's) is recorded in ``failure``."""
        failure.step = "dial"
        try:
            ctx = client_context(self.cfg.bundle, (alpn,))
            tls, _claims = await dial_link(self.cfg.boundary_host, self.cfg.boundary_port, ctx, self.cfg.bundle, alpn)
        except Refused as exc:
            failure.step = "connect" if exc.field is None else "handshake"
            failure.field, failure.reason = exc.field, exc.reason
            return None
        except (BundleError, ssl.SSLError, OSError) as exc:  # our own bundle became unreadable
            failure.field, failure.reason = "bootstrap", str(exc)
            return None
        return tls

    async def _maintain_ops_link(self) -> None:
        """Dial, drive the lifecycle, follow the agent; on any failure log it once and back off. Nothing that
        happens on a link ends the daemon: control stays up, not ready, and keeps redialling."""
        backoff = self._backoffs.new()
        while True:
            failure = LinkFailure()
            try:
                await self._ops_attempt(failure)
            except Exception as exc:  # a bug or a peer we did not foresee: logged, never the daemon's end
                failure.reason = _describe(exc)
            finally:
                self.ops = None
                self.ops_ready = trio.Event()
                self.peer_claims_ok = False
                self.workload_gone.lost()
            self.last_link_error = failure.describe()
            await backoff.sleep(self._link_failed(ALPN_OPS, backoff, failure))

    async def _ops_attempt(self, failure: LinkFailure) -> None:
        tls = await self._dial(ALPN_OPS, failure)
        if tls is None:
            return
        link = Link(tls, client=True, name=f"ops:{self._peer}")
        async with trio.open_nursery() as nursery:
            await nursery.start(link.run)
            self.ops = link
            self.workload_gone.seen()
            self.peer_claims_ok = True
            self.ops_ready.set()
            self.log.emit(EventName.LINK_UP, peer=self._peer, alpn=ALPN_OPS)
            try:
                await self._drive(link, failure)
                failure.step = "running" if self.agent_result is None else "agent-exited"
                await link.wait_closed()
            except OpError as exc:
                failure.reason = f"{exc.kind}: {exc.reason}"
            except trio.TooSlowError:
                failure.reason = f"no reply within {CONFIRM_RETRY_S:g}s"
            if link.closed:  # the link's own account (a GOAWAY naming the field, a TLS alert) beats the call's
                failure.reason = link.close_reason or failure.reason
                failure.field = link.refused_field
            await link.aclose()
            nursery.cancel_scope.cancel()

    def _descriptor(self) -> AttachRequest:
        claims = self.cfg.bundle.claims
        snap = self.policy.snapshot()
        static = StaticPolicy.from_wire(snap.last_valid.policy.static_json())
        return AttachRequest(
            sandbox=claims.sandbox,
            network_policy=claims.network_policy,
            capture_mode=self.cfg.capture_mode,
            agent_uid=self.cfg.agent_uid,
            agent_gid=self.cfg.agent_gid,
            policy_generation=snap.generation,
            static_policy=static,
            acknowledge_external_fence=self.cfg.acknowledge_external_fence,
            fence_canary=self.canary.target if self.canary is not None else None,
            acknowledge_unprobed_fence=self.cfg.acknowledge_unprobed_fence,
            capture_ports=capture_ports(snap.last_valid.policy),
            interception_ca_pem=self.cfg.interception.ca.cert_pem if self.cfg.interception else None,
            credential_placeholders=self.cfg.interception.credentials.placeholders() if self.cfg.interception else {},
        )

    async def _drive(self, link: Link, failure: LinkFailure) -> None:
        failure.step = "status"
        status = await call(link, "/v1/status")
        if _peer_state(status) is State.IDLE:
            failure.step = "attach"
            try:
                reply = await call(link, "/v1/attach", self._descriptor().to_wire())
            except OpError as exc:
                if exc.kind is not ErrorKind.UNAVAILABLE:  # a refused attach ends the boundary (boundary spec §1.2)
                    self.boundary_refused = f"{exc.kind}: {exc.reason}" + (f" ({exc.field})" if exc.field else "")
                    self.log.emit(EventName.BOUNDARY_REFUSED, step="attach", error=exc.to_json(),
                                  reason="the boundary refused the attach descriptor and exits non-zero")  # fmt: skip
                raise
            self.boundary_refused = None
            self.agent_result = None  # a fresh boundary, a new agent: an earlier one's result no longer answers
            self._closed_said = False
            self._backoffs.reset()  # progress: only a successful attach or resume resets the backoff
            self.boundary_ca_sha256 = self.certificates.interception_ca_sha256
            self.log.emit(EventName.LIFECYCLE_BOUND, reply=reply)
            self._start_egress_links()
            failure.step = "confirm"
            reply = await self._confirm_observed(link)
            self.log.emit(EventName.LIFECYCLE_READY, fence=reply.get("fence"))
            failure.step = "start"
            reply = await call(link, "/v1/start")
            self.log.emit(EventName.LIFECYCLE_RUNNING, agent=reply.get("agent"))
        else:
            failure.step = "resume"
            ours = self.certificates.interception_ca_sha256
            reply = await call(link, "/v1/resume", {"interception_ca_sha256": ours})
            self._backoffs.reset()
            self.log.emit(EventName.LIFECYCLE_RESUMED, state=reply.get("state"))
            state = _peer_state(reply)
            self._compare_interception_ca(reply.get("interception_ca_sha256"))
            if state in (State.BOUND, State.READY, State.RUNNING):
                self._start_egress_links()
            if state is State.BOUND:
                failure.step = "confirm"
                await self._confirm_observed(link)
            if state in (State.BOUND, State.READY):  # a link lost between confirm and start lands here
                failure.step = "start"
                reply = await call(link, "/v1/start")
                self.log.emit(EventName.LIFECYCLE_RUNNING, agent=reply.get("agent"))
        failure.step = "status"
        self.boundary = await call(link, "/v1/status")
        failure.step = "running"
        async with trio.open_nursery() as nursery:
            if self._canary_in_use:
                nursery.start_soon(self._watch_canary, link)
            await self._follow_agent(link)
            nursery.cancel_scope.cancel()

    def _compare_interception_ca(self, theirs: object) -> None:
        """After a restart: does the agent trust the CA we mint with? (control/certificates.py)"""
        self.boundary_ca_sha256 = theirs if isinstance(theirs, str) else None
        ours = self.certificates.interception_ca_sha256
        if self.boundary_ca_sha256 is not None and self.boundary_ca_sha256 != ours:
            self.log.emit(EventName.INTERCEPTION_CA_MISMATCH, ours=ours, boundary=self.boundary_ca_sha256,
                          reason="control's interception CA is not the one the agent was given at attach: "
                          "inspected connections will fail verification in the agent (was --interception-ca "
                          "or its Secret replaced?)")  # fmt: skip

    async def _watch_certificates(self) -> None:
        """One ``certificate.expiring`` event per certificate once it is within the warning (rechecked hourly)."""
        told: set[str] = set()
        while True:
            for name, when in expiring(self.certificates, datetime.datetime.now(datetime.UTC)):
                if name not in told:
                    told.add(name)
                    self.log.emit(EventName.CERTIFICATE_EXPIRING, certificate=name, when=when)
            await trio.sleep(3600)

    @property
    def _canary_in_use(self) -> bool:
        return self.canary is not None and self.cfg.capture_mode is CaptureMode.PROXY_ENV

    async def _confirm_observed(self, link: Link) -> dict[str, Any]:
        """``confirm``; in proxy-env with a canary, one canary round first and its report goes with ``confirm``.
        A fence found not in force ends the boundary: said in our events and /readyz."""
        try:
            body = None
            if self._canary_in_use:
                assert self.canary is not None
                body = {"canary": (await self.canary.round(link)).to_wire()}
            return await self._confirm(link, body)
        except OpError as exc:
            if exc.kind is ErrorKind.FAILED:  # the boundary found the fence not in force and exits
                self.boundary_refused = f"{exc.kind}: {exc.reason}"
                self.log.emit(EventName.BOUNDARY_REFUSED, step="confirm", error=exc.to_json(),
                              reason="the fence is not in force; the boundary exits non-zero")  # fmt: skip
            raise

    async def _watch_canary(self, link: Link) -> None:
        """Every ``canary_interval_s`` after Ready: one canary round, its report to ``/v1/fence-observed``. A
        probe that connects or a connection seen makes the boundary end the workload (enforcement lost)."""
        assert self.canary is not None
        while not link.closed:
            await trio.sleep(self.cfg.canary_interval_s)
            try:
                report = await self.canary.round(link)
                await call(link, "/v1/fence-observed", {"canary": report.to_wire()})
            except OpError as exc:
                self.log.emit(EventName.FENCE_CANARY_ROUND_FAILED, error=exc.to_json())
                if exc.kind in (ErrorKind.FAILED, ErrorKind.TERMINATED):
                    return  # enforcement lost: _follow_agent's wait returns the agent's result

    async def _confirm(self, link: Link, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """``confirm`` needs an egress link of ours up (mediation connected): ask once one is up (the boundary
        gives it a moment to register), and again each time one comes up while the boundary says unavailable."""
        with trio.fail_after(CONFIRM_RETRY_S):
            while True:
                if not self.egress_up:
                    await self._egress_came_up.wait()
                try:
                    return await call(link, "/v1/confirm", body)
                except OpError as exc:
                    if exc.kind is not ErrorKind.UNAVAILABLE or link.closed:
                        raise
                await self._egress_came_up.wait()

    # -- egress links ---------------------------------------------------------------------------------------
    def _start_egress_links(self) -> None:
        if self._egress_started or self._nursery is None:
            return
        self._egress_started = True
        for index in range(self.cfg.egress_links):
            self._nursery.start_soon(self._maintain_egress_link, index)

    async def _maintain_egress_link(self, index: int) -> None:
        """One egress link, redialled with backoff: we dial (TLS client) and serve HTTP/2 on it."""
        backoff = self._backoffs.new()
        while True:
            failure = LinkFailure()
            try:
                tls = await self._dial(ALPN_EGRESS, failure)
                if tls is not None:
                    failure.step = "serving"
                    link = Link(tls, client=False, handler=self.egress.handle, name=f"egress{index}:{self._peer}")
                    self.egress_up += 1
                    self._egress_came_up.set()
                    self._egress_came_up = trio.Event()
                    self.log.emit(EventName.LINK_UP, peer=self._peer, alpn=ALPN_EGRESS, index=index)
                    try:
                        await link.run()
                    finally:
                        self.egress_up -= 1
                    failure.reason, failure.field = link.close_reason or "link ended", link.refused_field
            except Exception as exc:  # never the daemon's end (see _maintain_ops_link)
                failure.reason = _describe(exc)
            await backoff.sleep(self._link_failed(ALPN_EGRESS, backoff, failure, index=index))

    # -- policy generations -----------------------------------------------------------------------------------
    def _policy_changed(self, snap: Any) -> None:
        warnings = {"warnings": [str(w) for w in snap.warnings]} if snap.warnings else {}
        errors = {"errors": [error.to_json() for error in snap.errors]} if snap.errors else {}
        self.log.emit(EventName.POLICY_GENERATION, generation=snap.generation, status=snap.status, source=snap.source,
                      **warnings, **errors)  # fmt: skip
        try:
            self._acks.send_nowait(snap.generation)
        except trio.WouldBlock:
            pass  # a newer generation will be acknowledged anyway

    async def _acknowledge_policy(self) -> None:
        """Tell the boundary which policy generation governs it now (it reports it in status)."""
        async for generation in self._ack_queue:
            link = self.ops
            if link is None or link.closed:
                continue
            try:
                await call(link, "/v1/policy-ack", {"policy_generation": generation})
            except OpError as exc:
                self.log.emit(EventName.POLICY_ACK_FAILED, generation=generation, error=exc.to_json())

    async def _follow_agent(self, link: Link) -> None:
        agent = (self.boundary.get("agent") or {}).get("handle")
        if agent is None:
            return
        reply = await call(link, "/v1/wait", {"handle": agent})
        try:
            told = ExitResult.from_wire(reply)
        except ExitResultError as exc:
            raise OpError(ErrorKind.FAILED, f"the boundary's /v1/wait reply: {exc}") from None
        # kept: the API answers every later operation from it, boundary gone or not (protocol/agent_ended.py)
        self.agent_result = told if told.handle == agent else dataclasses.replace(told, handle=agent)
        result = self.agent_result.to_wire()
        self.log.emit(EventName.AGENT_EXITED, handle=agent, result=result)
        self.boundary = await call(link, "/v1/status")
        if self.boundary.get("enforcement_lost"):
            self.log.emit(EventName.ENFORCEMENT_LOST, reason=self.boundary["enforcement_lost"], agent_result=result)
        try:
            await call(link, "/v1/agent/exit-ack")
        except OpError as exc:
            self.log.emit(EventName.AGENT_EXIT_ACK_FAILED, error=exc.to_json())

    async def refresh_status(self) -> dict[str, Any]:
        link = self.ops
        if link is not None and not link.closed:
            try:
                with trio.move_on_after(2):
                    self.boundary = await call(link, "/v1/status")
            except OpError:
                pass
        return self.boundary

    # -- what the API reports ------------------------------------------------------------------------------
    def _links_up(self) -> dict[str, int]:
        if self.proxy is not None:
            return {}
        return {ALPN_OPS: int(self.ops is not None and not self.ops.closed), ALPN_EGRESS: self.egress_up}

    def activity(self) -> dict[str, Any]:
        """docs/reference/policy.md §4.3's counters since control started (``GET /v1/activity``, ``status``)."""
        return dict(self.metrics.activity.to_json())

    def readiness(self) -> list[str]:
        """The failing conditions; empty means ready (spec §6.6)."""
        failing: list[str] = []
        if not self.policy.ready:
            failing.append(f"policy: {self.policy.status} (generation {self.policy.generation})")
            failing += [f"policy error: {error}" for error in self.policy.last_error or ()]
        if self.proxy is not None:  # proxy-pod: no boundary, no fence of ours; the listener is the service
            if self.proxy.bound is None:
                failing.append("proxy: not listening yet")
            return failing
        if self.boundary_refused is not None:
            failing.append(f"boundary: refused attach ({self.boundary_refused})")
        if self.boundary.get("enforcement_lost"):
            failing.append(f"enforcement lost: {self.boundary['enforcement_lost']}")
        if self.ops is None or self.ops.closed or not self.peer_claims_ok:
            failing.append(f"boundary: not attached ({self.last_link_error or 'no link yet'})")
            gone = self.workload_gone.readiness()
            if gone is not None:
                failing.append(gone)
        state = self.boundary.get("state")
        if state not in (State.READY, State.RUNNING):
            failing.append(f"boundary: state {state or 'unknown'}, need ready or running")
        if not self.boundary.get("fence"):
            failing.append("fence: not confirmed")
        if self.cfg.capture_mode is CaptureMode.NETNS and self.egress_up == 0:
            failing.append("egress: no egress link to the boundary")
        for name, when in expiring(self.certificates, datetime.datetime.now(datetime.UTC)):
            failing.append(f"certificate: {name} {when}")
        ours = self.certificates.interception_ca_sha256
        if self.boundary_ca_sha256 is not None and self.boundary_ca_sha256 != ours:
            failing.append(f"interception: CA {ours} is not the one the agent trusts ({self.boundary_ca_sha256})")
        return failing

    def _interception_status(self) -> dict[str, Any]:
        ours, theirs = self.certificates.interception_ca_sha256, self.boundary_ca_sha256
        return {"ca_sha256": ours, "boundary_ca_sha256": theirs, "match": None if theirs is None else theirs == ours}

    def _tap(self, event: Event) -> None:
        self.events.record(event)
        self.denials.observe(event)

    def denials_json(self, since_ms: int | None) -> dict[str, Any]:
        """``GET /v1/denials``: the aggregated denials and what ``policy suggest`` needs beside them — the policy in
        force (its normalised document) and the paths the agent can write."""
        snap = self.policy.snapshot()
        return {
            **self.denials.to_json(since_ms),
            "policy_generation": snap.generation,
            "policy_status": snap.status,
            "policy": snap.last_valid.policy.to_json(),
            "agent_writable": list(self.cfg.agent_writable),
            "identity": "relaxed" if self.cfg.relaxed_identity else "binary",
        }

    def status(self) -> dict[str, Any]:
        claims = self.cfg.bundle.claims
        return {
            "sandbox": claims.sandbox,
            "namespace": claims.namespace,
            "generation": claims.generation,
            "claims": claims.to_dict(),
            "policy": self.policy.status_json(),
            "link": {
                "up": self.ops is not None and not self.ops.closed,
                "last_error": self.last_link_error,
                "boundary_refused": self.boundary_refused,
                # past --workload-gone-after without a link: since when, and the commands that remove the sandbox
                "workload_gone": None if self.proxy is not None else self.workload_gone.status(),
            },
            "boundary": self.boundary,
            "agent_result": self.agent_result.to_wire() if self.agent_result is not None else None,
            "egress": {"links": self.egress_up, "live": self.egress.live_connections, **self.egress.counters},
            "activity": self.activity(),
            "certificates": self.certificates.to_json(datetime.datetime.now(datetime.UTC)),
            "interception": self._interception_status(),
            "topology": self._topology_status(),
            "fence_canary": self.canary.status() if self.canary is not None else None,
            "inference": self.inference.status() if self.inference is not None else None,
            "ready": not self.readiness(),
        }

    def _topology_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.topology, "identity": "relaxed" if self.cfg.relaxed_identity
                               else "binary"}  # fmt: skip
        if self.proxy is not None:
            out["networkpolicy_enforcement"] = "acknowledged" if self.cfg.networkpolicy_acknowledged else None
            out["proxy"] = self.proxy.status()
        return out


def certificate_facts(cfg: ControlConfig) -> CertificateFacts:
    ca = cfg.interception.ca.certificate if cfg.interception is not None else None
    try:
        rendered = read_policy_digest(cfg.bundle.directory)
    except BundleError as exc:
        cfg.log.emit(EventName.BOOTSTRAP_POLICY_DIGEST_UNREADABLE, reason=str(exc))
        rendered = None
    return CertificateFacts(
        bootstrap_not_after=cfg.bundle.not_after,
        interception_not_after=ca.not_valid_after_utc if ca is not None else None,
        interception_ca_sha256=certificate_fingerprint(ca) if ca is not None else None,
        rendered_policy_digest=rendered,
        started_policy_digest=cfg.policy_digest,
    )


def capture_ports(policy: Any) -> tuple[int, ...]:
    """Ports the boundary listens on for transparent capture: every port the policy names, plus the usual web
    ports. Fixed at attach (the listeners exist from then on); proxy-aware clients are not limited by it."""
    ports = set(DEFAULT_CAPTURE_PORTS)
    for rule in policy.network_policies:
        for endpoint in rule.endpoints:
            ports.update(endpoint.ports)
    return tuple(sorted(ports)[:MAX_CAPTURE_PORTS])


def _peer_state(reply: dict[str, Any]) -> State:
    """The boundary's lifecycle state in a status or resume reply; any other value is the peer's error."""
    try:
        return State(str(reply.get("state")))
    except ValueError:
        raise OpError(ErrorKind.INVALID, f"the boundary reported state {reply.get('state')!r}", field="state") from None


def run(cfg: ControlConfig) -> int:
    try:
        return trio.run(ControlDaemon(cfg).serve)
    except OSError as exc:
        cfg.log.emit(EventName.CONTROL_FAILED, reason=str(exc))
        print(f"openshell-sandbox: control: {exc}", file=sys.stderr)
        return ExitCode.SELF_FAILED
