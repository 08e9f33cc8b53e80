"""Dev mode's dedicated agent id: the first of the range that no account, subordinate range, process or file
uses (the checks injected; one real pick at the end)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from supervisor.cli.agent_ids import AGENT_ID_RANGE, NoFreeAgentId, _reserve, pick_agent_id


def pick(**checks: object) -> int:
    defaults: dict[str, object] = {
        "in_database": lambda ident: False,
        "subordinate": lambda: [],
        "process_ids": lambda: set(),
        "file_owners": lambda: set(),
        "candidates": range(100, 110),
        "reserve": lambda ident: True,
    }
    return pick_agent_id(**{**defaults, **checks})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("checks", "expected"),
    [
        ({}, 100),
        ({"in_database": lambda ident: ident in (100, 101)}, 102),
        ({"subordinate": lambda: [range(95, 104)]}, 104),
        ({"process_ids": lambda: {100}}, 101),
        ({"file_owners": lambda: {100, 101, 102}}, 103),
        ({"reserve": lambda ident: ident != 100}, 101),  # another dev mode reserved 100 a moment ago
    ],
)
def test_first_unused(checks: dict[str, object], expected: int) -> None:
    assert pick(**checks) == expected


def test_exhausted_range_names_the_flag() -> None:
    with pytest.raises(NoFreeAgentId, match="--agent-user"):
        pick(process_ids=lambda: set(range(100, 110)))


def test_real_pick_is_unused_here() -> None:
    ident = pick_agent_id()
    assert ident in AGENT_ID_RANGE
    with pytest.raises(KeyError):
        pwd.getpwuid(ident)
    assert ident not in (os.getuid(), os.getgid())


def test_a_reservation_is_exclusive_while_held(tmp_path: Path) -> None:
    """Two dev modes starting together: the second cannot take the id the first holds (flock on another open
    file description conflicts even inside one process, so this stands in for the second process)."""
    assert _reserve(7, str(tmp_path))
    assert not _reserve(7, str(tmp_path))
    assert _reserve(8, str(tmp_path))
