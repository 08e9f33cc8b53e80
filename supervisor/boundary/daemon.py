"""The boundary daemon: listens for control, runs the lifecycle, owns the workload.

Size (over ~500 lines on purpose): the daemon is the lifecycle's one owner — every operation handler checks and
advances the same state and workload; what it drives (capture, process table, egress, confinement, trust) are
modules of their own.

Order of events in a boundary's life:

1. ``main`` loads the bootstrap bundle (refusing the other role's key), picks the privilege model and forks the
   launcher — before ``trio.run`` and before any thread exists (docs/design.md "Privilege models").
2. The daemon listens (never ``SO_REUSEPORT``) and only listens: control dials. Every connection must complete
   a TLS 1.3 handshake within a deadline and present a control certificate whose claims equal ours exactly;
   anything else is logged with the peer and the failing field and closed, and the daemon keeps serving.
3. ``attach`` prepares the agent's namespaces; ``confirm`` reads the fence back; ``start`` launches the agent.
4. Agent exit ends Running: every workload process is terminated, the result is kept for ``wait``, and the
   daemon exits with the agent's rendered code once control acknowledged it (or after ``exit_linger``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import signal
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import trio

from supervisor.boundary import state_file
from supervisor.boundary.capture import connect_notify
from supervisor.boundary.capture.canary import ProbeResult, probe_canary
from supervisor.boundary.capture.connect_record import ConnectRecords, ExecLog, live_bound
from supervisor.boundary.capture.fence_watch import (
    NETLINK_NETFILTER,
    FenceWatch,
    nftables_groups_socket,
    rtnetlink_groups_socket,
)
from supervisor.boundary.capture.identity import IdentityResolver
from supervisor.boundary.capture.setup import open_sock_diag
from supervisor.boundary.confinement import landlock_for, root_for
from supervisor.boundary.egress import EgressCapture, EgressLinks, RecentPids
from supervisor.boundary.forkimage import NamespacePlan, capabilities
from supervisor.boundary.forkimage.landlock import LandlockSpec
from supervisor.boundary.forkimage.rootfs import DEFAULT_SHM_SIZE, DEFAULT_TMP_SIZE, TRUST_PATH, RootError, under
from supervisor.boundary.forward import open_forward
from supervisor.boundary.metrics import BoundaryMetrics
from supervisor.boundary.process import Launcher, LauncherError, Prepared
from supervisor.boundary.process.cgroups import (
    DEFAULT_PIDS_LIMIT,
    CgroupError,
    PidsCgroup,
    create_pids_cgroup,
    workload_cgroup_name,
)
from supervisor.boundary.process.environment import account, build_process_spec, managed_env
from supervisor.boundary.process.exec_session import pump_exec
from supervisor.boundary.process.memory_cgroup import (
    LAUNCHER_OOM_SCORE_ADJ,
    WORKLOAD_OOM_SCORE_ADJ,
    MemoryCgroup,
    create_memory_cgroup,
    default_memory_limit,
    privileged_for_oom_score,
    set_oom_score_adj,
)
from supervisor.boundary.process.table import ProcessTable
from supervisor.boundary.trust import TrustError, install_trust
from supervisor.jsonlog import JsonLog
from supervisor.link.h2link import Link, LinkStream
from supervisor.link.relay import relay
from supervisor.link.rpc import Accept, Router
from supervisor.link.tls_link import Refused, accept_link, refuse
from supervisor.metrics import PATH as METRICS_PATH
from supervisor.metrics import MetricsServer
from supervisor.protocol.agent_ended import why_ended
from supervisor.protocol.attach import AttachRequest, CaptureMode, parse_attach
from supervisor.protocol.certs import Bundle
from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.event_names import EventName
from supervisor.protocol.exit_codes import ExitCode, for_launch_errno, for_signal
from supervisor.protocol.exit_result import EndReason
from supervisor.protocol.fence_canary import CanaryReport, parse_canary
from supervisor.protocol.fingerprint import pem_fingerprint
from supervisor.protocol.lifecycle import Lifecycle, Op, State
from supervisor.protocol.ocsf import placeholder_scrub
from supervisor.protocol.privilege_model import PrivilegeModel
from supervisor.protocol.process_ops import (
    is_forward_probe,
    parse_exec_request,
    parse_forward_request,
    parse_signal_request,
    parse_terminate_request,
    parse_wait_request,
)
from supervisor.protocol.tls import ALPN_EGRESS, ALPN_OPS, server_context

PROXY_PORT = 3128
# Identity must resolve within this much of the resolving thread's CPU time (spec §4.2: 50 ms), first-time
# hashing of a binary excluded; typically 0.2-3 ms. CPU, not wall time: waiting for the GIL under load is not
# the workload's doing.
IDENTITY_BUDGET_US = 50_000
CONNECT_NOTIFY_OFF_ENV = "OPENSHELL_BENCH_NO_CONNECT_NOTIFY"  # "1": accept-time identity only (bench baseline)
PROBE_ADDRESS = "192.0.2.1"  # TEST-NET-1: inside the agent's namespace it can only land on our own listener
END_WORKLOAD_S = 5.0
REPLY_FLUSH_S = 2.0  # how long an ending daemon waits for its last replies to be written to control
EGRESS_LINK_WAIT_S = 1.0  # confirm waits this long for control's first egress link (its dial just completed)
REDACTED_CREDENTIAL = "[CREDENTIAL]"  # a placeholder as status shows it (as control's events do, l7/rewrite.py)


@dataclass
class BoundaryConfig:
    bundle: Bundle
    agent_argv: tuple[str, ...]
    listen_host: str = "0.0.0.0"
    listen_port: int = 7443
    port_file: Path | None = None
    workdir: str = "/"
    agent_stdio: str = "inherit"  # "inherit" (container stdout), "pipe", or "tty" (dev mode's terminal)
    agent_tty_size: tuple[int, int] = (80, 24)  # "tty": (cols, rows) until the attached client resizes it
    agent_term: str = "xterm-256color"  # "tty": the agent's TERM (dev mode passes its caller's)
    privilege_model: PrivilegeModel = PrivilegeModel.R
    model_reason: str = ""
    hide_paths: tuple[str, ...] = ()
    exit_linger_s: float = 60.0
    acknowledge_external_fence: bool = False
    acknowledge_unprobed_fence: bool = False  # proxy-env without a canary (--acknowledge-unprobed-fence)
    tls_dir: Path = Path(TRUST_PATH)  # where we write the trust files; R and U show them at TRUST_PATH
    tmp_size: str = DEFAULT_TMP_SIZE  # the agent's private /tmp (R, U)
    shm_size: str = DEFAULT_SHM_SIZE  # the agent's private /dev/shm (R, U)
    pids_limit: int = DEFAULT_PIDS_LIMIT  # the workload's cgroup pids.max; 0: none (reported unenforced)
    memory_limit: int = field(default_factory=default_memory_limit)  # bytes; 0: none (reported unenforced)
    state_file: Path | None = None  # --state-file: our lifecycle state for the pod's readiness probe
    metrics_listen: tuple[str, int] | None = None  # /metrics for Prometheus (--metrics-listen; supervisor/metrics.py)
    test_landlock_off: bool = False  # tests only: prove the mount layer alone holds (OPENSHELL_TEST_LANDLOCK_OFF)
    log: JsonLog = field(default_factory=lambda: JsonLog("boundary"))


class BoundaryDaemon:
    def __init__(self, cfg: BoundaryConfig, launcher: Launcher) -> None:
        self.cfg = cfg
        self.log = cfg.log
        self.launcher = launcher
        self.lifecycle = Lifecycle(on_change=self._publish_state)
        self.instance = str(uuid.uuid4())
        self.table = ProcessTable(launcher, log=self.log)
        launcher.on_unowned = lambda count, pids: self.log.emit(
            EventName.PROCESS_UNOWNED_REAPED, count=count, pids_in_namespace=pids
        )  # orphans the workload's init reaped (double forks, daemons), aggregated per second
        self.attach: AttachRequest | None = None
        self.prepared: Prepared | None = None
        self.fence: dict[str, Any] | None = None
        self.policy_generation_acked: int | None = None
        self.exit_acked = trio.Event()
        self.exit_code: int | None = None
        self.links: set[Link] = set()
        self.egress_links = EgressLinks()
        self.trust: tuple[Path, Path] | None = None  # (CA file, bundle file) given to the workload
        # what every exec's spec shares, made once per attach (each was ~60 µs of every exec's path)
        self._env_memo: tuple[object, Mapping[str, str]] | None = None
        self._landlock_memo: tuple[object, int, LandlockSpec] | None = None
        self.capture: EgressCapture | None = None
        self.pids_cgroup: PidsCgroup | None = None
        self.memory_cgroup: MemoryCgroup | None = None
        self.terminating = 0  # terminate calls in flight: their replies go out before the daemon ends
        self.terminates_done = trio.Event()
        self.enforcement_lost: str | None = None  # the watched fence changed: why (capture/fence_watch.py)
        self.limits: dict[str, Any] = {"pids": None, "memory": None, **self._fixed_limits()}  # set at attach
        self.canary_probe: ProbeResult | None = None  # the last probe of control's canary (proxy-env)
        self.router = self._make_router()
        self._nursery: trio.Nursery | None = None
        self.metrics = BoundaryMetrics(self.log, self)  # every event moves it (boundary/metrics.py), served or not
        self.log.sink = self.metrics.observe

    # -- serving ----------------------------------------------------------------------------------------------
    async def serve(self) -> int:
        ctx = server_context(self.cfg.bundle, (ALPN_OPS, ALPN_EGRESS))
        # "::" (the default, [::]:7443) means every address of both families: trio then binds 0.0.0.0 and a
        # v6-only ::, and skips the family a v6-less (or v4-less) pod does not have. Dual-stack clusters work.
        host = None if self.cfg.listen_host in ("::", "") else self.cfg.listen_host
        listeners = await trio.open_tcp_listeners(self.cfg.listen_port, host=host)
        port = listeners[0].socket.getsockname()[1]
        if self.cfg.port_file is not None:
            tmp = self.cfg.port_file.with_suffix(".tmp")
            tmp.write_text(str(port))
            tmp.rename(self.cfg.port_file)
        self.log.emit(
            EventName.BOUNDARY_LISTENING,
            address=f"{self.cfg.listen_host}:{port}",
            privilege_model=self.cfg.privilege_model,
            model_reason=self.cfg.model_reason,
            instance=self.instance,
        )
        if self.cfg.test_landlock_off:
            self.log.emit(EventName.BOUNDARY_TEST_KNOB, knob="landlock-off", warning="Landlock is off for every launch")
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self.cfg.metrics_listen is not None:
                metrics_host, metrics_port = self.cfg.metrics_listen
                server = MetricsServer(self.metrics.registry, metrics_host, metrics_port)
                address = await nursery.start(server.serve)
                self.log.emit(EventName.METRICS_LISTENING, address=address, path=METRICS_PATH)
            await nursery.start(self.table.run)
            nursery.start_soon(self._signals, nursery)
            nursery.start_soon(self._watch_agent, nursery)
            nursery.start_soon(trio.serve_listeners, functools.partial(self._connection, ctx=ctx), listeners)
        code = self.exit_code if self.exit_code is not None else ExitCode.SELF_FAILED
        if self.pids_cgroup is not None or self.memory_cgroup is not None:
            self.launcher.close()  # the launcher is their last member: stop it, then the cgroups can go
        if self.memory_cgroup is not None and not self.memory_cgroup.remove(wait_s=END_WORKLOAD_S):
            self.log.emit(EventName.LIMITS_MEMORY_CGROUP_LEFT, cgroup=self.memory_cgroup.describe())
        if self.pids_cgroup is not None and not self.pids_cgroup.remove(wait_s=END_WORKLOAD_S):
            self.log.emit(EventName.LIMITS_PIDS_CGROUP_LEFT, cgroup=self.pids_cgroup.describe())
        self.log.emit(EventName.BOUNDARY_EXIT, code=code)
        return code

    async def _signals(self, nursery: trio.Nursery) -> None:
        """The first SIGTERM or SIGINT ends the workload and then the daemon; later ones are logged and taken
        here until the end (Ctrl-C on dev reaches us with dev's own SIGTERM right behind: a receiver closed with
        one pending would deliver it to the default action, killing us before the agent's result is recorded
        and its cgroups removed)."""
        ending = False
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                self.log.emit(EventName.BOUNDARY_SIGNAL, signal=signal.Signals(signum).name)
                if ending:
                    continue
                ending = True
                agent_running = self.table.agent is not None and self.table.agent.result is None
                await self._end_workload("shutdown")
                if agent_running:
                    # _watch_agent records the agent's result and ends the daemon; no ack will come now.
                    self.exit_acked.set()
                    continue
                self.exit_code = for_signal(signum)
                nursery.cancel_scope.cancel()

    async def _end_workload(self, reason: str) -> None:
        """Terminate every workload process; never let a stuck launcher keep the daemon from exiting."""
        with trio.move_on_after(END_WORKLOAD_S) as scope:
            try:
                await self.table.end_all(reason)
            except LauncherError as exc:
                self.log.emit(EventName.BOUNDARY_END_ALL_FAILED, reason=str(exc))
        if scope.cancelled_caught:
            self.log.emit(EventName.BOUNDARY_END_ALL_TIMEOUT, seconds=END_WORKLOAD_S)

    async def _watch_agent(self, nursery: trio.Nursery) -> None:
        await self.table.agent_exited.wait()
        agent = self.table.agent
        assert agent is not None
        result = await agent.wait_result()
        self.lifecycle.end()
        self.exit_code = result.exit_code
        self.log.emit(EventName.AGENT_EXITED, handle=agent.handle, result=result.to_wire())
        await self._end_workload("agent-exit")
        with trio.move_on_after(self.cfg.exit_linger_s) as scope:
            await self.exit_acked.wait()
        if scope.cancelled_caught:
            self.log.emit(EventName.BOUNDARY_EXIT_LINGER_EXPIRED, linger_s=self.cfg.exit_linger_s)
        with trio.move_on_after(END_WORKLOAD_S):  # a terminate racing the exit answers the agent's result
            while self.terminating:
                await self.terminates_done.wait()
        with trio.move_on_after(REPLY_FLUSH_S):  # the acknowledgement's (or a terminate's) reply goes out first
            await self.router.replies_flushed()
        nursery.cancel_scope.cancel()

    async def _connection(self, stream: trio.SocketStream, ctx: Any) -> None:
        try:
            tls, claims, alpn = await accept_link(stream, ctx, self.cfg.bundle)
        except Refused as exc:
            self.log.emit(EventName.LINK_REFUSED, peer=exc.peer, field=exc.field, reason=exc.reason)
            return
        peer = f"{claims.control_deployment}"
        if alpn == ALPN_OPS:
            link = Link(tls, client=False, handler=self.router.handle, name=f"ops:{peer}")
        else:
            try:
                self.lifecycle.check(Op.EGRESS)
            except OpError as exc:
                self.log.emit(EventName.LINK_REFUSED, peer=peer, field="state", reason=f"egress link: {exc.reason}")
                await refuse(tls, server=True, field="state")  # control is told why (a GOAWAY)
                return
            # On egress links the boundary is the HTTP/2 client (HTTP/2 roles do not follow TCP's).
            link = Link(tls, client=True, name=f"egress:{peer}")
            self.egress_links.add(link)
        self.links.add(link)
        self.log.emit(EventName.LINK_UP, peer=peer, alpn=alpn, links=len(self.links))
        try:
            await link.run()
        finally:
            self.links.discard(link)
            self.egress_links.discard(link)
            self.log.emit(EventName.LINK_DOWN, peer=peer, alpn=alpn, reason=link.close_reason, links=len(self.links))

    # -- operations ---------------------------------------------------------------------------------------------
    def _make_router(self) -> Router:
        router = Router()
        router.unary("/v1/attach", self.op_attach)
        router.unary("/v1/confirm", self.op_confirm)
        router.unary("/v1/start", self.op_start)
        router.unary("/v1/resume", self.op_resume)
        router.unary("/v1/status", self.op_status)
        router.unary("/v1/wait", self.op_wait)
        router.unary("/v1/signal", self.op_signal)
        router.unary("/v1/terminate", self.op_terminate)
        router.unary("/v1/policy-ack", self.op_policy_ack)
        router.unary("/v1/agent/exit-ack", self.op_exit_ack)
        router.unary("/v1/fence-probe", self.op_fence_probe)
        router.unary("/v1/fence-observed", self.op_fence_observed)
        router.channel("/v1/exec", self.op_exec)
        router.channel("/v1/forward", self.op_forward)
        router.channel("/v1/attach-stream", self.op_attach_stream)
        return router

    def _agent_ids(self, attach: AttachRequest) -> tuple[int, int]:
        """Model R runs the agent as the descriptor's uid; U and P as the boundary's own (spec §2.9) — except U
        under euid 0, where the user namespace maps the descriptor's ids instead (never host uid 0: it would own
        root's files; docs/design.md "Settled details")."""
        model = self.cfg.privilege_model
        if model == PrivilegeModel.R:
            if attach.agent_uid == os.geteuid():
                raise OpError(ErrorKind.INVALID, "agent uid must differ from the boundary's in model R", "agent_uid")
            return attach.agent_uid, attach.agent_gid
        if model == PrivilegeModel.U and os.geteuid() == 0:
            if attach.agent_uid == 0 or attach.agent_gid == 0:
                raise OpError(ErrorKind.INVALID, "model U under root never maps the agent to uid or gid 0",
                              "agent_uid")  # fmt: skip
            return attach.agent_uid, attach.agent_gid
        return os.geteuid(), os.getegid()

    async def op_attach(self, body: dict[str, Any]) -> dict[str, Any]:
        self.lifecycle.check(Op.ATTACH)
        try:
            return await self._attach(body)
        except OpError as exc:
            # A refused descriptor or acknowledgement will not be different next time: reply, then exit
            # non-zero (spec §1.1) instead of idling for a control that keeps sending the same thing.
            if self.lifecycle.state is State.IDLE:
                self.log.emit(EventName.LIFECYCLE_REFUSED, op="attach", error=exc.to_json())
                self._fatal(f"attach refused: {exc.kind}: {exc.reason}" + (f" ({exc.field})" if exc.field else ""))
            raise

    async def _attach(self, body: dict[str, Any]) -> dict[str, Any]:
        attach = parse_attach(body, self.cfg.bundle.claims)
        self._agent_ids(attach)
        if attach.capture_mode is CaptureMode.PROXY_ENV and not (
            attach.acknowledge_external_fence and self.cfg.acknowledge_external_fence
        ):
            raise OpError(
                ErrorKind.DENIED,
                "proxy-env needs the external-fence acknowledgement in both the boundary's configuration and the "
                "descriptor",
                field="capture_mode",
            )
        if (
            attach.capture_mode is CaptureMode.PROXY_ENV
            and attach.fence_canary is None
            and not (attach.acknowledge_unprobed_fence and self.cfg.acknowledge_unprobed_fence)
        ):
            raise OpError(
                ErrorKind.DENIED,
                'proxy-env without a fence canary needs the acknowledgement to say "no probe" '
                "(--acknowledge-unprobed-fence) in both the boundary's configuration and the descriptor",
                field="fence_canary",
            )
        model = self.cfg.privilege_model
        netns = attach.capture_mode is CaptureMode.NETNS and model != PrivilegeModel.P
        if attach.capture_mode is CaptureMode.NETNS and model == PrivilegeModel.P:
            raise OpError(ErrorKind.DENIED, "model P has no network namespace: only proxy-env", field="capture_mode")
        root: dict[str, Any] | None = None
        if model != PrivilegeModel.P:  # the agent's own root: only granted trees, secrets hidden (confinement rule 1)
            uid, gid = self._agent_ids(attach)
            try:
                layout = root_for(
                    attach.static_policy, self.cfg.workdir, trust_dir=str(self.cfg.tls_dir), agent_uid=uid,
                    agent_gid=gid, hide=(*self.cfg.hide_paths, str(self.cfg.bundle.directory)),
                    tmp_size=self.cfg.tmp_size, shm_size=self.cfg.shm_size,
                )  # fmt: skip
            except RootError as exc:  # a layout we cannot build now will not build later: exit, do not idle
                self._fatal(f"agent filesystem: {exc}")
                raise OpError(ErrorKind.INVALID, f"agent filesystem: {exc}", field="filesystem_policy") from None
            root = layout.to_wire()
            self.log.emit(
                EventName.AGENT_FILESYSTEM, read_only=[b.target for b in layout.binds if not b.writable],
                read_write=[b.target for b in layout.binds if b.writable], hidden=list(layout.hide),
                tmp_size=layout.tmp_size, shm_size=layout.shm_size,
            )  # fmt: skip
        capture: dict[str, Any] | None = None
        if netns:
            capture = {"capture_ports": list(attach.capture_ports), "proxy_port": PROXY_PORT}
        plan = NamespacePlan(
            model,
            netns=netns,
            pidns=model != PrivilegeModel.P,
            mountns=model != PrivilegeModel.P,
            capture=capture,
            root=root,
            agent_ids=self._agent_ids(attach) if model == PrivilegeModel.U and os.geteuid() == 0 else None,
        )
        self._limit_pids()
        self._limit_memory()
        try:
            self.prepared = await self.launcher.prepare(plan)
        except (LauncherError, OSError) as exc:
            self._fatal(f"namespace setup failed: {exc}")
            raise OpError(ErrorKind.FAILED, f"namespace setup failed: {exc}", stage="prepare") from exc
        self._oom_score(plan.pidns)
        if attach.interception_ca_pem is not None:
            try:
                self.trust = install_trust(self.cfg.tls_dir, attach.interception_ca_pem)
            except (TrustError, OSError) as exc:
                self._fatal(f"interception CA: {exc}")
                raise OpError(ErrorKind.INVALID if isinstance(exc, TrustError) else ErrorKind.FAILED,
                              f"interception CA: {exc}", field="interception_ca_pem") from None  # fmt: skip
        self.attach = attach
        self.log.scrub = placeholder_scrub(attach.credential_placeholders.values())  # §4.1: never in an event
        self.policy_generation_acked = attach.policy_generation
        if netns:
            fds = dict(self.prepared.fds)
            anchor = self.launcher.pid
        else:  # proxy-env: one proxy listener in our own (the pod's) network namespace
            fds = {"proxy": _proxy_listener()}
            with contextlib.suppress(OSError):
                fds["sock_diag"] = open_sock_diag()
            anchor = os.getpid()
        diag_fd = fds.pop("sock_diag", None)
        recent_pids = RecentPids(self.launcher.workload_pids)
        # Identity fixed at connect (docs/design.md "Identity"): where the kernel has seccomp user notification
        # and we may take a workload process's fds (pidfd_getfd needs ptrace rights over it: R, U, or root);
        # else the accept-time resolution and its documented window. The bench's baseline turns it off.
        at_connect = (
            (model != PrivilegeModel.P or os.geteuid() == 0)
            and os.environ.get(CONNECT_NOTIFY_OFF_ENV) != "1"
            and connect_notify.available()
        )
        resolver = IdentityResolver(
            anchor_pid=anchor,
            workload_pids=recent_pids,
            agent_pid=lambda: self.table.agent.pid if self.table.agent is not None else None,
            # With a workload PID namespace no process outside it can hold one of its sockets except ourselves
            # and the launcher, so the walk of every fd table for foreign owners is not needed. Without one (P)
            # it is, over our PID namespace: as a container's PID 1 that is just the pod. Outside a container
            # (dev mode's model P) it would be every process on the host, tens of ms per connection: skipped,
            # one of dev-P's documented limits.
            scan_foreign=model == PrivilegeModel.P and os.getpid() == 1,
            budget_us=IDENTITY_BUDGET_US,
            sock_diag=socket.socket(fileno=diag_fd) if diag_fd is not None else None,
            records=ConnectRecords() if at_connect else None,
            exec_log=ExecLog(limit=live_bound(self._pids_limit())) if at_connect else None,
        )
        if at_connect:
            notifier = connect_notify.ConnectNotifier(
                resolver, on_event=lambda name, fields: self.log.emit(name, **fields)
            )
            self.launcher.notify_socket = notifier.child_end()
            self.launcher.first_execs = notifier.first_execs
            assert self._nursery is not None
            self._nursery.start_soon(notifier.serve)
        self.capture = EgressCapture(
            fds=fds, links=self.egress_links, resolver=resolver, log=self.log, recent_pids=recent_pids,
            accepting=lambda: self.lifecycle.state is not State.ENDED,
        )  # fmt: skip
        self.lifecycle.advance(Op.ATTACH)
        self.log.emit(
            EventName.LIFECYCLE_BOUND, capture_mode=str(attach.capture_mode), privilege_model=model,
            policy_generation=attach.policy_generation, identity_at="connect" if at_connect else "accept",
        )  # fmt: skip
        return {
            "state": str(self.lifecycle.state),
            "boundary_instance": self.instance,
            "privilege_model": model,
            "capture": {"mode": str(attach.capture_mode), "netns": netns, **(self.prepared.report or {})},
        }

    async def op_confirm(self, body: dict[str, Any]) -> dict[str, Any]:
        self.lifecycle.check(Op.CONFIRM)
        assert self.attach is not None and self.prepared is not None
        with trio.move_on_after(EGRESS_LINK_WAIT_S):  # control asks once its dial completed: ours is moments away
            await self.egress_links.wait_live()
        if len(self.egress_links) == 0:
            raise OpError(ErrorKind.UNAVAILABLE, "no egress link from control yet: mediation is not connected")
        fence: dict[str, Any] = {"mode": str(self.attach.capture_mode), "privilege_model": self.cfg.privilege_model}
        if self.attach.capture_mode is CaptureMode.NETNS:
            fence.update(await self._verify_fence())
        elif self.attach.fence_canary is not None:
            fence.update(self._canary_observed(body.get("canary")))
        else:
            # Acknowledged "no probe" by the operator in both places (docs/design.md: no probe leaves the machine
            # unless the deployment configured its target): reported as such, never claimed as verified.
            fence.update(fingerprint=None, probe="acknowledged-unprobed")
        if self.capture is not None:
            assert self._nursery is not None
            await self._nursery.start(self.capture.run)
        self.fence = fence
        self.lifecycle.advance(Op.CONFIRM)
        self.log.emit(EventName.LIFECYCLE_READY, fence=fence)
        if self.attach.capture_mode is CaptureMode.NETNS and fence.get("fingerprint"):
            await self._watch_fence(str(fence["fingerprint"]))
        if self.cfg.privilege_model == PrivilegeModel.R:
            self._narrow_capabilities()
        return {"state": str(self.lifecycle.state), "fence": fence}

    def _narrow_capabilities(self) -> None:
        """Model R, ready: the namespaces, listeners, fence watch and trust files are built; keep only what the
        running sandbox uses (forkimage/capabilities.py). A drop that does not take ends the sandbox."""
        keep = capabilities.mask(capabilities.BOUNDARY_KEEPS)
        groups = [group.directory.parent for group in (self.pids_cgroup, self.memory_cgroup) if group is not None]
        if not all(capabilities.owner_writes(str(parent)) for parent in groups):
            keep |= capabilities.mask(capabilities.BOUNDARY_CLEANUP_KEEPS)
        try:
            kept, dropped = capabilities.restrict(keep)
        except OSError as exc:
            self._fatal(f"capabilities: {exc}")
            raise OpError(ErrorKind.FAILED, f"capabilities: {exc}", stage="confirm") from None
        self.log.emit(
            EventName.BOUNDARY_CAPABILITIES, kept=capabilities.names(kept), dropped=capabilities.names(dropped),
            threads_beyond=capabilities.threads_beyond(keep),
        )  # fmt: skip

    def _canary_observed(self, raw: Any) -> dict[str, Any]:
        """Model P's fence counts as observed only if our last probe's connect failed and control's report of
        that probe says its canary answered its own self-check and saw nothing else (protocol/fence_canary.py)."""
        assert self.attach is not None and self.attach.fence_canary is not None
        probe = self.canary_probe
        problem = None
        if raw is None:
            problem = "no canary report from control (confirm needs /v1/fence-probe first)"
        else:
            try:
                report = CanaryReport.from_wire(raw)
            except OpError as exc:
                problem = f"canary report: {exc.reason}"
            else:
                if probe is None or report.probe != probe.probe:
                    problem = f"the canary report is for probe {report.probe}, not the last probe"
                elif report.self_check != "ok":
                    problem = f"control could not reach its own canary: {report.self_check}"
                elif report.seen:
                    problem = f"control's canary saw {report.seen} connection(s) during the probe: {list(report.peers)}"
        if problem is not None:
            self._fatal(f"fence not observed: {problem}")
            raise OpError(ErrorKind.FAILED, f"fence not observed: {problem}", stage="confirm", field="canary")
        assert probe is not None
        return {"fingerprint": None, "probe": "canary", "canary": probe.target, "probe_error": probe.error}

    async def op_fence_probe(self, body: dict[str, Any]) -> dict[str, Any]:
        """Connect to control's canary from the pod's namespace (proxy-env); a connect that succeeds is a path
        out, and one that failed for a local reason (capture/canary.py rule 2: e.g. the agent holds every
        ephemeral port) observed nothing: either way, before Ready the boundary exits, after it enforcement is
        lost."""
        self.lifecycle.check(Op.FENCE_PROBE)
        if self.attach is None or self.attach.fence_canary is None:
            raise OpError(ErrorKind.INVALID, "no fence canary in the attach descriptor", field="fence_canary")
        address, port = parse_canary(self.attach.fence_canary)
        number = (self.canary_probe.probe + 1) if self.canary_probe is not None else 1
        result = await probe_canary(number, address, port)
        self.canary_probe = result
        self.log.emit(EventName.FENCE_CANARY_PROBE, **result.to_json())
        if result.connected or not result.conclusive:
            reason = (
                f"connected to the fence canary {result.target} from the pod: a path out exists"
                if result.connected
                else f"the probe of the fence canary {result.target} failed inside the pod ({result.error}), "
                "not at a fence: nothing observed"
            )
            if self.lifecycle.state is State.BOUND:
                self._fatal(f"fence not in force: {reason}")
            else:
                await self._enforcement_lost({"problems": [reason]})
            raise OpError(ErrorKind.FAILED, f"fence not in force: {reason}", stage="fence-probe")
        return result.to_json()

    async def op_fence_observed(self, body: dict[str, Any]) -> dict[str, Any]:
        """Control's report of a repeated probe (every 30 s after Ready): a connection it saw is enforcement
        lost; a canary it could not reach itself is said, and the fence stays as it was confirmed."""
        self.lifecycle.check(Op.FENCE_PROBE)
        if self.lifecycle.state is State.BOUND or self.fence is None:
            raise OpError(ErrorKind.INVALID, "fence-observed: confirm first")
        report = CanaryReport.from_wire(body.get("canary"))
        if self.canary_probe is None or report.probe != self.canary_probe.probe:
            raise OpError(ErrorKind.INVALID, f"no probe {report.probe} to report on", field="canary.probe")
        if report.seen:
            reason = f"control's fence canary saw {report.seen} connection(s) from outside it: {list(report.peers)}"
            await self._enforcement_lost({"problems": [reason]})
            raise OpError(ErrorKind.FAILED, f"fence not in force: {reason}", stage="fence-observed")
        if report.self_check != "ok":
            self.log.emit(EventName.FENCE_CANARY_UNVERIFIED, reason=report.self_check, probe=report.probe)
        self.fence["canary_self_check"] = report.self_check
        return {"probe": report.probe, "observed": report.observed}

    async def _verify_fence(self) -> dict[str, Any]:
        """Read the fence back and probe it from inside the agent's namespace (spec §1.2 confirm)."""
        assert self.attach is not None and self.prepared is not None and self.capture is not None
        port = self.attach.capture_ports[0]
        try:
            report = await self.launcher.capture_call("inspect", {"expect_anyip": True})
            probe = await self.launcher.capture_call(
                "probe", {"address": PROBE_ADDRESS, "port": port, "expect_listener_port": port}
            )
        except (LauncherError, OSError) as exc:
            report, probe = {"ok": False, "problems": [f"fence read-back failed: {exc}"]}, {"ok": False}
        _drain(self.prepared.fds.get(f"tcp4:{port}"))  # the probe's own connection must not reach the handler
        problems = list(report.get("problems") or [])
        if not probe.get("ok", False) or not probe.get("captured", False):
            problems.append(f"probe to {PROBE_ADDRESS}:{port} was not captured: {probe.get('error')}")
        if not report.get("ok", False) or problems:
            self._fatal(f"fence not in force: {problems}")
            raise OpError(ErrorKind.FAILED, f"fence not in force: {problems}", stage="confirm")
        return {"fingerprint": report.get("fingerprint"), "links": report.get("links"), "probe": "captured"}

    async def _watch_fence(self, fingerprint: str) -> None:
        """Re-read the fence on every rtnetlink and nftables notification of the agent's namespace and every 5 s
        (capture/fence_watch.py); a changed fingerprint ends the workload."""
        notifications: list[socket.socket] = []
        try:
            notifications.append(rtnetlink_groups_socket(
                await self.launcher.socket_in_netns(socket.AF_NETLINK, socket.SOCK_RAW)
            ))  # fmt: skip
        except OSError as exc:
            self.log.emit(EventName.FENCE_WATCH, notifications=False, reason=f"timer only: {exc}")
        nftables: dict[str, Any] = {"nftables_notifications": True}
        try:
            notifications.append(nftables_groups_socket(
                await self.launcher.socket_in_netns(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
            ))  # fmt: skip
        except OSError as exc:  # the timer still sees nftables changes, within 5 s
            nftables = {"nftables_notifications": False, "nftables_reason": str(exc)}

        async def inspect() -> dict[str, Any]:
            return await self.launcher.capture_call("inspect", {"expect_anyip": True})

        watch = FenceWatch(
            expected=fingerprint, inspect=inspect, on_lost=self._enforcement_lost, notifications=notifications,
            on_error=lambda reason: self.log.emit(EventName.FENCE_WATCH_ERROR, reason=reason),
        )  # fmt: skip
        assert self._nursery is not None
        await self._nursery.start(watch.run)
        self.log.emit(EventName.FENCE_WATCH, notifications=bool(notifications), interval_s=watch.interval_s, **nftables)

    async def _enforcement_lost(self, report: dict[str, Any]) -> None:
        """The fence changed under a running workload: kill every workload process now (no grace), the agent's
        result says ``enforcement-lost``, and the daemon ends as on the agent's exit."""
        problems = list(report.get("problems") or [])
        reason = "fence changed: " + ("; ".join(problems) if problems else "fingerprint differs from confirm's")
        self.enforcement_lost = reason
        self.log.emit(
            EventName.ENFORCEMENT_LOST, reason=reason, problems=problems, links=report.get("links"),
            fingerprint_confirmed=(self.fence or {}).get("fingerprint"), fingerprint_now=report.get("fingerprint"),
            trigger=report.get("trigger"),
        )  # fmt: skip
        started = self.table.agent is not None
        await self.table.end_all(EndReason.ENFORCEMENT_LOST, kill=True)
        if not started:  # ready, never started: nothing will report an agent exit
            self._fatal(reason)

    def _managed_env(self) -> Mapping[str, str]:
        """CA env at the fixed path in R and U (a read-only bind of our tls dir); in P where we wrote them."""
        if self._env_memo is not None and self._env_memo[0] is self.trust:
            return self._env_memo[1]
        if self.trust is None:
            env = managed_env(ca_cert=None, ca_bundle=None)
        else:
            ca_path, bundle_path = self.trust
            if self.cfg.privilege_model != PrivilegeModel.P:
                ca_path, bundle_path = Path(TRUST_PATH) / ca_path.name, Path(TRUST_PATH) / bundle_path.name
            env = managed_env(ca_cert=str(ca_path), ca_bundle=str(bundle_path))
        self._env_memo = (self.trust, MappingProxyType(env))
        return self._env_memo[1]

    def _home(self, uid: int) -> str | None:
        """``HOME``: the account's, unless the agent's own root (R, U) leaves it out; then the workdir."""
        if self.cfg.privilege_model == PrivilegeModel.P:
            return None
        found = account(uid)
        if found is None:
            return None  # no account: the environment falls back to the workdir already
        home = found[1]
        assert self.attach is not None
        fs = self.attach.static_policy.filesystem
        writable = [self.cfg.workdir, *(fs.read_write if fs is not None else ())]
        return None if any(under(home, path) for path in writable) else self.cfg.workdir

    def _landlock(self, uid: int) -> LandlockSpec:
        assert self.attach is not None
        if self._landlock_memo is not None and self._landlock_memo[0] is self.attach and self._landlock_memo[1] == uid:
            return self._landlock_memo[2]
        spec = landlock_for(
            self.attach.static_policy, self.cfg.workdir, model=self.cfg.privilege_model, agent_uid=uid,
            trust_dir=str(self.cfg.tls_dir) if self.cfg.privilege_model == PrivilegeModel.P else None,
        )  # fmt: skip
        if self.cfg.test_landlock_off:
            spec = dataclasses.replace(spec, mode="off")
        self._landlock_memo = (self.attach, uid, spec)
        return spec

    async def op_start(self, body: dict[str, Any]) -> dict[str, Any]:
        self.lifecycle.check(Op.START)
        assert self.attach is not None
        uid, gid = self._agent_ids(self.attach)
        agent: dict[str, Any] = {"argv": list(self.cfg.agent_argv), "cwd": self.cfg.workdir, "tty": False}
        if self.cfg.agent_stdio == "tty":  # its own terminal, streamed to whoever attaches (dev mode's terminal)
            cols, rows = self.cfg.agent_tty_size
            agent.update(tty=True, cols=cols, rows=rows, env={"TERM": self.cfg.agent_term})
        request = parse_exec_request(agent)
        spec = build_process_spec(
            request, agent_uid=uid, agent_gid=gid, managed_env=self._managed_env(), default_cwd=self.cfg.workdir,
            landlock=self._landlock(uid), home=self._home(uid),
            provider_env=self.attach.credential_placeholders,
        )  # fmt: skip
        if self.cfg.agent_stdio == "inherit":
            spec = dataclasses.replace(spec, stdin="inherit", stdout="inherit", stderr="inherit")
        try:
            entry = await self.table.start(spec, kind="agent")
        except OpError as exc:
            self.lifecycle.end()
            self.exit_code = for_launch_errno(exc.errno)
            self.log.emit(EventName.AGENT_LAUNCH_FAILED, error=exc.to_json(), exit_code=self.exit_code,
                          program=self.cfg.agent_argv[0])  # fmt: skip
            self._end_soon()
            raise
        self.lifecycle.advance(Op.START)
        self.log.emit(EventName.LIFECYCLE_RUNNING, agent=entry.handle, argv=list(self.cfg.agent_argv))
        return {"state": str(self.lifecycle.state), "agent": entry.handle}

    async def op_resume(self, body: dict[str, Any]) -> dict[str, Any]:
        # The link's claims were verified exactly equal to ours (generation included) before any request.
        self.lifecycle.check(Op.RESUME)
        return self._status()

    async def op_status(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._status()

    def _status(self) -> dict[str, Any]:
        agent = self.table.agent
        result = agent.result.to_wire() if agent is not None and agent.result is not None else None
        return {
            "state": str(self.lifecycle.state),
            "boundary_instance": self.instance,
            "privilege_model": self.cfg.privilege_model,
            "capture_mode": str(self.attach.capture_mode) if self.attach else None,
            "fence": self.fence,
            "enforcement_lost": self.enforcement_lost,
            "policy_generation": self.policy_generation_acked,
            "agent": None if agent is None else {"handle": agent.handle, "result": result},
            "processes": [self._redacted(process) for process in self.table.live()],
            "links": len(self.links),
            "limits": self._limits_now(),
            # The CA the agent was given to trust: a control that resumes with another one says so.
            "interception_ca_sha256": self._interception_ca_sha256(),
        }

    def _redacted(self, process: dict[str, Any]) -> dict[str, Any]:
        """A process as status shows it: a credential placeholder in its argv reads ``[CREDENTIAL]``, as in the
        events (control's ``l7/rewrite.py``)."""
        placeholders = (
            sorted(self.attach.credential_placeholders.values(), key=len, reverse=True) if self.attach else []
        )
        argv = []
        for arg in process.get("argv") or ():
            for placeholder in placeholders:
                arg = arg.replace(placeholder, REDACTED_CREDENTIAL)
            argv.append(arg)
        return {**process, "argv": argv}

    @property
    def lifecycle_state(self) -> str:
        return str(self.lifecycle.state)

    def limits_now(self) -> dict[str, Any]:
        return self._limits_now()

    def _limits_now(self) -> dict[str, Any]:
        """Every limit, whether it is enforced (and why not), and the cgroups' counters now."""
        now = dict(self.limits)
        if self.pids_cgroup is not None:
            now["pids_current"] = self.pids_cgroup.current()
        if self.memory_cgroup is not None:
            now["memory_current"] = self.memory_cgroup.current()
            now["memory_oom_kills"] = self.memory_cgroup.oom_kills()
        return now

    def _fixed_limits(self) -> dict[str, Any]:
        """The limits the configuration alone decides: the workdir's size and the private /tmp and /dev/shm."""
        fixed: dict[str, Any] = {
            "workdir_size": "unenforced",
            "workdir_size_reason": "the workdir is a host directory (dev mode) or the pod's volume, given to the "
            "agent as it is: it has no filesystem of its own whose size could be capped",
        }
        if self.cfg.privilege_model == PrivilegeModel.P:
            shared = "model P: the agent shares the pod's own, sized by the pod"
            fixed.update(tmp_size="unenforced", tmp_size_reason=shared, shm_size="unenforced", shm_size_reason=shared)
        else:
            fixed.update(tmp_size=self.cfg.tmp_size, shm_size=self.cfg.shm_size)  # tmpfs size= (rootfs.py)
        return fixed

    def _interception_ca_sha256(self) -> str | None:
        pem = self.attach.interception_ca_pem if self.attach else None
        if not pem:
            return None
        try:
            return pem_fingerprint(pem)
        except ValueError:
            return None

    async def op_wait(self, body: dict[str, Any]) -> dict[str, Any]:
        self.lifecycle.check(Op.WAIT)
        req = parse_wait_request(body)
        return (await self.table.wait(req.handle, req.timeout_s)).to_wire()

    async def op_signal(self, body: dict[str, Any]) -> dict[str, Any]:
        self.lifecycle.check(Op.SIGNAL)
        req = parse_signal_request(body)
        self.table.signal(req.handle, req.signal, str(req.scope))
        return {"handle": req.handle, "signal": req.signal, "delivered": True}

    async def op_terminate(self, body: dict[str, Any]) -> dict[str, Any]:
        req = parse_terminate_request(body)
        try:
            self.lifecycle.check(Op.TERMINATE)
        except OpError as exc:
            # The agent had already ended: terminated (§1.3-1.4), with what ended it.
            raise self._agent_already_ended(req.handle) or exc from None
        self.terminating += 1
        try:
            return (await self.table.terminate(req.handle, req.grace_s)).to_wire()
        except OpError as exc:
            raise self._agent_already_ended(req.handle) or exc from None  # it exited on its own meanwhile
        finally:
            self.terminating -= 1
            if not self.terminating:
                self.terminates_done.set()
                self.terminates_done = trio.Event()

    def _agent_already_ended(self, handle: str) -> OpError | None:
        """``terminated`` carrying the agent's result when ``handle`` is the agent's and it has ended."""
        agent = self.table.agent
        if agent is None or agent.handle != handle or agent.result is None:
            return None
        return OpError(ErrorKind.TERMINATED, f"terminate: {why_ended(agent.result)} already", field="handle",
                       result=agent.result)  # fmt: skip

    async def op_policy_ack(self, body: dict[str, Any]) -> dict[str, Any]:
        generation = body.get("policy_generation")
        if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
            raise OpError(ErrorKind.INVALID, "policy_generation must be a non-negative integer", "policy_generation")
        self.policy_generation_acked = generation
        self.log.emit(EventName.POLICY_ACKNOWLEDGED, policy_generation=generation)
        return {"policy_generation": generation}

    async def op_exit_ack(self, body: dict[str, Any]) -> dict[str, Any]:
        self.lifecycle.check(Op.EXIT_ACK)
        self.exit_acked.set()
        return {"acknowledged": True}

    async def op_exec(self, body: dict[str, Any], stream: LinkStream, accept: Accept) -> None:
        self.lifecycle.check(Op.EXEC)
        assert self.attach is not None
        request = parse_exec_request(body)
        uid, gid = self._agent_ids(self.attach)
        spec = build_process_spec(
            request, agent_uid=uid, agent_gid=gid, managed_env=self._managed_env(), default_cwd=self.cfg.workdir,
            landlock=self._landlock(uid), home=self._home(uid),
            provider_env=self.attach.credential_placeholders,
        )  # fmt: skip
        entry = await self.table.start(spec, kind="exec", timeout_s=request.timeout_s, grace_s=request.grace_s)
        await accept({"handle": entry.handle, "tty": entry.tty})
        await pump_exec(entry, stream)

    async def op_attach_stream(self, body: dict[str, Any], stream: LinkStream, accept: Accept) -> None:
        """Re-attach to an exec's output after its client or control went away (spec §2.3): the buffered tail
        (a ``lagged`` frame first if some was dropped), then live output, then ``exit``. An agent with a terminal
        of its own (``--agent-stdio=tty``) is attached the same way: that is how dev mode's terminal reaches it."""
        self.lifecycle.check(Op.EXEC)
        handle = body.get("handle")
        if not isinstance(handle, str) or set(body) - {"handle"}:
            raise OpError(ErrorKind.INVALID, "body must be {handle}", field="handle")
        entry = self.table.entry(handle)
        if entry.output is None or (entry.kind != "exec" and not entry.tty):
            raise OpError(ErrorKind.INVALID, "only an exec's or a terminal agent's output can be attached", "handle")
        if entry.output.attached:
            raise OpError(ErrorKind.UNAVAILABLE, "a stream is already attached to this process", field="handle")
        await accept({"handle": entry.handle, "tty": entry.tty})
        await pump_exec(entry, stream)

    async def op_forward(self, body: dict[str, Any], stream: LinkStream, accept: Accept) -> None:
        self.lifecycle.check(Op.FORWARD)
        target = parse_forward_request(body, self._reserved_ports())
        if is_forward_probe(body):  # `forward`'s start-up question: would this target be accepted? No connection
            await accept({"host": target.host, "port": target.port, "probe": True})
            return
        local = await open_forward(self.launcher, target.host, target.port, self._reserved_ports())
        await accept({"host": target.host, "port": target.port})
        stats = await relay(stream, local, idle_timeout=math.inf)
        self.log.emit(
            EventName.FORWARD_CLOSED, host=target.host, port=target.port, bytes_in=stats.bytes_a_to_b,
            bytes_out=stats.bytes_b_to_a, closed_by=str(stats.closed_by),
        )  # fmt: skip

    def _reserved_ports(self) -> set[int]:
        """Ports a forward may never reach: our own listeners inside the agent's namespace (spec §3 rule 4)."""
        ports = {self.cfg.listen_port, PROXY_PORT, 53}
        if self.attach is not None:
            ports.update(self.attach.capture_ports)
        return ports

    def _pids_limit(self) -> int | None:
        """The workload's ``pids.max`` where it is enforced (the exec log's bound on live processes), else None."""
        limit = self.limits.get("pids")
        return limit if isinstance(limit, int) and not isinstance(limit, bool) else None

    def _limit_pids(self) -> None:
        """The launcher joins the workload's pids cgroup before it forks anything (cgroups.py rule 4); where no
        cgroup can be made the limit is reported unenforced (inside a pod: the cluster's podPidsLimit)."""
        limit = self.cfg.pids_limit
        try:
            if limit <= 0:
                raise CgroupError("disabled by --pids-limit=0")
            group = create_pids_cgroup(workload_cgroup_name(os.getpid(), self.instance), limit)
            try:
                group.add(self.launcher.pid)
            except OSError as exc:
                group.remove()
                raise CgroupError(f"cannot move the launcher into {group.directory}: {exc.strerror}") from None
        except CgroupError as exc:
            self.limits.update(pids="unenforced", pids_reason=str(exc))
            self.log.emit(EventName.LIMITS_PIDS, enforced=False, limit=None, reason=str(exc))
            return
        self.pids_cgroup = group
        if group.stale_removed:  # a SIGKILLed boundary's leftovers (cgroups.py rule 5)
            self.log.emit(EventName.LIMITS_PIDS_CGROUP_STALE_REMOVED, cgroups=list(group.stale_removed))
        self.limits.update(pids=limit, pids_cgroup=group.describe())
        self.log.emit(EventName.LIMITS_PIDS, enforced=True, limit=limit, cgroup=group.describe())

    def _limit_memory(self) -> None:
        """The launcher joins the workload's memory cgroup before it forks anything, as the pids one
        (memory_cgroup.py rule 1); where none can be made the limit is reported unenforced (inside a pod: the
        container's limit)."""
        limit = self.cfg.memory_limit
        try:
            if limit <= 0:
                raise CgroupError("disabled by --memory-limit=0")
            group = create_memory_cgroup(workload_cgroup_name(os.getpid(), self.instance), limit)
            if not group.shares_pids_child:
                try:
                    group.add(self.launcher.pid)
                except OSError as exc:
                    group.remove()
                    raise CgroupError(f"cannot move the launcher into {group.directory}: {exc.strerror}") from None
        except CgroupError as exc:
            self.limits.update(memory="unenforced", memory_reason=str(exc))
            self.log.emit(EventName.LIMITS_MEMORY, enforced=False, limit=None, reason=str(exc))
            return
        self.memory_cgroup = group
        self.table.oom_kills = group.oom_kills
        self.limits.update(memory=group.limit, memory_cgroup=group.describe(), memory_swap=group.swap)
        self.log.emit(
            EventName.LIMITS_MEMORY, enforced=True, limit=group.limit, cgroup=group.describe(), swap=group.swap,
            stale_removed=list(group.stale_removed),
        )  # fmt: skip

    def _oom_score(self, pidns: bool) -> None:
        """The workload's init — and so every workload process, forked below it — at oom_score_adj 1000, so any
        OOM kill, the memory cgroup's or the host's, picks a workload process before the launcher (raising needs
        no capability). Where we hold CAP_SYS_RESOURCE the kernel also makes 1000 their floor, and the launcher
        goes to -1000: never picked (memory_cgroup.py rule 5). Without a workload init (model P) the launcher
        forks the workload itself and is left alone."""
        init_pid = self.launcher.init_pid
        why = None if pidns else "model P: the workload has no init of its own to set it on"
        if why is None and init_pid is None:
            why = "the launcher did not name the workload's init"
        if why is None:
            assert init_pid is not None
            try:
                set_oom_score_adj(init_pid, WORKLOAD_OOM_SCORE_ADJ)
            except OSError as exc:
                why = f"cannot set the workload's oom_score_adj: {exc.strerror or exc}"
        if why is not None:
            self.limits.update(oom_score_adj="unenforced", oom_score_adj_reason=why)
            return
        self.limits.update(oom_score_adj=WORKLOAD_OOM_SCORE_ADJ)
        no_floor = privileged_for_oom_score()
        if no_floor is None:
            try:
                set_oom_score_adj(self.launcher.pid, LAUNCHER_OOM_SCORE_ADJ)
            except OSError as exc:
                no_floor = f"cannot set the launcher's oom_score_adj: {exc.strerror or exc}"
        self.limits.update(oom_score_adj_floor=no_floor is None)
        if no_floor is not None:  # R and U mount the agent's /proc read-only: it cannot write it there either
            self.limits.update(oom_score_adj_floor_reason=no_floor)

    def _publish_state(self, state: State) -> None:
        """Every lifecycle state to ``--state-file`` (state_file.py); the probe fails closed on a failed write."""
        if self.cfg.state_file is not None:
            state_file.publish(self.cfg.state_file, str(state))

    # -- failure ------------------------------------------------------------------------------------------------
    def _fatal(self, reason: str) -> None:
        """An authenticated lifecycle step failed: reply, then exit non-zero (spec §1.1)."""
        self.log.emit(EventName.LIFECYCLE_FAILED, reason=reason)
        self.lifecycle.end()
        self.exit_code = ExitCode.SELF_FAILED
        self._end_soon()

    def _end_soon(self) -> None:
        async def later() -> None:
            with trio.move_on_after(REPLY_FLUSH_S):  # the failed operation's error reply goes out first
                await self.router.replies_flushed()
            if self._nursery is not None:
                self._nursery.cancel_scope.cancel()

        if self._nursery is not None:
            self._nursery.start_soon(later)


def _proxy_listener() -> int:
    """The HTTP proxy listener for proxy-env mode, on the pod's loopback (never SO_REUSEPORT)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", PROXY_PORT))
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        reason = f"cannot listen on 127.0.0.1:{PROXY_PORT}: {exc.strerror}"
        raise OpError(ErrorKind.FAILED, reason, stage="attach") from None
    return sock.detach()


def _drain(fd: int | None) -> None:
    """Accept and drop whatever is queued on a listener (before the agent exists, only our probe can be)."""
    if fd is None:
        return
    sock = socket.socket(fileno=os.dup(fd))
    sock.setblocking(False)
    try:
        while True:
            conn, _ = sock.accept()
            conn.close()
    except (BlockingIOError, OSError):
        pass
    finally:
        sock.close()


def run(cfg: BoundaryConfig, launcher: Launcher) -> int:
    """Run the daemon under trio; ``launcher`` was forked before trio (no thread may exist at fork time)."""
    return trio.run(BoundaryDaemon(cfg, launcher).serve)
