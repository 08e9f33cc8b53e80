"""The §2.5 exit result (supervisor/protocol/exit_result.py): the object on the wire is the one the boundary always
wrote, a client's exit code follows rendered → code → signal → 125, and a bad field is named."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.protocol.exit_codes import ExitCode
from supervisor.protocol.exit_result import EndReason, ExitResult, ExitResultError

WIRE = {
    "handle": "p_0123456789abcdef",
    "exited": True,
    "code": 3,
    "signal": None,
    "signal_number": None,
    "rendered": 3,
    "core_dumped": False,
    "reason": "exited",
    "ended_at": "2026-12-01T00:00:00.000Z",
}


def test_wire_object_round_trips_unchanged() -> None:
    result = ExitResult.from_wire(WIRE)
    assert result.to_wire() == WIRE and list(result.to_wire()) == list(WIRE)
    assert result.reason is EndReason.EXITED and result.exit_code == 3


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"rendered": 124, "code": None, "signal_number": 15}, 124),  # a timeout, as timeout(1) says
        ({"rendered": None, "code": 300}, 300 & 0xFF),
        ({"rendered": 999, "code": 7}, 7),  # out of range: not a code a process can exit with
        ({"rendered": None, "code": None, "signal_number": 9}, 137),
        ({"rendered": None, "code": None, "signal_number": None}, ExitCode.SELF_FAILED),
        ({"rendered": None, "code": None, "signal_number": 200}, ExitCode.SELF_FAILED),
    ],
)
def test_exit_code_falls_back_in_order(fields: dict[str, Any], code: int) -> None:
    assert ExitResult.from_wire({**WIRE, **fields}).exit_code == code


def test_an_older_or_newer_peer_is_understood() -> None:
    assert ExitResult.from_wire({"code": 0}).exit_code == 0  # fields left out are absent, reason "exited"
    assert ExitResult.from_wire({**WIRE, "cgroup": "gone"}) == ExitResult.from_wire(WIRE)  # unknown ones ignored


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"code": "3"}, "code"),
        ({"rendered": True}, "rendered"),
        ({"signal": 9}, "signal"),
        ({"core_dumped": 1}, "core_dumped"),
        ({"reason": "bored"}, "reason"),
        ({"ended_at": 0}, "ended_at"),
    ],
)
def test_a_bad_field_is_named(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(ExitResultError, match=f"field {field}"):
        ExitResult.from_wire({**WIRE, **fields})


def test_not_an_object() -> None:
    with pytest.raises(ExitResultError, match="JSON object"):
        ExitResult.from_wire([WIRE])
