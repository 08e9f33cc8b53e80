"""The confirm step and the fence's watch (docs/reference/boundary.md §1.2): read the fence back (netns) or
observe it through control's canary (proxy-env), start the capture, narrow the capabilities; then, while the
workload runs, a fence that changes or a canary that is reached is enforcement lost.
"""

from __future__ import annotations

import os
import socket

import trio

from supervisor.boundary.capture.canary import probe_canary
from supervisor.boundary.capture.fence_watch import (
    NETLINK_NETFILTER,
    FenceWatch,
    nftables_groups_socket,
    rtnetlink_groups_socket,
)
from supervisor.boundary.capture.readback import FenceReadback, NetnsProbe
from supervisor.boundary.forkimage import capabilities
from supervisor.boundary.process import LauncherError
from supervisor.boundary.state import DaemonState
from supervisor.protocol.acks import NoArguments
from supervisor.protocol.attach import CaptureMode
from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.event_names import EventName
from supervisor.protocol.exit_result import EndReason
from supervisor.protocol.fence_canary import (
    FenceObserved,
    FenceObservedReply,
    ProbeResult,
    parse_canary,
)
from supervisor.protocol.fence_report import (
    CAPTURED,
    PROBED_BY_CANARY,
    UNPROBED,
    ConfirmReply,
    ConfirmRequest,
    FenceReport,
)
from supervisor.protocol.json_value import JsonValue
from supervisor.protocol.lifecycle import Op, State
from supervisor.protocol.privilege_model import PrivilegeModel

PROBE_ADDRESS = "192.0.2.1"  # TEST-NET-1: inside the agent's namespace it can only land on our own listener
EGRESS_LINK_WAIT_S = 1.0  # confirm waits this long for control's first egress link (its dial just completed)


class FenceSteps:
    """``/v1/confirm`` (Bound to Ready), ``/v1/fence-probe`` and ``/v1/fence-observed``, and the fence's watch
    while the workload runs."""

    def __init__(self, state: DaemonState) -> None:
        self.state = state
        self.canary_probe: ProbeResult | None = None  # the last probe of control's canary (proxy-env)

    async def op_confirm(self, req: ConfirmRequest) -> ConfirmReply:
        """After ``lifecycle.check(Op.CONFIRM)`` (the router's ``before``)."""
        state = self.state
        assert state.attach is not None and state.prepared is not None
        with trio.move_on_after(EGRESS_LINK_WAIT_S):  # control asks once its dial completed: ours is moments away
            await state.egress_links.wait_live()
        if len(state.egress_links) == 0:
            raise OpError(ErrorKind.UNAVAILABLE, "no egress link from control yet: mediation is not connected")
        mode, model = state.attach.capture_mode, str(state.cfg.privilege_model)
        if mode is CaptureMode.NETNS:
            fingerprint, links = await self._verify_fence()
            fence = FenceReport(mode, model, CAPTURED, fingerprint=fingerprint, links=links)
        elif state.attach.fence_canary is not None:
            target, probe_error = self._canary_observed(req)
            fence = FenceReport(mode, model, PROBED_BY_CANARY, canary=target, probe_error=probe_error)
        else:
            # Acknowledged "no probe" by the operator in both places (docs/design.md: no probe leaves the machine
            # unless the deployment configured its target): reported as such, never claimed as verified.
            fence = FenceReport(mode, model, UNPROBED)
        if state.capture is not None:
            assert state.nursery is not None
            await state.nursery.start(state.capture.run)
        state.fence = fence
        state.lifecycle.advance(Op.CONFIRM)
        state.log.emit(EventName.LIFECYCLE_READY, fence=fence.to_wire())
        if mode is CaptureMode.NETNS and fence.fingerprint:
            await self._watch_fence(fence.fingerprint)
        if state.cfg.privilege_model == PrivilegeModel.R:
            self._narrow_capabilities()
        return ConfirmReply(state.lifecycle.state, fence)

    def _narrow_capabilities(self) -> None:
        """Model R, ready: the namespaces, listeners, fence watch and trust files are built; keep only what the
        running sandbox uses (forkimage/capabilities.py). A drop that does not take ends the sandbox."""
        state = self.state
        keep = capabilities.mask(capabilities.BOUNDARY_KEEPS)
        groups = [
            group.directory.parent
            for group in (state.limits.pids_cgroup, state.limits.memory_cgroup)
            if group is not None
        ]
        if not all(capabilities.owner_writes(str(parent)) for parent in groups):
            keep |= capabilities.mask(capabilities.BOUNDARY_CLEANUP_KEEPS)
        try:
            kept, dropped = capabilities.restrict(keep)
        except OSError as exc:
            state.fatal(f"capabilities: {exc}")
            raise OpError(ErrorKind.FAILED, f"capabilities: {exc}", stage="confirm") from None
        state.log.emit(
            EventName.BOUNDARY_CAPABILITIES, kept=capabilities.names(kept), dropped=capabilities.names(dropped),
            threads_beyond=capabilities.threads_beyond(keep),
        )  # fmt: skip

    def _canary_observed(self, req: ConfirmRequest) -> tuple[str, str]:
        """Model P's fence counts as observed only if our last probe's connect failed and control's report of
        that probe says its canary answered its own self-check and saw nothing else (protocol/fence_canary.py).
        Returns the canary's target and how our probe's connect failed."""
        state = self.state
        assert state.attach is not None and state.attach.fence_canary is not None
        probe = self.canary_probe
        problem = None
        report = req.canary
        if req.canary_problem is not None:
            problem = f"canary report: {req.canary_problem}"
        elif report is None:
            problem = "no canary report from control (confirm needs /v1/fence-probe first)"
        elif probe is None or report.probe != probe.probe:
            problem = f"the canary report is for probe {report.probe}, not the last probe"
        elif report.self_check != "ok":
            problem = f"control could not reach its own canary: {report.self_check}"
        elif report.seen:
            problem = f"control's canary saw {report.seen} connection(s) during the probe: {list(report.peers)}"
        if problem is not None:
            state.fatal(f"fence not observed: {problem}")
            raise OpError(ErrorKind.FAILED, f"fence not observed: {problem}", stage="confirm", field="canary")
        assert probe is not None
        return probe.target, probe.error

    async def op_fence_probe(self, req: NoArguments) -> ProbeResult:
        """Connect to control's canary from the pod's namespace (proxy-env); a connect that succeeds is a path
        out, and one that failed for a local reason (capture/canary.py rule 2: e.g. the agent holds every
        ephemeral port) observed nothing: either way, before Ready the boundary exits, after it enforcement is
        lost."""
        state = self.state
        state.lifecycle.check(Op.FENCE_PROBE)
        if state.attach is None or state.attach.fence_canary is None:
            raise OpError(ErrorKind.INVALID, "no fence canary in the attach descriptor", field="fence_canary")
        address, port = parse_canary(state.attach.fence_canary)
        number = (self.canary_probe.probe + 1) if self.canary_probe is not None else 1
        result = await probe_canary(number, address, port)
        self.canary_probe = result
        state.log.emit(EventName.FENCE_CANARY_PROBE, **result.to_wire())
        if result.connected or not result.conclusive:
            reason = (
                f"connected to the fence canary {result.target} from the pod: a path out exists"
                if result.connected
                else f"the probe of the fence canary {result.target} failed inside the pod ({result.error}), "
                "not at a fence: nothing observed"
            )
            if state.lifecycle.state is State.BOUND:
                state.fatal(f"fence not in force: {reason}")
            else:
                await self._enforcement_lost(FenceReadback(problems=(reason,)))
            raise OpError(ErrorKind.FAILED, f"fence not in force: {reason}", stage="fence-probe")
        return result

    def fence_observed_allowed(self) -> None:
        """What ``/v1/fence-observed`` needs before its report is read: past confirm."""
        state = self.state
        state.lifecycle.check(Op.FENCE_PROBE)
        if state.lifecycle.state is State.BOUND or state.fence is None:
            raise OpError(ErrorKind.INVALID, "fence-observed: confirm first")

    async def op_fence_observed(self, req: FenceObserved) -> FenceObservedReply:
        """Control's report of a repeated probe (every 30 s after Ready): a connection it saw is enforcement
        lost; a canary it could not reach itself is said, and the fence stays as it was confirmed. After
        :meth:`fence_observed_allowed` (the router's ``before``)."""
        state = self.state
        assert state.fence is not None
        report = req.canary
        if self.canary_probe is None or report.probe != self.canary_probe.probe:
            raise OpError(ErrorKind.INVALID, f"no probe {report.probe} to report on", field="canary.probe")
        if report.seen:
            reason = f"control's fence canary saw {report.seen} connection(s) from outside it: {list(report.peers)}"
            await self._enforcement_lost(FenceReadback(problems=(reason,)))
            raise OpError(ErrorKind.FAILED, f"fence not in force: {reason}", stage="fence-observed")
        if report.self_check != "ok":
            state.log.emit(EventName.FENCE_CANARY_UNVERIFIED, reason=report.self_check, probe=report.probe)
        state.fence = state.fence.with_self_check(report.self_check)
        return FenceObservedReply(report.probe, report.observed)

    async def _verify_fence(self) -> tuple[str | None, JsonValue]:
        """Read the fence back and probe it from inside the agent's namespace (spec §1.2 confirm)."""
        state = self.state
        assert state.attach is not None and state.prepared is not None and state.capture is not None
        port = state.attach.capture_ports[0]
        try:
            report = FenceReadback.from_wire(await state.launcher.capture_call("inspect", {"expect_anyip": True}))
            probe = NetnsProbe.from_wire(await state.launcher.capture_call(
                "probe", {"address": PROBE_ADDRESS, "port": port, "expect_listener_port": port}
            ))  # fmt: skip
        except (LauncherError, OSError) as exc:
            report, probe = FenceReadback.failed(f"fence read-back failed: {exc}"), NetnsProbe()
        _drain(state.prepared.fds.get(f"tcp4:{port}"))  # the probe's own connection must not reach the handler
        problems = list(report.problems)
        if not probe.ok or not probe.captured:
            problems.append(f"probe to {PROBE_ADDRESS}:{port} was not captured: {probe.error}")
        if not report.ok or problems:
            state.fatal(f"fence not in force: {problems}")
            raise OpError(ErrorKind.FAILED, f"fence not in force: {problems}", stage="confirm")
        return report.fingerprint, report.links

    async def _watch_fence(self, fingerprint: str) -> None:
        """Re-read the fence on every rtnetlink and nftables notification of the agent's namespace and every 5 s
        (capture/fence_watch.py); a changed fingerprint ends the workload."""
        state = self.state
        notifications: list[socket.socket] = []
        try:
            notifications.append(rtnetlink_groups_socket(
                await state.launcher.socket_in_netns(socket.AF_NETLINK, socket.SOCK_RAW)
            ))  # fmt: skip
        except OSError as exc:
            state.log.emit(EventName.FENCE_WATCH, notifications=False, reason=f"timer only: {exc}")
        nftables: dict[str, JsonValue] = {"nftables_notifications": True}
        try:
            notifications.append(nftables_groups_socket(
                await state.launcher.socket_in_netns(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
            ))  # fmt: skip
        except OSError as exc:  # the timer still sees nftables changes, within 5 s
            nftables = {"nftables_notifications": False, "nftables_reason": str(exc)}

        async def inspect() -> FenceReadback:
            return FenceReadback.from_wire(await state.launcher.capture_call("inspect", {"expect_anyip": True}))

        watch = FenceWatch(
            expected=fingerprint, inspect=inspect, on_lost=self._enforcement_lost, notifications=notifications,
            on_error=lambda reason: state.log.emit(EventName.FENCE_WATCH_ERROR, reason=reason),
        )  # fmt: skip
        assert state.nursery is not None
        await state.nursery.start(watch.run)
        state.log.emit(
            EventName.FENCE_WATCH, notifications=bool(notifications), interval_s=watch.interval_s, **nftables
        )

    async def _enforcement_lost(self, report: FenceReadback) -> None:
        """The fence changed under a running workload: kill every workload process now (no grace), the agent's
        result says ``enforcement-lost``, and the daemon ends as on the agent's exit."""
        state = self.state
        problems = list(report.problems)
        reason = "fence changed: " + ("; ".join(problems) if problems else "fingerprint differs from confirm's")
        state.enforcement_lost = reason
        state.log.emit(
            EventName.ENFORCEMENT_LOST, reason=reason, problems=problems, links=report.links,
            fingerprint_confirmed=state.fence.fingerprint if state.fence else None,
            fingerprint_now=report.fingerprint, trigger=report.trigger,
        )  # fmt: skip
        started = state.table.agent is not None
        await state.table.end_all(EndReason.ENFORCEMENT_LOST, kill=True)
        if not started:  # ready, never started: nothing will report an agent exit
            state.fatal(reason)


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
