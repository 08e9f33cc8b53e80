"""The boundary's lifecycle as a pure state machine (docs/reference/boundary.md §1.1, §1.4).

Rule 1: every operation is checked against the current state here, first, before it touches anything.
Rule 2: only the three lifecycle steps move the state forward, one step each; errors never move it.
Rule 3: there is no way back: Ended is final, and a second ``attach`` is refused in every later state.

The table below is the operation × state matrix of the spec: a cell is either ``OK`` or the error kind to
answer with.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.json_value import JsonValue


class State(enum.StrEnum):
    IDLE = "idle"
    BOUND = "bound"
    READY = "ready"
    RUNNING = "running"
    ENDED = "ended"


class Op(enum.StrEnum):
    ATTACH = "attach"
    RESUME = "resume"
    CONFIRM = "confirm"
    START = "start"
    EXEC = "exec"
    FORWARD = "forward"
    SIGNAL = "signal"
    TERMINATE = "terminate"
    RESIZE = "resize"
    WAIT = "wait"
    STATUS = "status"
    EGRESS = "egress"
    EXIT_ACK = "exit-ack"
    FENCE_PROBE = "fence-probe"  # proxy-env's canary probe and control's report of it (protocol/fence_canary.py)


OK = None
_I, _D, _T = ErrorKind.INVALID, ErrorKind.DENIED, ErrorKind.TERMINATED
_ORDER = (State.IDLE, State.BOUND, State.READY, State.RUNNING, State.ENDED)

#                 Idle   Bound  Ready  Running Ended
_TABLE: dict[Op, tuple[ErrorKind | None, ...]] = {
    Op.ATTACH: (OK, _D, _D, _D, _T),
    Op.RESUME: (_I, OK, OK, OK, OK),  # in Ended, resume returns the retained agent result
    Op.CONFIRM: (_I, OK, _I, _I, _T),
    Op.START: (_I, _I, OK, _I, _T),
    Op.EXEC: (_I, _I, _I, OK, _T),
    Op.FORWARD: (_I, _I, _I, OK, _T),
    Op.SIGNAL: (_I, _I, _I, OK, _T),
    Op.TERMINATE: (_I, _I, _I, OK, _T),
    Op.RESIZE: (_I, _I, _I, OK, _T),
    Op.WAIT: (_I, _I, _I, OK, OK),
    Op.STATUS: (OK, OK, OK, OK, OK),
    Op.EGRESS: (_D, OK, OK, OK, _T),
    Op.EXIT_ACK: (_I, _I, _I, _I, OK),
    Op.FENCE_PROBE: (_I, OK, OK, OK, _T),
}

_NEXT = {Op.ATTACH: State.BOUND, Op.CONFIRM: State.READY, Op.START: State.RUNNING}

_WHY = {
    _I: "not valid in state {state}",
    _D: "refused in state {state}",
    _T: "the sandbox has ended",
}


def check(state: State, op: Op) -> None:
    """Raise the spec's error for ``op`` in ``state``; return if it is allowed."""
    kind = _TABLE[op][_ORDER.index(state)]
    if kind is None:
        return
    reason = _WHY[kind].format(state=state)
    if op is Op.ATTACH and kind is _D:
        reason = f"already bound (state {state}); a second attach is refused"
    raise OpError(kind, f"{op}: {reason}")


class Lifecycle:
    """The one state variable of a boundary. Transitions consume the previous state."""

    def __init__(self, on_change: Callable[[State], None] | None = None) -> None:
        self.state = State.IDLE
        self._on_change = on_change  # told every new state (the boundary publishes it for its pod's probe)

    def check(self, op: Op) -> None:
        check(self.state, op)

    def advance(self, op: Op) -> State:
        """Check ``op`` and move to its next state (lifecycle steps only)."""
        self.check(op)
        self.state = _NEXT[op]
        if self._on_change is not None:
            self._on_change(self.state)
        return self.state

    def end(self) -> None:
        self.state = State.ENDED
        if self._on_change is not None:
            self._on_change(self.state)

    def at_least(self, state: State) -> bool:
        return self.state is not State.ENDED and _ORDER.index(self.state) >= _ORDER.index(state)


def reported_state(value: object) -> State:
    """A lifecycle state as a peer reported it; any other value is the peer's error."""
    try:
        return State(str(value))
    except ValueError:
        raise OpError(ErrorKind.INVALID, f"the boundary reported state {value!r}", field="state") from None


@dataclass(frozen=True)
class StartReply:
    """``/v1/start``'s answer: the state reached (``running``) and the agent's process handle."""

    state: State
    agent: str

    def to_wire(self) -> dict[str, JsonValue]:
        return {"state": str(self.state), "agent": self.agent}

    @classmethod
    def from_wire(cls, obj: object) -> StartReply:
        if not isinstance(obj, dict):
            raise OpError(ErrorKind.INVALID, "the start reply must be a JSON object")
        agent = obj.get("agent")
        if not isinstance(agent, str):
            raise OpError(ErrorKind.INVALID, "the start reply's agent must be a process handle", field="agent")
        return cls(reported_state(obj.get("state")), agent)
