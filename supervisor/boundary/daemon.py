"""The boundary daemon: listens for control, runs the lifecycle, owns the workload.

Order of events in a boundary's life, and the module of each step:

1. ``main`` loads the bootstrap bundle (refusing the other role's key), picks the privilege model and forks the
   launcher — before ``trio.run`` and before any thread exists (docs/design.md "Privilege models"); what it
   decided is a ``BoundaryConfig`` (config.py).
2. The daemon listens (never ``SO_REUSEPORT``) and only listens: control dials (listen.py).
3. ``attach`` prepares the agent's namespaces and the capture (attach.py, capture_start.py, limits.py);
   ``confirm`` reads the fence back (fence.py); ``start`` launches the agent (workload_ops.py).
4. Agent exit ends Running: every workload process is terminated, the result is kept for ``wait``, and the
   daemon exits with the agent's rendered code once control acknowledged it (or after ``exit_linger``)
   (shutdown.py, reports.py).

What the steps share — the lifecycle, the workload, the links — is one ``DaemonState`` (state.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import trio

from supervisor.boundary.attach import AttachStep
from supervisor.boundary.config import BoundaryConfig
from supervisor.boundary.fence import FenceSteps
from supervisor.boundary.listen import open_listeners, serve_connection
from supervisor.boundary.process import Launcher
from supervisor.boundary.reports import Reports
from supervisor.boundary.shutdown import Shutdown
from supervisor.boundary.state import DaemonState
from supervisor.boundary.workload_ops import WorkloadOps
from supervisor.link.rpc import Router
from supervisor.metrics import PATH as METRICS_PATH
from supervisor.metrics import MetricsServer
from supervisor.protocol.acks import NoArguments, PolicyAck
from supervisor.protocol.attach import AttachReader
from supervisor.protocol.channel_ops import AttachStreamRequest, ForwardRequest
from supervisor.protocol.event_names import EventName
from supervisor.protocol.fence_canary import FenceObserved
from supervisor.protocol.fence_report import ConfirmRequest
from supervisor.protocol.lifecycle import Op
from supervisor.protocol.process_ops import ExecRequest, SignalRequest, TerminateRequest, WaitRequest
from supervisor.protocol.status import ResumeRequest
from supervisor.protocol.tls import ALPN_EGRESS, ALPN_OPS, server_context


class BoundaryDaemon:
    def __init__(self, cfg: BoundaryConfig, launcher: Launcher) -> None:
        self.state = DaemonState(cfg, launcher)
        self.attach = AttachStep(self.state)
        self.fence = FenceSteps(self.state)
        self.workload = WorkloadOps(self.state)
        self.reports = Reports(self.state)
        self.shutdown = Shutdown(self.state)
        self._register(self.state.router)

    def _register(self, router: Router) -> None:
        """Every operation control may call, by path (docs/reference/boundary.md §1.4)."""
        attach_refused = self.attach.refused
        descriptor = AttachReader(self.state.cfg.bundle.claims)  # read against our claims
        router.unary("/v1/attach", descriptor, self.attach.op_attach, before=self._lifecycle(Op.ATTACH),
                     refused=attach_refused)  # fmt: skip
        router.unary("/v1/confirm", ConfirmRequest, self.fence.op_confirm, before=self._lifecycle(Op.CONFIRM))
        router.unary("/v1/start", NoArguments, self.workload.op_start)
        router.unary("/v1/resume", ResumeRequest, self.reports.op_resume, before=self._lifecycle(Op.RESUME))
        router.unary("/v1/status", NoArguments, self.reports.op_status)
        router.unary("/v1/wait", WaitRequest, self.workload.op_wait, before=self._lifecycle(Op.WAIT))
        router.unary("/v1/signal", SignalRequest, self.workload.op_signal, before=self._lifecycle(Op.SIGNAL))
        router.unary("/v1/terminate", TerminateRequest, self.workload.op_terminate)
        router.unary("/v1/policy-ack", PolicyAck, self.reports.op_policy_ack)
        exit_ack = self._lifecycle(Op.EXIT_ACK)
        router.unary("/v1/agent/exit-ack", NoArguments, self.reports.op_exit_ack, before=exit_ack)
        router.unary("/v1/fence-probe", NoArguments, self.fence.op_fence_probe)
        observed_allowed = self.fence.fence_observed_allowed
        router.unary("/v1/fence-observed", FenceObserved, self.fence.op_fence_observed, before=observed_allowed)
        router.channel("/v1/exec", ExecRequest, self.workload.op_exec, before=self._lifecycle(Op.EXEC))
        router.channel("/v1/forward", ForwardRequest, self.workload.op_forward, before=self._lifecycle(Op.FORWARD))
        attach_stream = self.workload.op_attach_stream
        router.channel("/v1/attach-stream", AttachStreamRequest, attach_stream, before=self._lifecycle(Op.EXEC))

    def _lifecycle(self, op: Op) -> Callable[[], None]:
        """The lifecycle's check for ``op``: refused in the wrong state before the request is read."""
        return functools.partial(self.state.lifecycle.check, op)

    async def serve(self) -> int:
        state = self.state
        cfg = state.cfg
        ctx = server_context(cfg.bundle, (ALPN_OPS, ALPN_EGRESS))
        listeners = await open_listeners(state)
        if cfg.test_landlock_off:
            state.log.emit(
                EventName.BOUNDARY_TEST_KNOB, knob="landlock-off", warning="Landlock is off for every launch"
            )
        async with trio.open_nursery() as nursery:
            state.nursery = nursery
            if cfg.metrics_listen is not None:
                metrics_host, metrics_port = cfg.metrics_listen
                server = MetricsServer(state.metrics.registry, metrics_host, metrics_port)
                address = await nursery.start(server.serve)
                state.log.emit(EventName.METRICS_LISTENING, address=address, path=METRICS_PATH)
            await nursery.start(state.table.run)
            nursery.start_soon(self.shutdown.signals, nursery)
            nursery.start_soon(self.shutdown.watch_agent, nursery)
            nursery.start_soon(trio.serve_listeners, functools.partial(serve_connection, state, ctx=ctx), listeners)
        return self.shutdown.finish()


def run(cfg: BoundaryConfig, launcher: Launcher) -> int:
    """Run the daemon under trio; ``launcher`` was forked before trio (no thread may exist at fork time)."""
    return trio.run(BoundaryDaemon(cfg, launcher).serve)
