"""What every step of the boundary daemon reads and advances: the lifecycle, the workload, the links.

The daemon is the lifecycle's one owner (docs/reference/boundary.md §1): attach, confirm, start and the process
operations each check and advance the same state, so it lives in one object that each step's module is handed.
The failure path (``fatal``) is here too: any step may end the daemon after its reply.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import trio

from supervisor.boundary import state_file
from supervisor.boundary.config import PROXY_PORT, BoundaryConfig
from supervisor.boundary.egress import EgressCapture, EgressLinks
from supervisor.boundary.limits import WorkloadLimits
from supervisor.boundary.limits_report import LimitsReport
from supervisor.boundary.metrics import BoundaryMetrics
from supervisor.boundary.process import Launcher, Prepared
from supervisor.boundary.process.table import ProcessTable
from supervisor.link.h2link import Link
from supervisor.link.rpc import Router
from supervisor.protocol.attach import AttachRequest
from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.event_names import EventName
from supervisor.protocol.exit_codes import ExitCode
from supervisor.protocol.fence_report import FenceReport
from supervisor.protocol.lifecycle import Lifecycle, State
from supervisor.protocol.privilege_model import PrivilegeModel

REPLY_FLUSH_S = 2.0  # how long an ending daemon waits for its last replies to be written to control


class DaemonState:
    """The lifecycle, the workload and the links, shared by every step; set up before ``trio.run``."""

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
        self.fence: FenceReport | None = None
        self.policy_generation_acked: int | None = None
        self.exit_acked = trio.Event()
        self.exit_code: int | None = None
        self.links: set[Link] = set()
        self.egress_links = EgressLinks()
        self.trust: tuple[Path, Path] | None = None  # (CA file, bundle file) given to the workload
        self.capture: EgressCapture | None = None
        self.limits = WorkloadLimits(cfg, self.log)
        self.terminating = 0  # terminate calls in flight: their replies go out before the daemon ends
        self.terminates_done = trio.Event()
        self.enforcement_lost: str | None = None  # the watched fence changed: why (capture/fence_watch.py)
        self.router = Router()  # the operations are registered by the daemon (boundary/daemon.py)
        self.nursery: trio.Nursery | None = None  # the daemon's own, while it serves
        self.metrics = BoundaryMetrics(self.log, self)  # every event moves it (boundary/metrics.py), served or not
        self.log.sink = self.metrics.observe

    # -- what the metrics read (boundary/metrics.py BoundaryState) ---------------------------------------------
    @property
    def lifecycle_state(self) -> str:
        return str(self.lifecycle.state)

    def limits_now(self) -> LimitsReport:
        return self.limits.now()

    # -- shared by the steps ----------------------------------------------------------------------------------
    def agent_ids(self, attach: AttachRequest) -> tuple[int, int]:
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

    def reserved_ports(self) -> set[int]:
        """Ports a forward may never reach: our own listeners inside the agent's namespace (spec §3 rule 4)."""
        ports = {self.cfg.listen_port, PROXY_PORT, 53}
        if self.attach is not None:
            ports.update(self.attach.capture_ports)
        return ports

    def _publish_state(self, state: State) -> None:
        """Every lifecycle state to ``--state-file`` (state_file.py); the probe fails closed on a failed write."""
        if self.cfg.state_file is not None:
            state_file.publish(self.cfg.state_file, str(state))

    # -- failure ----------------------------------------------------------------------------------------------
    def fatal(self, reason: str) -> None:
        """An authenticated lifecycle step failed: reply, then exit non-zero (spec §1.1)."""
        self.log.emit(EventName.LIFECYCLE_FAILED, reason=reason)
        self.lifecycle.end()
        self.exit_code = ExitCode.SELF_FAILED
        self.end_soon()

    def end_soon(self) -> None:
        """End the daemon once the failed operation's reply is written (or after ``REPLY_FLUSH_S``)."""

        async def later() -> None:
            with trio.move_on_after(REPLY_FLUSH_S):  # the failed operation's error reply goes out first
                await self.router.replies_flushed()
            if self.nursery is not None:
                self.nursery.cancel_scope.cancel()

        if self.nursery is not None:
            self.nursery.start_soon(later)
