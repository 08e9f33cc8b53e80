"""A process as status shows it (boundary/process/description.py): the object status always carried, key for
key and in order, and never a pid (spec invariant 4)."""

from __future__ import annotations

import json

from supervisor.boundary.process.description import ProcessDescription


def test_a_process_is_described_as_status_always_did() -> None:
    running = ProcessDescription("p-1", "exec", ("sh", "-c", "x"), False, "2026-01-01T00:00:00Z", True, False)
    assert json.dumps(running.to_wire()) == (
        '{"handle": "p-1", "kind": "exec", "argv": ["sh", "-c", "x"], "tty": false, '
        '"started_at": "2026-01-01T00:00:00Z", "state": "running", "stream_attached": false}'
    )
    exited = ProcessDescription("p-2", "agent", (), True, "t", False, True)
    assert exited.to_wire()["state"] == "exited"
    assert "pid" not in exited.to_wire()
