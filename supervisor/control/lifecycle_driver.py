"""The boundary's lifecycle as control drives it over the ops link (docs/reference/boundary.md §1.2, §1.6).

On a fresh boundary control runs ``attach → confirm → start``; on a boundary that is already bound (control
restarted, or the link dropped) it calls ``resume`` instead — never a second attach. While the agent runs,
control keeps a long ``wait`` on it; the result is logged and acknowledged, which lets the boundary exit with the
agent's code. Control keeps that result and answers later operations from it (``api.py``,
``protocol/agent_ended.py``) until it attaches a fresh boundary. Nothing that happens on a link ends the daemon.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import trio

from supervisor.control.boundary_links import BoundaryLinks, LinkFailure, describe_exception
from supervisor.control.canary import FenceCanary
from supervisor.control.certificates import CertificateFacts
from supervisor.control.config import ControlConfig
from supervisor.control.peer import BoundaryPeer
from supervisor.control.policy.model import Policy
from supervisor.control.workload_gone import WorkloadGone
from supervisor.link.h2link import Link
from supervisor.link.rpc import call_typed
from supervisor.protocol.acks import ExitAck, NoArguments, PolicyAck, PolicyAcknowledged
from supervisor.protocol.attach import AttachReply, AttachRequest, CaptureMode, StaticPolicy
from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.event_names import EventName
from supervisor.protocol.exit_result import ExitResult, ExitResultError
from supervisor.protocol.fence_canary import FenceObserved, FenceObservedReply
from supervisor.protocol.fence_report import ConfirmReply, ConfirmRequest
from supervisor.protocol.lifecycle import StartReply, State
from supervisor.protocol.process_ops import WaitRequest
from supervisor.protocol.status import ResumeRequest, StatusReply
from supervisor.protocol.tls import ALPN_OPS

CONFIRM_RETRY_S = 15.0
DEFAULT_CAPTURE_PORTS = (80, 443, 8080, 8443)
MAX_CAPTURE_PORTS = 256


class LifecycleDriver:
    """The ops link's redial loop and what control asks the boundary over it."""

    def __init__(
        self,
        cfg: ControlConfig,
        peer: BoundaryPeer,
        links: BoundaryLinks,
        certificates: CertificateFacts,
        canary: FenceCanary | None,
        workload_gone: WorkloadGone,
    ) -> None:
        self.cfg = cfg
        self.log = cfg.log
        self.policy = cfg.policy
        self.peer = peer
        self.links = links
        self.certificates = certificates
        self.canary = canary
        self.workload_gone = workload_gone
        self._acks, self._ack_queue = trio.open_memory_channel[int](16)
        # the generation every process of control has in force (control/workers); None: this one's, all there is
        self.in_force: Callable[[], int] | None = None

    # -- the ops link -----------------------------------------------------------------------------------------
    async def maintain_ops_link(self) -> None:
        """Dial, drive the lifecycle, follow the agent; on any failure log it once and back off. Nothing that
        happens on a link ends the daemon: control stays up, not ready, and keeps redialling."""
        backoff = self.links.backoffs.new()
        peer = self.peer
        while True:
            failure = LinkFailure()
            try:
                await self._ops_attempt(failure)
            except Exception as exc:  # a bug or a peer we did not foresee: logged, never the daemon's end
                failure.reason = describe_exception(exc)
            finally:
                peer.ops = None
                peer.ops_ready = trio.Event()
                peer.claims_ok = False
                self.workload_gone.lost()
            peer.last_link_error = failure.describe()
            await backoff.sleep(self.links.link_failed(ALPN_OPS, backoff, failure))

    async def _ops_attempt(self, failure: LinkFailure) -> None:
        tls = await self.links.dial(ALPN_OPS, failure)
        if tls is None:
            return
        peer = self.peer
        name = self.links.peer_name
        link = Link(tls, client=True, name=f"ops:{name}")
        async with trio.open_nursery() as nursery:
            await nursery.start(link.run)
            peer.ops = link
            self.workload_gone.seen()
            peer.claims_ok = True
            peer.ops_ready.set()
            self.log.emit(EventName.LINK_UP, peer=name, alpn=ALPN_OPS)
            try:
                await self._drive(link, failure)
                failure.step = "running" if peer.agent_result is None else "agent-exited"
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

    # -- the lifecycle ----------------------------------------------------------------------------------------
    async def _drive(self, link: Link, failure: LinkFailure) -> None:
        failure.step = "status"
        status = await call_typed(link, "/v1/status", NoArguments(), StatusReply)
        if status.state is State.IDLE:
            await self._attach_fresh(link, failure)
        else:
            await self._resume(link, failure)
        failure.step = "status"
        self.peer.reported = await call_typed(link, "/v1/status", NoArguments(), StatusReply)
        failure.step = "running"
        async with trio.open_nursery() as nursery:
            if self._canary_in_use:
                nursery.start_soon(self._watch_canary, link)
            await self._follow_agent(link)
            nursery.cancel_scope.cancel()

    async def _attach_fresh(self, link: Link, failure: LinkFailure) -> None:
        """A fresh boundary: ``attach``, ``confirm``, ``start``."""
        peer = self.peer
        failure.step = "attach"
        try:
            bound = await call_typed(link, "/v1/attach", self._descriptor(), AttachReply)
        except OpError as exc:
            if exc.kind is not ErrorKind.UNAVAILABLE:  # a refused attach ends the boundary (boundary spec §1.2)
                peer.refused = f"{exc.kind}: {exc.reason}" + (f" ({exc.field})" if exc.field else "")
                self.log.emit(EventName.BOUNDARY_REFUSED, step="attach", error=exc.to_json(),
                              reason="the boundary refused the attach descriptor and exits non-zero")  # fmt: skip
            raise
        peer.refused = None
        peer.agent_result = None  # a fresh boundary, a new agent: an earlier one's result no longer answers
        peer.closed_said = False
        self.links.backoffs.reset()  # progress: only a successful attach or resume resets the backoff
        peer.ca_sha256 = self.certificates.interception_ca_sha256
        self.log.emit(EventName.LIFECYCLE_BOUND, reply=bound.to_wire())
        self.links.start_egress_links()
        failure.step = "confirm"
        reply = await self._confirm_observed(link)
        self.log.emit(EventName.LIFECYCLE_READY, fence=reply.fence.to_wire())
        failure.step = "start"
        started = await call_typed(link, "/v1/start", NoArguments(), StartReply)
        self.log.emit(EventName.LIFECYCLE_RUNNING, agent=started.agent)

    async def _resume(self, link: Link, failure: LinkFailure) -> None:
        """A boundary already bound (control restarted, or the link dropped): ``resume``, then the steps it has
        not taken yet."""
        failure.step = "resume"
        ours = self.certificates.interception_ca_sha256
        reply = await call_typed(link, "/v1/resume", ResumeRequest(ours), StatusReply)
        self.links.backoffs.reset()
        state = reply.state
        self.log.emit(EventName.LIFECYCLE_RESUMED, state=str(state))
        self._compare_interception_ca(reply.interception_ca_sha256)
        if state in (State.BOUND, State.READY, State.RUNNING):
            self.links.start_egress_links()
        if state is State.BOUND:
            failure.step = "confirm"
            await self._confirm_observed(link)
        if state in (State.BOUND, State.READY):  # a link lost between confirm and start lands here
            failure.step = "start"
            started = await call_typed(link, "/v1/start", NoArguments(), StartReply)
            self.log.emit(EventName.LIFECYCLE_RUNNING, agent=started.agent)

    def _descriptor(self) -> AttachRequest:
        cfg = self.cfg
        claims = cfg.bundle.claims
        snap = self.policy.snapshot()
        static = StaticPolicy.from_wire(snap.last_valid.policy.static_json())
        return AttachRequest(
            sandbox=claims.sandbox,
            network_policy=claims.network_policy,
            capture_mode=cfg.capture_mode,
            agent_uid=cfg.agent_uid,
            agent_gid=cfg.agent_gid,
            policy_generation=snap.generation if self.in_force is None else self.in_force(),
            static_policy=static,
            acknowledge_external_fence=cfg.acknowledge_external_fence,
            fence_canary=self.canary.target if self.canary is not None else None,
            acknowledge_unprobed_fence=cfg.acknowledge_unprobed_fence,
            capture_ports=capture_ports(snap.last_valid.policy),
            interception_ca_pem=cfg.interception.ca.cert_pem if cfg.interception else None,
            credential_placeholders=cfg.interception.credentials.placeholders() if cfg.interception else {},
        )

    def _compare_interception_ca(self, theirs: object) -> None:
        """After a restart: does the agent trust the CA we mint with? (control/certificates.py)"""
        peer = self.peer
        peer.ca_sha256 = theirs if isinstance(theirs, str) else None
        ours = self.certificates.interception_ca_sha256
        if peer.ca_sha256 is not None and peer.ca_sha256 != ours:
            self.log.emit(EventName.INTERCEPTION_CA_MISMATCH, ours=ours, boundary=peer.ca_sha256,
                          reason="control's interception CA is not the one the agent was given at attach: "
                          "inspected connections will fail verification in the agent (was --interception-ca "
                          "or its Secret replaced?)")  # fmt: skip

    # -- confirm and the fence canary -------------------------------------------------------------------------
    @property
    def _canary_in_use(self) -> bool:
        return self.canary is not None and self.cfg.capture_mode is CaptureMode.PROXY_ENV

    async def _confirm_observed(self, link: Link) -> ConfirmReply:
        """``confirm``; in proxy-env with a canary, one canary round first and its report goes with ``confirm``.
        A fence found not in force ends the boundary: said in our events and /readyz."""
        try:
            request = ConfirmRequest()
            if self._canary_in_use:
                assert self.canary is not None
                request = ConfirmRequest(await self.canary.round(link))
            return await self._confirm(link, request)
        except OpError as exc:
            if exc.kind is ErrorKind.FAILED:  # the boundary found the fence not in force and exits
                self.peer.refused = f"{exc.kind}: {exc.reason}"
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
                await call_typed(link, "/v1/fence-observed", FenceObserved(report), FenceObservedReply)
            except OpError as exc:
                self.log.emit(EventName.FENCE_CANARY_ROUND_FAILED, error=exc.to_json())
                if exc.kind in (ErrorKind.FAILED, ErrorKind.TERMINATED):
                    return  # enforcement lost: _follow_agent's wait returns the agent's result

    async def _confirm(self, link: Link, request: ConfirmRequest) -> ConfirmReply:
        """``confirm`` needs an egress link of ours up (mediation connected): ask once one is up (the boundary
        gives it a moment to register), and again each time one comes up while the boundary says unavailable."""
        peer = self.peer
        with trio.fail_after(CONFIRM_RETRY_S):
            while True:
                if not peer.egress_up:
                    await peer.egress_came_up.wait()
                try:
                    return await call_typed(link, "/v1/confirm", request, ConfirmReply)
                except OpError as exc:
                    if exc.kind is not ErrorKind.UNAVAILABLE or link.closed:
                        raise
                await peer.egress_came_up.wait()

    # -- policy generations and the agent ---------------------------------------------------------------------
    def queue_ack(self, generation: int) -> None:
        """A new policy generation for the boundary to acknowledge (a full queue drops it: a newer generation
        will be acknowledged anyway)."""
        try:
            self._acks.send_nowait(generation)
        except trio.WouldBlock:
            pass

    async def acknowledge_policy(self) -> None:
        """Tell the boundary which policy generation governs it now (it reports it in status)."""
        async for generation in self._ack_queue:
            link = self.peer.ops
            if link is None or link.closed:
                continue
            try:
                await call_typed(link, "/v1/policy-ack", PolicyAck(generation), PolicyAcknowledged)
            except OpError as exc:
                self.log.emit(EventName.POLICY_ACK_FAILED, generation=generation, error=exc.to_json())

    async def _follow_agent(self, link: Link) -> None:
        peer = self.peer
        agent = peer.reported.agent.handle if peer.reported is not None and peer.reported.agent else None
        if agent is None:
            return
        try:
            told = await call_typed(link, "/v1/wait", WaitRequest(agent), ExitResult)
        except ExitResultError as exc:
            raise OpError(ErrorKind.FAILED, f"the boundary's /v1/wait reply: {exc}") from None
        # kept: the API answers every later operation from it, boundary gone or not (protocol/agent_ended.py)
        peer.agent_result = told if told.handle == agent else dataclasses.replace(told, handle=agent)
        result = peer.agent_result.to_wire()
        self.log.emit(EventName.AGENT_EXITED, handle=agent, result=result)
        peer.reported = await call_typed(link, "/v1/status", NoArguments(), StatusReply)
        if peer.reported.enforcement_lost:
            self.log.emit(EventName.ENFORCEMENT_LOST, reason=peer.reported.enforcement_lost, agent_result=result)
        try:
            await call_typed(link, "/v1/agent/exit-ack", NoArguments(), ExitAck)
        except OpError as exc:
            self.log.emit(EventName.AGENT_EXIT_ACK_FAILED, error=exc.to_json())


def capture_ports(policy: Policy) -> tuple[int, ...]:
    """Ports the boundary listens on for transparent capture: every port the policy names, plus the usual web
    ports. Fixed at attach (the listeners exist from then on); proxy-aware clients are not limited by it."""
    ports = set(DEFAULT_CAPTURE_PORTS)
    for rule in policy.network_policies:
        for endpoint in rule.endpoints:
            ports.update(endpoint.ports)
    return tuple(sorted(ports)[:MAX_CAPTURE_PORTS])
