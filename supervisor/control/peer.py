"""What control knows of its boundary: the ops link while it is up, the boundary's last reported status, the
agent's result, and why the last link attempt failed. The link driver (control/lifecycle_driver.py) writes it;
status, readiness and the operator API (control/api.py) read it."""

from __future__ import annotations

import trio

from supervisor.link.h2link import Link
from supervisor.protocol.exit_result import ExitResult
from supervisor.protocol.status import StatusReply


class BoundaryPeer:
    def __init__(self) -> None:
        self.ops: Link | None = None
        self.ops_ready = trio.Event()
        self.reported: StatusReply | None = None  # last status the boundary reported
        self.claims_ok = False
        self.agent_result: ExitResult | None = None
        self.closed_said = False  # link.closed was logged for this agent's end
        self.last_link_error: str | None = None
        self.refused: str | None = None  # the boundary refused our attach (and exits): why
        self.ca_sha256: str | None = None  # the interception CA the boundary (the agent) trusts
        self.egress_up = 0
        self.egress_came_up = trio.Event()  # set (and replaced) whenever one of our egress links comes up

    @property
    def ops_up(self) -> bool:
        return self.ops is not None and not self.ops.closed

    def egress_link_up(self) -> None:
        self.egress_up += 1
        self.egress_came_up.set()
        self.egress_came_up = trio.Event()
