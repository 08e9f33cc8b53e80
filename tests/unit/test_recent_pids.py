"""The boundary's cached view of the workload's pids: rescans at most every ttl, at once when invalidated."""

from __future__ import annotations

import time

import pytest

from supervisor.boundary.egress import RecentPids


def test_cached_within_ttl_and_rescanned_after_or_on_invalidate(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]  # the clock, moved by hand: the ttl is the thing under test, not something to wait out
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    scans: list[int] = []

    def scan() -> set[int]:
        scans.append(1)
        return {len(scans)}

    pids = RecentPids(scan, ttl=0.2)
    assert pids() == {1} and pids() == {1} and len(scans) == 1
    pids.invalidate()
    assert pids() == {2}
    now[0] += 0.15
    assert pids() == {2}  # still within the ttl
    now[0] += 0.1
    assert pids() == {3}
    copy = pids()
    copy.add(99)
    assert 99 not in pids(), "callers get a copy"
