"""What the boundary reports to control (``status``, ``resume``) and what control acknowledges to it (the policy
generation in force, the agent's result) (docs/reference/boundary.md §1.2, §1.6)."""

from __future__ import annotations

from dataclasses import replace

from supervisor.boundary.process.description import ProcessDescription
from supervisor.boundary.state import DaemonState
from supervisor.protocol.acks import ExitAck, NoArguments, PolicyAck
from supervisor.protocol.event_names import EventName
from supervisor.protocol.fingerprint import pem_fingerprint
from supervisor.protocol.status import AgentStatus, ResumeRequest, StatusReply

REDACTED_CREDENTIAL = "[CREDENTIAL]"  # a placeholder as status shows it (as control's events do, l7/rewrite.py)


class Reports:
    """``/v1/status``, ``/v1/resume``, ``/v1/policy-ack`` and ``/v1/agent/exit-ack``."""

    def __init__(self, state: DaemonState) -> None:
        self.state = state

    async def op_resume(self, req: ResumeRequest) -> StatusReply:
        """After ``lifecycle.check(Op.RESUME)`` (the router's ``before``). The link's claims were verified exactly
        equal to ours (generation included) before any request."""
        return self._status()

    async def op_status(self, req: NoArguments) -> StatusReply:
        return self._status()

    def _status(self) -> StatusReply:
        state = self.state
        agent = state.table.agent
        return StatusReply(
            state=state.lifecycle.state,
            boundary_instance=state.instance,
            privilege_model=str(state.cfg.privilege_model),
            capture_mode=str(state.attach.capture_mode) if state.attach else None,
            fence=state.fence,
            enforcement_lost=state.enforcement_lost,
            policy_generation=state.policy_generation_acked,
            agent=None if agent is None else AgentStatus(agent.handle, agent.result),
            processes=tuple(self._redacted(process).to_wire() for process in state.table.live()),
            links=len(state.links),
            limits=state.limits_now().to_wire(),
            # The CA the agent was given to trust: a control that resumes with another one says so.
            interception_ca_sha256=self._interception_ca_sha256(),
        )

    def _redacted(self, process: ProcessDescription) -> ProcessDescription:
        """A process as status shows it: a credential placeholder in its argv reads ``[CREDENTIAL]``, as in the
        events (control's ``l7/rewrite.py``)."""
        attach = self.state.attach
        placeholders = sorted(attach.credential_placeholders.values(), key=len, reverse=True) if attach else []
        argv = []
        for arg in process.argv:
            for placeholder in placeholders:
                arg = arg.replace(placeholder, REDACTED_CREDENTIAL)
            argv.append(arg)
        return replace(process, argv=tuple(argv))

    def _interception_ca_sha256(self) -> str | None:
        pem = self.state.attach.interception_ca_pem if self.state.attach else None
        if not pem:
            return None
        try:
            return pem_fingerprint(pem)
        except ValueError:
            return None

    async def op_policy_ack(self, req: PolicyAck) -> PolicyAck:
        generation = req.policy_generation
        self.state.policy_generation_acked = generation
        self.state.log.emit(EventName.POLICY_ACKNOWLEDGED, policy_generation=generation)
        return PolicyAck(generation)

    async def op_exit_ack(self, req: NoArguments) -> ExitAck:
        """After ``lifecycle.check(Op.EXIT_ACK)`` (the router's ``before``)."""
        self.state.exit_acked.set()
        return ExitAck()
