"""The attach step (docs/reference/boundary.md §1.2): check the descriptor, prepare the agent's namespaces and
limits, install the trust files, set up the capture; then the boundary is Bound.

A refused descriptor or a failed preparation will not be different next time: the reply is sent, then the daemon
exits non-zero (spec §1.1) instead of idling for a control that keeps sending the same thing.
"""

from __future__ import annotations

import os

from supervisor.boundary.capture_start import start_capture
from supervisor.boundary.config import PROXY_PORT
from supervisor.boundary.confinement import root_for
from supervisor.boundary.forkimage import NamespacePlan
from supervisor.boundary.forkimage.rootfs import RootError, RootPlan
from supervisor.boundary.process import LauncherError
from supervisor.boundary.state import DaemonState
from supervisor.boundary.trust import TrustError, install_trust
from supervisor.protocol.attach import AttachReply, AttachRequest, CaptureMode
from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.event_names import EventName
from supervisor.protocol.lifecycle import Op, State
from supervisor.protocol.ocsf import placeholder_scrub
from supervisor.protocol.privilege_model import PrivilegeModel


class AttachStep:
    """``/v1/attach``: Idle to Bound, or a reply and the daemon's exit."""

    def __init__(self, state: DaemonState) -> None:
        self.state = state

    def refused(self, exc: OpError) -> None:
        """A descriptor refused or a preparation failed while still Idle: said, and the daemon ends (the
        router's ``refused``, after ``lifecycle.check(Op.ATTACH)`` as its ``before``)."""
        state = self.state
        if state.lifecycle.state is State.IDLE:
            state.log.emit(EventName.LIFECYCLE_REFUSED, op="attach", error=exc.to_json())
            state.fatal(f"attach refused: {exc.kind}: {exc.reason}" + (f" ({exc.field})" if exc.field else ""))

    async def op_attach(self, attach: AttachRequest) -> AttachReply:
        state = self.state
        state.agent_ids(attach)
        netns = self._capture_in_netns(attach)
        plan = self._namespace_plan(attach, netns)
        await self._prepare(plan)
        self._install_trust(attach)
        state.attach = attach
        state.log.scrub = placeholder_scrub(attach.credential_placeholders.values())  # §4.1: never in an event
        state.policy_generation_acked = attach.policy_generation
        at_connect = start_capture(state, netns)
        state.lifecycle.advance(Op.ATTACH)
        return self._bound(attach, netns, at_connect)

    def _capture_in_netns(self, attach: AttachRequest) -> bool:
        """Whether capture is in the agent's own network namespace; refuses a capture mode the boundary's
        configuration or privilege model does not allow."""
        cfg = self.state.cfg
        if attach.capture_mode is CaptureMode.PROXY_ENV and not (
            attach.acknowledge_external_fence and cfg.acknowledge_external_fence
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
            and not (attach.acknowledge_unprobed_fence and cfg.acknowledge_unprobed_fence)
        ):
            raise OpError(
                ErrorKind.DENIED,
                'proxy-env without a fence canary needs the acknowledgement to say "no probe" '
                "(--acknowledge-unprobed-fence) in both the boundary's configuration and the descriptor",
                field="fence_canary",
            )
        model = cfg.privilege_model
        if attach.capture_mode is CaptureMode.NETNS and model == PrivilegeModel.P:
            raise OpError(ErrorKind.DENIED, "model P has no network namespace: only proxy-env", field="capture_mode")
        return attach.capture_mode is CaptureMode.NETNS

    def _namespace_plan(self, attach: AttachRequest, netns: bool) -> NamespacePlan:
        model = self.state.cfg.privilege_model
        root = self._agent_root(attach) if model != PrivilegeModel.P else None
        return NamespacePlan(
            model,
            netns=netns,
            pidns=model != PrivilegeModel.P,
            mountns=model != PrivilegeModel.P,
            capture={"capture_ports": list(attach.capture_ports), "proxy_port": PROXY_PORT} if netns else None,
            root=root.to_wire() if root is not None else None,
            agent_ids=self.state.agent_ids(attach) if model == PrivilegeModel.U and os.geteuid() == 0 else None,
        )

    def _agent_root(self, attach: AttachRequest) -> RootPlan:
        """The agent's own root (R, U): only granted trees, secrets hidden (confinement rule 1)."""
        state = self.state
        cfg = state.cfg
        uid, gid = state.agent_ids(attach)
        try:
            layout = root_for(
                attach.static_policy, cfg.workdir, trust_dir=str(cfg.tls_dir), agent_uid=uid, agent_gid=gid,
                hide=(*cfg.hide_paths, str(cfg.bundle.directory)), tmp_size=cfg.tmp_size, shm_size=cfg.shm_size,
            )  # fmt: skip
        except RootError as exc:  # a layout we cannot build now will not build later: exit, do not idle
            state.fatal(f"agent filesystem: {exc}")
            raise OpError(ErrorKind.INVALID, f"agent filesystem: {exc}", field="filesystem_policy") from None
        state.log.emit(
            EventName.AGENT_FILESYSTEM, read_only=[b.target for b in layout.binds if not b.writable],
            read_write=[b.target for b in layout.binds if b.writable], hidden=list(layout.hide),
            tmp_size=layout.tmp_size, shm_size=layout.shm_size,
        )  # fmt: skip
        return layout

    async def _prepare(self, plan: NamespacePlan) -> None:
        """The limits first (the launcher joins the cgroups before it forks anything), then the namespaces."""
        state = self.state
        state.limits.limit_pids(state.launcher, state.instance)
        state.limits.limit_memory(state.launcher, state.instance, state.table)
        try:
            state.prepared = await state.launcher.prepare(plan)
        except (LauncherError, OSError) as exc:
            state.fatal(f"namespace setup failed: {exc}")
            raise OpError(ErrorKind.FAILED, f"namespace setup failed: {exc}", stage="prepare") from exc
        state.limits.oom_score(state.launcher, plan.pidns)

    def _install_trust(self, attach: AttachRequest) -> None:
        """The interception CA the workload is given to trust (boundary/trust.py)."""
        if attach.interception_ca_pem is None:
            return
        state = self.state
        try:
            state.trust = install_trust(state.cfg.tls_dir, attach.interception_ca_pem)
        except (TrustError, OSError) as exc:
            state.fatal(f"interception CA: {exc}")
            raise OpError(ErrorKind.INVALID if isinstance(exc, TrustError) else ErrorKind.FAILED,
                          f"interception CA: {exc}", field="interception_ca_pem") from None  # fmt: skip

    def _bound(self, attach: AttachRequest, netns: bool, at_connect: bool) -> AttachReply:
        state = self.state
        model = state.cfg.privilege_model
        state.log.emit(
            EventName.LIFECYCLE_BOUND, capture_mode=str(attach.capture_mode), privilege_model=model,
            policy_generation=attach.policy_generation, identity_at="connect" if at_connect else "accept",
        )  # fmt: skip
        assert state.prepared is not None
        # the set-up's report is the last word, as it always was (its own "mode" says how it captures)
        capture = {"mode": str(attach.capture_mode), "netns": netns, **(state.prepared.report or {})}
        return AttachReply(state.lifecycle.state, state.instance, model, capture)
