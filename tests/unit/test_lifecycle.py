"""The lifecycle state machine: the spec's operation × state matrix, cell by cell."""

from __future__ import annotations

import pytest

from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.lifecycle import Lifecycle, Op, State, check

INV, D, T, OK = ErrorKind.INVALID, ErrorKind.DENIED, ErrorKind.TERMINATED, None
STATES = (State.IDLE, State.BOUND, State.READY, State.RUNNING, State.ENDED)
MATRIX = {  # docs/reference/boundary.md §1.4
    Op.ATTACH: (OK, D, D, D, T),
    Op.RESUME: (INV, OK, OK, OK, OK),
    Op.CONFIRM: (INV, OK, INV, INV, T),
    Op.START: (INV, INV, OK, INV, T),
    Op.EXEC: (INV, INV, INV, OK, T),
    Op.FORWARD: (INV, INV, INV, OK, T),
    Op.SIGNAL: (INV, INV, INV, OK, T),
    Op.TERMINATE: (INV, INV, INV, OK, T),
    Op.RESIZE: (INV, INV, INV, OK, T),
    Op.WAIT: (INV, INV, INV, OK, OK),
}
CASES = [(op, state, row[i]) for op, row in MATRIX.items() for i, state in enumerate(STATES)]


@pytest.mark.parametrize(("op", "state", "expected"), CASES, ids=[f"{o}-{s}" for o, s, _ in CASES])
def test_matrix_cell(op: Op, state: State, expected: ErrorKind | None) -> None:
    if expected is None:
        check(state, op)
        return
    with pytest.raises(OpError) as info:
        check(state, op)
    assert info.value.kind is expected


def test_steps_in_order_and_each_consumes_the_previous_state() -> None:
    life = Lifecycle()
    with pytest.raises(OpError):
        life.advance(Op.START)  # cannot skip Bound and Ready
    assert life.advance(Op.ATTACH) is State.BOUND
    with pytest.raises(OpError) as second:
        life.advance(Op.ATTACH)
    assert second.value.kind is ErrorKind.DENIED and "second attach" in second.value.reason
    assert life.advance(Op.CONFIRM) is State.READY
    with pytest.raises(OpError):
        life.advance(Op.CONFIRM)
    assert life.advance(Op.START) is State.RUNNING
    life.end()
    for op in (Op.ATTACH, Op.EXEC, Op.START):
        with pytest.raises(OpError) as ended:
            life.check(op)
        assert ended.value.kind is ErrorKind.TERMINATED
    life.check(Op.WAIT)  # results stay readable after the end


def test_errors_never_move_the_state() -> None:
    life = Lifecycle()
    for op in (Op.CONFIRM, Op.START, Op.EXEC, Op.RESUME):
        with pytest.raises(OpError):
            life.advance(op)
        assert life.state is State.IDLE
