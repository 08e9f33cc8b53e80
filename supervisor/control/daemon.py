"""The control daemon: holds the policy, dials the boundary, drives its lifecycle, serves the operator API.

Control always dials; the boundary only listens. The ops link is redialled with capped exponential backoff
whenever it drops. On a fresh boundary control runs ``attach → confirm → start``; on a boundary that is
already bound (control restarted, or the link dropped) it calls ``resume`` instead — never a second attach.
While the agent runs, control keeps a long ``wait`` on it; the result is logged and acknowledged, which lets
the boundary exit with the agent's code.
"""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from supervisor.control.api import ApiServer
from supervisor.control.egress import EgressService, Interception
from supervisor.control.policy import PolicyStore
from supervisor.control.upstream import UpstreamConfig
from supervisor.jsonlog import JsonLog
from supervisor.link.h2link import Link
from supervisor.link.rpc import call
from supervisor.link.tls_link import Refused, dial_link
from supervisor.protocol.attach import AttachRequest, CaptureMode
from supervisor.protocol.certs import Bundle
from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.tls import ALPN_EGRESS, ALPN_OPS, client_context

BACKOFF_START_S = 0.05
BACKOFF_MAX_S = 5.0
EGRESS_LINKS = 2  # a few long-lived links; HTTP/2 multiplexes every captured connection over them
CONFIRM_RETRY_S = 15.0
DEFAULT_CAPTURE_PORTS = (80, 443, 8080, 8443)
MAX_CAPTURE_PORTS = 256


@dataclass
class ControlConfig:
    bundle: Bundle
    boundary_host: str
    boundary_port: int
    policy: PolicyStore
    api_path: Path
    agent_uid: int = 1000
    agent_gid: int = 1000
    capture_mode: CaptureMode = CaptureMode.NETNS
    acknowledge_external_fence: bool = False
    policy_file: Path | None = None
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    interception: Interception | None = None
    egress_links: int = EGRESS_LINKS
    log: JsonLog = field(default_factory=lambda: JsonLog("control"))


class ControlDaemon:
    def __init__(self, cfg: ControlConfig) -> None:
        self.cfg = cfg
        self.log = cfg.log
        self.policy = cfg.policy
        self.ops: Link | None = None
        self.ops_ready = trio.Event()
        self.boundary: dict[str, Any] = {}  # last status the boundary reported
        self.peer_claims_ok = False
        self.agent_result: dict[str, Any] | None = None
        self.last_link_error: str | None = None
        self.egress = EgressService(cfg.policy, cfg.upstream, self.log, interception=cfg.interception)
        self.egress_up = 0
        self._egress_started = False
        self._nursery: trio.Nursery | None = None
        self._acks, self._ack_queue = trio.open_memory_channel[int](16)
        self.policy.subscribe(self._policy_changed)

    @property
    def sandbox(self) -> str:
        return self.cfg.bundle.claims.sandbox

    async def serve(self) -> int:
        api = ApiServer(self, self.cfg.api_path, log=self.log)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(api.serve)
            nursery.start_soon(self._acknowledge_policy)
            nursery.start_soon(self._signals, nursery)
            nursery.start_soon(self._maintain_ops_link)
            if self.cfg.policy_file is not None:
                from supervisor.control.policy import watch_policy_file

                nursery.start_soon(watch_policy_file, self.cfg.policy_file, self.policy)
        self.log.emit("control.exit")
        return 0

    async def _signals(self, nursery: trio.Nursery) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                self.log.emit("control.signal", signal=signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                return

    # -- the ops link ---------------------------------------------------------------------------------------
    async def _dial(self, alpn: str) -> trio.SSLStream[trio.SocketStream]:
        """Dial the boundary until a link of kind ``alpn`` is up, with capped exponential backoff. Each refusal
        on authentication grounds (a named field) is logged every time: it is never expected."""
        ctx = client_context(self.cfg.bundle, (alpn,))
        backoff = BACKOFF_START_S
        while True:
            try:
                tls, _claims = await dial_link(
                    self.cfg.boundary_host, self.cfg.boundary_port, ctx, self.cfg.bundle, alpn
                )
                return tls
            except Refused as exc:
                if exc.field is not None:
                    self.log.emit("link.refused", peer=exc.peer, field=exc.field, reason=exc.reason, alpn=alpn)
                if alpn == ALPN_OPS:
                    self.last_link_error = str(exc)
                await trio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def _maintain_ops_link(self) -> None:
        address = f"{self.cfg.boundary_host}:{self.cfg.boundary_port}"
        while True:
            tls = await self._dial(ALPN_OPS)
            self.peer_claims_ok = True
            link = Link(tls, client=True, name=f"ops:{address}")
            async with trio.open_nursery() as nursery:
                await nursery.start(link.run)
                self.ops = link
                self.ops_ready.set()
                self.log.emit("link.up", peer=address, alpn=ALPN_OPS)
                try:
                    await self._drive(link)
                except OpError as exc:
                    self.log.emit("lifecycle.error", error=exc.to_json())
                    if exc.kind in (ErrorKind.FAILED, ErrorKind.INVALID, ErrorKind.DENIED):
                        await trio.sleep(BACKOFF_MAX_S)
                await link.wait_closed()
                nursery.cancel_scope.cancel()
            self.ops = None
            self.ops_ready = trio.Event()
            self.peer_claims_ok = False
            self.last_link_error = link.close_reason
            self.log.emit("link.down", peer=address, reason=link.close_reason)
            await trio.sleep(BACKOFF_START_S)

    def _descriptor(self) -> AttachRequest:
        claims = self.cfg.bundle.claims
        snap = self.policy.snapshot()
        static = snap.last_valid.policy.static_json()
        return AttachRequest(
            sandbox=claims.sandbox,
            network_policy=claims.network_policy,
            capture_mode=self.cfg.capture_mode,
            agent_uid=self.cfg.agent_uid,
            agent_gid=self.cfg.agent_gid,
            policy_generation=snap.generation,
            static_policy=static,
            acknowledge_external_fence=self.cfg.acknowledge_external_fence,
            capture_ports=capture_ports(snap.last_valid.policy),
            interception_ca_pem=self.cfg.interception.ca.cert_pem if self.cfg.interception else None,
            credential_placeholders=self.cfg.interception.credentials.placeholders() if self.cfg.interception else {},
        )

    async def _drive(self, link: Link) -> None:
        status = await call(link, "/v1/status")
        state = status.get("state")
        if state == "idle":
            reply = await call(link, "/v1/attach", self._descriptor().to_json())
            self.log.emit("lifecycle.bound", reply=reply)
            self._start_egress_links()
            reply = await self._confirm(link)
            self.log.emit("lifecycle.ready", fence=reply.get("fence"))
            reply = await call(link, "/v1/start")
            self.log.emit("lifecycle.running", agent=reply.get("agent"))
        else:
            reply = await call(link, "/v1/resume")
            self.log.emit("lifecycle.resumed", state=reply.get("state"))
            if reply.get("state") in ("bound", "ready", "running"):
                self._start_egress_links()
            if reply.get("state") == "bound":
                await self._confirm(link)
                await call(link, "/v1/start")
        self.boundary = await call(link, "/v1/status")
        await self._follow_agent(link)

    async def _confirm(self, link: Link) -> dict[str, Any]:
        """``confirm`` needs our egress links up (mediation connected): retry while it says unavailable."""
        with trio.fail_after(CONFIRM_RETRY_S):
            while True:
                try:
                    return await call(link, "/v1/confirm")
                except OpError as exc:
                    if exc.kind is not ErrorKind.UNAVAILABLE:
                        raise
                await trio.sleep(0.02)

    # -- egress links ---------------------------------------------------------------------------------------
    def _start_egress_links(self) -> None:
        if self._egress_started or self._nursery is None:
            return
        self._egress_started = True
        for index in range(self.cfg.egress_links):
            self._nursery.start_soon(self._maintain_egress_link, index)

    async def _maintain_egress_link(self, index: int) -> None:
        """One egress link, redialled with backoff: we dial (TLS client) and serve HTTP/2 on it."""
        address = f"{self.cfg.boundary_host}:{self.cfg.boundary_port}"
        while True:
            tls = await self._dial(ALPN_EGRESS)
            link = Link(tls, client=False, handler=self.egress.handle, name=f"egress{index}:{address}")
            self.egress_up += 1
            self.log.emit("link.up", peer=address, alpn=ALPN_EGRESS, index=index)
            try:
                await link.run()
            finally:
                self.egress_up -= 1
                self.log.emit("link.down", peer=address, alpn=ALPN_EGRESS, index=index, reason=link.close_reason)
            await trio.sleep(BACKOFF_START_S)

    # -- policy generations -----------------------------------------------------------------------------------
    def _policy_changed(self, snap: Any) -> None:
        self.log.emit("policy.generation", generation=snap.generation, status=snap.status, source=snap.source)
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
                self.log.emit("policy.ack-failed", generation=generation, error=exc.to_json())

    async def _follow_agent(self, link: Link) -> None:
        agent = (self.boundary.get("agent") or {}).get("handle")
        if agent is None:
            return
        result = await call(link, "/v1/wait", {"handle": agent})
        self.agent_result = result
        self.log.emit("agent.exited", handle=agent, result=result)
        self.boundary = await call(link, "/v1/status")
        try:
            await call(link, "/v1/agent/exit-ack")
        except OpError as exc:
            self.log.emit("agent.exit-ack-failed", error=exc.to_json())

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
    def readiness(self) -> list[str]:
        """The failing conditions; empty means ready (spec §6.6)."""
        failing: list[str] = []
        if not self.policy.ready:
            failing.append(f"policy: {self.policy.status} (generation {self.policy.generation})")
        if self.ops is None or self.ops.closed or not self.peer_claims_ok:
            failing.append(f"boundary: not attached ({self.last_link_error or 'no link yet'})")
        state = self.boundary.get("state")
        if state not in ("ready", "running"):
            failing.append(f"boundary: state {state or 'unknown'}, need ready or running")
        if not self.boundary.get("fence"):
            failing.append("fence: not confirmed")
        if self.cfg.capture_mode is CaptureMode.NETNS and self.egress_up == 0:
            failing.append("egress: no egress link to the boundary")
        return failing

    def status(self) -> dict[str, Any]:
        claims = self.cfg.bundle.claims
        return {
            "sandbox": claims.sandbox,
            "namespace": claims.namespace,
            "generation": claims.generation,
            "claims": claims.to_dict(),
            "policy": self.policy.status_json(),
            "link": {"up": self.ops is not None and not self.ops.closed, "last_error": self.last_link_error},
            "boundary": self.boundary,
            "agent_result": self.agent_result,
            "egress": {"links": self.egress_up, "live": self.egress.live_connections, **self.egress.counters},
            "ready": not self.readiness(),
        }


def capture_ports(policy: Any) -> tuple[int, ...]:
    """Ports the boundary listens on for transparent capture: every port the policy names, plus the usual web
    ports. Fixed at attach (the listeners exist from then on); proxy-aware clients are not limited by it."""
    ports = set(DEFAULT_CAPTURE_PORTS)
    for rule in policy.network_policies:
        for endpoint in rule.endpoints:
            ports.update(endpoint.ports)
    return tuple(sorted(ports)[:MAX_CAPTURE_PORTS])


def run(cfg: ControlConfig) -> int:
    try:
        return trio.run(ControlDaemon(cfg).serve)
    except OSError as exc:
        cfg.log.emit("control.failed", reason=str(exc))
        print(f"openshell-sandbox: control: {exc}", file=sys.stderr)
        return 125
