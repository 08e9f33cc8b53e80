"""What control answers once the agent has ended (supervisor/protocol/agent_ended.py), rule by rule."""

from __future__ import annotations

import pytest

from supervisor.protocol.agent_ended import after_agent_end, why_ended
from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.exit_result import EndReason, ExitResult
from supervisor.protocol.lifecycle import Op

AGENT = "p_0123456789abcdef"
EXEC = "p_fedcba9876543210"
LOST = ExitResult(AGENT, None, "KILL", 9, 137, False, EndReason.ENFORCEMENT_LOST, "2025-01-01T00:00:00Z")
EXITED = ExitResult(AGENT, 3, None, None, 3, False, EndReason.EXITED, "2025-01-01T00:00:00Z")


@pytest.mark.parametrize("attached", [True, False])
def test_wait_on_the_agent_answers_its_result(attached: bool) -> None:
    assert after_agent_end(Op.WAIT, AGENT, LOST, boundary_attached=attached) == LOST


@pytest.mark.parametrize("attached", [True, False])
@pytest.mark.parametrize("result", [LOST, EXITED])
def test_terminate_on_the_ended_agent_is_terminated_with_its_result(result: ExitResult, attached: bool) -> None:
    with pytest.raises(OpError) as info:
        after_agent_end(Op.TERMINATE, AGENT, result, boundary_attached=attached)
    assert info.value.kind is ErrorKind.TERMINATED and info.value.kind.http_status == 410
    assert info.value.result == result
    assert OpError.from_json(info.value.to_json(), status=410).result == result  # it crosses the wire
    assert info.value.reason == f"terminate: {why_ended(result)} already"


def test_wait_on_an_exec_is_the_boundarys_while_it_is_there() -> None:
    assert after_agent_end(Op.WAIT, EXEC, LOST, boundary_attached=True) is None
    with pytest.raises(OpError) as info:
        after_agent_end(Op.WAIT, EXEC, LOST, boundary_attached=False)
    assert info.value.kind is ErrorKind.TERMINATED and info.value.field == "handle"
    assert "reason enforcement-lost" in info.value.reason


CASES = [
    (Op.EXEC, None),
    (Op.FORWARD, None),
    (Op.SIGNAL, AGENT),
    (Op.SIGNAL, EXEC),
    (Op.TERMINATE, EXEC),
    (Op.RESIZE, AGENT),
]


@pytest.mark.parametrize("attached", [True, False])
@pytest.mark.parametrize(("op", "handle"), CASES, ids=[f"{op}-{handle}" for op, handle in CASES])
def test_everything_else_is_terminated_naming_why(op: Op, handle: str | None, attached: bool) -> None:
    with pytest.raises(OpError) as info:
        after_agent_end(op, handle, LOST, boundary_attached=attached)
    assert info.value.kind is ErrorKind.TERMINATED and info.value.kind.http_status == 410
    assert info.value.reason.startswith(f"{op}: the agent has terminated: reason enforcement-lost (signal KILL)")


def test_the_reason_says_how_the_agent_ended() -> None:
    assert why_ended(LOST) == "the agent has terminated: reason enforcement-lost (signal KILL)"
    assert why_ended(EXITED) == "the agent has terminated: reason exited (code 3)"
