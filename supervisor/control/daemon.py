"""The control daemon: holds the policy, dials the boundary, drives its lifecycle, serves the operator API.

Its parts, each a module: the configuration (config.py); the links to the boundary, dialled and redialled
(boundary_links.py); the lifecycle driven over the ops link (lifecycle_driver.py), which records what control
knows of the boundary (peer.py); the operator API (api.py), the egress pipeline (egress.py) and the policy store
(policy/). The daemon composes them, serves, and answers what the API reports.
"""

from __future__ import annotations

import datetime
import functools
import signal
import socket
import sys

import trio

from supervisor.control.api import ApiServer
from supervisor.control.boundary_links import BoundaryLinks
from supervisor.control.canary import FenceCanary
from supervisor.control.certificates import CertificateFacts, expiring
from supervisor.control.config import ControlConfig
from supervisor.control.denials import DenialTable
from supervisor.control.egress import EgressService
from supervisor.control.events import EventBuffer
from supervisor.control.inference.from_config import inference_router
from supervisor.control.inference.router import SYNTHETIC_ADDRESS
from supervisor.control.inference.store import watch_routes_file
from supervisor.control.l7.rewrite import redact_path
from supervisor.control.lifecycle_driver import LifecycleDriver
from supervisor.control.metrics import ControlMetrics
from supervisor.control.peer import BoundaryPeer
from supervisor.control.policy.store import PolicySnapshot
from supervisor.control.proxy_listener import ProxyListener, per_process
from supervisor.control.workers.pool import WorkerPool
from supervisor.control.workers.pool import spawn as spawn_workers
from supervisor.control.workload_gone import WorkloadGone
from supervisor.link.h2link import Link
from supervisor.link.rpc import call_typed
from supervisor.protocol.acks import NoArguments
from supervisor.protocol.attach import CaptureMode
from supervisor.protocol.certs import BundleError, read_policy_digest
from supervisor.protocol.errors import OpError
from supervisor.protocol.event_names import EventName
from supervisor.protocol.event_record import Event
from supervisor.protocol.exit_codes import ExitCode
from supervisor.protocol.exit_result import ExitResult
from supervisor.protocol.fingerprint import certificate_fingerprint
from supervisor.protocol.json_value import JsonValue
from supervisor.protocol.lifecycle import State
from supervisor.protocol.status import StatusReply
from supervisor.protocol.tls import ALPN_EGRESS, ALPN_OPS


class ControlDaemon:
    def __init__(
        self, cfg: ControlConfig, pool: WorkerPool | None = None, proxy_sockets: list[socket.socket] | None = None
    ) -> None:
        self.cfg = cfg
        self.pool = pool  # the other processes serving egress (--workers; control/workers), forked already
        self.log = cfg.log
        self.events = EventBuffer()  # every event control logs, recent ones served by GET /v1/events
        self.denials = DenialTable()  # what the policy advisor reads (GET /v1/denials, control/denials.py)
        self.log.tap = self._tap
        # every event also moves the metrics and §4.3 activity counters (control/metrics.py), served or not
        self.metrics = ControlMetrics(cfg.policy, self.log, live=lambda: self.live_connections,
                                      links=self._links_up)  # fmt: skip
        self.log.sink = self.metrics.observe
        if cfg.interception is not None:  # placeholders the agent spells in a binary's name or a host: [CREDENTIAL]
            self.log.scrub = functools.partial(redact_path, cfg.interception.credentials)
        self.policy = cfg.policy
        self.peer = BoundaryPeer()
        claims = cfg.bundle.claims
        self.workload_gone = WorkloadGone(cfg.workload_gone_after_s, claims.namespace, claims.sandbox_uid)
        self.inference = inference_router(cfg)
        self.egress = EgressService(
            cfg.policy,
            cfg.upstream,
            self.log,
            interception=cfg.interception,
            relaxed=cfg.relaxed_identity,
            inference=self.inference,
        )
        self.proxy = (
            ProxyListener(cfg.proxy, self.egress, self.log, sockets=proxy_sockets) if cfg.proxy is not None else None
        )
        self.links = BoundaryLinks(cfg, self.peer, self.egress)
        self.certificates = certificate_facts(cfg)
        self.canary = FenceCanary(*cfg.fence_canary, log=self.log) if cfg.fence_canary is not None else None
        self.driver = LifecycleDriver(cfg, self.peer, self.links, self.certificates, self.canary, self.workload_gone)
        self.policy.subscribe(self._policy_changed)
        if pool is not None:
            pool.egress, pool.peer, pool.links = self.egress, self.peer, self.links
            pool.queue_ack = self.driver.queue_ack
            pool.in_force = cfg.policy.generation
            self.driver.in_force = lambda: pool.in_force  # what attach tells the boundary is in force everywhere
            self.links.on_start.append(pool.start_egress)

    @property
    def live_connections(self) -> int:
        """Connections relayed now, by every process of control."""
        return self.egress.live_connections + (self.pool.live if self.pool is not None else 0)

    @property
    def topology(self) -> str:
        return "proxy-pod" if self.cfg.proxy is not None else "boundary"

    @property
    def sandbox(self) -> str:
        return self.cfg.bundle.claims.sandbox

    @property
    def ops(self) -> Link | None:
        """The ops link to the boundary, while it is up (control/api.py forwards operations on it)."""
        return self.peer.ops

    @property
    def agent_result(self) -> ExitResult | None:
        """The last agent result the boundary told control (control/api.py answers from it)."""
        return self.peer.agent_result

    async def serve(self) -> int:
        self.events.bind()
        api = ApiServer(self, self.cfg.api_path, log=self.log)
        async with trio.open_nursery() as nursery:
            self.links.nursery = nursery
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
            if self.pool is not None:
                nursery.start_soon(self._workers, nursery)
            self._log_topology()
            if self.proxy is not None:  # proxy-pod: no boundary to dial, the workload connects to us
                await nursery.start(self.proxy.serve)
            else:
                if self.canary is not None:  # listening before any descriptor names it
                    await nursery.start(self.canary.serve)
                nursery.start_soon(self.driver.acknowledge_policy)
                nursery.start_soon(self.driver.maintain_ops_link)
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
        fields: dict[str, str | None] = {"topology": self.topology, "identity": "relaxed" if self.cfg.relaxed_identity
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
                if self.pool is not None:  # their last connections' events are logged before control's end
                    await self.pool.stop_workers()
                nursery.cancel_scope.cancel()
                return

    async def _workers(self, nursery: trio.Nursery) -> None:
        """Serve the workers; one of them ending ends control (its connections are gone, and a pod restarts)."""
        assert self.pool is not None
        await self.pool.serve()
        nursery.cancel_scope.cancel()

    async def _watch_certificates(self) -> None:
        """One ``certificate.expiring`` event per certificate once it is within the warning (rechecked hourly)."""
        told: set[str] = set()
        while True:
            for name, when in expiring(self.certificates, datetime.datetime.now(datetime.UTC)):
                if name not in told:
                    told.add(name)
                    self.log.emit(EventName.CERTIFICATE_EXPIRING, certificate=name, when=when)
            await trio.sleep(3600)

    def _policy_changed(self, snap: PolicySnapshot) -> None:
        warnings = {"warnings": [str(w) for w in snap.warnings]} if snap.warnings else {}
        errors = {"errors": [error.to_json() for error in snap.errors]} if snap.errors else {}
        self.log.emit(EventName.POLICY_GENERATION, generation=snap.generation, status=snap.status, source=snap.source,
                      **warnings, **errors)  # fmt: skip
        if self.pool is not None:  # acknowledged once every worker has it in force too
            self.pool.publish(snap)
        else:
            self.driver.queue_ack(snap.generation)

    async def refresh_status(self) -> dict[str, JsonValue]:
        """The boundary's status, asked again if the ops link is up (the last one reported if not)."""
        link = self.peer.ops
        if link is not None and not link.closed:
            try:
                with trio.move_on_after(2):
                    self.peer.reported = await call_typed(link, "/v1/status", NoArguments(), StatusReply)
            except OpError:
                pass
        return self._reported()

    def _reported(self) -> dict[str, JsonValue]:
        """The boundary's last status as it wrote it; ``{}`` before the first."""
        reported = self.peer.reported
        return {} if reported is None else dict(reported.to_wire())

    # -- what the API reports ------------------------------------------------------------------------------
    def _links_up(self) -> dict[str, int]:
        if self.proxy is not None:
            return {}
        return {ALPN_OPS: int(self.peer.ops_up), ALPN_EGRESS: self.peer.egress_up}

    def activity(self) -> dict[str, JsonValue]:
        """docs/reference/policy.md §4.3's counters since control started (``GET /v1/activity``, ``status``)."""
        counts = self.metrics.activity.to_json()
        return {
            "network_activity_count": counts["network_activity_count"],
            "denied_action_count": counts["denied_action_count"],
            "denials_by_group": dict(counts["denials_by_group"]),
        }

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
        peer = self.peer
        if peer.refused is not None:
            failing.append(f"boundary: refused attach ({peer.refused})")
        reported = peer.reported
        if reported is not None and reported.enforcement_lost:
            failing.append(f"enforcement lost: {reported.enforcement_lost}")
        if not peer.ops_up or not peer.claims_ok:
            failing.append(f"boundary: not attached ({peer.last_link_error or 'no link yet'})")
            gone = self.workload_gone.readiness()
            if gone is not None:
                failing.append(gone)
        state = reported.state if reported is not None else None
        if state not in (State.READY, State.RUNNING):
            failing.append(f"boundary: state {state or 'unknown'}, need ready or running")
        if reported is None or reported.fence is None:
            failing.append("fence: not confirmed")
        if self.cfg.capture_mode is CaptureMode.NETNS and peer.egress_up == 0:
            failing.append("egress: no egress link to the boundary")
        for name, when in expiring(self.certificates, datetime.datetime.now(datetime.UTC)):
            failing.append(f"certificate: {name} {when}")
        ours = self.certificates.interception_ca_sha256
        if peer.ca_sha256 is not None and peer.ca_sha256 != ours:
            failing.append(f"interception: CA {ours} is not the one the agent trusts ({peer.ca_sha256})")
        return failing

    def _interception_status(self) -> dict[str, JsonValue]:
        ours, theirs = self.certificates.interception_ca_sha256, self.peer.ca_sha256
        return {"ca_sha256": ours, "boundary_ca_sha256": theirs, "match": None if theirs is None else theirs == ours}

    def _tap(self, event: Event) -> None:
        self.events.record(event)
        self.denials.observe(event)

    def denials_json(self, since_ms: int | None) -> dict[str, JsonValue]:
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

    def status(self) -> dict[str, JsonValue]:
        claims = self.cfg.bundle.claims
        peer = self.peer
        return {
            "sandbox": claims.sandbox,
            "namespace": claims.namespace,
            "generation": claims.generation,
            "claims": dict(claims.to_dict()),
            "policy": self.policy.status_json(),
            "link": {
                "up": peer.ops_up,
                "last_error": peer.last_link_error,
                "boundary_refused": peer.refused,
                # past --workload-gone-after without a link: since when, and the commands that remove the sandbox
                "workload_gone": None if self.proxy is not None else self.workload_gone.status(),
            },
            "boundary": self._reported(),
            "agent_result": peer.agent_result.to_wire() if peer.agent_result is not None else None,
            "egress": {"links": peer.egress_up, "live": self.live_connections, **self._counters()},
            "workers": self.pool.status() if self.pool is not None else None,
            "activity": self.activity(),
            "certificates": self.certificates.to_json(datetime.datetime.now(datetime.UTC)),
            "interception": self._interception_status(),
            "topology": self._topology_status(),
            "fence_canary": self.canary.status() if self.canary is not None else None,
            "inference": self.inference.status() if self.inference is not None else None,
            "ready": not self.readiness(),
        }

    def _counters(self) -> dict[str, int]:
        counters = dict(self.egress.counters)
        if self.pool is not None:
            for key, value in self.pool.counters().items():
                counters[key] = counters.get(key, 0) + value
        return counters

    def _topology_status(self) -> dict[str, JsonValue]:
        out: dict[str, JsonValue] = {"name": self.topology, "identity": "relaxed" if self.cfg.relaxed_identity
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


def run(cfg: ControlConfig) -> int:
    pool: WorkerPool | None = None
    proxy_sockets: list[socket.socket] | None = None
    try:
        if cfg.workers > 1:  # forked before trio.run and before anything subscribes to the policy store
            if cfg.proxy is not None:
                cfg.proxy = per_process(cfg.proxy, cfg.workers)
            handles, proxy_sockets = spawn_workers(cfg, cfg.workers)
            pool = WorkerPool(handles, cfg.log)
        code = trio.run(ControlDaemon(cfg, pool, proxy_sockets).serve)
    except OSError as exc:
        cfg.log.emit(EventName.CONTROL_FAILED, reason=str(exc))
        print(f"openshell-sandbox: control: {exc}", file=sys.stderr)
        return ExitCode.SELF_FAILED
    finally:
        if pool is not None:
            pool.stop()
    if pool is not None and pool.exited is not None:
        cfg.log.emit(EventName.CONTROL_FAILED, reason=pool.exited)
        print(f"openshell-sandbox: control: {pool.exited}", file=sys.stderr)
        return ExitCode.SELF_FAILED
    return code
