"""Control's redial backoff: doubling from 50 ms to a 30 s cap, reset only on demand, and a reset
cuts a wait short. Virtual time (``MockClock``), so the cap costs nothing to reach."""

from __future__ import annotations

import itertools

import pytest
import trio
import trio.testing

from supervisor.control.dialer import BACKOFF_CAP_S, BACKOFF_START_S, Backoff, BackoffGroup


def test_doubles_to_the_cap_and_stays() -> None:
    backoff = Backoff()
    delays = [backoff.advance() for _ in range(14)]
    assert delays[:3] == [BACKOFF_START_S, 2 * BACKOFF_START_S, 4 * BACKOFF_START_S]
    assert all(b == min(2 * a, BACKOFF_CAP_S) for a, b in itertools.pairwise(delays))
    assert delays[-1] == BACKOFF_CAP_S == 30.0
    backoff.reset()
    assert backoff.advance() == BACKOFF_START_S


@pytest.mark.parametrize(("start", "cap"), [(0, 1), (-1, 1), (2, 1)])
def test_rejects_nonsense(start: float, cap: float) -> None:
    with pytest.raises(ValueError):
        Backoff(start, cap)


async def test_a_reset_wakes_a_sleeping_link(autojump_clock: trio.testing.MockClock) -> None:
    group = BackoffGroup()
    ops, egress = group.new(), group.new()
    for _ in range(20):
        egress.advance()
    woke_at: list[float] = []

    async def sleeper() -> None:
        await egress.sleep(BACKOFF_CAP_S)
        woke_at.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sleeper)
        await trio.sleep(1)
        start = trio.current_time()
        group.reset()  # an attach succeeded on the ops link
    assert woke_at and woke_at[0] - start < 0.1
    assert ops.delay == egress.delay == BACKOFF_START_S


async def test_sleep_without_reset_takes_the_whole_delay(autojump_clock: trio.testing.MockClock) -> None:
    backoff = Backoff()
    start = trio.current_time()
    await backoff.sleep(BACKOFF_CAP_S)
    assert trio.current_time() - start == pytest.approx(BACKOFF_CAP_S)
